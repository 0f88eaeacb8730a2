"""Trace construction, validation errors and JSON-lines round trips."""

from __future__ import annotations

import json

import numpy as np
import pytest

from continual_eval.stream import (
    EpisodeStep,
    EpisodeTrace,
    compute_all_metrics,
    read_jsonl,
    write_jsonl,
)


def test_nan_reward_names_the_step():
    with pytest.raises(ValueError, match=r"step 12 .*finite"):
        EpisodeTrace.from_arrays([0.0, float("nan")], ["a", "a"], step=[10, 12])


def test_infinite_reward_names_the_step():
    steps = [EpisodeStep(step=i, reward=r, regime_id="a") for i, r in enumerate([1.0, 2.0, np.inf])]
    with pytest.raises(ValueError, match="step 2"):
        EpisodeTrace(steps=steps)


def test_non_increasing_steps_name_the_step():
    with pytest.raises(ValueError, match="step 3 at position 2 follows step 5"):
        EpisodeTrace.from_arrays([0.0, 0.0, 0.0], ["a"] * 3, step=[1, 5, 3])
    with pytest.raises(ValueError, match="step 5 at position 2 follows step 5"):
        EpisodeTrace.from_arrays([0.0, 0.0, 0.0], ["a"] * 3, step=[1, 5, 5])


def test_alias_whose_origin_never_occurs_names_the_label():
    steps = [
        EpisodeStep(step=0, reward=1.0, regime_id="b"),
        EpisodeStep(step=1, reward=1.0, regime_id="a_again", regime_origin="a"),
    ]
    with pytest.raises(ValueError, match=r"'a_again'.*'a' never occurs"):
        EpisodeTrace(steps=steps)


def test_inconsistent_origin_names_the_label_and_step():
    steps = [
        EpisodeStep(step=0, reward=1.0, regime_id="a"),
        EpisodeStep(step=1, reward=1.0, regime_id="b"),
        EpisodeStep(step=2, reward=1.0, regime_id="x", regime_origin="a"),
        EpisodeStep(step=3, reward=1.0, regime_id="x", regime_origin="b"),
    ]
    with pytest.raises(ValueError, match="'x' at step 3"):
        EpisodeTrace(steps=steps)


def test_alias_cycle_is_an_error():
    with pytest.raises(ValueError, match="cycle"):
        EpisodeTrace.from_arrays([1, 1], ["x", "y"], origin_of={"x": "y", "y": "x"})


def test_alias_chain_resolves_to_root_and_pairs_forgetting():
    tr = EpisodeTrace.from_arrays(
        [1.0, 0.0, 0.5, 0.0, 0.25],
        ["a", "b", "a2", "c", "a3"],
        origin_of={"a2": "a", "a3": "a2"},
    )
    assert tr.root_of("a3") == "a"
    rows = compute_all_metrics(tr)["per_regime"]
    for z in ("a", "a2", "a3"):
        assert rows[z]["forgetting"] == pytest.approx(1.0 - 0.5)


def test_unknown_component_names_the_component():
    tr = EpisodeTrace.from_arrays([1.0, 0.0], ["a", "b"], components={"goal": [0.0, 1.0]})
    with pytest.raises(ValueError, match="unknown reward component 'solved'"):
        compute_all_metrics(tr, solve_component="solved")
    with pytest.raises(ValueError, match="unknown reward component 'bonus'"):
        compute_all_metrics(tr, episode_end_components=["bonus"])


def test_reference_length_and_finiteness_checked():
    tr = EpisodeTrace.from_arrays([1.0, 0.0, 2.0], ["a", "b", "b"], step=[4, 5, 9])
    with pytest.raises(ValueError, match="2 rewards, the trace has 3"):
        compute_all_metrics(tr, reference=[1.0, 2.0])
    with pytest.raises(ValueError, match="step 9"):
        compute_all_metrics(tr, reference=[1.0, 2.0, float("inf")])
    res = compute_all_metrics(tr, reference=[1.0, 2.0, 3.0])
    assert res["per_regime"]["b"]["regret"] == pytest.approx((2.0 - 0.0) + (3.0 - 2.0))
    assert res["per_regime"]["a"]["regret"] == 0.0  # a value, not absence


def test_jsonl_round_trip(tmp_path):
    steps = [
        EpisodeStep(step=0, reward=0.5, regime_id="a", components={"goal": 0.0}),
        EpisodeStep(step=3, reward=1.5, regime_id="b", invalid_action=True, effective_rank=2.5),
        EpisodeStep(
            step=7,
            reward=-1.0,
            regime_id="a2",
            regime_origin="a",
            episode_end=True,
            components={"goal": 1.0},
        ),
    ]
    path = write_jsonl(steps, tmp_path / "t.jsonl")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0] == {"step": 0, "reward": 0.5, "regime_id": "a", "components": {"goal": 0.0}}
    back = read_jsonl(path)
    assert back.steps == steps
    write_jsonl(back, tmp_path / "u.jsonl")
    assert (tmp_path / "u.jsonl").read_text() == path.read_text()


def test_jsonl_errors_name_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"step": 0, "reward": 1.0, "regime_id": "a"}\n{"step": 1, "reward": 2.0}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: .*regime_id"):
        read_jsonl(p)
    p.write_text('{"step": 0, "reward": 1.0, "regime_id": "a"}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        read_jsonl(p)
    p.write_text('{"step": 0, "reward": NaN, "regime_id": "a"}\n')
    with pytest.raises(ValueError, match="step 0"):
        read_jsonl(p)


def test_from_arrays_with_codes_matches_labels():
    a = EpisodeTrace.from_arrays([1, 2, 3], ["x", "y", "x"])
    b = EpisodeTrace.from_arrays([1, 2, 3], [0, 1, 0], regime_names=["x", "y"])
    assert a.regime_names == b.regime_names == ("x", "y")
    assert a.regime_code.tolist() == b.regime_code.tolist() == [0, 1, 0]
    assert a.regime_id == ["x", "y", "x"]


def test_unused_regime_names_are_dropped():
    tr = EpisodeTrace.from_arrays([1.0, 2.0], [2, 0], regime_names=["x", "unused", "z"])
    assert tr.regime_names == ("x", "z")
    assert tr.regime_id == ["z", "x"]
    assert list(compute_all_metrics(tr)["per_regime"]) == ["x", "z"]


def test_bad_optional_columns_name_the_step():
    with pytest.raises(ValueError, match="invalid_action at step 1"):
        EpisodeTrace.from_arrays([1.0, 2.0], ["a", "a"], invalid_action=[0.0, 0.5])
    with pytest.raises(ValueError, match="effective_rank at step 0"):
        EpisodeTrace.from_arrays([1.0, 2.0], ["a", "a"], effective_rank=[np.inf, 1.0])

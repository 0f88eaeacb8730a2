"""Reward specifications and the three derivations of the ceiling."""

from __future__ import annotations

import math

import pytest

from continual_eval.stream import (
    EpisodeTrace,
    RewardComponent,
    RewardSpec,
    UpperBound,
    analytic_upper_bound,
    data_relative_upper_bound,
    numeric_upper_bound,
)


def paper_like() -> RewardSpec:
    # a pure per-step penalty and one episode-end payout
    return RewardSpec(
        components=(
            RewardComponent("collision", weight=-1.0, clip=(0.0, 1.0)),
            RewardComponent("success", weight=0.5, clip=(0.0, 1.0), pays="episode_end"),
        ),
        name="paper",
    )


def experiment_like() -> RewardSpec:
    return RewardSpec(
        components=(
            RewardComponent("progress", weight=1 / 3, clip=(-1.0, 1.0)),
            RewardComponent("penalty", weight=-0.5, clip=(0.0, 2.0)),
            RewardComponent("goal", weight=2 / 3, clip=(0.0, 1.0), pays="episode_end"),
        ),
        name="experiment",
    )


def test_analytic_bound_per_step_final_step_and_interval_form():
    p = analytic_upper_bound(paper_like())
    assert (p.per_step, p.final_step, p.derivation) == (0.0, 0.5, "analytic")
    e = analytic_upper_bound(experiment_like())
    assert e.per_step == pytest.approx(1 / 3) and e.final_step == pytest.approx(1.0)
    # seed: "interval of 60 holding the final step: 0.3444"
    assert f"{e.for_interval(60, contains_final_step=True):.4f}" == "0.3444"
    assert e.for_interval(60, contains_final_step=False) == pytest.approx(1 / 3)
    L, pp, f = 7, e.per_step, e.final_step
    assert e.for_interval(L, True) == pytest.approx(((L - 1) * pp + f) / L)
    with pytest.raises(ValueError, match=">= 1"):
        e.for_interval(0, True)


def test_unclipped_component_has_no_analytic_bound_but_a_numeric_one():
    spec = RewardSpec(
        components=(
            RewardComponent("speed", weight=1.0, clip=None),
            RewardComponent("goal", weight=1.0, clip=(0.0, 1.0), pays="episode_end"),
        ),
        name="open",
    )
    with pytest.raises(ValueError, match=r"\['speed'\].*numeric_upper_bound"):
        analytic_upper_bound(spec)
    contexts = [
        {"speed": 0.3, "goal": 0.0},
        {"speed": 2.0, "goal": 0.0},
        {"speed": 0.1, "goal": 1.0},
    ]
    b = numeric_upper_bound(spec, contexts)
    assert b.derivation == "numeric"
    # best over contexts computed by hand: per step max(0.3, 2.0, 0.1); final max(0.3, 2.0, 1.1)
    assert b.per_step == pytest.approx(2.0) and b.final_step == pytest.approx(2.0)
    # negative weight on an unclipped term is bounded above by 0 only if clipped below
    neg = RewardSpec((RewardComponent("cost", weight=-1.0, clip=(0.0, math.inf)),))
    assert analytic_upper_bound(neg).per_step == 0.0


def test_compose_clips_weights_and_rejects_unknown_names():
    spec = experiment_like()
    assert spec.compose({"progress": 5.0, "penalty": -3.0}) == pytest.approx(1 / 3)
    assert spec.compose({"progress": 1.0, "goal": 1.0}, final_step=False) == pytest.approx(1 / 3)
    assert spec.compose({"progress": 1.0, "goal": 1.0}, final_step=True) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown reward component 'speed'"):
        spec.compose({"speed": 1.0})
    assert spec.episode_end_names == ("goal",)


def test_spec_validation():
    with pytest.raises(ValueError, match="duplicate"):
        RewardSpec((RewardComponent("x"), RewardComponent("x")))
    with pytest.raises(ValueError, match="pays"):
        RewardComponent("x", pays="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lo <= hi"):
        RewardComponent("x", clip=(1.0, 0.0))


def test_spec_dict_round_trip(tmp_path):
    spec = experiment_like()
    assert RewardSpec.from_dict(spec.to_dict()) == spec


def test_data_relative_bound_is_best_observed():
    tr = EpisodeTrace.from_arrays(
        [0.1, 0.7, 0.3, 2.0, 0.2], ["a"] * 5, episode_end=[False, False, False, True, False]
    )
    b = data_relative_upper_bound([tr])
    assert (b.per_step, b.final_step, b.derivation) == (0.7, 2.0, "data_relative")
    tr2 = EpisodeTrace.from_arrays([0.1, 0.9], ["a", "a"])
    b2 = data_relative_upper_bound([tr2])
    assert b2.per_step == b2.final_step == 0.9


def test_explicit_bound():
    b = UpperBound.explicit(1.5)
    assert b.derivation == "explicit" and b.for_interval(10, True) == 1.5
    with pytest.raises(ValueError, match="finite"):
        UpperBound.explicit(float("inf"))

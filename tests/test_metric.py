"""ContinualMetrics: equal to the functional layer after every stage, persistent, DDP-safe."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import warnings

import pytest
import torch

from continual_eval import ContinualMetrics, continual_metrics
from metric_ddp_worker import random_stream
from reference import reference_metrics

NAN = float("nan")


def test_metric_equals_function_after_every_stage():
    T = 6
    R, b = random_stream(T, seed=0)
    metric = ContinualMetrics(num_tasks=T)
    metric.update_baseline(b)
    for s in range(T):
        metric.update(R[s])
        out = metric.compute()
        expected = continual_metrics(R[: s + 1, : s + 1], b[: s + 1])
        loop = reference_metrics(R[: s + 1, : s + 1].tolist(), b[: s + 1].tolist())
        for key in expected:
            torch.testing.assert_close(out[key], expected[key])
            assert out[key].item() == pytest.approx(loop[key], abs=1e-6)
    assert metric.num_stages == T
    torch.testing.assert_close(metric.scores, R, equal_nan=True)
    torch.testing.assert_close(metric.baseline, b, equal_nan=True)


def test_chaudhry_convention_is_passed_through():
    T = 4
    R, b = random_stream(T, seed=3)
    metric = ContinualMetrics(T, forgetting="chaudhry")
    metric.update_baseline(b)
    for row in R:
        metric.update(row)
    expected = reference_metrics(R.tolist(), b.tolist(), "chaudhry")
    assert metric.compute()["forgetting"].item() == pytest.approx(expected["forgetting"], abs=1e-6)


def test_state_dict_round_trip_and_reset():
    T = 4
    R, b = random_stream(T, seed=1)
    metric = ContinualMetrics(T)
    metric.update_baseline(b)
    metric.update(R[0])
    metric.update(R[1])
    state = metric.state_dict()
    assert {"scores_state", "baseline_state", "stages"} <= set(state)

    restored = ContinualMetrics(T)
    restored.load_state_dict(state)
    assert restored.num_stages == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "compute called before update" warning
        out = restored.compute()
    for key, value in metric.compute().items():
        torch.testing.assert_close(out[key], value)
    restored.update(R[2])  # continues where it stopped
    torch.testing.assert_close(restored.scores, R[:3], equal_nan=True)

    restored.reset()
    assert restored.num_stages == 0
    assert torch.isnan(restored.baseline).all()
    with (
        pytest.warns(UserWarning, match="before the ``update``"),
        pytest.raises(RuntimeError, match="at least one update"),
    ):
        restored.compute()


def test_bad_updates_are_clear_errors_and_keep_what_was_recorded():
    T = 3
    R, b = random_stream(T, seed=0)
    metric = ContinualMetrics(T)
    metric.update_baseline(b)
    metric.update(R[0])
    with pytest.raises(ValueError, match=r"shape \[num_tasks\] = \[3\]"):
        metric.update(torch.tensor([0.5, 0.5]))
    with pytest.raises(TypeError, match="floating dtype"):
        metric.update(torch.tensor([1, 0, 1]))
    with pytest.raises(
        ValueError, match=r"scores\[1, 0\] = 1.5 is outside \[0, 1\].*nothing was recorded"
    ):
        metric.update(torch.tensor([1.5, 0.5, 0.5]))
    with pytest.raises(ValueError, match=r"scores\[1, 2\] is nan"):
        metric.update(torch.tensor([0.5, 0.5, NAN]))
    assert metric.num_stages == 1
    torch.testing.assert_close(metric.scores, R[:1], equal_nan=True)
    metric.update(R[1])
    metric.update(R[2])
    with pytest.raises(ValueError, match=r"num_tasks=3\) already holds 3 stages"):
        metric.update(R[2])
    with pytest.raises(ValueError, match=r"baseline\[1\] is nan"):
        metric.update_baseline(torch.tensor([0.5, NAN, 0.5]))
    torch.testing.assert_close(metric.baseline, b, equal_nan=True)


def test_compute_without_baseline_is_explained():
    metric = ContinualMetrics(3)
    metric.update(torch.tensor([0.9, 0.5, NAN]))
    assert metric.compute()["acc"].item() == pytest.approx(0.9)  # one stage needs no baseline
    metric.update(torch.tensor([0.8, 0.9, 0.5]))
    with pytest.raises(RuntimeError, match="update_baseline"):
        metric.compute()


def test_baseline_update_invalidates_cached_compute():
    metric = ContinualMetrics(2)
    metric.update_baseline(torch.tensor([NAN, 0.5]))
    metric.update(torch.tensor([0.9, 0.6]))
    metric.update(torch.tensor([0.8, 0.9]))
    assert metric.compute()["fwt"].item() == pytest.approx(0.1)
    metric.update_baseline(torch.tensor([NAN, 0.2]))
    assert metric.compute()["fwt"].item() == pytest.approx(0.4)


def test_plot_draws_the_matrix(tmp_path):
    pytest.importorskip("matplotlib")
    R, b = random_stream(3, seed=0)
    metric = ContinualMetrics(3)
    metric.update_baseline(b)
    metric.update(R[0])
    metric.update(R[1])
    fig, ax = metric.plot()
    image = ax.images[0].get_array()
    assert image.shape == (3, 3)  # baseline row + two stages
    assert bool(image.mask[1, 2])  # R[0, 2] not evaluated: drawn empty
    fig.savefig(tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 1000


# ---------------------------------------------------------------- DDP with 2 gloo processes
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_ddp(tmp_path, disagree: bool, mode: str = "update") -> dict:
    """Two fresh processes (not forks of this one: pytest's threads make fork unsafe)."""
    script = os.path.join(os.path.dirname(__file__), "metric_ddp_worker.py")
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                script,
                str(rank),
                "2",
                port,
                str(int(disagree)),
                str(tmp_path / f"{rank}.json"),
                mode,
            ]
        )
        for rank in (0, 1)
    ]
    try:
        for proc in procs:
            assert proc.wait(timeout=120) == 0
    finally:
        for proc in procs:
            proc.kill()
    return {rank: json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)}


@pytest.mark.slow
def test_ddp_sync_keeps_the_matrix_intact(tmp_path):
    results = _run_ddp(tmp_path, disagree=False)
    R, b = random_stream(4, seed=7)
    expected = reference_metrics(R[:3, :3].tolist(), b[:3].tolist())
    for rank in (0, 1):
        assert "error" not in results[rank], results[rank]
        for key, value in expected.items():
            assert results[rank]["metrics"][key] == pytest.approx(value, abs=1e-6)
        torch.testing.assert_close(torch.tensor(results[rank]["scores"]), R[:3], equal_nan=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["update", "forward"])
def test_ddp_sync_refuses_ranks_that_disagree(tmp_path, mode):
    results = _run_ddp(tmp_path, disagree=True, mode=mode)
    for rank in (0, 1):
        assert "differs between rank 0 and rank 1" in results[rank]["error"]


@pytest.mark.slow
def test_ddp_forward_returns_the_synced_metrics_so_far(tmp_path):
    results = _run_ddp(tmp_path, disagree=False, mode="forward")
    R, b = random_stream(4, seed=7)
    expected = reference_metrics(R[:3, :3].tolist(), b[:3].tolist())
    for rank in (0, 1):
        assert "error" not in results[rank], results[rank]
        for key, value in expected.items():
            assert results[rank]["forward_metrics"][key] == pytest.approx(value, abs=1e-6)
            assert results[rank]["metrics"][key] == pytest.approx(value, abs=1e-6)
        torch.testing.assert_close(torch.tensor(results[rank]["scores"]), R[:3], equal_nan=True)


@pytest.mark.parametrize("via_set_dtype", [False, True])
def test_float64_states_keep_an_integer_stage_counter(via_set_dtype):
    metric = (
        ContinualMetrics(2).set_dtype(torch.float64)
        if via_set_dtype
        else ContinualMetrics(2, dtype=torch.float64)
    )
    metric.update_baseline(torch.tensor([NAN, 1 / 3], dtype=torch.float64))
    metric.update(torch.tensor([2 / 3, 1 / 7], dtype=torch.float64))
    assert metric.scores.dtype == torch.float64
    assert metric.scores[0, 1].item() == 1 / 7  # exact: no float32 round trip
    assert metric.stages.dtype == torch.long
    with pytest.raises(TypeError, match="floating dtype"):
        ContinualMetrics(2, dtype=torch.long)


# ---------------------------------------------------------------- forward (metric(row))
def test_forward_records_the_row_and_returns_the_metrics_so_far():
    T = 4
    R, b = random_stream(T, seed=5)
    called, stepwise = ContinualMetrics(T), ContinualMetrics(T)
    called.update_baseline(b)
    stepwise.update_baseline(b)
    for s in range(T):
        out = called(R[s])  # torchmetrics' forward
        stepwise.update(R[s])
        expected = stepwise.compute()
        loop = reference_metrics(R[: s + 1, : s + 1].tolist(), b[: s + 1].tolist())
        assert set(out) == set(loop)
        for key, value in loop.items():
            assert out[key].item() == pytest.approx(value, abs=1e-6)
            torch.testing.assert_close(out[key], expected[key])
        assert called.num_stages == s + 1
    torch.testing.assert_close(called.scores, R, equal_nan=True)
    for key, value in called.compute().items():  # the recorded state, not a one-row "batch"
        torch.testing.assert_close(value, stepwise.compute()[key])


def test_forward_with_a_bad_row_records_nothing():
    T = 3
    R, b = random_stream(T, seed=2)
    metric = ContinualMetrics(T)
    metric.update_baseline(b)
    metric(R[0])
    with pytest.raises(ValueError, match=r"scores\[1, 0\] = 1.5 is outside.*nothing was recorded"):
        metric(torch.tensor([1.5, 0.5, 0.5]))
    assert metric.num_stages == 1
    torch.testing.assert_close(metric.scores, R[:1], equal_nan=True)


# ---------------------------------------------------------------- load_state_dict checks
def _recorded(T: int, stages: int, seed: int = 1) -> ContinualMetrics:
    R, b = random_stream(T, seed=seed)
    metric = ContinualMetrics(T)
    metric.update_baseline(b)
    for s in range(stages):
        metric.update(R[s])
    return metric


def _assert_unchanged(metric: ContinualMetrics, before: dict) -> None:
    after = metric.state_dict()
    assert set(after) == set(before)
    for key, value in before.items():
        torch.testing.assert_close(after[key], value, equal_nan=True)


def test_load_state_dict_refuses_a_state_of_another_num_tasks():
    state = _recorded(3, 2).state_dict()
    target = _recorded(4, 1, seed=9)
    before = target.state_dict()
    with pytest.raises(
        RuntimeError, match=r"ContinualMetrics\(num_tasks=4\) cannot load a state of num_tasks=3"
    ):
        target.load_state_dict(state)
    _assert_unchanged(target, before)  # nothing already recorded is lost
    target.update(random_stream(4, seed=9)[0][1])  # and it still works
    assert target.num_stages == 2


@pytest.mark.parametrize("stages", [-1, 4, 7])
def test_load_state_dict_refuses_a_stage_counter_out_of_range(stages):
    state = _recorded(3, 2).state_dict()
    state["stages"] = torch.tensor(stages)
    target = _recorded(3, 1, seed=4)
    before = target.state_dict()
    with pytest.raises(RuntimeError, match=rf"stages = {stages} is out of range \[0, 3\]"):
        target.load_state_dict(state)
    _assert_unchanged(target, before)


def test_load_state_dict_refuses_a_partial_or_invalid_state():
    state = _recorded(3, 2).state_dict()
    target = _recorded(3, 1, seed=4)
    before = target.state_dict()
    partial = {k: v for k, v in state.items() if k != "stages"}
    with pytest.raises(
        RuntimeError, match=r"stages missing \(found scores_state, baseline_state\)"
    ):
        target.load_state_dict(partial)
    _assert_unchanged(target, before)
    bad = dict(state)
    bad["scores_state"] = state["scores_state"].clone()
    bad["scores_state"][1, 0] = 2.0
    with pytest.raises(RuntimeError, match=r"scores\[1, 0\] = 2.0 is outside"):
        target.load_state_dict(bad)
    _assert_unchanged(target, before)
    fractional = dict(state)
    fractional["stages"] = torch.tensor(1.5)
    with pytest.raises(RuntimeError, match=r"stages = 1\.5 is not an integer"):
        target.load_state_dict(fractional)
    _assert_unchanged(target, before)


def test_load_state_dict_keeps_the_metric_dtype_and_nested_prefixes():
    R, b = random_stream(3, seed=6)
    source = ContinualMetrics(3)  # float32 states
    source.update_baseline(b)
    source.update(R[0])
    target = ContinualMetrics(3, dtype=torch.float64)
    target.load_state_dict(source.state_dict())
    assert target.scores_state.dtype == torch.float64
    assert target.stages.dtype == torch.long
    torch.testing.assert_close(target.scores, R[:1].double(), equal_nan=True)

    class Holder(torch.nn.Module):
        def __init__(self, num_tasks: int) -> None:
            super().__init__()
            self.metric = ContinualMetrics(num_tasks)

    holder = Holder(3)
    holder.metric.update(R[0])
    with pytest.raises(RuntimeError, match=r"metric\.scores_state has shape \(3, 3\)"):
        Holder(4).load_state_dict(holder.state_dict())
    restored = Holder(3)
    restored.load_state_dict(holder.state_dict())
    assert restored.metric.num_stages == 1


def test_validation_messages_print_every_digit():
    metric = ContinualMetrics(2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"scores\[0, 0\] = 1\.000000000001 is outside"):
        metric.update(torch.tensor([1 + 1e-12, 0.5], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"baseline\[1\] = -1e-15 is outside"):
        metric.update_baseline(torch.tensor([NAN, -1e-15], dtype=torch.float64))
    assert metric.num_stages == 0


# ---------------------------------------------------------------- score direction and bounds
def test_lower_is_better_metric_equals_the_function_after_every_stage():
    T = 5
    R, b = random_stream(T, seed=11)
    losses, base = 10 * R, 10 * b  # cells in [0, 10]: outside the default bounds
    metric = ContinualMetrics(T, higher_is_better=False, bounds=None, forgetting="chaudhry")
    metric.update_baseline(base)
    for s in range(T):
        metric.update(losses[s])
        out = metric.compute()
        loop = reference_metrics(
            losses[: s + 1, : s + 1].tolist(), base[: s + 1].tolist(), "chaudhry", False
        )
        expected = continual_metrics(
            losses[: s + 1, : s + 1],
            base[: s + 1],
            forgetting="chaudhry",
            higher_is_better=False,
            bounds=None,
        )
        for key, value in loop.items():
            torch.testing.assert_close(out[key], expected[key], rtol=0, atol=0)
            assert out[key].item() == pytest.approx(value, abs=1e-5)
    assert metric.scores_higher_is_better is False and metric.bounds is None
    # torchmetrics' own attribute describes the outputs (mixed directions): unchanged
    assert metric.higher_is_better is None and ContinualMetrics.higher_is_better is None


def test_metric_of_a_negated_stream_with_flipped_direction_is_the_same():
    T = 4
    R, b = random_stream(T, seed=12)
    high, low = ContinualMetrics(T), ContinualMetrics(T, higher_is_better=False, bounds=(-1, 0))
    high.update_baseline(b)
    low.update_baseline(-b)
    for row in R:
        high.update(row)
        low.update(-row)
        got, want = low.compute(), high.compute()
        assert torch.equal(got["acc"], -want["acc"])
        for key in ("bwt", "fwt", "forgetting"):
            assert torch.equal(got[key], want[key]), key


def test_metric_checks_rows_baselines_and_loaded_states_against_its_bounds():
    metric = ContinualMetrics(2, bounds=(0, 100), dtype=torch.float64)
    with pytest.raises(
        ValueError, match=r"scores\[0, 0\] = 100.5 is outside \[0, 100\].*nothing was recorded"
    ):
        metric.update(torch.tensor([100.5, 50.0], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"baseline\[1\] = -1.0 is outside \[0, 100\]"):
        metric.update_baseline(torch.tensor([NAN, -1.0], dtype=torch.float64))
    metric.update_baseline(torch.tensor([NAN, 20.0], dtype=torch.float64))
    metric.update(torch.tensor([90.0, 30.0], dtype=torch.float64))
    metric.update(torch.tensor([80.0, 95.0], dtype=torch.float64))
    assert metric.compute()["bwt"].item() == -10.0
    state = metric.state_dict()
    with pytest.raises(RuntimeError, match=r"scores\[0, 0\] = 90.0 is outside \[0, 1\]"):
        ContinualMetrics(2, dtype=torch.float64).load_state_dict(state)  # default bounds
    unbounded = ContinualMetrics(2, bounds=None, dtype=torch.float64)
    unbounded.load_state_dict(state)
    assert unbounded.compute()["fwt"].item() == 10.0
    inf_row = torch.tensor([math.inf, 0.5], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"scores\[0, 0\] is inf"):
        ContinualMetrics(2, bounds=None, dtype=torch.float64).update(inf_row)


def test_metric_refuses_bad_direction_and_bounds():
    with pytest.raises(TypeError, match="higher_is_better must be True or False"):
        ContinualMetrics(2, higher_is_better="min")
    with pytest.raises(ValueError, match="bounds must satisfy lo <= hi"):
        ContinualMetrics(2, bounds=(1.0, 0.0))

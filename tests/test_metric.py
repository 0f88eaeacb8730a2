"""ContinualMetrics: equal to the functional layer after every stage, persistent, DDP-safe."""

from __future__ import annotations

import json
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


def _run_ddp(tmp_path, disagree: bool) -> dict:
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
def test_ddp_sync_refuses_ranks_that_disagree(tmp_path):
    results = _run_ddp(tmp_path, disagree=True)
    for rank in (0, 1):
        assert "differs between rank 0 and rank 1" in results[rank]["error"]


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

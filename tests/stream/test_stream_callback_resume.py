"""RewardStreamCallback state in checkpoints: a killed, resumed run equals the uninterrupted one."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from continual_eval.stream import read_jsonl
from continual_eval.stream.callback import RewardStreamCallback

HERE = Path(__file__).parent
SRC = HERE.parents[1] / "src"
SCRIPT = HERE / "stream_resume_script.py"

_spec = importlib.util.spec_from_file_location("stream_resume_script", SCRIPT)
assert _spec is not None and _spec.loader is not None
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)


def run_script(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def trace_rows(path: Path) -> list[tuple]:
    trace = read_jsonl(path)
    return [
        (s.step, s.reward, s.regime_id, s.regime_origin, dict(s.components or {}))
        for s in trace.steps
    ]


@pytest.mark.slow
def test_killed_and_resumed_run_equals_uninterrupted(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    proc = run_script(full, "full")
    assert proc.returncode == 0, proc.stderr[-3000:]
    kill_at = 2 * script.BATCHES_PER_EPOCH + 2  # two steps after the checkpoint at step 12
    proc = run_script(cut, "kill", str(kill_at))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert not (cut / "logs" / "version_0" / "stream_trace.jsonl").exists()

    # the checkpoint holds the 12 steps recorded before it, as compact columns
    ckpt = torch.load(cut / "ckpt" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2 * script.BATCHES_PER_EPOCH
    state = ckpt["callbacks"][RewardStreamCallback(prefix="stream").state_key]
    (columns,) = state["ranks"]
    assert isinstance(columns["reward"], torch.Tensor) and columns["reward"].dtype == torch.float64
    reference = script.reference_trace()
    assert columns["reward"].tolist() == pytest.approx([r["reward"] for r in reference[:12]])

    proc = run_script(cut, "resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    log_full, log_cut = full / "logs" / "version_0", cut / "logs" / "version_0"
    resumed = trace_rows(log_cut / "stream_trace.jsonl")
    assert resumed == trace_rows(log_full / "stream_trace.jsonl")  # exact, step numbers included
    # ... and both are the stream an independent plain-Python SGD produces
    assert [row[0] for row in resumed] == list(range(len(reference)))
    assert [row[1] for row in resumed] == pytest.approx([r["reward"] for r in reference])
    assert [row[2] for row in resumed] == [r["regime_id"] for r in reference]
    assert [row[4]["close"] for row in resumed] == [r["close"] for r in reference]
    assert [row[3] for row in resumed] == [
        "a" if r["regime_id"] == "a_again" else None for r in reference
    ]
    metrics_full = json.loads((log_full / "stream_metrics.json").read_text())
    metrics_cut = json.loads((log_cut / "stream_metrics.json").read_text())
    assert metrics_cut == metrics_full
    assert metrics_full["per_regime"]["b"]["adaptation_speed"] is not None


class StateAt(pl.Callback):
    """Copies the stream callback's state once ``global_step`` reaches ``step``."""

    def __init__(self, stream: RewardStreamCallback, step: int) -> None:
        self.stream, self.step, self.state = stream, step, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            self.state = self.stream.state_dict()


def fit_tracker(root: Path, callbacks: list, ckpt_path: Path | None = None) -> pl.Trainer:
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        callbacks=callbacks,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=any(isinstance(cb, ModelCheckpoint) for cb in callbacks),
    )
    trainer.fit(script.Tracker(), ckpt_path=ckpt_path)
    return trainer


def test_batches_replayed_after_resume_are_not_recorded_twice(tmp_path):
    """A checkpoint whose stream state is ahead of its loop state (steps 6, 7 recorded, the loop
    saved at step 6): Lightning replays batches 6 and 7, which must replace, not repeat, them."""
    n = script.BATCHES_PER_EPOCH
    stream = RewardStreamCallback()
    ahead = StateAt(stream, n + 2)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=n, save_top_k=-1)
    fit_tracker(tmp_path, [stream, ahead, ckpt])
    uninterrupted = [(s.step, s.reward, s.regime_id) for s in stream.steps]
    assert len(uninterrupted) == 2 * n

    checkpoint = torch.load(tmp_path / "ckpt" / f"epoch=0-step={n}.ckpt", weights_only=False)
    assert len(checkpoint["callbacks"][stream.state_key]["ranks"][0]["reward"]) == n
    checkpoint["callbacks"][stream.state_key] = ahead.state
    torch.save(checkpoint, tmp_path / "ahead.ckpt")

    resumed = RewardStreamCallback()
    fit_tracker(tmp_path, [resumed], ckpt_path=tmp_path / "ahead.ckpt")
    assert [(s.step, s.reward, s.regime_id) for s in resumed.steps] == uninterrupted


def test_state_round_trip_and_bad_state(tmp_path):
    stream = RewardStreamCallback()
    fit_tracker(tmp_path, [stream])
    path = tmp_path / "state.pt"
    torch.save(stream.state_dict(), path)
    state = torch.load(path, weights_only=True)  # tensors, lists, strings only
    other = RewardStreamCallback()
    other.load_state_dict(state)
    assert other.state_dict() == state  # pending until the next fit, and not lost meanwhile
    with pytest.raises(ValueError, match="RewardStreamCallback state has version 99"):
        other.load_state_dict({"version": 99, "ranks": []})
    two_ranks = {**state, "ranks": state["ranks"] * 2}
    other.load_state_dict(two_ranks)
    with pytest.raises(ValueError, match="traces of 2 rank"):
        fit_tracker(tmp_path, [other])
    assert other.state_dict() == two_ranks  # the loaded records are kept, not lost

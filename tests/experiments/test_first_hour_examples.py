"""The first hour with the examples: ``examples/attach_callback.py`` prints the same numbers every
run and no checkpoint-directory warning; ``continual-eval fit`` reports each stage's own epochs,
not Lightning's cumulative ``max_epochs``."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest

from continual_eval.experiments.logistic import CircleGridTasks, LogisticClassifier
from continual_eval.experiments.stream import fit_stream
from continual_eval.lightning_log import LIGHTNING_INFO_LOGGER, without_cumulative_epoch_message

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "attach_callback.py"


def run_example(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONHASHSEED": "0", "WANDB_MODE": "offline"}
    return subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def printed_metrics(stdout: str) -> list[str]:
    """The example's own prints: R (a tensor over three lines) and the metrics dict."""
    lines = stdout.strip().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("tensor(["))
    return lines[start:]


@pytest.mark.slow
def test_attach_callback_example_is_seeded_and_quiet(tmp_path: Path) -> None:
    first, second = run_example(tmp_path), run_example(tmp_path)  # same cwd: version_0, version_1
    for proc in (first, second):
        assert proc.returncode == 0, proc.stderr[-3000:]
        output = proc.stdout + proc.stderr
        assert "exists and is not empty" not in output  # ModelCheckpoint's per-stage warning
        assert "log_every_n_steps" not in output
    assert printed_metrics(first.stdout) == printed_metrics(second.stdout)
    assert printed_metrics(first.stdout)[-1].startswith("{'acc': ")
    logs = tmp_path / "lightning_logs"
    assert (logs / "version_0" / "results.json").is_file()
    assert (logs / "version_1" / "results.json").is_file()


def test_cumulative_epoch_message_is_dropped_only_inside_the_block(caplog) -> None:
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    caplog.set_level(logging.INFO, logger=LIGHTNING_INFO_LOGGER)
    with without_cumulative_epoch_message():
        rank_zero_info("`Trainer.fit` stopped: `max_epochs=72` reached.")
        rank_zero_info("another Lightning message")
    rank_zero_info("`Trainer.fit` stopped: `max_epochs=36` reached.")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "another Lightning message",
        "`Trainer.fit` stopped: `max_epochs=36` reached.",
    ]


def test_fit_stream_prints_each_stage_s_own_epochs(tmp_path: Path, capsys, caplog) -> None:
    caplog.set_level(logging.INFO)
    pl.seed_everything(0)
    trainer = pl.Trainer(
        max_epochs=4,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = CircleGridTasks(directions_deg=[0.0, 110.0, 220.0])
    data.setup("fit")
    callback_kwargs = {"dirpath": tmp_path, "log_images": False, "verbose": False}
    fit_stream(trainer, LogisticClassifier(lr=0.8), data, callback_kwargs=callback_kwargs)
    out = capsys.readouterr().out
    stage_lines = [ln for ln in out.splitlines() if "trained:" in ln]
    assert stage_lines == [
        "[continual-eval] stage 1/3 (dir0) trained: 4 epochs (epochs 1-4 of the stream)",
        "[continual-eval] stage 2/3 (dir110) trained: 4 epochs (epochs 5-8 of the stream)",
        "[continual-eval] stage 3/3 (dir220) trained: 4 epochs (epochs 9-12 of the stream)",
    ]
    assert "max_epochs=8" not in out + caplog.text
    assert "max_epochs=12" not in out + caplog.text
    # the filter is gone after the stream: Lightning's message is back for an ordinary fit
    assert not logging.getLogger(LIGHTNING_INFO_LOGGER).filters


def test_one_epoch_stage_is_singular(tmp_path: Path, capsys) -> None:
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = CircleGridTasks(directions_deg=[0.0, 110.0])
    data.setup("fit")
    callback_kwargs = {"dirpath": tmp_path, "log_images": False, "verbose": False}
    fit_stream(trainer, LogisticClassifier(), data, callback_kwargs=callback_kwargs)
    out = capsys.readouterr().out
    assert "[continual-eval] stage 2/2 (dir110) trained: 1 epoch (epochs 2-2 of the stream)" in out

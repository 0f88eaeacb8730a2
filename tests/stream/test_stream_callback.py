"""RewardStreamCallback in a real Trainer, and the bandit example through its config."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader

from continual_eval.stream import read_jsonl
from continual_eval.stream.callback import RewardStreamCallback

ROOT = Path(__file__).resolve().parents[2]
REWARDS = [0.8] * 10 + [0.1, 0.9, 0.9] + [0.6] * 7 + [0.5] * 10
LABELS = ["a"] * 10 + ["b"] * 10 + ["a_again"] * 10


class ScriptedStream(pl.LightningModule):
    """Replays the seed's worked example, one step per batch.

    ``via="outputs"`` returns every reading from training_step; ``via="log"`` logs the reward and
    a component with ``self.log`` and returns only the loss and the labels.
    """

    def __init__(self, via: str = "outputs") -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.via = via

    def train_dataloader(self):
        return DataLoader(list(range(len(REWARDS))), batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def training_step(self, batch, batch_idx):
        t = int(batch[0])
        label = LABELS[t]
        out = {
            "loss": (self.w * 0.0).sum(),
            "regime_id": label,
            "regime_origin": "a" if label == "a_again" else None,
        }
        solved = float(REWARDS[t] > 0.55)
        if self.via == "outputs":
            out["reward"] = torch.tensor(REWARDS[t])
            out["components"] = {"solved": solved}
            out["invalid_action"] = t % 5 == 0
        else:
            self.log("reward", REWARDS[t])
            self.log("components/solved", solved)
        return out


def fit(module, callback, logger, max_steps=-1):
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        max_steps=max_steps,
        logger=logger,
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(module)
    return trainer


def test_callback_scores_worked_example_and_logs_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cb = RewardStreamCallback(solve_component="solved")
    logger = TensorBoardLogger(tmp_path, name="tb")
    fit(ScriptedStream("outputs"), cb, logger)
    rows = cb.result["per_regime"]
    # the seed's printed numbers
    assert f"{rows['b']['per_configuration_reward']:.4f}" == "0.6100"
    assert rows["b"]["adaptation_speed"] == 3 and rows["b"]["recovery_time"] == 2
    assert rows["a"]["adaptation_speed"] is None
    assert f"{rows['a_again']['forgetting']:+.4f}" == "+0.3000"
    assert f"{rows['b']['stability_variance']:.4f}" == "0.0477"
    # invalid every 5th step: a -> steps 0, 5 of 10
    assert rows["a"]["invalid_action_rate"] == pytest.approx(2 / 10)
    # solved: reward > 0.55 -> b: 0.9, 0.9 and seven 0.6
    assert rows["b"]["solve_rate"] == pytest.approx(9 / 10)

    acc = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert "stream/b/adaptation_speed" in scalars
    assert acc.Scalars("stream/b/adaptation_speed")[-1].value == 3
    assert "stream/a/adaptation_speed" not in scalars  # absent is not logged as 0
    assert "stream/b/forgetting" not in scalars
    assert any(tag.startswith("stream/table") for tag in acc.Tags()["tensors"])
    text = (Path(logger.log_dir) / "stream_table.txt").read_text()
    assert "Adaptation speed" in text
    trace = read_jsonl(Path(logger.log_dir) / "stream_trace.jsonl")
    assert trace.reward.tolist() == pytest.approx(REWARDS)
    assert trace.origin_of == {"a_again": "a"}


def test_callback_reads_logged_values_and_writes_csv(tmp_path):
    cb = RewardStreamCallback(solve_component="solved")
    logger = CSVLogger(tmp_path, name="csv")
    fit(ScriptedStream("log"), cb, logger)
    assert cb.result["per_regime"]["a_again"]["per_configuration_reward"] == pytest.approx(0.5)
    assert cb.result["per_regime"]["b"]["solve_rate"] == pytest.approx(9 / 10)
    assert cb.result["per_regime"]["b"]["invalid_action_rate"] is None  # never recorded
    with open(Path(logger.log_dir) / "metrics.csv") as fh:
        header = next(csv.reader(fh))
    assert "stream/b/recovery_time" in header
    assert "stream/a/recovery_time" not in header
    saved = json.loads((Path(logger.log_dir) / "stream_metrics.json").read_text())
    assert saved["per_regime"]["a"]["adaptation_speed"] is None


def test_missing_reward_is_a_clear_error(tmp_path):
    cb = RewardStreamCallback(reward_key="return")
    with pytest.raises(KeyError, match="'return' at training step 0"):
        fit(ScriptedStream("outputs"), cb, False)


def test_bandit_config_runs_and_scores(tmp_path):
    from continual_eval.stream.bandit import main

    cli = main(
        [
            "--config",
            str(ROOT / "configs" / "bandit.yaml"),
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--model.init_args.schedule=[[a, 60], [b, 60], [a_again, 60]]",
        ]
    )
    cb = next(c for c in cli.trainer.callbacks if isinstance(c, RewardStreamCallback))
    rows = cb.result["per_regime"]
    assert list(rows) == ["a", "b", "a_again"]
    assert rows["a"]["forgetting"] is not None
    assert rows["a"]["forgetting"] == rows["a_again"]["forgetting"]
    assert rows["b"]["forgetting"] is None
    assert rows["a"]["adaptation_speed"] is None and rows["b"]["adaptation_speed"] is not None
    assert rows["a"]["invalid_action_rate"] == 0.0  # refused arm only under b
    assert rows["b"]["solve_rate"] is not None
    log_dir = Path(cli.trainer.logger.log_dir)
    assert (log_dir / "stream_table.txt").exists()
    assert len(read_jsonl(log_dir / "stream_trace.jsonl")) == 180


@pytest.mark.slow
def test_bandit_documented_command(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [
        sys.executable,
        "-m",
        "continual_eval.stream.bandit",
        "--config",
        str(ROOT / "configs" / "bandit.yaml"),
        "--model.init_args.schedule=[[a, 30], [b, 30], [a_again, 30]]",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    tables = list((tmp_path / "runs" / "bandit").rglob("stream_table.txt"))
    assert len(tables) == 1
    assert "Forgetting" in tables[0].read_text()


class SparselyMeasured(ScriptedStream):
    """Logs the effective rank and an episode-end flag at step 0 only (and the reward each step)."""

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        if batch_idx == 0:
            self.log("effective_rank", 5.0)
            self.log("episode_end", 1.0)
        return out


def test_a_value_logged_once_is_not_carried_to_later_steps(tmp_path):
    cb = RewardStreamCallback()
    module = SparselyMeasured("log")
    fit(module, cb, False)
    ranks = [step.effective_rank for step in cb.steps]
    ends = [step.episode_end for step in cb.steps]
    assert ranks == [5.0] + [None] * (len(REWARDS) - 1)  # unmeasured, not a stale 5.0
    assert ends == [True] + [False] * (len(REWARDS) - 1)
    assert [step.reward for step in cb.steps] == pytest.approx(REWARDS)
    assert "log" not in module.__dict__  # the module's own log is back after fit

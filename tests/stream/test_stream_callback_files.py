"""RewardStreamCallback's files are replaced atomically: a failed write keeps the previous ones."""

from __future__ import annotations

import json
import os
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from continual_eval.stream import read_jsonl
from continual_eval.stream.callback import RewardStreamCallback

LABELS = ["a"] * 4 + ["b"] * 4 + ["a_again"] * 4
FILES = ("stream_table.txt", "stream_metrics.json", "stream_trace.jsonl")


class Constant(pl.LightningModule):
    """Pays ``level`` under a and a_again, ``level / 2`` under b; returns every reading."""

    def __init__(self, level: float) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.level = level

    def train_dataloader(self) -> DataLoader:
        return DataLoader(list(range(len(LABELS))), batch_size=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> dict:
        label = LABELS[int(batch[0])]
        return {
            "loss": (self.w * 0.0).sum(),
            "reward": self.level / 2 if label == "b" else self.level,
            "regime_id": label,
            "regime_origin": "a" if label == "a_again" else None,
        }


def fit(root: Path, level: float) -> Path:
    logger = CSVLogger(root, name="csv", version=0)
    pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=logger,
        callbacks=[RewardStreamCallback()],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    ).fit(Constant(level))
    return Path(logger.log_dir)


def test_files_are_complete_and_no_temporary_file_is_left(tmp_path):
    log_dir = fit(tmp_path, 0.8)
    assert read_jsonl(log_dir / "stream_trace.jsonl").reward.tolist() == pytest.approx(
        [0.4 if lb == "b" else 0.8 for lb in LABELS]
    )
    metrics = json.loads((log_dir / "stream_metrics.json").read_text())
    assert metrics["per_regime"]["b"]["per_configuration_reward"] == pytest.approx(0.4)
    assert "Forgetting" in (log_dir / "stream_table.txt").read_text()
    assert sorted(p.name for p in log_dir.iterdir()) == sorted([*FILES, "metrics.csv"])


def test_failed_replace_keeps_previous_files_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    log_dir = fit(tmp_path, 0.8)
    before = {name: (log_dir / name).read_bytes() for name in FILES}
    replaced: list[str] = []

    def failing_replace(src, dst):
        replaced.append(Path(dst).name)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        fit(tmp_path, 0.3)  # a different stream, written to the same directory
    assert replaced and set(replaced) <= set(FILES)  # every file goes through os.replace
    assert {name: (log_dir / name).read_bytes() for name in FILES} == before
    assert not [p.name for p in log_dir.iterdir() if p.name.endswith(".tmp")]

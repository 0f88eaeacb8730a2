"""Issue 19 item 7 through the results model (the callback's path): finite, unbounded scores
whose metrics overflow float64 are never stored as ``null``. The recorder checks the cells and
builds the results without validation; a difference beyond float64 (BWT ``1e308 - (-1e308)``) is
then a ``ValueError`` naming the metric and the cells, and a sum that overflows although its mean
is representable gives the exact mean (checked in exact rational arithmetic)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.results import ContinualResults, ScoreMatrix

BIG = 1e308


def unbounded(rows, baseline) -> dict[str, ScoreMatrix]:
    R = torch.tensor(rows, dtype=torch.float64)
    b = torch.tensor(baseline, dtype=torch.float64)
    return {"loss": ScoreMatrix("loss", R, b, higher_is_better=False, bounds=None)}


def test_a_difference_beyond_float64_is_refused_naming_the_cells(tmp_path: Path) -> None:
    matrices = unbounded([[BIG, -BIG], [-BIG, BIG]], [-BIG, BIG])
    with pytest.raises(ValueError, match=r"transfer of stage 1, task 0 overflows.*scores\[1, 0\]"):
        ContinualResults.from_tensors(matrices).write(tmp_path)
    assert not (tmp_path / "results.json").exists()


def test_a_sum_that_overflows_gives_the_exact_mean(tmp_path: Path) -> None:
    rows = [[BIG, 0.5], [BIG, BIG]]
    ContinualResults.from_tensors(unbounded(rows, [0.0, 0.0])).write(tmp_path)
    metrics = json.loads((tmp_path / "results.json").read_text())["matrices"]["loss"]["metrics"]
    exact = (Fraction(BIG) + Fraction(BIG)) / 2  # ACC of the last row, by hand
    assert metrics["acc"] == float(exact) and None not in metrics.values()


class Huge:
    """An unbounded scorer whose scores alternate between +1e308 and -1e308 (finite)."""

    name, higher_is_better, bounds, count_based = "huge", True, None, False

    def __init__(self) -> None:
        self.calls = 0

    def start(self, device):
        pass

    def update(self, preds, target):
        pass

    def local_counts(self):
        return torch.tensor([0.0, 1.0], dtype=torch.float64)

    def result(self, counts):
        self.calls += 1
        return torch.tensor(BIG if self.calls % 2 else -BIG, dtype=torch.float64)


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_fit_whose_metric_overflows_stops_naming_it(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    data = [TensorDataset(torch.randn(8, 4, generator=g), torch.arange(8) % 2) for _ in range(3)]
    callback = ContinualEvalCallback(
        [DataLoader(d, batch_size=4) for d in data],
        scorers={"acc": "accuracy", "huge": Huge()},
        dirpath=tmp_path / "run",
        verbose=False,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[callback],
        default_root_dir=tmp_path,
    )
    with pytest.raises(ValueError, match="backward transfer of stage 1, task 0 overflows"):
        fit_tasks(trainer, Net(), [DataLoader(d, batch_size=4) for d in data])
    document = json.loads((tmp_path / "run" / "results.json").read_text())
    huge = document["matrices"]["huge"]
    assert huge["scores"] == [[-BIG, BIG, -BIG]]  # stage 0 on disk, no metric stored as null
    assert None not in huge["metrics"].values()

"""Standalone DDP run for test_class_incremental.py: ``ContinualEvalCallback(task_classes=...)``
on 2 CPU processes (gloo), test sets of odd sizes sharded without padding (one of them an
iterable dataset that rank 0 scores alone).

Usage: python class_incremental_ddp_script.py OUT_DIR [items]. Lightning re-launches this script
for rank 1. With ``items``: per-item records too (every rank saves the items and labels it
recorded and the class-incremental intervals). Rank 0 saves the weights at the baseline and
after every stage; every rank saves its callback's matrices and ``class_incremental`` section.
The test module rebuilds the single-process reference from the weights with
:func:`make_problem`'s test sets.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from continual_eval import ContinualEvalCallback, fit_tasks
from ddp_teardown import destroy_process_group

FEATURES = 5
TASK_CLASSES = [[1, 0], [4, 2], [3, 5]]  # not in id order, not contiguous
NUM_CLASSES = 6
TEST_SIZES = (37, 29, 41)  # odd: a padded shard would count a sample twice
TRAIN_SIZE = 48


def make_problem(seed: int = 0) -> tuple[list[tuple[Tensor, Tensor]], list[tuple[Tensor, Tensor]]]:
    """Per task: Gaussian blobs of its two classes; ``(train sets, test sets)``."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(NUM_CLASSES, FEATURES, generator=g) * 1.5

    def sample(classes: list[int], n: int) -> tuple[Tensor, Tensor]:
        y = torch.tensor(classes)[torch.randint(0, len(classes), (n,), generator=g)]
        return means[y] + torch.randn(n, FEATURES, generator=g), y

    train = [sample(c, TRAIN_SIZE) for c in TASK_CLASSES]
    test = [sample(c, n) for c, n in zip(TASK_CLASSES, TEST_SIZES, strict=True)]
    return train, test


def make_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, NUM_CLASSES))


class Stream(IterableDataset):
    """An iterable test set: cannot be sharded, so rank 0 scores it alone."""

    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def __iter__(self):
        return iter(zip(self.x, self.y, strict=True))


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_net()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.3)


class Snapshots(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out, self.stage = out, 0

    def on_fit_start(self, trainer, pl_module):
        if self.stage == 0 and trainer.is_global_zero:
            torch.save(pl_module.state_dict(), self.out / "weights_baseline.pt")

    def on_train_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            torch.save(pl_module.state_dict(), self.out / f"weights_{self.stage}.pt")
        self.stage += 1


def main(out: Path, items: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    train, test = make_problem()
    loaders = [DataLoader(TensorDataset(x, y), batch_size=8) for x, y in test]
    loaders[1] = DataLoader(Stream(*test[1]), batch_size=8)
    cb = ContinualEvalCallback(
        loaders,
        task_classes=TASK_CLASSES,
        dirpath=out / "run",
        verbose=False,
        item_records={"resamples": 200} if items else False,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        callbacks=[Snapshots(out), cb],
        default_root_dir=str(out),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    train_loaders = [DataLoader(TensorDataset(x, y), batch_size=8) for x, y in train]
    fit_tasks(trainer, Net(), train_loaders)
    results = cb.continual_results()
    extra = {}
    if items:
        record = cb.record.sections["items"]
        extra = {
            "labels": {j: v.clone() for j, v in record.labels.items()},
            "bits": [record.values("acc_task_agnostic", stage) for stage in (None, 0, 1, 2)],
            "class_il": results.to_dict()["intervals"]["class_incremental"],
        }
    torch.save(
        {
            **extra,
            "world_size": trainer.world_size,
            "matrices": {name: m.scores.clone() for name, m in results.matrices.items()},
            "baselines": {name: m.baseline.clone() for name, m in results.matrices.items()},
            "confusion": results.class_incremental.confusion.to_dense(),
            "section": results.to_dict()["class_incremental"],
        },
        out / f"rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), "items" in sys.argv[2:])
    destroy_process_group()

"""Standalone DDP run for test_callback_ddp.py: 2 CPU processes (gloo), odd test-set sizes.

Usage: python ddp_script.py OUT_DIR. Lightning re-launches this script for rank 1. Rank 0 saves the
weights at the baseline, after every stage and after every training step (for the per-step
evaluation of a third callback, ``eval_every_n_steps=1``); every rank saves the R and curves it
holds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, IterableDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cl_helpers import (
    NUM_CLASSES,
    Classifier,
    eval_loaders,
    make_net,
    make_tasks,
    train_loaders,
)

from continual_eval import ContinualEvalCallback, fit_tasks
from ddp_teardown import destroy_process_group


class Stream(IterableDataset):
    """An iterable test set: cannot be sharded, so rank 0 must score it alone."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        return iter(zip(self.x, self.y, strict=True))


class Snapshots(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out, self.stage, self.step = out, 0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.step += 1  # no gradient accumulation: one optimizer step per batch
        if trainer.is_global_zero:
            torch.save(pl_module.state_dict(), self.out / f"weights_step_{self.step}.pt")

    def on_fit_start(self, trainer, pl_module):
        if self.stage == 0 and trainer.is_global_zero:
            torch.save(pl_module.state_dict(), self.out / "weights_baseline.pt")

    def on_train_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            torch.save(pl_module.state_dict(), self.out / f"weights_{self.stage}.pt")
        self.stage += 1


def main(out: Path) -> None:
    from torchmetrics.classification import MulticlassF1Score

    out.mkdir(parents=True, exist_ok=True)
    tasks = make_tasks()
    loaders = eval_loaders(tasks)
    x, y = tasks[2][1]
    loaders[2] = DataLoader(Stream(x, y), batch_size=8)
    accuracy = ContinualEvalCallback(loaders, dirpath=out / "acc", verbose=False)
    f1 = ContinualEvalCallback(
        eval_loaders(tasks),
        metric=MulticlassF1Score(num_classes=NUM_CLASSES, average="macro"),
        prefix="f1/",
        dirpath=out / "f1",
        verbose=False,
    )
    steps = ContinualEvalCallback(
        eval_loaders(tasks),
        eval_every_n_steps=1,
        prefix="steps/",
        dirpath=out / "steps",
        verbose=False,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        callbacks=[Snapshots(out), accuracy, f1, steps],
        default_root_dir=str(out),
        logger=pl.loggers.CSVLogger(out, name="logs"),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    torch.save(
        {
            "scores": accuracy.scores,
            "baseline": accuracy.baseline,
            "f1_scores": f1.scores,
            "f1_baseline": f1.baseline,
            "world_size": trainer.world_size,
            "curves": steps.curves(),
            "cache_bytes": steps._task_loaders.cache.nbytes,
            "cache_entries": steps._task_loaders.cache.num_cached,
        },
        out / f"rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    destroy_process_group()

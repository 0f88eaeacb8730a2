"""Standalone DDP run for test_fast_path.py: 2 CPU processes (gloo), odd test-set sizes.

Usage: python fast_path_ddp_script.py OUT_DIR. Lightning re-launches this script for rank 1. Four
callbacks on one Trainer score the same tasks (a TensorDataset, a worker loader over a per-sample
transform, a Subset of a TensorDataset) with the fast path and the worker pool on or off and the
batch cache on or off; every rank saves each callback's R, baseline and curves.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cl_helpers import Classifier, make_net, make_tasks, train_loaders

from continual_eval import ContinualEvalCallback, evaluation, fit_tasks
from ddp_teardown import destroy_process_group


class Shifted(Dataset):
    """A per-sample (deterministic) transform: read through its DataLoader's workers."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i] + 0.5, self.y[i]


class Switched(ContinualEvalCallback):
    """Evaluates with ``FAST_PATH`` and ``POOLED_LOADERS`` both set to ``fast``."""

    def __init__(self, *args, fast: bool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fast = fast

    def _evaluate(self, *args, **kwargs):
        saved = evaluation.switches.FAST_PATH, evaluation.switches.POOLED_LOADERS
        evaluation.switches.FAST_PATH = evaluation.switches.POOLED_LOADERS = self.fast
        try:
            return super()._evaluate(*args, **kwargs)
        finally:
            evaluation.switches.FAST_PATH, evaluation.switches.POOLED_LOADERS = saved


def test_loaders(tasks) -> list[DataLoader]:
    (_, (x0, y0)), (_, (x1, y1)), (_, (x2, y2)) = tasks
    return [
        DataLoader(TensorDataset(x0, y0), batch_size=5),
        DataLoader(Shifted(x1, y1), batch_size=4, num_workers=1),
        DataLoader(Subset(TensorDataset(x2, y2), list(range(40, -1, -2))), batch_size=3),
    ]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tasks = make_tasks()
    variants = {
        f"{'fast' if fast else 'plain'}-{'cached' if cache else 'uncached'}": Switched(
            test_loaders(tasks),
            fast=fast,
            cache_test_batches=cache,
            eval_every_n_steps=1,
            prefix=f"{fast}-{cache}/",
            dirpath=out / f"{fast}-{cache}",
            verbose=False,
            log_images=False,
        )
        for fast in (True, False)
        for cache in (True, False)
    }
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        callbacks=list(variants.values()),
        default_root_dir=str(out),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    torch.save(
        {
            name: {"scores": cb.scores, "baseline": cb.baseline, "curves": cb.curves()}
            for name, cb in variants.items()
        },
        out / f"rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    destroy_process_group()

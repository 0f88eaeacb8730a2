"""Standalone DDP run for test_ddp_loaders.py: 2 CPU processes (gloo), test loaders that a plain
re-shard would get wrong.

Usage: python ddp_loader_script.py OUT_DIR. Lightning re-launches this script for rank 1.

The module's ``test_dataloader()`` (built for ``trainer.test``, called by the callback once the
process group is up) returns, for test sets of 41, 37 and 41 samples:

0. a sequential loader with ``drop_last=True`` (batch 8): one process reads samples 0..39;
1. a ``DistributedSampler(shuffle=True, seed=3)`` loader: each rank's sampler reads a padded half;
2. a ``DistributedSampler(shuffle=False, drop_last=True)`` loader: the replicas read 0..39.

Rank 0 saves the weights at the baseline and after every stage; every rank saves the R it holds.
A second Trainer then fits with a shuffled ``drop_last=True`` test loader, which cannot be
reproduced under DDP: every rank writes the error it got.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.evaluation import EvaluationError
from ddp_teardown import destroy_process_group

TEST_SIZES = (41, 37, 41)


class DistributedTestData(Classifier):
    def __init__(self, net, tests) -> None:
        super().__init__(net)
        self.tests = tests

    def test_dataloader(self):
        sets = [TensorDataset(x, y) for x, y in self.tests]
        return [
            DataLoader(sets[0], batch_size=8, drop_last=True),
            DataLoader(sets[1], batch_size=8, sampler=DistributedSampler(sets[1], seed=3)),
            DataLoader(
                sets[2],
                batch_size=8,
                sampler=DistributedSampler(sets[2], shuffle=False, drop_last=True),
            ),
        ]


class Snapshots(pl.Callback):
    """Rank 0 saves the weights at the baseline and after every stage (the stage is counted from
    the files: under ddp_spawn every fit runs in new child processes)."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_fit_start(self, trainer, pl_module):
        if trainer.is_global_zero and not (self.out / "weights_baseline.pt").exists():
            torch.save(pl_module.state_dict(), self.out / "weights_baseline.pt")

    def on_train_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            stage = len(list(self.out.glob("weights_[0-9]*.pt")))
            torch.save(pl_module.state_dict(), self.out / f"weights_{stage}.pt")


def ddp_trainer(out: Path, callbacks: list, strategy: str) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=1,
        callbacks=callbacks,
        default_root_dir=str(out),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )


def main(out: Path, strategy: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tasks = make_tasks(test_sizes=TEST_SIZES)
    model = DistributedTestData(make_net(), [te for _, te in tasks])
    cb = ContinualEvalCallback(dirpath=out / "acc", verbose=False)
    snapshots = Snapshots(out)
    # spawned strategies cannot fit one Trainer twice: a new Trainer per task
    trainers: list[pl.Trainer] = []

    def new_trainer(task: int) -> pl.Trainer:
        trainers.append(ddp_trainer(out, [snapshots, cb], strategy))
        return trainers[-1]

    fit_tasks(new_trainer, model, train_loaders(tasks))
    trainer = trainers[-1]
    torch.save(
        {"scores": cb.scores, "baseline": cb.baseline, "world_size": trainer.world_size},
        out / f"rank{trainer.global_rank}.pt",
    )

    loaders = eval_loaders(tasks)
    x, y = tasks[1][1]
    loaders[1] = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, drop_last=True)
    refusing = ContinualEvalCallback(loaders, dirpath=out / "refused", verbose=False)
    trainer = ddp_trainer(out, [refusing], strategy)
    try:
        trainer.fit(Classifier(make_net()), train_loaders(tasks)[0])
        message = "no error"
    except EvaluationError as err:
        message = str(err)
    except Exception as err:  # ddp_spawn: the child's error, re-raised in the launching process
        message = str(err) if "EvaluationError" in str(err) else f"other error: {err!r}"
    (out / f"refused_rank{trainer.global_rank}.txt").write_text(message)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "ddp")
    destroy_process_group()

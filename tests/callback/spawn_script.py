"""Standalone 2-process runs for test_callback_spawn.py (gloo on CPU).

Usage: python spawn_script.py OUT_DIR STRATEGY PATTERN, with STRATEGY ``ddp`` or ``ddp_spawn``
and PATTERN ``schedule`` (one fit over 4 tasks, ``epochs_per_task=1``) or ``fit_tasks`` (one fit
per task over 2 tasks, a new Trainer each: each fit spawns its own processes). Rank 0 saves the
weights at the end of every stage; the process that started the run (the main process: under
``ddp_spawn`` it trains nothing itself) saves what its callback holds after training.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders

from continual_eval import ContinualEvalCallback, fit_tasks, scheduled_task

#: tasks per pattern
NUM_TASKS = {"schedule": 4, "fit_tasks": 2}


class Scheduled(Classifier):
    def __init__(self, net, loaders) -> None:
        super().__init__(net)
        self.loaders = loaders

    def train_dataloader(self):
        return self.loaders[scheduled_task(self.trainer, 1)]


class Snapshots(pl.Callback):
    """Rank 0 saves the weights at the end of each stage (every epoch: one epoch per stage)."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            stage = len(list(self.out.glob("weights_*.pt")))
            torch.save(pl_module.state_dict(), self.out / f"weights_{stage}.pt")


def trainer(strategy: str, out: Path, callbacks, **kwargs) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        callbacks=callbacks,
        default_root_dir=str(out),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        **kwargs,
    )


def main(strategy: str, pattern: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tasks = make_tasks(NUM_TASKS[pattern])
    callback = ContinualEvalCallback(eval_loaders(tasks), dirpath=out / "results", verbose=False)
    if pattern == "schedule":
        callback.epochs_per_task = 1
        run = trainer(
            strategy,
            out,
            [Snapshots(out), callback],
            max_epochs=NUM_TASKS[pattern],
            reload_dataloaders_every_n_epochs=1,
        )
        run.fit(Scheduled(make_net(), train_loaders(tasks)))
    else:
        snapshots = Snapshots(out)
        fit_tasks(
            lambda task: trainer(strategy, out, [snapshots, callback], max_epochs=1),
            Classifier(make_net()),
            train_loaders(tasks),
        )
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # the launching process (rank 0 under ddp)
        torch.save(
            {
                "scores": callback.scores,
                "baseline": callback.baseline,
                "stages": callback.stages_completed,
                "results_dir": str(callback.results_dir),
                "results": callback.results(),
            },
            out / "main_process.pt",
        )


if __name__ == "__main__":
    main(sys.argv[2], sys.argv[3], Path(sys.argv[1]))

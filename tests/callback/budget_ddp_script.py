"""Standalone DDP run for test_callback_budget.py: 2 CPU processes (gloo), 4 tasks of odd test
sizes, ``stage_eval_subset=20`` (stratified) and ``eval_old_tasks_every=2``.

Usage: python budget_ddp_script.py OUT_DIR. Rank 0 saves the weights at the baseline and after
every stage; every rank saves the R it holds and the subset indices it drew.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders
from ddp_script import Snapshots

from continual_eval import ContinualEvalCallback, fit_tasks
from ddp_teardown import destroy_process_group


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tasks = make_tasks(4)
    callback = ContinualEvalCallback(
        eval_loaders(tasks),
        dirpath=out / "run",
        verbose=False,
        stage_eval_subset=20,
        stage_eval_seed=5,
        eval_old_tasks_every=2,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        callbacks=[Snapshots(out), callback],
        default_root_dir=str(out),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    loaders = callback._task_loaders
    assert loaders is not None
    torch.save(
        {
            "scores": callback.scores,
            "baseline": callback.baseline,
            "world_size": trainer.world_size,
            "indices": [indices.tolist() for indices in loaders.stage_indices],
        },
        out / f"rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    destroy_process_group()

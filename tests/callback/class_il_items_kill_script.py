"""Standalone run for test_class_il_intervals.py's kill -9 test: class-incremental evaluation
(``task_classes``) with per-item records, 3 tasks of class_incremental_ddp_script's Gaussian
blobs.

Usage: python class_il_items_kill_script.py MODE OUT_DIR with MODE ``full`` (uninterrupted),
``killed`` (the process kills itself with SIGKILL in the middle of stage 2's evaluation, after
task 2 trained) or ``resume`` (continue the killed run from ``OUT_DIR/ckpt/task_1.ckpt``).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import lightning.pytorch as pl
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from class_incremental_ddp_script import TASK_CLASSES, Net, make_problem

from continual_eval import ContinualEvalCallback, fit_tasks


class KillDuringEvaluation(Net):
    """Kills its own process at the 3rd test batch of the evaluation after stage ``kill_stage``."""

    def __init__(self, callback: ContinualEvalCallback, kill_stage: int | None) -> None:
        super().__init__()
        self.callback, self.kill_stage, self.eval_batches = callback, kill_stage, 0

    def forward(self, x):
        if not self.training and self.callback.stages_completed == self.kill_stage:
            self.eval_batches += 1
            if self.eval_batches == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(x)


def main(mode: str, out: Path) -> None:
    train, test = make_problem()
    callback = ContinualEvalCallback(
        [DataLoader(TensorDataset(x, y), batch_size=8) for x, y in test],
        task_classes=TASK_CLASSES,
        dirpath=out / "results",
        verbose=False,
        item_records={"resamples": 300, "seed": 4},
    )
    model = KillDuringEvaluation(callback, 2 if mode == "killed" else None)
    fit_tasks(
        lambda task: pl.Trainer(
            callbacks=[callback],
            accelerator="cpu",
            devices=1,
            max_epochs=2,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            default_root_dir=str(out),
        ),
        model,
        [DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True) for x, y in train],
        checkpoint_dir=out / "ckpt",
        ckpt_path=out / "ckpt" / "task_1.ckpt" if mode == "resume" else None,
        seed=3,
    )


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))

"""Standalone run for test_callback_lifecycle.py's kill -9 test.

Usage: python kill_script.py MODE OUT_DIR with MODE ``full`` (3 tasks, uninterrupted), ``killed``
(the process kills itself with SIGKILL in the middle of stage 2's evaluation, after task 2 trained)
or ``resume`` (continue the killed run from ``OUT_DIR/ckpt/task_1.ckpt``). Dropout and shuffled
train loaders: every random draw must be reproduced for the resume to equal the full run.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders, trainer_kwargs

from continual_eval import ContinualEvalCallback, fit_tasks


class KillDuringEvaluation(Classifier):
    """Kills its own process at the 3rd test batch of the evaluation after stage ``kill_stage``."""

    def __init__(self, callback: ContinualEvalCallback, kill_stage: int | None) -> None:
        super().__init__(make_net(dropout=0.3))
        self.callback, self.kill_stage, self.eval_batches = callback, kill_stage, 0

    def forward(self, x):
        if not self.training and self.callback.stages_completed == self.kill_stage:
            self.eval_batches += 1
            if self.eval_batches == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(x)


def main(mode: str, out: Path) -> None:
    tasks = make_tasks()
    callback = ContinualEvalCallback(eval_loaders(tasks), dirpath=out / "results", verbose=False)
    model = KillDuringEvaluation(callback, 2 if mode == "killed" else None)
    fit_tasks(
        lambda task: pl.Trainer(callbacks=[callback], **trainer_kwargs(out, max_epochs=2)),
        model,
        train_loaders(tasks, shuffle=True),
        checkpoint_dir=out / "ckpt",
        ckpt_path=out / "ckpt" / "task_1.ckpt" if mode == "resume" else None,
        seed=3,
    )
    torch.save({"scores": callback.scores, "weights": model.state_dict()}, out / f"{mode}.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))

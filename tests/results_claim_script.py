"""Standalone run for test_results_files.py: one continual run on a shared results directory.

Usage: python results_claim_script.py RESULTS_DIR MARKERS TAG SECONDS. In its first evaluation
forward (the baseline) the model writes ``MARKERS/TAG.baseline`` and then waits until
``MARKERS/TAG.release`` exists (at most SECONDS); every training step writes
``MARKERS/TAG.trained``; the run's id goes to ``MARKERS/TAG.run_id``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import lightning.pytorch as pl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "callback"))

from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders, trainer_kwargs

from continual_eval import ContinualEvalCallback, fit_tasks


class SlowBaseline(Classifier):
    def __init__(self, markers: Path, tag: str, seconds: float) -> None:
        super().__init__(make_net())
        self.markers, self.tag, self.seconds, self.slept = markers, tag, seconds, False

    def forward(self, x):
        if not self.training and not self.slept:
            self.slept = True
            (self.markers / f"{self.tag}.baseline").write_text(str(os.getpid()))
            deadline = time.time() + self.seconds
            while not (self.markers / f"{self.tag}.release").exists() and time.time() < deadline:
                time.sleep(0.05)
        return super().forward(x)

    def training_step(self, batch, batch_idx):
        (self.markers / f"{self.tag}.trained").write_text("trained")
        return super().training_step(batch, batch_idx)


def main(results_dir: Path, markers: Path, tag: str, seconds: float) -> None:
    tasks = make_tasks()
    callback = ContinualEvalCallback(eval_loaders(tasks), dirpath=results_dir, verbose=False)
    (markers / f"{tag}.run_id").write_text(callback.run_id)
    fit_tasks(
        lambda task: pl.Trainer(
            callbacks=[callback], **trainer_kwargs(markers / tag, max_epochs=1)
        ),
        SlowBaseline(markers, tag, seconds),
        train_loaders(tasks),
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], float(sys.argv[4]))

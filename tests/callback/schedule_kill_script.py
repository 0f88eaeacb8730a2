"""Standalone run for test_callback_resume.py's kill -9 tests of a single fit over a schedule.

Usage: python schedule_kill_script.py MODE OUT_DIR GENERATORS with MODE ``full`` (uninterrupted),
``killed:E`` (the process kills itself with SIGKILL at the start of epoch ``E``) or ``resume``
(continue the killed run from ``OUT_DIR/ckpt/last.ckpt`` in a fresh process). GENERATORS is how
the train loaders shuffle: ``own`` (each task's loader its own seeded ``torch.Generator``),
``shared`` (one generator for every task's loader) or ``global`` (the global torch RNG).
Dropout too: every random draw must be reproduced for the resume to equal the full run.
Writes ``MODE.pt`` (weights, R) and ``MODE-warnings.txt`` (the warnings the callback gave).
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, trainer_kwargs

from continual_eval import ContinualEvalCallback, scheduled_task

K, T = 2, 3  # epochs per task, tasks


class KillAtEpoch(Callback):
    def __init__(self, epoch: int | None) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGKILL)


def main(mode: str, out: Path, generators: str) -> None:
    name, _, epoch = mode.partition(":")
    pl.seed_everything(5, verbose=False)
    if name == "resume":
        torch.manual_seed(999)  # the resuming process starts from another random state
    tasks = make_tasks(T)
    shared = torch.Generator().manual_seed(100)
    loaders = []
    for j, (train, _) in enumerate(tasks):
        own = torch.Generator().manual_seed(100 + j) if generators == "own" else shared
        loaders.append(
            DataLoader(
                TensorDataset(*train),
                batch_size=16,
                shuffle=True,
                generator=None if generators == "global" else own,
            )
        )

    class Scheduled(Classifier):
        def train_dataloader(self):
            return loaders[scheduled_task(self.trainer, K)]

    callback = ContinualEvalCallback(
        eval_loaders(tasks), epochs_per_task=K, dirpath=out / "results", verbose=False
    )
    trainer = pl.Trainer(
        callbacks=[
            ModelCheckpoint(dirpath=out / "ckpt", save_last=True, every_n_epochs=1),
            KillAtEpoch(int(epoch) if epoch else None),
            callback,
        ],
        reload_dataloaders_every_n_epochs=1,
        **trainer_kwargs(out, max_epochs=K * T, enable_checkpointing=True),
    )
    model = Scheduled(make_net(dropout=0.3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, ckpt_path=out / "ckpt" / "last.ckpt" if name == "resume" else None)
    notes = [str(w.message) for w in caught if "ContinualEvalCallback" in str(w.message)]
    (out / f"{name}-warnings.txt").write_text("\n".join(notes))
    torch.save({"scores": callback.scores, "weights": model.state_dict()}, out / f"{name}.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])

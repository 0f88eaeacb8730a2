"""Standalone run for test_stream_callback_resume.py: a reward stream killed and resumed.

Usage: ``python stream_resume_script.py OUT_DIR MODE [KILL_AT]``; MODE is ``full`` (uninterrupted),
``kill`` (SIGKILL from a callback once ``global_step == KILL_AT``, after ModelCheckpoint saved
``last.ckpt`` at an earlier step) or ``resume`` (continue ``OUT_DIR/ckpt/last.ckpt``). The module
tracks a regime-dependent target with one SGD-trained weight, so every reward depends on the weights
restored from the checkpoint. It records through all three channels: ``record()`` (reward, label),
the returned dict (origin) and ``self.log`` (a component).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from continual_eval.stream.callback import RewardStreamCallback, record

BATCHES_PER_EPOCH = 6
EPOCHS = 5
LR = 0.1
TARGET = {"a": 1.0, "b": -0.5, "a_again": 1.0}
# Checkpoints at epoch ends (saved from on_train_batch_end, after this callback recorded the step):
# Lightning restarts a plain DataLoader's epoch from its first batch on a mid-epoch resume, so only
# an epoch-end checkpoint continues exactly where the uninterrupted run went on.
CHECKPOINT_EVERY = BATCHES_PER_EPOCH  # optimizer steps


def label_at(t: int) -> str:
    """The regime of global step ``t``: a for 10 steps, b for 10, then a_again."""
    return "a" if t < 10 else "b" if t < 20 else "a_again"


def reference_trace() -> list[dict]:
    """The uninterrupted stream computed with plain Python floats (SGD on ``(w - target)^2``)."""
    w, out = 0.0, []
    for t in range(BATCHES_PER_EPOCH * EPOCHS):
        target = TARGET[label_at(t)]
        out.append(
            {
                "reward": 1.0 - (w - target) ** 2,
                "regime_id": label_at(t),
                "close": float(abs(w - target) < 0.3),
            }
        )
        w -= LR * 2.0 * (w - target)
    return out


class Tracker(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(list(range(BATCHES_PER_EPOCH)), batch_size=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> dict:
        t = self.current_epoch * BATCHES_PER_EPOCH + int(batch[0])
        label = label_at(t)
        error = self.w - TARGET[label]
        record(self, reward=1.0 - error.detach() ** 2, regime_id=label)
        self.log("components/close", float(abs(error.item()) < 0.3))
        return {"loss": error**2, "regime_origin": "a" if label == "a_again" else None}


class KillAt(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main(out: Path, mode: str, kill_at: int | None) -> None:
    torch.manual_seed(0)
    callbacks: list[pl.Callback] = [
        RewardStreamCallback(solve_component="close"),
        ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=CHECKPOINT_EVERY, save_last=True),
    ]
    if mode == "kill":
        assert kill_at is not None
        callbacks.append(KillAt(kill_at))
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=EPOCHS,
        logger=CSVLogger(out, name="logs", version=0),
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tracker(), ckpt_path=out / "ckpt" / "last.ckpt" if mode == "resume" else None)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)

"""Standalone run for test_online_resume.py's kill -9 test.

Usage: ``python online_kill_script.py MODE OUT_DIR``. The stream (240 samples) is trained in 4
epochs of 60 (``train_dataloader`` returns the epoch's chunk; the dataloaders are reloaded every
epoch), read ahead from the whole stream (``stream=``), with windows of 4 batches that straddle
the epochs, dropout (so every training batch gets an eval-mode forward) reseeded at every batch,
and held-out sets with a segment boundary. ModelCheckpoint saves at every epoch end. MODE:
``full`` (uninterrupted), ``killed`` (SIGKILL in the middle of epoch 2 and of window 3), or
``resume`` (continue the killed run from ``OUT_DIR/ckpt/epoch1.ckpt``). Writes ``weights.pt``.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from online_helpers import Learner, make_net, run_stream, trainer
from torch.utils.data import DataLoader, TensorDataset

from continual_eval.online import OnlineEvalCallback

CHUNK = 60


class ChunkedStream(Learner):
    def __init__(self, dataset: TensorDataset) -> None:
        super().__init__(make_net(dropout=0.2, seed=2))
        self.dataset = dataset

    def on_train_start(self) -> None:
        pass  # seeded per epoch instead

    def on_train_batch_start(self, batch, batch_idx) -> None:
        # per batch: Lightning itself draws from the global RNG when it restarts an epoch from a
        # checkpoint (after on_train_epoch_start), which a per-epoch seed would not undo
        torch.manual_seed(1000 * self.current_epoch + batch_idx)

    def train_dataloader(self) -> DataLoader:
        x, y = self.dataset.tensors
        start = self.current_epoch * CHUNK
        chunk = TensorDataset(x[start : start + CHUNK], y[start : start + CHUNK])
        return DataLoader(chunk, batch_size=10)


class KillAt(pl.Callback):
    def __init__(self, batch: int | None) -> None:
        self.batch = batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.fit_loop.total_batch_idx == self.batch:
            os.kill(os.getpid(), signal.SIGKILL)


def main(mode: str, out: Path) -> None:
    torch.set_num_threads(1)
    x, y = run_stream(240, 15, seed=2)
    stream = TensorDataset(x, y)
    held = [
        DataLoader(TensorDataset(*run_stream(21, 21, seed=30)), batch_size=8),
        DataLoader(TensorDataset(*run_stream(17, 17, seed=31)), batch_size=8),
    ]
    online = OnlineEvalCallback(
        near_future_delays=[2],
        label_delays=[3],
        window_batches=4,
        blind_window=8,
        stream=stream,
        held_out=held,
        segment_starts=[0, 120],
        eval_every_n_windows=2,
        dirpath=out / "results",
        verbose=False,
    )
    checkpoint = ModelCheckpoint(
        dirpath=out / "ckpt",
        filename="epoch{epoch}",
        auto_insert_metric_name=False,
        every_n_epochs=1,
        save_top_k=-1,
    )
    run = trainer(
        out,
        [online, checkpoint, KillAt(15 if mode == "killed" else None)],
        max_epochs=4,
        reload_dataloaders_every_n_epochs=1,
        enable_checkpointing=True,
    )
    model = ChunkedStream(stream)
    run.fit(model, ckpt_path=out / "ckpt" / "epoch1.ckpt" if mode == "resume" else None)
    torch.save(model.state_dict(), out / "weights.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))

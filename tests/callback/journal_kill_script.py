"""Standalone run for test_stage_journal.py's kill -9 test.

Usage: python journal_kill_script.py MODE OUT_DIR with MODE ``full`` (40 tasks, one fit over a
schedule, uninterrupted) or ``killed`` (the process kills itself with SIGKILL at the first test
batch of the evaluation after stage 35, when results.json was last rebuilt after 35 stages and
the journal holds 36).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback

T, KILL_AFTER = 40, 36


class Model(pl.LightningModule):
    def __init__(self, train: list[DataLoader], callback: ContinualEvalCallback, kill: bool):
        super().__init__()
        self.train_loaders, self.callback, self.kill = train, callback, kill
        self.net = nn.Linear(4, 2)

    def forward(self, x):
        if self.kill and not self.training and self.callback.stages_completed == KILL_AFTER:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def train_dataloader(self):
        return self.train_loaders[self.current_epoch]


def main(mode: str, out: Path) -> None:
    g = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(12, 4, generator=g), torch.randint(0, 2, (12,), generator=g)) for _ in range(T)
    ]
    train = [DataLoader(TensorDataset(x[:8], y[:8]), batch_size=8) for x, y in data]
    test = [DataLoader(TensorDataset(x[8:], y[8:]), batch_size=4) for x, y in data]
    callback = ContinualEvalCallback(test, epochs_per_task=1, dirpath=out, verbose=False)
    torch.manual_seed(0)
    model = Model(train, callback, mode == "killed")
    trainer = pl.Trainer(
        max_epochs=T,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        reload_dataloaders_every_n_epochs=1,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(model)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))

"""Standalone DDP run for test_stream_callback_ddp.py: 2 CPU processes (gloo), one stream each.

Usage: ``python stream_ddp_script.py OUT_DIR``. Lightning re-launches this script for rank 1. Each
rank replays its own reward stream (``STREAMS[rank]``, 30 steps of regimes a, b, a_again), records
it with ``record()``, and saves what its callback holds (result, traces); ModelCheckpoint saves
mid-training (step 15) and the script saves a final checkpoint after fit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from continual_eval.stream.callback import RewardStreamCallback, record
from ddp_teardown import destroy_process_group

LABELS = ["a"] * 10 + ["b"] * 10 + ["a_again"] * 10
STREAMS = [
    [0.8] * 10 + [0.1, 0.9, 0.9] + [0.6] * 7 + [0.5] * 10,  # rank 0: the worked example
    [0.2] * 10 + [0.9] * 10 + [0.4] * 10,  # rank 1
]


class PerRankStream(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def train_dataloader(self) -> DataLoader:
        # the DistributedSampler gives each of the 2 ranks 30 of these 60 items: 30 steps each
        return DataLoader(list(range(2 * len(LABELS))), batch_size=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        label = LABELS[batch_idx]
        record(
            self,
            reward=STREAMS[self.global_rank][batch_idx],
            regime_id=label,
            regime_origin="a" if label == "a_again" else None,
        )
        return (self.w * 0.0).sum()


def main(out: Path) -> None:
    cb = RewardStreamCallback()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        callbacks=[
            cb,
            ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=15, save_top_k=-1),
        ],
        logger=CSVLogger(out, name="logs", version=0),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(PerRankStream())
    trainer.save_checkpoint(out / "final.ckpt")  # every rank builds it; rank 0 writes it
    torch.save(
        {
            "world_size": trainer.world_size,
            "result": cb.result,
            "own": cb.trace.reward.tolist(),
            "traces": [t.reward.tolist() for t in cb.traces],
        },
        out / f"rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    destroy_process_group()

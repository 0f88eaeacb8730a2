"""Standalone run for test_online_ddp.py: one stream scored by 1 process or by 2 DDP processes.

Usage: ``python online_ddp_script.py OUT_DIR DEVICES``: ``DEVICES=1`` trains with batch size 8,
``DEVICES=2`` (DDP, gloo, Lightning re-launches this script for rank 1) with 4 per rank, so both
train the same global batches. Lightning would shuffle a training loader under DDP, so the run
passes ``use_distributed_sampler=False`` and a ``DistributedSampler(shuffle=False)`` of its own.
The stream has 97 samples: on 2 ranks the sampler pads it to 98 (rank 1's last sample repeats
sample 0). ModelCheckpoint saves in the middle of window 1
(after training batch 4). Each rank writes what its callback holds to ``online_rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from online_helpers import Learner, make_net, run_stream, trainer
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from continual_eval.online import OnlineEvalCallback
from ddp_teardown import destroy_process_group


class StreamLearner(Learner):
    """The learner with its stream: in order, interleaved over the ranks."""

    def __init__(self, dataset: TensorDataset, batch_size: int) -> None:
        super().__init__(make_net(seed=1))
        self.dataset, self.batch_size = dataset, batch_size

    def train_dataloader(self) -> DataLoader:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        sampler = DistributedSampler(self.dataset, shuffle=False) if distributed else None
        return DataLoader(self.dataset, batch_size=self.batch_size, sampler=sampler)


def main(out: Path, devices: int) -> None:
    torch.set_num_threads(1)
    x, y = run_stream(97, 11, seed=3)
    held = [
        DataLoader(TensorDataset(*run_stream(13, 13, seed=20)), batch_size=4),
        DataLoader(TensorDataset(*run_stream(7, 7, seed=21)), batch_size=4),
    ]
    cb = OnlineEvalCallback(
        near_future_delays=[1, 3],
        label_delays=[2],
        window_batches=3,
        blind_window=5,
        held_out=held,
        segment_starts=[0, 48],
        eval_every_n_windows=2,
        dirpath=out / "results",
        verbose=False,
    )
    checkpoint = ModelCheckpoint(
        dirpath=out / "ckpt", filename="mid", every_n_train_steps=5, save_top_k=1
    )
    run = trainer(
        out,
        [cb, checkpoint],
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        enable_checkpointing=True,
        use_distributed_sampler=False,
    )
    run.fit(StreamLearner(TensorDataset(x, y), 8 // devices))
    document = cb.results.to_dict(summary=False)
    path = out / f"online_rank{run.global_rank}.json"
    path.write_text(json.dumps(document), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
    destroy_process_group()

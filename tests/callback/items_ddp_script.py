"""Standalone DDP run for test_callback_items.py: 2 CPU processes (gloo), per-item records.

Usage: python items_ddp_script.py OUT_DIR. Test sets of 37, 29 and 41 items (odd shards), a
1-item task (rank 1 holds no sample of it), an iterable test set (not shardable: rank 0
scores it alone) and one read through a shuffling, padding DistributedSampler. Rank 0 saves the
weights at the baseline and after every stage and the tasks; every rank saves the items it
recorded and its intervals. A held-out set of 23 items (odd shards, ids ``T + h``) is recorded
beside the tasks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders

from continual_eval import ContinualEvalCallback, fit_tasks
from ddp_teardown import destroy_process_group


class Stream(IterableDataset):
    """An iterable test set: cannot be sharded, so rank 0 must score it alone."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        return iter(zip(self.x, self.y, strict=True))


class Weights(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out, self.stage = out, 0

    def on_fit_start(self, trainer, pl_module):
        if self.stage == 0 and trainer.is_global_zero:
            torch.save(pl_module.state_dict(), self.out / "weights_0.pt")

    def on_train_end(self, trainer, pl_module):
        self.stage += 1
        if trainer.is_global_zero:
            torch.save(pl_module.state_dict(), self.out / f"weights_{self.stage}.pt")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tasks = make_tasks(4, test_sizes=(37, 29, 41, 1))
    loaders = eval_loaders(tasks)
    x, y = tasks[2][1]
    loaders[2] = DataLoader(Stream(x, y), batch_size=8)
    # a loader built for trainer.test: a shuffling DistributedSampler that pads 29 to 30
    test_set = TensorDataset(*tasks[1][1])
    padded = DistributedSampler(test_set, num_replicas=2, rank=0, shuffle=True, seed=3)
    loaders[1] = DataLoader(test_set, batch_size=8, sampler=padded)
    ((_, general),) = make_tasks(1, seed=7, test_sizes=(23,))
    cb = ContinualEvalCallback(
        loaders,
        held_out_dataloaders={"general": DataLoader(TensorDataset(*general), batch_size=5)},
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        dirpath=out / "acc",
        verbose=False,
        item_records={"resamples": 300},
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        callbacks=[Weights(out), cb],
        default_root_dir=str(out),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks)[:3])
    record = cb.record.sections["items"]
    saved = {
        name: [[record.values(name, stage)[j] for j in range(4)] for stage in (None, 0, 1, 2)]
        for name in ("acc", "loss")
    }
    saved["held_out"] = {
        name: [record.values(name, stage)[4] for stage in (None, 0, 1, 2)]
        for name in ("acc", "loss")
    }
    saved["held_out_intervals"] = cb.results()["intervals"]["held_out"]
    intervals = cb.results()["intervals"]["matrices"]
    saved["intervals"] = {
        name: {k: [v["estimate"], v["low"], v["high"]] for k, v in m["metrics"].items()}
        for name, m in intervals.items()
    }
    torch.save(saved, out / f"rank{trainer.global_rank}.pt")
    if trainer.is_global_zero:
        torch.save(tasks, out / "tasks.pt")
        torch.save(general, out / "held_out.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    destroy_process_group()

"""Standalone run for test_callback_items.py: per-item records under ModelParallelStrategy (FSDP2
``fully_shard``, lockstep evaluation) on 2 CPU processes (gloo), test sets of 1, 5 and 7 samples
(batch 2: rank 1 holds no sample of task 0) and an iterable one (rank 0 alone); the data and
model of ``sharded_script.py``.

Usage: python items_sharded_script.py OUT_DIR. Rank 0 saves the full weights at the baseline and
after every stage; every rank saves the items it recorded.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sharded_script import TRAINED_TASKS, make_data, make_net, test_loaders, train_loaders

from ddp_teardown import destroy_process_group


def main(out: Path) -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FSDPModule, fully_shard

    from continual_eval import ContinualEvalCallback, fit_tasks

    class Sharded(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_net()

        def configure_model(self) -> None:
            if isinstance(self.net, FSDPModule):
                return
            mesh = self.device_mesh["data_parallel"]
            for layer in (self.net[0], self.net[2]):
                fully_shard(layer, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.2)

    class Weights(pl.Callback):
        def __init__(self) -> None:
            self.stage = 0

        def save(self, trainer, pl_module, name: str) -> None:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            weights = get_model_state_dict(pl_module.net, options=options)  # every rank
            if trainer.is_global_zero:
                torch.save(weights, out / f"weights_{name}.pt")

        def on_fit_start(self, trainer, pl_module):
            if self.stage == 0:
                self.save(trainer, pl_module, "0")

        def on_train_end(self, trainer, pl_module):
            self.stage += 1
            self.save(trainer, pl_module, str(self.stage))

    out.mkdir(parents=True, exist_ok=True)
    tasks = make_data()
    cb = ContinualEvalCallback(
        test_loaders(tasks),
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        dirpath=out / "main",
        verbose=False,
        log_images=False,
        item_records={"resamples": 200},
    )

    weights = Weights()

    def new_trainer(task: int) -> pl.Trainer:
        return pl.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=ModelParallelStrategy(
                data_parallel_size=2,
                tensor_parallel_size=1,
                save_distributed_checkpoint=False,
                timeout=timedelta(seconds=90),
            ),
            max_epochs=1,
            callbacks=[weights, cb],
            default_root_dir=str(out),
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
        )

    trainers: list[pl.Trainer] = []

    def factory(task: int) -> pl.Trainer:
        trainers.append(new_trainer(task))
        return trainers[-1]

    fit_tasks(factory, Sharded(), train_loaders(tasks)[:TRAINED_TASKS], seed=5)
    record = cb.record.sections["items"]
    saved = {
        name: [record.values(name, stage) for stage in (None, *range(TRAINED_TASKS))]
        for name in ("acc", "loss")
    }
    torch.save(saved, out / f"rank{trainers[-1].global_rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    destroy_process_group()

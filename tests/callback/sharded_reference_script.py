"""Standalone run for test_sharded_reference.py: ``train_reference(kind="isolated")`` under
``ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)`` on 2 CPU processes (gloo),
the LightningModule's ``configure_model`` applying FSDP2 ``fully_shard``; two tasks with test sets
of 5 and 7 samples (batch 2: the ranks hold 3 + 2 and 4 + 3 samples, so the 5-sample task is
evaluated in lockstep with a discarded pass), 1 epoch.

Usage: python sharded_reference_script.py OUT_DIR. In order, on both ranks:

1. ``unsharded``: the reference of the untrained, unsharded model (copied with ``copy.deepcopy``;
   each copy is sharded by ``configure_model`` when its fit starts);
2. the model is fitted once (that shards it in place) and its full weights saved (rank 0);
3. ``train_reference`` of the sharded model without ``model_factory`` and with a factory of the
   wrong architecture: both refused, on both ranks, before any collective (no hang);
4. ``sharded``: its reference with ``model_factory`` (copies from the full state dict), then the
   model's full weights again (it must be unchanged).

The Trainers pass ``use_distributed_sampler=False``: both ranks train on the whole training set,
so the gradients the ranks average are equal and the sharded training is the single-process one
bit for bit (``(g + g) / 2 == g``); what differs from one process is the sharded copy and the
sharded, lockstep evaluation, which is what the test compares. Every rank saves what it holds.
Lightning re-launches this script for rank 1; the test imports the data and model helpers.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.utils.data import DataLoader, TensorDataset

FEATURES, CLASSES = 6, 4
TEST_SIZES = (5, 7)
TRAIN_SIZE, TRAIN_BATCH, TEST_BATCH = 6, 2, 2
SEED = 3


def make_data(seed: int = 0) -> list[tuple[tuple[torch.Tensor, torch.Tensor], ...]]:
    """Per task ``(train (x, y), test (x, y))``: Gaussian blobs of the classes."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(CLASSES, FEATURES, generator=g) * 1.5

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, CLASSES, (n,), generator=g)
        return means[y] + torch.randn(n, FEATURES, generator=g), y

    return [(sample(TRAIN_SIZE), sample(size)) for size in TEST_SIZES]


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))

    def configure_model(self) -> None:
        if self.device_mesh is None or isinstance(self.net, FSDPModule):  # one process; sharded
            return
        mesh = self.device_mesh["data_parallel"]
        for layer in (self.net[0], self.net[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)


def make_model() -> Net:
    torch.manual_seed(0)
    return Net()


def train_loaders(tasks) -> list[DataLoader]:
    return [DataLoader(TensorDataset(*tr), batch_size=TRAIN_BATCH, shuffle=True) for tr, _ in tasks]


def test_loaders(tasks) -> list[DataLoader]:
    return [DataLoader(TensorDataset(*te), batch_size=TEST_BATCH) for _, te in tasks]


class Probe(pl.Callback):
    """How each fitted copy's parameters were sharded when its training ended."""

    def __init__(self, seen: list[str | None]) -> None:
        self.seen = seen

    def on_train_end(self, trainer, pl_module):
        from continual_eval.evaluation.strategy import parameter_sharding

        self.seen.append(parameter_sharding(pl_module))


def trainer_factory(devices: int, seen: list[str | None] | None = None):
    """``() -> Trainer``: one process (``devices=1``) or ModelParallelStrategy on 2."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    def new_trainer() -> pl.Trainer:
        sharded = {}
        if devices > 1:
            sharded = dict(
                strategy=ModelParallelStrategy(
                    data_parallel_size=devices,
                    tensor_parallel_size=1,
                    save_distributed_checkpoint=False,
                    timeout=timedelta(seconds=90),  # a hang fails fast
                ),
                use_distributed_sampler=False,  # every rank trains on all of it: see above
            )
        return pl.Trainer(
            accelerator="cpu",
            devices=devices,
            max_epochs=1,
            callbacks=[] if seen is None else [Probe(seen)],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            **sharded,
        )

    return new_trainer


def reference(model: pl.LightningModule, trainer, **kwargs):
    from continual_eval import train_reference

    tasks = make_data()
    return train_reference(
        model,
        train_loaders(tasks),
        test_loaders(tasks),
        kind="isolated",
        trainer_factory=trainer,
        seed=SEED,
        **kwargs,
    )


def saved(ref) -> dict:
    return {"scores": ref.scores, "baseline": ref.baseline, "steps": ref.steps_trained}


def main(out: Path) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from continual_eval.evaluation.strategy import parameter_sharding
    from ddp_teardown import destroy_process_group

    out.mkdir(parents=True, exist_ok=True)
    seen: list[str | None] = []
    new_trainer = trainer_factory(2, seen)
    result: dict = {"unsharded": saved(reference(make_model(), new_trainer))}

    model = make_model()
    trainer = new_trainer()
    trainer.fit(model, train_dataloaders=train_loaders(make_data())[0])
    rank = trainer.global_rank
    result["model_sharding"] = parameter_sharding(model)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    fitted = get_model_state_dict(model, options=options)  # a collective: every rank

    class Wider(Net):
        def __init__(self) -> None:
            super().__init__()
            self.net[2] = nn.Linear(16, CLASSES + 1)

    for name, factory in (("no_factory", None), ("wrong_factory", Wider)):
        try:
            reference(model, new_trainer, model_factory=factory)
            result[name] = "no error"
        except ValueError as err:
            result[name] = str(err)
    result["sharded"] = saved(reference(model, new_trainer, model_factory=Net))
    after = get_model_state_dict(model, options=options)
    result["model_unchanged"] = all(torch.equal(after[k], v) for k, v in fitted.items())
    result["copies_sharding"] = seen
    if rank == 0:
        torch.save(fitted, out / "weights_fitted.pt")
    torch.save(result, out / f"rank{rank}.pt")
    destroy_process_group()  # both ranks, before the interpreter exits


if __name__ == "__main__":
    main(Path(sys.argv[1]))

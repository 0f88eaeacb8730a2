"""Standalone run for test_sharded.py: ModelParallelStrategy (FSDP2 ``fully_shard``) on 2 CPU
processes (gloo), test sets of 1, 5 and 7 samples (batch 2) and an iterable (unshardable) one.

Usage: python sharded_script.py MODE OUT_DIR, MODE one of

* ``full``: three tasks, uninterrupted. Two callbacks on one Trainer: ``main`` on all four test
  sets (accuracy, top-2 accuracy, cross-entropy, a torchmetrics macro F1) and ``steps`` on the
  three map-style ones (``eval_every_n_steps=1`` on a fixed subset, the batch cache,
  ``task_classes``: the two class-incremental matrices, and a torchmetrics accuracy). Both ranks
  gather the full weights at the baseline, after every optimizer step and after every stage
  (rank 0 saves them); at the end, a lockstep evaluation of a 0-sample test set next to a
  1-sample one (it must raise on both ranks, not hang). Every rank saves what it holds.
* ``killed``: the same run (without the weight snapshots); both processes kill themselves
  (SIGKILL) at their 3rd forward pass of stage 2's evaluation, after task 2 trained (lockstep:
  both reach it).
* ``resume``: continue the killed run from ``OUT_DIR/ckpt/task_1.ckpt``.

Lightning re-launches this script for rank 1. The data helpers are imported by the test for its
plain-torch reference.
"""

from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

FEATURES = 6
CLASSES = 8  # task j brings classes 2j, 2j + 1 (task 3, the iterable one, brings 6 and 7)
TEST_SIZES = (1, 5, 7, 5)  # task 3: an iterable dataset (cannot be sharded)
TRAIN_SIZE, TRAIN_BATCH, TEST_BATCH = 8, 2, 2
STEPS_PER_TASK = TRAIN_SIZE // (2 * TRAIN_BATCH)  # optimizer steps per task on 2 ranks
TASK_CLASSES = [[2 * j, 2 * j + 1] for j in range(len(TEST_SIZES))]
SUBSET = 3  # StepEvaluation(subset=...)
TRAINED_TASKS = 3


def make_data(seed: int = 0) -> list[tuple[tuple[torch.Tensor, torch.Tensor], ...]]:
    """Per task ``(train (x, y), test (x, y))``: Gaussian blobs of the task's two classes."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(CLASSES, FEATURES, generator=g) * 2.0
    tasks = []
    for j, size in enumerate(TEST_SIZES):

        def sample(n: int, j: int = j) -> tuple[torch.Tensor, torch.Tensor]:
            y = 2 * j + torch.randint(0, 2, (n,), generator=g)
            return means[y] + torch.randn(n, FEATURES, generator=g), y

        tasks.append((sample(TRAIN_SIZE), sample(size)))
    return tasks


def make_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))


class Stream(IterableDataset):
    """An iterable test set: it cannot be sharded, so every rank reads all of it and only rank 0
    counts it."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __iter__(self):
        return iter(zip(self.x, self.y, strict=True))


def test_loaders(tasks) -> list[DataLoader]:
    loaders = [DataLoader(TensorDataset(*te), batch_size=TEST_BATCH) for _, te in tasks[:3]]
    return [*loaders, DataLoader(Stream(*tasks[3][1]), batch_size=TEST_BATCH)]


def train_loaders(tasks) -> list[DataLoader]:
    return [DataLoader(TensorDataset(*tr), batch_size=TRAIN_BATCH) for tr, _ in tasks]


def main(mode: str, out: Path) -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

    from continual_eval import ContinualEvalCallback, StepEvaluation, fit_tasks
    from continual_eval.evaluation import (
        EvaluationError,
        Lockstep,
        collective_forward,
        evaluate_tasks,
    )

    class Sharded(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_net()
            self.kill_at: int | None = None  # the eval forward at which to SIGKILL
            self.eval_calls = 0

        def configure_model(self) -> None:
            if isinstance(self.net, FSDPModule):  # a later fit: sharded already
                return
            mesh = self.device_mesh["data_parallel"]
            for layer in (self.net[0], self.net[2]):
                fully_shard(layer, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

        def forward(self, x):
            if not self.training and self.kill_at is not None:
                self.eval_calls += 1
                if self.eval_calls == self.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.2)

    def full_weights(module: nn.Module) -> dict[str, torch.Tensor]:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(module.net, options=options)  # a collective: every rank

    class Snapshots(pl.Callback):
        """Full weights at the baseline, after every step and every stage (rank 0 saves)."""

        def __init__(self) -> None:
            self.stage, self.step = 0, 0

        def save(self, trainer, pl_module, name: str) -> None:
            weights = full_weights(pl_module)
            if trainer.is_global_zero:
                torch.save(weights, out / f"weights_{name}.pt")

        def on_fit_start(self, trainer, pl_module):
            if self.stage == 0:
                self.save(trainer, pl_module, "baseline")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.step += 1
            self.save(trainer, pl_module, f"step_{self.step}")

        def on_train_end(self, trainer, pl_module):
            self.save(trainer, pl_module, f"stage_{self.stage}")
            self.stage += 1

    class KillAtStage(pl.Callback):
        """Arms the model's SIGKILL for stage 2's evaluation (``killed`` mode)."""

        def __init__(self) -> None:
            self.stage = 0

        def on_train_end(self, trainer, pl_module):
            if self.stage == 2:
                pl_module.kill_at = 3
            self.stage += 1

    out.mkdir(parents=True, exist_ok=True)
    tasks = make_data()
    main_cb = ContinualEvalCallback(
        test_loaders(tasks),
        scorers={
            "accuracy": "accuracy",
            "top2": "top2",
            "cross_entropy": "loss",
            "f1": MulticlassF1Score(num_classes=CLASSES, average="macro"),
        },
        dirpath=out / "main",
        verbose=False,
        log_images=False,
    )
    steps_cb = ContinualEvalCallback(
        test_loaders(tasks)[:3],  # a fixed subset needs map-style test sets
        scorers={"accuracy": "accuracy", "tm_accuracy": MulticlassAccuracy(num_classes=CLASSES)},
        task_classes=TASK_CLASSES[:3],
        eval_every_n_steps=StepEvaluation(1, subset=SUBSET),
        cache_test_batches=True,
        prefix="steps/",
        dirpath=out / "steps",
        verbose=False,
        log_images=False,
    )
    callbacks: list[pl.Callback] = [main_cb, steps_cb]
    if mode == "full":
        callbacks.insert(0, Snapshots())
    if mode == "killed":  # before the evaluating callbacks: armed when their hook runs
        callbacks.insert(0, KillAtStage())
    trainers: list[pl.Trainer] = []

    def new_trainer(task: int) -> pl.Trainer:
        # a Trainer per task: each task's fit starts at epoch 0, so the DistributedSampler that
        # Lightning puts into the train loaders shuffles the same way in a resumed run
        trainers.append(
            pl.Trainer(
                accelerator="cpu",
                devices=2,
                strategy=ModelParallelStrategy(
                    data_parallel_size=2,
                    tensor_parallel_size=1,
                    save_distributed_checkpoint=False,
                    timeout=timedelta(seconds=90),  # a hang fails fast
                ),
                max_epochs=1,
                callbacks=callbacks,
                default_root_dir=str(out),
                logger=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                enable_checkpointing=False,
            )
        )
        return trainers[-1]

    model = Sharded()
    fit_tasks(
        new_trainer,
        model,
        train_loaders(tasks)[:TRAINED_TASKS],
        checkpoint_dir=out / "ckpt",
        ckpt_path=out / "ckpt" / "task_1.ckpt" if mode == "resume" else None,
        seed=5,
    )
    trainer = trainers[-1]
    rank = trainer.global_rank

    def matrices(callback: ContinualEvalCallback) -> dict[str, dict[str, torch.Tensor]]:
        results = callback.continual_results()
        return {
            name: {"scores": m.scores, "baseline": m.baseline, "steps": m.step_scores}
            for name, m in results.matrices.items()
        }

    saved = {
        "lockstep": collective_forward(trainer.strategy, model),
        "main": matrices(main_cb),
        "steps": matrices(steps_cb),
        "curve_steps": steps_cb.curves()[0],
        "curve_full": steps_cb.continual_results().steps.full,
        "parameters": [c.parameters for c in main_cb.continual_results().cost.per_stage],
    }
    # a 0-sample test set next to a 1-sample one, in lockstep: raises on both ranks together
    import torch.distributed as dist

    def max_reduce(t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    def sum_reduce(t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t)
        return t

    x, y = tasks[0][1]
    empty = DataLoader(TensorDataset(x[:0], y[:0]), batch_size=2)
    one = DataLoader(TensorDataset(x[rank:1], y[rank:1]), batch_size=2)  # rank 1: none
    spare = DataLoader(TensorDataset(x[:1], y[:1]), batch_size=2)
    try:
        evaluate_tasks(
            model,
            [one, empty],
            [0, 1],
            all_reduce=sum_reduce,
            rank=rank,
            world_size=2,
            lockstep=Lockstep(max_reduce, [spare, None]),
        )
        saved["empty"] = "no error"
    except EvaluationError as err:
        saved["empty"] = str(err)
    torch.save(saved, out / f"{mode}_rank{rank}.pt")
    dist.destroy_process_group()  # both ranks, before the interpreter exits


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))

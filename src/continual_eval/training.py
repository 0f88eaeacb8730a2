"""Driving a task sequence through Lightning: :func:`fit_tasks` (one ``fit`` per task) and
:func:`scheduled_task` (one ``fit`` over a schedule of ``epochs_per_task`` epochs per task)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import LightningModule, Trainer

from continual_eval.lightning_log import without_cumulative_epoch_message

if TYPE_CHECKING:  # pragma: no cover
    from continual_eval.callback import ContinualEvalCallback

__all__ = ["fit_tasks", "scheduled_task"]


def scheduled_task(trainer: Trainer, epochs_per_task: int) -> int:
    """The task whose training data the epoch about to run should use: ``epoch // epochs_per_task``.

    Call it from ``train_dataloader`` with ``Trainer(reload_dataloaders_every_n_epochs=1)``. It
    counts epochs already started, so it is also right while a resumed fit reloads its data (when
    ``trainer.current_epoch`` still shows the last finished epoch).
    """
    return trainer.fit_loop.epoch_progress.current.processed // epochs_per_task


def fit_already_done(trainer: Trainer) -> bool:
    """Whether another ``fit`` on ``trainer`` would train nothing (max_steps/max_epochs reached)."""
    max_steps, max_epochs = trainer.max_steps, trainer.max_epochs
    if max_steps is not None and max_steps != -1 and trainer.global_step >= max_steps:
        return True
    return max_epochs is not None and max_epochs != -1 and trainer.current_epoch >= max_epochs


def spawns_processes(trainer: Trainer) -> bool:
    """Whether ``trainer``'s strategy runs the fit in child processes (``ddp_spawn``, notebooks)."""
    from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

    return isinstance(trainer.strategy.launcher, _MultiProcessingLauncher)


def _find_callbacks(trainer: Trainer) -> list[ContinualEvalCallback]:
    from continual_eval.callback import ContinualEvalCallback

    found = [cb for cb in trainer.callbacks if isinstance(cb, ContinualEvalCallback)]
    if not found:
        raise ValueError("fit_tasks needs a ContinualEvalCallback in trainer.callbacks, found none")
    return found


def fit_tasks(
    trainer: Trainer | Callable[[int], Trainer],
    model: LightningModule,
    train_dataloaders: Sequence[Any],
    *,
    val_dataloaders: Sequence[Any] | None = None,
    ckpt_path: str | os.PathLike[str] | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    seed: int | None = None,
) -> ContinualEvalCallback:
    """Train ``model`` on ``train_dataloaders[i]`` for ``i = 0, 1, ...``, one ``fit`` per task.

    Args:
        trainer: one Trainer for the whole sequence (each task trains for the Trainer's
            ``max_epochs``; ``fit_loop.max_epochs`` is raised before every fit), or a factory
            ``task_id -> Trainer`` for a new Trainer per task. The Trainer(s) must hold at least
            one :class:`ContinualEvalCallback` (the same instances across a factory's Trainers).
        model: the LightningModule, trained in place.
        train_dataloaders: one training loader per task.
        val_dataloaders: optional, one validation loader per task.
        ckpt_path: resume from a checkpoint written by ``checkpoint_dir`` (``task_{i}.ckpt``):
            the model weights and the callback's recorded stages are restored and training
            continues with the first unrecorded task.
        checkpoint_dir: after each task, save ``task_{i}.ckpt`` there (weights, callback state).
        seed: if given, ``seed_everything(seed + i)`` before task ``i``, so a resumed sequence
            draws the same random numbers as an uninterrupted one.

    Returns:
        The (first) :class:`ContinualEvalCallback` (``.scores``, ``.baseline``, ``.results()``).

    Raises:
        ValueError: no callback, a Trainer without a positive ``max_epochs``, or more tasks than
            test dataloaders.
    """
    from lightning.pytorch import seed_everything

    factory = None if isinstance(trainer, Trainer) else trainer
    current = trainer if isinstance(trainer, Trainer) else None
    epochs = None
    if current is not None:
        epochs = current.fit_loop.max_epochs
        if epochs is None or epochs < 1 or current.fit_loop.max_steps != -1:
            raise ValueError(
                "fit_tasks on one Trainer needs Trainer(max_epochs=E) with E >= 1 epochs per task "
                "and no max_steps; pass a factory (task_id -> Trainer) for other stopping rules"
            )
    if current is not None and spawns_processes(current) and len(train_dataloaders) > 1:
        raise ValueError(
            f"fit_tasks on one Trainer cannot run under strategy "
            f"{type(current.strategy).__name__} with a spawn-based launcher: Lightning refuses a "
            "second fit on such a Trainer. Pass a factory (task_id -> Trainer) for a new Trainer "
            "per task"
        )
    if val_dataloaders is not None and len(val_dataloaders) != len(train_dataloaders):
        raise ValueError(
            f"{len(val_dataloaders)} val_dataloaders for {len(train_dataloaders)} train_dataloaders"
        )
    start = 0
    callbacks: list[ContinualEvalCallback] | None = None
    if ckpt_path is not None:
        checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(checkpoint["state_dict"])
        first = current if current is not None else factory(0)  # type: ignore[misc]
        callbacks = _find_callbacks(first)
        for cb in callbacks:
            if cb.state_key not in checkpoint.get("callbacks", {}):
                raise ValueError(f"{ckpt_path} holds no state for {cb.state_key}")
            cb.load_state_dict(checkpoint["callbacks"][cb.state_key])
        done = {cb.stages_completed for cb in callbacks}
        if len(done) != 1:
            raise ValueError(
                f"{ckpt_path}: the callbacks recorded different numbers of stages {done}"
            )
        start = done.pop()
        current = first if current is not None else None
    prebuilt = None
    if factory is not None and callbacks is None and start < len(train_dataloaders):
        prebuilt = factory(start)  # its callbacks tell the number of test loaders before training
    known = current if current is not None else prebuilt
    for cb in callbacks or (_find_callbacks(known) if known is not None else []):
        if cb.num_tasks is not None and cb.num_tasks < len(train_dataloaders):
            raise ValueError(
                f"fit_tasks: {len(train_dataloaders)} train dataloaders (tasks) but the "
                f"ContinualEvalCallback has {cb.num_tasks} test dataloaders; every task needs "
                "one test loader (index = task id). Nothing was trained"
            )
    for task in range(start, len(train_dataloaders)):
        if factory is not None:
            current = prebuilt if task == start and prebuilt is not None else factory(task)
        assert current is not None
        found = _find_callbacks(current)
        if callbacks is not None and [id(cb) for cb in found] != [id(cb) for cb in callbacks]:
            raise ValueError(
                "the factory's Trainers must share the same ContinualEvalCallback instances"
            )
        callbacks = found
        if epochs is not None:
            current.fit_loop.max_epochs = current.current_epoch + epochs
        if seed is not None:
            seed_everything(seed + task, verbose=False)
        # on one Trainer max_epochs grows with every task: Lightning's "max_epochs=N reached"
        # would count the epochs of all tasks so far (the callback prints each stage instead)
        quiet = without_cumulative_epoch_message() if factory is None else contextlib.nullcontext()
        with quiet:
            current.fit(
                model,
                train_dataloaders=train_dataloaders[task],
                val_dataloaders=None if val_dataloaders is None else val_dataloaders[task],
            )
        if checkpoint_dir is not None:
            current.save_checkpoint(os.path.join(checkpoint_dir, f"task_{task}.ckpt"))
    if callbacks is None:
        callbacks = _find_callbacks(current if current is not None else factory(0))  # type: ignore[misc]
    return callbacks[0]

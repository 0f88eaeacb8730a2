"""Driving a task sequence through Lightning: [`fit_tasks`][continual_eval.fit_tasks] (one ``fit``
per task) and [`scheduled_task`][continual_eval.scheduled_task] (one ``fit`` over a schedule of
``epochs_per_task`` epochs per task)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything

from continual_eval._run_end import end_run
from continual_eval.callback import ContinualEvalCallback
from continual_eval.lightning_log import without_cumulative_epoch_message

__all__ = ["fit_tasks", "scheduled_task"]


def scheduled_task(trainer: Trainer, epochs_per_task: int) -> int:
    """The task whose training data the epoch about to run should use: ``epoch // epochs_per_task``.

    Call it from ``train_dataloader`` with ``Trainer(reload_dataloaders_every_n_epochs=1)``. It
    counts epochs already started, so it is also right while a resumed fit reloads its data (when
    ``trainer.current_epoch`` still shows the last finished epoch).
    """
    # the fit loop's epoch progress is a _Progress of _ProcessedTracker counters at run time
    processed: int = trainer.fit_loop.epoch_progress.current.processed  # type: ignore[attr-defined]
    return processed // epochs_per_task


def spawns_processes(trainer: Trainer) -> bool:
    """Whether ``trainer``'s strategy runs the fit in child processes (``ddp_spawn``, notebooks)."""
    from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

    return isinstance(trainer.strategy.launcher, _MultiProcessingLauncher)


def _find_callbacks(trainer: Trainer) -> list[ContinualEvalCallback]:
    callbacks = trainer.callbacks  # type: ignore[attr-defined]  # set by the callback connector
    found = [cb for cb in callbacks if isinstance(cb, ContinualEvalCallback)]
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
            one [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] (the same instances
            across a factory's Trainers).
        model: the LightningModule, trained in place.
        train_dataloaders: one training loader per task.
        val_dataloaders: optional, one validation loader per task.
        ckpt_path: resume from a checkpoint written by ``checkpoint_dir`` (``task_{i}.ckpt``):
            the model weights and the callback's recorded stages are restored and training
            continues with the first unrecorded task. On one Trainer, the Trainer's epoch and
            step counters continue from the checkpoint's, so the resumed fits draw the same
            random numbers as the uninterrupted sequence's (bitwise equal weights and R).
        checkpoint_dir: after each task, save ``task_{i}.ckpt`` there (weights, callback state).
        seed: if given, ``seed_everything(seed + i)`` before task ``i``, so a resumed sequence
            draws the same random numbers as an uninterrupted one.

    With fewer ``train_dataloaders`` than the callback has test loaders, the run ends after
    those tasks: the metrics cover only the first ``k x k`` block of R, which ``results.json``
    records (its ``coverage`` section) and, with ``verbose``, one printed line says.

    Returns:
        The (first) [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] (``.scores``,
        ``.baseline``, ``.results()``).

    Raises:
        ValueError: no callback, a Trainer without a positive ``max_epochs``, or more tasks than
            test dataloaders.
    """
    factory = None if isinstance(trainer, Trainer) else trainer
    current = trainer if isinstance(trainer, Trainer) else None
    epochs = None if current is None else _epochs_per_fit(current, len(train_dataloaders))
    if val_dataloaders is not None and len(val_dataloaders) != len(train_dataloaders):
        raise ValueError(
            f"{len(val_dataloaders)} val_dataloaders for {len(train_dataloaders)} train_dataloaders"
        )
    start, callbacks, first = 0, None, None
    if ckpt_path is not None:
        first = current if current is not None else factory(0)  # type: ignore[misc]
        callbacks = _find_callbacks(first)
        checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        start = _resume(ckpt_path, checkpoint, model, callbacks)
        if current is not None:
            _continue_loop_counters(current, checkpoint)
        current = first if current is not None else None
    prebuilt = None
    if factory is not None and callbacks is None and start < len(train_dataloaders):
        prebuilt = factory(start)  # its callbacks tell the number of test loaders before training
    known = current if current is not None else prebuilt
    _check_task_count(
        callbacks or (_find_callbacks(known) if known is not None else []), len(train_dataloaders)
    )
    for task in range(start, len(train_dataloaders)):
        if factory is not None:
            current = prebuilt if task == start and prebuilt is not None else factory(task)
        assert current is not None
        callbacks = _same_callbacks(callbacks, _find_callbacks(current))
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
    last = current if current is not None else first
    if last is None:
        last = factory(0)  # type: ignore[misc]
    if callbacks is None:
        callbacks = _find_callbacks(last)
    for cb in callbacks:  # fewer tasks trained than test loaders: say what the metrics cover
        end_run(cb, last)
    return callbacks[0]


def _epochs_per_fit(trainer: Trainer, num_tasks: int) -> int:
    """The epochs of each task on one Trainer (its ``max_epochs``), refused when that Trainer
    cannot run a sequence."""
    epochs = trainer.fit_loop.max_epochs
    if epochs is None or epochs < 1 or trainer.fit_loop.max_steps != -1:
        raise ValueError(
            "fit_tasks on one Trainer needs Trainer(max_epochs=E) with E >= 1 epochs per task "
            "and no max_steps; pass a factory (task_id -> Trainer) for other stopping rules"
        )
    if spawns_processes(trainer) and num_tasks > 1:
        raise ValueError(
            f"fit_tasks on one Trainer cannot run under strategy "
            f"{type(trainer.strategy).__name__} with a spawn-based launcher: Lightning refuses a "
            "second fit on such a Trainer. Pass a factory (task_id -> Trainer) for a new Trainer "
            "per task"
        )
    return epochs


def _resume(
    ckpt_path: str | os.PathLike[str],
    checkpoint: dict[str, Any],
    model: LightningModule,
    callbacks: Sequence[ContinualEvalCallback],
) -> int:
    """Load a ``task_{i}.ckpt``'s weights into ``model`` and its states into ``callbacks``;
    returns the first task to train (the stages they recorded)."""
    model.load_state_dict(checkpoint["state_dict"])
    for cb in callbacks:
        if cb.state_key not in checkpoint.get("callbacks", {}):
            raise ValueError(f"{ckpt_path} holds no state for {cb.state_key}")
        cb.load_state_dict(checkpoint["callbacks"][cb.state_key])
    done = {cb.stages_completed for cb in callbacks}
    if len(done) != 1:
        raise ValueError(f"{ckpt_path}: the callbacks recorded different numbers of stages {done}")
    return done.pop()


def _continue_loop_counters(trainer: Trainer, checkpoint: dict[str, Any]) -> None:
    """Continue a fresh Trainer's fit-loop counters (epochs, batches, optimizer steps) from
    ``task_{i}.ckpt``, as if it had run the fits before it.

    Why: in every fit that starts after epoch 0, Lightning's training epoch loop makes a second
    train-loader iterator (``TrainingEpochLoop.on_run_start``: ``current_epoch > 0``), one more draw
    from the global RNG for the iterator's base seed; a fresh Trainer's first fit starts at epoch 0
    and skips it, so the resumed task shuffled and dropped out with other numbers than the same task
    on the Trainer that had trained the tasks before (measured: max |dW| = 0.026 after two tasks).
    Only the progress counters are loaded, through the loops' own ``_load_from_state_dict`` (the
    one private name used; no public call loads counters alone): ``_Loop.load_state_dict`` would
    also mark the loops as restarting, i.e. resume a fit midway instead of starting the next one.
    """
    # lightning.pytorch.loops.loop._Loop is the base of every loop; not exported publicly
    from lightning.pytorch.loops.loop import _Loop

    state = checkpoint.get("loops", {}).get("fit_loop")
    if state is None:
        return

    def load(loop: _Loop, prefix: str) -> None:
        loop._load_from_state_dict(state.copy(), prefix)
        for name, child in vars(loop).items():
            if isinstance(child, _Loop):
                load(child, f"{prefix}{name}.")

    load(trainer.fit_loop, "")


def _check_task_count(callbacks: Sequence[ContinualEvalCallback], num_tasks: int) -> None:
    for cb in callbacks:
        if cb.num_tasks is not None and cb.num_tasks < num_tasks:
            raise ValueError(
                f"fit_tasks: {num_tasks} train dataloaders (tasks) but the "
                f"ContinualEvalCallback has {cb.num_tasks} test dataloaders; every task needs "
                "one test loader (index = task id). Nothing was trained"
            )


def _same_callbacks(
    before: list[ContinualEvalCallback] | None, found: list[ContinualEvalCallback]
) -> list[ContinualEvalCallback]:
    """A factory's Trainers must hold the same callback instances as the first one."""
    if before is not None and [id(cb) for cb in found] != [id(cb) for cb in before]:
        raise ValueError(
            "the factory's Trainers must share the same ContinualEvalCallback instances"
        )
    return found

"""Task-stream plumbing shared by the experiments: a datamodule that serves one task at a time,
and the loop that trains a task stream with a :class:`~continual_eval.ContinualEvalCallback`."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset

from continual_eval.callback import ContinualEvalCallback
from continual_eval.lightning_log import without_cumulative_epoch_message
from continual_eval.results import default_results_dir

__all__ = ["TaskStreamDataModule", "fit_stream", "joint_reference"]

#: the logger Lightning's ``rank_zero_info`` writes to (its "`Trainer.fit` stopped" line)


class TaskStreamDataModule(pl.LightningDataModule):
    """Serves the training data of ``current_task`` and one test loader per task.

    Subclasses fill ``self.train_sets`` and ``self.test_sets`` (one dataset per task, same order)
    and ``self.task_names`` in ``setup``. Set ``current_task`` before each stage's ``fit``;
    ``joint=True`` serves the union of every task's training data (the joint-training reference).
    """

    def __init__(
        self,
        batch_size: int = 32,
        test_batch_size: int = 512,
        joint: bool = False,
        shuffle: bool = True,
    ):
        super().__init__()
        self.batch_size = batch_size
        self.test_batch_size = test_batch_size
        self.joint = joint
        self.shuffle = shuffle
        self.current_task = 0
        self.train_sets: list[Dataset] = []
        self.test_sets: list[Dataset] = []
        self.task_names: list[str] = []

    @property
    def num_tasks(self) -> int:
        """Number of tasks in the stream (available after ``setup``)."""
        return len(self.test_sets)

    def training_set(self) -> Dataset:
        """The dataset trained on in the current stage."""
        return ConcatDataset(self.train_sets) if self.joint else self.train_sets[self.current_task]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.training_set(), batch_size=self.batch_size, shuffle=self.shuffle)

    def test_dataloader(self) -> list[DataLoader]:
        return [DataLoader(ds, batch_size=self.test_batch_size) for ds in self.test_sets]


def _evaluation_trainer_kwargs(trainer: pl.Trainer) -> dict[str, Any]:
    return {
        "accelerator": trainer.accelerator,
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }


def joint_reference(
    model: pl.LightningModule,
    datamodule: TaskStreamDataModule,
    *,
    epochs: int,
    callback_kwargs: dict[str, Any],
    dirpath: Path,
    trainer_kwargs: dict[str, Any] | None = None,
) -> list[float | None]:
    """Per-task test accuracy of a copy of ``model`` trained on every task's training data at once.

    The copy starts from ``model``'s current (untrained) weights and trains for ``epochs`` epochs
    on the union of the training sets. A model may define ``joint_reference_model()`` to supply
    the copy without its continual-learning extras (DigitsMLP drops its replay memory), so every
    method of a study is compared with the same plain joint training. The copy is scored by a
    ContinualEvalCallback with the stream's own scoring options (its results.json, one stage, goes
    to ``dirpath``). The global RNG state is restored afterwards, so the continual run draws the
    same numbers with or without a reference.
    """
    make_copy = getattr(model, "joint_reference_model", None)
    joint_model = make_copy() if callable(make_copy) else copy.deepcopy(model)
    joint_data = copy.copy(datamodule)
    joint_data.joint = True
    kwargs = {**callback_kwargs, "dirpath": dirpath, "verbose": False, "log_images": False}
    callback = ContinualEvalCallback(task_names=datamodule.task_names, **kwargs)
    with torch.random.fork_rng(devices=[]):
        trainer = pl.Trainer(max_epochs=epochs, callbacks=[callback], **(trainer_kwargs or {}))
        trainer.fit(joint_model, datamodule=joint_data)
    return [None if v != v else float(v) for v in callback.scores[0].tolist()]


def fit_stream(
    trainer: pl.Trainer,
    model: pl.LightningModule,
    datamodule: TaskStreamDataModule,
    *,
    callback_kwargs: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    reference: bool = False,
) -> ContinualEvalCallback:
    """Train ``model`` on the datamodule's tasks in order, one ``fit`` per task on ``trainer``.

    ``trainer.max_epochs`` is the budget per task. A :class:`ContinualEvalCallback` built from
    ``callback_kwargs`` (task names from the datamodule, ``metadata`` stored in results.json) is
    appended to the Trainer's callbacks and returned. ``reference=True`` first computes
    :func:`joint_reference` into ``metadata["reference"]``.
    """
    callback_kwargs = dict(callback_kwargs or {})
    metadata = {**(callback_kwargs.pop("metadata", None) or {}), **(metadata or {})}
    epochs = trainer.fit_loop.max_epochs
    if epochs is None or epochs < 1:
        raise ValueError("fit_stream needs trainer.max_epochs >= 1 (the epoch budget per task)")
    num_tasks = datamodule.num_tasks
    run_dir = run_dir_of(trainer, callback_kwargs)
    for logger in trainer.loggers:
        _ = logger.experiment  # create the run directory before the reference writes into it
    if reference:
        progress(f"joint reference: training on all {num_tasks} tasks at once")
        metadata["reference"] = joint_reference(
            model,
            datamodule,
            epochs=epochs,
            callback_kwargs=callback_kwargs,
            dirpath=run_dir / "joint_reference",
            trainer_kwargs=_evaluation_trainer_kwargs(trainer),
        )
        progress("joint reference accuracy: " + _format_row(metadata["reference"]))
    callback = ContinualEvalCallback(
        task_names=datamodule.task_names, metadata=metadata, **callback_kwargs
    )
    trainer.callbacks.append(callback)
    for task in range(num_tasks):
        name = datamodule.task_names[task]
        progress(f"task {task + 1}/{num_tasks}: {name}")
        datamodule.current_task = task
        first = trainer.current_epoch
        trainer.fit_loop.max_epochs = first + epochs
        with without_cumulative_epoch_message():
            trainer.fit(model, datamodule=datamodule)
        trained = trainer.current_epoch - first
        span = f" (epochs {first + 1}-{trainer.current_epoch} of the stream)" if trained else ""
        plural = "" if trained == 1 else "s"
        progress(f"stage {task + 1}/{num_tasks} ({name}) trained: {trained} epoch{plural}{span}")
    return callback


def run_dir_of(trainer: pl.Trainer, callback_kwargs: dict[str, Any]) -> Path:
    """The run directory: where the callback built from ``callback_kwargs`` writes results.json
    (:func:`~continual_eval.results.default_results_dir`; an empty ``dirpath`` counts as unset)."""
    return default_results_dir(trainer, callback_kwargs.get("dirpath") or None)


def progress(message: str) -> None:
    """Print a ``[continual-eval]`` progress line (flushed, so it interleaves with Lightning's)."""
    print(f"[continual-eval] {message}", flush=True)


def _format_row(values: Sequence[float | None]) -> str:
    return "  ".join("  -   " if v is None else f"{v:.4f}" for v in values)

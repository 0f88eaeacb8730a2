"""Task-stream plumbing shared by the experiments: a datamodule that serves one task at a time,
and `fit_stream`, which trains a task stream through [`fit_tasks`][continual_eval.fit_tasks] with
a [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] (and, on request, a reference
model first)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import lightning.pytorch as pl
from torch.utils.data import ConcatDataset, DataLoader, Dataset

if TYPE_CHECKING:  # pragma: no cover
    from continual_eval.online import OnlineEvalCallback

from continual_eval.callback import ContinualEvalCallback
from continual_eval.references import REFERENCE_DIRS, Reference, train_reference
from continual_eval.results.files import default_results_dir
from continual_eval.training import fit_tasks

__all__ = [
    "REFERENCE_OPTIONS",
    "TaskStreamDataModule",
    "connect_online",
    "fit_stream",
    "reference_kind",
    "stream_reference",
]

#: the values of ``fit_stream(reference=...)`` and of ``stream.reference`` in a config
REFERENCE_OPTIONS = ("none", "isolated", "joint", "cumulative")


class TaskStreamDataModule(pl.LightningDataModule):
    """Serves the training data of ``current_task`` and one test loader per task.

    Subclasses fill ``self.train_sets`` and ``self.test_sets`` (one dataset per task, same order)
    and ``self.task_names`` in ``__init__`` or ``setup``. Set ``current_task`` before each
    stage's ``fit``; ``joint=True`` serves the union of every task's training data (the
    joint-training reference).
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
        self.train_sets: list[Dataset[Any]] = []
        self.test_sets: list[Dataset[Any]] = []
        self.task_names: list[str] = []

    @property
    def num_tasks(self) -> int:
        """Number of tasks in the stream (available after ``setup``)."""
        return len(self.test_sets)

    def training_set(self) -> Dataset[Any]:
        """The dataset trained on in the current stage."""
        return ConcatDataset(self.train_sets) if self.joint else self.train_sets[self.current_task]

    def _train_loader(self, dataset: Dataset[Any]) -> DataLoader[Any]:
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=self.shuffle)

    def train_dataloader(self) -> DataLoader[Any]:
        return self._train_loader(self.training_set())

    def task_train_dataloader(self, task: int) -> DataLoader[Any]:
        """Task ``task``'s training loader, as ``train_dataloader`` serves it in that stage."""
        return self._train_loader(self.train_sets[task])

    def cumulative_train_dataloader(self, task: int) -> DataLoader[Any]:
        """The loader over the training data of tasks ``0..task`` (the cumulative reference's
        copy ``task``), built like ``train_dataloader``."""
        return self._train_loader(ConcatDataset(self.train_sets[: task + 1]))

    def joint_train_dataloader(self) -> DataLoader[Any]:
        """The loader over every task's training data, as ``train_dataloader`` serves it with
        ``joint=True``."""
        return self._train_loader(ConcatDataset(self.train_sets))

    def test_dataloader(self) -> list[DataLoader[Any]]:
        return [DataLoader(ds, batch_size=self.test_batch_size) for ds in self.test_sets]


class _TaskStages(Sequence[TaskStreamDataModule]):
    """The datamodule once per task, for [`fit_tasks`][continual_eval.fit_tasks]: item ``i`` selects
    task ``i`` (``current_task``) right before its ``fit`` and prints the progress lines (the task
    about to train, and how many epochs the previous stage trained)."""

    def __init__(self, trainer: pl.Trainer, datamodule: TaskStreamDataModule):
        self.trainer = trainer
        self.datamodule = datamodule
        self._open: tuple[int, int] | None = None  # (task, first epoch) of the stage in training

    def __len__(self) -> int:
        return self.datamodule.num_tasks

    @overload
    def __getitem__(self, task: int) -> TaskStreamDataModule: ...

    @overload
    def __getitem__(self, task: slice) -> Sequence[TaskStreamDataModule]: ...

    def __getitem__(self, task: int | slice) -> Any:
        if isinstance(task, slice):
            raise TypeError("the stages of a stream are selected one at a time, not sliced")
        self.finish()
        data = self.datamodule
        progress(f"task {task + 1}/{data.num_tasks}: {data.task_names[task]}")
        data.current_task = task
        self._open = (task, self.trainer.current_epoch)
        return data

    def finish(self) -> None:
        """Print the epochs the last selected stage trained (once)."""
        if self._open is None:
            return
        (task, first), self._open = self._open, None
        num_tasks, name = self.datamodule.num_tasks, self.datamodule.task_names[task]
        trained = self.trainer.current_epoch - first
        span = (
            f" (epochs {first + 1}-{self.trainer.current_epoch} of the stream)" if trained else ""
        )
        plural = "" if trained == 1 else "s"
        progress(f"stage {task + 1}/{num_tasks} ({name}) trained: {trained} epoch{plural}{span}")


def _reference_trainer_kwargs(trainer: pl.Trainer) -> dict[str, Any]:
    """The continual Trainer's training settings for a reference Trainer: the same device type,
    precision, gradient clipping, accumulation and batch limit; one device, no logger,
    checkpoints, progress bar or summary."""
    kwargs: dict[str, Any] = {
        "accelerator": trainer.accelerator,
        "devices": 1,
        "precision": trainer.precision,
        "gradient_clip_val": trainer.gradient_clip_val,
        "gradient_clip_algorithm": trainer.gradient_clip_algorithm,
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    if trainer.limit_train_batches != 1.0:  # Lightning announces an explicit 1.0 in a line
        kwargs["limit_train_batches"] = trainer.limit_train_batches
    return kwargs


def reference_kind(reference: object) -> str | None:
    """``"isolated"``, ``"joint"``, ``"cumulative"`` or ``None`` (no reference) from a
    ``reference`` option, one of
    `REFERENCE_OPTIONS`; anything else is a `ValueError` naming the choices."""
    if not isinstance(reference, str) or reference not in REFERENCE_OPTIONS:
        raise ValueError(
            f"reference must be one of {', '.join(REFERENCE_OPTIONS)}, got {reference!r}"
        )
    return None if reference == "none" else reference


def _set_up(datamodule: TaskStreamDataModule) -> None:
    """Fill a datamodule that builds its task sets in ``setup`` (as ``fit`` would)."""
    if not datamodule.test_sets:
        datamodule.prepare_data()
        datamodule.setup("fit")


def stream_reference(
    model: pl.LightningModule,
    datamodule: TaskStreamDataModule,
    *,
    kind: str,
    epochs: int,
    callback_kwargs: dict[str, Any],
    dirpath: Path | None,
    trainer_kwargs: dict[str, Any] | None = None,
) -> Reference:
    """[`train_reference`][continual_eval.train_reference] on the datamodule's tasks.

    The copies start from ``model``'s current (untrained) weights (a model may define
    ``reference_model()`` to supply a copy without its continual-learning extras: DigitsMLP drops
    its replay memory, so every method of a study is compared with the same plain training) and
    train on the datamodule's loaders (``task_train_dataloader(j)``, or
    ``joint_train_dataloader()``) for ``epochs`` epochs, on Trainers built from
    ``trainer_kwargs``; they are scored with the stream's own scoring options (with
    ``eval_every_n_steps``, the isolated kind also records each copy's learning curve). The
    global random state is restored afterwards, so the continual run draws the same numbers with
    or without a reference.
    """
    _set_up(datamodule)
    options = dict(callback_kwargs)
    every = options.pop("eval_every_n_steps", None) if kind == "isolated" else None
    return train_reference(
        model,
        [datamodule.task_train_dataloader(j) for j in range(datamodule.num_tasks)],
        datamodule.test_dataloader(),
        kind=kind,
        trainer_factory=lambda: pl.Trainer(max_epochs=epochs, **(trainer_kwargs or {})),
        joint_dataloader=_union_loaders(datamodule, kind),
        task_names=datamodule.task_names,
        eval_every_n_steps=every,
        callback_kwargs=options,
        dirpath=dirpath,
    )


def _union_loaders(datamodule: TaskStreamDataModule, kind: str) -> Any:
    """The joint copy's loader, the cumulative copies' ``T`` loaders, or ``None`` (isolated)."""
    if kind == "joint":
        return datamodule.joint_train_dataloader()
    if kind == "cumulative":
        return [datamodule.cumulative_train_dataloader(k) for k in range(datamodule.num_tasks)]
    return None


def connect_online(
    callback: OnlineEvalCallback, datamodule: TaskStreamDataModule, epochs: int
) -> None:
    """Give an [`OnlineEvalCallback`][continual_eval.online.OnlineEvalCallback] of a task stream
    what it was not given: the stream (``stream=``: the tasks' training sets in order, when
    every task trains ``epochs == 1`` epoch, so that it reads ahead across the task
    boundaries) and held-out sets (the tasks' test sets, named after the tasks, with the task
    boundaries as segment starts when ``epochs == 1``). A stream is trained in its order:
    ``ValueError`` for a datamodule that shuffles or serves the joint union."""
    from continual_eval.online.held_out import HeldOutSets

    if datamodule.shuffle or datamodule.joint:
        raise ValueError(
            f"{type(datamodule).__name__} shuffles its training data (shuffle=True) or serves "
            "every task at once (joint=True): an OnlineEvalCallback scores a stream in its order "
            "(data: shuffle: false)"
        )
    lengths = [len(s) for s in datamodule.train_sets]  # type: ignore[arg-type]
    one_pass = epochs == 1
    if callback.stream is None and one_pass:
        callback.stream = ConcatDataset(datamodule.train_sets)
    if callback.held_out is None:
        starts = [sum(lengths[:j]) for j in range(len(lengths))] if one_pass else None
        callback.held_out = HeldOutSets(datamodule.test_dataloader(), datamodule.task_names, starts)


def fit_stream(
    trainer: pl.Trainer,
    model: pl.LightningModule,
    datamodule: TaskStreamDataModule,
    *,
    callback_kwargs: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    reference: str = "none",
) -> ContinualEvalCallback:
    """Train ``model`` on the datamodule's tasks in order, one ``fit`` per task on ``trainer``
    ([`fit_tasks`][continual_eval.fit_tasks], the datamodule serving task ``i`` in fit ``i``).

    ``trainer.max_epochs`` is the budget per task. A
    [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] built from ``callback_kwargs``
    (task names from the datamodule, ``metadata`` stored in results.json) is appended to the
    Trainer's callbacks and returned. ``reference``: ``"none"``, ``"isolated"``, ``"joint"`` or
    ``"cumulative"``: first train that reference (`stream_reference`, results in
    ``<run dir>/isolated_reference/task_j``, ``<run dir>/joint_reference`` or
    ``<run dir>/cumulative_reference/task_k``) and store its per-task
    scores as ``metadata["reference"]`` and the kind as ``metadata["reference_kind"]``. An
    [`OnlineEvalCallback`][continual_eval.online.OnlineEvalCallback] among the Trainer's callbacks
    scores the tasks' training data as one stream
    ([`connect_online`][continual_eval.experiments.stream.connect_online]); its record is the
    ``online`` section of the same ``results.json``.
    """
    kind = reference_kind(reference)
    callback_kwargs = dict(callback_kwargs or {})
    if kind is not None and callback_kwargs.get("reference") is not None:
        # refused before anything trains (the reference alone can take as long as the stream)
        raise ValueError(
            f"fit_stream(reference={reference!r}) trains the reference itself; do not also "
            "pass a callback `reference`"
        )
    metadata = {**(callback_kwargs.pop("metadata", None) or {}), **(metadata or {})}
    epochs = trainer.fit_loop.max_epochs
    if epochs is None or epochs < 1 or trainer.fit_loop.max_steps != -1:
        raise ValueError(
            "fit_stream needs trainer.max_epochs >= 1 (the epoch budget per task) and no "
            f"max_steps (got max_epochs={epochs}, max_steps={trainer.fit_loop.max_steps})"
        )
    _set_up(datamodule)
    if datamodule.num_tasks == 0:
        raise ValueError(
            f"fit_stream: {type(datamodule).__name__} has no tasks: fill train_sets, test_sets "
            "and task_names in __init__ or setup"
        )
    run_dir = run_dir_of(trainer, callback_kwargs)
    for logger in trainer.loggers:
        _ = logger.experiment  # create the run directory before the reference writes into it
    if kind is not None:
        num_tasks = datamodule.num_tasks
        progress(
            {
                "joint": f"joint reference: training on all {num_tasks} tasks at once",
                "isolated": "isolated reference: training a fresh copy on each of the "
                f"{num_tasks} tasks alone",
                "cumulative": f"cumulative reference: training {num_tasks} fresh copies, copy k "
                "on tasks 0..k",
            }[kind]
        )
        ref = stream_reference(
            model,
            datamodule,
            kind=kind,
            epochs=epochs,
            callback_kwargs=callback_kwargs,
            dirpath=run_dir / REFERENCE_DIRS[kind],
            trainer_kwargs=_reference_trainer_kwargs(trainer),
        )
        metadata["reference"] = ref.to_list()
        metadata["reference_kind"] = kind
        progress(f"{kind} reference {ref.score_name}: " + _format_row(metadata["reference"]))
        callback_kwargs["reference"] = ref  # results.json gets the reference section
    from continual_eval.online import OnlineEvalCallback

    for online in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(online, OnlineEvalCallback):
            connect_online(online, datamodule, epochs)
    callback = ContinualEvalCallback(
        task_names=datamodule.task_names, metadata=metadata, **callback_kwargs
    )
    trainer.callbacks.append(callback)  # type: ignore[attr-defined]
    stages = _TaskStages(trainer, datamodule)
    fit_tasks(trainer, model, stages)
    stages.finish()
    return callback


def run_dir_of(trainer: pl.Trainer, callback_kwargs: dict[str, Any]) -> Path:
    """The run directory: where the callback built from ``callback_kwargs`` writes results.json
    (`default_results_dir`; an empty ``dirpath`` counts as
    unset)."""
    return default_results_dir(trainer, callback_kwargs.get("dirpath") or None)


def progress(message: str) -> None:
    """Print a ``[continual-eval]`` progress line (flushed, so it interleaves with Lightning's)."""
    print(f"[continual-eval] {message}", flush=True)


def _format_row(values: Sequence[float | None]) -> str:
    return "  ".join("  -   " if v is None else f"{v:.4f}" for v in values)

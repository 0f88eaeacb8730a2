"""Checks of the Trainer a ``ContinualEvalCallback`` fit starts with, before anything trains
(a schedule that fits the tasks and switches the training data at every stage, a fit that would
train something), and the messages of fits and stages that end without training."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from lightning.pytorch import Trainer

__all__ = [
    "as_callback_error",
    "check_fit_trains",
    "check_schedule",
    "check_stage_exists",
    "due_stage",
    "empty_fit",
    "schedule_end_problem",
    "too_many_stages",
    "unsharded_loaders",
    "untrained_stage",
]

T = TypeVar("T")


def check_stage_exists(stage: int, num_tasks: int | None) -> None:
    """Refuse training stage ``stage`` of a sequence of ``num_tasks`` tasks when there is no such
    task (more training stages than test loaders)."""
    assert num_tasks is not None
    if stage >= num_tasks:
        raise too_many_stages(stage, num_tasks)


def too_many_stages(stage: int, num_tasks: int) -> ValueError:
    return ValueError(
        f"ContinualEvalCallback: training stage {stage} would be stage {stage + 1} of a sequence "
        f"with only {num_tasks} tasks ({num_tasks} test dataloaders); more training stages than "
        "tasks"
    )


def due_stage(epochs_done: int, epochs_per_task: int | None, stages: int) -> int | None:
    """Under a schedule of ``k = epochs_per_task`` epochs per task: the stage whose last epoch is
    the ``epochs_done``-th when it is the next one to record (``stages`` recorded so far), else
    ``None`` (also without a schedule)."""
    k = epochs_per_task
    if k is None or epochs_done % k or epochs_done // k - 1 != stages:
        return None
    return stages


def check_schedule(trainer: Trainer, epochs_per_task: int, num_tasks: int) -> None:
    """A single fit over a schedule of ``epochs_per_task`` epochs per task: ``max_epochs`` must
    not train more stages than tasks, and the train dataloader must be reloaded at every stage
    boundary (else the first task's data trains every stage)."""
    k, T = epochs_per_task, num_tasks
    max_epochs = trainer.max_epochs
    if max_epochs is not None and max_epochs > T * k:
        raise ValueError(
            f"max_epochs={max_epochs} trains {math.ceil(max_epochs / k)} stages of "
            f"epochs_per_task={k} epochs, but there are only {T} tasks (test dataloaders)"
        )
    stages = T if max_epochs in (None, -1) else math.ceil(max_epochs / k)
    # set on the Trainer by Lightning's data connector, not declared on the class
    reload: int = trainer.reload_dataloaders_every_n_epochs  # type: ignore[attr-defined]
    if stages > 1 and (reload < 1 or k % reload):
        raise ValueError(
            f"ContinualEvalCallback(epochs_per_task={k}): the training data must switch to the "
            f"next task every {k} epochs, but Trainer(reload_dataloaders_every_n_epochs={reload}) "
            + (
                "never reloads the train dataloader"
                if reload < 1
                else "does not reload it at every stage boundary"
            )
            + ", so the first task's data would train every stage. Use Trainer("
            "reload_dataloaders_every_n_epochs=1) with a train_dataloader() returning "
            f"loaders[continual_eval.scheduled_task(self.trainer, {k})]; nothing was trained"
        )


def fit_already_done(trainer: Trainer) -> bool:
    """Whether another ``fit`` on ``trainer`` would train nothing (max_steps/max_epochs reached)."""
    max_steps, max_epochs = trainer.max_steps, trainer.max_epochs
    if max_steps is not None and max_steps != -1 and trainer.global_step >= max_steps:
        return True
    return max_epochs is not None and max_epochs != -1 and trainer.current_epoch >= max_epochs


def check_fit_trains(trainer: Trainer, stages_completed: int, num_tasks: int) -> None:
    """One fit per task: the fit must be a new stage, and one that trains."""
    if stages_completed >= num_tasks:
        raise too_many_stages(stages_completed, num_tasks)
    if fit_already_done(trainer):
        raise ValueError(
            f"ContinualEvalCallback: this fit (stage {stages_completed}) would train "
            f"nothing: the Trainer already reached max_epochs={trainer.max_epochs} / "
            f"max_steps={trainer.max_steps}. A second fit on the same Trainer trains only if "
            "trainer.fit_loop.max_epochs is raised; use continual_eval.fit_tasks(trainer, "
            "model, train_dataloaders) to run a task sequence on one Trainer, or a new "
            "Trainer per task"
        )


def schedule_end_problem(
    epoch: int, max_epochs: int | None, k: int, stages: int, task_names: Sequence[str]
) -> str | None:
    """Why a fit over a schedule of ``k`` epochs per task ended (after ``epoch`` epochs) with
    stages unrecorded, in words; ``None`` when it did not."""
    T = len(task_names)
    planned = T if max_epochs in (None, -1) else min(T, max_epochs // k)
    if epoch % k:
        return (
            f"ContinualEvalCallback: training stopped inside stage {epoch // k} after "
            f"{epoch % k} of its {k} epochs; that stage is not recorded"
        )
    if stages < planned:
        return (
            f"ContinualEvalCallback: training ended after {stages} of {planned} scheduled "
            f"stages: stage {stages} (task {stages}, {task_names[stages]!r}) ended without a "
            "training step (its train dataloader yielded no batch, or the fit was stopped). "
            f"Stages 0..{stages - 1} are recorded"
        )
    return None


def untrained_stage(stage: int, task_names: Sequence[str]) -> str:
    """The warning of a scheduled stage that ended without a training step."""
    return (
        f"ContinualEvalCallback: stage {stage} (task {stage}, {task_names[stage]!r}) ended "
        "without a training step: its train dataloader yielded no batch. The row is recorded "
        "from the unchanged model"
    )


def empty_fit(stage: int, task_names: Sequence[str], results_dir: Path | None) -> RuntimeError:
    """The error of a fit (one per task) that trained nothing."""
    name = task_names[stage] if stage < len(task_names) else "?"
    return RuntimeError(
        f"ContinualEvalCallback: the fit for stage {stage} (task {stage}, {name!r}) trained "
        "nothing and no row was recorded: its train dataloader yielded no batch (or "
        "limit_train_batches=0). Everything recorded before is kept in "
        f"{results_dir or 'the results directory'}"
    )


def unsharded_loaders(unsharded: Collection[int]) -> str:
    """The warning of test loaders that cannot be sharded across ranks."""
    return (
        f"ContinualEvalCallback: test dataloaders {sorted(unsharded)} cannot be sharded (an "
        "iterable dataset, a custom sampler or batch sampler, or not a torch DataLoader); rank 0 "
        "scores them alone"
    )


def as_callback_error(record: Callable[..., T], *values: Any) -> T:
    """``record(*values)``, its refusal (``ValueError``) named as the callback's."""
    try:
        return record(*values)
    except ValueError as err:
        raise ValueError(f"ContinualEvalCallback: {err}") from err

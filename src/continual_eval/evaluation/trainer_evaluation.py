"""Evaluation inside a running Lightning fit: the test loaders a Trainer's datamodule or module
gives, and :func:`~continual_eval.evaluation.evaluate_tasks` wired to the Trainer's device,
precision plugin and strategy (what ``ContinualEvalCallback`` calls from its hooks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_helpers import is_overridden

from continual_eval._loader_list import as_loader_list
from continual_eval.evaluation.guards import grad_free_context
from continual_eval.evaluation.loop import TaskEvaluation, evaluate_tasks
from continual_eval.evaluation.scorers import Scorer
from continual_eval.evaluation.task_loaders import TaskLoaders

if TYPE_CHECKING:
    from lightning.pytorch import LightningModule, Trainer

__all__ = ["evaluate_under_trainer", "module_test_loaders"]


def module_test_loaders(trainer: Trainer, pl_module: LightningModule) -> list[Any]:
    """The test loaders per task that the datamodule's (else the module's) ``test_dataloader()``
    returns; ``ValueError`` when neither defines one."""
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None and is_overridden("test_dataloader", datamodule):
        # as trainer.test does: a datamodule may build its test sets in setup("test") only
        datamodule.setup("test")
        source, loaders = "the datamodule's test_dataloader()", datamodule.test_dataloader()
    elif is_overridden("test_dataloader", pl_module):
        source, loaders = "the LightningModule's test_dataloader()", pl_module.test_dataloader()
    else:
        raise ValueError(
            "ContinualEvalCallback has no test data: pass test_dataloaders=[loader per task] "
            "or define test_dataloader() returning that list on the datamodule or "
            "LightningModule"
        )
    return as_loader_list(loaders, source)


def evaluate_under_trainer(
    trainer: Trainer,
    pl_module: LightningModule,
    task_loaders: TaskLoaders,
    task_ids: Sequence[int],
    scorers: Mapping[str, Scorer],
    *,
    inference_mode: bool,
    task_names: Sequence[str] | None,
    subset: bool = False,
    stage: int | None = None,
) -> TaskEvaluation:
    """Score ``task_ids`` with every scorer on this rank's shards of ``task_loaders`` (their
    fixed subsets with ``subset``), counts reduced over the Trainer's ranks; the
    :class:`~continual_eval.evaluation.TaskEvaluation`, its scores aligned with ``scorers``.
    ``stage`` goes to the scorers' ``set_task``. Rank 0 reports the batch cache once it is
    filled."""
    world = trainer.world_size
    device = trainer.strategy.root_device
    evaluation = evaluate_tasks(
        pl_module,
        task_loaders.for_evaluation(
            task_ids, device=device, rank=trainer.global_rank, world_size=world, subset=subset
        ),
        task_ids,
        scorers=list(scorers.values()),
        device=device,
        forward_context=trainer.precision_plugin.forward_context,
        convert_input=trainer.precision_plugin.convert_input,
        grad_context=partial(grad_free_context, inference_mode),
        all_reduce=partial(trainer.strategy.reduce, reduce_op="sum") if world > 1 else None,
        rank=trainer.global_rank,
        world_size=world,
        task_names=task_names,
        unsharded=task_loaders.unsharded,
        stage=stage,
    )
    report = task_loaders.cache_report(device)
    if report is not None and trainer.is_global_zero:
        rank_zero_info(report)
    return evaluation

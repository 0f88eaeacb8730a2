"""Evaluation inside a running Lightning fit: the test loaders a Trainer's datamodule or module
gives, and [`evaluate_tasks`][continual_eval.evaluation.evaluate_tasks] wired to the Trainer's
device, precision plugin and strategy (what ``ContinualEvalCallback`` calls from its hooks): in
lockstep when the strategy's forward pass is a collective, the model called through the strategy's
forward redirection when the strategy wraps it (`strategy`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any

from lightning.fabric.plugins import Precision
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_helpers import is_overridden

from continual_eval._loader_list import as_loader_list
from continual_eval.evaluation.guards import grad_free_context
from continual_eval.evaluation.lockstep import Lockstep
from continual_eval.evaluation.loop import EvaluationProgress, TaskEvaluation, evaluate_tasks
from continual_eval.evaluation.scorers import Scorer, scorer_keys
from continual_eval.evaluation.step import default_batch_step
from continual_eval.evaluation.strategy import collective_forward, strategy_step
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


def _precision_hooks(
    plugin: Precision,
) -> tuple[Callable[[], AbstractContextManager[Any]], Callable[[Any], Any] | None]:
    """The precision plugin's ``forward_context`` and ``convert_input``; the base plugin's
    (a ``nullcontext`` and the identity) are replaced by ``nullcontext`` and ``None``, which the
    loop skips per batch."""
    forward = type(plugin).forward_context
    context = nullcontext if forward is Precision.forward_context else plugin.forward_context
    convert = type(plugin).convert_input
    return context, None if convert is Precision.convert_input else plugin.convert_input


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
    progress: EvaluationProgress | None = None,
    verbose: bool = True,
    item_scorers: Sequence[int] = (),
) -> TaskEvaluation:
    """Score ``task_ids`` with every scorer on this rank's shards of ``task_loaders`` (their
    fixed subsets with ``subset``), counts reduced over the Trainer's ranks; the
    [`TaskEvaluation`][continual_eval.evaluation.TaskEvaluation], its scores aligned with
    ``scorers``. ``stage`` goes to the scorers' ``set_task``; ``progress`` hears every batch (see
    [`EvaluationProgress`][continual_eval.evaluation.EvaluationProgress]). With ``verbose``, rank 0
    reports the batch cache once it is filled. ``item_scorers``: the scorers (positions) whose
    per-item values are gathered (``TaskEvaluation.items_by_scorer``)."""
    world = trainer.world_size
    strategy = trainer.strategy
    device = strategy.root_device
    lockstep = None
    if world > 1 and collective_forward(strategy, pl_module):
        max_reduce = partial(strategy.reduce, reduce_op="max")
        lockstep = Lockstep(max_reduce, task_loaders.spare_loaders)
    forward_context, convert_input = _precision_hooks(trainer.precision_plugin)
    with scorer_keys(scorers), strategy_step(strategy, pl_module, default_batch_step) as step:
        evaluation = evaluate_tasks(
            pl_module,
            task_loaders.for_evaluation(
                task_ids, device=device, rank=trainer.global_rank, world_size=world, subset=subset
            ),
            task_ids,
            scorers=list(scorers.values()),
            device=device,
            step=step,
            forward_context=forward_context,
            convert_input=convert_input,
            grad_context=partial(grad_free_context, inference_mode),
            all_reduce=partial(strategy.reduce, reduce_op="sum") if world > 1 else None,
            rank=trainer.global_rank,
            world_size=world,
            task_names=task_names,
            unsharded=task_loaders.unsharded,
            stage=stage,
            lockstep=lockstep,
            progress=progress,
            item_scorers=item_scorers,
        )
    report = task_loaders.cache_report(device) if verbose else None
    if report is not None and trainer.is_global_zero:
        rank_zero_info(report)
    return evaluation

"""How an evaluation must run under a Lightning strategy: whether its forward passes are
collectives (then the ranks evaluate in lockstep) and how the model must be called.

* [`collective_forward`][continual_eval.evaluation.collective_forward]: ``True`` when a forward pass
  of the module under the strategy is a collective, read from what the module and the strategy are
  (not from the strategy's name): parameters that are DTensors (FSDP2 ``fully_shard``, tensor
  parallelism: Lightning's ``ModelParallelStrategy``), FSDP-managed modules (``FSDPModule``, FSDP1's
  ``FullyShardedDataParallel``: ``FSDPStrategy``), DeepSpeed ZeRO-3 partitioned parameters (their
  ``ds_id``) or the strategy's ``zero_stage_3``; or what the strategy or module declares in
  `LOCKSTEP_ATTR`.
* `strategy_step`: the batch step called the way the strategy's own ``test_step`` calls the
  model. Under FSDP1 and DeepSpeed, Lightning wraps the LightningModule and routes ``test_step``
  through the wrapper's ``forward`` (its forward redirection), which gathers the flattened or
  partitioned parameters first; a call that bypassed the wrapper would see the shards. Under
  FSDP2 (``trainer.strategy.model is pl_module``: sharding acts in place) and under DDP (the
  replicas are whole; the DDP wrapper's forward would add buffer broadcasts, collectives) the
  LightningModule is called directly.

* `parameter_counts`: the element counts of the model as built, read from sharded
  parameters without gathering them.
* `parameter_sharding`: how a module's parameters are sharded (DTensors, or FSDP1's and
  DeepSpeed's flattened or partitioned tensors), read without a collective; what
  [`train_reference`][continual_eval.train_reference] copies a model by.

This module is the only one that reads private names of Lightning and torch: the strategy's
``_forward_redirection``, the object Lightning's own ``Strategy.test_step`` calls, so that the
evaluation's forward passes go through exactly the same redirection (and any subclass hooks a
strategy installs there) as ``trainer.test`` does; and the ``_fsdp_flattened`` mark that torch's
FSDP1 puts on the parameters it flattened (no public API tells them apart).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from continual_eval.evaluation.step import BatchStep

__all__ = [
    "LOCKSTEP_ATTR",
    "collective_forward",
    "parameter_counts",
    "parameter_sharding",
    "strategy_step",
]

#: An attribute a strategy or a LightningModule may set: ``True`` to have the evaluation run in
#: lockstep (every rank the same number of forward passes per task) where it would not detect a
#: collective forward pass, ``False`` to turn lockstep off. Unset: detected.
LOCKSTEP_ATTR = "continual_eval_lockstep"

#: the LightningModule method name the forward redirection calls (set for one evaluation)
_REDIRECTED = "_continual_eval_redirected_step"


def _dtensor(p: nn.Parameter) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(p, DTensor)  # FSDP2 fully_shard, tensor parallelism


def _sharded_parameter(p: nn.Parameter) -> bool:
    return _dtensor(p) or hasattr(p, "ds_id")  # FSDP2/TP; DeepSpeed ZeRO-3


def _sharding_module(m: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    return isinstance(m, (FSDPModule, FullyShardedDataParallel))


def collective_forward(strategy: Any, module: nn.Module) -> bool:
    """Whether a forward pass of ``module`` under ``strategy`` is a collective (see the module
    docstring); a `LOCKSTEP_ATTR` set on ``module`` or ``strategy`` decides first."""
    for owner in (module, strategy):
        declared = getattr(owner, LOCKSTEP_ATTR, None)
        if declared is not None:
            return bool(declared)
    if getattr(strategy, "zero_stage_3", False) is True:
        return True
    wrapper = getattr(strategy, "model", None)
    modules = [module] if wrapper is None or wrapper is module else [module, wrapper]
    if any(_sharding_module(m) for root in modules for m in root.modules()):
        return True
    return any(_sharded_parameter(p) for p in module.parameters())


def _wrapper(strategy: Any, module: nn.Module) -> nn.Module | None:
    """The module the strategy wraps ``module`` in, when calls must go through it."""
    wrapper: nn.Module | None = getattr(strategy, "model", None)
    if wrapper is None or wrapper is module or isinstance(wrapper, DistributedDataParallel):
        return None
    return wrapper


@contextmanager
def strategy_step(strategy: Any, module: nn.Module, step: BatchStep) -> Iterator[BatchStep]:
    """``step`` as the strategy needs it called, for the duration of one evaluation: through
    the strategy's forward redirection when it wraps ``module`` (FSDP1, DeepSpeed), else
    ``step`` itself.

    The redirected step patches nothing per batch beyond what Lightning's redirection does: for
    the evaluation, ``module`` holds a method that runs ``step`` on it; the redirection makes the
    wrapper's ``forward`` call that method (gathering the parameters around it).
    """
    wrapper = _wrapper(strategy, module)
    redirection = getattr(strategy, "_forward_redirection", None)
    if wrapper is None or redirection is None:
        yield step
        return

    def inner(batch: Any, task_id: int) -> Any:
        return step(module, batch, task_id)

    def redirected(_module: nn.Module, batch: Any, task_id: int) -> Any:
        return redirection(wrapper, module, _REDIRECTED, batch, task_id)

    redirected.__qualname__ = getattr(step, "__qualname__", "step")
    setattr(module, _REDIRECTED, inner)
    try:
        yield redirected
    finally:
        delattr(module, _REDIRECTED)


def parameter_counts(module: nn.Module) -> tuple[int, int] | None:
    """``(all, trainable)`` element counts of ``module``'s parameters as the model was built,
    also when they are sharded, with no collective and nothing gathered: a DTensor (FSDP2, tensor
    parallelism) counts its global size, a DeepSpeed ZeRO-3 partition its ``ds_numel``. ``None``
    under FSDP1, whose flattened local shards do not tell the sizes (and whose padding would be
    counted)."""
    total = trainable = 0
    for p in module.parameters():
        if getattr(p, "_fsdp_flattened", False):
            return None
        n = int(getattr(p, "ds_numel", p.numel()))  # DTensor.numel(): the global size
        total += n
        if p.requires_grad:
            trainable += n
    return total, trainable


def parameter_sharding(module: nn.Module) -> str | None:
    """How ``module``'s parameters are sharded, read from the module alone (no collective, the
    same answer on every rank): ``"dtensor"`` when a parameter is a DTensor (FSDP2
    ``fully_shard``, tensor parallelism: torch's distributed state dict gathers and loads them),
    ``"flattened"`` for FSDP1's flattened and DeepSpeed ZeRO-3's partitioned parameters (or an
    FSDP1 module inside), ``None`` when every parameter is a whole tensor."""
    parameters = list(module.parameters())
    if any(_dtensor(p) for p in parameters):
        return "dtensor"
    if any(_sharded_parameter(p) or getattr(p, "_fsdp_flattened", False) for p in parameters):
        return "flattened"
    if any(_sharding_module(m) for m in module.modules()):
        return "flattened"
    return None

"""Lockstep evaluation: every rank runs the same number of forward passes per task.

Under a strategy whose forward pass is a collective (FSDP2 ``fully_shard`` and FSDP1 all-gather
parameters in every forward, DeepSpeed ZeRO-3 gathers its partitions), the ranks must call the
model equally often and in the same order, or the first rank to run out of test data leaves the
others waiting in an all-gather until the process-group timeout. Unpadded shards
(`shard_dataloader`) give the ranks up to one batch more or less
of a task, and a rank may hold no sample of a small task at all.

The rule (one collective per evaluation): before scoring, the ranks agree on every task's
largest batch count (one element-wise max over ``[tasks]`` counts); each rank scores its own
batches, then runs the forward pass on a real sample of the same task it already has (the first
sample of its last batch when the batch's tensors share one leading size, else the whole batch;
without a batch, one sample of the task's test set,
`spare_dataloader`) until it reached the agreed count,
discarding the output. The scores are unchanged: the discarded
passes are never counted. A loader whose length is not known exactly (an iterable dataset)
instead agrees batch by batch: one max of ``[has a batch, cannot pad]`` per batch of that task.

This module is Lightning-free: `strategy` decides when a Trainer
needs it and builds the [`Lockstep`][continual_eval.evaluation.Lockstep].
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from continual_eval.evaluation.errors import EvaluationError

__all__ = ["Lockstep", "agree_batch_counts", "known_length", "lockstep_batches"]


@dataclass(frozen=True)
class Lockstep:
    """How the ranks keep their forward passes in step.

    Attributes:
        max_reduce: element-wise maximum of an int64 tensor across ranks (e.g.
            ``partial(strategy.reduce, reduce_op="max")``); every rank calls it equally often.
        spare_loaders: per task, a loader of one real sample of its test set
            (`spare_dataloader`), or ``None``: what a rank that
            holds no batch of the task runs its forward passes on.
    """

    max_reduce: Callable[[Tensor], Tensor]
    spare_loaders: Sequence[Any] = ()

    def spare_loader(self, task: int) -> Any:
        """Task ``task``'s one-sample loader, or ``None``."""
        return self.spare_loaders[task] if 0 <= task < len(self.spare_loaders) else None


def known_length(batches: Iterable[Any]) -> int | None:
    """The exact number of batches ``batches`` yields, or ``None`` when only iterating tells:
    a DataLoader over an iterable dataset (its ``len`` is an estimate) or an object without
    ``len``. A DataLoader over a map-style dataset, a list or the engine's own batch sources
    (fast path, worker-pool view, cache) know theirs."""
    if isinstance(batches, DataLoader) and isinstance(batches.dataset, IterableDataset):
        return None
    try:
        return len(batches)  # type: ignore[arg-type]
    except TypeError:
        return None


@dataclass(frozen=True)
class StepPlan:
    """What the ranks agreed for one task: ``steps`` forward passes, or ``None`` to agree batch
    by batch (a loader of unknown length on some rank)."""

    steps: int | None


def agree_batch_counts(
    lengths: Sequence[int | None],
    can_pad: Sequence[bool],
    lockstep: Lockstep,
    device: torch.device,
    labels: Sequence[str],
) -> list[StepPlan]:
    """One max-reduction of every task's batch count; the plan per task, equal on every rank.

    ``lengths[k]``: this rank's batch count of the ``k``-th task (``None``: unknown);
    ``can_pad[k]``: whether this rank has a batch of the task to repeat when it runs out (a spare
    loader). Raises [`EvaluationError`][continual_eval.evaluation.EvaluationError] on every rank
    together when a rank holds no batch of a task that others score and has nothing to pad with.
    """
    n = len(lengths)
    if n == 0:
        return []
    local = torch.zeros(3, n, dtype=torch.int64)
    for k, (length, pad) in enumerate(zip(lengths, can_pad, strict=True)):
        local[0, k] = 0 if length is None else length
        local[1, k] = length is None
        local[2, k] = length == 0 and not pad
    agreed = lockstep.max_reduce(local.to(device)).cpu().tolist()
    plans = []
    for k in range(n):
        if agreed[1][k]:
            plans.append(StepPlan(None))
            continue
        if agreed[0][k] > 0 and agreed[2][k]:
            raise EvaluationError(
                f"{labels[k]}: a process holds no sample of this test set and has no spare "
                "sample to run the model on while the others score theirs (every forward pass is "
                "a collective under this strategy); give every rank at least one sample"
            )
        plans.append(StepPlan(int(agreed[0][k])))
    return plans


_END = object()


def lockstep_batches(
    batches: Iterable[Any],
    plan: StepPlan,
    lockstep: Lockstep,
    device: torch.device,
    can_pad: bool,
) -> Iterator[Any | None]:
    """``batches`` in step with the other ranks: each real batch, then ``None`` (run a forward
    pass on a batch already had, and discard it) until the agreed count; with ``plan.steps``
    ``None``, one max-reduction per step decides whether any rank still has a batch."""
    if plan.steps is not None:
        done = 0
        for batch in batches:
            yield batch
            done += 1
        for _ in range(plan.steps - done):
            yield None
        return
    iterator, exhausted, seen = iter(batches), False, False
    while True:
        batch = _END if exhausted else next(iterator, _END)
        exhausted = batch is _END
        flags = torch.tensor(
            [not exhausted, exhausted and not seen and not can_pad], dtype=torch.int64
        )
        has_batch, cannot_pad = lockstep.max_reduce(flags.to(device)).tolist()
        if not has_batch:
            return
        if cannot_pad:
            raise EvaluationError(
                "a process ran out of test batches before the others and has none to run the "
                "model on while they score theirs (every forward pass is a collective under this "
                "strategy)"
            )
        seen = seen or not exhausted
        yield None if exhausted else batch

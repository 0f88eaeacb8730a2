r"""Item-level forgetting: which test items go from right to wrong between evaluations.

An accuracy cell ``R[i, j]`` hides how it changes: a task can lose 50 items and regain 45 others
with its accuracy down by only 5. These functions read the per-item records of 0/1 scores (right
or wrong), one entry per task ``j``, ``[T, n_j]`` (row ``i``: after stage ``i``; ``bool`` or
[`PackedBits`][continual_eval.functional.intervals.PackedBits]), with the untrained model's
``[n_j]``
as an optional ``baseline``. Item ``v[i, k]`` is item ``k`` of task ``j`` after stage ``i``.

Per stage ``i`` and task ``j`` ([`item_transitions`][continual_eval.functional.item_transitions],
``[T, T]`` each, NaN where undefined):

* against the previous stage: ``right_to_wrong[i, j] = #{k : v[i-1, k] and not v[i, k]}`` and
  ``wrong_to_right[i, j]`` the reverse, for ``i >= j`` (the previous evaluation of stage ``j``
  is ``R[j-1, j]``, the model before training on ``j``); stage 0's previous evaluation is the
  baseline, so ``(0, 0)`` is defined only with one. Rows ``i < j - 1`` are never read.
* against the diagonal (the task just after it was learned): ``forgotten[i, j] = #{k : v[j, k]
  and not v[i, k]}`` and ``recovered[i, j] = #{k : not v[j, k] and v[i, k]}`` for ``i >= j``
  (0 at ``i = j``); ``R[i, j] - R[j, j] = (recovered - forgotten) / n_j`` exactly.
* forgetting events (Toneva et al., "An Empirical Study of Example Forgetting during Deep Neural
  Network Learning", ICLR 2019: an item is *forgotten* when it goes from right to wrong between
  two consecutive evaluations): ``forgotten_once[i, j]``, the items of task ``j`` with at least
  one right-to-wrong step between consecutive stages in ``j..i`` (0 at ``i = j``), i.e. after
  task ``j`` was trained. [`forgetting_events`][continual_eval.functional.forgetting_events] gives
  each item's number of events (nonzero: the items forgotten at least once).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from continual_eval.functional.intervals import PackedBits, unpack_bits

__all__ = ["ItemTransitions", "forgetting_events", "item_transitions"]


@dataclass(frozen=True)
class ItemTransitions:
    """Item transitions per stage ``i`` (row) and task ``j`` (column), float64 ``[T, T]``
    counts, NaN where undefined (module notes)."""

    right_to_wrong: Tensor
    """items right at the previous evaluation, wrong after stage ``i``"""
    wrong_to_right: Tensor
    """items wrong at the previous evaluation, right after stage ``i``"""
    forgotten: Tensor
    """items right just after task ``j`` was learned (``R[j, j]``), wrong after stage ``i``"""
    recovered: Tensor
    """items wrong at ``R[j, j]``, right after stage ``i``"""
    forgotten_once: Tensor
    """items with at least one forgetting event (right to wrong) in stages ``j..i``"""
    num_items: Tensor
    """``n_j``, ``[T]``"""

    @property
    def forgotten_once_fraction(self) -> Tensor:
        """``forgotten_once[T-1, j] / n_j``, ``[T]``: the fraction of each task's items forgotten
        at least once after it was learned, by the end of the run (0 for the last task)."""
        return self.forgotten_once[-1] / self.num_items


def _rows(
    items: Sequence[Tensor | PackedBits], baseline: Sequence[Tensor | PackedBits] | None
) -> tuple[Tensor, Tensor, Tensor]:
    """``(values [T(+1), N] bool, task [N] long, sizes [T])``: every task's items side by side,
    the baseline row first when given."""
    if isinstance(items, (Tensor, PackedBits)) or not isinstance(items, Sequence) or not items:
        raise TypeError("items must be a non-empty sequence with one [T, n_j] entry per task")
    T = len(items)
    if baseline is not None and (isinstance(baseline, (Tensor, PackedBits)) or len(baseline) != T):
        raise ValueError(f"baseline must be a sequence of {T} [n_j] entries, one per task")
    columns: list[Tensor] = []
    for j, entry in enumerate(items):
        values = unpack_bits(entry) if isinstance(entry, PackedBits) else entry
        if not isinstance(values, Tensor) or values.dtype != torch.bool:
            raise TypeError(
                f"items[{j}] must be a bool tensor (right or wrong) or PackedBits, got "
                f"{getattr(values, 'dtype', type(values).__name__)}: transitions need 0/1 scores"
            )
        if values.ndim != 2 or values.shape[0] != T:
            raise ValueError(
                f"items[{j}] must have shape [T, n_j] with T = {T}, got {tuple(values.shape)}"
            )
        if baseline is not None:
            first = baseline[j]
            first = unpack_bits(first) if isinstance(first, PackedBits) else first
            if (
                not isinstance(first, Tensor)
                or first.dtype != torch.bool
                or first.shape != values.shape[1:]
            ):
                raise ValueError(
                    f"baseline[{j}] must be a bool [n_j] = [{values.shape[1]}] tensor like "
                    f"items[{j}], got {getattr(first, 'dtype', type(first).__name__)} "
                    f"{tuple(getattr(first, 'shape', ()))}"
                )
            values = torch.cat([first.unsqueeze(0), values])
        columns.append(values.detach().cpu())
    sizes = torch.tensor([c.shape[1] for c in columns], dtype=torch.long)
    task = torch.repeat_interleave(torch.arange(T), sizes)
    return torch.cat(columns, dim=1), task, sizes


def _per_task(flags: Tensor, task: Tensor, num_tasks: int) -> Tensor:
    """Counts of ``flags`` ``[rows, N]`` per task: ``[rows, T]`` float64."""
    counts = torch.zeros(flags.shape[0], num_tasks, dtype=torch.float64)
    return counts.index_add_(1, task, flags.to(torch.float64))


def item_transitions(
    items: Sequence[Tensor | PackedBits],
    *,
    baseline: Sequence[Tensor | PackedBits] | None = None,
) -> ItemTransitions:
    """Right-to-wrong and wrong-to-right counts per stage and task, against the previous
    evaluation and against the diagonal, and the items forgotten at least once (module notes).

    >>> right = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    >>> other = torch.ones(3, 2, dtype=torch.bool)  # tasks 1 and 2: always right
    >>> moves = item_transitions([right, other, other])  # task 0: 4 items, after stages 0-2
    >>> moves.right_to_wrong[:, 0].tolist(), moves.wrong_to_right[:, 0].tolist()
    ([nan, 1.0, 1.0], [nan, 1.0, 0.0])
    >>> moves.forgotten[:, 0].tolist(), moves.forgotten_once[:, 0].tolist()
    ([0.0, 1.0, 2.0], [0.0, 1.0, 2.0])
    """
    values, task, sizes = _rows(items, baseline)
    T = len(items)
    offset = 1 if baseline is not None else 0  # row of stage i is i + offset
    # previous evaluation: stage i - 1, or the baseline for stage 0
    before, after = values[:-1], values[1:]  # [T - 1 + offset, N]
    lost = _per_task(before & ~after, task, T)
    gained = _per_task(~before & after, task, T)
    if offset == 0:  # no baseline: stage 0 has no previous evaluation
        nan_row = torch.full((1, T), math.nan, dtype=torch.float64)
        lost, gained = torch.cat([nan_row, lost]), torch.cat([nan_row, gained])
    stages = values[offset:]  # [T, N]
    diagonal = stages[task, torch.arange(stages.shape[1])]  # v[j, k] for item k of task j
    forgotten = _per_task(diagonal & ~stages, task, T)
    recovered = _per_task(~diagonal & stages, task, T)
    # forgetting events after learning: right -> wrong between stages s-1 >= j and s
    stage = torch.arange(T).unsqueeze(1)
    event = torch.zeros_like(stages)
    event[1:] = stages[:-1] & ~stages[1:] & (stage[1:] - 1 >= task.unsqueeze(0))
    once = _per_task(event.cummax(dim=0).values, task, T)
    i, j = stage, torch.arange(T).unsqueeze(0)
    defined = i >= j  # the previous evaluation of stage i >= j is read; i < j is not

    def mask(counts: Tensor, where: Tensor = defined) -> Tensor:
        return counts.masked_fill(~where, math.nan)

    previous = defined & ((i > 0) | torch.tensor(offset == 1))
    return ItemTransitions(
        right_to_wrong=mask(lost, previous),
        wrong_to_right=mask(gained, previous),
        forgotten=mask(forgotten),
        recovered=mask(recovered),
        forgotten_once=mask(once),
        num_items=sizes.to(torch.float64),
    )


def forgetting_events(items: Sequence[Tensor | PackedBits]) -> list[Tensor]:
    """Each item's number of forgetting events after its task was learned (Toneva et al.,
    ICLR 2019): right-to-wrong steps between consecutive stages ``s - 1 >= j`` and ``s``; task
    ``j``'s ``[n_j]`` int64. Nonzero: the items forgotten at least once.

    >>> right = torch.tensor([[1, 1, 0], [0, 1, 0], [1, 0, 0]], dtype=torch.bool)
    >>> ones = torch.ones(3, 1, dtype=torch.bool)
    >>> forgetting_events([right, ones, ones])[0].tolist()
    [1, 1, 0]
    """
    values, task, sizes = _rows(items, None)
    stage = torch.arange(values.shape[0]).unsqueeze(1)
    after_learning = stage[1:] - 1 >= task.unsqueeze(0)
    events = (values[:-1] & ~values[1:] & after_learning).sum(dim=0)
    return list(torch.split(events, sizes.tolist()))

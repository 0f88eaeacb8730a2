r"""Paired bootstrap of the class-incremental numbers that read each item's class: per-stage
task-weighted seen / old accuracy, average incremental accuracy (both weightings), mean class
accuracy, AMCA and per-class forgetting, from one run's per-item records of ``acc_task_agnostic``
(each test item right or wrong after every stage) and each item's label, recorded once.

The resampling is [`paired_bootstrap`][continual_eval.functional.paired_bootstrap]'s
double-or-nothing scheme (Owen & Eckles 2012) with its very draws (the same seed and test-set
sizes give the same kept items): each task's items are resampled once (strata are tasks) and
that resample is used at every stage, so a class's accuracy at stage ``i`` and at stage ``k``
keep their pairing. In resample ``r`` with kept items ``K_r``:

* ``a*[i, c] = #{k in K_r of class c right after stage i} / #{k in K_r of class c}`` for the
  seen classes (task of ``c`` ``<= i``), and ``R*[i, j]`` summed over task ``j``'s classes (the
  resampled matrix cell, exactly
  [`paired_bootstrap`][continual_eval.functional.paired_bootstrap]'s);
* then the functional formulas of `continual_eval.functional.class_incremental` on ``a*`` and
  ``R*``: ``seen_accuracy_task[i] = (1/(i+1)) sum_{j<=i} R*[i, j]``, ``old_accuracy_task[i] =
  (1/i) sum_{j<i} R*[i, j]``, the sample-weighted seen accuracy (pooled counts), their means over
  the stages (average incremental accuracy), ``mean_class_accuracy[i]`` (the mean of ``a*[i, c]``
  over the seen classes), ``amca_per_stage`` (its running mean; the last value is AMCA),
  ``class_forgetting[c]`` and ``mean_class_forgetting_per_stage`` (the run's convention).

A class none of whose items a resample keeps (probability ``2^-n_c``) has no accuracy in it and
is left out of that resample's means, as a class without a test sample is left out of the
plug-in values; its own forgetting's interval is the percentile interval of the resamples that
keep it (``numpy.nanquantile``). The interval is the percentile interval; the estimates are the
values of all items, equal to the ``class_incremental`` section's. Task-weighted seen accuracy at
the last stage and its mean over stages are ACC and the average incremental accuracy of
``acc_task_agnostic``'s matrix: with the same draws their intervals are the matrix's
(``intervals.matrices.acc_task_agnostic.metrics``), to rounding.

Per resample the work is one popcount per (stage, class) over the class's task's words, in
blocks of resamples; no Python loop over resamples, tasks or items.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from continual_eval.functional._validation import check_forgetting_convention
from continual_eval.functional.class_incremental import _class_forgetting_table
from continual_eval.functional.intervals import (
    _BLOCK_CELLS,
    _WORD,
    IntervalTensors,
    PackedBits,
    _check_bootstrap_options,
    _Draws,
    _Layout,
    _layout,
)

__all__ = ["CLASS_IL_STATISTICS", "class_il_bootstrap"]

#: the statistics `class_il_bootstrap` returns, with their trailing shape (``s`` stages, ``C``
#: classes)
CLASS_IL_STATISTICS = {
    "seen_accuracy_task": "[s]",
    "old_accuracy_task": "[s]",
    "seen_accuracy_sample": "[s]",
    "average_incremental_accuracy_task": "[]",
    "average_incremental_accuracy_sample": "[]",
    "mean_class_accuracy": "[s]",
    "amca_per_stage": "[s]",
    "class_forgetting": "[C]",
    "mean_class_forgetting_per_stage": "[s]",
}


def _statistics(
    hits: Tensor, totals: Tensor, class_task: Tensor, forgetting: str
) -> dict[str, Tensor]:
    """Every statistic of ``hits [..., s, C]`` (right items per stage and class; zero where
    not seen) and ``totals [..., C]`` (items per class), float64."""
    s = hits.shape[-2]
    stage = torch.arange(s).unsqueeze(-1)  # [s, 1]
    seen = (class_task >= 0) & (class_task <= stage)  # [s, C]
    n = totals.unsqueeze(-2).expand(hits.shape)
    accuracy = torch.where(seen & (n > 0), hits / n, math.nan)  # [..., s, C]
    # the matrix cells R*[i, j] (j < s): sums over each task's classes (integers, exact)
    onehot = (class_task.unsqueeze(-1) == torch.arange(s)).to(torch.float64)  # [C, s]
    task_hits = hits @ onehot  # [..., s, s]
    task_totals = (totals @ onehot).unsqueeze(-2)  # [..., 1, s]
    cells = torch.tril(task_hits / task_totals)  # j > i: never read
    seen_count = torch.arange(1, s + 1, dtype=torch.float64)
    seen_task = cells.sum(dim=-1) / seen_count
    old_task = torch.tril(cells, diagonal=-1).sum(dim=-1) / (seen_count - 1)
    old_task[..., 0] = math.nan  # no old task at stage 0
    pooled = (hits * seen).sum(dim=-1) / (n * seen).sum(dim=-1)
    mca = torch.nanmean(accuracy, dim=-1)
    table = _class_forgetting_table(accuracy, convention=forgetting)  # [..., s, C]
    return {
        "seen_accuracy_task": seen_task,
        "old_accuracy_task": old_task,
        "seen_accuracy_sample": pooled,
        "average_incremental_accuracy_task": seen_task.mean(dim=-1),
        "average_incremental_accuracy_sample": pooled.mean(dim=-1),
        "mean_class_accuracy": mca,
        "amca_per_stage": torch.cumsum(mca, dim=-1) / seen_count,
        "class_forgetting": table[..., -1, :],
        "mean_class_forgetting_per_stage": torch.nanmean(table, dim=-1),
    }


def _labels(labels: Sequence[Tensor], layout: _Layout, class_task: Tensor) -> Tensor:
    """Each stratum's labels ``[S, n_pad]`` int64 (``-1`` past its items; ``n_pad`` the most
    words of a stratum x 64), checked: task ``j``'s items are classes of task ``j``."""
    s, runs = layout.num_tasks, layout.num_runs
    if isinstance(labels, Tensor) or not isinstance(labels, Sequence) or len(labels) != s:
        raise TypeError(
            f"labels must be a sequence of one [..., n_j] class-id tensor per task ({s})"
        )
    n_pad = int(layout.task_words.max()) * _WORD
    table = torch.full((runs, s, n_pad), -1, dtype=torch.int64)
    C = len(class_task)
    for j, given in enumerate(labels):  # assembly, one copy per task
        n = layout.num_items[j]
        if not isinstance(given, Tensor) or given.is_floating_point() or given.shape[-1:] != (n,):
            raise ValueError(
                f"labels[{j}] must be an integer [..., {n}] tensor (task {j}'s {n} items), got "
                f"{given.dtype if isinstance(given, Tensor) else type(given).__name__} "
                f"{tuple(given.shape) if isinstance(given, Tensor) else ''}"
            )
        values = given.detach().cpu().to(torch.int64)
        try:
            values = values.expand(*layout.batch, n).reshape(runs, n)
        except RuntimeError:
            raise ValueError(
                f"labels[{j}] has shape {tuple(given.shape)}; expected [{n}] or "
                f"[{', '.join(map(str, layout.batch))}, {n}] (the items' runs)"
            ) from None
        outside = (values < 0) | (values >= C)
        wrong = outside | (class_task[values.clamp(0, C - 1)] != j)
        if bool(wrong.any()):
            run, k = (int(v) for v in wrong.nonzero()[0])
            raise ValueError(
                f"labels[{j}] item {k}{f' (run {run})' if runs > 1 else ''} is class "
                f"{int(values[run, k])}, not a class of task {j}: an item's label is one of its "
                "task's classes"
            )
        table[:, j, :n] = values
    return table.reshape(runs * s, n_pad)


def class_il_bootstrap(
    items: Sequence[Tensor | PackedBits],
    labels: Sequence[Tensor],
    class_task: Tensor,
    *,
    forgetting: str = "peak",
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, IntervalTensors]:
    """Estimates and paired percentile-bootstrap intervals of the class-incremental statistics
    (module notes) after ``s = len(items)`` stages.

    Args:
        items: task ``j < s``'s task-agnostic correctness ``[..., s, n_j]`` (bool or
            [`PackedBits`][continual_eval.functional.PackedBits]; row ``i``: after stage ``i``;
            rows ``i < j`` are never read), leading dimensions independent runs.
        labels: task ``j``'s item classes ``[n_j]`` or ``[..., n_j]`` (integer class ids of task
            ``j``).
        class_task: ``[C]`` the task of each class id (``-1``: none), as
            [`check_task_classes`][continual_eval.functional.check_task_classes] makes.
        forgetting: ``"peak"`` or ``"chaudhry"`` (per-class forgetting's convention).

    Returns:
        statistic -> ``(estimate, low, high)`` of `CLASS_IL_STATISTICS`, leading dimensions
        first (NaN: undefined).
    """
    check_forgetting_convention(forgetting)
    _check_bootstrap_options(confidence, resamples, seed, "double_or_nothing")
    layout = _layout(items, None, None)
    if not layout.binary:
        raise TypeError("items must be 0/1 (bool or PackedBits): task-agnostic correctness")
    class_task = torch.as_tensor(class_task).to("cpu", torch.int64)
    s, runs, C = layout.num_tasks, layout.num_runs, len(class_task)
    table = _labels(labels, layout, class_task)  # [S, n_pad]
    assert layout.words is not None
    # every item's bit in the word layout, grouped by (run, class): index [P, n_most] into the
    # bits (W * 64: a zero bit, the padding), P the (run, class) pairs with an item
    bits = layout.total_words * _WORD
    stratum, k = (table >= 0).nonzero(as_tuple=True)
    position = torch.from_numpy(layout.word_start)[stratum] * _WORD + k
    group = (stratum // s) * C + table[stratum, k]  # flat (run, class)
    order = torch.argsort(group, stable=True)
    group, position = group[order], position[order]
    present, size = torch.unique_consecutive(group, return_counts=True)
    first = torch.cumsum(size, 0) - size
    slot = torch.repeat_interleave(torch.arange(len(present)), size)
    rank = torch.arange(len(group)) - first[slot]
    # padding slots read bit 0; their design rows are zero, so they add nothing
    index = torch.zeros(len(present), int(size.max()), dtype=torch.int64)
    index[slot, rank] = position
    inside = torch.zeros(index.shape, dtype=torch.bool)
    inside[slot, rank] = True
    exact = torch.float32 if int(size.max()) < 2**24 else torch.float64  # integer sums
    byte_at = index.view(-1) // 8  # each slot's byte and bit in the packed layout
    bit_at = (index.view(-1) % 8).to(torch.uint8).unsqueeze(1)

    def unpacked(words: np.ndarray) -> Tensor:
        """``[rows, W]`` words -> ``[P, n_most, rows]`` 0/1 (``exact``), grouped by class."""
        rows = words.shape[0]
        as_bytes = torch.from_numpy(np.ascontiguousarray(words.T)).view(torch.uint8)  # [W, 8r]
        by_byte = as_bytes.view(-1, rows, 8).transpose(1, 2).reshape(-1, rows)  # [W * 8, rows]
        picked = (by_byte.index_select(0, byte_at) >> bit_at) & 1  # [P * n_most, rows]
        return picked.view(*index.shape, rows).to(exact)

    # per (run, class): its items' right bits at every stage and a column of ones (the count)
    weight = inside.to(exact).unsqueeze(1)  # [P, 1, n_most]
    stages = unpacked(layout.words).transpose(1, 2) * weight  # [P, s, n_most]
    design = torch.cat([stages, weight], dim=1)  # [P, s + 1, n_most]

    def counts(kept: Tensor) -> tuple[Tensor, Tensor]:
        """``kept`` ``[P, n_most, rows]`` -> hits ``[rows, R, s, C]``, totals ``[rows, R, C]``."""
        rows = kept.shape[-1]
        sums = torch.bmm(design, kept).permute(2, 0, 1).double()  # [rows, P, s + 1]
        hits = torch.zeros(rows, runs * C, s, dtype=torch.float64)
        hits[:, present] = sums[..., :s]
        totals = torch.zeros(rows, runs * C, dtype=torch.float64)
        totals[:, present] = sums[..., s]
        return hits.view(rows, runs, C, s).transpose(-1, -2), totals.view(rows, runs, C)

    every = torch.ones(*index.shape, 1, dtype=exact)  # all items kept (weight 1)
    estimate = {
        key: value[0] for key, value in _statistics(*counts(every), class_task, forgetting).items()
    }
    draws = _Draws(layout, seed, "double_or_nothing")
    # blocks of resamples: at most 2^23 kept weights (32 MiB of float32) at once
    step = max(1, (4 * _BLOCK_CELLS) // max(1, index.numel(), bits))
    keys = list(estimate)
    sizes = [math.prod(estimate[k].shape) for k in keys]
    buffer = np.empty((sum(sizes), int(resamples)), dtype=np.float64)
    for begin in range(0, int(resamples), step):  # blocks of resamples: bounded memory
        rows = min(step, int(resamples) - begin)
        kept = unpacked(draws.words(rows))
        values = _statistics(*counts(kept), class_task, forgetting)
        flat = torch.cat([values[k].reshape(rows, -1) for k in keys], dim=1)
        buffer[:, begin : begin + rows] = flat.T.contiguous().numpy()
    alpha = 1 - float(confidence)
    levels = [alpha / 2, 1 - alpha / 2]
    missing = np.isnan(buffer)
    some = missing.any(axis=1) & ~missing.all(axis=1)  # a class no item of which was kept
    ends = np.full((2, len(buffer)), math.nan)
    full = ~missing.any(axis=1)
    ends[:, full] = np.quantile(buffer[full], levels, axis=1)
    if some.any():  # numpy.nanquantile goes row by row: only where needed
        ends[:, some] = np.nanquantile(buffer[some], levels, axis=1)
    out: dict[str, IntervalTensors] = {}
    start = 0
    for key, size in zip(keys, sizes, strict=True):
        shape = estimate[key].shape  # [R, ...]
        low, high = (
            torch.from_numpy(ends[k, start : start + size].copy()).view(shape) for k in (0, 1)
        )
        start += size
        out[key] = IntervalTensors(
            *(t.reshape((*layout.batch, *shape[1:])) for t in (estimate[key], low, high))
        )
    return out

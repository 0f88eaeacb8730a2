r"""Confidence intervals from one run's test items: every cell, and the metrics (paired bootstrap).

A cell ``R[i, j]`` is a mean over the ``n_j`` test items of task ``j``; a finite test set makes it
an estimate of the model's accuracy on the task's population, with sampling error. These
functions state that error from the per-item records of one run.

Inputs: ``items`` has one entry per task ``j``, the value of each of its test items after every
stage, ``[T, n_j]`` (row ``i``: after stage ``i``; item ``k`` is the ``k``-th item of the task's
test set in every row). 0/1 scores (correct or not) are ``bool`` tensors or
[`PackedBits`][]; other per-item scores (a per-sample loss) are
floating tensors. ``baseline`` (the untrained model, for FWT) and ``reference`` (a reference model,
for intransigence) hold one ``[n_j]`` entry per task, the same items. Rows ``i < j - 1`` of task
``j`` are cells no metric reads (``R[i, j]`` with ``j > i + 1``): any value, NaN included, is
allowed there. To state the metrics after stage ``s < T - 1``, pass the leading ``s + 1`` tasks with
their first ``s + 1`` rows.

Per cell ([`cell_intervals`][continual_eval.functional.cell_intervals]), at confidence ``c`` with
``z = Phi^{-1}((1 + c) / 2)``:

* 0/1 scores: the Wilson score interval (Wilson, "Probable inference, the law of succession, and
  statistical inference", JASA 1927) of ``x`` successes in ``n`` items, ``p = x / n``:
  ``(p + z^2/(2n) -/+ z sqrt(p(1-p)/n + z^2/(4n^2))) / (1 + z^2/n)``; it stays in ``[0, 1]`` and
  keeps its coverage near 0 and 1, where the normal (Wald) interval does not.
* other scores: the Student-t interval ``mean -/+ t_{(1+c)/2, n-1} s / sqrt(n)`` (``s``: the
  sample standard deviation of the items, ``ddof = 1``).

The metrics ([`paired_bootstrap`][continual_eval.functional.paired_bootstrap]): ``R[i, j]`` and
``R[j, j]`` (and ``b[j]``, ``ref[j]``) are scored on the *same* items, so the noise of BWT, FWT,
forgetting and intransigence is paired and much smaller than independent binomial errors of the two
cells suggest. The paired bootstrap draws one resample of each task's items and uses it in every
cell of that task: resample ``r`` gives task ``j`` weights ``w_{rk}`` over its items and

``R*_r[i, j] = sum_k w_{rk} v_{ijk} / sum_k w_{rk}``, likewise ``b*_r[j]``, ``ref*_r[j]``,

then every metric of ``(R*_r, b*_r, ref*_r)`` by the formulas of
`accuracy_matrix` (batched over ``r``). Tasks are resampled
independently (a stratified bootstrap: strata are tasks). The interval is the percentile
interval: the ``(1-c)/2`` and ``(1+c)/2`` quantiles of the ``resamples`` values
(``numpy.quantile``, linear interpolation). Two weight schemes:

* ``"double_or_nothing"`` (default): ``w_{rk} in {0, 2}`` with probability 1/2 each,
  independently per item (Owen & Eckles, "Bootstrapping data arrays of arbitrary order", Annals
  of Applied Statistics 2012): a resample keeps each item with probability 1/2. ``E w = 1`` and
  ``Var w = 1``, as for Efron's resampling (Poisson(1) counts), so a cell's resampled variance is
  ``p(1-p)/n`` to first order. It needs one random bit per item, and 0/1 items are then summed
  by ``popcount`` over 64-bit words: 10,000 resamples of 20 tasks x 2000 items take well under a
  second on one thread (``benchmarks/bench_intervals.py``). A resample that keeps none of a
  task's items (probability ``2^-n_j``) is drawn again.
* ``"multinomial"``: Efron's bootstrap, ``n_j`` items drawn with replacement per task
  (``w`` = the counts); several times slower (a weight matrix and a matrix product per task).

Randomness: ``numpy.random.default_rng(seed)`` (PCG64), so an interval is reproducible from
``(items, seed, resamples, weights)``;
[`resample_weights`][continual_eval.functional.resample_weights] returns the weights themselves.

What the intervals mean, and what they do not: they state the error due to the finite test set
(a new test set of the same size drawn from the same population), for the trained models as
they are; not the variation between training runs (seeds: `continual_eval.seed_statistics`).
Forgetting is a maximum over stages; where several stages tie for a task's peak, the plug-in
value is biased upward and no bootstrap interval covers reliably (the bootstrap of a maximum is
inconsistent at ties; Andrews, Econometrica 2000): read a forgetting interval near 0 with care.
"""

from __future__ import annotations

import functools
import math
import numbers
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import numpy as np
import torch
from torch import Tensor

from continual_eval.functional._validation import (
    check_direction,
    check_forgetting_convention,
)
from continual_eval.functional._workspace import used_cells
from continual_eval.functional.accuracy_matrix import (
    FWT_CONVENTIONS,
    average_accuracy,
    average_incremental_accuracy,
    backward_transfer,
    backward_transfer_per_task,
    forgetting_per_task,
    forward_transfer,
    forward_transfer_per_task,
    intransigence,
    intransigence_per_task,
    learning_accuracy,
)

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_RESAMPLES",
    "WEIGHT_SCHEMES",
    "BootstrapIntervals",
    "CellIntervals",
    "IntervalTensors",
    "PackedBits",
    "cell_intervals",
    "normal_quantile",
    "pack_bits",
    "paired_bootstrap",
    "resample_weights",
    "student_t_interval",
    "t_quantile",
    "unpack_bits",
    "wilson_interval",
    "window_means_interval",
]

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 10_000
WEIGHT_SCHEMES = ("double_or_nothing", "multinomial")
#: 64-bit words (double-or-nothing on 0/1 items) or weights (otherwise) handled per block of
#: resamples: bounds the memory (about 16 MiB per buffer); the results do not depend on it
_BLOCK_CELLS = 1 << 21
_WORD = 64


class PackedBits(NamedTuple):
    """0/1 item values packed eight to a byte: item ``k`` is bit ``k % 8`` of byte ``k // 8``
    (``numpy.packbits(..., bitorder="little")``); ``bits`` is ``uint8`` ``[..., ceil(n / 8)]``
    and ``num_items`` is ``n`` (the bits past it are ignored)."""

    bits: Tensor
    num_items: int


def pack_bits(values: Tensor) -> PackedBits:
    """[`PackedBits`][] of a ``bool`` tensor along its last
    dimension (its items)."""
    if not isinstance(values, Tensor) or values.dtype != torch.bool:
        raise TypeError(f"pack_bits takes a bool tensor, got {_describe(values)}")
    packed = np.packbits(values.detach().cpu().numpy(), axis=-1, bitorder="little")
    return PackedBits(torch.from_numpy(packed), int(values.shape[-1]))


def unpack_bits(packed: PackedBits) -> Tensor:
    """The ``bool`` tensor ``[..., n]`` of [`PackedBits`][] (the
    inverse of [`pack_bits`][continual_eval.functional.pack_bits])."""
    bits = packed.bits.detach().cpu().numpy()
    values = np.unpackbits(bits, axis=-1, count=int(packed.num_items), bitorder="little")
    return torch.from_numpy(values.astype(bool))


# ---------------------------------------------------------------------------- quantiles
def normal_quantile(probability: float) -> float:
    """``Phi^{-1}(probability)``, the standard normal quantile (``statistics.NormalDist``)."""
    return statistics.NormalDist().inv_cdf(probability)


@functools.lru_cache(maxsize=1024)
def t_quantile(probability: float, df: int | float) -> float:
    """``t_{probability, df}``, the Student-t quantile (``scipy.stats.t.ppf``; scipy comes with
    the ``plot`` and ``experiments`` extras and is imported only here, when a t interval is
    computed)."""
    try:
        import scipy.stats  # type: ignore[import-untyped]  # lazily: an extra
    except ImportError as err:  # pragma: no cover - scipy comes with the plot/experiments extras
        raise ImportError(
            "the Student-t interval needs scipy: pip install 'continual-eval[plot]'"
        ) from err
    return float(scipy.stats.t.ppf(probability, df))


def _check_confidence(confidence: float) -> float:
    if (
        not isinstance(confidence, numbers.Real)
        or isinstance(confidence, bool)
        or not 0 < confidence < 1
    ):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(confidence)


# ---------------------------------------------------------------------------- per cell
class IntervalTensors(NamedTuple):
    """Point estimates and interval ends, one tensor each, of equal shape (NaN: absent)."""

    estimate: Tensor
    low: Tensor
    high: Tensor


def wilson_interval(
    successes: Tensor, trials: Tensor, *, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[Tensor, Tensor]:
    r"""Wilson score interval of ``successes`` out of ``trials``, element-wise (float64).

    ``(p + z^2/(2n) -/+ z sqrt(p(1-p)/n + z^2/(4n^2))) / (1 + z^2/n)`` with ``p = x/n`` and
    ``z = Phi^{-1}((1 + c)/2)``; NaN where ``trials`` is 0.

    >>> low, high = wilson_interval(torch.tensor(8), torch.tensor(10))
    >>> round(low.item(), 4), round(high.item(), 4)
    (0.4902, 0.9433)
    """
    z = normal_quantile((1 + _check_confidence(confidence)) / 2)
    x = torch.as_tensor(successes).to(torch.float64)
    n = torch.as_tensor(trials).to(torch.float64)
    p = x / n
    shrink = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / shrink
    half = z * torch.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / shrink
    return (centre - half).clamp(min=0.0), (centre + half).clamp(max=1.0)


def student_t_interval(
    mean: Tensor, std: Tensor, count: Tensor, *, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[Tensor, Tensor]:
    r"""``mean -/+ t_{(1+c)/2, n-1} std / sqrt(n)``, element-wise (float64; ``std`` with
    ``ddof = 1``); NaN where ``count < 2``."""
    level = (1 + _check_confidence(confidence)) / 2
    mean, std = torch.as_tensor(mean).to(torch.float64), torch.as_tensor(std).to(torch.float64)
    n = torch.as_tensor(count).to(torch.float64).expand_as(mean)
    sizes = {int(k) for k in n.reshape(-1).tolist()}
    quantiles = {k: t_quantile(level, k - 1) for k in sizes if k >= 2}
    t = torch.tensor(
        [quantiles.get(int(k), math.nan) for k in n.reshape(-1).tolist()], dtype=torch.float64
    )
    half = t.view_as(n) * std / n.sqrt()
    return mean - half, mean + half


def window_means_interval(
    successes: Tensor, trials: Tensor, *, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[float, float] | None:
    r"""Interval of the pooled proportion ``p = sum(x) / sum(n)`` of a stream from its
    consecutive windows' counts (``successes``, ``trials``: ``[W]``, in stream order), by batch
    means: the windows are the batches, and their spread, not a binomial count, gives the error,
    so predictions correlated within a window (labels in runs, a learner better on some
    classes) are accounted for.

    ``p -/+ t_{(1+c)/2, k-1} sqrt(v / k)`` over the ``k`` windows with a prediction, ``z_w =
    (x_w - p n_w) / nbar`` the windows' linearised deviations (``nbar = sum(n) / k``; for equal
    windows ``z_w = x_w / n - p``) and ``v = sum_w (z_{w+1} - z_w)^2 / (2 (k - 1))`` their
    variance by the mean squared successive difference (von Neumann et al., Ann. Math. Stat.
    1941), which a slow drift of the accuracy (a learning curve) barely inflates. Assumes windows
    longer than the stream's correlation (adjacent windows nearly independent); clipped to
    ``[0, 1]``; ``None`` with fewer than two windows with a prediction or all of them equal.

    >>> low, high = window_means_interval(torch.tensor([30, 35, 38, 40]), torch.full((4,), 50))
    >>> round(low, 4), round(high, 4)
    (0.6349, 0.7951)
    """
    level = (1 + _check_confidence(confidence)) / 2
    x = torch.as_tensor(successes).to(torch.float64).reshape(-1)
    n = torch.as_tensor(trials).to(torch.float64).reshape(-1)
    if x.shape != n.shape:
        raise ValueError(
            f"window_means_interval: successes {tuple(x.shape)} and trials {tuple(n.shape)} "
            "must have one count per window each"
        )
    bad = ~(torch.isfinite(x) & torch.isfinite(n) & (x >= 0) & (x <= n))
    if bool(bad.any()):
        w = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"window_means_interval: window {w} has {x[w].item()} successes of "
            f"{n[w].item()} trials; expected finite counts with 0 <= successes <= trials"
        )
    kept = n > 0
    x, n = x[kept], n[kept]
    k = int(n.numel())
    if k < 2:
        return None
    p = x.sum() / n.sum()
    z = (x - p * n) / (n.sum() / k)
    v = torch.diff(z).square().sum() / (2 * (k - 1))
    if not bool(v > 0):
        return None
    half = t_quantile(level, k - 1) * math.sqrt(float(v) / k)
    return max(float(p) - half, 0.0), min(float(p) + half, 1.0)


# ---------------------------------------------------------------------------- item layout
def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


@dataclass(frozen=True)
class _Layout:
    """Every item row of every run and task in one array. Rows (``K``): ``0..T-1`` the stages,
    then the baseline and the reference rows when given. Columns: the ``R * T`` strata (run
    ``r``'s task ``j`` is stratum ``r * T + j``), each a task's items.

    0/1 items (``binary``): ``words`` ``uint64`` ``[K, W]``, each stratum's items padded to
    whole 64-bit words (``word_start`` its first word). Other items: ``values`` float64
    ``[R * T, n_max, K]``, zero past each stratum's items.
    """

    num_tasks: int
    batch: tuple[int, ...]
    num_items: tuple[int, ...]  # per stratum
    baseline_row: int | None
    reference_row: int | None
    binary: bool
    words: np.ndarray | None = None
    values: Tensor | None = None

    @property
    def num_runs(self) -> int:
        return math.prod(self.batch)

    @property
    def num_rows(self) -> int:
        return self.num_tasks + (self.baseline_row is not None) + (self.reference_row is not None)

    @property
    def task_words(self) -> np.ndarray:
        return -(-np.asarray(self.num_items, dtype=np.int64) // _WORD)

    @property
    def word_start(self) -> np.ndarray:
        """The first word of each stratum."""
        words = self.task_words
        return np.asarray(np.cumsum(words) - words, dtype=np.int64)

    @property
    def total_words(self) -> int:
        return int(self.task_words.sum())


def _entry(
    name: str, entry: object, task: int, rows: int | None, batch: tuple[int, ...] | None
) -> tuple[np.ndarray | Tensor, int, bool, tuple[int, ...]]:
    """One task's entry as ``(packed uint8 [R, rows, nbytes] | float64 [R, rows, n], n, binary,
    batch)``; ``rows=None``: one row (baseline, reference), returned as ``rows = 1``."""
    where = f"{name}[{task}]"
    trailing = 1 if rows is None else 2
    want = "[..., n_j]" if rows is None else f"[..., T, n_j] with T = {rows}"
    tensor = entry.bits if isinstance(entry, PackedBits) else entry
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{where} must be a tensor or PackedBits, got {type(entry).__name__}")
    shape = tuple(tensor.shape)
    if len(shape) < trailing or (rows is not None and shape[-2] != rows):
        raise ValueError(f"{where} must have shape {want}, got {shape}")
    here = shape[:-trailing]
    if batch is not None and here != batch:
        raise ValueError(
            f"{where} has batch (run) shape {here}, items[0] has {batch}: every entry must "
            "have the same leading dimensions"
        )
    runs = math.prod(here)
    if isinstance(entry, PackedBits):
        n = entry.num_items
        if tensor.dtype != torch.uint8:
            raise TypeError(f"{where}: PackedBits.bits must be uint8, got {tensor.dtype}")
        if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 0:
            raise ValueError(f"{where}: PackedBits.num_items must be a non-negative int, got {n!r}")
        if shape[-1] != -(-int(n) // 8):
            raise ValueError(
                f"{where}: PackedBits.bits must have {-(-int(n) // 8)} bytes per row for {n} "
                f"items, got {shape[-1]}"
            )
        data = tensor.detach().cpu().numpy().reshape(runs, rows or 1, shape[-1])
        return data, int(n), True, here
    n = shape[-1]
    values = tensor.detach().cpu().reshape(runs, rows or 1, n)
    if tensor.dtype == torch.bool:
        return np.packbits(values.numpy(), axis=-1, bitorder="little"), n, True, here
    if not tensor.is_floating_point():
        raise TypeError(
            f"{where} must be bool (0/1 scores), floating (other scores) or PackedBits, "
            f"got {tensor.dtype}"
        )
    return values.to(torch.float64), n, False, here


def _check_finite(
    name: str, task: int, values: Tensor, first_row: int, batch: tuple[int, ...], single: bool
) -> None:
    """Raise naming the first non-finite value a metric reads (rows ``>= first_row``)."""
    used = values[:, first_row:]
    bad = ~torch.isfinite(used)
    if not bool(bad.any()):
        return
    run, row, item = (int(v) for v in bad.nonzero()[0])
    value = used[run, row, item].item()
    index = [*np.unravel_index(run, batch)] if batch else []
    if single:
        where = ", ".join(map(str, [*index, item]))
        raise ValueError(f"{name}[{task}][{where}] is {value!r}: item values must be finite")
    where = ", ".join(map(str, [*index, row + first_row, item]))
    run_text = f"run {tuple(int(i) for i in index)}, " if batch else ""
    raise ValueError(
        f"{name}[{task}][{where}] is {value!r} ({run_text}task {task}, stage {row + first_row}, "
        f"item {item}): item values a metric reads must be finite (rows i < j - 1 are never "
        "read and may hold anything)"
    )


def _layout(
    items: Sequence[Tensor | PackedBits],
    baseline: Sequence[Tensor | PackedBits] | None,
    reference: Sequence[Tensor | PackedBits] | None,
) -> _Layout:
    if isinstance(items, (Tensor, PackedBits)) or not isinstance(items, Sequence) or not items:
        raise TypeError(
            "items must be a non-empty sequence with one [T, n_j] entry per task, "
            f"got {_describe(items)}"
        )
    num_tasks = len(items)
    extra: list[tuple[str, Sequence[Tensor | PackedBits]]] = []
    for name, vectors in (("baseline", baseline), ("reference", reference)):
        if vectors is None:
            continue
        if isinstance(vectors, (Tensor, PackedBits)) or not isinstance(vectors, Sequence):
            raise TypeError(f"{name} must be a sequence with one [n_j] entry per task")
        if len(vectors) != num_tasks:
            raise ValueError(f"{name} has {len(vectors)} entries for {num_tasks} tasks")
        extra.append((name, vectors))
    batch: tuple[int, ...] | None = None
    tasks: list[list[np.ndarray | Tensor]] = []
    sizes: list[int] = []
    kinds: set[bool] = set()
    for j in range(num_tasks):
        rows, n, binary, batch = _entry("items", items[j], j, num_tasks, batch)
        if n == 0:
            raise ValueError(f"items[{j}] has no items: task {j}'s test set is empty")
        if not binary:
            _check_finite("items", j, cast(Tensor, rows), max(j - 1, 0), batch, single=False)
        parts, kinds = [rows], kinds | {binary}
        for name, vectors in extra:
            row, m, row_binary, _ = _entry(name, vectors[j], j, None, batch)
            if m != n:
                raise ValueError(f"{name}[{j}] has {m} items, items[{j}] has {n}: the same items")
            if not row_binary:
                _check_finite(name, j, cast(Tensor, row), 0, batch, single=True)
            parts.append(row)
            kinds |= {row_binary}
        tasks.append(parts)
        sizes.append(n)
    assert batch is not None
    if len(kinds) > 1:
        raise TypeError(
            "items, baseline and reference mix 0/1 (bool or PackedBits) and floating item "
            "values: use one kind for every task"
        )
    names = [name for name, _ in extra]
    baseline_row = num_tasks if "baseline" in names else None
    reference_row = num_tasks + len(names) - 1 if "reference" in names else None
    runs = math.prod(batch)
    strata = tuple(sizes) * runs
    if kinds == {True}:
        blocks = []  # per task: [K, R, padded bytes]
        for parts, n in zip(tasks, sizes, strict=True):
            stacked = np.concatenate(cast(list[np.ndarray], parts), axis=1)  # [R, K, bytes]
            padded = np.zeros((*stacked.shape[:2], -(-n // _WORD) * 8), dtype=np.uint8)
            padded[..., : stacked.shape[2]] = stacked
            padded[..., :] &= _valid_bytes(n)  # PackedBits may carry bits past num_items
            blocks.append(padded.transpose(1, 0, 2))
        joined = np.concatenate(blocks, axis=2).reshape(blocks[0].shape[0], -1)  # run-major
        words = np.ascontiguousarray(joined).view(np.uint64)
        return _Layout(num_tasks, batch, strata, baseline_row, reference_row, True, words=words)
    n_max = max(sizes)
    values = torch.zeros(runs, num_tasks, n_max, num_tasks + len(extra), dtype=torch.float64)
    for j, (parts, n) in enumerate(zip(tasks, sizes, strict=True)):
        rows_of_task = torch.cat(cast(list[Tensor], parts), dim=1)  # [R, K, n]
        # rows no metric reads may hold NaN: zeroed, so that weight x value stays finite
        # (their cells are set to NaN after the sums)
        finite = torch.nan_to_num(rows_of_task.transpose(1, 2), nan=0.0, posinf=0, neginf=0)
        values[:, j, :n] = finite
    flat = values.reshape(runs * num_tasks, n_max, -1)
    return _Layout(num_tasks, batch, strata, baseline_row, reference_row, False, values=flat)


#: set bits per byte value, for numpy < 2.0 (no ``numpy.bitwise_count``)
_BYTE_POPCOUNT = np.array([bin(value).count("1") for value in range(256)], dtype=np.uint8)


def _popcount(words: np.ndarray) -> np.ndarray:
    """Set bits of each ``uint64`` word (``uint8``): ``numpy.bitwise_count`` (numpy >= 2.0), else
    a byte table (torchmetrics, which brings numpy, allows numpy 1.x)."""
    count = getattr(np, "bitwise_count", None)
    if count is not None:
        return count(words)  # type: ignore[no-any-return]
    by_byte = _BYTE_POPCOUNT[np.ascontiguousarray(words).view(np.uint8)]
    return np.asarray(by_byte.reshape(*words.shape, 8).sum(axis=-1, dtype=np.uint8))


@functools.lru_cache(maxsize=64)
def _valid_bytes(n: int) -> np.ndarray:
    """``uint8`` bytes of whole 64-bit words with the first ``n`` bits set (shared: read only)."""
    nbytes = -(-n // _WORD) * 8
    return np.packbits(np.arange(nbytes * 8) < n, bitorder="little")


# ---------------------------------------------------------------------------- cell intervals
@dataclass(frozen=True)
class CellIntervals:
    """Per-cell intervals ([`cell_intervals`][continual_eval.functional.cell_intervals]): ``scores``
    ``[..., T, T]`` (``R[i, j]``), ``baseline`` and ``reference`` ``[..., T]`` when given; NaN in
    cells no metric reads."""

    scores: IntervalTensors
    baseline: IntervalTensors | None
    reference: IntervalTensors | None
    method: str
    """``"wilson"`` (0/1 items) or ``"t"`` (Student t, other items)"""
    confidence: float
    num_items: tuple[int, ...]
    """``n_j`` per task"""


def _unread(num_tasks: int) -> Tensor:
    """``[T, T]`` mask of the cells no metric reads: ``j > i + 1``."""
    return ~used_cells(num_tasks)


def _segment_sum(counts: np.ndarray, layout: _Layout) -> np.ndarray:
    """Sums over each stratum's words along the last axis: ``[..., W] -> [..., S]``."""
    words = layout.task_words
    if not (words == words[0]).all():
        return np.add.reduceat(counts, layout.word_start, axis=-1)
    width = int(words[0])  # equal test-set sizes: strided adds, far faster than a reduction
    split = counts.reshape(*counts.shape[:-1], len(words), width)  # over a short last axis
    if width > 64:
        return np.asarray(split.sum(axis=-1))
    total = split[..., 0].astype(np.uint16)  # at most 64 * 64 bits per stratum
    for k in range(1, width):
        total += split[..., k]
    return total


def _by_run(table: Tensor, layout: _Layout) -> Tensor:
    """``[..., K, R * T] -> [..., R, K, T]``."""
    lead = table.shape[:-2]
    split = table.reshape(*lead, layout.num_rows, layout.num_runs, layout.num_tasks)
    return split.movedim(-2, -3)


def _cell_table(layout: _Layout, confidence: float) -> tuple[IntervalTensors, str]:
    """Estimates and intervals of every row and task, ``[R, K, T]`` each, and the method."""
    n = torch.tensor(layout.num_items, dtype=torch.float64)  # per stratum
    if layout.binary:
        assert layout.words is not None
        successes = torch.from_numpy(
            _segment_sum(_popcount(layout.words), layout).astype(np.float64)
        )  # [K, R * T]
        low, high = wilson_interval(successes, n.expand_as(successes), confidence=confidence)
        table = IntervalTensors(successes / n, low, high)
        return IntervalTensors(*(_by_run(t, layout) for t in table)), "wilson"
    assert layout.values is not None  # [R * T, n_max, K]
    inside = (torch.arange(layout.values.shape[1]) < n.unsqueeze(1)).unsqueeze(-1)
    mean = layout.values.sum(dim=1) / n.unsqueeze(1)  # [R * T, K]
    centred = torch.where(inside, layout.values - mean.unsqueeze(1), 0.0)
    std = (centred.square().sum(dim=1) / (n.unsqueeze(1) - 1)).sqrt()
    count = n.unsqueeze(1).expand_as(mean)
    low, high = student_t_interval(mean, std, count, confidence=confidence)
    table = IntervalTensors(mean, low, high)
    return IntervalTensors(*(_by_run(t.T, layout) for t in table)), "t"


def _unbatch(t: Tensor, layout: _Layout) -> Tensor:
    """``[R, ...] -> [*batch, ...]``."""
    return t.reshape((*layout.batch, *t.shape[1:]))


def _select(table: IntervalTensors, layout: _Layout, row: int | None) -> IntervalTensors | None:
    if row is None:
        return None
    return IntervalTensors(*(_unbatch(t[:, row], layout) for t in table))


def cell_intervals(
    items: Sequence[Tensor | PackedBits],
    *,
    baseline: Sequence[Tensor | PackedBits] | None = None,
    reference: Sequence[Tensor | PackedBits] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> CellIntervals:
    """Per-cell estimates and intervals from per-item records: Wilson for 0/1 items, Student t
    for other items (module notes); float64, NaN in the cells no metric reads (``j > i + 1``).
    Leading dimensions of the entries (several runs) are kept.

    >>> hits = torch.tensor([[True] * 8 + [False] * 2, [True] * 6 + [False] * 4])
    >>> cells = cell_intervals([hits, hits])  # two tasks of 10 items, after stages 0 and 1
    >>> low, high = cells.scores.low[0, 0].item(), cells.scores.high[0, 0].item()
    >>> cells.method, round(low, 4), round(high, 4)
    ('wilson', 0.4902, 0.9433)
    """
    confidence = _check_confidence(confidence)
    layout = _layout(items, baseline, reference)
    table, method = _cell_table(layout, confidence)
    T, unread = layout.num_tasks, _unread(layout.num_tasks)
    return CellIntervals(
        scores=IntervalTensors(
            *(_unbatch(t[:, :T].masked_fill(unread, math.nan), layout) for t in table)
        ),
        baseline=_select(table, layout, layout.baseline_row),
        reference=_select(table, layout, layout.reference_row),
        method=method,
        confidence=confidence,
        num_items=layout.num_items[:T],
    )


# ---------------------------------------------------------------------------- resampling
def _check_bootstrap_options(confidence: float, resamples: int, seed: int, weights: str) -> None:
    _check_confidence(confidence)
    if not isinstance(resamples, numbers.Integral) or isinstance(resamples, bool) or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if weights not in WEIGHT_SCHEMES:
        raise ValueError(f"unknown weights {weights!r}; expected one of {WEIGHT_SCHEMES}")


class _Draws:
    """The resampling weights, block by block of resamples, from one seed.

    Double-or-nothing: ``uint64`` words ``[rows, W]`` of the word layout (bit set: weight 2;
    padding bits cleared), from ``SeedSequence(seed, spawn_key=(0,))``. A stratum that keeps
    none of its items in resample ``r`` gets fresh words from ``SeedSequence(seed,
    spawn_key=(1, r, stratum))`` until it keeps one, so the draws never depend on the block
    size. Multinomial: counts ``[S, rows, n_max]`` (`counts`)."""

    def __init__(self, layout: _Layout, seed: int, weights: str) -> None:
        self.layout, self.scheme, self.seed = layout, weights, int(seed)
        self.rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(0,)))
        self.streams: dict[int, np.random.Generator] = {}
        self.first_row = 0
        self.valid = np.concatenate([_valid_bytes(n) for n in layout.num_items]).view(np.uint64)

    def words(self, rows: int) -> np.ndarray:
        """Double-or-nothing bits ``[rows, W]``; every row keeps at least one item per stratum."""
        words = self.rng.bit_generator.random_raw((rows, self.layout.total_words))
        words &= self.valid
        kept = _segment_sum(_popcount(words), self.layout)
        for row, stratum in zip(*np.nonzero(kept == 0), strict=True):  # rare: 2^-n per stratum
            self._redraw(words[row], self.first_row + int(row), int(stratum))
        self.first_row += rows
        return words

    def _redraw(self, words: np.ndarray, resample: int, stratum: int) -> None:
        key = np.random.SeedSequence(self.seed, spawn_key=(1, resample, stratum))
        stream = np.random.default_rng(key)
        first = int(self.layout.word_start[stratum])
        span = slice(first, first + int(self.layout.task_words[stratum]))
        while not _popcount(words[span]).any():
            words[span] = stream.bit_generator.random_raw(span.stop - span.start) & self.valid[span]

    def counts(self, rows: int, dtype: torch.dtype) -> Tensor:
        """Multinomial counts ``[S, rows, n_max]`` (zero past each stratum's items): per
        stratum, ``n`` indices drawn uniformly from its items. Strata of one size share a
        stream, ``SeedSequence(seed, spawn_key=(2, n))``, drawn resample by resample."""
        sizes = np.asarray(self.layout.num_items, dtype=np.int64)
        counts = torch.zeros(len(sizes), rows, int(sizes.max()), dtype=dtype)
        for size in np.unique(sizes):  # one draw per distinct test-set size
            strata = torch.from_numpy(np.flatnonzero(sizes == size))
            stream = self.streams.setdefault(
                int(size),
                np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(2, int(size)))),
            )
            drawn = stream.integers(0, size, size=(rows, len(strata), int(size)))
            index = torch.from_numpy(drawn).transpose(0, 1)  # [strata, rows, n]
            hits = torch.zeros(index.shape, dtype=dtype)
            hits.scatter_add_(2, index, torch.ones((), dtype=dtype).expand(index.shape))
            counts[strata, :, : int(size)] = hits
        return counts

    def weights(self, rows: int, dtype: torch.dtype = torch.float64) -> Tensor:
        """The weights ``[S, rows, n_max]`` (zero past each stratum's items)."""
        if self.scheme == "multinomial":
            return self.counts(rows, dtype)
        bits = np.unpackbits(self.words(rows).view(np.uint8), axis=1, bitorder="little")
        weights = torch.from_numpy(_by_stratum(self.layout, bits)).to(dtype).mul_(2.0)
        return weights.permute(1, 0, 2)


def _by_stratum(layout: _Layout, bits: np.ndarray) -> np.ndarray:
    """Unpacked bits ``[..., W * 64]`` of the word layout as ``[..., S, n_max]`` (zero past
    each stratum's items)."""
    sizes = np.asarray(layout.num_items, dtype=np.int64)
    n_max = int(sizes.max())
    if (sizes == n_max).all() and n_max % _WORD == 0:  # no padding: a view
        return bits.reshape(*bits.shape[:-1], len(sizes), n_max)
    inside = np.arange(n_max) < sizes[:, None]
    position = np.where(inside, layout.word_start[:, None] * _WORD + np.arange(n_max), 0)
    return np.take(bits, position, axis=-1) * inside


def _block_rows(layout: _Layout, weights: str) -> int:
    if layout.binary and weights == "double_or_nothing":
        cells = layout.num_rows * layout.total_words
    else:
        cells = len(layout.num_items) * max(layout.num_items)  # the weights of one resample
    return max(1, _BLOCK_CELLS // cells)


def resample_weights(
    num_items: Sequence[int],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    weights: str = "double_or_nothing",
) -> list[Tensor]:
    """The weights [`paired_bootstrap`][continual_eval.functional.paired_bootstrap] draws for tasks
    of these test-set sizes: task ``j``'s ``[resamples, n_j]`` (float64; ``{0, 2}`` for
    double-or-nothing, counts for multinomial). For several runs (leading dimensions), list the
    sizes run by run (``num_items * runs``). The same for 0/1 and for floating items."""
    _check_bootstrap_options(0.5, resamples, seed, weights)
    sizes = tuple(int(n) for n in num_items)
    if not sizes or min(sizes) < 1:
        raise ValueError(f"num_items must be positive test-set sizes, got {list(num_items)!r}")
    layout = _Layout(len(sizes), (1,), sizes, None, None, binary=False)
    draws = _Draws(layout, seed, weights)
    step = _block_rows(layout, weights)
    blocks = [draws.weights(min(step, resamples - r)) for r in range(0, resamples, step)]
    stacked = torch.cat(blocks, dim=1)
    return [stacked[j, :, :n] for j, n in enumerate(sizes)]


def _binary_values(layout: _Layout) -> Tensor:
    """The 0/1 items of the word layout as float64 ``[S, n_max, K]`` (for weight matrices)."""
    assert layout.words is not None
    bits = np.unpackbits(layout.words.view(np.uint8), axis=1, bitorder="little")  # [K, bits]
    by_stratum = torch.from_numpy(_by_stratum(layout, bits).astype(np.float64))  # [K, S, n]
    return by_stratum.permute(1, 2, 0).contiguous()


def _resampled_blocks(
    layout: _Layout, resamples: int, seed: int, weights: str
) -> Iterator[tuple[int, Tensor]]:
    """``(first resample, means [rows, K, S])`` block by block: every row's resampled mean per
    stratum, one resample per stratum shared by all of its rows (the pairing)."""
    draws = _Draws(layout, seed, weights)
    step = _block_rows(layout, weights)
    popcount = layout.binary and weights == "double_or_nothing"
    # 0/1 items under integer weights: every sum is an integer below 2^24, exact in float32
    # (about three times faster matrix products); other items are summed in float64
    exact32 = layout.binary and 2 * max(layout.num_items) < 2**24
    dtype = torch.float32 if exact32 else torch.float64
    values = None
    if not popcount:
        values = layout.values if layout.values is not None else _binary_values(layout)
        values = values.to(dtype)
    for begin in range(0, resamples, step):  # blocks of resamples: bounded memory
        rows = min(step, resamples - begin)
        if popcount:
            assert layout.words is not None
            kept = draws.words(rows)  # [rows, W]
            both = np.bitwise_and(kept[:, None, :], layout.words[None])  # [rows, K, W]
            hits = _segment_sum(_popcount(both), layout)
            total = _segment_sum(_popcount(kept), layout)
            yield begin, torch.from_numpy(hits / total[:, None, :])
            continue
        w = draws.weights(rows, dtype)  # [S, rows, n_max]
        assert values is not None
        sums = torch.bmm(w, values).double()  # [S, rows, K]
        weight = w.sum(dim=2, keepdim=True).double()
        yield begin, (sums / weight).permute(1, 2, 0)


# ---------------------------------------------------------------------------- paired bootstrap
@dataclass(frozen=True)
class BootstrapIntervals:
    """The paired bootstrap's intervals
    ([`paired_bootstrap`][continual_eval.functional.paired_bootstrap]) and how they were drawn.

    Every tensor has the entries' leading (run) dimensions first: 0-dim metrics for one run."""

    metrics: dict[str, IntervalTensors]
    """``acc``, ``bwt``, ``forgetting`` (under ``forgetting_convention``), ``learning_accuracy``,
    ``average_incremental_accuracy``; ``fwt`` with a baseline, ``intransigence`` and
    ``fwt_isolated`` (``R[j, j] - ref[j]`` over ``j >= 1``, FWT's ``isolated`` convention) with
    a reference"""
    per_task: dict[str, IntervalTensors]
    """``bwt``, ``forgetting``, ``fwt`` ``[..., T-1]``; ``intransigence`` ``[..., T]``"""
    cells: IntervalTensors
    """``R[i, j]`` ``[..., T, T]``: percentile intervals of the resampled cells (NaN in the
    cells no metric reads)"""
    baseline: IntervalTensors | None
    reference: IntervalTensors | None
    confidence: float
    resamples: int
    seed: int
    weights: str
    forgetting_convention: str
    fwt_convention: str
    higher_is_better: bool
    num_items: tuple[int, ...]
    method: str = "paired percentile bootstrap over test items"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``None`` for NaN): the settings, then ``metrics``, ``per_task``,
        ``cells``, ``baseline`` and ``reference`` as ``{"estimate", "low", "high"}`` lists."""

        def table(x: IntervalTensors | None) -> dict[str, Any] | None:
            if x is None:
                return None
            return {key: _nan_to_none(t.tolist()) for key, t in x._asdict().items()}

        return {
            "method": self.method,
            "weights": self.weights,
            "confidence": self.confidence,
            "resamples": self.resamples,
            "seed": self.seed,
            "forgetting_convention": self.forgetting_convention,
            "fwt_convention": self.fwt_convention,
            "higher_is_better": self.higher_is_better,
            "num_items": list(self.num_items),
            "metrics": {key: table(v) for key, v in self.metrics.items()},
            "per_task": {key: table(v) for key, v in self.per_task.items()},
            "cells": table(self.cells),
            "baseline": table(self.baseline),
            "reference": table(self.reference),
        }


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _task_mean(per_task: Tensor) -> Tensor:
    """Equal-weight mean over tasks (last dimension); zero when there is none (``T = 1``), the
    convention of [`forgetting`][continual_eval.functional.forgetting]."""
    if per_task.shape[-1]:
        return per_task.mean(dim=-1)
    return per_task.new_zeros(per_task.shape[:-1])


def _metric_family(
    scores: Tensor,
    baseline: Tensor | None,
    reference: Tensor | None,
    *,
    forgetting: str,
    fwt_convention: str,
    higher_is_better: bool,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Means ``[...]`` and per-task values ``[..., T-1 or T]`` of ``scores`` ``[..., T, T]`` by
    the accuracy-matrix functions (batched; ``validate=False``)."""
    options: dict[str, Any] = {
        "higher_is_better": higher_is_better,
        "bounds": None,
        "validate": False,
    }
    per_task = {
        "bwt": backward_transfer_per_task(scores, **options),
        "forgetting": forgetting_per_task(scores, convention=forgetting, **options),
    }
    means = {
        "acc": average_accuracy(scores, **options),
        "bwt": backward_transfer(scores, **options),
        # the mean of the per-task values just computed (forgetting's scan is the costly part;
        # zero without an old task, as the functional means); the other means by their functions
        "forgetting": _task_mean(per_task["forgetting"]),
        "learning_accuracy": learning_accuracy(scores, **options),
        "average_incremental_accuracy": average_incremental_accuracy(scores, **options),
    }
    if baseline is not None:
        fwt = {"convention": fwt_convention, **options}
        per_task["fwt"] = forward_transfer_per_task(scores, baseline, **fwt)
        means["fwt"] = forward_transfer(scores, baseline, **fwt)
    if reference is not None:
        per_task["intransigence"] = intransigence_per_task(scores, reference, **options)
        means["intransigence"] = intransigence(scores, reference, **options)
        # FWT against isolated training, R[j, j] - ref[j] over j >= 1 (a mean of the negated
        # per-task intransigence after the first task; meaningful for an isolated reference)
        means["fwt_isolated"] = forward_transfer(
            scores, reference, convention="isolated", **options
        )
    return means, per_task


class _Samples:
    """The resampled statistics, written block by block into one ``[values, B]`` buffer (each
    statistic's values contiguous, as ``numpy.quantile`` along the last axis wants them)."""

    def __init__(self, resamples: int) -> None:
        self.resamples = resamples
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.buffer: np.ndarray | None = None

    def write(self, begin: int, block: dict[str, Tensor]) -> None:
        rows = next(iter(block.values())).shape[0]
        if self.buffer is None:
            self.shapes = {key: tuple(v.shape[1:]) for key, v in block.items()}
            size = sum(math.prod(shape) for shape in self.shapes.values())
            self.buffer = np.empty((size, self.resamples), dtype=np.float64)
        flat = torch.cat([v.reshape(rows, -1) for v in block.values()], dim=1)
        # transposed by torch (blocked), then copied row by row: far fewer cache misses than
        # numpy's strided copy of the transposed view
        self.buffer[:, begin : begin + rows] = flat.T.contiguous().numpy()

    def percentiles(self, confidence: float) -> dict[str, tuple[Tensor, Tensor]]:
        """Each statistic's ``(1-c)/2`` and ``(1+c)/2`` quantiles (``numpy.quantile``, linear;
        the buffer is reordered in place)."""
        assert self.buffer is not None
        alpha = 1 - confidence
        ends = np.quantile(self.buffer, [alpha / 2, 1 - alpha / 2], axis=1, overwrite_input=True)
        out, begin, ends_t = {}, 0, torch.from_numpy(ends)
        for key, shape in self.shapes.items():
            size = math.prod(shape)
            low, high = (ends_t[k, begin : begin + size].reshape(shape) for k in (0, 1))
            out[key], begin = (low, high), begin + size
        self.buffer = None
        return out


def paired_bootstrap(
    items: Sequence[Tensor | PackedBits],
    *,
    baseline: Sequence[Tensor | PackedBits] | None = None,
    reference: Sequence[Tensor | PackedBits] | None = None,
    forgetting: str = "peak",
    fwt_convention: str = "gem",
    higher_is_better: bool = True,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    weights: str = "double_or_nothing",
) -> BootstrapIntervals:
    r"""Intervals of ACC, BWT, FWT, forgetting, intransigence, learning accuracy and average
    incremental accuracy (and of their per-task values and every read cell) by the paired
    percentile bootstrap over test items (module notes): in each resample, one resample of
    each task's items, used in every cell of that task.

    ``forgetting`` (``"peak"`` or ``"chaudhry"``), ``fwt_convention`` (``"gem"``: ``baseline`` is
    the untrained model; ``"isolated"``: a model trained on each task alone) and
    ``higher_is_better`` are those of `accuracy_matrix`. The
    estimates are the metrics of the run's cells (the means over all items). Entries with
    leading dimensions ``[..., T, n_j]`` are several runs on test sets of these sizes (seeds,
    simulations), each resampled independently; every result keeps those dimensions.

    >>> g = torch.Generator().manual_seed(0)
    >>> items = [torch.rand(2, 500, generator=g) < 0.8 for _ in range(2)]  # T = 2 tasks
    >>> res = paired_bootstrap(items, resamples=2000)
    >>> bwt = res.metrics["bwt"]
    >>> bool(bwt.low <= bwt.estimate <= bwt.high), res.weights
    (True, 'double_or_nothing')
    """
    check_forgetting_convention(forgetting)
    check_direction(higher_is_better)
    if fwt_convention not in FWT_CONVENTIONS:
        raise ValueError(
            f"unknown FWT convention {fwt_convention!r}; expected one of {FWT_CONVENTIONS}"
        )
    _check_bootstrap_options(confidence, resamples, seed, weights)
    layout = _layout(items, baseline, reference)
    T, unread = layout.num_tasks, _unread(layout.num_tasks)
    family: dict[str, Any] = {
        "forgetting": forgetting,
        "fwt_convention": fwt_convention,
        "higher_is_better": higher_is_better,
    }

    def split(means: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """``[..., K, T]`` rows as ``(R [..., T, T], b [..., T], ref [..., T])``."""
        scores = means[..., :T, :].masked_fill(unread, math.nan)
        rows = (layout.baseline_row, layout.reference_row)
        base, ref = (None if row is None else means[..., row, :] for row in rows)
        return scores, base, ref

    table, _ = _cell_table(layout, 0.5)  # [R, K, T]; the estimates: means over all items
    estimate_means, estimate_per_task = _metric_family(*split(table.estimate), **family)
    read = ~unread
    samples = _Samples(int(resamples))
    for begin, block in _resampled_blocks(layout, int(resamples), int(seed), weights):
        scores, base, ref = split(_by_run(block, layout))  # [rows, R, T, T], [rows, R, T]
        means, per_task = _metric_family(scores, base, ref, **family)
        statistics = {f"metric:{k}": v for k, v in means.items()}
        statistics |= {f"task:{k}": v for k, v in per_task.items()}
        statistics["cells"] = scores[..., read]  # [rows, R, read cells]
        for name, values in (("baseline", base), ("reference", ref)):
            if values is not None:
                statistics[name] = values
        samples.write(begin, statistics)
    ends = samples.percentiles(float(confidence))

    def result(estimate: Tensor, key: str) -> IntervalTensors:
        low, high = ends[key]
        return IntervalTensors(*(_unbatch(t, layout) for t in (estimate, low, high)))

    def row(index: int | None, key: str) -> IntervalTensors | None:
        return None if index is None else result(table.estimate[:, index], key)

    cell_estimate = table.estimate[:, :T].masked_fill(unread, math.nan)

    def spread(read_values: Tensor) -> Tensor:  # [R, read cells] -> [R, T, T], NaN unread
        full = cell_estimate.new_full(cell_estimate.shape, math.nan)
        full[..., read] = read_values
        return full

    ends["cells"] = (spread(ends["cells"][0]), spread(ends["cells"][1]))
    return BootstrapIntervals(
        metrics={k: result(v, f"metric:{k}") for k, v in estimate_means.items()},
        per_task={k: result(v, f"task:{k}") for k, v in estimate_per_task.items()},
        cells=result(cell_estimate, "cells"),
        baseline=row(layout.baseline_row, "baseline"),
        reference=row(layout.reference_row, "reference"),
        confidence=float(confidence),
        resamples=int(resamples),
        seed=int(seed),
        weights=weights,
        forgetting_convention=forgetting,
        fwt_convention=fwt_convention,
        higher_is_better=higher_is_better,
        num_items=layout.num_items[:T],
    )


# ---------------------------------------------------------------------------- held-out rows
def held_out_bootstrap(
    rows: Sequence[Tensor],
    *,
    higher_is_better: bool = True,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[IntervalTensors, IntervalTensors]:
    r"""Paired percentile bootstrap of a held-out set's change against its baseline: set ``h``'s
    items ``[K, n_h]`` (row 0 the baseline ``b_h``, row ``i + 1`` stage ``i``; bool or floating),
    one double-or-nothing resample of the set's items (Owen & Eckles 2012, module notes) used
    in every row, so ``delta_h[i] = s_h[i] - b_h`` keeps its pairing. Returns ``delta``
    ``[K - 1, H]`` and ``worst_drop`` ``[H]`` (``max_i (b_h - s_h[i])``, or ``max_i (s_h[i] -
    b_h)`` when lower is better) as `IntervalTensors` (estimate: all items); each set's draws
    from ``SeedSequence(seed, spawn_key=(3, h))``, a resample keeping no item drawn again. The
    worst drop is a maximum over stages: as for forgetting, its interval is unreliable where
    several stages tie (module notes)."""
    _check_bootstrap_options(confidence, resamples, seed, "double_or_nothing")
    check_direction(higher_is_better)
    if isinstance(rows, Tensor) or not rows:
        raise TypeError("rows must be a non-empty sequence with one [K, n_h] tensor per set")
    K = int(rows[0].shape[0]) if isinstance(rows[0], Tensor) and rows[0].ndim == 2 else -1
    alpha = 1 - float(confidence)
    estimates, lows, highs, worst = [], [], [], []
    for h, values in enumerate(rows):
        if not isinstance(values, Tensor) or values.ndim != 2 or values.shape[0] != K or K < 1:
            raise ValueError(
                f"rows[{h}] must be a [K, n_h] tensor with K = {K} (the baseline and the "
                f"stages), got {_describe(values)}"
            )
        if values.shape[1] == 0:
            raise ValueError(f"rows[{h}] has no items: held-out set {h} is empty")
        x = values.detach().cpu().to(torch.float64)
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"rows[{h}] holds a non-finite item value")
        n = int(x.shape[1])
        rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(3, h)))
        step = max(1, _BLOCK_CELLS // n)
        means = []
        for begin in range(0, int(resamples), step):
            count = min(step, int(resamples) - begin)
            kept = rng.integers(0, 2, size=(count, n), dtype=np.int8)
            empty = np.flatnonzero(kept.sum(axis=1) == 0)
            while empty.size:  # rare: 2^-n per resample
                kept[empty] = rng.integers(0, 2, size=(empty.size, n), dtype=np.int8)
                empty = empty[kept[empty].sum(axis=1) == 0]
            w = torch.from_numpy(kept).to(torch.float64)
            means.append((w @ x.T) / w.sum(dim=1, keepdim=True))  # [count, K]
        sampled = torch.cat(means)  # [B, K]
        full = x.mean(dim=1)  # [K]

        def family(m: Tensor) -> tuple[Tensor, Tensor]:
            delta = m[..., 1:] - m[..., :1]
            drop = -delta if higher_is_better else delta
            if drop.shape[-1] == 0:
                return delta, torch.full(drop.shape[:-1], math.nan, dtype=torch.float64)
            return delta, drop.amax(dim=-1)

        delta, drop = family(full)
        boot_delta, boot_drop = family(sampled)
        stats = torch.cat([boot_delta, boot_drop.unsqueeze(-1)], dim=-1).numpy()
        ends = torch.from_numpy(np.quantile(stats, [alpha / 2, 1 - alpha / 2], axis=0))
        estimates.append(delta)
        lows.append(ends[0, :-1])
        highs.append(ends[1, :-1])
        worst.append((drop, ends[0, -1], ends[1, -1]))
    delta_table = IntervalTensors(*(torch.stack(v, dim=1) for v in (estimates, lows, highs)))
    worst_table = IntervalTensors(*(torch.stack([w[k] for w in worst]) for k in range(3)))
    return delta_table, worst_table

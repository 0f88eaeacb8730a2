r"""Statistics of a metric over the runs (seeds) of each method, for the report.

Inputs are plain Python: for each method, its runs as ``{seed: value}``, ``None`` where the metric
is absent in that run (``null`` in its ``results.json``; left out and counted in ``n_absent``).
Every value must be a finite number: ``inf``, ``-inf`` and NaN are refused with an error naming
the method and seed (or the position), and so is a statistic that overflows float64 (values near
``1e308``), never a silent ``inf`` or NaN. Seed labels of one method (or of a pair compared)
must be of one type: ``0`` and ``"0"`` are different seeds and are refused together, by name.
Outputs are frozen dataclasses of floats, and Markdown (names escaped by
`continual_eval._markdown.escape_markdown`) and CSV (through `continual_eval._csv`:
formula-like names neutralised, numbers unchanged) strings.

Over the ``n`` values ``x_1..x_n`` of a method:

* ``mean = 1/n sum_i x_i``; ``std`` the sample standard deviation (``ddof=1``);
* Student-t interval ``mean -/+ t_{(1+c)/2, n-1} std / sqrt(n)`` at confidence ``c`` (0.95 by
  default), ``t`` from ``scipy.stats.t.ppf`` (``scipy`` comes with the ``plot`` and
  ``experiments`` extras and is imported only when an interval is computed);
* percentile bootstrap interval: ``resamples`` (10000 by default) resamples of the ``n`` values
  with replacement, drawn as ``numpy.random.default_rng(seed).integers(0, n, (resamples, n))``
  over the values sorted ascending (so the interval does not depend on their order), and the
  ``(1-c)/2`` and ``(1+c)/2`` quantiles of the resample means (``numpy.quantile``, linear
  interpolation). Reproducible: the same values, ``seed`` and ``resamples`` give the same
  interval.

Few runs. With ``n < 10`` (`SMALL_SAMPLE_RUNS`) a percentile bootstrap is not to be
trusted: resamples of ``n`` values never leave the range of those values, so at ``n = 3`` the
interval is about ``[min, max]`` and covers the mean far less often than its nominal level (the
simulation in ``tests/test_seed_statistics.py`` measures it). Every summary then carries a
``caveat`` (text, for the report to print) naming the fall-back to read instead: the Student-t
interval for the mean; for the interquartile mean, Yuen's trimmed-mean t interval; for the
probability of improvement, the Brunner-Munzel interval. With ``n == 1`` there is no spread:
``std`` and every interval are ``None``; with ``n == 0`` the mean is ``None`` too.

Paired differences between methods A and B use the seeds both have (matched by seed value):
``d_s = A_s - B_s``, summarised as above (the bootstrap resamples seeds, keeping pairs), with the
number of seeds where A is better (higher if ``higher_is_better``, else lower), worse, or tied
(exactly equal).

Aggregates of Agarwal et al., "Deep Reinforcement Learning at the Edge of the Statistical
Precipice" (NeurIPS 2021; the ``rliable`` library), on ``scores`` ``[runs, tasks]`` (a 1-D
sequence is one task):

* interquartile mean (`interquartile_mean`): the 25% trimmed mean of all runs' and tasks'
  scores pooled, ``scipy.stats.trim_mean(scores, 0.25, axis=None)`` (``floor(N / 4)`` values cut
  at each end), rliable's ``aggregate_iqm``;
* stratified bootstrap (`summarize_iqm`): each resample draws ``n`` runs with replacement
  *within each task* (tasks are strata, rliable's ``StratifiedBootstrap``); percentile interval;
* probability of improvement (`probability_of_improvement`): ``P(X > Y)`` of method X over
  Y, averaged over tasks: per task ``1/(n_x n_y) sum_{i,k} ([x_i > y_k] + 1/2 [x_i = y_k])``, the
  Mann-Whitney ``U`` over ``n_x n_y`` (rliable's ``probability_of_improvement``); its interval
  (`summarize_improvement`) resamples X's and Y's runs independently within each task
  (rliable's ``StratifiedIndependentBootstrap``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from continual_eval._csv import csv_text
from continual_eval._markdown import escape_markdown
from continual_eval.functional.intervals import student_t_interval, t_quantile

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_RESAMPLES",
    "SMALL_SAMPLE_RUNS",
    "IQMSummary",
    "ImprovementSummary",
    "Interval",
    "PairedDifference",
    "SeedSummary",
    "bootstrap_interval",
    "brunner_munzel_interval",
    "improvement_csv",
    "improvement_markdown",
    "interquartile_mean",
    "iqm_csv",
    "iqm_markdown",
    "paired_csv",
    "paired_difference",
    "paired_markdown",
    "pairwise_differences",
    "probability_of_improvement",
    "small_sample_caveat",
    "summarize",
    "summarize_improvement",
    "summarize_iqm",
    "summarize_runs",
    "summary_csv",
    "summary_markdown",
    "t_interval",
    "t_quantile",
    "yuen_interval",
]

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 10_000
#: fewer runs than this: the percentile bootstrap is not trusted (a ``caveat`` and a fall-back)
SMALL_SAMPLE_RUNS = 10
#: cells drawn at once by the bootstraps (bounds their memory; the draws do not depend on it)
_CHUNK_CELLS = 1 << 20


@dataclass(frozen=True)
class Interval:
    """A two-sided confidence interval ``[low, high]``."""

    low: float
    high: float


@dataclass(frozen=True)
class SeedSummary:
    """One method's metric over its runs (see the module's formulas)."""

    n: int
    """runs with a value"""
    mean: float | None
    """``None`` when ``n == 0``"""
    std: float | None
    """sample standard deviation (``ddof=1``); ``None`` when ``n < 2``"""
    t_interval: Interval | None
    """Student-t interval of the mean; ``None`` when ``n < 2``"""
    bootstrap_interval: Interval | None
    """percentile bootstrap interval of the mean; ``None`` when ``n < 2``"""
    n_absent: int
    """runs whose value was ``None`` (left out)"""
    confidence: float
    resamples: int
    bootstrap_seed: int
    caveat: str | None = None
    """with fewer than `SMALL_SAMPLE_RUNS` runs: why the bootstrap interval is not to be
    trusted and which interval to read instead (`small_sample_caveat`)"""


@dataclass(frozen=True)
class PairedDifference:
    """Method A minus method B over the seeds both have a value for."""

    summary: SeedSummary
    """statistics of ``d_s = A_s - B_s`` over the shared seeds (``summary.n == n_shared``)"""
    seeds: tuple[Any, ...]
    """the shared seeds, ascending"""
    a_better: int
    """shared seeds where A is better (higher if ``higher_is_better``, else lower)"""
    b_better: int
    """shared seeds where B is better"""
    ties: int
    """shared seeds where the values are equal"""
    only_a: tuple[Any, ...]
    """seeds with a value for A only"""
    only_b: tuple[Any, ...]
    """seeds with a value for B only"""
    higher_is_better: bool

    @property
    def n_shared(self) -> int:
        return len(self.seeds)

    @property
    def mean_difference(self) -> float | None:
        """mean of ``A - B`` over the shared seeds; ``None`` when none is shared"""
        return self.summary.mean


# ---------------------------------------------------------------------------- checks
def _check_options(confidence: float, resamples: int, seed: int) -> None:
    if (
        not isinstance(confidence, numbers.Real)
        or isinstance(confidence, bool)
        or not 0 < confidence < 1
    ):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if not isinstance(resamples, numbers.Integral) or isinstance(resamples, bool) or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


def _number(value: object, where: str) -> float:
    """``value`` as a finite float; a ``ValueError`` naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where} is {value!r} ({type(value).__name__}); values must be numbers")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(
            f"{where} is {number!r}; values must be finite (None marks a run without the metric)"
        )
    return number


def _values(values: Iterable[float | None], name: str) -> tuple[list[float], int]:
    """``(present values as floats, count of absent ones)``; a non-finite value is refused,
    named ``name[i]``."""
    present: list[float] = []
    absent = 0
    for i, value in enumerate(values):
        if value is None:
            absent += 1
            continue
        present.append(_number(value, f"{name}[{i}]"))
    return present, absent


def _check_seed_types(labels: Iterable[Hashable], owner: str) -> list[Hashable]:
    """The seed labels sorted; labels of mixed types (``0`` and ``"0"``) refused by name."""
    labels = list(labels)
    refuse_mixed_seed_types(labels, owner)
    return sorted(labels)  # type: ignore[type-var]


def refuse_mixed_seed_types(
    labels: Sequence[Any], owner: str, sources: Sequence[str] | None = None
) -> None:
    """A ``ValueError`` naming one label of each type (with ``sources``: where each label comes
    from, e.g. its run's file) when the labels are of more than one type (``0`` and ``"0"``)."""
    first: dict[type, int] = {}
    for i, label in enumerate(labels):
        first.setdefault(type(label), i)
    if len(first) > 1:
        examples = ", ".join(
            f"{labels[i]!r} ({t.__name__}{'' if sources is None else ', ' + sources[i]})"
            for t, i in first.items()
        )
        raise ValueError(
            f"{owner}: seed labels of mixed types: {examples}; seeds are matched by value and "
            "type, so use one type for every seed (all int or all str)"
        )


def _finite(value: float, what: str, owner: str) -> float:
    """``value``, or a ``ValueError`` saying that ``what`` overflows float64."""
    if math.isfinite(value):
        return value
    raise ValueError(
        f"{owner}: the {what} {'of its values' if owner.startswith('method') else 'of values'} "
        f"overflows float64 ({value!r}); the values are too large in magnitude (near 1e308): "
        "rescale them"
    )


# ---------------------------------------------------------------------------- mean of runs
def small_sample_caveat(n: int, statistic: str = "mean", fallback: str | None = "t") -> str | None:
    """The caveat for ``n`` runs (``None`` from `SMALL_SAMPLE_RUNS` on): why a percentile
    bootstrap interval of the ``statistic`` is not to be trusted, and which ``fallback``
    interval to read instead (``None``: there is none)."""
    if n >= SMALL_SAMPLE_RUNS:
        return None
    if n < 2:
        return f"{n} run{'s' if n != 1 else ''}: no spread, so no interval of the {statistic}"
    instead = (
        f"read the {fallback} interval instead"
        if fallback
        else "no interval here is reliable: add runs"
    )
    return (
        f"only {n} runs (fewer than {SMALL_SAMPLE_RUNS}): a percentile bootstrap of {n} values "
        f"cannot reach beyond those values and covers the {statistic} less often than its "
        f"nominal level; {instead}"
    )


def t_interval(
    values: Iterable[float], confidence: float = DEFAULT_CONFIDENCE, *, name: str = "values"
) -> Interval | None:
    r"""``mean -/+ t_{(1+c)/2, n-1} s / sqrt(n)`` (``s``: sample std, ``ddof=1``); ``None`` for
    ``n < 2``.

    >>> ci = t_interval([1.0, 2.0, 3.0])  # 2 -/+ 4.3027 * 1 / sqrt(3)
    >>> round(ci.low, 4), round(ci.high, 4)
    (-0.4841, 4.4841)
    """
    _check_options(confidence, 1, 0)
    present, _ = _values(values, name)
    return _t_interval(np.asarray(present, dtype=np.float64), confidence, name)


def _mean_std(x: np.ndarray, name: str) -> tuple[float, float]:
    owner = name
    with np.errstate(over="ignore", invalid="ignore"):
        mean = _finite(float(np.mean(x)), "mean", owner)
        std = _finite(float(np.std(x, ddof=1)), "standard deviation", owner)
    return mean, std


def _t_interval(x: np.ndarray, confidence: float, name: str) -> Interval | None:
    if x.size < 2:
        return None
    mean, std = _mean_std(x, name)
    low, high = student_t_interval(
        torch.tensor(mean, dtype=torch.float64),
        torch.tensor(std, dtype=torch.float64),
        torch.tensor(x.size),
        confidence=confidence,
    )
    owner = name
    return Interval(
        _finite(low.item(), "t interval", owner), _finite(high.item(), "t interval", owner)
    )


def bootstrap_interval(
    values: Iterable[float],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    name: str = "values",
) -> Interval | None:
    r"""Percentile bootstrap interval of the mean: the ``(1-c)/2`` and ``(1+c)/2`` quantiles of
    the means of ``resamples`` resamples with replacement of the sorted values, drawn by
    ``numpy.random.default_rng(seed).integers(0, n, (resamples, n))``; ``None`` for ``n < 2``.
    Not to be trusted below `SMALL_SAMPLE_RUNS` values (module notes)."""
    _check_options(confidence, resamples, seed)
    present, _ = _values(values, name)
    return _bootstrap_interval(np.asarray(present), confidence, resamples, seed, name)


def _bootstrap_interval(
    values: np.ndarray, confidence: float, resamples: int, seed: int, name: str
) -> Interval | None:
    x = np.sort(values.astype(np.float64))
    n = x.size
    if n < 2:
        return None
    rng = np.random.default_rng(int(seed))
    means = np.empty(int(resamples), dtype=np.float64)
    rows = max(1, _CHUNK_CELLS // n)
    with np.errstate(over="ignore", invalid="ignore"):
        for begin in range(0, int(resamples), rows):
            count = min(rows, int(resamples) - begin)
            means[begin : begin + count] = x[rng.integers(0, n, size=(count, n))].mean(axis=1)
    if not np.isfinite(means).all():
        _finite(float(means[~np.isfinite(means)][0]), "bootstrap mean", name)
    return _percentile_interval(means, confidence)


def _percentile_interval(samples: np.ndarray, confidence: float) -> Interval:
    alpha = 1 - confidence
    low, high = np.quantile(samples, [alpha / 2, 1 - alpha / 2])
    return Interval(float(low), float(high))


def summarize(
    values: Iterable[float | None],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    name: str = "values",
) -> SeedSummary:
    """Mean, sample std, t and bootstrap intervals of one method's values (``None`` left out
    and counted in ``n_absent``), with the small-sample ``caveat``. ``name`` names the values
    in errors (``"values"``: ``values[2] is inf``).

    >>> s = summarize([0.5, None, 0.7], resamples=1000)
    >>> s.n, s.n_absent, round(s.mean, 6), round(s.std, 6)
    (2, 1, 0.6, 0.141421)
    >>> summarize([0.5]).t_interval is None
    True
    """
    _check_options(confidence, resamples, seed)
    present, absent = _values(values, name)
    return _summary(
        np.asarray(present, dtype=np.float64), absent, confidence, resamples, seed, name
    )


def _summary(
    x: np.ndarray, absent: int, confidence: float, resamples: int, seed: int, name: str
) -> SeedSummary:
    n = int(x.size)
    mean: float | None = None
    std: float | None = None
    if n >= 2:
        mean, std = _mean_std(x, name)
    elif n == 1:
        mean = float(x[0])  # one finite value is its own mean
    spread = n >= 2
    return SeedSummary(
        n=n,
        mean=mean,
        std=std,
        t_interval=_t_interval(x, confidence, name) if spread else None,
        bootstrap_interval=(
            _bootstrap_interval(x, confidence, resamples, seed, name) if spread else None
        ),
        n_absent=absent,
        confidence=float(confidence),
        resamples=int(resamples),
        bootstrap_seed=int(seed),
        caveat=small_sample_caveat(n, "mean", "Student-t"),
    )


def _labelled(by_seed: Mapping[Any, float | None], owner: str) -> dict[Any, float | None]:
    """``{seed: finite float or None}`` in seed order; bad seeds and values refused by name."""
    seeds = _check_seed_types(by_seed, owner)
    return {
        s: None if by_seed[s] is None else _number(by_seed[s], f"{owner}, seed {s!r}: the value")
        for s in seeds
    }


def summarize_runs(
    runs: Mapping[str, Mapping[Any, float | None]],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, SeedSummary]:
    """`summarize` of each method's ``{seed: value}`` runs, in the mapping's order (the
    values in seed order)."""
    _check_options(confidence, resamples, seed)
    out = {}
    for method, by_seed in runs.items():
        owner = f"method {method!r}"
        values = _labelled(by_seed, owner)
        present = [v for v in values.values() if v is not None]
        out[method] = _summary(
            np.asarray(present, dtype=np.float64),
            len(values) - len(present),
            confidence,
            resamples,
            seed,
            owner,
        )
    return out


def paired_difference(
    a: Mapping[Any, float | None],
    b: Mapping[Any, float | None],
    *,
    higher_is_better: bool = True,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> PairedDifference:
    """Method A minus method B over the seeds both have a value for (``{seed: value}`` each).

    >>> d = paired_difference({0: 0.8, 1: 0.7, 2: 0.9, 3: 0.5}, {0: 0.6, 1: 0.7, 2: 0.95, 4: 0.1})
    >>> d.seeds, d.only_a, d.only_b, (d.a_better, d.b_better, d.ties)
    ((0, 1, 2), (3,), (4,), (1, 1, 1))
    >>> round(d.mean_difference, 6)  # (0.2 + 0 - 0.05) / 3
    0.05
    """
    if not isinstance(higher_is_better, bool):
        raise TypeError(f"higher_is_better must be True or False, got {higher_is_better!r}")
    _check_options(confidence, resamples, seed)
    _check_seed_types([*a, *b], "the pair (A, B)")
    left = {s: v for s, v in _labelled(a, "method A").items() if v is not None}
    right = {s: v for s, v in _labelled(b, "method B").items() if v is not None}
    shared = sorted(set(left) & set(right))
    x = np.asarray([left[s] for s in shared], dtype=np.float64)
    y = np.asarray([right[s] for s in shared], dtype=np.float64)
    better, worse = (x > y, x < y) if higher_is_better else (x < y, x > y)
    with np.errstate(over="ignore"):
        d = x - y
    for s, value in zip(shared, d, strict=True):
        _finite(float(value), f"difference at seed {s!r}", "method A - method B")
    return PairedDifference(
        summary=_summary(d, 0, confidence, resamples, seed, "differences A - B"),
        seeds=tuple(shared),
        a_better=int(better.sum()),
        b_better=int(worse.sum()),
        ties=int((x == y).sum()),
        only_a=tuple(sorted(set(left) - set(right))),
        only_b=tuple(sorted(set(right) - set(left))),
        higher_is_better=higher_is_better,
    )


def pairwise_differences(
    runs: Mapping[str, Mapping[Any, float | None]],
    *,
    higher_is_better: bool = True,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[tuple[str, str], PairedDifference]:
    """`paired_difference` of every pair ``(A, B)`` of methods, A before B in the mapping's
    order; every method's seeds must share one label type."""
    methods = list(runs)
    _check_seed_types([s for by_seed in runs.values() for s in by_seed], "the methods' runs")
    return {
        (first, second): paired_difference(
            runs[first],
            runs[second],
            higher_is_better=higher_is_better,
            confidence=confidence,
            resamples=resamples,
            seed=seed,
        )
        for i, first in enumerate(methods)
        for second in methods[i + 1 :]
    }


# ---------------------------------------------------------------------------- rliable aggregates
def _score_matrix(scores: object, name: str) -> tuple[np.ndarray, int]:
    """``scores`` as finite float64 ``[runs, tasks]`` and the count of absent runs (``None``
    entries, 1-D scores only)."""
    if (isinstance(scores, np.ndarray) and scores.ndim == 2) or (
        isinstance(scores, Sequence)
        and scores
        and all(isinstance(row, (Sequence, np.ndarray)) for row in scores)
    ):
        matrix = np.asarray(scores, dtype=object)
        if matrix.ndim != 2:
            raise ValueError(f"{name} must be [runs] or [runs, tasks], got ragged rows")
        values = matrix.astype(np.float64)  # None becomes NaN
        bad = np.argwhere(~np.isfinite(values))
        if bad.size:
            i, j = bad[0]
            if matrix[i, j] is None:
                raise ValueError(f"{name}[{i}, {j}] is None: [runs, tasks] scores must be complete")
            _number(values[i, j], f"{name}[{i}, {j}]")  # raises, naming the cell
        return values, 0
    present, absent = _values(list(scores), name)  # type: ignore[call-overload]
    return np.asarray(present, dtype=np.float64).reshape(-1, 1), absent


def interquartile_mean(scores: object) -> float:
    """The interquartile mean (IQM) of ``scores`` (``[runs]`` or ``[runs, tasks]``, pooled):
    ``scipy.stats.trim_mean(scores, 0.25, axis=None)``: the mean after cutting ``floor(N / 4)``
    values at each end (Agarwal et al., NeurIPS 2021; rliable's ``aggregate_iqm``).

    >>> interquartile_mean([8.0, 1.0, 2.0, 7.0, 3.0, 6.0, 4.0, 5.0])  # mean of 3, 4, 5, 6
    4.5
    """
    x, _ = _score_matrix(scores, "scores")
    if not x.size:
        raise ValueError("scores is empty: no run to average")
    return _finite(float(_iqm(x.reshape(1, -1))[0]), "IQM", "scores")


def _iqm(pooled: np.ndarray) -> np.ndarray:
    """Row-wise IQM of ``[rows, N]``: the mean of the sorted values ``floor(N / 4)..N - 1 -
    floor(N / 4)``, as ``scipy.stats.trim_mean(..., 0.25)`` (without its per-call overhead, which
    dominates for the small samples of a bootstrap)."""
    size = pooled.shape[1]
    cut = size // 4
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused by the callers
        middle = np.sort(pooled, axis=1)[:, cut : size - cut].mean(axis=1)
    return np.asarray(middle, dtype=np.float64)


def yuen_interval(
    values: Iterable[float], confidence: float = DEFAULT_CONFIDENCE
) -> Interval | None:
    r"""Yuen's t interval of the 25% trimmed mean (the IQM) of one sample (Yuen, "The two-sample
    trimmed t for unequal population variances", Biometrika 1974; Tukey & McLaughlin 1963):

    ``IQM -/+ t_{(1+c)/2, h-1} sqrt((n-1) s_w^2 / (h (h-1)))`` with ``g = floor(n/4)`` values cut
    at each end, ``h = n - 2g`` and ``s_w^2`` the variance (``ddof=1``) of the winsorized sample
    (the ``g`` lowest values set to the ``(g+1)``-th, the ``g`` highest to the ``(n-g)``-th). With
    ``g = 0`` (``n < 4``) it is the Student-t interval. ``None`` when ``h < 2``.

    >>> ci = yuen_interval([1.0, 2.0, 3.0, 4.0, 10.0])  # g = 1: winsorized 2, 2, 3, 4, 4
    >>> # 3 -/+ t_{0.975, 2} sqrt(4 * 1 / (3 * 2)) = 3 -/+ 4.3027 * 0.8165
    >>> round(ci.low, 4), round(ci.high, 4)
    (-0.5131, 6.5131)
    """
    _check_options(confidence, 1, 0)
    present, _ = _values(values, "values")
    x = np.sort(np.asarray(present, dtype=np.float64))
    n = x.size
    g = n // 4
    h = n - 2 * g
    if h < 2:
        return None
    centre = float(_iqm(x.reshape(1, -1))[0])
    winsorized = np.clip(x, x[g], x[n - g - 1])
    with np.errstate(over="ignore", invalid="ignore"):
        variance = float(np.var(winsorized, ddof=1))
        half = t_quantile((1 + confidence) / 2, h - 1) * math.sqrt(
            (n - 1) * variance / (h * (h - 1))
        )
    return Interval(
        _finite(centre - half, "Yuen interval", "values"),
        _finite(centre + half, "Yuen interval", "values"),
    )


@dataclass(frozen=True)
class IQMSummary:
    """The interquartile mean of one method's scores with its stratified bootstrap interval."""

    n_runs: int
    """runs per task (with a value)"""
    n_tasks: int
    iqm: float | None
    """``None`` without runs"""
    bootstrap_interval: Interval | None
    """stratified percentile bootstrap; ``None`` for fewer than 2 runs"""
    fallback_interval: Interval | None
    """with fewer than `SMALL_SAMPLE_RUNS` runs of one task: `yuen_interval`"""
    caveat: str | None
    """with fewer than `SMALL_SAMPLE_RUNS` runs (`small_sample_caveat`)"""
    n_absent: int
    confidence: float
    resamples: int
    bootstrap_seed: int


def _stratified_resamples(
    x: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    resamples: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """``statistic`` of ``resamples`` stratified resamples of ``x`` ``[n, tasks]`` (each task's
    column sorted, then ``n`` runs drawn with replacement within it, as
    ``rng.integers(0, n, (resamples, n, tasks))``); ``statistic`` maps ``[rows, n, tasks]`` to
    ``[rows]``."""
    x = np.sort(x, axis=0)  # the interval does not depend on the runs' order
    n, tasks = x.shape
    out = np.empty(resamples, dtype=np.float64)
    rows = max(1, _CHUNK_CELLS // (n * tasks))
    for begin in range(0, resamples, rows):
        count = min(rows, resamples - begin)
        index = rng.integers(0, n, size=(count, n, tasks))
        out[begin : begin + count] = statistic(np.take_along_axis(x[None], index, axis=1))
    return out


def summarize_iqm(
    scores: object,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> IQMSummary:
    """The IQM of ``scores`` (``[runs]``, ``None`` absent, or complete ``[runs, tasks]``) and
    its stratified percentile bootstrap interval (rliable's ``StratifiedBootstrap``; draws by
    ``numpy.random.default_rng(seed)``); below `SMALL_SAMPLE_RUNS` runs a ``caveat`` and,
    for one task, Yuen's trimmed-mean t interval as the fall-back."""
    _check_options(confidence, resamples, seed)
    x, absent = _score_matrix(scores, "scores")
    n, tasks = x.shape
    if n == 0:
        return IQMSummary(
            0, tasks, None, None, None, small_sample_caveat(0, "IQM"), absent,
            float(confidence), int(resamples), int(seed),
        )  # fmt: skip
    iqm = _finite(float(_iqm(x.reshape(1, -1))[0]), "IQM", "scores")
    interval = None
    if n >= 2:
        samples = _stratified_resamples(
            x,
            lambda r: _iqm(r.reshape(r.shape[0], -1)),
            int(resamples),
            np.random.default_rng(seed),
        )
        if not np.isfinite(samples).all():  # a resample's sum overflowed (values near 1e308)
            _finite(float(samples[~np.isfinite(samples)][0]), "bootstrap IQM", "scores")
        interval = _percentile_interval(samples, confidence)
    small = n < SMALL_SAMPLE_RUNS
    fallback = yuen_interval(x[:, 0], confidence) if small and tasks == 1 else None
    name = "Yuen trimmed-mean t" if tasks == 1 else None
    return IQMSummary(
        n_runs=n,
        n_tasks=tasks,
        iqm=iqm,
        bootstrap_interval=interval,
        fallback_interval=fallback,
        caveat=small_sample_caveat(n, "IQM", name),
        n_absent=absent,
        confidence=float(confidence),
        resamples=int(resamples),
        bootstrap_seed=int(seed),
    )


def _improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``P(X > Y) + P(X = Y) / 2`` averaged over tasks, of ``x`` ``[rows, n_x, tasks]`` and ``y``
    ``[rows, n_y, tasks]``: ``[rows]``."""
    wins = (x[:, :, None, :] > y[:, None, :, :]).mean(axis=(1, 2))
    ties = (x[:, :, None, :] == y[:, None, :, :]).mean(axis=(1, 2))
    return np.asarray((wins + 0.5 * ties).mean(axis=1), dtype=np.float64)


def _oriented(scores: object, name: str, higher_is_better: bool) -> np.ndarray:
    x, _ = _score_matrix(scores, name)
    return x if higher_is_better else -x


def probability_of_improvement(x: object, y: object, *, higher_is_better: bool = True) -> float:
    r"""The probability that method X improves on method Y (Agarwal et al., NeurIPS 2021;
    rliable's ``probability_of_improvement``): per task ``1/(n_x n_y) sum_{i,k} ([x_i > y_k] +
    [x_i = y_k] / 2)`` (the Mann-Whitney ``U`` over ``n_x n_y``), averaged over tasks; ``x`` and
    ``y`` are ``[runs]`` or ``[runs, tasks]`` (runs may differ in number). For lower-is-better
    scores improvement means lower.

    >>> round(probability_of_improvement([1.0, 2.0, 3.0], [2.0, 2.0, 0.0]), 6)  # 6 of 9 pairs
    0.666667
    """
    a = _oriented(x, "x", _direction(higher_is_better))
    b = _oriented(y, "y", higher_is_better)
    _check_pair(a, b)
    return float(_improvement(a[None], b[None])[0])


def _direction(higher_is_better: bool) -> bool:
    if not isinstance(higher_is_better, bool):
        raise TypeError(f"higher_is_better must be True or False, got {higher_is_better!r}")
    return higher_is_better


def _check_pair(a: np.ndarray, b: np.ndarray) -> None:
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"x has {a.shape[1]} tasks and y has {b.shape[1]}: the same tasks")
    if not a.shape[0] or not b.shape[0]:
        raise ValueError(f"x has {a.shape[0]} runs and y has {b.shape[0]}: each needs one")


def brunner_munzel_interval(
    x: object,
    y: object,
    *,
    higher_is_better: bool = True,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Interval | None:
    r"""The Brunner-Munzel interval of the probability of improvement of X over Y (Brunner &
    Munzel, "The nonparametric Behrens-Fisher problem", Biometrical Journal 2000): per task,
    ``p -/+ t_{(1+c)/2, df} se`` with ``p`` the probability of improvement, ``se = sqrt(n_x S_x^2
    + n_y S_y^2) / (n_x n_y)``, ``S^2`` the variance (``ddof=1``) of each run's overall minus
    internal midrank and ``df`` Welch-Satterthwaite's; over several tasks the mean of ``p`` with
    ``se = sqrt(sum se_m^2) / M`` and Satterthwaite's ``df`` (tasks independent). Clipped to
    ``[0, 1]``; ``None`` with fewer than 2 runs on a side or when every ``S^2`` is 0 (no
    overlap: the variance estimate is 0 and the interval undefined). Approximate for few runs:
    with 6 runs each it covers about 93% at nominal 95% (``tests/test_seed_statistics.py``)."""
    _check_options(confidence, 1, 0)
    a = _oriented(x, "x", _direction(higher_is_better))
    b = _oriented(y, "y", higher_is_better)
    _check_pair(a, b)
    n_a, n_b = a.shape[0], b.shape[0]
    if min(n_a, n_b) < 2:
        return None
    # a run's overall midrank minus its midrank within its own method is its placement: the
    # other method's runs below it, ties counted 1/2
    beats = (a[:, None, :] > b[None, :, :]) + 0.5 * (a[:, None, :] == b[None, :, :])
    placements = (beats.sum(axis=1), (1 - beats).sum(axis=0))  # [n_a, M], [n_b, M]
    parts = (
        np.stack(
            [size * p.var(axis=0, ddof=1) for size, p in zip((n_a, n_b), placements, strict=True)]
        )
        / (n_a * n_b) ** 2
    )  # each method's share of se^2, per task
    total = float(parts.sum())  # sum over tasks of se_m^2
    if total == 0:
        return None
    dof = np.array([[n_a - 1], [n_b - 1]])
    df = total**2 / float((parts**2 / dof).sum())
    probability = float(beats.mean(axis=(0, 1)).mean())
    half = t_quantile((1 + confidence) / 2, df) * math.sqrt(total) / a.shape[1]
    return Interval(max(0.0, probability - half), min(1.0, probability + half))


@dataclass(frozen=True)
class ImprovementSummary:
    """The probability of improvement of method X over method Y, with its interval."""

    probability: float
    bootstrap_interval: Interval | None
    """stratified independent percentile bootstrap; ``None`` for fewer than 2 runs on a side"""
    fallback_interval: Interval | None
    """with fewer than `SMALL_SAMPLE_RUNS` runs on a side: `brunner_munzel_interval`"""
    caveat: str | None
    n_x: int
    n_y: int
    n_tasks: int
    higher_is_better: bool
    confidence: float
    resamples: int
    bootstrap_seed: int


def summarize_improvement(
    x: object,
    y: object,
    *,
    higher_is_better: bool = True,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> ImprovementSummary:
    """`probability_of_improvement` of X over Y and its percentile interval from
    resampling X's and Y's runs independently within each task (rliable's
    ``StratifiedIndependentBootstrap``; X's draws from ``SeedSequence(seed).spawn(2)[0]``, Y's
    from ``[1]``); below `SMALL_SAMPLE_RUNS` runs on a side, a ``caveat`` and the
    Brunner-Munzel interval as the fall-back."""
    _check_options(confidence, resamples, seed)
    a = _oriented(x, "x", _direction(higher_is_better))
    b = _oriented(y, "y", higher_is_better)
    _check_pair(a, b)
    (n_a, tasks), n_b = a.shape, b.shape[0]
    probability = float(_improvement(a[None], b[None])[0])
    interval = None
    if min(n_a, n_b) >= 2:
        first, second = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
        a_sorted, b_sorted = np.sort(a, axis=0), np.sort(b, axis=0)
        samples = np.empty(int(resamples), dtype=np.float64)
        rows = max(1, _CHUNK_CELLS // (n_a * n_b * tasks))
        for begin in range(0, int(resamples), rows):
            count = min(rows, int(resamples) - begin)
            ra = np.take_along_axis(a_sorted[None], first.integers(0, n_a, (count, n_a, tasks)), 1)
            rb = np.take_along_axis(b_sorted[None], second.integers(0, n_b, (count, n_b, tasks)), 1)
            samples[begin : begin + count] = _improvement(ra, rb)
        interval = _percentile_interval(samples, confidence)
    small = min(n_a, n_b) < SMALL_SAMPLE_RUNS
    fallback = (
        brunner_munzel_interval(x, y, higher_is_better=higher_is_better, confidence=confidence)
        if small
        else None
    )
    caveat = small_sample_caveat(
        min(n_a, n_b), "probability of improvement", "Brunner-Munzel" if fallback else None
    )
    return ImprovementSummary(
        probability=probability,
        bootstrap_interval=interval,
        fallback_interval=fallback,
        caveat=caveat,
        n_x=n_a,
        n_y=n_b,
        n_tasks=tasks,
        higher_is_better=higher_is_better,
        confidence=float(confidence),
        resamples=int(resamples),
        bootstrap_seed=int(seed),
    )


# ---------------------------------------------------------------------------- rendering
_MISSING = "—"


def _shown(value: float | None, digits: int) -> str:
    return _MISSING if value is None else f"{value:.{digits}f}"


def _interval(interval: Interval | None, digits: int) -> str:
    if interval is None:
        return _MISSING
    return f"[{interval.low:.{digits}f}, {interval.high:.{digits}f}]"


def _percent(confidence: float) -> str:
    return f"{100 * confidence:g}%"


def _caveat_lines(caveats: Iterable[tuple[str, str | None]]) -> list[str]:
    """Notes under a table: one line per named caveat (names escaped)."""
    notes = [
        f"- {escape_markdown(name)}: {escape_markdown(text)}" for name, text in caveats if text
    ]
    return ["", *notes] if notes else []


def summary_markdown(
    summaries: Mapping[str, SeedSummary], *, digits: int = 4, caveats: bool = False
) -> str:
    """A Markdown table: method (escaped), n, mean, std, t and bootstrap intervals (``—``:
    none); the confidence in the header is the first summary's. ``caveats=True`` lists each
    method's small-sample caveat under the table.

    >>> print(summary_markdown({"ewc": summarize([0.5, 0.7], resamples=100)}, digits=2))
    | method | n | mean | std | 95% CI (t) | 95% CI (bootstrap) |
    |---|---:|---:|---:|---|---|
    | ewc | 2 | 0.60 | 0.14 | [-0.67, 1.87] | [0.50, 0.70] |
    """
    confidence = next(iter(summaries.values())).confidence if summaries else DEFAULT_CONFIDENCE
    pct = _percent(confidence)
    lines = [
        f"| method | n | mean | std | {pct} CI (t) | {pct} CI (bootstrap) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for method, s in summaries.items():
        absent = f" (+{s.n_absent} absent)" if s.n_absent else ""
        lines.append(
            f"| {escape_markdown(method)} | {s.n}{absent} | {_shown(s.mean, digits)} "
            f"| {_shown(s.std, digits)} | {_interval(s.t_interval, digits)} "
            f"| {_interval(s.bootstrap_interval, digits)} |"
        )
    if caveats:
        lines += _caveat_lines((method, s.caveat) for method, s in summaries.items())
    return "\n".join(lines)


def _estimate_cells(s: SeedSummary) -> list[object]:
    """The CSV cells ``mean, std, t_low, t_high, bootstrap_low, bootstrap_high`` of ``s``."""
    t, boot = s.t_interval, s.bootstrap_interval
    return [
        s.mean,
        s.std,
        t.low if t else None,
        t.high if t else None,
        boot.low if boot else None,
        boot.high if boot else None,
    ]


def _bootstrap_settings(s: SeedSummary) -> list[object]:
    """The CSV cells ``confidence, resamples, bootstrap_seed`` of ``s``."""
    return [s.confidence, s.resamples, s.bootstrap_seed]


def summary_csv(summaries: Mapping[str, SeedSummary]) -> str:
    """CSV, one row per method, full precision; empty cells where a value is absent; names
    through `continual_eval._csv.csv_text` (formula-like text neutralised)."""
    header = [
        "method",
        "n",
        "n_absent",
        "mean",
        "std",
        "t_low",
        "t_high",
        "bootstrap_low",
        "bootstrap_high",
        "confidence",
        "resamples",
        "bootstrap_seed",
    ]
    rows = [
        [method, s.n, s.n_absent, *_estimate_cells(s), *_bootstrap_settings(s)]
        for method, s in summaries.items()
    ]
    return csv_text(header, rows)


def paired_markdown(
    differences: Mapping[tuple[str, str], PairedDifference], *, digits: int = 4
) -> str:
    """A Markdown table of `pairwise_differences`: ``A - B`` (names escaped), shared
    seeds, mean difference, both intervals, and wins / losses / ties of A."""
    first = next(iter(differences.values()), None)
    pct = _percent(first.summary.confidence if first else DEFAULT_CONFIDENCE)
    lines = [
        f"| A - B | shared seeds | mean difference | {pct} CI (t) | {pct} CI (bootstrap) "
        "| A better | B better | ties |",
        "|---|---:|---:|---|---|---:|---:|---:|",
    ]
    for (a, b), d in differences.items():
        lines.append(
            f"| {escape_markdown(a)} - {escape_markdown(b)} | {d.n_shared} "
            f"| {_shown(d.mean_difference, digits)} "
            f"| {_interval(d.summary.t_interval, digits)} "
            f"| {_interval(d.summary.bootstrap_interval, digits)} "
            f"| {d.a_better} | {d.b_better} | {d.ties} |"
        )
    return "\n".join(lines)


def paired_csv(differences: Mapping[tuple[str, str], PairedDifference]) -> str:
    """CSV, one row per pair ``(A, B)``, full precision; empty cells where a value is absent."""
    header = [
        "method_a",
        "method_b",
        "n_shared",
        "mean_difference",
        "std",
        "t_low",
        "t_high",
        "bootstrap_low",
        "bootstrap_high",
        "a_better",
        "b_better",
        "ties",
        "higher_is_better",
        "confidence",
        "resamples",
        "bootstrap_seed",
    ]
    rows = [
        [
            a,
            b,
            d.n_shared,
            *_estimate_cells(d.summary),
            d.a_better,
            d.b_better,
            d.ties,
            d.higher_is_better,
            *_bootstrap_settings(d.summary),
        ]
        for (a, b), d in differences.items()
    ]
    return csv_text(header, rows)


def iqm_markdown(summaries: Mapping[str, IQMSummary], *, digits: int = 4) -> str:
    """A Markdown table of `summarize_iqm` per method (names escaped): runs, tasks, IQM,
    the stratified bootstrap interval and the fall-back; each method's caveat under it."""
    first = next(iter(summaries.values()), None)
    pct = _percent(first.confidence if first else DEFAULT_CONFIDENCE)
    lines = [
        f"| method | runs | tasks | IQM | {pct} CI (stratified bootstrap) | {pct} CI (Yuen) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for method, s in summaries.items():
        lines.append(
            f"| {escape_markdown(method)} | {s.n_runs} | {s.n_tasks} | {_shown(s.iqm, digits)} "
            f"| {_interval(s.bootstrap_interval, digits)} "
            f"| {_interval(s.fallback_interval, digits)} |"
        )
    lines += _caveat_lines((method, s.caveat) for method, s in summaries.items())
    return "\n".join(lines)


def iqm_csv(summaries: Mapping[str, IQMSummary]) -> str:
    """CSV of `summarize_iqm` per method, full precision, names neutralised."""
    header = [
        "method", "n_runs", "n_tasks", "n_absent", "iqm", "bootstrap_low", "bootstrap_high",
        "yuen_low", "yuen_high", "caveat", "confidence", "resamples", "bootstrap_seed",
    ]  # fmt: skip
    rows = [
        [
            method,
            s.n_runs,
            s.n_tasks,
            s.n_absent,
            s.iqm,
            *_ends(s.bootstrap_interval),
            *_ends(s.fallback_interval),
            s.caveat,
            s.confidence,
            s.resamples,
            s.bootstrap_seed,
        ]
        for method, s in summaries.items()
    ]
    return csv_text(header, rows)


def _ends(interval: Interval | None) -> list[float | None]:
    return [None, None] if interval is None else [interval.low, interval.high]


def improvement_markdown(
    improvements: Mapping[tuple[str, str], ImprovementSummary], *, digits: int = 3
) -> str:
    """A Markdown table of `summarize_improvement` per pair ``(X, Y)`` (names escaped):
    ``P(X > Y)``, the bootstrap interval and the Brunner-Munzel fall-back; caveats under it."""
    first = next(iter(improvements.values()), None)
    pct = _percent(first.confidence if first else DEFAULT_CONFIDENCE)
    lines = [
        f"| X over Y | runs X | runs Y | P(X > Y) | {pct} CI (bootstrap) "
        f"| {pct} CI (Brunner-Munzel) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for (x, y), s in improvements.items():
        lines.append(
            f"| {escape_markdown(x)} over {escape_markdown(y)} | {s.n_x} | {s.n_y} "
            f"| {_shown(s.probability, digits)} | {_interval(s.bootstrap_interval, digits)} "
            f"| {_interval(s.fallback_interval, digits)} |"
        )
    lines += _caveat_lines((f"{x} over {y}", s.caveat) for (x, y), s in improvements.items())
    return "\n".join(lines)


def improvement_csv(improvements: Mapping[tuple[str, str], ImprovementSummary]) -> str:
    """CSV of `summarize_improvement` per pair ``(X, Y)``, names neutralised."""
    header = [
        "method_x", "method_y", "n_x", "n_y", "n_tasks", "probability", "bootstrap_low",
        "bootstrap_high", "brunner_munzel_low", "brunner_munzel_high", "caveat",
        "higher_is_better", "confidence", "resamples", "bootstrap_seed",
    ]  # fmt: skip
    rows = [
        [
            x,
            y,
            s.n_x,
            s.n_y,
            s.n_tasks,
            s.probability,
            *_ends(s.bootstrap_interval),
            *_ends(s.fallback_interval),
            s.caveat,
            s.higher_is_better,
            s.confidence,
            s.resamples,
            s.bootstrap_seed,
        ]
        for (x, y), s in improvements.items()
    ]
    return csv_text(header, rows)

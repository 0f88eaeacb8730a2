r"""Statistics of a metric over the runs (seeds) of each method, for the report.

Inputs are plain Python: for each method, its runs as ``{seed: value}`` (``None`` or NaN: the
metric is absent in that run, e.g. ``null`` in its ``results.json``; such runs are left out and
counted in ``n_absent``). Outputs are frozen dataclasses of floats, and markdown / CSV strings
(nothing is escaped: the report escapes method names).

Over the ``n`` values ``x_1..x_n`` of a method:

* ``mean = 1/n sum_i x_i``; ``std`` the sample standard deviation (``ddof=1``);
* Student-t interval ``mean -/+ t_{(1+c)/2, n-1} std / sqrt(n)`` at confidence ``c`` (0.95 by
  default), ``t`` from :func:`scipy.stats.t.ppf` (``scipy`` comes with the ``plot`` and
  ``experiments`` extras and is imported only here, when an interval is computed);
* percentile bootstrap interval: ``resamples`` (10000 by default) resamples of the ``n`` values
  with replacement, drawn as ``numpy.random.default_rng(seed).integers(0, n, (resamples, n))``
  over the values sorted ascending (so the interval does not depend on their order), and the
  ``(1-c)/2`` and ``(1+c)/2`` quantiles of the resample means (``numpy.quantile``, linear
  interpolation). Reproducible: the same values, ``seed`` and ``resamples`` give the same
  interval.

With ``n == 1`` there is no spread: ``std`` and both intervals are ``None``; with ``n == 0`` the
mean is ``None`` too.

Paired differences between methods A and B use the seeds both have (matched by seed value):
``d_s = A_s - B_s``, summarised as above (the bootstrap resamples seeds, keeping pairs), with the
number of seeds where A is better (higher if ``higher_is_better``, else lower), worse, or tied
(exactly equal).
"""

from __future__ import annotations

import csv
import importlib
import io
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_RESAMPLES",
    "Interval",
    "PairedDifference",
    "SeedSummary",
    "bootstrap_interval",
    "paired_csv",
    "paired_difference",
    "paired_markdown",
    "pairwise_differences",
    "summarize",
    "summarize_runs",
    "summary_csv",
    "summary_markdown",
    "t_interval",
    "t_quantile",
]

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 10_000
#: rows drawn at once by the bootstrap (bounds its memory; the draws do not depend on it)
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
    """runs whose value was ``None`` or NaN (left out)"""
    confidence: float
    resamples: int
    bootstrap_seed: int


@dataclass(frozen=True)
class PairedDifference:
    """Method A minus method B over the seeds both have a value for."""

    summary: SeedSummary
    """statistics of ``d_s = A_s - B_s`` over the shared seeds (``summary.n == n_shared``)"""
    seeds: tuple[int, ...]
    """the shared seeds, ascending"""
    a_better: int
    """shared seeds where A is better (higher if ``higher_is_better``, else lower)"""
    b_better: int
    """shared seeds where B is better"""
    ties: int
    """shared seeds where the values are equal"""
    only_a: tuple[int, ...]
    """seeds with a value for A only"""
    only_b: tuple[int, ...]
    """seeds with a value for B only"""
    higher_is_better: bool

    @property
    def n_shared(self) -> int:
        return len(self.seeds)

    @property
    def mean_difference(self) -> float | None:
        """mean of ``A - B`` over the shared seeds; ``None`` when none is shared"""
        return self.summary.mean


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


def _is_absent(value: float | None) -> bool:
    return value is None or math.isnan(value)


def _values(values: Iterable[float | None]) -> tuple[list[float], int]:
    """``(present values as floats, count of absent ones)``; an infinite value is refused."""
    present: list[float] = []
    absent = 0
    for value in values:
        if value is None or math.isnan(value):
            absent += 1
            continue
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"a run's value is {number!r}; values must be finite (or None)")
        present.append(number)
    return present, absent


def t_quantile(probability: float, df: int) -> float:
    """``t_{probability, df}``, the Student-t quantile (``scipy.stats.t.ppf``)."""
    try:
        stats = importlib.import_module("scipy.stats")  # lazily: an extra, and untyped
    except ImportError as err:  # pragma: no cover - scipy comes with the plot/experiments extras
        raise ImportError(
            "the Student-t interval needs scipy: pip install 'continual-eval[plot]'"
        ) from err
    return float(stats.t.ppf(probability, df))


def t_interval(values: Iterable[float], confidence: float = DEFAULT_CONFIDENCE) -> Interval | None:
    r"""``mean -/+ t_{(1+c)/2, n-1} s / sqrt(n)`` (``s``: sample std, ``ddof=1``); ``None`` for
    ``n < 2``.

    >>> ci = t_interval([1.0, 2.0, 3.0])  # 2 -/+ 4.3027 * 1 / sqrt(3)
    >>> round(ci.low, 4), round(ci.high, 4)
    (-0.4841, 4.4841)
    """
    _check_options(confidence, 1, 0)
    x = np.asarray(list(values), dtype=np.float64)
    n = x.size
    if n < 2:
        return None
    mean = float(np.mean(x))
    half = t_quantile((1 + confidence) / 2, n - 1) * float(np.std(x, ddof=1)) / math.sqrt(n)
    return Interval(mean - half, mean + half)


def bootstrap_interval(
    values: Iterable[float],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Interval | None:
    r"""Percentile bootstrap interval of the mean: the ``(1-c)/2`` and ``(1+c)/2`` quantiles of
    the means of ``resamples`` resamples with replacement of the sorted values, drawn by
    ``numpy.random.default_rng(seed).integers(0, n, (resamples, n))``; ``None`` for ``n < 2``."""
    _check_options(confidence, resamples, seed)
    x = np.sort(np.asarray(list(values), dtype=np.float64))
    n = x.size
    if n < 2:
        return None
    rng = np.random.default_rng(int(seed))
    means = np.empty(int(resamples), dtype=np.float64)
    rows = max(1, _CHUNK_CELLS // n)
    for begin in range(0, int(resamples), rows):
        count = min(rows, int(resamples) - begin)
        means[begin : begin + count] = x[rng.integers(0, n, size=(count, n))].mean(axis=1)
    alpha = 1 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return Interval(float(low), float(high))


def summarize(
    values: Iterable[float | None],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> SeedSummary:
    """Mean, sample std, t and bootstrap intervals of one method's values (``None`` / NaN left
    out and counted in ``n_absent``).

    >>> s = summarize([0.5, None, 0.7], resamples=1000)
    >>> s.n, s.n_absent, round(s.mean, 6), round(s.std, 6)
    (2, 1, 0.6, 0.141421)
    >>> summarize([0.5]).t_interval is None
    True
    """
    _check_options(confidence, resamples, seed)
    present, absent = _values(values)
    n = len(present)
    mean = float(np.mean(present)) if n else None
    spread = n >= 2
    return SeedSummary(
        n=n,
        mean=mean,
        std=float(np.std(present, ddof=1)) if spread else None,
        t_interval=t_interval(present, confidence) if spread else None,
        bootstrap_interval=(
            bootstrap_interval(present, confidence=confidence, resamples=resamples, seed=seed)
            if spread
            else None
        ),
        n_absent=absent,
        confidence=float(confidence),
        resamples=int(resamples),
        bootstrap_seed=int(seed),
    )


def summarize_runs(
    runs: Mapping[str, Mapping[int, float | None]],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, SeedSummary]:
    """:func:`summarize` of each method's ``{seed: value}`` runs, in the mapping's order."""
    return {
        method: summarize(
            [by_seed[s] for s in sorted(by_seed)],
            confidence=confidence,
            resamples=resamples,
            seed=seed,
        )
        for method, by_seed in runs.items()
    }


def paired_difference(
    a: Mapping[int, float | None],
    b: Mapping[int, float | None],
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
    have_a = {s for s, v in a.items() if not _is_absent(v)}
    have_b = {s for s, v in b.items() if not _is_absent(v)}
    shared = sorted(have_a & have_b)
    left, _ = _values(a[s] for s in shared)
    right, _ = _values(b[s] for s in shared)
    x, y = np.asarray(left, dtype=np.float64), np.asarray(right, dtype=np.float64)
    better, worse = (x > y, x < y) if higher_is_better else (x < y, x > y)
    return PairedDifference(
        summary=summarize((x - y).tolist(), confidence=confidence, resamples=resamples, seed=seed),
        seeds=tuple(shared),
        a_better=int(better.sum()),
        b_better=int(worse.sum()),
        ties=int((x == y).sum()),
        only_a=tuple(sorted(have_a - have_b)),
        only_b=tuple(sorted(have_b - have_a)),
        higher_is_better=higher_is_better,
    )


def pairwise_differences(
    runs: Mapping[str, Mapping[int, float | None]],
    *,
    higher_is_better: bool = True,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[tuple[str, str], PairedDifference]:
    """:func:`paired_difference` of every pair ``(A, B)`` of methods, A before B in the mapping's
    order."""
    methods = list(runs)
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


# ---------------------------------------------------------------------------- rendering
_MISSING = "—"


def _number(value: float | None, digits: int) -> str:
    return _MISSING if value is None else f"{value:.{digits}f}"


def _interval(interval: Interval | None, digits: int) -> str:
    if interval is None:
        return _MISSING
    return f"[{interval.low:.{digits}f}, {interval.high:.{digits}f}]"


def _cell(value: float | None) -> str:
    return "" if value is None else repr(value)


def _percent(confidence: float) -> str:
    return f"{100 * confidence:g}%"


def _csv(header: list[str], rows: Iterable[list[object]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def summary_markdown(summaries: Mapping[str, SeedSummary], *, digits: int = 4) -> str:
    """A markdown table: method, n, mean, std, t and bootstrap intervals (``—``: none); the
    confidence in the header is the first summary's. Method names are not escaped.

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
            f"| {method} | {s.n}{absent} | {_number(s.mean, digits)} | {_number(s.std, digits)} "
            f"| {_interval(s.t_interval, digits)} | {_interval(s.bootstrap_interval, digits)} |"
        )
    return "\n".join(lines)


def _estimate_cells(s: SeedSummary) -> list[object]:
    """The CSV cells ``mean, std, t_low, t_high, bootstrap_low, bootstrap_high`` of ``s``."""
    t, boot = s.t_interval, s.bootstrap_interval
    return [
        _cell(s.mean),
        _cell(s.std),
        _cell(t.low if t else None),
        _cell(t.high if t else None),
        _cell(boot.low if boot else None),
        _cell(boot.high if boot else None),
    ]


def _bootstrap_settings(s: SeedSummary) -> list[object]:
    """The CSV cells ``confidence, resamples, bootstrap_seed`` of ``s``."""
    return [repr(s.confidence), s.resamples, s.bootstrap_seed]


def summary_csv(summaries: Mapping[str, SeedSummary]) -> str:
    """CSV, one row per method, full precision; empty cells where a value is absent."""
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
    rows: list[list[object]] = []
    for method, s in summaries.items():
        rows.append([method, s.n, s.n_absent, *_estimate_cells(s), *_bootstrap_settings(s)])
    return _csv(header, rows)


def paired_markdown(
    differences: Mapping[tuple[str, str], PairedDifference], *, digits: int = 4
) -> str:
    """A markdown table of :func:`pairwise_differences`: ``A - B``, shared seeds, mean
    difference, both intervals, and wins / losses / ties of A. Names are not escaped."""
    first = next(iter(differences.values()), None)
    pct = _percent(first.summary.confidence if first else DEFAULT_CONFIDENCE)
    lines = [
        f"| A - B | shared seeds | mean difference | {pct} CI (t) | {pct} CI (bootstrap) "
        "| A better | B better | ties |",
        "|---|---:|---:|---|---|---:|---:|---:|",
    ]
    for (a, b), d in differences.items():
        lines.append(
            f"| {a} - {b} | {d.n_shared} | {_number(d.mean_difference, digits)} "
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
    rows: list[list[object]] = []
    for (a, b), d in differences.items():
        s = d.summary
        rows.append(
            [
                a,
                b,
                d.n_shared,
                *_estimate_cells(s),
                d.a_better,
                d.b_better,
                d.ties,
                d.higher_is_better,
                *_bootstrap_settings(s),
            ]
        )
    return _csv(header, rows)

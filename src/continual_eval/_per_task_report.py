"""The per-task part of ``continual-eval report --per-task``: per method, a table of each task's
BWT, forgetting, FWT and intransigence of the primary matrix.

The values are the run's own (``matrices.<primary>.per_task`` for BWT ``R[s-1, j] - R[j, j]``
and forgetting, tasks ``j < s - 1``; FWT ``R[j-1, j] - b[j]``, tasks ``j >= 1``; intransigence
``ref[j] - R[j, j]`` against ``metadata["reference"]``, tasks ``j < s``; each in the score's
direction). A method with one run shows its value with ``[low, high]``, the paired-bootstrap
interval over its test items (``intervals.matrices.<primary>.per_task``, the same resamples as
the metrics) where the estimate is the value shown; with two or more runs, mean ± sample std
across them. A value printed without an interval is explained once under its table
(``unavailable``, or what is missing)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from continual_eval.functional import intransigence_per_task

__all__ = [
    "PER_TASK_METRICS",
    "PerTaskTable",
    "per_task_html",
    "per_task_markdown",
    "per_task_tables",
]

PER_TASK_METRICS = {"bwt": "BWT", "forgetting": "Forgetting", "fwt": "FWT",
                    "intransigence": "Intransigence"}  # fmt: skip
"""The per-task columns (key -> title), in order."""
#: where task ``j``'s value sits in each stored per-task vector (FWT starts at task 1)
_OFFSET = {"bwt": 0, "forgetting": 0, "fwt": 1, "intransigence": 0}


@dataclass(frozen=True)
class PerTaskTable:
    """One method's per-task table: ``cells[j][key]`` is ``(stats, single)`` (a
    ``SeedSummary`` over its runs and the one-run interval or ``None``), ``None`` where the
    value is undefined for task ``j`` in every run; ``missing``: plain-text lines, why values
    of one run are printed without an interval."""

    method: str
    runs: int
    task_names: tuple[str, ...]
    cells: list[dict[str, tuple[Any, tuple[float, float] | None] | None]]
    missing: list[str]


def _run_values(results: Any) -> dict[str, list[float]]:
    """Per key, ``T`` values of one run (NaN: undefined for that task or absent)."""
    T = results.num_tasks
    primary = results.primary
    out: dict[str, list[float]] = {}
    for key in PER_TASK_METRICS:
        row = [math.nan] * T
        if key == "intransigence":
            s, reference = primary.num_stages, results.reference
            stored = None
            if reference is not None and s:
                stored = intransigence_per_task(
                    primary.scores[:, :s],
                    reference[:s],
                    higher_is_better=primary.higher_is_better,
                    validate=False,
                )
        else:
            stored = primary.per_task.get(key)
        if stored is not None:
            for k, v in enumerate(stored.tolist()):
                if k + _OFFSET[key] < T:
                    row[k + _OFFSET[key]] = float(v)
        out[key] = row
    return out


def _run_intervals(results: Any, values: dict[str, list[float]]) -> dict[str, list[Any]]:
    """Per key, ``T`` one-run intervals ``(low, high)`` from ``intervals.matrices.<primary>
    .per_task`` whose estimate is the value shown (``None`` elsewhere)."""
    T = results.num_tasks
    section = results.intervals
    held = None if section is None else section.matrices.get(results.primary_name)
    out: dict[str, list[Any]] = {key: [None] * T for key in PER_TASK_METRICS}
    if held is None:
        return out
    for key, (estimate, low, high) in held.per_task.items():
        if key not in out:
            continue
        triples = zip(estimate.tolist(), low.tolist(), high.tolist(), strict=True)
        for k, (e, lo, hi) in enumerate(triples):
            j = k + _OFFSET[key]
            if j >= T or not all(math.isfinite(v) for v in (e, lo, hi, values[key][j])):
                continue
            if math.isclose(e, values[key][j], rel_tol=1e-6, abs_tol=1e-9):
                out[key][j] = (lo, hi)
    return out


def _reason(results: Any, key: str, reason: Callable[[Any, str], str]) -> str:
    """Why one run's per-task ``key`` has no interval: the matrix's ``unavailable`` entry for
    it, else ``reason(results, key)`` (the report's reasons for the metric)."""
    section = results.intervals
    held = None if section is None else section.matrices.get(results.primary_name)
    if (
        held is not None
        and key not in held.unavailable
        and held.metrics.get(key) is not None
        and key not in held.per_task
    ):
        return "the intervals section holds no per-task interval of it"
    return reason(results, key)


def per_task_tables(
    summaries: Sequence[Any],
    summarize: Callable[[list[float | None]], Any],
    reason: Callable[[Any, str], str],
) -> list[PerTaskTable]:
    """One table per method of ``summaries`` (``continual_eval.report.MethodSummary``): each
    task's values over its runs through ``summarize`` (a list with ``None`` for absent -> a
    ``SeedSummary``), the one-run intervals for a method whose value comes from one run;
    ``reason(results, key)``: why one run's metric ``key`` has no interval."""
    tables = []
    for s in summaries:
        runs = [r for r in s.runs if r.results.num_tasks > 0]
        if not runs:
            continue
        T = max(r.results.num_tasks for r in runs)
        values = [_run_values(r.results) for r in runs]
        spans = [_run_intervals(r.results, v) for r, v in zip(runs, values, strict=True)]
        cells: list[dict[str, Any]] = []
        missing: dict[tuple[str, str], list[str]] = {}
        for j in range(T):
            row: dict[str, Any] = {}
            for key, title in PER_TASK_METRICS.items():
                got = [v[key][j] if j < len(v[key]) else math.nan for v in values]
                present = [k for k, v in enumerate(got) if math.isfinite(v)]
                if not present:
                    row[key] = None
                    continue
                stats = summarize([v if math.isfinite(v) else None for v in got])
                single = None
                if len(present) == 1:
                    k = present[0]
                    single = spans[k][key][j] if j < len(spans[k][key]) else None
                    if single is None:
                        why = _reason(runs[k].results, key, reason)
                        missing.setdefault((title, why), []).append(str(j))
                row[key] = (stats, single)
            cells.append(row)
        names = tuple(str(n) for n in runs[0].results.task_names[:T])
        names += tuple(f"task {j}" for j in range(len(names), T))
        by_reason: dict[str, list[str]] = {}  # one line per reason
        for (title, why), tasks in missing.items():
            shown = ", ".join(names[int(j)] for j in tasks)
            by_reason.setdefault(why, []).append(f"{title} (tasks {shown})")
        notes = [f"{', '.join(what)}: no interval: {why}" for why, what in by_reason.items()]
        tables.append(PerTaskTable(s.method, len(s.runs), names, cells, notes))
    return tables


def per_task_markdown(
    tables: Sequence[PerTaskTable],
    cell: Callable[[Any, int, tuple[float, float] | None], str],
    escape: Callable[[str], str],
    pct: str,
) -> list[str]:
    """``report.md`` lines: the section, one table per method (``cell(stats, runs, single)``
    writes a value), the reasons under each."""
    if not tables:
        return []
    lines = [
        "## Per-task metrics",
        "",
        "Per task of each method's primary matrix: BWT `R[s-1, j] - R[j, j]` and forgetting "
        "(tasks before the last), FWT `R[j-1, j] - b[j]` (tasks after the first), "
        "intransigence `ref[j] - R[j, j]` (with a reference); each signed as the metric. One "
        f"run: the value and `[low, high]`, its {pct} paired-bootstrap interval over its test "
        "items (the same resamples as the metrics; `intervals.matrices.<m>.per_task`); two or "
        "more runs: mean ± sample std across them. — : undefined for that task.",
        "",
    ]
    for table in tables:
        header = ["task", *PER_TASK_METRICS.values()]
        lines += [
            f"**{escape(table.method)}** ({table.runs} run(s))",
            "",
            "| " + " | ".join(header) + " |",
            "|---|" + "---:|" * len(PER_TASK_METRICS),
        ]
        for name, row in zip(table.task_names, table.cells, strict=True):
            shown = [
                "—" if row[key] is None else cell(row[key][0], table.runs, row[key][1])
                for key in PER_TASK_METRICS
            ]
            lines.append("| " + " | ".join([escape(name), *shown]) + " |")
        lines.append("")
        lines += [*(f"- {escape(n)}" for n in table.missing), *([""] if table.missing else [])]
    return lines


def per_task_html(
    tables: Sequence[PerTaskTable],
    cell: Callable[[Any, int, tuple[float, float] | None], str],
    text: Callable[..., str],
    table_html: Callable[[Sequence[str], Sequence[Sequence[str]]], str],
    pct: str,
) -> list[str]:
    """``report.html``'s section of the same tables (``cell``: HTML; ``text``: escapes)."""
    if not tables:
        return []
    body = [
        "<h2>Per-task metrics</h2>",
        "<p>Per task of each method's primary matrix: BWT, forgetting (tasks before the last), "
        "FWT (tasks after the first), intransigence (with a reference). One run: the value and "
        f"[low, high], its {pct} paired-bootstrap interval over its test items; two or more "
        "runs: mean ± sample std. —: undefined for that task.</p>",
    ]
    for table in tables:
        rows = [
            [
                text(name, 60),
                *(
                    "—" if row[key] is None else cell(row[key][0], table.runs, row[key][1])
                    for key in PER_TASK_METRICS
                ),
            ]
            for name, row in zip(table.task_names, table.cells, strict=True)
        ]
        body.append(f"<h3>{text(table.method)} ({table.runs} run(s))</h3>")
        body.append(table_html(["task", *PER_TASK_METRICS.values()], rows))
        if table.missing:
            items = "".join(f"<li>{text(n, 800)}</li>" for n in table.missing)
            body.append(f'<ul class="note">{items}</ul>')
    return body

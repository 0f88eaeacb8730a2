"""The class-incremental part of ``continual-eval report``: for runs with a ``class_incremental``
section, a table of the final class-incremental measures per method (mean ± sample std over its
runs) and, per run, the ``acc_task_aware`` and ``acc_task_agnostic`` heatmaps side by side and
the final confusion matrix in arrival order."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from continual_eval.evaluation.class_incremental import AGNOSTIC_NAME, AWARE_NAME
from continual_eval.results import ClassIncrementalResults
from continual_eval.results.schema import printable

__all__ = [
    "CLASS_IL_COLUMNS",
    "ClassIncrementalSummary",
    "ClassIncrementalTables",
    "class_incremental_run_lines",
    "class_incremental_summary",
    "class_incremental_summary_lines",
    "class_incremental_tables",
    "final_intervals",
]


def _last(values: Any) -> float:
    return float(values[-1]) if len(values) else math.nan


CLASS_IL_COLUMNS: dict[str, Callable[[ClassIncrementalResults], float]] = {
    "last acc (sample)": lambda r: r.last_accuracy["sample"],
    "last acc (task)": lambda r: r.last_accuracy["task"],
    "avg inc acc (sample)": lambda r: r.average_incremental_accuracy["sample"],
    "avg inc acc (task)": lambda r: r.average_incremental_accuracy["task"],
    "old acc (final)": lambda r: _last(r.old_accuracy["sample"]),
    "new acc (final)": lambda r: _last(r.new_accuracy),
    "AMCA": lambda r: r.amca,
    "class forgetting": lambda r: r.mean_class_forgetting,
    "newest-task prediction share": lambda r: _last(r.recency_prediction_share),
    "newest-task sample share": lambda r: _last(r.recency_sample_share),
}
"""The final class-incremental measures tabulated per method: column title -> value of a
section."""


def _mean_std(values: Sequence[float], ends: tuple[float, float] | None = None) -> str:
    """Mean ± sample std of the finite values; one value alone, followed by ``ends`` (its
    one-run interval) as ``[low, high]``; ``(n=k)`` where only ``k`` are finite."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "n/a"
    mean = math.fsum(finite) / len(finite)
    text = f"{mean:.4f}" if len(finite) < 2 else f"{mean:.4f} ± {statistics.stdev(finite):.4f}"
    if len(finite) == 1 and ends is not None and all(math.isfinite(e) for e in ends):
        text += f" [{ends[0] + 0.0:.4f}, {ends[1] + 0.0:.4f}]"
    return text if len(finite) == len(values) else f"{text} (n={len(finite)})"


#: the one-run interval behind a final measure: ``(matrix, metric)`` of the ``intervals``
#: section's matrix metrics (the paired bootstrap; used only where its estimate is the value
#: shown), ``("class_incremental", field)``, the Wilson interval of the last stage, or
#: ``("paired", metric)``, the paired bootstrap over the items and their classes
#: (``intervals.class_incremental.paired.metrics``)
_INTERVAL_OF: dict[str, tuple[str, str]] = {
    "task-aware acc": (AWARE_NAME, "acc"),
    "task-agnostic acc": (AGNOSTIC_NAME, "acc"),
    "last acc (sample)": ("class_incremental", "seen_accuracy"),
    "last acc (task)": (AGNOSTIC_NAME, "acc"),
    "avg inc acc (task)": (AGNOSTIC_NAME, "average_incremental_accuracy"),
    "old acc (final)": ("class_incremental", "old_accuracy"),
    "new acc (final)": ("class_incremental", "new_accuracy"),
    "avg inc acc (sample)": ("paired", "average_incremental_accuracy_sample"),
    "AMCA": ("paired", "amca"),
    "class forgetting": ("paired", "mean_class_forgetting"),
    "newest-task prediction share": ("class_incremental", "recency_prediction_share"),
}
#: the ``intervals.class_incremental.unavailable`` entry that says why a final measure has
#: no one-run interval
_UNAVAILABLE_KEY = {
    "last acc (task)": "seen_accuracy_task",
    "avg inc acc (sample)": "average_incremental_accuracy",
    "avg inc acc (task)": "average_incremental_accuracy",
    "AMCA": "amca",
    "class forgetting": "class_forgetting",
    "newest-task prediction share": "recency_bias",
    "newest-task sample share": "recency_bias",
}


def _final_values(results: Any) -> dict[str, float]:
    """Every final measure of a run (title -> value, NaN: undefined)."""
    aware, agnostic = _aware_agnostic_means(results)
    section = results.class_incremental
    return {
        "task-aware acc": aware,
        "task-agnostic acc": agnostic,
        **{title: float(f(section)) for title, f in CLASS_IL_COLUMNS.items()},
    }


def final_intervals(results: Any) -> tuple[dict[str, tuple[float, float]], dict[str, str]]:
    """A run's one-run intervals of its final measures (title -> ``(low, high)``) and, for the
    measures with a value but none, why (title -> the ``unavailable`` reason, or what is
    missing)."""
    values = _final_values(results)
    intervals = getattr(results, "intervals", None)
    ends: dict[str, tuple[float, float]] = {}
    missing: dict[str, str] = {}
    for title, value in values.items():
        if not math.isfinite(value):
            continue
        found = None if intervals is None else _interval_of(intervals, title, value)
        if found is not None:
            ends[title] = found
        else:
            missing[title] = _why(results, title)
    return ends, missing


def _interval_of(intervals: Any, title: str, value: float) -> tuple[float, float] | None:
    source = _INTERVAL_OF.get(title)
    if source is None:
        return None
    where, key = source
    if where == "class_incremental":
        section = intervals.class_incremental
        part = None if section is None else getattr(section, key)
        if part is None or not len(part[0]):
            return None
        estimate, low, high = (float(t[-1]) for t in part)
    elif where == "paired":
        section = intervals.class_incremental
        paired = None if section is None else section.paired
        if paired is None or key not in paired.metrics:
            return None
        estimate, low, high = paired.metrics[key]
    else:
        held = intervals.matrices.get(where)
        found = None if held is None else held.metrics.get(key)
        if found is None:
            return None
        estimate, low, high = found
    if not all(math.isfinite(v) for v in (estimate, low, high)):
        return None
    if not math.isclose(estimate, value, rel_tol=1e-6, abs_tol=1e-9):
        return None
    return low, high


#: a final measure that is no estimate from the model's predictions, and why it has no interval
_EXACT = {
    "newest-task sample share": (
        "the newest task's share of the seen test samples: fixed by the test set, not estimated "
        "from the model's predictions"
    )
}


def _why(results: Any, title: str) -> str:
    """Why a final measure of one run has no interval: the ``unavailable`` reason (an entry
    ``"as <key>"`` followed to ``<key>``'s), else what is missing."""
    if title in _EXACT:
        return _EXACT[title]
    intervals = getattr(results, "intervals", None)
    if intervals is None:
        return "the run has no per-item records (item_records= not set)"
    section = intervals.class_incremental
    key = _UNAVAILABLE_KEY.get(title)
    if section is not None and key is not None and key in section.unavailable:
        why = section.unavailable[key]
        seen = {key}
        while why.startswith("as ") and why[3:] in section.unavailable and why[3:] not in seen:
            seen.add(why[3:])
            why = f"{section.unavailable[why[3:]]} (as for {why[3:]})"
        return printable(why, 600)
    if section is None and _INTERVAL_OF.get(title, ("",))[0] == "class_incremental":
        return "the intervals section has no class_incremental part"
    return "the intervals section holds no interval whose estimate is this value"


@dataclass(frozen=True)
class ClassIncrementalTables:
    """One run's class-incremental tables, each ``(title, header, rows)`` with every row's
    first cell plain text (escaped by the caller) and the rest written by the caller's
    ``cell``; ``note``: what the intervals are (plain text, ``None`` without any);
    ``missing``: why numbers printed have none (plain text)."""

    tables: list[tuple[str, list[str], list[list[str]]]]
    note: str | None
    missing: list[str]


def class_incremental_tables(
    results: Any, cell: Callable[[float, tuple[float, float] | None], str]
) -> ClassIncrementalTables | None:
    """The final measures, the seen / old / new accuracy per stage and each class's accuracy
    after the last stage of a run's ``class_incremental`` section, each value written by
    ``cell(value, (low, high) or None)`` with its Wilson interval
    (``intervals.class_incremental``) or the paired-bootstrap one of its matrix metric;
    ``None`` without the section."""
    section = getattr(results, "class_incremental", None)
    if section is None or section.num_stages == 0:
        return None
    intervals = getattr(results, "intervals", None)
    wilson = None if intervals is None else intervals.class_incremental
    values = _final_values(results)
    ends, missing = final_intervals(results)
    final = [[title, cell(v, ends.get(title))] for title, v in values.items() if math.isfinite(v)]
    names = list(results.task_names)

    def triple(key: str, i: int) -> tuple[float, float] | None:
        if wilson is None:
            return None
        _, low, high = getattr(wilson, key)
        return float(low[i]), float(high[i])

    stages = [
        [
            f"after {names[i]}" if i < len(names) else f"stage {i}",
            cell(float(section.seen_accuracy["sample"][i]), triple("seen_accuracy", i)),
            cell(float(section.old_accuracy["sample"][i]), triple("old_accuracy", i)),
            cell(float(section.new_accuracy[i]), triple("new_accuracy", i)),
        ]
        for i in range(section.num_stages)
    ]
    task_of = {c: t for t, classes in enumerate(section.task_classes) for c in classes}
    per_class = []
    last = section.num_stages - 1
    for c in section.class_order:
        value = float(section.per_class_accuracy[last, c])
        if not math.isfinite(value):
            continue
        span = None
        if wilson is not None:
            _, low, high = wilson.per_class_accuracy
            span = (float(low[last, c]), float(high[last, c]))
        task = names[task_of[c]] if task_of[c] < len(names) else str(task_of[c])
        per_class.append(
            [f"{c} ({printable(task, 60)})", str(int(section.test_samples[c])), cell(value, span)]
        )
    tables = [
        ("Final measures", ["measure", "value"], final),
        (
            "Seen / old / new accuracy per stage (sample-weighted)",
            ["evaluation", "seen classes", "old classes", "new classes"],
            stages,
        ),
        (
            f"Per-class accuracy after stage {last} (arrival order)",
            ["class (task)", "test samples", "accuracy"],
            per_class,
        ),
    ]
    note = None
    if wilson is not None and intervals is not None:
        note = (
            f"Each [low, high]: {100 * intervals.confidence:g}% interval from the test items: "
            "Wilson for the per-class, seen, old and new accuracies (each a proportion of the "
            "class's or pool's test samples predicted right); the paired bootstrap of the "
            "acc_task_aware / acc_task_agnostic matrix metrics where a final measure is one of "
            "them. The error of the finite test set, not the variation between runs."
        )
    notes = [f"{title}: no interval: {why}" for title, why in missing.items()]
    if wilson is None:
        notes.append(
            "per-stage and per-class accuracies: no interval: "
            + (
                "the run has no per-item records (item_records= not set)"
                if intervals is None
                else "the intervals section has no class_incremental part"
            )
        )
    return ClassIncrementalTables(tables, note, notes)


def _aware_agnostic_means(results: Any) -> tuple[float, float]:
    """The final row's mean over the seen tasks of the two matrices (the task-weighted
    accuracies)."""
    out = []
    for name in (AWARE_NAME, AGNOSTIC_NAME):
        matrix = results.matrices.get(name)
        if matrix is None or matrix.num_stages == 0:
            out.append(math.nan)
            continue
        s = matrix.num_stages
        row = [v for v in matrix.scores[s - 1, :s].tolist() if math.isfinite(v)]
        out.append(math.fsum(row) / len(row) if row else math.nan)
    return out[0], out[1]


#: what ``[low, high]`` means in the across-methods class-incremental table
SUMMARY_NOTE = (
    "[low, high] after the value of a method with one run: its interval from its test items "
    "(Wilson for last / old / new accuracy; the paired bootstrap of the acc_task_aware / "
    "acc_task_agnostic matrix metrics for the task-weighted accuracies), not the variation "
    "between seeds."
)


@dataclass(frozen=True)
class ClassIncrementalSummary:
    """The across-methods table: ``titles`` (the columns after method and runs), ``rows`` of
    ``(method, runs, cells)`` (cells written by the caller's ``cell``), ``single``: whether a
    method has one run, ``missing``: ``(title, reason, methods)`` of the one-run values without
    an interval (plain text)."""

    titles: list[str]
    rows: list[tuple[str, int, list[str]]]
    single: bool
    missing: list[tuple[str, str, list[str]]]


def class_incremental_summary(
    summaries: Sequence[Any],
    cell: Callable[[Sequence[float], tuple[float, float] | None], str],
) -> ClassIncrementalSummary | None:
    """Per method (``summaries`` of
    [`continual_eval.report.summarise`][continual_eval.report.summarise]) over its runs with a
    ``class_incremental`` section, the final task-aware and task-agnostic accuracy and
    ``CLASS_IL_COLUMNS``, each written by ``cell(values, interval)`` (the one-run interval of a
    method with one run, else ``None``); ``None`` when no run has the section."""
    groups = []
    for summary in summaries:
        sections = [
            run.results
            for run in summary.runs
            if getattr(run.results, "class_incremental", None) is not None
        ]
        if sections:
            groups.append((summary.method, sections))
    if not groups:
        return None
    titles = ["task-aware acc", "task-agnostic acc", *CLASS_IL_COLUMNS]
    rows = []
    reasons: dict[tuple[str, str], list[str]] = {}
    for method, runs in groups:
        values = [_final_values(results) for results in runs]
        one = final_intervals(runs[0]) if len(runs) == 1 else ({}, {})
        rows.append(
            (method, len(runs), [cell([v[t] for v in values], one[0].get(t)) for t in titles])
        )
        for title, why in one[1].items():
            reasons.setdefault((title, why), []).append(method)
    missing = [(title, why, methods) for (title, why), methods in reasons.items()]
    return ClassIncrementalSummary(titles, rows, any(len(r) == 1 for _, r in groups), missing)


def class_incremental_summary_lines(
    summaries: Sequence[Any], escape: Callable[[str], str]
) -> list[str]:
    """Markdown lines of `class_incremental_summary` (mean ± sample std over each method's runs;
    one run: its value and interval), with the note and the reasons under the table; nothing
    when no run has a ``class_incremental`` section."""
    found = class_incremental_summary(summaries, _mean_std)
    if found is None:
        return []
    lines = [
        "## Class-incremental evaluation",
        "",
        "Final values, mean ± sample std over each method's runs with a `class_incremental` "
        "section. Task-aware / task-agnostic acc: the mean over the seen tasks of the last row "
        "of `acc_task_aware` (argmax over the task's own classes) and `acc_task_agnostic` "
        "(argmax over every class seen so far). Last / average incremental accuracy on the seen "
        "classes: `sample` pools every seen test sample, `task` averages the tasks. Old acc: "
        "classes of the earlier tasks, sample-weighted; new acc: the last task's classes. Class "
        "forgetting: per class, best minus final accuracy, averaged. Prediction share: the share "
        "of the seen test samples predicted as a class of the newest task, next to that task's "
        "share of the samples (equal for an unbiased classifier).",
        "",
        "| method | runs | " + " | ".join(found.titles) + " |",
        "|---|---:|" + "---:|" * len(found.titles),
    ]
    for method, runs, cells in found.rows:
        lines.append(f"| {escape(method)} | {runs} | " + " | ".join(cells) + " |")
    lines.append("")
    if found.single:
        lines += [SUMMARY_NOTE, ""]
    if found.missing:
        lines += ["Values of one run printed without an interval, and why:", ""]
        lines += [
            f"- {escape(title)} ({', '.join(escape(m) for m in methods)}): {escape(why)}"
            for title, why, methods in found.missing
        ]
        lines.append("")
    return lines


def class_incremental_run_lines(run: Any, out_dir: Path, plain: Callable[[str], str]) -> list[str]:
    """Markdown lines for one run (a [`continual_eval.report.Run`][continual_eval.report.Run]) with
    a ``class_incremental`` section: the two heatmaps side by side and the final confusion matrix
    (PNGs written into ``out_dir``); nothing without the section. ``plain`` makes a name safe for a
    matplotlib label."""
    section = getattr(run.results, "class_incremental", None)
    if section is None or section.num_stages == 0:
        return []
    from continual_eval.plotting import _pyplot, plot_accuracy_matrix

    plt = _pyplot()
    names = [plain(name) for name in run.results.task_names]
    lines: list[str] = []
    matrices = [run.results.matrices.get(name) for name in (AWARE_NAME, AGNOSTIC_NAME)]
    if all(m is not None for m in matrices):
        width = min(max(3.5, 0.6 * len(names) + 2.0) + 1.2, 16.0)
        fig, axes = plt.subplots(1, 2, figsize=(2 * width, width * 0.75), layout="constrained")
        for ax, matrix, label in zip(
            axes, matrices, ("task-aware (task-IL)", "task-agnostic (class-IL)"), strict=True
        ):
            plot_accuracy_matrix(
                matrix.scores, matrix.baseline, ax=ax, task_names=names, title=label
            )
        pair = out_dir / f"{run.label}_aware_vs_agnostic.png"
        fig.savefig(pair, dpi=110)
        plt.close(fig)
        lines.append(f"![task-aware vs task-agnostic]({pair.name})")
    fig = section.confusion_figure(
        -1, title=f"task-agnostic confusion after stage {section.num_stages - 1}"
    )
    confusion = out_dir / f"{run.label}_confusion.png"
    fig.savefig(confusion, dpi=110)
    plt.close(fig)
    lines.append(f"![confusion matrix, arrival order]({confusion.name})")
    from continual_eval._markdown import escape_markdown

    out = ["### Class-incremental evaluation", ""]
    found = class_incremental_tables(run.results, _cell)
    assert found is not None
    for title, header, rows in found.tables:
        out += [
            f"**{escape_markdown(title)}**",
            "",
            "| " + " | ".join(header) + " |",
            "| --- |" + " ---: |" * (len(header) - 1),
            *("| " + " | ".join([escape_markdown(r[0]), *r[1:]]) + " |" for r in rows),
            "",
        ]
    if found.note:  # the report's own words (no name from the file)
        out += [found.note, ""]
    if found.missing:
        out += [*(f"- {escape_markdown(m)}" for m in found.missing), ""]
    return [*out, " ".join(lines), ""]


def _cell(value: float, ends: tuple[float, float] | None) -> str:
    """``value`` (4 decimals, ``n/a`` when not finite) and ``[low, high]`` when both ends are
    finite."""
    if not math.isfinite(value):
        return "n/a"
    text = f"{value + 0.0:.4f}"
    if ends is not None and all(math.isfinite(e) for e in ends):
        text += f" [{ends[0] + 0.0:.4f}, {ends[1] + 0.0:.4f}]"
    return text

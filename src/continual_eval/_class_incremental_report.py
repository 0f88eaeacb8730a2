"""The class-incremental part of ``continual-eval report``: for runs with a ``class_incremental``
section, a table of the final class-incremental measures per method (mean ± sample std over its
runs) and, per run, the ``acc_task_aware`` and ``acc_task_agnostic`` heatmaps side by side and
the final confusion matrix in arrival order."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from continual_eval.evaluation.class_incremental import AGNOSTIC_NAME, AWARE_NAME
from continual_eval.results import ClassIncrementalResults

__all__ = ["CLASS_IL_COLUMNS", "class_incremental_run_lines", "class_incremental_summary_lines"]


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


def _mean_std(values: Sequence[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "n/a"
    mean = math.fsum(finite) / len(finite)
    text = f"{mean:.4f}" if len(finite) < 2 else f"{mean:.4f} ± {statistics.stdev(finite):.4f}"
    return text if len(finite) == len(values) else f"{text} (n={len(finite)})"


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


def class_incremental_summary_lines(
    summaries: Sequence[Any], escape: Callable[[str], str]
) -> list[str]:
    """Markdown lines: per method (``summaries`` of
    [`continual_eval.report.summarise`][continual_eval.report.summarise]), the mean ± sample std
    over its runs of the final task-aware and task-agnostic accuracy and of ``CLASS_IL_COLUMNS``;
    nothing when no run has a ``class_incremental`` section."""
    rows = []
    for summary in summaries:
        sections = [
            (run.results, run.results.class_incremental)
            for run in summary.runs
            if getattr(run.results, "class_incremental", None) is not None
        ]
        if sections:
            rows.append((summary.method, sections))
    if not rows:
        return []
    titles = ["task-aware acc", "task-agnostic acc", *CLASS_IL_COLUMNS]
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
        "| method | runs | " + " | ".join(titles) + " |",
        "|---|---:|" + "---:|" * len(titles),
    ]
    for method, sections in rows:
        pairs = [_aware_agnostic_means(results) for results, _ in sections]
        cells = [_mean_std([a for a, _ in pairs]), _mean_std([b for _, b in pairs])]
        cells += [_mean_std([f(s) for _, s in sections]) for f in CLASS_IL_COLUMNS.values()]
        lines.append(f"| {escape(method)} | {len(sections)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


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
    values = {title: f(section) for title, f in CLASS_IL_COLUMNS.items()}
    shown = ", ".join(f"{k}={v:.4f}" for k, v in values.items() if math.isfinite(v))
    return ["Class-incremental: " + shown, "", " ".join(lines), ""]

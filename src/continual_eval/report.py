"""``continual-eval report RUN_DIR [RUN_DIR ...]``: pictures and tables from the callback's files.

Per run (a directory holding ``results.json``): the accuracy-matrix heatmap and the per-task
accuracy trajectories. Across runs, grouped by method: a bar chart of the metrics (mean over
seeds; error bars = sample standard deviation when a method has two or more runs) and a table of
mean ± spread. Everything goes into ``--out`` as PNGs, ``summary.csv`` and ``report.md``.

Intransigence needs the joint-training reference accuracy of each task; ``continual-eval fit``
stores it as ``results.json["metadata"]["reference"]`` (a list, one value per task). Runs without it
show no intransigence.

The files read may come from anywhere: each is validated
(:func:`continual_eval.results_schema.read_results_json`: size, nesting and name-length limits,
types and shapes of every field) before anything is drawn, and an invalid one stops the command
with exit code 2 and a one-line message naming the file and the field. Names and metadata from
the files are escaped for Markdown and HTML in ``report.md`` and shown as plain text (no
mathtext) in the pictures.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import html
import math
import os
import re
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from continual_eval.functional import intransigence
from continual_eval.results import RESULTS_FILE, results_to_tensors
from continual_eval.results_schema import InvalidResultsError, printable, read_results_json

__all__ = [
    "REPORT_METRICS",
    "MethodSummary",
    "Run",
    "escape_markdown",
    "find_runs",
    "main",
    "run_metrics",
    "summarise",
    "write_report",
]

#: metric key -> column title, in table and chart order
REPORT_METRICS: dict[str, str] = {
    "acc": "ACC",
    "bwt": "BWT",
    "fwt": "FWT",
    "forgetting": "Forgetting",
    "intransigence": "Intransigence",
}
JOINT_REFERENCE_DIR = "joint_reference"
#: longest run label used in a picture's file name (longer ones are cut and given a hash)
MAX_LABEL_LENGTH = 80
_HTML_SPECIAL = frozenset("&<>\"'")
#: escaped everywhere: inline markup (code, emphasis, links and images), GFM tables and
#: strikethrough, math ($), heading closers (#) and URL autolinks (:)
_MARKDOWN_INLINE = frozenset("\\`*_[]|~$#:")
#: a line that starts with one of these, or with digits and one of ".)", is a list item or an
#: underline; escaped at the start of the text
_LINE_START = re.compile(r"[-+=]|\d{1,9}[.)]")
_INVISIBLE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def escape_markdown(text: str) -> str:
    """``text`` as literal Markdown text on one line (CommonMark/GFM): HTML specials as entities
    (``<`` -> ``&lt;``), inline markup characters backslash-escaped (``` ` ``` ``*`` ``_`` ``[``
    ``]`` ``|`` ``~`` ``$`` ``#`` ``:`` ``\\``), a leading list or underline marker escaped,
    and line breaks, control and format characters (bidi overrides, zero-width) written as
    ``\\uXXXX``-style escapes. It renders as the original text, never as markup."""
    out = []
    for ch in text:
        if ch in _HTML_SPECIAL:
            out.append(html.escape(ch, quote=True))
        elif ch in _MARKDOWN_INLINE:
            out.append("\\" + ch)
        elif unicodedata.category(ch) in _INVISIBLE:
            out.append("\\" + ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    escaped = "".join(out)
    marker = _LINE_START.match(escaped)
    if marker is not None:
        end = marker.end() - 1
        escaped = f"{escaped[:end]}\\{escaped[end:]}"
    return escaped


def _code_span(text: str) -> str:
    """``text`` as a Markdown code span (literal, HTML not interpreted) on one line: a fence
    longer than any run of backticks inside, control characters as escapes."""
    shown = printable(text, len(text))
    longest = max((len(run) for run in re.findall(r"`+", shown)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def _plain_for_plot(text: str, limit: int = 40) -> str:
    """``text`` for a matplotlib label: cut to ``limit`` characters (``…`` marks a cut) and every
    ``$`` escaped, so nothing is parsed as mathtext."""
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("$", r"\$")


@dataclass
class Run:
    """One run directory and its ``results.json``."""

    path: Path
    results: dict[str, Any]

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self.results.get("metadata") or {})

    @property
    def experiment(self) -> str:
        return str(self.metadata.get("experiment") or "")

    @property
    def method(self) -> str:
        return str(self.metadata.get("method") or self.path.parent.name or self.path.name)

    @property
    def group(self) -> str:
        """``experiment/method`` (or just the method when no experiment is recorded)."""
        return f"{self.experiment}/{self.method}" if self.experiment else self.method

    @property
    def seed(self) -> Any:
        return self.metadata.get("seed")

    @property
    def complete(self) -> bool:
        return self.results["stages_completed"] == self.results["num_tasks"]

    @property
    def label(self) -> str:
        """File-name-safe label (``[A-Za-z0-9_.-]``, at most :data:`MAX_LABEL_LENGTH`
        characters), unique among runs of one method when their seeds differ."""
        seed = self.seed
        tail = f"seed{seed}" if seed is not None else self.path.name
        label = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self.group}_{tail}")
        if len(label) <= MAX_LABEL_LENGTH:
            return label
        digest = hashlib.sha256(label.encode("utf-8")).hexdigest()[:12]
        return f"{label[: MAX_LABEL_LENGTH - 13]}_{digest}"


@dataclass
class MethodSummary:
    """Mean and spread of each metric over the runs of one method."""

    method: str
    runs: list[Run]
    mean: dict[str, float | None]
    std: dict[str, float | None]  # None with fewer than two values


def find_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Runs in ``paths``: each path is a run directory (or its results.json) or a folder searched
    recursively for ``results.json`` (joint-reference sub-runs excluded). Sorted by path.

    Every file is validated; the first invalid one raises
    :class:`~continual_eval.results_schema.InvalidResultsError`."""
    found: dict[Path, Run] = {}
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            candidates = [path]
        elif (path / RESULTS_FILE).is_file():
            candidates = [path / RESULTS_FILE]
        else:
            candidates = [
                p for p in path.rglob(RESULTS_FILE) if JOINT_REFERENCE_DIR not in p.parent.parts
            ]
            if not candidates:
                raise FileNotFoundError(f"no {RESULTS_FILE} in {path}")
        for file in candidates:
            found[file.parent.resolve()] = Run(file.parent, read_results_json(file))
    return [found[k] for k in sorted(found)]


def run_metrics(results: dict[str, Any]) -> dict[str, float | None]:
    """ACC, BWT, FWT and forgetting as recorded, plus intransigence from
    ``metadata["reference"]``: ``reference[j] - R[j, j]`` averaged over the completed stages
    (``None`` without a reference)."""
    metrics: dict[str, float | None] = {k: results["metrics"].get(k) for k in REPORT_METRICS}
    reference = (results.get("metadata") or {}).get("reference")
    stages = results["stages_completed"]
    metrics["intransigence"] = None
    if reference is not None and stages > 0 and all(v is not None for v in reference[:stages]):
        scores, _ = results_to_tensors(results)
        ref = torch.tensor(reference[:stages], dtype=torch.float64)
        metrics["intransigence"] = float(intransigence(scores[:, :stages], ref))
    return metrics


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    t = torch.tensor(values, dtype=torch.float64)
    return float(t.mean()), (float(t.std(correction=1)) if len(values) > 1 else None)


def summarise(runs: Sequence[Run]) -> list[MethodSummary]:
    """Group runs by experiment and method (in first-seen order) and average each metric over the
    group. The group is named by its method alone when all runs share one experiment."""
    one_experiment = len({run.experiment for run in runs}) <= 1
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.method if one_experiment else run.group, []).append(run)
    summaries = []
    for method, members in groups.items():
        per_run = [run_metrics(r.results) for r in members]
        mean, std = {}, {}
        for key in REPORT_METRICS:
            mean[key], std[key] = _mean_std([m[key] for m in per_run if m[key] is not None])
        summaries.append(MethodSummary(method, members, mean, std))
    return summaries


def _cell(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"


def _seeds(summary: MethodSummary) -> str:
    seeds = [r.seed for r in summary.runs]
    return ", ".join("-" if s is None else str(s) for s in seeds)


def markdown_table(summaries: Sequence[MethodSummary]) -> str:
    """``| method | runs | seeds | ACC | ... |`` with mean ± sample std (mean alone for one run);
    method names and seeds escaped (:func:`escape_markdown`)."""
    header = ["method", "runs", "seeds", *REPORT_METRICS.values()]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in summaries:
        cells = [_cell(s.mean[k], s.std[k]) for k in REPORT_METRICS]
        row = [escape_markdown(s.method), str(len(s.runs)), escape_markdown(_seeds(s)), *cells]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _plot_metric_bars(summaries: Sequence[MethodSummary], path: Path) -> None:
    from continual_eval.plotting import _pyplot

    plt = _pyplot()
    keys = [k for k in REPORT_METRICS if any(s.mean[k] is not None for s in summaries)]
    fig, ax = plt.subplots(figsize=(1.6 * len(keys) + 2.5, 4.2), layout="constrained")
    width = 0.8 / len(summaries)
    for n, s in enumerate(summaries):
        xs = [i + (n - (len(summaries) - 1) / 2) * width for i in range(len(keys))]
        means = [math.nan if s.mean[k] is None else s.mean[k] for k in keys]
        errs = [0.0 if s.std[k] is None else s.std[k] for k in keys]
        has_spread = any(s.std[k] is not None for k in keys)
        label = f"{_plain_for_plot(s.method)} (n={len(s.runs)})"
        ax.bar(xs, means, width * 0.95, label=label)
        if has_spread:
            ax.errorbar(xs, means, yerr=errs, fmt="none", ecolor="black", capsize=3, linewidth=1)
        for x, m, e in zip(xs, means, errs, strict=True):
            if m != m:  # no value (e.g. intransigence without a reference)
                ax.annotate(
                    "n/a",
                    (x, 0),
                    xytext=(0, 3),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color="grey",
                )
            else:  # value labels beyond the bar end and its error bar
                y = m + e if m >= 0 else m - e
                ax.annotate(
                    f"{m:.2f}",
                    (x, y),
                    xytext=(0, 3 if m >= 0 else -3),
                    textcoords="offset points",
                    ha="center",
                    va="bottom" if m >= 0 else "top",
                    fontsize=7,
                )
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(keys)), [REPORT_METRICS[k] for k in keys])
    ax.set_xlim(-0.6, len(keys) - 0.4)
    ax.set_ylabel("value")
    spread = any(len(s.runs) > 1 for s in summaries)
    ax.set_title("Metrics per method" + (" (mean ± sample std over seeds)" if spread else ""))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    low = min(
        [
            0.0,
            *(
                s.mean[k] - (s.std[k] or 0)
                for s in summaries
                for k in keys
                if s.mean[k] is not None
            ),
        ]
    )
    high = max(
        [
            1.0,
            *(
                s.mean[k] + (s.std[k] or 0)
                for s in summaries
                for k in keys
                if s.mean[k] is not None
            ),
        ]
    )
    ax.set_ylim(low - 0.08, high + 0.08)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_run(run: Run, out_dir: Path) -> tuple[Path, Path]:
    from continual_eval.plotting import _pyplot, plot_accuracy_matrix, plot_task_trajectories

    plt = _pyplot()
    scores, baseline = results_to_tensors(run.results)
    names = [_plain_for_plot(name) for name in run.results["task_names"]]
    title = _plain_for_plot(run.group)
    title = f"{title}, seed {_plain_for_plot(str(run.seed))}" if run.seed is not None else title
    matrix_path = out_dir / f"{run.label}_matrix.png"
    fig, _ = plot_accuracy_matrix(scores, baseline, task_names=names, title=f"R[i, j]: {title}")
    fig.savefig(matrix_path, dpi=120)
    plt.close(fig)
    traj_path = out_dir / f"{run.label}_trajectories.png"
    fig, _ = plot_task_trajectories(scores, task_names=names, title=f"Per-task accuracy: {title}")
    fig.savefig(traj_path, dpi=120)
    plt.close(fig)
    return matrix_path, traj_path


def _write_summary_csv(summaries: Sequence[MethodSummary], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["method", "runs", *(f"{k}_{s}" for k in REPORT_METRICS for s in ("mean", "std"))]
        )
        for s in summaries:
            row: list[Any] = [s.method, len(s.runs)]
            for k in REPORT_METRICS:
                row += [
                    "" if s.mean[k] is None else repr(s.mean[k]),
                    "" if s.std[k] is None else repr(s.std[k]),
                ]
            writer.writerow(row)


def write_report(paths: Sequence[str | Path], out_dir: str | Path) -> Path:
    """Draw and tabulate the runs found in ``paths`` into ``out_dir``; returns ``report.md``."""
    runs = find_runs(paths)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = summarise(runs)
    lines = ["# Continual-evaluation report", ""]
    lines += [
        f"{len(runs)} run(s). Metrics per method: mean over its runs; `±` = sample standard "
        "deviation across runs (seeds), shown only with two or more runs. Peak forgetting, GEM "
        "BWT/FWT; intransigence = joint-training reference minus R[j, j] (n/a without a "
        "reference).",
        "",
        markdown_table(summaries),
        "",
    ]
    if len(runs) > 0:
        _plot_metric_bars(summaries, out / "metrics.png")
        lines += ["![metrics per method](metrics.png)", ""]
    _write_summary_csv(summaries, out / "summary.csv")
    from continual_eval.loggers import format_matrix_table

    for run in runs:
        matrix_path, traj_path = _plot_run(run, out)
        stages = f"{run.results['stages_completed']}/{run.results['num_tasks']} stages"
        heading = escape_markdown(f"{run.group}, seed {run.seed} ({stages})")
        lines += [f"## {heading}", "", _code_span(str(run.path)), ""]
        lines += [format_matrix_table(_escaped_names(run.results), markdown=True), ""]
        extra = run_metrics(run.results)["intransigence"]
        if extra is not None:
            lines += [f"intransigence={extra:.4f}", ""]
        lines += [f"![R]({matrix_path.name}) ![trajectories]({traj_path.name})", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report


def _escaped_names(results: dict[str, Any]) -> dict[str, Any]:
    """A shallow copy of ``results`` whose task names and score name are Markdown-escaped."""
    conventions = dict(results.get("conventions") or {})
    if "score" in conventions:
        conventions["score"] = escape_markdown(conventions["score"])
    names = [escape_markdown(name) for name in results["task_names"]]
    return {**results, "task_names": names, "conventions": conventions}


def _default_out(paths: Sequence[str]) -> Path:
    """``<run>/report`` for one run directory, else ``<common parent>/report``."""
    dirs = [Path(p).resolve() if Path(p).is_dir() else Path(p).resolve().parent for p in paths]
    if len(dirs) == 1:
        return dirs[0] / "report"
    return Path(os.path.commonpath(dirs)) / "report"


def main(argv: Sequence[str] | None = None) -> int:
    """``continual-eval report RUN_DIR [RUN_DIR ...] [--out DIR]``; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="continual-eval report",
        description="Heatmaps, trajectories, a metric chart and a mean ± spread table from "
        "the results.json files ContinualEvalCallback wrote.",
    )
    parser.add_argument("runs", nargs="+", help="run directories (or folders holding several)")
    parser.add_argument(
        "--out", default=None, help="output folder (default: <common parent of the runs>/report)"
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    out = Path(args.out) if args.out else _default_out(args.runs)
    try:
        report = write_report(args.runs, out)
    except InvalidResultsError as err:  # a file that is not a valid results.json
        print(f"continual-eval report: {err}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as err:  # nothing found, unreadable, output not writable
        print(f"continual-eval report: {printable(str(err), 500)}", file=sys.stderr)
        return 1
    print(report.read_text(encoding="utf-8").split("\n## ")[0])
    print(f"report written to {report}")
    return 0

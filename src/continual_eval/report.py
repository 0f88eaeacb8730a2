"""``continual-eval report RUN_DIR [RUN_DIR ...]``: pictures and tables from the callback's files.

Per run (a directory holding ``results.json``): the heatmap and the per-task trajectories of
every matrix. Across runs, grouped by method: a table of mean ± sample standard deviation (``n``,
the runs, always shown), ``metrics.png`` with one panel per metric (its own scale; the means as
bars with the 95% Student-t interval of each mean as error bars, none for a method with one run),
``table.tex`` ([`latex_summary`][continual_eval.report.latex_summary]), ``report.html`` (one
self-contained page, Plotly), and the uncertainty across seeds from
``continual_eval.seed_statistics``: per metric, each method's ``n``, mean, sample std, Student-t
interval and percentile bootstrap interval
([`BOOTSTRAP_RESAMPLES`][continual_eval.report.BOOTSTRAP_RESAMPLES] resamples drawn with seed
[`BOOTSTRAP_SEED`][continual_eval.report.BOOTSTRAP_SEED], both stated in ``report.md``; one run: no
interval), and the paired differences ``A - B`` of every pair of methods over the seeds they share
(interval on the difference, and the seeds where A is better, where B is better, and ties; the
direction of each metric from
[`metric_higher_is_better`][continual_eval.report.metric_higher_is_better]). With the runs' ``cost``
totals, a table of their means per method; with a matrix's ``plasticity`` (anytime accuracy, LCA),
extra columns; with a ``class_incremental`` section (``task_classes=``), a table of the final
class-incremental measures per method and, per run, the task-aware and task-agnostic heatmaps side
by side and the final confusion matrix in order of arrival; with an ``online`` section
(``OnlineEvalCallback``), a table of the online, near-future and blind accuracy per method and,
per run, the picture of online vs near-future vs blind accuracy over the stream
(``<run>_online.png``), its score table, compute and held-out values, and
``<run>_online_windows.csv`` (``continual_eval._online_report``; a run without tasks, an online
run alone, shows only these). Everything goes into ``--out``: PNGs,
``summary.csv`` (mean, std and n per metric), ``seed_statistics.csv``, ``paired_differences.csv``,
``cost.csv`` (with costs), ``table.tex``, ``report.html`` and ``report.md``; every CSV through the
package's one CSV writer (a cell a spreadsheet would run as a formula begins with ``'``).

Each run is read with [`ContinualResults.load`][continual_eval.results.ContinualResults.load]
(``format_version`` 2); the metric columns are the primary matrix's (the family's report
columns, ``REPORT_KEYS``), and every matrix of a run is
tabulated under its heading.

Intransigence needs a reference accuracy of each task; ``continual-eval fit`` stores it as
``results.json["metadata"]["reference"]`` (a list, one value per task) and its kind (``joint`` or
``isolated``) as ``metadata["reference_kind"]``, which the report names. Runs without it show no
intransigence. The reference models' own runs (``<run>/joint_reference/``,
``<run>/isolated_reference/task_j/``:
[`REFERENCE_DIR_NAMES`][continual_eval.report.REFERENCE_DIR_NAMES]) are never listed as runs.

The files read may come from anywhere: each is validated
(``continual_eval.results.files.read_document``: size, nesting and name-length limits,
types and shapes of every field) before anything is drawn, and an invalid one stops the command
with exit code 2 and a one-line message naming the file and the field. Names and metadata from
the files are escaped for Markdown and HTML in ``report.md``, for HTML in ``report.html`` (tables
and figure labels) and for LaTeX in ``table.tex``, and shown as plain text (no mathtext) in the
pictures.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from continual_eval._class_incremental_report import (
    class_incremental_run_lines,
    class_incremental_summary_lines,
)
from continual_eval._csv import csv_text
from continual_eval._held_out_report import held_out_run_lines
from continual_eval._items_report import items_run_lines
from continual_eval._latex_table import SPREADS, LatexColumn, latex_table
from continual_eval._markdown import escape_markdown
from continual_eval._online_report import online_run_lines, online_summary_lines
from continual_eval._per_task_report import PerTaskTable, per_task_markdown, per_task_tables
from continual_eval._predictions_report import forgotten_lines
from continual_eval.functional import intransigence
from continual_eval.functional.family import METRIC_KEYS, METRIC_TITLES, REPORT_KEYS
from continual_eval.results import ContinualResults, InvalidResultsError, MatrixResults
from continual_eval.results.files import JOURNAL_FILE, RESULTS_FILE
from continual_eval.results.schema import printable
from continual_eval.seed_statistics import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    PairedDifference,
    SeedSummary,
    paired_csv,
    paired_markdown,
    pairwise_differences,
    refuse_mixed_seed_types,
    summarize,
    summary_csv,
    summary_markdown,
)

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "COST_COLUMNS",
    "DEFAULT_SPREAD",
    "HTML_FILE",
    "PLASTICITY_METRICS",
    "REFERENCE_DIR_NAMES",
    "REFERENCE_METRICS",
    "REPORT_METRICS",
    "TABLE_FILE",
    "MethodSummary",
    "Run",
    "RunPictures",
    "escape_markdown",
    "find_runs",
    "latex_summary",
    "main",
    "markdown_table",
    "metric_higher_is_better",
    "paired_differences",
    "run_cost",
    "run_metrics",
    "summarise",
    "write_report",
]

REPORT_METRICS: dict[str, str] = {key: METRIC_TITLES[key] for key in REPORT_KEYS}
"""Metric key -> column title, in table and chart order (the family's report columns)."""
PLASTICITY_METRICS: dict[str, str] = {"anytime_accuracy": "Anytime ACC", "lca": "LCA"}
"""Further columns, shown when a run's primary matrix records them (its ``plasticity``)."""
REFERENCE_METRICS: dict[str, str] = {"fwt_isolated": "FWT (isolated)"}
"""Further columns, shown when a run records a ``reference`` section with an isolated
reference."""
#: metrics signed so that higher is better whatever the score's direction (the functional layer)
_HIGHER_IS_BETTER = frozenset({"bwt", "fwt", "fwt_isolated"})
#: metrics where lower is better whatever the score's direction (a drop, a gap)
_LOWER_IS_BETTER = frozenset({"forgetting", "intransigence"})
REFERENCE_DIR_NAMES: tuple[str, ...] = (
    "isolated_reference",
    "joint_reference",
    "cumulative_reference",
)
"""The sub-directories ``continual-eval fit`` gives a run's reference models, skipped when
searching for runs (``continual_eval.references.REFERENCE_DIRS``; not imported from
there: that module loads Lightning)."""
JOINT_REFERENCE_DIR = "joint_reference"
#: how each reference kind is named in ``report.md``
_REFERENCE_NAMES = {
    "joint": "joint-training reference",
    "isolated": "isolated-training reference (each task trained alone)",
    "cumulative": "cumulative reference (task k: trained on tasks 0..k; Chaudhry et al., 2018)",
    "given": "given reference",
}
BOOTSTRAP_RESAMPLES = DEFAULT_RESAMPLES
"""Resamples of the percentile bootstrap (the default of ``continual-eval report``;
``--resamples`` changes it)."""
BOOTSTRAP_SEED = 0
"""Seed of the bootstrap's ``numpy.random.default_rng`` (the default of ``continual-eval
report``; ``--bootstrap-seed`` changes it)."""
COST_COLUMNS: dict[str, str] = {
    "train_seconds": "train s",
    "eval_seconds": "eval s",
    "samples": "samples",
    "optimizer_steps": "optimizer steps",
    "peak_memory_bytes": "peak memory (MiB)",
    "model_size_efficiency": "model-size efficiency",
}
"""The ``cost`` totals tabulated per method (key -> column title), when runs carry them."""
MAX_LABEL_LENGTH = 80
"""Longest run label used in a picture's file name (longer ones are cut and given a hash)."""


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


def _plain_title(text: str) -> str:
    """``text`` for a figure's title (`_plain_for_plot`, up to 100 characters)."""
    return _plain_for_plot(text, 100)


@dataclass
class Run:
    """One run directory and its results (its ``results.json``, read)."""

    path: Path
    results: ContinualResults

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self.results.metadata)

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
        return self.results.complete

    @property
    def reference_kind(self) -> str | None:
        """The kind of the reference behind intransigence: the ``reference`` section's kind
        when recorded, else ``metadata["reference_kind"]`` (``continual-eval fit``), else
        ``"joint"``; ``None`` without a reference."""
        if self.results.reference is None:
            return None
        kind = _field(getattr(self.results, "reference_metrics", None), "kind")
        if kind is None:
            kind = self.metadata.get("reference_kind")
        return "joint" if kind is None else str(kind)

    @property
    def label(self) -> str:
        """File-name-safe label (``[A-Za-z0-9_.-]``, at most
        [`MAX_LABEL_LENGTH`][continual_eval.report.MAX_LABEL_LENGTH] characters), unique among runs
        of one method when their seeds differ."""
        seed = self.seed
        tail = f"seed{seed}" if seed is not None else self.path.name
        label = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self.group}_{tail}")
        if len(label) <= MAX_LABEL_LENGTH:
            return label
        digest = hashlib.sha256(label.encode("utf-8")).hexdigest()[:12]
        return f"{label[: MAX_LABEL_LENGTH - 13]}_{digest}"


@dataclass
class MethodSummary:
    """Each metric over the runs of one method: mean, sample std and the full statistics
    (``SeedSummary``: ``n``, both intervals)."""

    method: str
    runs: list[Run]
    mean: dict[str, float | None]
    std: dict[str, float | None]  # None with fewer than two values
    #: metric -> its statistics over the runs with a value
    stats: dict[str, SeedSummary] = field(default_factory=dict)
    #: metric -> each run's value, in run order (``None``: absent in that run)
    values: dict[str, list[float | None]] = field(default_factory=dict)


def find_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Runs in ``paths``: each path is a run directory (or its results.json) or a folder searched
    recursively for ``results.json`` (and for stage journals without one: runs killed before
    their first ``results.json``, replayed), leaving out the reference models' runs (anything
    under a directory named in
    [`REFERENCE_DIR_NAMES`][continual_eval.report.REFERENCE_DIR_NAMES], below ``path``). Sorted
    by path.

    Every file is validated; the first invalid one raises
    ``InvalidResultsError``."""
    found: dict[Path, Run] = {}
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            candidates = [path]
        elif (path / RESULTS_FILE).is_file() or (path / JOURNAL_FILE).is_file():
            # a journal alone (a run killed before its first results.json): load replays it
            candidates = [path / RESULTS_FILE]
        else:
            candidates = [
                p.with_name(RESULTS_FILE)
                for p in (*path.rglob(RESULTS_FILE), *path.rglob(JOURNAL_FILE))
                if not _in_reference_dir(p.relative_to(path))
            ]
            if not candidates:
                raise FileNotFoundError(f"no {RESULTS_FILE} in {path}")
        for file in candidates:
            found[file.parent.resolve()] = Run(file.parent, ContinualResults.load(file))
    return [found[k] for k in sorted(found)]


def _in_reference_dir(relative: Path) -> bool:
    return any(part in REFERENCE_DIR_NAMES for part in relative.parent.parts)


def metric_higher_is_better(key: str, score_higher_is_better: bool = True) -> bool:
    """Which way a report column is better: BWT and FWT are signed so that higher is better for
    any score, forgetting and intransigence are lower-is-better for any score (a drop, a gap),
    and ACC, anytime accuracy and LCA (means of the score) follow the score's direction."""
    if key in _HIGHER_IS_BETTER:
        return True
    if key in _LOWER_IS_BETTER:
        return False
    return bool(score_higher_is_better)


def _field(section: Any, name: str) -> Any:
    """``section[name]`` of a mapping or ``section.name`` of an object; ``None`` when absent."""
    if section is None:
        return None
    if isinstance(section, Mapping):
        return section.get(name)
    return getattr(section, name, None)


def _finite(value: Any) -> float | None:
    """``value`` as a finite float (a number or a one-element tensor), else ``None``."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return None
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _plasticity(matrix: MatrixResults) -> dict[str, float | None]:
    """Anytime accuracy and LCA of a matrix's ``plasticity`` section (``{}`` without one)."""
    section = getattr(matrix, "plasticity", None)
    if section is None:
        return {}
    lca = _field(section, "lca")
    lca_value = _finite(lca)
    if lca_value is None:
        lca_value = _finite(_field(lca, "value"))
    return {"anytime_accuracy": _finite(_field(section, "anytime_accuracy")), "lca": lca_value}


def run_metrics(results: ContinualResults | Mapping[str, Any]) -> dict[str, float | None]:
    """The report columns of the primary matrix: the final metrics as recorded, plus
    intransigence from ``metadata["reference"]``: ``reference[j] - R[j, j]`` averaged over the
    completed stages (reversed for a lower-is-better score); ``None`` where undefined or without
    a reference. With a ``plasticity`` section on the primary matrix, also its anytime accuracy
    and LCA ([`PLASTICITY_METRICS`][continual_eval.report.PLASTICITY_METRICS]). ``results`` may also
    be a ``results.json`` document."""
    if not isinstance(results, ContinualResults):
        results = ContinualResults.from_dict(results)
    primary = results.primary
    metrics: dict[str, float | None] = {}
    for key in REPORT_METRICS:
        value = primary.metrics.get(key)
        metrics[key] = value if value is not None and math.isfinite(value) else None
    metrics["intransigence"] = _intransigence(primary, results.reference)
    # R[j, j] - ref[j] over j >= 1 against isolated training (the reference section's; in the
    # primary score's direction), absent without an isolated reference
    metrics["fwt_isolated"] = _finite(
        _field(getattr(results, "reference_metrics", None), "fwt_isolated")
    )
    metrics.update(_plasticity(primary))
    return metrics


def run_cost(results: ContinualResults) -> dict[str, float | None] | None:
    """The ``cost`` totals of a run ([`COST_COLUMNS`][continual_eval.report.COST_COLUMNS], ``None``
    each where not recorded); ``None`` when the run records no cost, or not the cost of every
    recorded stage (a run resumed from a checkpoint written before costs were recorded: its totals
    would miss the earlier stages)."""
    cost = getattr(results, "cost", None)
    summary = _field(cost, "summary")
    if callable(summary):
        summary = summary()
    if summary is None:
        return None
    per_stage = _field(cost, "per_stage")
    if per_stage is not None:
        stages = [_field(entry, "stage") for entry in per_stage]
        if stages != list(range(int(getattr(results, "stages_completed", len(stages))))):
            return None
    return {key: _finite(_field(summary, key)) for key in COST_COLUMNS}


def _intransigence(matrix: MatrixResults, reference: torch.Tensor | None) -> float | None:
    s = matrix.num_stages
    if reference is None or s == 0 or bool(torch.isnan(reference[:s]).any()):
        return None
    value = intransigence(
        matrix.scores[:, :s],
        reference[:s],
        higher_is_better=matrix.higher_is_better,
        bounds=matrix.bounds,
    )
    return float(value)


def summarise(
    runs: Sequence[Run],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> list[MethodSummary]:
    """Group runs by experiment and method (in first-seen order) and summarise each metric over
    the group with ``summarize`` (mean, sample std, the
    Student-t and percentile bootstrap intervals at ``confidence``, the bootstrap drawing
    ``resamples`` resamples with ``seed``). The group is named by its method alone when all runs
    share one experiment. The metrics: [`REPORT_METRICS`][continual_eval.report.REPORT_METRICS],
    then the [`PLASTICITY_METRICS`][continual_eval.report.PLASTICITY_METRICS] some run records."""
    _check_run_seeds(runs)
    one_experiment = len({run.experiment for run in runs}) <= 1
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.method if one_experiment else run.group, []).append(run)
    per_group = {
        method: [run_metrics(r.results) for r in members] for method, members in groups.items()
    }
    present = {
        key
        for rows in per_group.values()
        for row in rows
        for key, v in row.items()
        if v is not None
    }
    optional = {**REFERENCE_METRICS, **PLASTICITY_METRICS}
    keys = [*REPORT_METRICS, *(k for k in optional if k in present)]
    summaries = []
    for method, members in groups.items():
        values = {key: [row.get(key) for row in per_group[method]] for key in keys}
        stats = {
            key: summarize(
                values[key],
                confidence=confidence,
                resamples=resamples,
                seed=seed,
                name=f"method {method!r}, {key}",  # named in an error (non-finite, overflow)
            )
            for key in keys
        }
        mean = {key: stats[key].mean for key in keys}
        std = {key: stats[key].std for key in keys}
        summaries.append(MethodSummary(method, members, mean, std, stats, values))
    return summaries


def _check_run_seeds(runs: Sequence[Run]) -> None:
    """Seeds (``metadata.seed``) of one type across the runs, else an
    [`InvalidResultsError`][continual_eval.results.InvalidResultsError] naming the labels, their
    files and the first run whose seed differs in type (seeds are matched by value and type)."""
    seeded = [r for r in runs if r.seed is not None]
    files = [str(r.path / RESULTS_FILE) for r in seeded]
    try:
        refuse_mixed_seed_types([r.seed for r in seeded], "the runs", files)
    except ValueError as err:
        odd = next(
            f
            for r, f in zip(seeded, files, strict=True)
            if type(r.seed) is not type(seeded[0].seed)
        )
        raise InvalidResultsError(odd, "metadata.seed", str(err)) from None


def _columns(summaries: Sequence[MethodSummary]) -> dict[str, str]:
    """key -> title of the metrics the summaries hold, in table order."""
    titles = {**REPORT_METRICS, **REFERENCE_METRICS, **PLASTICITY_METRICS}
    keys = summaries[0].mean if summaries else REPORT_METRICS
    return {key: titles[key] for key in keys}


def _directions(runs: Sequence[Run], keys: Sequence[str]) -> tuple[dict[str, bool], set[str]]:
    """Each metric's direction
    ([`metric_higher_is_better`][continual_eval.report.metric_higher_is_better] with the runs'
    primary matrix) and the metrics whose direction differs between runs (then the first run's is
    used)."""
    directions: dict[str, bool] = {}
    mixed: set[str] = set()
    for key in keys:
        found = [metric_higher_is_better(key, r.results.primary.higher_is_better) for r in runs]
        directions[key] = found[0] if found else metric_higher_is_better(key)
        if len(set(found)) > 1:
            mixed.add(key)
    return directions, mixed


def _seed_key(seed: Any) -> str:
    """A run's seed as a matching key: ``1``, ``1.0``, ``"1"`` and ``true`` stay distinct."""
    return json.dumps(seed, sort_keys=True)


def _seed_order(seed: Any) -> tuple[int, float, str]:
    """Numbers first, by value; then the rest by their JSON text."""
    number = isinstance(seed, (int, float)) and not isinstance(seed, bool)
    return (0, float(seed), "") if number else (1, 0.0, _seed_key(seed))


def paired_differences(
    summaries: Sequence[MethodSummary],
    key: str,
    *,
    higher_is_better: bool,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[tuple[str, str], PairedDifference]:
    """``A - B`` of metric ``key`` for every pair of methods (A before B in ``summaries``' order)
    over the seeds both have a value for, by
    ``pairwise_differences``. Runs are matched by their
    ``metadata["seed"]``; a run without a seed, or whose seed another run of its method shares,
    is not paired. The differences' ``seeds`` are indices into the sorted seeds of all runs
    (numbers first, by value; then the rest by their JSON text)."""
    index = {_seed_key(v): i for i, v in enumerate(_all_seeds(summaries))}
    by_method: dict[str, dict[int, float | None]] = {}
    for s in summaries:
        keys = [None if r.seed is None else _seed_key(r.seed) for r in s.runs]
        by_method[s.method] = {
            index[k]: value
            for k, value in zip(keys, s.values[key], strict=True)
            if k is not None and keys.count(k) == 1
        }
    return pairwise_differences(
        by_method,
        higher_is_better=higher_is_better,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )


def _cell(stats: SeedSummary, runs: int, single: tuple[float, float] | None = None) -> str:
    """``mean ± std`` over the runs; a value alone for one run, with ``single`` (its test-set
    interval) as ``value [low, high]``; ``(n=k)`` where only ``k`` of the runs have a value."""
    if stats.mean is None:
        return "n/a"
    text = f"{stats.mean:.4f}" if stats.std is None else f"{stats.mean:.4f} ± {stats.std:.4f}"
    if single is not None and stats.std is None:
        text += f" [{single[0]:.4f}, {single[1]:.4f}]"
    return text if stats.n == runs else f"{text} (n={stats.n})"


def _interval_note(summaries: Sequence[MethodSummary]) -> str | None:
    """The table note (plain text: the caller escapes it) saying which interval a cell shows:
    ``[low, high]`` after a single run's value is that run's interval from its test items (the
    ``intervals`` section's method, confidence, resamples and seed), ``±`` the sample std across
    seeds; ``None`` when no cell shows a single-run interval."""
    shown = [s for s in summaries if any(_single_run_interval(s, k) for k in s.stats)]
    if not shown:
        return None
    sections = {
        (iv.method, iv.confidence, iv.resamples, iv.seed)
        for s in shown
        for r in s.runs
        if (iv := r.results.intervals) is not None
    }
    how = "; ".join(
        f"{100 * c:g}% {printable(m, 80)}, {n} resamples, seed {seed}"
        for m, c, n, seed in sorted(sections)
    )
    return (
        "value [low, high]: a method with one run shows the interval of its test-set "
        f"noise, from its per-item records ({how}; the intervals section of results.json), "
        "not the variation between seeds. With two or more runs, ± is the sample std across "
        "seeds (the intervals across seeds are under Uncertainty across seeds)."
    )


def _named_caveats(stats: Mapping[str, SeedSummary]) -> list[tuple[str, str | None]]:
    return [(method, summary.caveat) for method, summary in stats.items()]


def _caveat_block(caveats: Sequence[str]) -> list[str]:
    """``report.md`` lines of the caveats under a table (a list, then a blank line)."""
    return [*(f"- {c}" for c in caveats), ""] if caveats else []


def _seed_caveats(named: Sequence[tuple[str, str | None]], escape: Any) -> list[str]:
    """The small-sample caveat of the across-seed intervals (``SeedSummary.caveat``, fewer
    than ``SMALL_SAMPLE_RUNS`` runs) once per distinct text, naming the methods (or pairs) it
    applies to (escaped with ``escape``)."""
    by_text: dict[str, list[str]] = {}
    for name, text in named:
        if text:
            by_text.setdefault(text, []).append(name)
    return [f"{', '.join(map(escape, names))}: {escape(text)}" for text, names in by_text.items()]


def _seeds(summary: MethodSummary) -> str:
    seeds = [r.seed for r in summary.runs]
    return ", ".join("-" if s is None else str(s) for s in seeds)


def markdown_table(summaries: Sequence[MethodSummary]) -> str:
    """``| method | runs | seeds | ACC | ... |`` with mean ± sample std (mean alone for one run,
    followed by ``[low, high]``, the run's interval from its test items, where its ``intervals``
    section has one for the column; ``(n=k)`` where only ``k`` of the runs have a value); method
    names and seeds escaped
    ([`escape_markdown`][continual_eval.report.escape_markdown])."""
    columns = _columns(summaries)
    header = ["method", "runs", "seeds", *columns.values()]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in summaries:
        cells = [_cell(s.stats[k], len(s.runs), _single_run_interval(s, k)) for k in columns]
        row = [escape_markdown(s.method), str(len(s.runs)), escape_markdown(_seeds(s)), *cells]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _plot_metric_panels(
    summaries: Sequence[MethodSummary], runs: Sequence[Run], path: Path
) -> bool:
    """``metrics.png`` (``False``: no metric has a value, nothing drawn): small multiples
    ([`plot_metric_panels`][continual_eval.plotting.plot_metric_panels]), one panel per metric with
    a value, its own y scale and 3 decimals, the direction as an arrow; the Student-t interval of
    the mean as error bars (only where the method has two or more values), ``n`` in the legend."""
    from continual_eval.plotting import _pyplot, plot_metric_panels

    columns = _columns(summaries)
    keys = [k for k in columns if any(s.mean[k] is not None for s in summaries)]
    if not keys:
        return False
    directions, _ = _directions(runs, keys)
    confidence = summaries[0].stats[keys[0]].confidence
    pct = f"{100 * confidence:g}%"
    intervals = {
        k: [None if (ci := s.stats[k].t_interval) is None else (ci.low, ci.high) for s in summaries]
        for k in keys
    }
    fig, _ = plot_metric_panels(
        {k: [s.mean[k] for s in summaries] for k in keys},
        [_plain_for_plot(s.method) for s in summaries],
        intervals=intervals,
        counts={k: [s.stats[k].n for s in summaries] for k in keys},
        runs=[len(s.runs) for s in summaries],
        titles={k: columns[k] for k in keys},
        higher_is_better=directions,
        interval_label=f"{pct} Student-t interval of the mean (n ≥ 2)",
        single_intervals={k: [_single_run_interval(s, k) for s in summaries] for k in keys},
        single_label="one run: its interval from its test items (grey)",
        title="Metrics per method: mean over seeds (↑ higher is better, ↓ lower is better)",
    )
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return True


@dataclass(frozen=True)
class RunPictures:
    """The PNGs of one matrix of a run: its heatmap and its per-task trajectories."""

    matrix: str
    heatmap: Path
    trajectories: Path


def _file_label(text: str) -> str:
    """``text`` as a short file-name-safe label (``[A-Za-z0-9_.-]``, a hash when cut)."""
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", text)
    if len(label) <= 40:
        return label
    return f"{label[:27]}_{hashlib.sha256(text.encode('utf-8')).hexdigest()[:12]}"


def _matrix_range(matrix: MatrixResults) -> tuple[float, float] | None:
    bounds = matrix.bounds
    if bounds is not None and all(math.isfinite(v) for v in bounds):
        return float(bounds[0]), float(bounds[1])
    return None


#: how the report names a cell interval method of the ``intervals`` section
_CELL_METHODS = {"wilson": "Wilson", "t": "Student-t"}


def _cell_interval_label(results: ContinualResults, matrix: str) -> str:
    """``"95% Wilson interval"``: what the cell intervals of ``matrix`` in ``results``'
    ``intervals`` section are (``"interval"`` without one)."""
    section = results.intervals
    held = None if section is None else section.matrices.get(matrix)
    if section is None or held is None:
        return "interval"
    method = _CELL_METHODS.get(held.cell_method, held.cell_method)
    return f"{100 * section.confidence:g}% {method} interval"


def _run_metric_interval(results: ContinualResults, key: str) -> tuple[float, float] | None:
    """The ``intervals`` section's ``(low, high)`` of report column ``key`` on the primary
    matrix (one run's test-set interval, e.g. the paired bootstrap of BWT), when the section
    holds one whose estimate is the column's value (the same definition); else ``None``. Any
    metric the section provides under a report column's key is found, so new ones need no
    change here."""
    section = results.intervals
    held = None if section is None else section.matrices.get(results.primary_name)
    found = None if held is None else held.metrics.get(key)
    value = run_metrics(results).get(key)
    if found is None or value is None:
        return None
    estimate, low, high = found
    if not (math.isfinite(low) and math.isfinite(high)):
        return None
    if not math.isclose(estimate, value, rel_tol=1e-6, abs_tol=1e-9):
        return None
    return low, high


#: report columns whose one-run interval is ruled out by a section-wide reason of the
#: ``intervals`` section's ``unavailable`` (column -> that key)
_SECTION_REASONS = {"anytime_accuracy": "plasticity", "lca": "plasticity"}


def _no_interval_reason(results: ContinualResults, key: str, matrix: str | None = None) -> str:
    """Why one run's value of metric ``key`` of ``matrix`` (the primary one by default) has no
    interval: the ``intervals`` section's reason (``unavailable`` of the matrix, then of the
    section) where it states one, else what is missing (no item records, the matrix not recorded,
    an estimate of another definition, no such interval)."""
    name = results.primary_name if matrix is None else matrix
    section = results.intervals
    if section is None:
        return "the run has no per-item records (item_records= not set): no intervals section"
    held = section.matrices.get(name)
    if held is None:
        skipped = None if results.items is None else results.items.skipped.get(name)
        why = f": {printable(skipped, 300)}" if skipped else ""
        return f"matrix {printable(name, 80)} has no per-item records{why}"
    if key in held.unavailable:
        return printable(held.unavailable[key], 500)
    for found in (_SECTION_REASONS.get(key), key):
        if found is not None and found in section.unavailable:
            return printable(section.unavailable[found], 500)
    interval = held.metrics.get(key)
    if interval is not None:
        if not (math.isfinite(interval[1]) and math.isfinite(interval[2])):
            return "its interval is undefined (a resampled value is not finite)"
        return (
            "the intervals section's estimate differs from the value shown (another "
            "definition), so its interval is not shown"
        )
    return "the intervals section of results.json holds no interval of it"


def _missing_interval_notes(summaries: Sequence[MethodSummary]) -> list[str]:
    """One line (plain text) per column and reason where a method's single value is printed
    without an interval: ``<title>: no interval (methods): <reason>``; a column shown with ``±``
    (two or more runs) has its intervals across seeds under Uncertainty across seeds."""
    columns = _columns(summaries)
    found: dict[tuple[str, str], list[str]] = {}
    for key, title in columns.items():
        for s in summaries:
            if s.stats[key].n != 1 or _single_run_interval(s, key) is not None:
                continue
            run = next(r for r, v in zip(s.runs, s.values[key], strict=True) if v is not None)
            found.setdefault((title, _no_interval_reason(run.results, key)), []).append(s.method)
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}  # one line per reason
    for (title, why), methods in found.items():
        grouped.setdefault((why, tuple(methods)), []).append(title)
    return [
        f"{', '.join(titles)}: no interval ({', '.join(printable(m, 80) for m in methods)}): {why}"
        for (why, methods), titles in grouped.items()
    ]


def _single_run_interval(summary: MethodSummary, key: str) -> tuple[float, float] | None:
    """The single-run interval of column ``key`` shown for a method with exactly one value of
    it (`_run_metric_interval` of that run); ``None``
    otherwise (with two or more values the intervals across seeds are the ones shown)."""
    if summary.stats[key].n != 1:
        return None
    values = summary.values[key]
    run = next(r for r, v in zip(summary.runs, values, strict=True) if v is not None)
    return _run_metric_interval(run.results, key)


def _plot_run(run: Run, out_dir: Path) -> list[RunPictures]:
    """Every matrix's heatmap (colormap by the score's direction) and trajectories:
    ``<label>_matrix.png`` / ``<label>_trajectories.png`` for the primary matrix,
    ``<label>_matrix_<name>.png`` / ``<label>_trajectories_<name>.png`` for the others."""
    from continual_eval.plotting import _pyplot, plot_accuracy_matrix, plot_task_trajectories

    plt = _pyplot()
    names = [_plain_for_plot(name) for name in run.results.task_names]
    title = _plain_for_plot(run.group)
    title = f"{title}, seed {_plain_for_plot(str(run.seed))}" if run.seed is not None else title
    pictures = []
    used: set[str] = set()
    for number, (key, matrix) in enumerate(run.results.matrices.items()):
        suffix = "" if number == 0 else f"_{_file_label(key)}"
        if suffix in used:  # two names that clean to one label
            suffix = f"{suffix}_{number}"
        used.add(suffix)
        score = _plain_for_plot(matrix.score)
        shown = _plain_for_plot(key)
        value_range = _matrix_range(matrix)
        matrix_path = out_dir / f"{run.label}_matrix{suffix}.png"
        held = None if run.results.intervals is None else run.results.intervals.matrices.get(key)
        fig, _ = plot_accuracy_matrix(
            matrix.scores,
            matrix.baseline,
            task_names=names,
            title=f"{shown} R[i, j]: {title}",
            value_range=value_range,
            value_label=score,
            higher_is_better=matrix.higher_is_better,
            intervals=None if held is None else (held.low, held.high),
            baseline_intervals=None if held is None else (held.baseline_low, held.baseline_high),
            interval_label=_cell_interval_label(run.results, key),
        )
        fig.savefig(matrix_path, dpi=120)
        plt.close(fig)
        traj_path = out_dir / f"{run.label}_trajectories{suffix}.png"
        fig, _ = plot_task_trajectories(
            matrix.scores,
            task_names=names,
            title=f"Per-task {score} ({shown}): {title}"
            + ("" if held is None else f" ({held.cell_method} intervals)"),
            ylabel=score,
            value_range=value_range,
            intervals=None if held is None else (held.low, held.high),
        )
        fig.savefig(traj_path, dpi=120)
        plt.close(fig)
        pictures.append(RunPictures(key, matrix_path, traj_path))
    return pictures


def _summary_interval(summary: MethodSummary, key: str) -> tuple[float, float] | None:
    """The interval ``summary.csv`` gives column ``key`` of a method: with one value, that run's
    interval from its test items (`_single_run_interval`); with two or more, the Student-t
    interval of the mean across seeds (``SeedSummary.t_interval``); ``None`` when there is none."""
    stats = summary.stats[key]
    if stats.n == 1:
        return _single_run_interval(summary, key)
    ci = stats.t_interval
    return None if ci is None else (ci.low, ci.high)


def _write_summary_csv(summaries: Sequence[MethodSummary], path: Path) -> None:
    """One row per method: runs, then ``n``, mean, sample std, ``lo`` and ``hi`` of each metric
    (`_summary_interval`: one value, its run's interval from its test items; two or more, the
    Student-t interval across seeds; empty when none), through ``csv_text`` (a name a
    spreadsheet would run as a formula is neutralised)."""
    columns = _columns(summaries)
    parts = ("n", "mean", "std", "lo", "hi")
    header = ["method", "runs", *(f"{k}_{p}" for k in columns for p in parts)]
    rows = []
    for s in summaries:
        row: list[Any] = [s.method, len(s.runs)]
        for k in columns:
            ends = _summary_interval(s, k)
            row += [s.stats[k].n, s.mean[k], s.std[k], *((None, None) if ends is None else ends)]
        rows.append(row)
    path.write_text(csv_text(header, rows), encoding="utf-8")


def _prefixed_csv(parts: Sequence[tuple[dict[str, Any], str]], suffix: Sequence[str]) -> str:
    """The rows of several CSV texts (one header each, all alike) under one header, each row
    with its part's columns (name -> value) first; ``suffix``: the ``shared_seeds`` column, one
    value per row, at the end (none when empty). Written through
    ``csv_text`` (idempotent: a cell it neutralised stays as it is)."""
    header: list[Any] = []
    out: list[list[Any]] = []
    extra = iter(suffix)
    for number, (first, text) in enumerate(parts):
        rows = list(csv.reader(io.StringIO(text)))
        if number == 0:
            header = [*first, *rows[0], *(["shared_seeds"] if suffix else [])]
        out += [[*first.values(), *row, *([next(extra)] if suffix else [])] for row in rows[1:]]
    return csv_text(header, out)


def _all_seeds(summaries: Sequence[MethodSummary]) -> list[Any]:
    """The distinct seeds of all runs, sorted (numbers first):
    [`paired_differences`][continual_eval.report.paired_differences] numbers the seeds by their
    place here."""
    seeds = {_seed_key(r.seed): r.seed for s in summaries for r in s.runs if r.seed is not None}
    return sorted(seeds.values(), key=_seed_order)


def _unpaired(summaries: Sequence[MethodSummary]) -> int:
    """Runs without a seed, or sharing their seed with another run of their method."""
    count = 0
    for s in summaries:
        keys = [None if r.seed is None else _seed_key(r.seed) for r in s.runs]
        count += sum(1 for k in keys if k is None or keys.count(k) > 1)
    return count


def _direction_text(higher_is_better: bool) -> str:
    return "higher is better" if higher_is_better else "lower is better"


def _statistics(
    summaries: Sequence[MethodSummary],
    runs: Sequence[Run],
    out: Path,
    *,
    confidence: float,
    resamples: int,
    seed: int,
) -> list[str]:
    """The uncertainty across seeds: per metric, the summary table and, with two or more
    methods, the paired differences; as markdown lines for ``report.md`` (method names
    escaped) and as ``seed_statistics.csv`` and ``paired_differences.csv`` in ``out``."""
    columns = _columns(summaries)
    directions, mixed = _directions(runs, list(columns))
    pct = f"{100 * confidence:g}%"
    q = f"{100 * (1 + confidence) / 2:g}"
    tail = f"{100 * (1 - confidence) / 2:g}"
    lines = [
        "## Uncertainty across seeds",
        "",
        f"Per metric, over each method's runs (seeds): `n` (the runs with a value; `+k absent`: "
        f"runs without one), the mean, the sample standard deviation `std`, the {pct} Student-t "
        f"interval of the mean, `mean ± t({q}%, n-1) · std / √n`, and the {pct} percentile "
        f"bootstrap interval: the {tail}% and {q}% quantiles of the means of **{resamples} "
        f"resamples** of the runs with replacement, drawn with "
        f"`numpy.random.default_rng({seed})` (**bootstrap seed {seed}**). A method with one "
        "run has no interval (—). Paired differences `A - B` use the seeds both methods ran "
        '(runs matched by `metadata["seed"]`): the same intervals on the mean difference (the '
        "bootstrap resamples seeds, keeping pairs), and the number of shared seeds where A is "
        "better, where B is better, and ties. As CSV: `seed_statistics.csv`, "
        "`paired_differences.csv`.",
        "",
    ]
    unpaired = _unpaired(summaries)
    if unpaired and len(summaries) > 1:
        lines += [
            f"{unpaired} run(s) without a seed, or sharing their seed with another run of their "
            "method, are left out of the paired differences.",
            "",
        ]
    seeds = _all_seeds(summaries)
    summary_parts: list[tuple[dict[str, Any], str]] = []
    paired_parts: list[tuple[dict[str, Any], str]] = []
    shared: list[str] = []
    for key, title in columns.items():
        hib = directions[key]
        note = (
            " (the runs' scores differ in direction: the first run's is used)"
            if key in mixed
            else ""
        )
        stats = {s.method: s.stats[key] for s in summaries}
        lines += [
            f"### {title} ({_direction_text(hib)}){note}",
            "",
            summary_markdown(stats),  # escapes the method names
            "",
        ]
        lines += _caveat_block(_seed_caveats(list(_named_caveats(stats)), escape_markdown))
        summary_parts.append(({"metric": key, "higher_is_better": hib}, summary_csv(stats)))
        if len(summaries) < 2:
            continue
        pairs = paired_differences(
            summaries,
            key,
            higher_is_better=hib,
            confidence=confidence,
            resamples=resamples,
            seed=seed,
        )
        lines += [
            f"Paired differences of {title}, `A - B` over shared seeds ({_direction_text(hib)}: "
            '"A better" counts the seeds where A\'s value is '
            f"{'higher' if hib else 'lower'}):",
            "",
            paired_markdown(pairs),  # escapes the method names
            "",
        ]
        named = [(f"{a} - {b}", d.summary.caveat) for (a, b), d in pairs.items()]
        lines += _caveat_block(_seed_caveats(named, escape_markdown))
        paired_parts.append(({"metric": key}, paired_csv(pairs)))
        shared += [json.dumps([seeds[i] for i in d.seeds]) for d in pairs.values()]
    (out / "seed_statistics.csv").write_text(_prefixed_csv(summary_parts, []), encoding="utf-8")
    if paired_parts:
        (out / "paired_differences.csv").write_text(
            _prefixed_csv(paired_parts, shared), encoding="utf-8"
        )
    return lines


def _cost_section(summaries: Sequence[MethodSummary], out: Path) -> list[str]:
    """With runs that record a ``cost``: a table of each method's mean totals (markdown lines)
    and ``cost.csv``; nothing otherwise."""
    rows = []
    for s in summaries:
        counted = [(r, c) for r, c in ((r, run_cost(r.results)) for r in s.runs) if c is not None]
        costs = [c for _, c in counted]
        means: dict[str, float | None] = {}
        for key in COST_COLUMNS:
            values = [v for v in (c[key] for c in costs) if v is not None]
            means[key] = math.fsum(values) / len(values) if values else None
        kinds = (_field(getattr(r.results, "cost", None), "memory_kind") for r, _ in counted)
        memory = ", ".join(dict.fromkeys(str(k) for k in kinds if k is not None))
        rows.append((s.method, len(costs), means, memory))
    if not any(count for _, count, _, _ in rows):
        return []
    formats = {"peak_memory_bytes": ".1f", "model_size_efficiency": ".4f", "samples": ".1f"}
    formats |= {"optimizer_steps": ".1f", "train_seconds": ".2f", "eval_seconds": ".2f"}
    scale = {"peak_memory_bytes": 1 / 2**20}
    header = ["method", "runs with cost", *COST_COLUMNS.values(), "memory measured"]
    lines = [
        "## Cost",
        "",
        "Mean over each method's runs that record the cost of every stage (their `cost` "
        "totals: wall time of "
        "training and of the evaluation, samples and optimizer steps trained, peak memory, "
        "model-size efficiency) and what the peak memory measures (`cuda_max_allocated`: the "
        "GPU's allocated bytes, `process_peak_rss`: the process's resident set); n/a where none "
        "does.",
        "",
        "| " + " | ".join(header) + " |",
        "|---|---:|" + "---:|" * len(COST_COLUMNS) + "---|",
    ]
    csv_rows = []
    for method, count, means, memory in rows:
        cells = [
            "n/a" if v is None else format(v * scale.get(k, 1.0), formats[k])
            for k, v in means.items()
        ]
        shown = escape_markdown(printable(memory, 80)) if memory else "n/a"
        lines.append("| " + " | ".join([escape_markdown(method), str(count), *cells, shown]) + " |")
        csv_rows.append([method, count, *means.values(), memory])
    header = ["method", "runs_with_cost", *(f"{k}_mean" for k in COST_COLUMNS), "memory_kind"]
    (out / "cost.csv").write_text(csv_text(header, csv_rows), encoding="utf-8")
    return [*lines, "", f"No interval: {escape_markdown(_cost_reason(summaries))}.", ""]


def _cost_reason(summaries: Sequence[MethodSummary]) -> str:
    """Why the cost totals have no interval: the ``intervals`` section's ``unavailable["cost"]``
    of the first run that states it, else the same fact in the report's words."""
    for s in summaries:
        for r in s.runs:
            section = r.results.intervals
            if section is not None and "cost" in section.unavailable:
                return printable(section.unavailable["cost"], 300)
    return "measured (times, samples, memory), not estimated from test items"


def _reference_name(kind: str) -> str:
    return _REFERENCE_NAMES.get(kind) or f"{escape_markdown(printable(kind, 40))} reference"


def _reference_text(runs: Sequence[Run]) -> str:
    """What intransigence is measured against, from the runs' ``reference_kind``."""
    kinds = list(dict.fromkeys(k for k in (r.reference_kind for r in runs) if k is not None))
    if not kinds:
        return "a reference model's score (none recorded)"
    if len(kinds) == 1:
        return f"the score of the {_reference_name(kinds[0])}"
    return "the score of each run's reference (" + "; ".join(map(_reference_name, kinds)) + ")"


DEFAULT_SPREAD = "std"
"""What ``table.tex``'s ``±`` shows by default (``--spread``): the sample standard deviation."""
TABLE_FILE = "table.tex"
HTML_FILE = "report.html"


def _run_title(run: Run) -> str:
    online = run.results.online
    if run.results.num_tasks == 0 and online is not None:
        samples = online.windows[-1].stream_end if online.windows else 0
        return f"{run.group}, seed {run.seed} (online, {samples} stream samples)"
    stages = f"{run.results.stages_completed}/{run.results.num_tasks} stages"
    return f"{run.group}, seed {run.seed} ({stages})"


def _per_task_columns(
    summaries: Sequence[MethodSummary], *, confidence: float, resamples: int, seed: int
) -> tuple[list[LatexColumn], str] | None:
    """The final score per task of the primary matrix (``R[s-1, j]``), summarised over each
    method's runs, and the primary score's name; ``None`` when the runs differ in their number
    of tasks or in their primary score."""
    runs = [r for s in summaries for r in s.runs]
    if not runs:
        return None
    T = runs[0].results.num_tasks
    primary = runs[0].results.primary
    if any(
        r.results.num_tasks != T
        or r.results.primary.score != primary.score
        or r.results.primary.higher_is_better != primary.higher_is_better
        for r in runs
    ):
        return None
    names = runs[0].results.task_names
    final: dict[str, list[list[float | None]]] = {}  # method -> per run, per task
    for s in summaries:
        final[s.method] = []
        for r in s.runs:
            matrix = r.results.primary
            row = matrix.scores[-1] if matrix.num_stages else torch.full((T,), math.nan)
            final[s.method].append([_finite(v) for v in row.tolist()])
    columns = [
        LatexColumn(
            title=str(names[j]),
            higher_is_better=primary.higher_is_better,
            stats=[
                summarize(
                    [row[j] for row in final[s.method]],
                    confidence=confidence,
                    resamples=resamples,
                    seed=seed,
                )
                for s in summaries
            ],
            single=[_final_cell_interval(s, j) for s in summaries],
        )
        for j in range(T)
    ]
    return columns, primary.score


def _final_cell_interval(summary: MethodSummary, task: int) -> tuple[float, float] | None:
    """``(low, high)`` of the final primary cell ``R[s-1, task]`` of a method's one run, from
    its ``intervals`` section; ``None`` with more runs, or without it."""
    if len(summary.runs) != 1:
        return None
    results = summary.runs[0].results
    section = results.intervals
    held = None if section is None else section.matrices.get(results.primary_name)
    if held is None or results.primary.num_stages == 0:
        return None
    low, high = float(held.low[-1, task]), float(held.high[-1, task])
    return (low, high) if math.isfinite(low) and math.isfinite(high) else None


def _final_cell_notes(summaries: Sequence[MethodSummary], score: str) -> list[str]:
    """Why a one-run method's final cells (``--per-task`` in ``table.tex``) have no interval
    (one line per reason, plain text)."""
    found: dict[str, list[str]] = {}
    for s in summaries:
        results = s.runs[0].results
        section = results.intervals
        if len(s.runs) == 1 and (section is None or results.primary_name not in section.matrices):
            found.setdefault(_no_interval_reason(results, "", results.primary_name), []).append(
                s.method
            )
    return [
        f"final {score} per task ({', '.join(printable(m, 80) for m in methods)}): {why}"
        for why, methods in found.items()
    ]


def latex_summary(
    summaries: Sequence[MethodSummary],
    runs: Sequence[Run],
    *,
    spread: str = DEFAULT_SPREAD,
    per_task: bool = False,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> str:
    """``table.tex``: a booktabs table with one row per method and a column per metric
    (``continual_eval._latex_table.latex_table``: ``mean ± spread``, ``spread`` ``"std"``
    or ``"ci"``, the direction as an arrow, the best mean of each column in bold); with
    ``per_task``, also the final primary score on each task (``R[s-1, j]`` over the runs) when
    all runs have the same tasks and primary score."""
    columns = _columns(summaries)
    directions, _ = _directions(runs, list(columns))
    metric_columns = [
        LatexColumn(
            columns[k],
            directions[k],
            [s.stats[k] for s in summaries],
            [_single_run_interval(s, k) for s in summaries],
        )
        for k in columns
    ]
    groups = None
    all_columns = metric_columns
    notes = _missing_interval_notes(summaries)
    if per_task:
        found = _per_task_columns(summaries, confidence=confidence, resamples=resamples, seed=seed)
        if found is not None:
            tasks, score = found
            all_columns = [*metric_columns, *tasks]
            groups = [("Metrics", len(metric_columns)), (f"Final {score} per task", len(tasks))]
            notes += _final_cell_notes(summaries, score)
    return latex_table(
        [s.method for s in summaries],
        [len(s.runs) for s in summaries],
        all_columns,
        spread=spread,
        confidence=confidence,
        groups=groups,
        caption="Continual-learning metrics per method",
        notes=notes,
    )


def _run_lines(run: Run, out: Path) -> list[str]:
    """One run's section of ``report.md``: its matrices as tables, its intransigence, its
    pictures (drawn into ``out``), its held-out sets, its forgotten items (prediction files) and
    its class-incremental lines."""
    from continual_eval.loggers import format_matrix_table

    lines = [f"## {escape_markdown(_run_title(run))}", "", _code_span(str(run.path)), ""]
    if run.results.num_tasks == 0:  # an online run without tasks: no matrix to show
        return lines + online_run_lines(run, out, _plain_title, _run_title(run))
    pictures = _plot_run(run, out)
    lines += [format_matrix_table(_escaped_names(run.results), markdown=True), ""]
    lines += _matrix_interval_lines(run.results)
    extra = run_metrics(run.results)["intransigence"]
    if extra is not None and run.reference_kind is not None:
        ends = _run_metric_interval(run.results, "intransigence")
        shown = (
            f" [{ends[0]:.4f}, {ends[1]:.4f}]"
            if ends is not None
            else " (no interval: "
            + escape_markdown(_no_interval_reason(run.results, "intransigence"))
            + ")"
        )
        lines += [
            f"intransigence={extra:.4f}{shown} (against the {_reference_name(run.reference_kind)})",
            "",
        ]
    for picture in pictures:
        name = escape_markdown(picture.matrix)
        lines += [
            f"![{name}: R]({picture.heatmap.name}) "
            f"![{name}: trajectories]({picture.trajectories.name})",
            "",
        ]
    lines += held_out_run_lines(run.results, run.label, _run_title(run), out, _plain_for_plot)
    lines += forgotten_lines(run.results, run.path)
    lines += items_run_lines(run.results, run.label, _run_title(run), out, _plain_for_plot)
    lines += class_incremental_run_lines(run, out, _plain_for_plot)
    return lines + online_run_lines(run, out, _plain_title, _run_title(run))


def _matrix_interval_lines(results: ContinualResults) -> list[str]:
    """``report.md`` lines under a run's matrix tables: where the cells' intervals are (the
    heatmaps, ``intervals.matrices.<m>``), and for each matrix whose cells or metrics are
    printed without one, why (once per matrix)."""
    section = results.intervals
    shown, missing = [], []
    for name, matrix in results.matrices.items():
        held = None if section is None else section.matrices.get(name)
        if held is not None:
            shown.append(f"{escape_markdown(name)} ({_cell_interval_label(results, name)})")
            keys = [k for k in METRIC_KEYS if _finite(matrix.metrics.get(k)) is not None]
            lost = [k for k in keys if k not in held.metrics]
            if lost:
                why = "; ".join(f"{k}: {_no_interval_reason(results, k, name)}" for k in lost)
                missing.append(f"{escape_markdown(name)}: {escape_markdown(why)}")
        else:
            why = _no_interval_reason(results, "", name)
            missing.append(f"{escape_markdown(name)}: {escape_markdown(why)}")
    lines = []
    if shown:
        lines += [
            "Cell intervals: on each heatmap below and in results.json "
            f"(`intervals.matrices`): {', '.join(shown)}.",
            "",
        ]
    if missing:
        lines += ["Printed above without an interval:", ""]
        lines += _caveat_block(missing)
    return lines


def write_report(
    paths: Sequence[str | Path],
    out_dir: str | Path,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    bootstrap_seed: int = BOOTSTRAP_SEED,
    spread: str = DEFAULT_SPREAD,
    per_task: bool = False,
    html_report: bool = True,
) -> Path:
    """Draw and tabulate the runs found in ``paths`` into ``out_dir``; returns ``report.md``.

    ``confidence``, ``resamples`` and ``bootstrap_seed``: the intervals across seeds;
    ``spread`` (``"std"`` or ``"ci"``) and ``per_task``: what ``table.tex`` shows
    ([`latex_summary`][continual_eval.report.latex_summary]); ``html_report``: also write
    ``report.html`` (needs plotly: without it one line in ``report.md`` says so)."""
    if spread not in SPREADS:
        raise ValueError(f"spread must be one of {', '.join(SPREADS)}, got {spread!r}")
    runs = find_runs(paths)
    summaries = summarise(runs, confidence=confidence, resamples=resamples, seed=bootstrap_seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pct = f"{100 * confidence:g}%"
    lines = ["# Continual-evaluation report", ""]
    lines += [
        f"{len(runs)} run(s). Metrics per method: mean over its runs; `±` = sample standard "
        "deviation across runs (seeds), shown only with two or more runs; `runs` = n, and "
        "`(n=k)` where only k runs have a value. Peak forgetting, GEM BWT/FWT; intransigence = "
        f"{_reference_text(runs)} minus R[j, j] (reversed for a lower-is-better score; n/a "
        "without a reference). The columns are each run's primary matrix; every matrix is "
        "tabulated under its run.",
        "",
        markdown_table(summaries),
        "",
    ]
    note = _interval_note(summaries)
    if note is not None:
        lines += [escape_markdown(note), ""]
    missing = _missing_interval_notes(summaries)
    if missing:
        lines += ["Values of one run printed without an interval, and why:", ""]
        lines += _caveat_block([escape_markdown(m) for m in missing])
    if len(runs) > 0 and _plot_metric_panels(summaries, runs, out / "metrics.png"):
        lines += [
            "![metrics per method](metrics.png)",
            "",
            "One panel per metric, each with its own scale (↑ higher is better, ↓ lower is "
            f"better). Bars: mean over each method's runs (n in the legend). Error bars: the {pct} "
            "Student-t interval of the mean, drawn only where a method has two or more values; "
            "grey where a method has one run with per-item records: that run's interval from "
            "its test items (the tables' [low, high]).",
            "",
        ]
    _write_summary_csv(summaries, out / "summary.csv")
    (out / TABLE_FILE).write_text(
        latex_summary(
            summaries,
            runs,
            spread=spread,
            per_task=per_task,
            confidence=confidence,
            resamples=resamples,
            seed=bootstrap_seed,
        ),
        encoding="utf-8",
    )
    shown = "sample std" if spread == "std" else f"half-width of the {pct} Student-t interval"
    lines += [
        f"LaTeX table (booktabs, mean ± {shown}, best in bold): `{TABLE_FILE}`.",
        "",
    ]
    tables: list[PerTaskTable] = []
    if per_task:
        tables = per_task_tables(
            summaries,
            lambda values: summarize(
                values, confidence=confidence, resamples=resamples, seed=bootstrap_seed
            ),
            _no_interval_reason,
        )
        lines += per_task_markdown(tables, _cell, escape_markdown, pct)
    if len(runs) > 1:
        lines += _statistics(
            summaries,
            runs,
            out,
            confidence=confidence,
            resamples=resamples,
            seed=bootstrap_seed,
        )
    else:
        lines += ["One run: no interval across seeds.", ""]
    lines += _cost_section(summaries, out)
    lines += class_incremental_summary_lines(summaries, escape_markdown)
    lines += online_summary_lines(summaries, escape_markdown)
    for run in runs:
        lines += _run_lines(run, out)
    if html_report:
        lines += _write_html(runs, summaries, out, confidence=confidence, per_task=tables)
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report


def _write_html(
    runs: Sequence[Run],
    summaries: Sequence[MethodSummary],
    out: Path,
    *,
    confidence: float,
    per_task: Sequence[PerTaskTable] = (),
) -> list[str]:
    """``report.html`` (``continual_eval._html_report``) and the lines of ``report.md`` that
    name it; without plotly, a line that names the extra instead. ``per_task``: the tables of
    ``--per-task``."""
    try:
        from continual_eval._html_report import _mean_std, _table, _text, html_report
        from continual_eval._per_task_report import per_task_html
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] != "plotly":
            raise
        return [
            f'`{HTML_FILE}` skipped: it needs plotly (`pip install "continual-eval[plot]"`).',
            "",
        ]
    columns = _columns(summaries)
    directions, _ = _directions(runs, list(columns))
    page = html_report(
        runs,
        summaries,
        columns,
        directions,
        confidence=confidence,
        seeds_text=_seeds,
        run_title=_run_title,
        single_interval=_single_run_interval,
        interval_note=_interval_note(summaries),
        missing_notes=_missing_interval_notes(summaries),
        per_task=per_task_html(per_task, _mean_std, _text, _table, f"{100 * confidence:g}%"),
        seed_caveats=lambda named: _seed_caveats(named, str),
        interval_label=_cell_interval_label,
    )
    (out / HTML_FILE).write_text(page, encoding="utf-8")
    return [
        f"Interactive report (one self-contained file, opens offline): `{HTML_FILE}`.",
        "",
    ]


def _escaped_names(results: ContinualResults) -> ContinualResults:
    """A copy of ``results`` whose task names, matrix names and score names are
    Markdown-escaped (for the tables of ``report.md``)."""
    matrices = {  # the keys stay; the tables show each matrix's own name
        name: replace(matrix, name=escape_markdown(name), score=escape_markdown(matrix.score))
        for name, matrix in results.matrices.items()
    }
    names = tuple(escape_markdown(name) for name in results.task_names)
    return replace(results, task_names=names, matrices=matrices)


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
        description="Heatmaps, trajectories, a metric chart with Student-t intervals, tables "
        "of mean ± spread, intervals across seeds (Student-t and percentile bootstrap) and "
        "paired differences between methods, from the results.json files "
        "ContinualEvalCallback wrote.",
    )
    parser.add_argument("runs", nargs="+", help="run directories (or folders holding several)")
    parser.add_argument(
        "--out", default=None, help="output folder (default: <common parent of the runs>/report)"
    )
    parser.add_argument(
        "--confidence",
        type=float,
        default=DEFAULT_CONFIDENCE,
        help="level of the intervals across seeds (default: %(default)s)",
    )
    parser.add_argument(
        "--resamples",
        type=int,
        default=BOOTSTRAP_RESAMPLES,
        help="bootstrap resamples (default: %(default)s)",
    )
    parser.add_argument(
        "--bootstrap-seed",
        type=int,
        default=BOOTSTRAP_SEED,
        help="seed of the bootstrap's numpy.random.default_rng (default: %(default)s)",
    )
    parser.add_argument(
        "--spread",
        choices=SPREADS,
        default=DEFAULT_SPREAD,
        help="what table.tex shows after ±: the sample standard deviation (std) or the "
        "half-width of the Student-t interval of the mean at --confidence (ci) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--per-task",
        action="store_true",
        help="table.tex: also a column per task (the final primary score, over the runs); "
        "report.md / report.html: a table per method of each task's BWT, forgetting, FWT and "
        "intransigence (one run: with its interval from its test items)",
    )
    parser.add_argument("--no-html", action="store_true", help="do not write report.html")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    out = Path(args.out) if args.out else _default_out(args.runs)
    try:
        report = write_report(
            args.runs,
            out,
            confidence=args.confidence,
            resamples=args.resamples,
            bootstrap_seed=args.bootstrap_seed,
            spread=args.spread,
            per_task=args.per_task,
            html_report=not args.no_html,
        )
    except InvalidResultsError as err:  # a file that is not a valid results.json
        print(f"continual-eval report: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:  # the figures' extra is not installed
        if (err.name or "").split(".")[0] != "matplotlib":
            raise
        print(
            "continual-eval report: the figures need matplotlib: "
            'pip install "continual-eval[plot]" (or "continual-eval[experiments]")',
            file=sys.stderr,
        )
        return 1
    except (OSError, ValueError) as err:  # nothing found, unreadable, output not writable
        print(f"continual-eval report: {printable(str(err), 500)}", file=sys.stderr)
        return 1
    print(report.read_text(encoding="utf-8").split("\n## ")[0])
    print(f"report written to {report}")
    return 0

"""Send a stage's score matrices and metrics to every logger of a Trainer.

Every function takes the run's [`ContinualResults`][continual_eval.ContinualResults] (a
``results.json`` document is accepted too and read into one). Every logger gets the scalars
through ``log_metrics`` (step = stage index), except W&B: its stage rows carry the stage counter
``{prefix}stage``, defined as their step metric (``define_metric``), so that its
``trainer/global_step`` column, which the training rows fill, never goes backwards. Where the
logger can show more, every matrix also goes out as a heatmap and as a table:

================  ===================================  ==========================================
logger            heatmap                              table
================  ===================================  ==========================================
TensorBoard       ``add_figure``                       ``add_text`` (markdown)
Weights & Biases  ``wandb.Image``                      ``wandb.Table`` (one ``log`` per stage)
MLflow            ``log_figure`` (one PNG per stage)   ``log_dict`` (``results.json``)
CSV               --                                   ``scores.csv``, ``scores_<name>.csv`` in the
                                                       logger's ``log_dir``
================  ===================================  ==========================================

Keys. The primary matrix keeps the keys of a single-scorer run; every other matrix carries its
name (``{prefix}`` is the callback's ``prefix``, ``continual/`` by default):

* metrics: ``{prefix}acc|bwt|fwt|forgetting`` for a primary accuracy matrix, else
  ``{prefix}{name}/acc|bwt|fwt|forgetting``;
* the row of R: ``{prefix}{score}/{task}`` (primary), ``{prefix}{name}/{task}`` (others);
* the baseline: ``{prefix}baseline/{task}`` (primary), ``{prefix}{name}/baseline/{task}``;
* per-step evaluations: ``{prefix}step/{task}`` (primary), ``{prefix}{name}/step/{task}``;
* stability: ``{prefix}min_acc``, ``{prefix}wc_acc``, ``{prefix}gap_depth/{task}``,
  ``{prefix}gap_recovery_steps/{task}`` (primary), the same under ``{prefix}{name}/``; with
  ``item_records`` their intervals as ``.../lo`` and ``.../hi`` (min-ACC, WC-ACC, the gap depth
  and recovery steps; at the last recorded stage; a recovery's ``hi`` is left out where the
  interval reaches "not recovered within the stage", both ends where it starts there);
* plasticity (per-step evaluation, after the last stage recorded): ``{prefix}anytime_acc``,
  ``{prefix}lca``, ``{prefix}auc_fwt`` (primary), the same under ``{prefix}{name}/``; with
  ``item_records`` each with ``.../lo`` and ``.../hi``;
* against the callback's ``reference=``: ``{prefix}intransigence``, ``{prefix}fwt_isolated``;
* cost of the stage: ``{prefix}cost/train_seconds``, ``eval_seconds``, ``peak_memory_bytes``,
  ``parameters``, ``samples``, ``optimizer_steps``, ``replay_memory`` (when the module reports
  it) and ``model_size_efficiency`` (over the stages so far);
* class-incremental (``task_classes=``): ``{prefix}class_il/seen_acc_sample``,
  ``seen_acc_task``, ``old_acc``, ``new_acc``, ``amca``, ``recency_prediction_share``,
  ``recency_sample_share``, ``class_forgetting`` (see
  [`scalars`][continual_eval.results.ClassIncrementalResults.scalars]) and the
  confusion matrix in arrival order as the figure ``{prefix}class_il/confusion``; with
  ``item_records`` their intervals as ``.../lo`` and ``.../hi`` (Wilson: ``seen_acc_sample``,
  ``old_acc``, ``new_acc``, ``recency_prediction_share``, every stage; the paired bootstrap:
  ``seen_acc_task``, ``amca``, ``class_forgetting``, at the last stage);
* figures: ``{prefix}{score}_matrix`` and ``{prefix}{score}_curves`` (primary),
  ``{prefix}{name}_matrix`` and ``{prefix}{name}_curves``.

With per-step evaluation (``eval_every_n_steps``), `log_step` sends every scorer's scores
at the callback's cumulative step (whole test sets: the per-step evaluations and every stage end,
one value per step, as in ``results.json``'s curves; with ``StepEvaluation(subset=n)`` the per-step
evaluations go to ``.../step_subset/{task}`` instead), and every stage also logs min-ACC, WC-ACC
and the stability gap of the task before it (``gap_depth/{task}``, ``gap_recovery_steps/{task}``)
at step = stage; each matrix's step-curves figure goes where the heatmap goes and to
``accuracy_curves.png`` (primary) or ``curves_<name>.png`` in the results directory.

Call these on global rank 0 only (Lightning's logger methods are rank-zero-only anyway).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import math
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.loggers import (
    CSVLogger,
    Logger,
    MLFlowLogger,
    TensorBoardLogger,
    WandbLogger,
)

from continual_eval._run_warnings import warn_once
from continual_eval.functional.family import METRIC_KEYS
from continual_eval.results import ContinualResults, MatrixResults, Plasticity
from continual_eval.results.class_incremental import class_incremental_scalars
from continual_eval.results.files import (
    ResultsWriteError,
    replace_atomically,
    scores_csv_name,
    write_failed,
    write_scores_csv,
)
from continual_eval.results.intervals import MatrixIntervals, Transitions
from continual_eval.results.schema import printable

__all__ = [
    "CURVES_PNG",
    "curves_png_name",
    "format_matrix_table",
    "log_baseline",
    "log_stage",
    "log_step",
    "refuse_key_collisions",
    "stage_key_collisions",
    "stage_line",
    "stage_scalars",
    "step_scalars",
]

CURVES_PNG = "accuracy_curves.png"
_GAP_TAGS = (("depth", "gap_depth"), ("recovery_steps", "gap_recovery_steps"))
#: the fields of a stage's cost logged as ``{prefix}cost/{field}``
_COST_KEYS = (
    "train_seconds",
    "eval_seconds",
    "peak_memory_bytes",
    "parameters",
    "samples",
    "optimizer_steps",
    "replay_memory",
)


def _as_results(results: ContinualResults | Mapping[str, Any]) -> ContinualResults:
    """``results`` itself, or a ``results.json`` document read into
    [`ContinualResults`][continual_eval.ContinualResults]."""
    if isinstance(results, ContinualResults):
        return results
    return ContinualResults.from_dict(results, validate=False)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _fmt(value: float | None, digits: int = 4) -> str:
    return f"{value:.{digits}f}" if _finite(value) else ""


def _cells(values: torch.Tensor) -> list[float | None]:
    """A row as JSON-like cells (``None`` where NaN/inf)."""
    return [v if math.isfinite(v) else None for v in values.tolist()]


def curves_png_name(name: str, primary: bool) -> str:
    """The step-curves picture in the results directory: `CURVES_PNG` for the primary
    matrix, ``curves_<name>.png`` for the others."""
    return CURVES_PNG if primary else f"curves_{name}.png"


def _metric_base(results: ContinualResults, name: str, prefix: str) -> str:
    """Key prefix of a matrix's metrics: ``{prefix}`` for the primary accuracy matrix (the keys
    ``{prefix}acc`` ... of a single-scorer run), else ``{prefix}{name}/``."""
    primary = name == results.primary_name
    return prefix if primary and results[name].score == "accuracy" else f"{prefix}{name}/"


def _scorer_base(results: ContinualResults, name: str, prefix: str) -> str:
    """Key prefix of a matrix's baseline, per-step and stability values: ``{prefix}`` for the
    primary matrix, else ``{prefix}{name}/``."""
    return prefix if name == results.primary_name else f"{prefix}{name}/"


def format_matrix_table(
    results: ContinualResults | Mapping[str, Any], *, markdown: bool = False
) -> str:
    """Every matrix (baseline row, one row per stage) and its metrics as compact text tables;
    with an ``intervals`` section (``item_records=``) each metric it gives an interval for is
    followed by it, ``acc=0.8641 [0.8308, 0.8961]``, and the line names the interval."""
    results = _as_results(results)
    named = len(results.matrices) > 1
    section = results.intervals
    return "\n\n".join(
        _format_one_table(
            results,
            matrix,
            markdown=markdown,
            named=named,
            held=None if section is None else section.matrices.get(key),
        )
        for key, matrix in results.matrices.items()
    )


def _metric_text(key: str, value: float | None, held: Any) -> str:
    """``key=value`` (``--``: absent), then ``[low, high]`` where ``held`` (the matrix's
    intervals) has a finite interval of this metric with the same estimate."""
    text = f"{key}={_fmt(value) or '--'}"
    found = None if held is None else held.metrics.get(key)
    if found is None or not _finite(value):
        return text
    estimate, low, high = found
    assert value is not None
    if _finite(low) and _finite(high) and math.isclose(estimate, value, rel_tol=1e-6, abs_tol=1e-9):
        text += f" [{low:.4f}, {high:.4f}]"
    return text


def _has_intervals(held: Any, metrics: Mapping[str, float]) -> bool:
    """Whether `_metric_text` writes an interval for one of ``metrics``."""
    return any(_metric_text(k, v, held).endswith("]") for k, v in metrics.items())


def _format_one_table(
    results: ContinualResults,
    matrix: MatrixResults,
    *,
    markdown: bool,
    named: bool,
    held: Any = None,
) -> str:
    header = ["stage", *results.task_names]
    rows = [["baseline", *(_fmt(v) for v in matrix.baseline.tolist())]]
    rows += [[str(i), *(_fmt(v) for v in row)] for i, row in enumerate(matrix.scores.tolist())]
    metrics = matrix.metrics
    # an absent metric (a cell it reads was not evaluated) prints "--", never an empty value
    summary = "  ".join(_metric_text(k, metrics.get(k), held) for k in METRIC_KEYS if k in metrics)
    if held is not None and _has_intervals(held, metrics):
        assert results.intervals is not None
        method = printable(results.intervals.method, 80)
        if markdown:
            from continual_eval._markdown import escape_markdown

            method = escape_markdown(method)
        ends = "\\[low, high\\]" if markdown else "[low, high]"
        summary += (
            f"  ({ends}: {100 * results.intervals.confidence:g}% {method}, test-set noise of "
            "this run)"
        )
    score = matrix.score
    if named:
        direction = "" if matrix.higher_is_better else ", lower is better"
        score = f"{matrix.name} ({score}{direction})"
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines) + f"\n\n{score}; {summary}"
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    lines = [
        "  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *rows]
    ]
    return (
        f"{score} R[i, j] (row: after stage i; column: task j)\n"
        + "\n".join(lines)
        + f"\n{summary}"
    )


def stage_line(results: ContinualResults, stage: int) -> str:
    """The line printed after stage ``stage`` (``verbose``): its place in the sequence, the
    primary matrix's finite metrics and how long the stage's evaluation took (when its cost is
    recorded)."""
    metrics = results.primary.metrics
    cost = results.cost.at(stage) if results.cost is not None else None
    took = "" if cost is None else f"  (evaluation {cost.eval_seconds:.2f} s)"
    return (
        f"[continual-eval] stage {stage + 1}/{results.num_tasks} ({results.task_names[stage]}; "
        f"row {stage} of R): "
        + "  ".join(f"{k}={v:.4f}" for k, v in metrics.items() if math.isfinite(v))
        + took
    )


def stage_scalars(
    results: ContinualResults | Mapping[str, Any], stage: int, *, prefix: str = "continual/"
) -> dict[str, float]:
    """Scalars of ``stage`` for every matrix: its metrics after that stage, the scores of row
    ``stage`` and, with per-step evaluation, min-ACC, WC-ACC and the stability gap of the task
    before it.

    The metrics of the primary accuracy matrix are ``{prefix}acc|bwt|fwt|forgetting``; those of
    every other matrix carry its name, ``{prefix}{name}/acc|bwt|fwt|forgetting`` (``metric=``
    names its matrix by the score, e.g. ``MulticlassF1Score``), so an F1 average is never logged
    as accuracy. Per-task scores are ``{prefix}{score}/{task}`` for the primary matrix and
    ``{prefix}{name}/{task}`` for the others; stability values are ``{prefix}min_acc`` ... for the
    primary matrix and ``{prefix}{name}/min_acc`` ... for the others. Undefined values (not
    evaluated, NaN) are left out rather than logged as 0.
    """
    results = _as_results(results)
    scalars: dict[str, float] = {}
    names = results.task_names
    intervals = results.intervals
    for name, matrix in results.matrices.items():
        primary = name == results.primary_name
        base = _metric_base(results, name, prefix)
        logged = {m: v for m, v in matrix.metrics_at(stage).items() if _finite(v)}
        scalars |= {f"{base}{m}": v for m, v in logged.items()}
        tasks = f"{prefix}{matrix.score}/" if primary else f"{prefix}{name}/"
        if stage < matrix.num_stages:
            for task, value in zip(names, matrix.scores[stage].tolist(), strict=True):
                if _finite(value):
                    scalars[f"{tasks}{task}"] = value
        # the intervals of the stages recorded (item_records): beside the last stage's scalars
        held = None if intervals is None else intervals.matrices.get(name)
        if held is not None and stage == matrix.num_stages - 1:
            scalars |= _interval_scalars(held, logged, base, tasks, names, stage)
        moves = None if results.items is None else results.items.transitions.get(name)
        if moves is not None and stage < moves.right_to_wrong.shape[0]:
            scalars |= _transition_scalars(moves, base, names, stage)
        stability = matrix.stability
        if stability is None:
            continue
        base = _scorer_base(results, name, prefix)
        for key in ("min_acc", "wc_acc"):
            values = getattr(stability, key)
            if stage < len(values) and _finite(float(values[stage])):
                scalars[f"{base}{key}"] = float(values[stage])
        for key, tag in _GAP_TAGS:
            values = stability.per_task.get(key)
            if values is not None and 1 <= stage <= len(values):
                value = float(values[stage - 1])
                if _finite(value):
                    scalars[f"{base}{tag}/{names[stage - 1]}"] = value
        if held is not None and stage == matrix.num_stages - 1:
            scalars |= _step_interval_scalars(held, base, names, stage)
    scalars |= _plasticity_scalars(results, stage, prefix)
    scalars |= _reference_scalars(results, stage, prefix)
    scalars |= _cost_scalars(results, stage, prefix)
    scalars |= class_incremental_scalars(results, stage, prefix)
    scalars |= _class_il_interval_scalars(results, stage, prefix)
    scalars |= held_out_scalars(results, stage, prefix)
    scalars[f"{prefix}stage"] = float(stage)
    return scalars


def held_out_scalars(results: ContinualResults, stage: int, prefix: str) -> dict[str, float]:
    """``{prefix}held_out/{set}/{name}`` (the score after ``stage``; ``stage=-1``: the baseline)
    and ``.../{name}/delta`` (against the baseline) of every matrix ``name`` and held-out set."""
    held_out = results.held_out
    if held_out is None or stage >= held_out.num_stages:
        return {}
    scalars: dict[str, float] = {}
    for name in held_out.scores:
        values = held_out.baseline[name] if stage < 0 else held_out.scores[name][stage]
        deltas = None if stage < 0 else held_out.delta(name)[stage].tolist()
        for k, (h, value) in enumerate(zip(held_out.names, values.tolist(), strict=True)):
            if _finite(value):
                scalars[f"{prefix}held_out/{h}/{name}"] = value
            if deltas is not None and _finite(deltas[k]):
                scalars[f"{prefix}held_out/{h}/{name}/delta"] = deltas[k]
    return scalars | _held_out_interval_scalars(results, stage, prefix)


def _class_il_interval_scalars(
    results: ContinualResults, stage: int, prefix: str
) -> dict[str, float]:
    """``{prefix}class_il/seen_acc_sample|old_acc|new_acc|recency_prediction_share/lo|hi`` of
    ``stage`` (Wilson, from the confusion counts) and, where the paired bootstrap over the items
    and their labels was made (the results of a finished run),
    ``.../seen_acc_task|amca|class_forgetting/lo|hi`` (the values logged as ``seen_acc_task``,
    ``amca`` and ``class_forgetting``), where the ``intervals`` section holds them."""
    held = None if results.intervals is None else results.intervals.class_incremental
    if held is None or not 0 <= stage < held.seen_accuracy[0].shape[0]:
        return {}
    out: dict[str, float] = {}
    parts = [
        ("seen_acc_sample", held.seen_accuracy),
        ("old_acc", held.old_accuracy),
        ("new_acc", held.new_accuracy),
    ]
    if held.recency_prediction_share is not None:
        parts.append(("recency_prediction_share", held.recency_prediction_share))
    if held.paired is not None:
        per_stage = held.paired.per_stage
        parts += [
            ("seen_acc_task", per_stage["seen_accuracy_task"]),
            ("amca", per_stage["amca_per_stage"]),
            ("class_forgetting", per_stage["mean_class_forgetting_per_stage"]),
        ]
    for key, (_, low, high) in parts:
        out |= {
            f"{prefix}class_il/{key}/lo": float(low[stage]),
            f"{prefix}class_il/{key}/hi": float(high[stage]),
        }
    return {key: value for key, value in out.items() if _finite(value)}


def _held_out_interval_scalars(
    results: ContinualResults, stage: int, prefix: str
) -> dict[str, float]:
    """``.../{name}/lo|hi`` and ``.../{name}/delta/lo|hi`` of the held-out sets at ``stage``
    (``-1``: the baseline, no delta) where the ``intervals`` section holds them."""
    intervals = results.intervals
    if intervals is None or not intervals.held_out:
        return {}
    out: dict[str, float] = {}
    for name, held in intervals.held_out.items():
        if stage < 0:
            low, high, delta = held.baseline_low, held.baseline_high, None
        elif stage < held.low.shape[0]:
            low, high, delta = held.low[stage], held.high[stage], held.delta
        else:
            continue
        for k, h in enumerate(intervals.held_out_names):
            key = f"{prefix}held_out/{h}/{name}"
            out |= {f"{key}/lo": float(low[k]), f"{key}/hi": float(high[k])}
            if delta is not None:
                out |= {
                    f"{key}/delta/lo": float(delta[1][stage, k]),
                    f"{key}/delta/hi": float(delta[2][stage, k]),
                }
    return {key: value for key, value in out.items() if _finite(value)}


def _step_interval_scalars(
    held: MatrixIntervals, base: str, names: Sequence[str], stage: int
) -> dict[str, float]:
    """``{base}min_acc|wc_acc/lo|hi`` and ``{base}gap_depth|gap_recovery_steps/{task}/lo|hi``
    of ``stage`` (the last recorded), and ``{base}anytime_acc|lca|auc_fwt/lo|hi`` (item_records
    with per-step evaluations), where the ``intervals`` section holds them (an end that is NaN
    is left out: for the recovery, not recovered within the stage)."""
    out: dict[str, float] = {}
    steps = held.step_metrics
    for key in ("min_acc", "wc_acc"):
        if key in steps and stage < len(steps[key][1]):
            out |= {
                f"{base}{key}/lo": float(steps[key][1][stage]),
                f"{base}{key}/hi": float(steps[key][2][stage]),
            }
    for tag in ("gap_depth", "gap_recovery_steps"):
        gap = steps.get(tag)
        if gap is not None and 1 <= stage <= len(gap[1]):
            key = f"{base}{tag}/{names[stage - 1]}"
            out |= {f"{key}/lo": float(gap[1][stage - 1]), f"{key}/hi": float(gap[2][stage - 1])}
    for metric, tag in _PLASTICITY_TAGS:
        if metric in held.metrics:
            _, low, high = held.metrics[metric]
            out |= {f"{base}{tag}/lo": low, f"{base}{tag}/hi": high}
    return {key: value for key, value in out.items() if _finite(value)}


#: the plasticity intervals' names in ``intervals.matrices.*.metrics`` and their log tags
_PLASTICITY_TAGS = (
    ("anytime_accuracy", "anytime_acc"),
    ("lca", "lca"),
    ("auc_forward_transfer", "auc_fwt"),
)


def _plasticity_scalars(results: ContinualResults, stage: int, prefix: str) -> dict[str, float]:
    """``{prefix}anytime_acc``, ``{prefix}lca``, ``{prefix}auc_fwt`` (``{prefix}{name}/...`` for
    the other matrices) after the last recorded stage (they cover every completed stage)."""
    scalars: dict[str, float] = {}
    if stage != results.stages_completed - 1:
        return scalars
    for name, matrix in results.matrices.items():
        plasticity = matrix.plasticity
        if plasticity is None:
            continue
        base = _scorer_base(results, name, prefix)
        for key, value in _plasticity_values(plasticity):
            if _finite(value):
                scalars[f"{base}{key}"] = float(value)  # type: ignore[arg-type]
    return scalars


def stage_key_collisions(results: ContinualResults, prefix: str) -> list[str]:
    """The keys `stage_scalars` could give two different values in one stage (a task
    named like a metric, ``acc``; a second scorer named like the primary's score, ``accuracy``;
    a scorer named ``cost``), sorted; empty when every key is unique. Found from the names
    alone, before anything is measured."""
    names = results.task_names
    keys: list[str] = [f"{prefix}stage", f"{prefix}intransigence", f"{prefix}fwt_isolated"]
    keys += [f"{prefix}cost/{key}" for key in (*_COST_KEYS, "model_size_efficiency")]
    for name, matrix in results.matrices.items():
        primary = name == results.primary_name
        keys += [f"{_metric_base(results, name, prefix)}{m}" for m in METRIC_KEYS]
        tasks = f"{prefix}{matrix.score}/" if primary else f"{prefix}{name}/"
        keys += [f"{tasks}{task}" for task in names]
        base = _scorer_base(results, name, prefix)
        keys += [f"{base}{key}" for key in ("min_acc", "wc_acc", "anytime_acc", "lca", "auc_fwt")]
        keys += [f"{base}{tag}/{task}" for _, tag in _GAP_TAGS for task in names]
    return sorted(key for key, count in collections.Counter(keys).items() if count > 1)


def refuse_key_collisions(results: ContinualResults, prefix: str) -> None:
    """A ``ValueError`` naming the keys under which two different values would be logged
    (`stage_key_collisions`), before anything is measured."""
    collisions = stage_key_collisions(results, prefix)
    if collisions:
        raise ValueError(
            "ContinualEvalCallback: two different values would be logged under the same "
            f"key{'s' if len(collisions) > 1 else ''} {', '.join(map(repr, collisions))} (a task "
            "named like a metric, or a scorer named like the primary's score or `cost`): rename "
            "the task or the scorer. Nothing was trained"
        )


def _plasticity_values(plasticity: Plasticity) -> tuple[tuple[str, float | None], ...]:
    return (
        ("anytime_acc", plasticity.anytime_accuracy),
        ("lca", plasticity.lca),
        ("auc_fwt", plasticity.auc_forward_transfer),
    )


def _reference_scalars(results: ContinualResults, stage: int, prefix: str) -> dict[str, float]:
    """``{prefix}intransigence`` and ``{prefix}fwt_isolated`` after ``stage`` (where defined),
    and ``{prefix}intransigence/lo`` and ``.../hi`` at the last stage where the ``intervals``
    section holds them."""
    reference = results.reference_metrics
    scalars: dict[str, float] = {}
    if reference is None:
        return scalars
    for key in ("intransigence", "fwt_isolated"):
        values = reference.per_stage.get(key)
        if values is not None and stage < len(values) and _finite(float(values[stage])):
            scalars[f"{prefix}{key}"] = float(values[stage])
    # intransigence's paired interval (item_records with a reference of items): the last stage
    held = (
        None if results.intervals is None else results.intervals.matrices.get(results.primary_name)
    )
    ends = None if held is None else held.metrics.get("intransigence")
    if ends is not None and stage == results.primary.num_stages - 1:
        _, low, high = ends
        found = {f"{prefix}intransigence/lo": low, f"{prefix}intransigence/hi": high}
        scalars |= {key: value for key, value in found.items() if _finite(value)}
    return scalars


def _cost_scalars(results: ContinualResults, stage: int, prefix: str) -> dict[str, float]:
    """``{prefix}cost/...``: what ``stage`` cost, and the model-size efficiency up to it."""
    cost = results.cost.at(stage) if results.cost is not None else None
    if cost is None or results.cost is None:
        return {}
    scalars = {
        f"{prefix}cost/{key}": float(getattr(cost, key))
        for key in _COST_KEYS
        if getattr(cost, key) is not None
    }
    efficiency = results.cost.model_size_efficiency_at(stage)
    if _finite(efficiency):
        scalars[f"{prefix}cost/model_size_efficiency"] = float(efficiency)  # type: ignore[arg-type]
    return scalars


def step_scalars(
    task_names: Sequence[str],
    rows: Mapping[str, torch.Tensor] | torch.Tensor,
    *,
    prefix: str = "continual/",
    subset: bool = False,
) -> dict[str, float]:
    """The scores of an evaluation during training: ``rows`` maps every scorer to its row
    ``[T]``, the primary first (a tensor alone is the primary's row). Keys: ``{prefix}step/{task}``
    (whole test sets) or ``{prefix}step_subset/{task}`` (the fixed ``StepEvaluation`` subset) for
    the primary scorer, ``{prefix}{name}/step/{task}`` (``.../step_subset/...``) for the others; NaN
    left out."""
    if isinstance(rows, torch.Tensor):
        rows = {"": rows}
    key = "step_subset" if subset else "step"
    scalars: dict[str, float] = {}
    for k, (name, row) in enumerate(rows.items()):
        base = prefix if k == 0 else f"{prefix}{name}/"
        for task, value in zip(task_names, row.tolist(), strict=True):
            if math.isfinite(value):
                scalars[f"{base}{key}/{task}"] = float(value)
    return scalars


def log_step(
    loggers: Sequence[Logger],
    task_names: Sequence[str],
    rows: Mapping[str, torch.Tensor] | torch.Tensor,
    step: int,
    *,
    prefix: str = "continual/",
    subset: bool = False,
) -> None:
    """Log an evaluation during training (every scorer's row, see `step_scalars`) at
    ``step`` (no ``save()``: the stage end flushes)."""
    scalars = step_scalars(task_names, rows, prefix=prefix, subset=subset)
    if scalars:
        for logger in loggers:
            logger.log_metrics(scalars, step=step)


def log_baseline(
    loggers: Sequence[Logger],
    results: ContinualResults | Mapping[str, Any],
    *,
    prefix: str = "continual/",
    results_dir: str | Path | None = None,
) -> None:
    """Log every matrix's untrained scores at step 0: ``{prefix}baseline/{task}`` for the primary
    matrix, ``{prefix}{name}/baseline/{task}`` for the others, ``{prefix}held_out/{set}/{name}``
    for the held-out sets. ``results_dir``: the run's results directory (named by a write
    error)."""
    results = _as_results(results)
    scalars = {
        f"{_scorer_base(results, name, prefix)}baseline/{task}": value
        for name, matrix in results.matrices.items()
        for task, value in zip(results.task_names, matrix.baseline.tolist(), strict=True)
        if math.isfinite(value)
    } | held_out_scalars(results, -1, prefix)
    for logger in loggers:
        with _logger_writes(logger, results, results_dir):
            if scalars:
                logger.log_metrics(scalars, step=0)
            logger.save()


@contextlib.contextmanager
def _logger_writes(
    logger: Logger, results: ContinualResults, results_dir: str | Path | None
) -> Iterator[None]:
    """A file a logger cannot write (a full disk: its CSV, its copy of ``scores.csv``) is the
    one-line `ResultsWriteError` naming it, what the results directory holds and how to resume
    (not a bare ``OSError`` without a file name); a network error of a remote logger passes."""
    try:
        yield
    except (ResultsWriteError, ConnectionError, TimeoutError):
        raise
    except OSError as err:
        if err.errno is None:
            raise
        log_dir = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None)
        kind = type(logger).__name__
        if err.filename:
            path, what = Path(os.fsdecode(err.filename)), f" (written by the {kind})"
        else:  # a failed write() names no file: the logger's directory, then
            path, what = Path(log_dir or ".") / "*", f" (a file of the {kind} in {log_dir})"
        raise write_failed(
            path,
            err,
            results.stages_completed,
            results_dir=results_dir if results_dir is not None else path.parent,
            what=what,
        ) from None


def _value_range(matrix: MatrixResults) -> tuple[float, float] | None:
    """The matrix's bounds as a colour/axis range, ``None`` (autoscale) when unbounded."""
    bounds = matrix.bounds
    if bounds is None or not all(math.isfinite(v) for v in bounds):
        return None
    return float(bounds[0]), float(bounds[1])


def _figure(results: ContinualResults, name: str) -> Any:
    """The heatmap of the matrix ``name``."""
    from continual_eval.plotting import plot_accuracy_matrix

    matrix = results[name]
    fig, _ = plot_accuracy_matrix(
        matrix.scores,
        matrix.baseline,
        task_names=results.task_names,
        title=f"{matrix.score} after stage {results.stages_completed - 1}",
        value_range=_value_range(matrix),
        value_label=matrix.score,
        higher_is_better=matrix.higher_is_better,
    )
    return fig


def _curves_figure(results: ContinualResults, name: str) -> Any:
    """The step curves of the matrix ``name``, a dashed line at each completed stage's end."""
    from continual_eval.functional.stability import boundary_indices
    from continual_eval.plotting import plot_accuracy_curves

    steps, stage, scores = results.curves(name)
    done = stage < results.stages_completed
    last = boundary_indices(stage[done]) if bool(done.any()) else stage[:0]
    boundaries = steps[last[last >= 0]]
    matrix = results[name]
    primary = name == results.primary_name
    fig, _ = plot_accuracy_curves(
        steps,
        scores,
        boundaries,
        task_names=results.task_names,
        ylabel=matrix.score,
        value_range=_value_range(matrix),
        title="Per-task accuracy during training (continual evaluation)"
        if primary and matrix.score == "accuracy"
        else f"Per-task {matrix.score} during training ({name})",
    )
    return fig


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _tags(results: ContinualResults, prefix: str, kind: str) -> dict[str, str]:
    """Figure tag of every matrix: ``{prefix}{score}_{kind}`` for the primary one (as in a
    single-scorer run), ``{prefix}{name}_{kind}`` for the others; name -> tag."""
    return {
        name: f"{prefix}{matrix.score}_{kind}"
        if name == results.primary_name
        else f"{prefix}{name}_{kind}"
        for name, matrix in results.matrices.items()
    }


def _interval_scalars(
    held: MatrixIntervals,
    logged: Mapping[str, float],
    base: str,
    tasks: str,
    names: Sequence[str],
    stage: int,
) -> dict[str, float]:
    """``{key}/lo`` and ``{key}/hi`` of every logged metric and score of row ``stage`` that has
    an interval (the paired bootstrap's, the cell's)."""
    out: dict[str, float] = {}
    for metric in logged:
        if metric in held.metrics:
            _, low, high = held.metrics[metric]
            out |= {f"{base}{metric}/lo": low, f"{base}{metric}/hi": high}
    rows = zip(names, held.low[stage].tolist(), held.high[stage].tolist(), strict=True)
    for task, low, high in rows:
        out |= {f"{tasks}{task}/lo": low, f"{tasks}{task}/hi": high}
    return {key: value for key, value in out.items() if _finite(value)}


def _transition_scalars(
    moves: Transitions, base: str, names: Sequence[str], stage: int
) -> dict[str, float]:
    """Row ``stage`` of the item transitions: ``{base}items/right_to_wrong`` and
    ``.../wrong_to_right`` (the tasks trained so far, against the previous evaluation) and
    ``{base}items/forgotten_once/{task}`` (the fraction of its items forgotten at least once)
    with its Wilson interval as ``.../lo`` and ``.../hi``."""
    out = {
        f"{base}items/right_to_wrong": float(moves.right_to_wrong[stage].nan_to_num(0.0).sum()),
        f"{base}items/wrong_to_right": float(moves.wrong_to_right[stage].nan_to_num(0.0).sum()),
    }
    fraction = moves.forgotten_once_fraction[stage].tolist()
    low, high = (bound[stage].tolist() for bound in moves.forgotten_once_interval)
    for task, value, lo, hi in zip(names, fraction, low, high, strict=True):
        key = f"{base}items/forgotten_once/{task}"
        out |= {key: value, f"{key}/lo": lo, f"{key}/hi": hi}
    return {key: value for key, value in out.items() if _finite(value)}


def log_stage(
    loggers: Sequence[Logger],
    results: ContinualResults | Mapping[str, Any],
    stage: int,
    *,
    prefix: str = "continual/",
    log_images: bool = True,
    results_dir: str | Path | None = None,
    whole_matrices: bool = True,
) -> None:
    """Log stage ``stage`` (scalars, a heatmap, a step-curves figure and a table per matrix) to
    every logger, then ``save()`` each one.

    ``results_dir`` is where the CSV files already live (the step-curves pictures are written
    there too); a CSVLogger elsewhere gets its own copy of the CSV files. ``whole_matrices=False``
    logs the stage's scalars only: the outputs whose size grows with the stages recorded
    (heatmaps, curve figures, matrix tables, copies of ``results.json`` and the CSV files) are
    left to the stages where the callback rebuilds ``results.json``.
    """
    results = _as_results(results)
    pictures = (
        log_images and whole_matrices and results.steps is not None and results_dir is not None
    )
    if not loggers and not pictures:
        return  # nothing to log to and no picture to write: no scalars made
    scalars = stage_scalars(results, stage, prefix=prefix)
    tags = _tags(results, prefix, "matrix")
    image_loggers = any(
        isinstance(lg, (TensorBoardLogger, WandbLogger, MLFlowLogger)) for lg in loggers
    )
    figures: dict[str, Any] = {}
    if (log_images and whole_matrices and image_loggers) or pictures:
        try:
            figures = _stage_figures(results, stage, prefix, results_dir, image_loggers)
        except ModuleNotFoundError as err:
            message = f"ContinualEvalCallback: no figure logged ({err})"
            warn_once(results.run_id, "no-figure", message)
    document = functools.cache(results.to_dict)  # built once, for the loggers that store it
    try:
        for logger in loggers:
            with _logger_writes(logger, results, results_dir):
                _log_stage_one(
                    logger,
                    results,
                    stage,
                    scalars,
                    tags,
                    figures,
                    document,
                    prefix=prefix,
                    results_dir=results_dir,
                    whole_matrices=whole_matrices,
                )
    finally:
        for figure in figures.values():
            import matplotlib.pyplot as plt

            plt.close(figure)


def _log_stage_one(
    logger: Logger,
    results: ContinualResults,
    stage: int,
    scalars: dict[str, float],
    tags: dict[str, str],
    figures: dict[str, Any],
    document: Callable[[], dict[str, Any]],
    *,
    prefix: str,
    results_dir: str | Path | None,
    whole_matrices: bool,
) -> None:
    """One logger's part of `log_stage`, then its ``save()``."""
    if whole_matrices:
        _log_stage_to(
            logger,
            results,
            stage,
            scalars,
            tags,
            figures,
            document,
            prefix=prefix,
            results_dir=results_dir,
        )
    elif isinstance(logger, WandbLogger):
        _log_wandb_stage_row(logger, scalars, stage, prefix)
    else:
        logger.log_metrics(scalars, step=stage)
    logger.save()


def _stage_figures(
    results: ContinualResults,
    stage: int,
    prefix: str,
    results_dir: str | Path | None,
    image_loggers: bool,
) -> dict[str, Any]:
    """Tag -> figure of the stage: every matrix's heatmap (for the loggers that take images),
    its step curves (also saved as ``curves_png_name`` in ``results_dir``) and the
    class-incremental confusion matrix."""
    tags, curves_tags = _tags(results, prefix, "matrix"), _tags(results, prefix, "curves")
    figures: dict[str, Any] = {}
    for name in results.matrices:
        if image_loggers:
            figures[tags[name]] = _figure(results, name)
        if results.steps is not None and results[name].step_scores is not None:
            fig = _curves_figure(results, name)
            figures[curves_tags[name]] = fig
            if results_dir is not None:
                Path(results_dir).mkdir(parents=True, exist_ok=True)
                path = Path(results_dir) / curves_png_name(name, name == results.primary_name)
                data = _png(fig)  # replaced atomically: a full disk leaves the last picture
                try:
                    replace_atomically(
                        path, functools.partial(Path.write_bytes, data=data), durable=False
                    )
                except OSError as err:
                    raise write_failed(path, err, results.stages_completed) from None
    section = results.class_incremental
    if image_loggers and section is not None and stage < section.num_stages:
        figures[f"{prefix}class_il/confusion"] = section.confusion_figure(stage)
    return figures


def _log_stage_to(
    logger: Logger,
    results: ContinualResults,
    stage: int,
    scalars: dict[str, float],
    tags: dict[str, str],
    figures: dict[str, Any],
    document: Callable[[], dict[str, Any]],
    *,
    prefix: str,
    results_dir: str | Path | None,
) -> None:
    """One logger's share of `log_stage` (what it can show of the stage)."""
    if isinstance(logger, WandbLogger):
        # one W&B row a stage, on the stage axis
        _log_wandb(logger, results, stage, tags, figures, scalars, prefix)
    else:
        logger.log_metrics(scalars, step=stage)
    if isinstance(logger, TensorBoardLogger):
        for tag, fig in figures.items():
            logger.experiment.add_figure(tag, fig, global_step=stage, close=False)
        primary_tag = tags[results.primary_name]
        table = format_matrix_table(results, markdown=True)
        logger.experiment.add_text(primary_tag, table, global_step=stage)
    elif isinstance(logger, MLFlowLogger):
        run_id = logger.run_id
        for tag, fig in figures.items():
            logger.experiment.log_figure(run_id, fig, f"{tag}_stage_{stage:03d}.png")
        logger.experiment.log_dict(run_id, document(), f"{prefix}results.json")
        if results_dir is not None:
            folder = prefix.rstrip("/") or None
            for csv_path in sorted(Path(results_dir).glob("scores*.csv")):
                logger.experiment.log_artifact(run_id, str(csv_path), folder)
    elif isinstance(logger, CSVLogger):
        log_dir = Path(logger.log_dir)
        if results_dir is None or log_dir.resolve() != Path(results_dir).resolve():
            for name in results.matrices:
                primary = name == results.primary_name
                path = log_dir / scores_csv_name(name, primary)
                try:
                    write_scores_csv(path, document(), None if primary else name)
                except OSError as err:
                    raise write_failed(
                        path,
                        err,
                        results.stages_completed,
                        results_dir=results_dir,
                        what=" (the CSVLogger's copy)",
                    ) from None


def _log_wandb(
    logger: WandbLogger,
    results: ContinualResults,
    stage: int,
    tags: Mapping[str, str],
    figures: Mapping[str, Any],
    scalars: Mapping[str, float],
    prefix: str,
) -> None:
    import wandb

    columns: list[Any] = ["stage", *results.task_names]
    payload: dict[str, Any] = dict(scalars)
    for name, matrix in results.matrices.items():
        data: list[list[Any]] = [["baseline", *_cells(matrix.baseline)]]
        data += [[str(i), *_cells(row)] for i, row in enumerate(matrix.scores)]
        payload[f"{tags[name]}_table"] = wandb.Table(columns=columns, data=data)
    for key, fig in figures.items():
        if fig is not None:
            from PIL import Image

            payload[key] = wandb.Image(Image.open(io.BytesIO(_png(fig))))
    _log_wandb_stage_row(logger, payload, stage, prefix)


#: per W&B run, the keys already given the stage axis (``define_metric`` once per key)
_WANDB_STAGE_KEYS: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def _log_wandb_stage_row(
    logger: WandbLogger, payload: Mapping[str, Any], stage: int, prefix: str
) -> None:
    """One W&B history row of stage ``stage``, plotted against ``{prefix}stage``.

    ``WandbLogger.log_metrics(..., step=stage)`` would write the stage into the
    ``trainer/global_step`` column, which the training rows fill with the global step (that
    column would go backwards); instead the row carries the stage counter ``{prefix}stage``
    and every key of it is defined (``define_metric``, once per run and key) with that counter as
    its step metric. W&B's own ``_step`` and ``trainer/global_step`` stay monotone.
    """
    from lightning.fabric.utilities.logger import _add_prefix

    join = logger.LOGGER_JOIN_CHAR
    row = _add_prefix({**payload, f"{prefix}stage": stage}, logger._prefix, join)
    (stage_key,) = _add_prefix({f"{prefix}stage": stage}, logger._prefix, join)
    run = logger.experiment
    try:
        defined = _WANDB_STAGE_KEYS.setdefault(run, set())
    except TypeError:  # a run object without weak references: define every time
        defined = set()
    if stage_key not in defined:
        run.define_metric(stage_key)  # its own axis, not trainer/global_step
        defined.add(stage_key)
    for key in row:
        if key not in defined:
            run.define_metric(key, step_metric=stage_key)
            defined.add(key)
    run.log(row)

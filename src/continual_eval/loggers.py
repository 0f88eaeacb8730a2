"""Send a stage's accuracy matrix and metrics to every logger of a Trainer.

Every logger gets the scalars through ``log_metrics`` (step = stage index). Where the logger can
show more, the matrix also goes out as a heatmap and as a table:

================  ===================================  ==========================================
logger            heatmap                              table
================  ===================================  ==========================================
TensorBoard       ``add_figure``                       ``add_text`` (markdown)
Weights & Biases  ``wandb.Image``                      ``wandb.Table`` (one ``log`` per stage)
MLflow            ``log_figure`` (one PNG per stage)   ``log_dict`` (``results.json``)
CSV               --                                   ``scores.csv`` in the logger's ``log_dir``
================  ===================================  ==========================================

With per-step evaluation (``eval_every_n_steps``), :func:`log_step` sends ``{prefix}step/{task}``
at the callback's cumulative step (whole test sets: the per-step evaluations and every stage end,
one value per step, as in ``results.json``'s curves; with ``step_eval_subset`` the per-step
evaluations go to ``{prefix}step_subset/{task}`` instead), and every stage also logs
``{prefix}min_acc``, ``{prefix}wc_acc`` and the stability gap of the task before it
(``{prefix}gap_depth/{task}``, ``{prefix}gap_recovery_steps/{task}``) at step = stage; the per-task
curves figure goes where the heatmap goes and to ``accuracy_curves.png`` in the results directory.

Call these on global rank 0 only (Lightning's logger methods are rank-zero-only anyway).
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Mapping, Sequence
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

from continual_eval.results import (
    METRIC_KEYS,
    matrix_key,
    results_to_curves,
    results_to_tensors,
    write_scores_csv,
)

__all__ = [
    "CURVES_PNG",
    "format_matrix_table",
    "log_baseline",
    "log_stage",
    "log_step",
    "stage_scalars",
    "step_scalars",
]

CURVES_PNG = "accuracy_curves.png"


def _fmt(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def matrix_sections(results: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(name, section)`` of every score matrix of a results document, the primary first (a
    version-1 document has one, the top level)."""
    matrices = results.get("matrices")
    if matrices:
        return list(matrices.items())
    score = results.get("conventions", {}).get("score", "accuracy")
    return [(matrix_key(score), {**results, "score": score})]


def _matrix_base(name: str, section: Mapping[str, Any], primary: bool, prefix: str) -> str:
    """Key prefix of a matrix's metrics: ``{prefix}`` for the primary accuracy matrix (the keys
    ``{prefix}acc`` ... of version 1), else ``{prefix}{name}/``."""
    return prefix if primary and section["score"] == "accuracy" else f"{prefix}{name}/"


def format_matrix_table(results: Mapping[str, Any], *, markdown: bool = False) -> str:
    """Every matrix (baseline row, one row per stage) and its metrics as compact text tables."""
    sections = matrix_sections(results)
    return "\n\n".join(
        _format_one_table(results, name, section, markdown=markdown, named=len(sections) > 1)
        for name, section in sections
    )


def _format_one_table(
    results: Mapping[str, Any],
    name: str,
    section: Mapping[str, Any],
    *,
    markdown: bool,
    named: bool,
) -> str:
    names = list(results["task_names"])
    header = ["stage", *names]
    rows = [["baseline", *(_fmt(v) for v in section["baseline"])]]
    rows += [[str(i), *(_fmt(v) for v in row)] for i, row in enumerate(section["scores"])]
    metrics = section.get("metrics", {})
    summary = "  ".join(f"{k}={_fmt(metrics.get(k))}" for k in METRIC_KEYS if k in metrics)
    score = section.get("score", "score")
    if named:
        direction = "" if section.get("higher_is_better", True) else ", lower is better"
        score = f"{name} ({score}{direction})"
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


def stage_scalars(
    results: Mapping[str, Any], stage: int, *, prefix: str = "continual/"
) -> dict[str, float]:
    """Scalars of ``stage``: the four metrics and the per-task scores of row ``stage``.

    The metrics of the primary accuracy matrix are ``{prefix}acc|bwt|fwt|forgetting``; those of
    every other matrix carry its name, ``{prefix}{name}/acc|bwt|fwt|forgetting`` (``metric=``
    names its matrix by the score, e.g. ``MulticlassF1Score``), so an F1 average is never logged
    as accuracy. Per-task scores are ``{prefix}{score}/{task}`` for the primary matrix and
    ``{prefix}{name}/{task}`` for the others. Undefined values (not evaluated, NaN) are left
    out rather than logged as 0.
    """
    scalars: dict[str, float] = {}
    for k, (key, section) in enumerate(matrix_sections(results)):
        base = _matrix_base(key, section, k == 0, prefix)
        scalars |= {f"{base}{m}": v for m, v in section["metrics"].items() if v is not None}
        # per-task keys: {prefix}{score}/{task} for the primary matrix (as in version 1)
        tasks = f"{prefix}{section['score']}/" if k == 0 else f"{prefix}{key}/"
        for name, value in zip(results["task_names"], section["scores"][stage], strict=True):
            if value is not None:
                scalars[f"{tasks}{name}"] = value
    scalars[f"{prefix}stage"] = float(stage)
    stability = results.get("stability")
    if stability is not None:
        for key in ("min_acc", "wc_acc"):
            values = stability[key]
            if stage < len(values) and values[stage] is not None:
                scalars[f"{prefix}{key}"] = values[stage]
        per_task = stability["per_task"]
        if 1 <= stage <= len(per_task["depth"]):
            name = results["task_names"][stage - 1]
            for key, tag in (("depth", "gap_depth"), ("recovery_steps", "gap_recovery_steps")):
                value = per_task[key][stage - 1]
                if value is not None:
                    scalars[f"{prefix}{tag}/{name}"] = value
    return scalars


def step_scalars(
    task_names: Sequence[str],
    row: torch.Tensor,
    *,
    prefix: str = "continual/",
    subset: bool = False,
) -> dict[str, float]:
    """``{prefix}step/{task}`` (whole test sets) or ``{prefix}step_subset/{task}`` (the fixed
    ``step_eval_subset``) for the tasks scored at an evaluation during training (NaN left out)."""
    key = "step_subset" if subset else "step"
    return {
        f"{prefix}{key}/{name}": float(v)
        for name, v in zip(task_names, row.tolist(), strict=True)
        if math.isfinite(v)
    }


def log_step(
    loggers: Sequence[Logger],
    task_names: Sequence[str],
    row: torch.Tensor,
    step: int,
    *,
    prefix: str = "continual/",
    subset: bool = False,
) -> None:
    """Log an evaluation during training at ``step`` (no ``save()``: the stage end flushes)."""
    scalars = step_scalars(task_names, row, prefix=prefix, subset=subset)
    if scalars:
        for logger in loggers:
            logger.log_metrics(scalars, step=step)


def log_baseline(
    loggers: Sequence[Logger], results: Mapping[str, Any], *, prefix: str = "continual/"
) -> None:
    """Log the untrained scores as ``{prefix}baseline/{task}`` at step 0."""
    scalars = {
        f"{prefix}baseline/{name}": value
        for name, value in zip(results["task_names"], results["baseline"], strict=True)
        if value is not None and math.isfinite(value)
    }
    for logger in loggers:
        if scalars:
            logger.log_metrics(scalars, step=0)
        logger.save()


def _figure(results: Mapping[str, Any], name: str | None = None) -> Any:
    """The heatmap of the matrix ``name`` (default: the primary one)."""
    from continual_eval.plotting import plot_accuracy_matrix

    scores, baseline = results_to_tensors(results, name)
    section = dict(matrix_sections(results)).get(name) if name is not None else None
    score = (section or {}).get("score") or results.get("conventions", {}).get("score", "score")
    bounds = (section or {}).get("bounds", [0.0, 1.0])
    finite = bounds is not None and all(v is not None for v in bounds)
    fig, _ = plot_accuracy_matrix(
        scores,
        baseline,
        task_names=results["task_names"],
        title=f"{score} after stage {results['stages_completed'] - 1}",
        value_range=(float(bounds[0]), float(bounds[1])) if finite else None,
        value_label=score,
    )
    return fig


def _curves_figure(results: Mapping[str, Any]) -> Any:
    from continual_eval.functional.stability import boundary_indices
    from continual_eval.plotting import plot_accuracy_curves

    steps, stage, accuracy = results_to_curves(results)
    done = stage < results["stages_completed"]
    last = boundary_indices(stage[done]) if bool(done.any()) else stage[:0]
    boundaries = steps[last[last >= 0]]
    fig, _ = plot_accuracy_curves(
        steps,
        accuracy,
        boundaries,
        task_names=results["task_names"],
        ylabel=results["curves"].get("score", "accuracy"),
    )
    return fig


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _matrix_tags(results: Mapping[str, Any], prefix: str) -> dict[str, str]:
    """Heatmap tag of every matrix: ``{prefix}{score}_matrix`` for the primary one (as in
    version 1), ``{prefix}{name}_matrix`` for the others; name -> tag."""
    return {
        name: f"{prefix}{section['score']}_matrix" if k == 0 else f"{prefix}{name}_matrix"
        for k, (name, section) in enumerate(matrix_sections(results))
    }


def log_stage(
    loggers: Sequence[Logger],
    results: Mapping[str, Any],
    stage: int,
    *,
    prefix: str = "continual/",
    log_images: bool = True,
    results_dir: str | Path | None = None,
) -> None:
    """Log stage ``stage`` (scalars, a heatmap and a table per matrix) to every logger, then
    ``save()`` each one.

    ``results_dir`` is where the CSV files already live; a CSVLogger elsewhere gets its own copy
    of ``scores.csv``.
    """
    scalars = stage_scalars(results, stage, prefix=prefix)
    tags = _matrix_tags(results, prefix)
    primary_tag = next(iter(tags.values()))
    curves_tag = f"{prefix}{results['conventions']['score']}_curves"
    figures: dict[str, Any] = {}
    curves_fig = None
    has_curves = results.get("curves") is not None
    image_loggers = any(
        isinstance(lg, (TensorBoardLogger, WandbLogger, MLFlowLogger)) for lg in loggers
    )
    if log_images and (image_loggers or (has_curves and results_dir is not None)):
        try:
            if image_loggers:
                for k, (name, tag) in enumerate(tags.items()):
                    figures[tag] = _figure(results, None if k == 0 else name)
            if has_curves:
                curves_fig = _curves_figure(results)
                if results_dir is not None:
                    Path(results_dir).mkdir(parents=True, exist_ok=True)
                    curves_fig.savefig(Path(results_dir) / CURVES_PNG, dpi=100)
        except ModuleNotFoundError as err:
            warnings.warn(f"ContinualEvalCallback: no figure logged ({err})", stacklevel=2)
    try:
        for logger in loggers:
            if isinstance(logger, WandbLogger):
                images = {**figures, curves_tag: curves_fig}
                _log_wandb(logger, results, stage, tags, images, scalars)  # one W&B step a stage
            else:
                logger.log_metrics(scalars, step=stage)
            if isinstance(logger, TensorBoardLogger):
                for tag, fig in figures.items():
                    logger.experiment.add_figure(tag, fig, global_step=stage, close=False)
                if curves_fig is not None:
                    logger.experiment.add_figure(
                        curves_tag, curves_fig, global_step=stage, close=False
                    )
                logger.experiment.add_text(
                    primary_tag, format_matrix_table(results, markdown=True), global_step=stage
                )
            elif isinstance(logger, MLFlowLogger):
                run_id = logger.run_id
                for tag, fig in figures.items():
                    logger.experiment.log_figure(run_id, fig, f"{tag}_stage_{stage:03d}.png")
                if curves_fig is not None:
                    logger.experiment.log_figure(
                        run_id, curves_fig, f"{curves_tag}_stage_{stage:03d}.png"
                    )
                logger.experiment.log_dict(run_id, dict(results), f"{prefix}results.json")
                if results_dir is not None:
                    folder = prefix.rstrip("/") or None
                    for csv_path in sorted(Path(results_dir).glob("scores*.csv")):
                        logger.experiment.log_artifact(run_id, str(csv_path), folder)
            elif isinstance(logger, CSVLogger):
                log_dir = Path(logger.log_dir)
                if results_dir is None or log_dir.resolve() != Path(results_dir).resolve():
                    write_scores_csv(log_dir / "scores.csv", results)
            logger.save()
    finally:
        for figure in (*figures.values(), curves_fig):
            if figure is not None:
                import matplotlib.pyplot as plt

                plt.close(figure)


def _log_wandb(
    logger: WandbLogger,
    results: Mapping[str, Any],
    stage: int,
    tags: Mapping[str, str],
    figures: Mapping[str, Any],
    scalars: Mapping[str, float],
) -> None:
    import wandb

    columns = ["stage", *results["task_names"]]
    payload: dict[str, Any] = dict(scalars)
    for name, section in matrix_sections(results):
        data = [["baseline", *section["baseline"]]]
        data += [[str(i), *row] for i, row in enumerate(section["scores"])]
        payload[f"{tags[name]}_table"] = wandb.Table(columns=columns, data=data)
    for key, fig in figures.items():
        if fig is not None:
            from PIL import Image

            payload[key] = wandb.Image(Image.open(io.BytesIO(_png(fig))))
    logger.log_metrics(payload, step=stage)

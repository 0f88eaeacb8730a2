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


def format_matrix_table(results: Mapping[str, Any], *, markdown: bool = False) -> str:
    """The matrix (baseline row, one row per stage) and the metrics as a compact text table."""
    names = list(results["task_names"])
    header = ["stage", *names]
    rows = [["baseline", *(_fmt(v) for v in results["baseline"])]]
    rows += [[str(i), *(_fmt(v) for v in row)] for i, row in enumerate(results["scores"])]
    metrics = results.get("metrics", {})
    summary = "  ".join(f"{k}={_fmt(metrics.get(k))}" for k in METRIC_KEYS if k in metrics)
    score = results.get("conventions", {}).get("score", "score")
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

    The metrics of an accuracy matrix are ``{prefix}acc|bwt|fwt|forgetting``; those of another
    score (``metric=``, e.g. ``MulticlassF1Score``) carry its name,
    ``{prefix}{score}/acc|bwt|fwt|forgetting``, so an F1 average is never logged as accuracy.
    Per-task scores are ``{prefix}{score}/{task}``. Undefined values (not evaluated, NaN) are left
    out rather than logged as 0.
    """
    score = results["conventions"]["score"]
    base = prefix if score == "accuracy" else f"{prefix}{score}/"
    scalars = {f"{base}{k}": v for k, v in results["metrics"].items() if v is not None}
    row = results["scores"][stage]
    for name, value in zip(results["task_names"], row, strict=True):
        if value is not None:
            scalars[f"{prefix}{score}/{name}"] = value
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


def _figure(results: Mapping[str, Any]) -> Any:
    from continual_eval.plotting import plot_accuracy_matrix

    scores, baseline = results_to_tensors(results)
    score = results.get("conventions", {}).get("score", "score")
    fig, _ = plot_accuracy_matrix(
        scores,
        baseline,
        task_names=results["task_names"],
        title=f"{score} after stage {results['stages_completed'] - 1}",
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


def log_stage(
    loggers: Sequence[Logger],
    results: Mapping[str, Any],
    stage: int,
    *,
    prefix: str = "continual/",
    log_images: bool = True,
    results_dir: str | Path | None = None,
) -> None:
    """Log stage ``stage`` (scalars, heatmap, table) to every logger, then ``save()`` each one.

    ``results_dir`` is where ``scores.csv`` already lives; a CSVLogger elsewhere gets its own copy.
    """
    scalars = stage_scalars(results, stage, prefix=prefix)
    tag = f"{prefix}{results['conventions']['score']}_matrix"
    curves_tag = f"{prefix}{results['conventions']['score']}_curves"
    fig = curves_fig = None
    has_curves = results.get("curves") is not None
    image_loggers = any(
        isinstance(lg, (TensorBoardLogger, WandbLogger, MLFlowLogger)) for lg in loggers
    )
    if log_images and (image_loggers or (has_curves and results_dir is not None)):
        try:
            fig = _figure(results) if image_loggers else None
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
                images = {tag: fig, curves_tag: curves_fig}
                _log_wandb(logger, results, stage, tag, images, scalars)  # one W&B step a stage
            else:
                logger.log_metrics(scalars, step=stage)
            if isinstance(logger, TensorBoardLogger):
                if fig is not None:
                    logger.experiment.add_figure(tag, fig, global_step=stage, close=False)
                if curves_fig is not None:
                    logger.experiment.add_figure(
                        curves_tag, curves_fig, global_step=stage, close=False
                    )
                logger.experiment.add_text(
                    tag, format_matrix_table(results, markdown=True), global_step=stage
                )
            elif isinstance(logger, MLFlowLogger):
                run_id = logger.run_id
                if fig is not None:
                    logger.experiment.log_figure(run_id, fig, f"{tag}_stage_{stage:03d}.png")
                if curves_fig is not None:
                    logger.experiment.log_figure(
                        run_id, curves_fig, f"{curves_tag}_stage_{stage:03d}.png"
                    )
                logger.experiment.log_dict(run_id, dict(results), f"{prefix}results.json")
                csv_path = None if results_dir is None else Path(results_dir) / "scores.csv"
                if csv_path is not None and csv_path.is_file():
                    folder = prefix.rstrip("/") or None
                    logger.experiment.log_artifact(run_id, str(csv_path), folder)
            elif isinstance(logger, CSVLogger):
                log_dir = Path(logger.log_dir)
                if results_dir is None or log_dir.resolve() != Path(results_dir).resolve():
                    write_scores_csv(log_dir / "scores.csv", results)
            logger.save()
    finally:
        for figure in (fig, curves_fig):
            if figure is not None:
                import matplotlib.pyplot as plt

                plt.close(figure)


def _log_wandb(
    logger: WandbLogger,
    results: Mapping[str, Any],
    stage: int,
    tag: str,
    figures: Mapping[str, Any],
    scalars: Mapping[str, float],
) -> None:
    import wandb

    columns = ["stage", *results["task_names"]]
    data = [["baseline", *results["baseline"]]]
    data += [[str(i), *row] for i, row in enumerate(results["scores"])]
    payload: dict[str, Any] = {**scalars, f"{tag}_table": wandb.Table(columns=columns, data=data)}
    for key, fig in figures.items():
        if fig is not None:
            from PIL import Image

            payload[key] = wandb.Image(Image.open(io.BytesIO(_png(fig))))
    logger.log_metrics(payload, step=stage)

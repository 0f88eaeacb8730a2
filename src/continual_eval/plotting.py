"""Pictures of an accuracy matrix: the R heatmap and per-task accuracy trajectories.

matplotlib is an optional dependency (``pip install continual-eval[plot]``); it is imported on
first use and the Agg backend is used when no display backend was chosen.

Figures grow with the number of tasks up to :data:`MAX_FIGURE_INCHES` a side; beyond
:data:`MAX_TICK_LABELS` tasks or stages only evenly spaced tick labels are drawn, and the legend is
left out beyond :data:`MAX_LEGEND_ENTRIES` tasks, so a large ``T`` costs a bounded picture.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

#: largest side of a figure these functions create (inches)
MAX_FIGURE_INCHES = 16.0
#: most tick labels on one axis (evenly spaced ones beyond)
MAX_TICK_LABELS = 40
#: most legend entries (no legend beyond)
MAX_LEGEND_ENTRIES = 20


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError as err:  # pragma: no cover - exercised only without the extra
        raise ModuleNotFoundError(
            "plotting needs matplotlib: pip install 'continual-eval[plot]'"
        ) from err
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _as_matrix(scores: Tensor | Sequence[Sequence[float | None]]) -> Tensor:
    if isinstance(scores, Tensor):
        return scores.detach().to("cpu", torch.float64)
    rows = [[float("nan") if v is None else float(v) for v in row] for row in scores]
    return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), -1)


def _task_labels(num_tasks: int, task_names: Sequence[str] | None) -> list[str]:
    if task_names is None:
        return [f"task {j}" for j in range(num_tasks)]
    if len(task_names) != num_tasks:
        raise ValueError(f"task_names has {len(task_names)} names for {num_tasks} tasks")
    return list(task_names)


def _ticks(count: int) -> list[int]:
    """Positions of at most :data:`MAX_TICK_LABELS` evenly spaced labels among ``count``."""
    return list(range(0, count, max(1, math.ceil(count / MAX_TICK_LABELS))))


def _set_ylim(ax: Any, value_range: tuple[float, float] | None) -> None:
    """The y axis over ``value_range`` with a 2 % margin (left to matplotlib when ``None``)."""
    if value_range is None:
        return
    low, high = value_range
    margin = 0.02 * (high - low)
    ax.set_ylim(low - margin, high + margin)


def _new_axes(ax: Any, figsize: tuple[float, float]) -> tuple[Any, Any]:
    plt = _pyplot()
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    else:
        fig = ax.get_figure()
    return fig, ax


def plot_accuracy_matrix(
    scores: Tensor | Sequence[Sequence[float | None]],
    baseline: Tensor | Sequence[float | None] | None = None,
    *,
    ax: Any = None,
    task_names: Sequence[str] | None = None,
    title: str | None = "Accuracy matrix R[i, j]",
    annotate: bool | None = None,
    value_range: tuple[float, float] | None = (0.0, 1.0),
    value_label: str = "accuracy",
) -> tuple[Any, Any]:
    """Heatmap of ``R[i, j]`` (rows: after training stage i; columns: evaluated task j).

    ``value_range`` fixes the colour scale (``None``: the range of the finite values, e.g. for
    a loss); ``value_label`` names it.

    Unevaluated cells (NaN or None) are drawn empty. With ``baseline`` an extra top row shows the
    untrained accuracies ``b[j]``. Cells are annotated with their values when the matrix is small
    (``annotate=None`` means up to 12 tasks). Returns ``(fig, ax)`` like torchmetrics' ``plot``.
    """
    R = _as_matrix(scores)
    num_stages, num_tasks = R.shape
    labels = _task_labels(num_tasks, task_names)
    row_labels = [f"after {labels[i]}" for i in range(num_stages)]
    if baseline is not None:
        b = _as_matrix([list(baseline.tolist() if isinstance(baseline, Tensor) else baseline)])
        R = torch.cat([b, R])
        row_labels = ["untrained", *row_labels]
    width = min(max(3.5, 0.6 * num_tasks + 2.0) + 1.2, MAX_FIGURE_INCHES)
    fig, ax = _new_axes(ax, (width, min(max(3.0, 0.5 * R.shape[0] + 1.6), MAX_FIGURE_INCHES)))
    plt = _pyplot()
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")
    masked = np.ma.masked_invalid(R.numpy())
    low, high = value_range if value_range is not None else (None, None)
    image = ax.imshow(masked, cmap=cmap, vmin=low, vmax=high, aspect="auto")
    fig.colorbar(image, ax=ax, label=value_label)
    slanted = num_tasks > 6 or max(map(len, labels), default=0) > 12
    columns, rows = _ticks(num_tasks), _ticks(R.shape[0])
    ax.set_xticks(
        columns,
        [labels[j] for j in columns],
        rotation=45 if slanted else 0,
        ha="right" if slanted else "center",
    )
    ax.set_yticks(rows, [row_labels[i] for i in rows])
    ax.set_xlabel("evaluated task j")
    ax.set_ylabel("training stage i")
    if baseline is not None:
        ax.axhline(0.5, color="black", linewidth=1.5)
    if annotate is None:
        annotate = num_tasks <= 12
    if annotate:
        for (i, j), value in np.ndenumerate(R.numpy()):
            if value == value:  # not NaN
                ax.text(
                    j,
                    i,
                    f"{value:.2f}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="black" if float(image.norm(value)) > 0.6 else "white",
                )
    if title:
        ax.set_title(title)
    return fig, ax


def plot_task_trajectories(
    scores: Tensor | Sequence[Sequence[float | None]],
    *,
    ax: Any = None,
    task_names: Sequence[str] | None = None,
    title: str | None = "Per-task accuracy after each training stage",
    ylabel: str = "accuracy",
    value_range: tuple[float, float] | None = (0.0, 1.0),
) -> tuple[Any, Any]:
    """One line per task: its accuracy ``R[i, j]`` against the training stage ``i``, from the stage
    it was trained on (``i >= j``); unevaluated cells leave gaps. ``value_range`` fixes the y axis
    (``None``: fitted to the values, e.g. for a loss). Returns ``(fig, ax)``."""
    R = _as_matrix(scores)
    num_stages, num_tasks = R.shape
    labels = _task_labels(num_tasks, task_names)
    fig, ax = _new_axes(ax, (6.4, 4.0))
    stages = list(range(num_stages))
    for j in range(min(num_tasks, num_stages)):
        ys = [R[i, j].item() if i >= j else float("nan") for i in stages]
        ax.plot(stages, ys, marker="o", label=labels[j])
    shown = _ticks(num_stages)
    ax.set_xticks(
        shown, [f"after {labels[i]}" for i in shown], rotation=30 if num_stages > 4 else 0
    )
    _set_ylim(ax, value_range)
    ax.set_xlabel("training stage")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if num_tasks <= MAX_LEGEND_ENTRIES:
        ax.legend(loc="best", fontsize=8, ncols=1 + num_tasks // 10)
    if title:
        ax.set_title(title)
    return fig, ax


def plot_accuracy_curves(
    steps: Tensor | Sequence[int],
    accuracy: Tensor | Sequence[Sequence[float | None]],
    boundaries: Tensor | Sequence[int],
    task_names: Sequence[str] | None = None,
    ax: Any = None,
    *,
    ylabel: str = "accuracy",
    title: str | None = "Per-task accuracy during training (continual evaluation)",
    value_range: tuple[float, float] | None = (0.0, 1.0),
) -> tuple[Any, Any]:
    """One line per task: ``accuracy[n, j]`` against the training step ``steps[n]`` (NaN = not
    evaluated, drawn as a gap), with a dashed vertical line at each task boundary step (the end of
    a stage) so the stability gap after each boundary is visible. ``accuracy`` may hold any score
    (``ylabel`` names it); ``value_range`` fixes the y axis (``None``: fitted to the values, e.g.
    for a loss). Returns ``(fig, ax)``."""
    A = _as_matrix(accuracy)
    x = torch.as_tensor(steps, dtype=torch.float64).reshape(-1)
    if A.shape[0] != x.shape[0]:
        raise ValueError(f"{x.shape[0]} steps for {A.shape[0]} rows of accuracy")
    num_tasks = A.shape[1]
    labels = _task_labels(num_tasks, task_names)
    fig, ax = _new_axes(ax, (7.2, 4.0))
    for b in torch.as_tensor(boundaries).reshape(-1).tolist():
        ax.axvline(b, color="grey", linestyle="--", linewidth=0.8, alpha=0.7)
    xs = x.tolist()
    for j in range(num_tasks):
        ys = A[:, j]
        if bool(torch.isnan(ys).all()):
            continue
        ax.plot(xs, ys.tolist(), marker="." if len(xs) < 200 else None, label=labels[j])
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _set_ylim(ax, value_range)
    ax.set_xlabel("training step (cumulative over tasks)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if 0 < num_tasks <= MAX_LEGEND_ENTRIES:
        ax.legend(loc="best", fontsize=8, ncols=1 + num_tasks // 10)
    if title:
        ax.set_title(title)
    return fig, ax


def plot_confusion_matrix(
    confusion: Tensor,
    task_classes: Sequence[Sequence[int]] | None = None,
    *,
    ax: Any = None,
    normalize: bool = True,
    title: str | None = "Confusion matrix (classes in order of arrival)",
    annotate: bool | None = None,
) -> tuple[Any, Any]:
    """Heatmap of a ``[C, C]`` confusion matrix (rows: true class, columns: predicted class, in
    class-id order), with the classes in order of arrival and each task's block outlined.

    ``task_classes`` (one list of class ids per task) gives the order: task 0's classes as
    listed, then task 1's, ..., then the classes of no task; lines separate the tasks, whose
    labels run along the top (up to :data:`MAX_TICK_LABELS` tasks). ``normalize``: each row as
    the share of that class's test samples (a class without samples, e.g. not seen yet, is drawn
    empty); else the counts. Cells are annotated up to 12 classes (``annotate=None``).
    Returns ``(fig, ax)``.
    """
    from continual_eval.functional.class_incremental import (
        check_task_classes,
        confusion_in_arrival_order,
    )

    counts = torch.as_tensor(confusion).detach().to("cpu", torch.int64)
    if counts.ndim != 2 or counts.shape[0] != counts.shape[1]:
        raise ValueError(f"confusion must be a [C, C] matrix, got {tuple(counts.shape)}")
    C = counts.shape[0]
    lists = [list(range(C))] if task_classes is None else [list(c) for c in task_classes]
    checked = check_task_classes(lists, C)
    ordered, boundaries = confusion_in_arrival_order(counts, checked)
    order = checked.order.tolist()
    values = ordered.double()
    if normalize:
        totals = values.sum(1, keepdim=True)
        values = torch.where(totals > 0, values / totals.clamp(min=1), math.nan)
    side = min(max(4.0, 0.32 * C + 2.5), MAX_FIGURE_INCHES)
    fig, ax = _new_axes(ax, (side + 1.2, side))
    plt = _pyplot()
    cmap = plt.get_cmap("magma_r" if normalize else "viridis").with_extremes(bad="#eeeeee")
    image = ax.imshow(
        np.ma.masked_invalid(values.numpy()),
        cmap=cmap,
        vmin=0.0 if normalize else None,
        vmax=1.0 if normalize else None,
        aspect="equal",
        interpolation="nearest",
    )
    fig.colorbar(image, ax=ax, label="share of the true class" if normalize else "count")
    shown = _ticks(C)
    ax.set_xticks(shown, [str(order[k]) for k in shown], rotation=90 if C > 20 else 0, fontsize=7)
    ax.set_yticks(shown, [str(order[k]) for k in shown], fontsize=7)
    ax.set_xlabel("predicted class (arrival order)")
    ax.set_ylabel("true class (arrival order)")
    bounds = boundaries.tolist()
    for b in bounds[1:]:
        if 0 < b < C:
            ax.axhline(b - 0.5, color="#1f77b4", linewidth=1.0)
            ax.axvline(b - 0.5, color="#1f77b4", linewidth=1.0)
    for j in range(len(bounds) - 1):
        low, high = bounds[j] - 0.5, bounds[j + 1] - 0.5
        ax.add_patch(
            plt.Rectangle(
                (low, low), high - low, high - low, fill=False, edgecolor="#1f77b4", linewidth=1.8
            )
        )
    if len(bounds) - 1 <= MAX_TICK_LABELS and task_classes is not None:
        top = ax.secondary_xaxis("top")
        centres = [(bounds[j] + bounds[j + 1] - 1) / 2 for j in range(len(bounds) - 1)]
        top.set_xticks(centres, [f"task {j}" for j in range(len(centres))], fontsize=7)
    if annotate is None:
        annotate = C <= 12
    if annotate:
        for (i, j), value in np.ndenumerate(values.numpy()):
            if value == value and (value > 0 or not normalize):
                text = f"{value:.2f}" if normalize else f"{int(value)}"
                ax.text(
                    j,
                    i,
                    text,
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if float(image.norm(value)) > 0.6 else "black",
                )
    if title:
        ax.set_title(title)
    return fig, ax

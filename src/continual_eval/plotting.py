"""Pictures of an accuracy matrix: the R heatmap, per-task trajectories, step curves, the
class-incremental confusion matrix and one panel per metric across methods; and of an online
evaluation over a stream ([`plot_online`][continual_eval.plotting.plot_online]).

matplotlib is an optional dependency (``pip install continual-eval[plot]``); it is imported on
first use and the Agg backend is used when no display backend was chosen.

Every heatmap follows two rules. Colour: ``viridis`` for a higher-is-better score, reversed
(``viridis_r``) for a lower-is-better one, so that bright always means good, and the colorbar
label says which way is better (``heatmap_colormap``,
``direction_label``). Text: each cell's number is black or
white, whichever contrasts more with that cell's colour by the WCAG 2 contrast ratio
([`text_colours`][continual_eval.plotting.text_colours]), the same rule for every heatmap and
colormap.

Figures grow with the number of tasks up to
[`MAX_FIGURE_INCHES`][continual_eval.plotting.MAX_FIGURE_INCHES] a side; beyond
``MAX_TICK_LABELS`` tasks or stages only evenly spaced tick
labels are drawn, and the legend is left out beyond
[`MAX_LEGEND_ENTRIES`][continual_eval.plotting.MAX_LEGEND_ENTRIES] tasks, so a large ``T`` costs a
bounded picture.
"""

from __future__ import annotations

import math
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from continual_eval.results import OnlineResults

MAX_FIGURE_INCHES = 16.0
"""Largest side of a figure these functions create (inches)."""
MAX_TICK_LABELS = 40
"""Most tick labels on one axis (evenly spaced ones beyond)."""
MAX_LEGEND_ENTRIES = 20
"""Most legend entries (no legend beyond)."""
HEATMAP_COLORMAP = "viridis"
"""The colormap of a higher-is-better score (reversed for a lower-is-better one)."""
BLACK_TEXT_LUMINANCE = math.sqrt(1.05 * 0.05) - 0.05
"""WCAG 2 relative luminance above which black text contrasts more than white: ``(L + 0.05) /
0.05 > 1.05 / (L + 0.05)`` <=> ``L > sqrt(1.05 * 0.05) - 0.05``."""
TRAJECTORY_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
"""Marker shapes of the trajectories, one per task (cycled), drawn open."""
ONLINE_POINTS = 60
"""The online curves are moving averages over ``ceil(windows / ONLINE_POINTS)`` windows."""
BLIND_NAMES = {"mode": "recent mode", "last": "last label", "prior": "most frequent so far"}
"""How the pictures name the blind predictors of an online section."""
SINGLE_RUN_COLOUR = "tab:gray"
"""Colour of the error bar of a single run's interval (from its test items) in the metric
panels; the intervals across seeds are black."""
MAX_INTERVAL_TASKS = 10
"""Most tasks whose heatmap cells show their interval under the value (beyond, the value alone
and the caption says so): each task column is then ``INTERVAL_CELL_INCHES`` wide."""
INTERVAL_CELL_INCHES = 0.9
"""Width of a heatmap column (inches) when its cells show intervals: room for ``[0.80, 0.86]`` in
6.5 pt type."""


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
    """Positions of at most ``MAX_TICK_LABELS`` evenly
    spaced labels among ``count``."""
    return list(range(0, count, max(1, math.ceil(count / MAX_TICK_LABELS))))


def _set_ylim(ax: Any, value_range: tuple[float, float] | None) -> None:
    """The y axis over ``value_range`` with a 2 % margin (left to matplotlib when ``None``)."""
    if value_range is None:
        return
    low, high = value_range
    margin = 0.02 * (high - low)
    ax.set_ylim(low - margin, high + margin)


def direction_label(label: str, higher_is_better: bool) -> str:
    """``label`` with the score's direction: ``"loss (lower is better)"``."""
    return f"{label} ({'higher' if higher_is_better else 'lower'} is better)"


def heatmap_colormap(higher_is_better: bool = True) -> str:
    """The colormap name of a heatmap of scores:
    [`HEATMAP_COLORMAP`][continual_eval.plotting.HEATMAP_COLORMAP], reversed (``_r``) for a
    lower-is-better score, so that the best values are bright in both."""
    return HEATMAP_COLORMAP if higher_is_better else f"{HEATMAP_COLORMAP}_r"


def relative_luminance(rgba: Any) -> np.ndarray:
    """WCAG 2 relative luminance ``L = 0.2126 R + 0.7152 G + 0.0722 B`` of sRGB colours
    (``[..., 3]`` or ``[..., 4]`` in ``[0, 1]``; alpha ignored), each channel linearised:
    ``c / 12.92`` up to ``0.04045``, else ``((c + 0.055) / 1.055) ** 2.4``."""
    c = np.asarray(rgba, dtype=np.float64)[..., :3]
    linear = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return np.asarray(linear @ np.array([0.2126, 0.7152, 0.0722]))


def text_colours(rgba: Any) -> np.ndarray:
    """The text colour for each cell colour (``[..., 4]`` RGBA): ``"black"`` where it contrasts
    more than white (relative luminance above
    [`BLACK_TEXT_LUMINANCE`][continual_eval.plotting.BLACK_TEXT_LUMINANCE]), else ``"white"``. The
    one rule of every heatmap's numbers.

    >>> text_colours([[1.0, 1.0, 0.0, 1.0], [0.27, 0.0, 0.33, 1.0]]).tolist()
    ['black', 'white']
    """
    return np.where(relative_luminance(rgba) > BLACK_TEXT_LUMINANCE, "black", "white")


def _annotate_cells(
    ax: Any, image: Any, values: np.ndarray, texts: np.ndarray, offset: float = 0.0, **kw: Any
) -> None:
    """Write ``texts[i, j]`` on the cells of ``image`` (an ``imshow``) where it is not empty,
    ``offset`` cells below the centre, in the colour
    [`text_colours`][continual_eval.plotting.text_colours] gives for the cell's own colour."""
    colours = text_colours(image.cmap(image.norm(np.nan_to_num(values))))
    for i, j in zip(*np.nonzero(texts != ""), strict=True):
        ax.text(
            j,
            i + offset,
            str(texts[i, j]),
            ha="center",
            va="center",
            color=str(colours[i, j]),
            **kw,
        )


def interval_text(value: float, low: float, high: float, digits: int = 2) -> str:
    """The interval of ``value`` as written under it on a heatmap cell: ``±h`` when both arms
    round to the same ``h`` at ``digits`` decimals (the interval is symmetric at the printed
    precision), else ``[low, high]``; ``""`` when an end is not finite.

    >>> interval_text(0.83, 0.80, 0.86), interval_text(0.97, 0.90, 0.99)
    ('±0.03', '[0.90, 0.99]')
    """
    if not (math.isfinite(value) and math.isfinite(low) and math.isfinite(high)):
        return ""
    below = round(value - low, digits)
    above = round(high - value, digits)
    if below == above:
        return f"±{above:.{digits}f}"
    return f"[{low:.{digits}f}, {high:.{digits}f}]"


def interval_texts(values: Tensor, low: Tensor, high: Tensor, digits: int = 2) -> list[list[str]]:
    """`interval_text` of every cell of ``values`` (``""`` where the value or an end is NaN)."""
    return [
        [interval_text(v, lo, hi, digits) for v, lo, hi in zip(*rows, strict=True)]
        for rows in zip(values.tolist(), low.tolist(), high.tolist(), strict=True)
    ]


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
    higher_is_better: bool = True,
    intervals: tuple[Tensor, Tensor] | None = None,
    baseline_intervals: tuple[Tensor, Tensor] | None = None,
    interval_label: str = "interval",
) -> tuple[Any, Any]:
    """Heatmap of ``R[i, j]`` (rows: after training stage i; columns: evaluated task j).

    ``value_range`` fixes the colour scale (``None``: the range of the finite values, e.g. for
    a loss); ``value_label`` names it. ``higher_is_better=False`` (a loss) reverses the colormap
    (``heatmap_colormap``: the best cells are bright
    either way) and the colorbar label states the direction
    (``direction_label``).

    Unevaluated cells (NaN or None) are drawn empty. With ``baseline`` an extra top row shows the
    untrained accuracies ``b[j]``. Cells are annotated with their values when the matrix is small
    (``annotate=None`` means up to 12 tasks). Returns ``(fig, ax)`` like torchmetrics' ``plot``.

    ``intervals``: ``(low, high)`` ``[s, T]`` per cell (e.g. the ``intervals`` section's Wilson
    intervals), ``baseline_intervals``: ``(low, high)`` ``[T]`` of the baseline row; with up to
    [`MAX_INTERVAL_TASKS`][continual_eval.plotting.MAX_INTERVAL_TASKS] tasks each annotated cell
    shows its interval under the value in smaller type
    ([`interval_text`][continual_eval.plotting.interval_text]: ``±h`` or ``[low, high]``), beyond
    that the value alone; a second title line says which (``interval_label`` names the
    intervals).
    """
    R = _as_matrix(scores)
    num_stages, num_tasks = R.shape
    labels = _task_labels(num_tasks, task_names)
    row_labels = [f"after {labels[i]}" for i in range(num_stages)]
    if baseline is not None:
        b = _as_matrix([list(baseline.tolist() if isinstance(baseline, Tensor) else baseline)])
        R = torch.cat([b, R])
        row_labels = ["untrained", *row_labels]
    if annotate is None:
        annotate = num_tasks <= 12
    spans = _cell_intervals(
        R.shape, intervals, baseline_intervals if baseline is not None else None
    )
    with_spans = spans is not None and annotate and num_tasks <= MAX_INTERVAL_TASKS
    column = INTERVAL_CELL_INCHES if with_spans else 0.6
    row = 0.62 if with_spans else 0.5
    width = min(max(3.5, column * num_tasks + 2.0) + 1.2, MAX_FIGURE_INCHES)
    fig, ax = _new_axes(ax, (width, min(max(3.0, row * R.shape[0] + 1.6), MAX_FIGURE_INCHES)))
    plt = _pyplot()
    cmap = plt.get_cmap(heatmap_colormap(higher_is_better)).with_extremes(bad="white")
    masked = np.ma.masked_invalid(R.numpy())
    low, high = value_range if value_range is not None else (None, None)
    image = ax.imshow(masked, cmap=cmap, vmin=low, vmax=high, aspect="auto")
    fig.colorbar(image, ax=ax, label=direction_label(value_label, higher_is_better))
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
    if annotate:
        values = R.numpy()
        texts = np.array([["" if v != v else f"{v:.2f}" for v in row] for row in values.tolist()])
        if with_spans:
            assert spans is not None
            shown = np.array(interval_texts(R, *spans))
            _annotate_cells(ax, image, values, texts, fontsize=8, offset=-0.16)
            _annotate_cells(ax, image, values, shown, fontsize=6.5, offset=0.2)
        else:
            _annotate_cells(ax, image, values, texts, fontsize=8)
    note = None
    if spans is not None:
        note = (
            f"cells: value and {interval_label} (±h: symmetric at 2 decimals)"
            if with_spans
            else f"cells: value only ({interval_label} not drawn: "
            + (f"more than {MAX_INTERVAL_TASKS} tasks)" if annotate else "cells not annotated)")
        )
    if note is not None:  # wrapped to the figure's width (about 7.5 pt a character)
        inches = fig.get_size_inches()[0]
        note = textwrap.fill(note, max(40, int(inches * 72 / 7.5)))
    if title or note:
        ax.set_title("\n".join(t for t in (title, note) if t))
    return fig, ax


def _cell_intervals(
    shape: tuple[int, ...],
    intervals: tuple[Tensor, Tensor] | None,
    baseline_intervals: tuple[Tensor, Tensor] | None,
) -> tuple[Tensor, Tensor] | None:
    """``(low, high)`` of the heatmap's rows (the baseline row first when it is drawn: NaN where
    its intervals are not given), ``None`` without ``intervals``."""
    if intervals is None:
        return None
    low, high = (_as_matrix(t) for t in intervals)
    if baseline_intervals is not None or low.shape[0] + 1 == shape[0]:
        if baseline_intervals is None:
            top = torch.full((2, 1, shape[1]), math.nan, dtype=torch.float64)
        else:
            top = torch.stack([_as_matrix([list(map(float, t))]) for t in baseline_intervals])
        low, high = torch.cat([top[0], low]), torch.cat([top[1], high])
    if low.shape != tuple(shape) or high.shape != tuple(shape):
        raise ValueError(
            f"intervals have shape {tuple(low.shape)} / {tuple(high.shape)} for a heatmap of "
            f"{tuple(shape)} cells (the baseline row included)"
        )
    return low, high


def plot_task_trajectories(
    scores: Tensor | Sequence[Sequence[float | None]],
    *,
    ax: Any = None,
    task_names: Sequence[str] | None = None,
    title: str | None = "Per-task accuracy after each training stage",
    ylabel: str = "accuracy",
    value_range: tuple[float, float] | None = (0.0, 1.0),
    intervals: tuple[Tensor, Tensor] | None = None,
) -> tuple[Any, Any]:
    """One line per task: its accuracy ``R[i, j]`` against the training stage ``i``, from the stage
    it was trained on (``i >= j``); unevaluated cells leave gaps. ``value_range`` fixes the y axis
    (``None``: fitted to the values, e.g. for a loss). Each task has its own open marker
    (``TRAJECTORY_MARKERS``), larger for earlier tasks,
    so points that coincide show as nested outlines instead of hiding each other.
    ``intervals``: ``(low, high)`` ``[s, T]`` per cell (e.g. the ``intervals`` section's
    Wilson intervals), drawn as error bars. Returns ``(fig, ax)``."""
    R = _as_matrix(scores)
    num_stages, num_tasks = R.shape
    labels = _task_labels(num_tasks, task_names)
    fig, ax = _new_axes(ax, (6.4, 4.0))
    stages = list(range(num_stages))
    drawn = min(num_tasks, num_stages)
    trained = torch.arange(num_stages)[:, None] >= torch.arange(num_tasks)[None, :]
    shown = torch.where(trained, R, math.nan)
    for j in range(drawn):
        (line,) = ax.plot(
            stages,
            shown[:, j].tolist(),
            marker=TRAJECTORY_MARKERS[j % len(TRAJECTORY_MARKERS)],
            markersize=_marker_size(j, drawn),
            markerfacecolor="none",
            markeredgewidth=1.4,
            linewidth=1.2,
            label=labels[j],
        )
        if intervals is not None:
            low, high = (torch.as_tensor(t, dtype=torch.float64)[:, j] for t in intervals)
            below = (shown[:, j] - low).clamp(min=0).nan_to_num(0.0)
            above = (high - shown[:, j]).clamp(min=0).nan_to_num(0.0)
            ax.errorbar(
                stages,
                shown[:, j].tolist(),
                yerr=[below.tolist(), above.tolist()],
                fmt="none",
                ecolor=line.get_color(),
                elinewidth=0.9,
                capsize=2.5,
                alpha=0.7,
            )
    ticks = _ticks(num_stages)
    ax.set_xticks(
        ticks, [f"after {labels[i]}" for i in ticks], rotation=30 if num_stages > 4 else 0
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


def _marker_size(j: int, count: int) -> float:
    """Marker size of task ``j`` of ``count``: from 12 points (task 0) down to 6 (the last)."""
    return 12.0 - 6.0 * j / max(1, count - 1)


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
    """Heatmap of a ``[C, C]`` confusion matrix (dense or sparse COO; rows: true class, columns:
    predicted class, in class-id order), with the classes in order of arrival and each task's
    block outlined.

    ``task_classes`` (one list of class ids per task) gives the order: task 0's classes as
    listed, then task 1's, ..., then the classes of no task; lines separate the tasks, whose
    labels run along the top (up to ``MAX_TICK_LABELS``
    tasks). ``normalize``: each row as the share of that class's test samples (a class without
    samples, e.g. not seen yet, is drawn empty); else the counts. Cells are annotated up to 12
    classes (``annotate=None``). Returns ``(fig, ax)``.
    """
    from continual_eval.functional.class_incremental import (
        check_task_classes,
        confusion_in_arrival_order,
    )

    counts = torch.as_tensor(confusion).detach().to("cpu", torch.int64)
    if counts.layout == torch.sparse_coo:  # e.g. one stage of ClassIncrementalResults.confusion
        counts = counts.to_dense()
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
        cells = values.numpy()

        def cell_text(v: float) -> str:  # empty: not evaluated, or a zero share
            if v != v or (normalize and v == 0):
                return ""
            return f"{v:.2f}" if normalize else f"{int(v)}"

        texts = np.array([[cell_text(v) for v in row] for row in cells.tolist()])
        _annotate_cells(ax, image, cells, texts, fontsize=7)
    if title:
        ax.set_title(title)
    return fig, ax


def _metric_panel(
    ax: Any,
    values: Sequence[float],
    bars: Sequence[tuple[float, float] | None],
    notes: Sequence[str],
    colours: Any,
    *,
    decimals: int,
    title: str,
    singles: Sequence[bool] | None = None,
) -> None:
    """One panel of `plot_metric_panels`: a bar per method (``nan``: "n/a" at the axis),
    its error bar (grey where ``singles[k]``: a single run's interval), its value (plus
    ``notes[k]``) at the bar's end, a y scale that holds them."""
    from matplotlib.ticker import FormatStrFormatter

    xs = np.arange(len(values))
    ax.bar(xs, np.nan_to_num(np.array(values)), 0.7, color=[colours(k % colours.N) for k in xs])
    ends = [0.0]
    for k, (value, bar) in enumerate(zip(values, bars, strict=True)):
        if value != value:  # no value: say so at the axis
            ax.annotate(
                "n/a",
                (k, 0),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
                color="grey",
            )
            continue
        low, high = (value, value) if bar is None else (float(bar[0]), float(bar[1]))
        if bar is not None:
            ax.errorbar(
                [k],
                [value],
                yerr=[[value - low], [high - value]],
                fmt="none",
                ecolor=SINGLE_RUN_COLOUR if singles is not None and singles[k] else "black",
                capsize=3,
                linewidth=1,
            )
        ends += [low, high, value]
        up = value >= 0
        ax.annotate(
            f"{value:.{decimals}f}{notes[k]}",
            (k, high if up else low),
            xytext=(0, 2 if up else -2),
            textcoords="offset points",
            ha="center",
            va="bottom" if up else "top",
            fontsize=7,
        )
    low_end, high_end = min(ends), max(ends)
    span = high_end - low_end
    if span <= 1e-12 * max(1.0, abs(high_end)):  # every value 0 (or equal): a scale around it
        span = max(abs(high_end), 0.05)
        low_end, high_end = -span, span
    ax.set_ylim(
        low_end - (0.18 if low_end < 0 else 0.0) * span,
        high_end + (0.18 if high_end > 0 else 0.02) * span,
    )
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.yaxis.set_major_formatter(FormatStrFormatter(f"%.{decimals}f"))
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xticks([])
    ax.set_xlim(-0.6, len(values) - 0.4)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)


def plot_metric_panels(
    means: Mapping[str, Sequence[float | None]],
    methods: Sequence[str],
    *,
    intervals: Mapping[str, Sequence[tuple[float, float] | None]] | None = None,
    counts: Mapping[str, Sequence[int]] | None = None,
    runs: Sequence[int] | None = None,
    titles: Mapping[str, str] | None = None,
    higher_is_better: Mapping[str, bool] | None = None,
    interval_label: str = "interval of the mean",
    single_intervals: Mapping[str, Sequence[tuple[float, float] | None]] | None = None,
    single_label: str = "one run's interval from its test items",
    decimals: int = 3,
    columns: int = 4,
    title: str | None = None,
) -> tuple[Any, Any]:
    """Small multiples: one panel per metric (``means[metric][k]``: method ``k``'s value,
    ``None`` = none), each with its own y scale from 0, one bar per method in the same colour
    in every panel, the value written at the bar's end with ``decimals`` decimals.

    ``intervals[metric][k]``: ``(low, high)`` drawn as an error bar (``None``: none);
    ``single_intervals[metric][k]``: where ``intervals`` has none, a single run's interval,
    drawn in grey and named ``single_label`` in the legend;
    ``counts[metric][k]`` / ``runs[k]``: the runs with a value / all runs of method ``k``
    (``n=k`` is written under a value when they differ; ``runs`` goes into the legend);
    ``higher_is_better[metric]`` puts an arrow in the panel title (↑ or ↓); ``titles`` names
    the metrics. Returns ``(fig, axes)`` (a 2-D array of axes; unused ones hidden).
    """
    from matplotlib.patches import Patch

    plt = _pyplot()
    keys = list(means)
    if not keys:
        raise ValueError("plot_metric_panels needs at least one metric")
    for key in keys:
        if len(means[key]) != len(methods):
            raise ValueError(
                f"means[{key!r}] has {len(means[key])} values for {len(methods)} methods"
            )
    ncols = max(1, min(columns, len(keys)))
    nrows = math.ceil(len(keys) / ncols)
    width = min(max(2.6, 0.45 * len(methods) + 1.6) * ncols + 0.4, MAX_FIGURE_INCHES)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(width, min(2.9 * nrows + 1.0, MAX_FIGURE_INCHES)),
        layout="constrained",
        squeeze=False,
    )
    colours = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")
    for panel, key in enumerate(keys):
        values = [math.nan if v is None else float(v) for v in means[key]]
        notes = [
            f"\nn={counts[key][k]}"
            if counts is not None and runs is not None and counts[key][k] != runs[k]
            else ""
            for k in range(len(methods))
        ]
        name = titles.get(key, key) if titles is not None else key
        if higher_is_better is not None and key in higher_is_better:
            name = f"{name} {'↑' if higher_is_better[key] else '↓'}"
        bars: list[tuple[float, float] | None] = (
            list(intervals[key]) if intervals is not None else [None] * len(methods)
        )
        singles = [False] * len(methods)
        if single_intervals is not None:
            for k, single in enumerate(single_intervals[key]):
                if bars[k] is None and single is not None:
                    bars[k], singles[k] = single, True
        _metric_panel(
            axes.flat[panel],
            values,
            bars,
            notes,
            colours,
            decimals=decimals,
            title=name,
            singles=singles,
        )
    for ax in axes.flat[len(keys) :]:
        ax.set_visible(False)
    handles: list[Any] = [
        Patch(
            color=colours(k % colours.N),
            label=methods[k] if runs is None else f"{methods[k]} (n={runs[k]})",
        )
        for k in range(len(methods))
    ]
    if intervals is not None and any(s is not None for key in keys for s in intervals[key]):
        from matplotlib.lines import Line2D

        handles.append(
            Line2D(
                [], [], color="black", marker="|", markersize=8, linewidth=1, label=interval_label
            )
        )
    if single_intervals is not None and any(
        single is not None and (intervals is None or intervals[key][k] is None)
        for key in keys
        for k, single in enumerate(single_intervals[key])
    ):
        from matplotlib.lines import Line2D

        handles.append(
            Line2D(
                [],
                [],
                color=SINGLE_RUN_COLOUR,
                marker="|",
                markersize=8,
                linewidth=1,
                label=single_label,
            )
        )
    fig.legend(handles=handles, loc="outside lower center", ncols=min(4, len(handles)), fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig, axes


def online_score_label(score: str) -> str:
    """How the pictures and reports name a score of an online section: ``online
    (prequential)``, ``near-future, delay d``, ``label delay d``."""
    if score == "online":
        return "online (prequential)"
    kind, _, delay = score.partition("/")
    return f"near-future, delay {delay}" if kind == "near_future" else f"label delay {delay}"


def plot_online(
    results: OnlineResults, path: str | Path | None = None, *, title: str | None = None
) -> Any:
    """A matplotlib figure of an online evaluation (the ``online`` section of a run:
    [`OnlineResults`][continual_eval.results.OnlineResults]), saved to ``path`` when given.

    Top: per score (online, near-future per delay, label delay per delay), the learner's accuracy
    (solid) and the best blind predictor's on that score (dashed, same colour; the legend names
    it and gives both over the whole stream) against the stream position at each window's end,
    each a sample-weighted moving average over ``ceil(windows / 60)`` windows, with chance (``1 /
    classes seen so far``, grey). Bottom (with held-out sets): the held-out accuracy on the seen
    segments (anytime accuracy), on the left ones (retention) and the forgetting, with the
    segment starts as vertical lines. ``title``: the figure's title (plain text).
    """
    from continual_eval.functional.online import held_out_curves, windowed_accuracy

    plt = _pyplot()
    held = results.held_out is not None and bool(results.held_out.evaluations)
    fig, axes = plt.subplots(
        2 if held else 1, 1, figsize=(12, 7.5 if held else 4.5), squeeze=False, sharex=True
    )
    ax = axes[0, 0]
    positions = results.stream_positions().numpy()
    smooth = max(1, -(-len(results.windows) // ONLINE_POINTS))
    summary = results.summary()["scores"]
    for k, score in enumerate(results.score_names()):
        correct, total = results.counts(score)
        if not int(total.sum()):
            continue
        entry = summary[score]
        learner = windowed_accuracy(correct, total, smooth).numpy()
        blinds = {b: v for b, v in entry["blind"].items() if v is not None}
        best = max(blinds, key=lambda b: blinds[b])  # the best blind predictor over the stream
        blind, _ = results.counts(score, best)
        blind_curve = windowed_accuracy(blind, total, smooth).numpy()
        label = online_score_label(score)
        ax.plot(
            positions, learner, color=f"C{k}", lw=1.8, label=f"{label}: {entry['accuracy']:.3f}"
        )
        ax.plot(
            positions,
            blind_curve,
            color=f"C{k}",
            lw=1.2,
            ls="--",
            label=f"  blind ({BLIND_NAMES.get(best, best)}): {blinds[best]:.3f}",
        )
    if results.windows:
        chance = [1 / max(1, w.classes_seen) for w in results.windows]
        ax.step(
            positions, chance, where="post", color="0.55", lw=1.0, label="chance (1 / classes seen)"
        )
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("accuracy per window")
    window = results.protocol.window_batches
    ax.set_title(
        f"Learner vs blind predictors over the stream ({window} batches per window"
        + (f", moving average of {smooth} windows" if smooth > 1 else "")
        + ")",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(
        fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False
    )
    if held:
        assert results.held_out is not None
        ax2 = axes[1, 0]
        A, at = results.held_out_matrix()
        curves = held_out_curves(A, results.held_out_segments())
        names = {
            "seen": "seen segments (anytime accuracy)",
            "past": "left segments (retention)",
            "forgetting": "forgetting (peak - now)",
        }
        for k, (name, text) in enumerate(names.items()):
            if torch.isfinite(curves[name]).any():
                ax2.plot(
                    at.numpy(),
                    curves[name].numpy(),
                    marker="o",
                    ms=3,
                    lw=1.5,
                    color=f"C{k + 4}",
                    label=text,
                )
        for start in results.held_out.segment_starts or []:
            if start > 0:
                ax2.axvline(start, color="0.8", lw=0.8, zorder=0)
        ax2.set_ylim(-0.02, 1.02)
        ax2.set_ylabel("held-out accuracy")
        ax2.set_title("Held-out sets over the stream", fontsize=10)
        ax2.grid(alpha=0.3)
        ax2.legend(
            fontsize=7.5,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            borderaxespad=0.0,
            frameon=False,
        )
    axes[-1, 0].set_xlabel("stream position (samples trained)")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig

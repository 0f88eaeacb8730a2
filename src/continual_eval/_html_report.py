"""The HTML report of ``continual-eval report`` (``report.html``): one self-contained file.

Plotly (the ``plot`` extra) draws the figures; its JavaScript library is embedded once in the
page, so the file opens offline and the page's Content-Security-Policy forbids every network
request. The page holds the summary table (mean ± sample std per method, each metric's
direction), the statistics across seeds, the metrics as small multiples (one panel per metric,
its own scale), and per run every matrix: its values as a table, a heatmap (the value, stage and
task under the cursor) and the per-task trajectories; with a ``class_incremental`` section the
final confusion matrix in arrival order; with an ``online`` section the learner's online and
near-future accuracy beside the best blind predictor's over the stream (the window's samples
seen, optimizer steps and wall time under the cursor), the score table, the compute and the
held-out values. The heatmaps use the colours and the text rule of the
PNGs ([`continual_eval.plotting`][continual_eval.plotting]). Every name from the files is escaped
for HTML, in the tables and in the figures' labels.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from continual_eval.plotting import (
    MAX_INTERVAL_TASKS,
    TRAJECTORY_MARKERS,
    direction_label,
    heatmap_colormap,
    interval_texts,
    text_colours,
)
from continual_eval.results.schema import printable

__all__ = ["CONTENT_SECURITY_POLICY", "MAX_ANNOTATED_CELLS", "html_report"]

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:"
)
"""No request leaves the page: scripts and styles only inline, images only as data URLs."""
MAX_ANNOTATED_CELLS = 400
"""Heatmaps with more cells than this show their values only under the cursor."""
#: Plotly's open marker of each of ``continual_eval.plotting.TRAJECTORY_MARKERS``
_PLOTLY_MARKERS = {
    "o": "circle-open",
    "s": "square-open",
    "^": "triangle-up-open",
    "D": "diamond-open",
    "v": "triangle-down-open",
    "P": "cross-open",
    "X": "x-open",
    "<": "triangle-left-open",
    ">": "triangle-right-open",
    "h": "hexagon-open",
}
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f2f2f2; }
code { background: #f4f4f4; padding: 0 0.2em; }
.figure { margin: 0.5em 0 1.5em; }
section.run { border-top: 2px solid #ddd; margin-top: 2em; }
.interval { color: #555; font-size: 0.85em; white-space: nowrap; }
.note, .caveats { font-size: 0.85em; color: #444; }
"""


def _text(value: object, limit: int = 200) -> str:
    """``value`` as HTML text: one line (control characters as escapes), cut, escaped."""
    return html.escape(printable(str(value), limit), quote=True)


def _label(value: object, limit: int = 40) -> str:
    """``value`` for a Plotly label: one line, at most ``limit`` characters (``…`` marks a cut),
    HTML-escaped (Plotly reads tags such as ``<b>`` and ``<a href>`` in labels, and shows
    entities as the characters they stand for)."""
    text = printable(str(value), 10 * limit)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return html.escape(text, quote=True)


def _cells(values: torch.Tensor) -> list[list[float | None]]:
    """A matrix as nested lists, ``None`` for NaN (a gap in Plotly)."""
    return [[v if math.isfinite(v) else None for v in row] for row in values.tolist()]


def _colorscale(name: str, stops: int = 11) -> list[list[Any]]:
    """matplotlib's colormap ``name`` as a Plotly colorscale (the PNGs' colours)."""
    import matplotlib

    cmap = matplotlib.colormaps[name]
    scale = []
    for k in range(stops):
        r, g, b, _ = cmap(k / (stops - 1))
        scale.append([k / (stops - 1), f"rgb({round(255 * r)},{round(255 * g)},{round(255 * b)})"])
    return scale


def _value_range(values: torch.Tensor, bounds: tuple[float, float] | None) -> tuple[float, float]:
    """The colour range: the bounds when finite, else the finite values' range."""
    if bounds is not None and all(math.isfinite(v) for v in bounds):
        return float(bounds[0]), float(bounds[1])
    finite = values[torch.isfinite(values)]
    if finite.numel() == 0:
        return 0.0, 1.0
    low, high = float(finite.min()), float(finite.max())
    return (low, high) if high > low else (low - 0.5, high + 0.5)


def heatmap_figure(
    values: torch.Tensor,
    *,
    columns: Sequence[str],
    rows: Sequence[str],
    title: str,
    colorbar: str,
    cmap: str,
    value_range: tuple[float, float],
    number_format: str = ".3f",
    hover: tuple[str, str] = ("row", "column"),
    intervals: tuple[torch.Tensor, torch.Tensor] | None = None,
    interval_label: str = "interval",
) -> Any:
    """A Plotly heatmap of ``values`` ``[rows, columns]`` (NaN: empty) coloured with the
    matplotlib colormap ``cmap`` over ``value_range``; the value, row and column under the
    cursor; the values written on the cells (up to ``MAX_ANNOTATED_CELLS``) in the colour
    [`text_colours`][continual_eval.plotting.text_colours] gives for each cell. Labels: escaped
    here.

    ``intervals``: ``(low, high)`` of every cell (``values``' shape; NaN: none), shown under the
    cursor and, with up to [`MAX_INTERVAL_TASKS`][continual_eval.plotting.MAX_INTERVAL_TASKS]
    columns, written under each value in smaller type
    ([`interval_text`][continual_eval.plotting.interval_text]); the title's second line says
    which (``interval_label`` names them)."""
    import matplotlib
    import plotly.graph_objects as go

    values = values.double()
    n_rows, n_cols = values.shape
    xs, ys = list(range(n_cols)), list(range(n_rows))
    col_labels = [_label(c) for c in columns]
    row_labels = [_label(r) for r in rows]
    spans = None
    if intervals is not None:
        lows, highs = (torch.as_tensor(t, dtype=torch.float64) for t in intervals)
        if lows.shape != values.shape or highs.shape != values.shape:
            raise ValueError(
                f"intervals have shape {tuple(lows.shape)} / {tuple(highs.shape)} for a heatmap "
                f"of {tuple(values.shape)} cells"
            )
        spans = interval_texts(values, lows, highs, digits=_digits(number_format))
        ends = [
            [
                f"[{lo:{number_format}}, {hi:{number_format}}]"
                if math.isfinite(lo) and math.isfinite(hi)
                else "none"
                for lo, hi in zip(low_row, high_row, strict=True)
            ]
            for low_row, high_row in zip(lows.tolist(), highs.tolist(), strict=True)
        ]
        custom = [[[row_labels[i], col_labels[j], ends[i][j]] for j in xs] for i in ys]
        template = (
            f"{hover[0]}: %{{customdata[0]}}<br>{hover[1]}: %{{customdata[1]}}<br>"
            f"value: %{{z:{number_format}}}<br>{_label(interval_label, 60)}: "
            "%{customdata[2]}<extra></extra>"
        )
    else:
        custom = [[[row_labels[i], col_labels[j]] for j in xs] for i in ys]
        template = (
            f"{hover[0]}: %{{customdata[0]}}<br>{hover[1]}: %{{customdata[1]}}<br>"
            f"value: %{{z:{number_format}}}<extra></extra>"
        )
    low, high = value_range
    fig = go.Figure(
        go.Heatmap(
            z=_cells(values),
            x=xs,
            y=ys,
            zmin=low,
            zmax=high,
            colorscale=_colorscale(cmap),
            colorbar={"title": {"text": _label(colorbar, 60), "side": "right"}},
            customdata=custom,
            hovertemplate=template,
            hoverongaps=False,
        )
    )
    finite = torch.isfinite(values)
    annotated = n_rows * n_cols <= MAX_ANNOTATED_CELLS and bool(finite.any())
    with_spans = spans is not None and annotated and n_cols <= MAX_INTERVAL_TASKS
    if annotated:
        i, j = torch.nonzero(finite, as_tuple=True)
        cell = values[i, j].numpy()
        span = high - low if high > low else 1.0
        colours = text_colours(matplotlib.colormaps[cmap](np.clip((cell - low) / span, 0, 1)))
        fig.add_trace(
            go.Scatter(
                x=j.tolist(),
                y=(i - 0.17).tolist() if with_spans else i.tolist(),
                mode="text",
                text=[format(v, number_format) for v in cell.tolist()],
                textfont={"color": colours.tolist(), "size": 11},
                hoverinfo="skip",
                showlegend=False,
                name="values",
            )
        )
        if with_spans:
            assert spans is not None
            fig.add_trace(
                go.Scatter(
                    x=j.tolist(),
                    y=(i + 0.22).tolist(),
                    mode="text",
                    text=[spans[a][b] for a, b in zip(i.tolist(), j.tolist(), strict=True)],
                    textfont={"color": colours.tolist(), "size": 10 if n_cols <= 6 else 9},
                    hoverinfo="skip",
                    showlegend=False,
                    name="intervals",
                )
            )
    if spans is not None:
        note = (
            f"cells: value and {interval_label} (±h: symmetric at the printed precision)"
            if with_spans
            else f"cells: value only, {interval_label} under the cursor"
        )
        title = f"{_label(title, 120)}<br><sup>{_label(note, 160)}</sup>"
    else:
        title = _label(title, 120)
    fig.update_xaxes(tickvals=xs, ticktext=col_labels, showgrid=False, zeroline=False)
    fig.update_yaxes(
        tickvals=ys, ticktext=row_labels, autorange="reversed", showgrid=False, zeroline=False
    )
    fig.update_layout(
        title={"text": title},
        height=min(260 + (46 if with_spans else 34) * n_rows, 900),
        margin={"l": 10, "r": 10, "t": 70 if spans is not None else 50, "b": 10},
        plot_bgcolor="white",
    )
    return fig


def _digits(number_format: str) -> int:
    """The decimals of a format such as ``".3f"`` (2 when it names none)."""
    found = re.fullmatch(r"\.(\d+)f", number_format)
    return int(found.group(1)) if found else 2


def trajectories_figure(
    scores: torch.Tensor,
    task_names: Sequence[str],
    *,
    title: str,
    ylabel: str,
    intervals: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Any:
    """One line per task ``j``: ``R[i, j]`` over the stages ``i >= j``, each task with its own
    open marker, larger for earlier tasks (coinciding points show as nested outlines);
    ``intervals``: ``(low, high)`` ``[s, T]`` per cell, drawn as error bars."""
    import plotly.graph_objects as go

    s, T = scores.shape
    fig = go.Figure()
    stages = [f"after {_label(task_names[i])}" for i in range(s)]
    drawn = min(s, T)
    for j in range(drawn):
        ys = [
            v if i >= j and math.isfinite(v) else None for i, v in enumerate(scores[:, j].tolist())
        ]
        error = None
        if intervals is not None:
            low, high = (torch.as_tensor(t, dtype=torch.float64)[:, j] for t in intervals)
            column = scores[:, j].double()
            error = {
                "type": "data",
                "array": (high - column).clamp(min=0).nan_to_num(0.0).tolist(),
                "arrayminus": (column - low).clamp(min=0).nan_to_num(0.0).tolist(),
                "thickness": 1,
                "width": 3,
            }
        fig.add_trace(
            go.Scatter(
                x=list(range(s)),
                y=ys,
                mode="lines+markers",
                name=_label(task_names[j]),
                marker={
                    "symbol": _PLOTLY_MARKERS[TRAJECTORY_MARKERS[j % len(TRAJECTORY_MARKERS)]],
                    "size": 16 - 7 * j / max(1, drawn - 1),
                    "line": {"width": 2},
                },
                customdata=stages,
                hovertemplate="%{customdata}<br>%{y:.4f}",
                error_y=error,
            )
        )
    fig.update_xaxes(tickvals=list(range(s)), ticktext=stages, title="training stage")
    fig.update_yaxes(title=_label(ylabel, 60))
    fig.update_layout(
        title={"text": _label(title, 120)},
        height=380,
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig


#: the direction arrow of a metric title: higher is better (True) or lower
_ARROW = {True: "↑", False: "↓"}


def metric_panels_figure(
    summaries: Sequence[Any],
    columns: Mapping[str, str],
    directions: Mapping[str, bool],
    confidence: float,
    single_interval: Any = None,
) -> Any:
    """Small multiples: one panel per metric with a value, its own y scale, a bar per method
    (its colour the same in every panel), the Student-t interval of the mean as error bars
    (methods with two or more values; for a method with one run, ``single_interval(summary,
    key)``, its interval from its test items, in grey), the value with 3 decimals."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    keys = [k for k in columns if any(s.mean[k] is not None for s in summaries)]
    singles = False
    ncols = max(1, min(4, len(keys)))
    nrows = max(1, math.ceil(len(keys) / ncols))
    fig = make_subplots(
        rows=nrows,
        cols=ncols,
        subplot_titles=[f"{html.escape(columns[k])} {_ARROW[directions[k]]}" for k in keys],
        horizontal_spacing=0.08,
        vertical_spacing=0.16,
    )
    palette = qualitative.Plotly
    for m, s in enumerate(summaries):
        name = f"{_label(s.method)} (n={len(s.runs)})"
        for p, key in enumerate(keys):
            stats = s.stats[key]
            ci = stats.t_interval
            mean = stats.mean
            error = None
            if ci is not None and mean is not None:
                error = {"type": "data", "array": [ci.high - mean], "arrayminus": [mean - ci.low]}
            single = None if single_interval is None or ci is not None else single_interval(s, key)
            if single is not None and mean is not None:
                ci = _Ends(*single)
                error = {
                    "type": "data",
                    "array": [single[1] - mean],
                    "arrayminus": [mean - single[0]],
                    "color": "#888",
                }
                singles = True
            row, col = p // ncols + 1, p % ncols + 1
            fig.add_trace(
                go.Bar(
                    x=[name],
                    y=[mean],
                    name=name,
                    legendgroup=name,
                    showlegend=p == 0,
                    marker_color=palette[m % len(palette)],
                    error_y=error,
                    hovertemplate=f"{name}<br>%{{y:.4f}}<extra></extra>",
                ),
                row=row,
                col=col,
            )
            # the value beyond the bar's end and its error bar
            up = mean is None or mean >= 0
            end = 0.0 if mean is None else (ci.high if ci and up else ci.low if ci else mean)
            fig.add_annotation(
                x=name,
                y=end,
                text="n/a" if mean is None else f"{mean:.3f}",
                showarrow=False,
                yshift=9 if up else -9,
                font={"size": 11},
                row=row,
                col=col,
            )
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(tickformat=".3f", rangemode="tozero")
    pct = f"{100 * confidence:g}%"
    text = f"Metrics per method: mean over seeds; error bars: {pct} Student-t interval of the mean"
    text += " (n ≥ 2)"
    if singles:
        text += "<br><sup>grey: a method with one run, its interval from its test items</sup>"
    fig.update_layout(
        title={"text": text},
        height=300 * nrows + 120,
        barmode="group",
        margin={"l": 10, "r": 10, "t": 80, "b": 10},
    )
    return fig


class _Ends:
    """``low`` / ``high`` of an interval given as a pair (the ``t_interval``'s attributes)."""

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """An HTML table; every cell is already HTML (escaped by the caller)."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _mean_std(stats: Any, runs: int, single: tuple[float, float] | None = None) -> str:
    """``mean ± std``; a value alone for one run, followed by ``single`` (its interval from its
    test items) as ``[low, high]``; ``(n=k)`` where only ``k`` of the runs have a value."""
    if stats.mean is None:
        return "n/a"
    text = f"{stats.mean:.4f}" if stats.std is None else f"{stats.mean:.4f} ± {stats.std:.4f}"
    if single is not None and stats.std is None:
        text += f' <span class="interval">[{single[0]:.4f}, {single[1]:.4f}]</span>'
    return text if stats.n == runs else f"{text} (n={stats.n})"


def _caveats(caveats: Sequence[str]) -> list[str]:
    """The small-sample caveats under a table (plain text, escaped here)."""
    if not caveats:
        return []
    items = "".join(f"<li>{_text(c, 600)}</li>" for c in caveats)
    return [f'<ul class="caveats">{items}</ul>']


def _interval(ci: Any) -> str:
    return "—" if ci is None else f"[{ci.low:.4f}, {ci.high:.4f}]"


def _matrix_table(matrix: Any, task_names: Sequence[str]) -> str:
    """The rows of a matrix (the baseline first) with its task names as columns."""
    header = ["", *(_text(n, 60) for n in task_names)]
    rows = [["untrained", *(_number(v) for v in matrix.baseline.tolist())]]
    rows += [
        [f"after {_text(task_names[i], 60)}", *(_number(v) for v in row)]
        for i, row in enumerate(matrix.scores.tolist())
    ]
    return _table(header, rows)


def _number(value: float) -> str:
    return f"{value:.4f}" if math.isfinite(value) else "—"


def _figure_html(fig: Any, div_id: str) -> str:
    import plotly.io as pio

    return str(
        pio.to_html(
            fig,
            full_html=False,
            include_plotlyjs=False,
            div_id=div_id,
            config={"displaylogo": False, "responsive": True},
            default_height=f"{fig.layout.height}px",
        )
    )


class _Figures:
    """The page's Plotly figures: each added one gets the next ``figure-N`` id (the list the
    page publishes as ``window.CONTINUAL_EVAL_FIGURES``)."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def add(self, fig: Any) -> str:
        self.ids.append(f"figure-{len(self.ids)}")
        return f'<div class="figure">{_figure_html(fig, self.ids[-1])}</div>'


def _summary_section(
    runs: Sequence[Any],
    summaries: Sequence[Any],
    columns: Mapping[str, str],
    directions: Mapping[str, bool],
    seeds_text: Any,
    single_interval: Any = None,
    interval_note: str | None = None,
    missing_notes: Sequence[str] = (),
) -> list[str]:
    """The heading and the table of each method's mean ± std per metric (a single run's value
    with ``single_interval(summary, key)``, its interval from its test items, when not
    ``None``; ``interval_note``, plain text, says so under the table; ``missing_notes``, plain
    text, why a single value printed has none)."""
    header = [
        "method",
        "runs",
        "seeds",
        *(f"{_text(t)} {_ARROW[directions[k]]}" for k, t in columns.items()),
    ]
    rows = [
        [
            _text(s.method),
            str(len(s.runs)),
            _text(seeds_text(s)),
            *(
                _mean_std(
                    s.stats[k],
                    len(s.runs),
                    None if single_interval is None else single_interval(s, k),
                )
                for k in columns
            ),
        ]
        for s in summaries
    ]
    body = [
        "<h1>Continual-evaluation report</h1>",
        f"<p>{len(runs)} run(s). Mean over each method's runs ± sample standard deviation across "
        "runs (seeds), shown with two or more runs; <code>(n=k)</code> where only k runs have a "
        "value. ↑: higher is better, ↓: lower is better.</p>",
        "<h2>Metrics per method</h2>",
        _table(header, rows),
    ]
    if interval_note:
        body.append(f'<p class="note">{_text(interval_note, 1000)}</p>')
    body += _missing(missing_notes)
    return body


def _missing(notes: Sequence[str]) -> list[str]:
    """Why numbers printed above have no interval (plain text lines, escaped here): a short
    list under the table, once per reason."""
    if not notes:
        return []
    items = "".join(f"<li>{_text(n, 800)}</li>" for n in notes)
    head = '<p class="note">Printed without an interval, and why:</p>'
    return [f'{head}<ul class="note">{items}</ul>']


def _uncertainty_section(
    summaries: Sequence[Any],
    columns: Mapping[str, str],
    directions: Mapping[str, bool],
    confidence: float,
    seed_caveats: Any = None,
) -> list[str]:
    """Per metric: n, mean, std, the t and the bootstrap interval of each method, and under
    each table the small-sample caveats (``seed_caveats([(method, caveat), ...])``: the lines,
    plain text)."""
    pct = f"{100 * confidence:g}%"
    body = [
        "<h2>Uncertainty across seeds</h2>",
        f"<p>Per metric: <code>n</code>, mean, sample std, the {pct} Student-t interval of the "
        f"mean and the {pct} percentile bootstrap interval (settings in <code>report.md</code>); "
        "a method with one run has no interval (—).</p>",
    ]
    for key, title in columns.items():
        stat_rows = [
            [
                _text(s.method),
                str(s.stats[key].n),
                _number(math.nan if s.stats[key].mean is None else s.stats[key].mean),
                _number(math.nan if s.stats[key].std is None else s.stats[key].std),
                _interval(s.stats[key].t_interval),
                _interval(s.stats[key].bootstrap_interval),
            ]
            for s in summaries
        ]
        body.append(f"<h3>{_text(title)} {_ARROW[directions[key]]}</h3>")
        body.append(
            _table(
                ["method", "n", "mean", "std", f"{pct} CI (t)", f"{pct} CI (bootstrap)"], stat_rows
            )
        )
        if seed_caveats is not None:
            body += _caveats(seed_caveats([(s.method, s.stats[key].caveat) for s in summaries]))
    return body


def _matrix_section(
    name: str,
    matrix: Any,
    names: list[str],
    figures: _Figures,
    held: Any = None,
    interval_label: str = "interval",
) -> list[str]:
    """One score matrix of a run: its table, its heatmap and its per-task trajectories; with
    ``held`` (its `MatrixIntervals` from the ``intervals`` section) each cell's interval on the
    heatmap and as the trajectories' error bars."""
    direction = "higher" if matrix.higher_is_better else "lower"
    grid = torch.cat([matrix.baseline[None, :], matrix.scores])
    spans = None
    if held is not None:
        spans = (
            torch.cat([held.baseline_low.double()[None, :], held.low.double()]),
            torch.cat([held.baseline_high.double()[None, :], held.high.double()]),
        )
    row_names = ["untrained", *(f"after {n}" for n in names[: matrix.num_stages])]
    where = (
        f"cells' {interval_label}s: on the heatmap below and as the trajectories' error bars"
        if held is not None
        else "no cell intervals: no per-item records of this matrix (item_records=)"
    )
    body = [
        f"<h3>{_text(name)} ({_text(matrix.score)}, {direction} is better)</h3>",
        _matrix_table(matrix, names),
        f'<p class="note">{_text(where, 300)}</p>',
        figures.add(
            heatmap_figure(
                grid,
                columns=names,
                rows=row_names,
                title=f"{name}: R[i, j]",
                colorbar=direction_label(matrix.score, matrix.higher_is_better),
                cmap=heatmap_colormap(matrix.higher_is_better),
                value_range=_value_range(grid, matrix.bounds),
                hover=("trained through", "task"),
                intervals=spans,
                interval_label=interval_label,
            )
        ),
    ]
    if matrix.num_stages > 0:
        body.append(
            figures.add(
                trajectories_figure(
                    matrix.scores,
                    names,
                    title=f"{name}: per task"
                    + ("" if held is None else f" (error bars: {interval_label})"),
                    ylabel=matrix.score,
                    intervals=None if held is None else (held.low, held.high),
                )
            )
        )
    return body


def _confusion_section(section: Any, figures: _Figures) -> list[str]:
    """The task-agnostic confusion after the last stage, rows normalised to shares."""
    ordered, _ = section.arrival_confusion(-1)
    counts = ordered.double()
    totals = counts.sum(1, keepdim=True)
    shares = torch.where(totals > 0, counts / totals.clamp(min=1), math.nan)
    order = [str(c) for c in section.class_order]
    return [
        f"<h3>Task-agnostic confusion after stage {section.num_stages - 1}</h3>",
        figures.add(
            heatmap_figure(
                shares,
                columns=order,
                rows=order,
                title="share of each true class's test samples (arrival order)",
                colorbar="share of the true class",
                cmap="magma_r",
                value_range=(0.0, 1.0),
                number_format=".2f",
                hover=("true class", "predicted class"),
            )
        ),
    ]


def _with_interval(value: float, ends: tuple[float, float] | None) -> str:
    """A value (4 decimals, ``—`` when not finite) and, when both ends are finite, its
    ``[low, high]`` in small type."""
    if not math.isfinite(value):
        return "—"
    text = f"{value + 0.0:.4f}"
    if ends is not None and all(math.isfinite(e) for e in ends):
        text += f' <span class="interval">[{ends[0] + 0.0:.4f}, {ends[1] + 0.0:.4f}]</span>'
    return text


def _held_out_section(results: Any) -> list[str]:
    """A run's held-out sets (`continual_eval._held_out_report`): per matrix the final table
    (baseline, final, delta, worst drop) and the table per evaluation (each set's score and
    delta), with their one-run intervals; why not where a matrix has none."""
    from continual_eval._held_out_report import (
        held_out_missing,
        held_out_note,
        held_out_rows,
        held_out_stage_rows,
    )

    held_out = getattr(results, "held_out", None)
    if held_out is None:
        return []
    body = [
        "<h3>Held-out sets</h3>",
        "<p>Scored at the baseline and after every stage, never trained, never part of R or its "
        "metrics; delta = score minus the baseline, worst drop = the largest loss against the "
        "baseline over the stages in the score's direction.</p>",
    ]
    for name in held_out.scores:
        matrix = results.matrices[name]
        arrow = _ARROW[bool(matrix.higher_is_better)]
        rows = [[_text(n, 60), *c] for n, c in held_out_rows(results, name, _with_interval)]
        header, stage_rows = held_out_stage_rows(results, name, _with_interval)
        body += [
            f"<h4>{_text(name)} ({_text(matrix.score)} {arrow})</h4>",
            _table(["set", "baseline", "final", "delta", "worst drop"], rows),
            _table(
                ["evaluation", *(_text(h, 80) for h in header)],
                [[_text(r[0], 80), *r[1:]] for r in stage_rows],
            ),
        ]
    note = held_out_note(results)
    if note is not None:
        body.append(f'<p class="note">{_text(note, 1000)}</p>')
    body += _missing(held_out_missing(results))
    return body


def _class_incremental_section(results: Any) -> list[str]:
    """The class-incremental values of a run with their Wilson intervals
    (`continual_eval._class_incremental_report`): the final measures, the seen / old / new
    accuracy per stage and each class's accuracy after the last stage; why not for the rest."""
    from continual_eval._class_incremental_report import class_incremental_tables

    found = class_incremental_tables(results, _with_interval)
    if found is None:
        return []
    body = ["<h3>Class-incremental evaluation</h3>"]
    for title, header, rows in found.tables:
        body += [f"<h4>{_text(title)}</h4>", _table([_text(h) for h in header],
                 [[_text(r[0], 80), *r[1:]] for r in rows])]  # fmt: skip
    if found.note:
        body.append(f'<p class="note">{_text(found.note, 1000)}</p>')
    body += _missing(found.missing)
    return body


def _class_incremental_summary(summaries: Sequence[Any]) -> list[str]:
    """The across-methods class-incremental table (mean ± sample std; one run: its value and
    interval), its note and the reasons for the one-run values without an interval."""
    from continual_eval._class_incremental_report import SUMMARY_NOTE, class_incremental_summary

    def cell(values: Sequence[float], ends: tuple[float, float] | None) -> str:
        finite = [v for v in values if math.isfinite(v)]
        if not finite:
            return "n/a"
        if len(finite) == 1:
            text = _with_interval(finite[0], ends)
        else:
            mean = math.fsum(finite) / len(finite)
            std = math.sqrt(math.fsum((v - mean) ** 2 for v in finite) / (len(finite) - 1))
            text = f"{mean:.4f} ± {std:.4f}"
        return text if len(finite) == len(values) else f"{text} (n={len(finite)})"

    found = class_incremental_summary(summaries, cell)
    if found is None:
        return []
    rows = [[_text(m), str(n), *cells] for m, n, cells in found.rows]
    body = [
        "<h2>Class-incremental evaluation</h2>",
        "<p>Final values, mean ± sample std over each method's runs with a class-incremental "
        "section (the columns as in <code>report.md</code>).</p>",
        _table(["method", "runs", *(_text(t) for t in found.titles)], rows),
    ]
    if found.single:
        body.append(f'<p class="note">{_text(SUMMARY_NOTE, 600)}</p>')
    body += _missing([f"{t} ({', '.join(methods)}): {why}" for t, why, methods in found.missing])
    return body


def _forgotten_section(results: Any, directory: Path) -> list[str]:
    """The items right at the diagonal and wrong at the final stage
    (`continual_eval._predictions_report`), when the run wrote prediction files."""
    from continual_eval._predictions_report import FORGOTTEN_PER_TASK, forgotten_items

    if getattr(results, "predictions", None) is None:
        return []
    found, notes = forgotten_items(results, directory)
    if not found and not notes:
        return []
    body = [
        "<h3>Forgotten items</h3>",
        f"<p>Right after the task's own stage, wrong after the final stage (at most "
        f"{FORGOTTEN_PER_TASK} per task and scorer).</p>",
    ]
    body += [f"<p>{_text(note, 500)}</p>" for note in notes]
    rows = []
    for f in found:
        head = [
            _text(f.scorer, 60),
            _text(results.task_names[f.task], 60),
            f"{f.count}/{f.compared}",
        ]
        for k, (item, reference, before, after, score) in enumerate(f.items):
            texts = [_text(t, 80) for t in (reference, before, after)]
            final = "—" if score is None else _number(float(score))
            rows.append([*(head if k == 0 else ["", "", ""]), str(item), *texts, final])
        if not f.items:
            rows.append([*head, "", "", "", "", ""])
    header = ["scorer", "task", "forgotten", "item", "reference", "diagonal", "final", "score"]
    if rows:
        body.append(_table(header, rows))
    return body


def _run_section(
    run: Any, run_title: Any, figures: _Figures, interval_label: Any = None
) -> list[str]:
    """One run: its path, every matrix (with its cell intervals where the run's ``intervals``
    section has them; ``interval_label(results, matrix)`` names them), and the
    class-incremental confusion where it has one."""
    results = run.results
    names = list(results.task_names)
    body = [
        '<section class="run">',
        f"<h2>{_text(run_title(run))}</h2>",
        f"<p><code>{_text(run.path, 500)}</code></p>",
    ]
    section = getattr(results, "intervals", None)
    if results.num_tasks:  # an online run without tasks has no matrix to show
        for name, matrix in results.matrices.items():
            held = None if section is None else section.matrices.get(name)
            label = "interval" if interval_label is None else interval_label(results, name)
            body.extend(_matrix_section(name, matrix, names, figures, held, label))
    body.extend(_held_out_section(results))
    body.extend(_forgotten_section(results, Path(run.path)))
    section = getattr(results, "class_incremental", None)
    if section is not None and section.num_stages > 0:
        body.extend(_class_incremental_section(results))
        body.extend(_confusion_section(section, figures))
    online = getattr(results, "online", None)
    if online is not None and online.windows:
        body.extend(_online_section(online, figures))
    body.append("</section>")
    return body


def online_figure(online: Any) -> Any:
    """Per score of an online section, the learner's accuracy per window (solid) and the best
    blind predictor's (dotted, same colour) over the stream, with chance (``1 / classes seen``);
    the window's samples seen, optimizer steps and wall time under the cursor."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    from continual_eval.plotting import BLIND_NAMES, online_score_label

    summary = online.summary()["scores"]
    positions = online.stream_positions().tolist()
    compute = [
        f"window {w.index}: {w.cost.samples} samples, {w.cost.optimizer_steps} optimizer steps, "
        f"{w.cost.train_seconds:.2f} s"
        for w in online.windows
    ]
    palette = qualitative.Plotly
    fig = go.Figure()
    for k, score in enumerate(online.score_names()):
        entry = summary[score]
        if not entry["samples"]:
            continue
        correct, total = online.counts(score)
        blinds = {b: v for b, v in entry["blind"].items() if v is not None}
        best = max(blinds, key=lambda b: blinds[b])
        blind, _ = online.counts(score, best)
        colour = palette[k % len(palette)]
        label = online_score_label(score)
        for values, name, dash in (
            (correct, f"{label}: {entry['accuracy']:.3f}", "solid"),
            (blind, f"{label}, blind ({BLIND_NAMES[best]}): {blinds[best]:.3f}", "dot"),
        ):
            ys = [
                int(c) / int(n) if int(n) else None
                for c, n in zip(values.tolist(), total.tolist(), strict=True)
            ]
            fig.add_trace(
                go.Scatter(
                    x=positions,
                    y=ys,
                    mode="lines",
                    name=_label(name, 80),
                    line={"color": colour, "dash": dash, "width": 2 if dash == "solid" else 1.4},
                    customdata=compute,
                    hovertemplate="%{customdata}<br>stream position %{x}<br>%{y:.4f}",
                )
            )
    fig.add_trace(
        go.Scatter(
            x=positions,
            y=[1 / max(1, w.classes_seen) for w in online.windows],
            mode="lines",
            name="chance (1 / classes seen)",
            line={"color": "#999", "shape": "hv", "width": 1},
        )
    )
    fig.update_xaxes(title="stream position (samples trained)")
    fig.update_yaxes(title="accuracy per window", range=[-0.02, 1.02])
    fig.update_layout(
        title={"text": "Online vs near-future vs blind accuracy over the stream"},
        height=420,
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig


def _online_section(online: Any, figures: _Figures) -> list[str]:
    """An online section: its figure, the score table, the compute and the held-out values."""
    from continual_eval._online_report import (
        INTERVAL_NOTE,
        SCORE_HEADER,
        cost_text,
        held_out_text,
        online_score_rows,
    )

    rows = [[_text(cell) for cell in row] for row in online_score_rows(online)]
    body = [
        "<h3>Online evaluation</h3>",
        figures.add(online_figure(online)),
        _table([_text(h) for h in SCORE_HEADER], rows),
        f"<p>{_text(INTERVAL_NOTE, 1500)}</p>",
        f"<p>Compute: {_text(cost_text(online), 500)}.</p>",
    ]
    held = held_out_text(online)
    if held is not None:
        body.append(f"<p>{_text(held[:1].upper() + held[1:], 500)}.</p>")
    return body


def html_report(
    runs: Sequence[Any],
    summaries: Sequence[Any],
    columns: Mapping[str, str],
    directions: Mapping[str, bool],
    *,
    confidence: float,
    seeds_text: Any,
    run_title: Any,
    single_interval: Any = None,
    interval_note: str | None = None,
    seed_caveats: Any = None,
    interval_label: Any = None,
    missing_notes: Sequence[str] = (),
    per_task: Sequence[str] = (),
) -> str:
    """The whole page. ``runs``: [`continual_eval.report.Run`][continual_eval.report.Run];
    ``summaries``: their [`MethodSummary`][continual_eval.report.MethodSummary]; ``columns`` /
    ``directions``: each metric's title and direction; ``seeds_text(summary)`` and
    ``run_title(run)``: plain text (escaped here). The single-run intervals:
    ``single_interval(summary, key)`` (``(low, high)`` or ``None``), ``interval_note`` (the
    summary table's note) and ``interval_label(results, matrix)`` (the cell intervals' name);
    ``seed_caveats(named)``: the small-sample caveat lines of the intervals across seeds."""
    from plotly.offline import get_plotlyjs

    figures = _Figures()
    body = _summary_section(
        runs,
        summaries,
        columns,
        directions,
        seeds_text,
        single_interval,
        interval_note,
        missing_notes,
    )
    body += list(per_task)
    if any(s.mean[k] is not None for s in summaries for k in columns):
        body.append(
            figures.add(
                metric_panels_figure(summaries, columns, directions, confidence, single_interval)
            )
        )
        body.extend(_uncertainty_section(summaries, columns, directions, confidence, seed_caveats))
    body.extend(_class_incremental_summary(summaries))
    for run in runs:
        body.extend(_run_section(run, run_title, figures, interval_label))
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">',
            "<title>Continual-evaluation report</title>",
            f"<style>{_STYLE}</style>",
            f"<script>{get_plotlyjs()}</script>",
            "</head><body>",
            *body,
            f"<script>window.CONTINUAL_EVAL_FIGURES = {json.dumps(figures.ids)};</script>",
            "</body></html>",
            "",
        ]
    )

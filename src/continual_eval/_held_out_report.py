"""The held-out part of ``continual-eval report``: for a run with a ``held_out`` section, a table
per matrix (each set's baseline, final score, change against the baseline, worst drop; with
their one-run intervals ``[low, high]`` where the ``intervals`` section holds them) and the
sets' trajectories over the stages, the baseline first."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from continual_eval.results import HeldOutResults

__all__ = [
    "held_out_missing",
    "held_out_note",
    "held_out_rows",
    "held_out_run_lines",
    "held_out_stage_rows",
    "plot_held_out",
]


def plot_held_out(
    held_out: HeldOutResults, name: str, *, title: str | None = None, ylabel: str = "score"
) -> tuple[Any, Any]:
    """One line per held-out set: its score under matrix ``name`` at the baseline (``b``) and
    after each stage, each set's baseline as a dotted line of its colour. Returns ``(fig,
    ax)``."""
    from continual_eval.plotting import TRAJECTORY_MARKERS, _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
    baseline, scores = held_out.baseline[name], held_out.scores[name]
    stages = list(range(scores.shape[0] + 1))
    for k, set_name in enumerate(held_out.names):
        values = [float(baseline[k]), *scores[:, k].tolist()]
        (line,) = ax.plot(
            stages,
            values,
            marker=TRAJECTORY_MARKERS[k % len(TRAJECTORY_MARKERS)],
            markerfacecolor="none",
            label=set_name,
        )
        if math.isfinite(values[0]):
            ax.axhline(values[0], color=line.get_color(), linestyle=":", linewidth=1)
    ax.set_xticks(stages, ["b", *(str(i) for i in range(scores.shape[0]))])
    ax.set_xlabel("after stage (b = untrained baseline; dotted: each set's baseline)")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend(title="held-out set", fontsize="small")
    return fig, ax


def held_out_run_lines(
    results: Any, label: str, title: str, out: Path, plain: Callable[[str], str]
) -> list[str]:
    """``report.md`` lines of a run's held-out sets (none without them): per matrix a table
    and ``<label>_held_out[_<matrix>].png`` drawn into ``out``; ``plain`` cleans a name for a
    picture."""
    from continual_eval._markdown import escape_markdown
    from continual_eval.plotting import _pyplot

    held_out: HeldOutResults | None = results.held_out
    if held_out is None:
        return []
    lines = ["### Held-out sets", ""]
    lines += [
        "Scored at the baseline and after every stage, never trained, never part of R or its "
        "metrics; delta = final score minus the baseline, worst drop = the largest loss against "
        "the baseline over the stages in the score's direction (negative: never below it).",
        "",
    ]
    for number, name in enumerate(held_out.scores):
        matrix = results.matrices[name]
        arrow = "↑" if matrix.higher_is_better else "↓"
        lines += [
            f"**{escape_markdown(name)}** ({escape_markdown(matrix.score)} {arrow})",
            "",
            "| set | baseline | final | delta | worst drop |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for set_name, cells in held_out_rows(results, name, _cell):
            lines.append(f"| {escape_markdown(set_name)} | " + " | ".join(cells) + " |")
        header, stage_rows = held_out_stage_rows(results, name, _cell)
        lines += [
            "",
            "| stage | " + " | ".join(escape_markdown(h) for h in header) + " |",
            "| --- |" + " ---: |" * len(header),
        ]
        lines += [
            "| " + " | ".join([escape_markdown(row[0]), *row[1:]]) + " |" for row in stage_rows
        ]
        path = out / f"{label}_held_out{'' if number == 0 else f'_{number}'}.png"
        fig, _ = plot_held_out(
            held_out,
            name,
            title=f"held-out sets, {plain(name)}: {plain(title)}",
            ylabel=plain(matrix.score),
        )
        fig.savefig(path, dpi=120)
        _pyplot().close(fig)
        lines += ["", f"![held-out sets: {escape_markdown(name)}]({path.name})", ""]
    note = held_out_note(results)
    if note is not None:  # the report's own words, no name from the file
        lines += [note, ""]
    lines += [f"- {escape_markdown(n)}" for n in held_out_missing(results)]
    return lines if lines[-1] == "" else [*lines, ""]


def held_out_note(results: Any) -> str | None:
    """What ``[low, high]`` means in the held-out tables (plain text); ``None`` when no matrix
    has held-out intervals."""
    held_out = results.held_out
    if held_out is None or not any(_interval_ends(results, n) for n in held_out.scores):
        return None
    confidence = results.intervals.confidence
    return (
        f"Each [low, high]: {100 * confidence:g}% intervals from the sets' test items (Wilson / t "
        "for the scores; paired bootstrap over each set's items for delta and worst drop, one "
        "resample of a set's items at the baseline and at every stage): the error of the "
        "finite set, not the variation between runs."
    )


def held_out_missing(results: Any) -> list[str]:
    """Why a matrix's held-out numbers are printed without intervals (plain text, one line per
    matrix without them)."""
    held_out = results.held_out
    if held_out is None:
        return []
    out = []
    for name in held_out.scores:
        if _interval_ends(results, name) is not None:
            continue
        intervals = getattr(results, "intervals", None)
        if intervals is None:
            why = "the run has no per-item records (item_records= not set)"
        elif name not in intervals.matrices:
            skipped = None if results.items is None else results.items.skipped.get(name)
            why = "matrix not recorded per item" + (f": {skipped}" if skipped else "")
        else:
            why = "the intervals section holds no held-out interval of this matrix"
        out.append(f"{name}: held-out values without an interval: {why}")
    return out


def held_out_rows(
    results: Any, name: str, cell: Callable[[float, tuple[float, float] | None], str]
) -> list[tuple[str, list[str]]]:
    """Per set of matrix ``name``: its name and the cells baseline, final, delta, worst drop
    written by ``cell(value, (low, high) or None)``."""
    ends = _interval_ends(results, name)
    return [
        (set_name, [cell(v, None if ends is None else ends[key][k]) for key, v in row.items()])
        for k, (set_name, row) in enumerate(results.held_out.summary(name).items())
    ]


def held_out_stage_rows(
    results: Any, name: str, cell: Callable[[float, tuple[float, float] | None], str]
) -> tuple[list[str], list[list[str]]]:
    """The header (per set: its score, and its delta against the baseline) and one row per
    evaluation (the baseline, then after each stage): each set's score with its cell interval
    and its delta with its paired-bootstrap interval, written by ``cell``."""
    held_out = results.held_out
    baseline, scores = held_out.baseline[name], held_out.scores[name]
    intervals = getattr(results, "intervals", None)
    held = None if intervals is None else intervals.held_out.get(name)
    header = [h for set_name in held_out.names for h in (set_name, f"{set_name} delta")]
    task_names = list(results.task_names)
    rows = []
    for i in range(scores.shape[0] + 1):
        label = "baseline" if i == 0 else f"after {task_names[i - 1]}"
        row = [label]
        for k in range(len(held_out.names)):
            value = float(baseline[k] if i == 0 else scores[i - 1, k])
            ends = delta = None
            if held is not None:
                low = held.baseline_low[k] if i == 0 else held.low[i - 1, k]
                high = held.baseline_high[k] if i == 0 else held.high[i - 1, k]
                ends = (float(low), float(high))
                if i > 0:
                    delta = (float(held.delta[1][i - 1, k]), float(held.delta[2][i - 1, k]))
            change = 0.0 if i == 0 else value - float(baseline[k])
            row += [cell(value, ends), "—" if i == 0 else cell(change, delta)]
        rows.append(row)
    return header, rows


def _cell(value: float, ends: tuple[float, float] | None) -> str:
    if not math.isfinite(value):
        return "n/a"
    text = f"{value + 0.0:.4f}"
    if ends is not None and all(math.isfinite(e) for e in ends):
        text += f" [{ends[0] + 0.0:.4f}, {ends[1] + 0.0:.4f}]"
    return text


def _interval_ends(results: Any, name: str) -> dict[str, list[tuple[float, float]]] | None:
    """Per summary column (``baseline``, ``final``, ``delta``, ``worst_drop``) each set's
    ``(low, high)``, from the ``intervals`` section (``None`` without one for ``name``)."""
    intervals = getattr(results, "intervals", None)
    held = None if intervals is None else intervals.held_out.get(name)
    if held is None or held.low.shape[0] == 0:
        return None

    def pairs(low: Any, high: Any) -> list[tuple[float, float]]:
        return list(zip(low.tolist(), high.tolist(), strict=True))

    return {
        "baseline": pairs(held.baseline_low, held.baseline_high),
        "final": pairs(held.low[-1], held.high[-1]),
        "delta": pairs(held.delta[1][-1], held.delta[2][-1]),
        "worst_drop": pairs(held.worst_drop[1], held.worst_drop[2]),
    }

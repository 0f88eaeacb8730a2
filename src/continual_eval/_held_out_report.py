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

__all__ = ["held_out_run_lines", "plot_held_out"]


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
        ends = _interval_ends(results, name)
        for k, (set_name, row) in enumerate(held_out.summary(name).items()):
            cells = [_cell(v, None if ends is None else ends[key][k]) for key, v in row.items()]
            lines.append(f"| {escape_markdown(set_name)} | " + " | ".join(cells) + " |")
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
    if any(_interval_ends(results, name) is not None for name in held_out.scores):
        confidence = results.intervals.confidence
        lines += [
            f"[low, high]: {confidence:.0%} intervals from the sets' test items (Wilson / t for "
            "the scores; paired bootstrap over each set's items for delta and worst drop): the "
            "error of the finite set, not the variation between runs.",
            "",
        ]
    return lines


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

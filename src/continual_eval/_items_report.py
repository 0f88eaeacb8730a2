"""The per-item part of ``continual-eval report``: for a run with ``intervals`` and ``items``
sections (``item_records=``), per recorded matrix a table of the metrics with their paired
bootstrap intervals (the settings stated; with per-step evaluations also each task's stability
gap, its depth and recovery steps), and per 0/1 matrix the item transitions picture
(``<label>_transitions[_<k>].png``): the items of the tasks seen that went right -> wrong and
wrong -> right against the previous stage, and each task's fraction of items forgotten at least
once, over the stages."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from continual_eval.results.intervals import Transitions

__all__ = ["items_run_lines", "plot_transitions"]


def plot_transitions(
    transitions: Transitions,
    task_names: list[str],
    *,
    title: str | None = None,
) -> tuple[Any, Any]:
    """Two panels over the stages ``i``: left, the items of the tasks trained so far (``j <=
    i``) that went right -> wrong (down) and wrong -> right (up) since the previous evaluation
    (stage 0: since the baseline); right, each task's fraction of items forgotten at least once
    after it was learned (``forgotten_once / n_j``). Returns ``(fig, axes)``."""
    from continual_eval.plotting import TRAJECTORY_MARKERS, _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 4.0), layout="constrained")
    s = transitions.right_to_wrong.shape[0]
    stages = list(range(s))
    lost = transitions.right_to_wrong.nan_to_num(0.0).sum(dim=1)
    gained = transitions.wrong_to_right.nan_to_num(0.0).sum(dim=1)
    left = axes[0]
    left.bar(stages, gained.tolist(), color="tab:green", label="wrong -> right")
    left.bar(stages, (-lost).tolist(), color="tab:red", label="right -> wrong")
    left.axhline(0, color="black", linewidth=0.8)
    left.set_xticks(stages, [task_names[i] for i in stages], rotation=30 if s > 4 else 0)
    left.set_xlabel("after training on")
    left.set_ylabel("items of the tasks seen, vs the previous stage")
    left.legend(fontsize="small")
    left.grid(alpha=0.3, axis="y")
    right = axes[1]
    fraction = transitions.forgotten_once_fraction
    for j in range(min(s, fraction.shape[1])):
        values = torch.where(torch.arange(s) >= j, fraction[:, j], math.nan)
        right.plot(
            stages,
            values.tolist(),
            marker=TRAJECTORY_MARKERS[j % len(TRAJECTORY_MARKERS)],
            markerfacecolor="none",
            label=task_names[j],
        )
    right.set_xticks(stages, [task_names[i] for i in stages], rotation=30 if s > 4 else 0)
    right.set_ylim(-0.02, 1.02)
    right.set_xlabel("after training on")
    right.set_ylabel("fraction forgotten at least once")
    right.grid(alpha=0.3)
    if s <= 20:
        right.legend(fontsize="small", title="task")
    if title:
        fig.suptitle(title)
    return fig, axes


def _number(value: float) -> str:
    return f"{value + 0.0:.4f}" if math.isfinite(value) else "n/a"


def _gap_rows(held: Any, task_names: list[str]) -> list[str]:
    """Table rows of the stability gap of each task ``j`` while ``j + 1`` trains (the
    ``step_metrics``' ``gap_depth`` and ``gap_recovery_steps``): a recovery's NaN, where its
    depth is defined, reads "not recovered" (within stage ``j + 1``)."""
    from continual_eval._markdown import escape_markdown

    depth = held.step_metrics.get("gap_depth")
    recovery = held.step_metrics.get("gap_recovery_steps")
    rows: list[str] = []
    for j in range(0 if depth is None else len(depth[0])):
        task = escape_markdown(task_names[j])
        values = [float(t[j]) for t in depth]
        rows.append(
            f"| {escape_markdown('gap_depth')} ({task}) | "
            + " | ".join(map(_number, values))
            + " |"
        )
        if recovery is None:
            continue
        never = "not recovered" if math.isfinite(values[0]) else "n/a"
        steps = [float(t[j]) for t in recovery]
        cells = [f"{v:.0f}" if math.isfinite(v) else never for v in steps]
        rows.append(
            f"| {escape_markdown('gap_recovery_steps')} ({task}) | " + " | ".join(cells) + " |"
        )
    return rows


def items_run_lines(
    results: Any, label: str, title: str, out: Path, plain: Callable[[str], str]
) -> list[str]:
    """``report.md`` lines of a run's per-item records (none without them): the metrics'
    intervals per matrix, and the transitions picture of each 0/1 matrix drawn into ``out``;
    ``plain`` cleans a name for a picture."""
    from continual_eval._markdown import escape_markdown
    from continual_eval.plotting import _pyplot

    intervals, items = results.intervals, results.items
    if intervals is None:
        return []
    lines = ["### Intervals from the test items", ""]
    lines += [
        f"{intervals.confidence:.0%} intervals of one run's test-set noise (not the variation "
        f"between seeds): the metrics by the {intervals.method} ({intervals.resamples} "
        f"resamples, {intervals.weights} weights, seed {intervals.seed}; one resample of each "
        "task's items in every cell of the task, so BWT and forgetting keep their pairing); the "
        "cells (error bars of the trajectories) by Wilson (0/1 items) or Student t.",
        "",
    ]
    for name, held in intervals.matrices.items():
        lines += [
            f"**{escape_markdown(name)}** (cells: {held.cell_method})",
            "",
            "| metric | value | low | high |",
            "| --- | ---: | ---: | ---: |",
        ]
        for key, (estimate, low, high) in held.metrics.items():
            lines.append(
                f"| {escape_markdown(key)} | {_number(estimate)} | {_number(low)} | "
                f"{_number(high)} |"
            )
        lines += _gap_rows(held, results.task_names)
        for key, why in held.unavailable.items():
            lines.append(f"| {escape_markdown(key)} | no interval: {escape_markdown(why)} | | |")
        lines.append("")
    if items is not None and items.skipped:
        skipped = "; ".join(
            f"{escape_markdown(k)}: {escape_markdown(v)}" for k, v in items.skipped.items()
        )
        lines += [f"Not recorded per item: {skipped}.", ""]
    if items is None or not items.transitions:
        return lines
    names = [plain(n) for n in results.task_names]
    shown = False
    for number, (name, moves) in enumerate(items.transitions.items()):
        if moves.right_to_wrong.shape[0] == 0:
            continue
        path = out / f"{label}_transitions{'' if number == 0 else f'_{number}'}.png"
        fig, _ = plot_transitions(
            moves, names, title=f"item transitions, {plain(name)}: {plain(title)}"
        )
        fig.savefig(path, dpi=120)
        _pyplot().close(fig)
        final = moves.forgotten_once_fraction[-1]
        low, high = (bound[-1] for bound in moves.forgotten_once_interval)
        seen = [
            f"{escape_markdown(results.task_names[j])} {final[j].item():.3f} "
            f"[{low[j].item():.3f}, {high[j].item():.3f}]"
            for j in range(min(moves.right_to_wrong.shape[0], len(final)))
            if math.isfinite(final[j].item())
        ]
        percent = f"{100 * moves.confidence:g}%"
        lines += [
            f"**{escape_markdown(name)}**: fraction of each task's items forgotten at least once "
            f"by the last stage: {', '.join(seen)}",
            "",
            f"![item transitions: {escape_markdown(name)}]({path.name})",
            "",
        ]
        shown = True
    if shown:
        lines += [
            f"\\[low, high\\]: the {percent} Wilson interval of the fraction forgotten at least "
            "once, as a rate over the task's items (i.i.d. draws of its test distribution). The "
            "figure's transition counts have no interval: they count which of this test set's "
            "items moved.",
            "",
        ]
    return lines

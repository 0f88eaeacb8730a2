"""Plain-text and markdown tables of stream metrics; ``--`` marks an absent value."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from continual_eval.stream.metrics import METRIC_NAMES

__all__ = [
    "ABSENT",
    "ROW_TITLES",
    "format_markdown",
    "format_seed_table",
    "format_table",
    "format_value",
]

ABSENT = "--"

#: Printed title of each of the fifteen rows.
ROW_TITLES: dict[str, str] = {
    "per_configuration_reward": "Per-configuration reward J",
    "adaptation_speed": "Adaptation speed",
    "recovery_time": "Recovery time",
    "forgetting": "Forgetting",
    "stability_variance": "Stability (variance)",
    "performance_gap": "Performance gap",
    "zero_shot_reward": "Zero-shot reward",
    "regret": "Regret",
    "effective_rank": "Effective rank",
    "settled_reward": "Settled reward",
    "settled_reward_policy": "Settled reward (policy)",
    "discounted_return": "Return (discounted)",
    "undiscounted_return": "Return (undiscounted)",
    "invalid_action_rate": "Invalid-action rate",
    "solve_rate": "Solve rate",
}

_STEP_COUNTS = {"adaptation_speed", "recovery_time"}


def format_value(metric: str, value: float | None) -> str:
    """``--`` for ``None``; step counts as integers when whole; ``+.4f`` for forgetting."""
    if value is None:
        return ABSENT
    if metric in _STEP_COUNTS:
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"
    if metric == "forgetting":
        return f"{value:+.4f}"
    return f"{value:.4f}"


def describe_params(result: Mapping[str, Any]) -> str:
    """One line naming the anchor, every parameter and the bound's derivation."""
    p = result["params"]
    parts = [f"anchor={p['anchor']}", f"alpha={p['alpha']}"]
    parts.append(f"eps={p['eps']}" if p["eps"] is not None else "eps=0.5*|R_ub|")
    parts += [
        f"floor={p['recovery_floor']}",
        f"tail={p['tail_fraction']}",
        f"zero_shot_window={p['zero_shot_window']}",
        f"gamma={p['gamma']}",
    ]
    bound = result.get("bound")
    if bound is None and "bounds" in result:
        derivs = {b["derivation"] for b in result["bounds"] if b and "derivation" in b}
        bound = {"derivation": ",".join(sorted(derivs))} if derivs else None
    if bound is None:
        parts.append("ceiling=none")
    elif "derivation" in bound:
        parts.append(f"ceiling={bound['derivation']}")
    else:
        parts.append("ceiling=per-regime")
    return "  ".join(parts)


def _grid(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [header, *rows]
    ]
    return "\n".join(line.rstrip() for line in lines)


def _metric_grid(result: Mapping[str, Any], cell: Callable[[str, Any], str]) -> str:
    """One row per metric, one column per regime; ``cell(metric, value)`` formats a value."""
    labels = list(result["per_regime"])
    header = ["metric", *labels]
    rows = [
        [ROW_TITLES[m], *(cell(m, result["per_regime"][lb][m]) for lb in labels)]
        for m in METRIC_NAMES
    ]
    return _grid(header, rows)


def format_table(result: Mapping[str, Any]) -> str:
    """The fifteen-row table of a :func:`compute_all_metrics` result, one column per regime."""
    return f"{describe_params(result)}\n{_metric_grid(result, format_value)}"


def _seed_cell(metric: str, cell: Mapping[str, Any]) -> str:
    if cell["mean"] is None:
        return ABSENT
    out = format_value(metric, cell["mean"])
    if cell["spread"] is not None:
        out += f" ± {cell['spread']:.4f}"
    return f"{out} (n={cell['n']})"


def format_seed_table(aggregate: Mapping[str, Any]) -> str:
    """The fifteen-row table of an :func:`aggregate_seeds` result: ``mean ± spread (n=...)``."""
    grid = _metric_grid(aggregate, _seed_cell)
    return f"{describe_params(aggregate)}  seeds={aggregate['n_seeds']}\n{grid}"


def format_markdown(result: Mapping[str, Any]) -> str:
    """The fifteen-row table as a markdown table (for TensorBoard text and reports)."""
    labels = list(result["per_regime"])
    lines = [
        f"`{describe_params(result)}`",
        "",
        "| metric | " + " | ".join(labels) + " |",
        "|---|" + "---:|" * len(labels),
    ]
    for m in METRIC_NAMES:
        cells = [format_value(m, result["per_regime"][lb][m]) for lb in labels]
        lines.append(f"| {ROW_TITLES[m]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

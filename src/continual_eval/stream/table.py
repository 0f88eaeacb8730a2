"""Plain-text and markdown tables of stream metrics; ``--`` marks an absent value.

Regime labels and ceiling derivations come from trace and ceiling files, so they are shown, never
passed through: a character that is not printable (a control character such as the ESC that
starts an ANSI escape sequence, a line break, a bidi override) is written as its Python escape
(``\\x1b``, ``\\n``, ``\\u202e``), and a label longer than ``label_width`` characters is cut in
the middle (``first…last``). The JSON output (``--json``, ``stream_metrics.json``) keeps every
full name. A number that is not finite prints as ``inf``, ``-inf`` or ``nan``.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

from continual_eval.stream.metrics import METRIC_NAMES

__all__ = [
    "ABSENT",
    "DEFAULT_LABEL_WIDTH",
    "ROW_TITLES",
    "format_markdown",
    "format_seed_table",
    "format_table",
    "format_value",
    "shown_label",
]

ABSENT = "--"
#: the widest a regime label is shown in a table, in characters (after escaping)
DEFAULT_LABEL_WIDTH = 32
_ELLIPSIS = "\u2026"
#: Unicode categories written as escapes: control, format (bidi overrides, zero-width), surrogate,
#: private-use, unassigned, line and paragraph separators
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
#: characters that are markup inside a GFM table cell
_MARKDOWN_SPECIAL = frozenset("\\`*_[]|<>&#~$")


def _shown_char(ch: str) -> str:
    if ch.isprintable() or unicodedata.category(ch) not in _HIDDEN:
        return ch
    return ch.encode("unicode_escape").decode("ascii")


def shown_label(label: str, width: int = DEFAULT_LABEL_WIDTH) -> str:
    """``label`` as a table shows it: unprintable characters as Python escapes (``\\x1b``), at
    most ``width`` characters, a longer label cut in the middle around ``…``. Reads at most
    ``2 * width`` characters of ``label``, however long it is."""
    if width < 1:
        raise ValueError(f"label width must be >= 1, got {width}")
    if len(label) <= width and label.isprintable():
        return label
    if len(label) <= 2 * width:
        pieces = [_shown_char(ch) for ch in label]
        if sum(map(len, pieces)) <= width:
            return "".join(pieces)
    else:
        pieces = [_shown_char(ch) for ch in (*label[:width], *label[-width:])]
    budget = width - 1
    head_budget, tail_budget = (budget + 1) // 2, budget // 2
    head, used = [], 0
    for piece in pieces:
        if used + len(piece) > head_budget:
            break
        head.append(piece)
        used += len(piece)
    tail: list[str] = []
    used = 0
    for piece in reversed(pieces[len(head) :]):
        if used + len(piece) > tail_budget:
            break
        tail.append(piece)
        used += len(piece)
    return "".join(head) + _ELLIPSIS + "".join(reversed(tail))


def _markdown_label(label: str, width: int) -> str:
    """A label inside a markdown table cell: shown (escaped, cut), markup characters escaped."""
    return "".join("\\" + ch if ch in _MARKDOWN_SPECIAL else ch for ch in shown_label(label, width))


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


#: from this magnitude on a table writes a number as ``.4e`` (``8.0000e+306``, not 309 digits)
_LARGE = 1e6


def _compact(value: float, fixed: str) -> str:
    """``value`` in the format ``fixed``, or ``.4e`` when its magnitude is 1e6 or more."""
    if abs(value) >= _LARGE:
        return f"{value:+.4e}" if fixed.startswith("+") else f"{value:.4e}"
    return format(value, fixed)


def format_value(metric: str, value: float | None) -> str:
    """``--`` for ``None``; step counts as integers when whole; ``+.4f`` for forgetting;
    ``inf``/``-inf``/``nan`` for a number that is not finite; a magnitude of 1e6 or more as
    ``.4e`` (the JSON output keeps every number whole)."""
    if value is None:
        return ABSENT
    if not math.isfinite(value):
        return str(float(value))
    if abs(value) >= _LARGE:
        return _compact(value, "+.4f" if metric == "forgetting" else ".4f")
    if metric in _STEP_COUNTS:
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"
    if metric == "forgetting":
        return f"{value:+.4f}"
    return f"{value:.4f}"


def describe_params(result: Mapping[str, Any], width: int = DEFAULT_LABEL_WIDTH) -> str:
    """One line naming the anchor, every parameter and the bound's derivation (a derivation read
    from a ceiling file is shown like a label)."""
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
        parts.append(f"ceiling={shown_label(str(bound['derivation']), width)}")
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


def _metric_grid(result: Mapping[str, Any], cell: Callable[[str, Any], str], width: int) -> str:
    """One row per metric, one column per regime; ``cell(metric, value)`` formats a value."""
    labels = list(result["per_regime"])
    header = ["metric", *(shown_label(lb, width) for lb in labels)]
    rows = [
        [ROW_TITLES[m], *(cell(m, result["per_regime"][lb][m]) for lb in labels)]
        for m in METRIC_NAMES
    ]
    return _grid(header, rows)


def format_table(result: Mapping[str, Any], *, label_width: int = DEFAULT_LABEL_WIDTH) -> str:
    """The fifteen-row table of a [`compute_all_metrics`][continual_eval.stream.compute_all_metrics]
    result, one column per regime (labels shown by `shown_label`, at most ``label_width``
    characters)."""
    grid = _metric_grid(result, format_value, label_width)
    return f"{describe_params(result, label_width)}\n{grid}"


def _seed_cell(metric: str, cell: Mapping[str, Any]) -> str:
    if cell["mean"] is None:
        return ABSENT
    out = format_value(metric, cell["mean"])
    if cell["spread"] is not None:
        spread = cell["spread"]
        out += f" ± {_compact(spread, '.4f')}" if math.isfinite(spread) else f" ± {float(spread)}"
    return f"{out} (n={cell['n']})"


def format_seed_table(
    aggregate: Mapping[str, Any], *, label_width: int = DEFAULT_LABEL_WIDTH
) -> str:
    """The fifteen-row table of an [`aggregate_seeds`][continual_eval.stream.aggregate_seeds]
    result: ``mean ± spread (n=...)``."""
    grid = _metric_grid(aggregate, _seed_cell, label_width)
    return f"{describe_params(aggregate, label_width)}  seeds={aggregate['n_seeds']}\n{grid}"


def format_markdown(result: Mapping[str, Any], *, label_width: int = DEFAULT_LABEL_WIDTH) -> str:
    """The fifteen-row table as a markdown table (for TensorBoard text and reports); labels
    shown by `shown_label`, their markup characters escaped."""
    labels = list(result["per_regime"])
    params = describe_params(result, label_width).replace("`", "'")
    lines = [
        f"`{params}`",
        "",
        "| metric | " + " | ".join(_markdown_label(lb, label_width) for lb in labels) + " |",
        "|---|" + "---:|" * len(labels),
    ]
    for m in METRIC_NAMES:
        cells = [format_value(m, result["per_regime"][lb][m]) for lb in labels]
        lines.append(f"| {ROW_TITLES[m]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

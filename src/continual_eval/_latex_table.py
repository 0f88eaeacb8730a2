"""The LaTeX table of ``continual-eval report`` (``table.tex``): one row per method, booktabs rules.

Each cell is the mean over the method's runs with its spread, ``mean ± s`` where ``s`` is the
sample standard deviation (``spread="std"``) or the half-width of the Student-t interval of the
mean (``spread="ci"``, at the report's confidence); a method with one run shows its value alone,
followed in small type by ``[low, high]``, that run's interval from its test items, where the
column gives one (``LatexColumn.single``; the caption then says so).
The header gives each metric's direction (↑ higher is better, ↓ lower is better), and in every
column the best mean *at the printed precision* is bold (ties all bold; none when fewer than
two methods have a value or when all of them tie). The table needs ``\\usepackage{booktabs}``
and nothing else; names are escaped for LaTeX (`escape_latex`). Set in ``\\small`` with 3 pt
column gaps, the five metric columns fit a 5.5 in text width (NeurIPS); per-task columns make it
wider (a ``table*`` in a two-column paper).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from continual_eval.results.schema import printable
from continual_eval.seed_statistics import SeedSummary

__all__ = ["SPREADS", "LatexColumn", "escape_latex", "latex_table"]

SPREADS = ("std", "ci")
"""What ``±`` shows: the sample standard deviation, or the half-width of the t interval."""
#: LaTeX's special characters and the text that prints each one literally (text mode). ``[``,
#: ``]`` and ``*`` are braced so that a row never starts with what ``\\`` reads as its own
#: argument (and ``--`` is split, below, so that it does not become a dash); ``<``, ``>``, ``|``
#: have no glyph of their own in LaTeX's default font encoding.
_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "{": r"\{",
    "}": r"\}",
    "$": r"\$",
    "&": r"\&",
    "#": r"\#",
    "%": r"\%",
    "_": r"\_",
    "^": r"\textasciicircum{}",
    "~": r"\textasciitilde{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    "`": r"\textasciigrave{}",
    "'": r"\textquotesingle{}",
    '"': r"\textquotedbl{}",
    "[": "{[}",
    "]": "{]}",
    "*": "{*}",
}


#: a hyphen followed by another: ``--`` and ``---`` would print as dashes
_LIGATURE = re.compile(r"-(?=-)")
#: the header's direction marks
_ARROWS = {True: r"$\uparrow$", False: r"$\downarrow$"}


def escape_latex(text: str, limit: int = 80) -> str:
    """``text`` as literal LaTeX text on one line: control and line-separator characters as
    ``\\uXXXX``-style escapes, cut to ``limit`` characters, every special character replaced by
    a command that prints it (``_`` -> ``\\_``, ``\\`` -> ``\\textbackslash{}``, ...).

    >>> escape_latex(r"50% \\textbf{x} & y_1")
    '50\\\\% \\\\textbackslash{}textbf\\\\{x\\\\} \\\\& y\\\\_1'
    """
    escaped = "".join(_LATEX_SPECIAL.get(ch, ch) for ch in printable(text, limit))
    return _LIGATURE.sub("-{}", escaped)


@dataclass(frozen=True)
class LatexColumn:
    """One column: its title (plain text, escaped here), the direction of the metric, one
    ``SeedSummary`` per method (in row order) and, optionally, each method's single-run
    interval."""

    title: str
    higher_is_better: bool
    stats: Sequence[SeedSummary]
    #: per method, the ``(low, high)`` interval of one run's value from its test items (shown
    #: after the value of a method with one run; ``None``: none)
    single: Sequence[tuple[float, float] | None] | None = None


def _half_width(stats: SeedSummary, spread: str) -> float | None:
    if spread == "std":
        return stats.std
    ci = stats.t_interval
    return None if ci is None else (ci.high - ci.low) / 2


def _best(column: LatexColumn, decimals: int) -> set[int]:
    """Rows whose mean, rounded to ``decimals``, is the best of the column (ties all; none with
    fewer than two values, or when every value ties)."""
    shown = {k: round(s.mean, decimals) for k, s in enumerate(column.stats) if s.mean is not None}
    if len(shown) < 2:
        return set()
    best = max(shown.values()) if column.higher_is_better else min(shown.values())
    found = {k for k, v in shown.items() if v == best}
    return set() if len(found) == len(shown) else found  # all equal: nothing stands out


def _cell(
    stats: SeedSummary,
    runs: int,
    spread: str,
    decimals: int,
    bold: bool,
    single: tuple[float, float] | None = None,
) -> str:
    if stats.mean is None:
        return "--"
    half = _half_width(stats, spread)
    body = f"{stats.mean:.{decimals}f}"
    if half is not None:
        body += rf" \pm {half:.{decimals}f}"
    text = rf"$\mathbf{{{body}}}$" if bold else f"${body}$"
    if single is not None and stats.n == 1:
        low, high = (f"{v:.{decimals}f}" for v in single)
        text += rf"\,{{\scriptsize $[{low}, {high}]$}}"
    return text if stats.n == runs else rf"{text}\,\textsuperscript{{($n={stats.n}$)}}"


def latex_table(
    methods: Sequence[str],
    runs: Sequence[int],
    columns: Sequence[LatexColumn],
    *,
    spread: str = "std",
    confidence: float = 0.95,
    decimals: int = 3,
    groups: Sequence[tuple[str, int]] | None = None,
    caption: str | None = None,
    label: str = "tab:continual-eval",
    notes: Sequence[str] = (),
) -> str:
    """A ``table`` environment with a booktabs ``tabular``: a row per method (its name and
    ``n``, the runs), a column per ``LatexColumn`` (``mean ± spread``, best in bold).

    ``groups``: ``(title, number of columns)`` spanning the columns in order (a first header row
    with ``\\cmidrule``); ``caption`` (plain text, escaped) is followed by what ``±`` and the
    bold cells mean; ``notes`` (plain text, escaped): lines under the table in small type (why
    a one-run value has no interval).
    """
    if spread not in SPREADS:
        raise ValueError(f"spread must be one of {', '.join(SPREADS)}, got {spread!r}")
    if len(runs) != len(methods) or any(len(c.stats) != len(methods) for c in columns):
        raise ValueError("latex_table needs one run count and one summary per method and column")
    pct = f"{100 * confidence:g}\\%"
    meaning = (
        "mean $\\pm$ sample standard deviation over seeds"
        if spread == "std"
        else f"mean $\\pm$ half-width of the {pct} Student-t interval of the mean over seeds"
    )
    text = escape_latex(caption, 400) + ". " if caption else ""
    text += (
        f"Each cell: {meaning} ($n$ runs; a value alone for $n = 1$). "
        "$\\uparrow$: higher is better, $\\downarrow$: lower is better; "
        "best per column in bold."
    )
    if any(v is not None for c in columns for v in (c.single or ())):
        text += (
            f" [low, high] after a value of one run: that run's {pct} interval of the test-set "
            "noise from its per-item records (paired bootstrap over test items for the metrics, "
            "Wilson or Student-t for a cell), not the variation between seeds."
        )
    best = [_best(c, decimals) for c in columns]
    lines = [
        "% written by continual-eval report; needs \\usepackage{booktabs}",
        "\\begin{table}[t]",
        "\\centering",
        "\\small",
        "\\setlength{\\tabcolsep}{3pt}",
        f"\\caption{{{text}}}",
        f"\\label{{{label}}}",
        "\\begin{tabular}{l r " + " ".join("c" for _ in columns) + "}",
        "\\toprule",
    ]
    if groups:
        first = 3
        spans, rules = ["", ""], []
        for title, width in groups:
            spans.append(f"\\multicolumn{{{width}}}{{c}}{{{escape_latex(title)}}}")
            rules.append(f"\\cmidrule(lr){{{first}-{first + width - 1}}}")
            first += width
        lines += [" & ".join(spans) + " \\\\", "".join(rules)]
    arrows = [f"{escape_latex(c.title)} {_ARROWS[c.higher_is_better]}" for c in columns]
    lines += ["Method & $n$ & " + " & ".join(arrows) + " \\\\", "\\midrule"]
    for k, method in enumerate(methods):
        cells = [
            _cell(
                c.stats[k],
                runs[k],
                spread,
                decimals,
                k in best[i],
                c.single[k] if c.single else None,
            )
            for i, c in enumerate(columns)
        ]
        lines.append(" & ".join([escape_latex(method), str(runs[k]), *cells]) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    if notes:
        shown = " ".join(escape_latex(n, 600) + "." for n in notes)
        lines += [f"\\par\\smallskip{{\\footnotesize One-run values without an interval: {shown}}}"]
    lines += ["\\end{table}", ""]
    return "\n".join(lines)

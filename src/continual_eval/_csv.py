"""CSV text that a spreadsheet opens as data: one writer for every CSV file the package writes.

A cell that begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is read by
spreadsheet programs as a formula (CSV injection). `csv_cell` neutralises such text cells as
the OWASP rule says, by prefixing a single quote; numbers are written as they are (``-0.25`` stays a
number), and so are text cells that are a plain decimal number.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable, Sequence

__all__ = ["FORMULA_PREFIXES", "csv_cell", "csv_text"]

#: first characters that make a spreadsheet read a cell as a formula (OWASP, "CSV Injection")
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def csv_cell(value: object) -> str:
    """``value`` as a CSV cell's text: ``None`` and non-finite floats as ``""``, numbers as
    written by ``repr``, text that a spreadsheet would run as a formula prefixed with ``'``.

    >>> [csv_cell(v) for v in ("=HYPERLINK(1)", "-0.5", -0.5, "naive", None, float("nan"))]
    ["'=HYPERLINK(1)", '-0.5', '-0.5', 'naive', '', '']
    """
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    text = str(value)
    if text.startswith(FORMULA_PREFIXES) and not _NUMBER.fullmatch(text):
        return "'" + text
    return text


def csv_text(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A whole CSV document (``\\n`` line ends) with every cell through `csv_cell`."""
    # rows end in "\r\n" so that the csv module quotes a cell holding a bare "\r" (it quotes
    # only the line terminator's characters: with "\n" a "\r" in a name split the row), then
    # each row's own terminator becomes "\n"
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    for row in (header, *rows):
        writer.writerow([csv_cell(cell) for cell in row])
        buffer.seek(buffer.tell() - 2)
        buffer.truncate()
        buffer.write("\n")
    return buffer.getvalue()

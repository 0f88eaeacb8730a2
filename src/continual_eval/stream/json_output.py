"""The JSON form of a stream result (``--json``, ``stream_metrics.json``): strict JSON, always.

JSON has no infinity or NaN. A metric whose true value lies beyond float64's range (a return of
rewards near ``1.7e308`` overflows to ``inf``) is written as ``null`` *and* listed under the
top-level key ``"nonfinite"``: an object mapping the value's JSON Pointer (RFC 6901, e.g.
``"/per_regime/a/undiscounted_return"``) to ``"inf"``, ``"-inf"`` or ``"nan"``. A ``null`` that
is not listed there is an absent metric (the absence rule); ``"nonfinite"`` is ``{}`` when every
number is finite.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["NONFINITE_KEY", "json_text", "split_nonfinite"]

#: the top-level key listing the non-finite numbers written as ``null``
NONFINITE_KEY = "nonfinite"


def _pointer_token(key: object) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def split_nonfinite(value: Any, pointer: str = "", found: dict[str, str] | None = None) -> Any:
    """A copy of ``value`` (dicts, lists, tuples, numbers, strings) with every non-finite float
    replaced by ``None``; each replaced float is recorded in ``found`` as ``pointer -> "inf" |
    "-inf" | "nan"``."""
    if found is None:
        found = {}
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        found[pointer] = str(value)
        return None
    if isinstance(value, Mapping):
        return {
            k: split_nonfinite(v, f"{pointer}/{_pointer_token(k)}", found) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [split_nonfinite(v, f"{pointer}/{i}", found) for i, v in enumerate(value)]
    return value


def json_text(result: Mapping[str, Any], indent: int | None = 2) -> str:
    """``result`` as strict JSON: non-finite numbers as ``null``, listed under ``"nonfinite"``."""
    if NONFINITE_KEY in result:
        raise ValueError(f"a stream result must not hold the key {NONFINITE_KEY!r} itself")
    found: dict[str, str] = {}
    clean = split_nonfinite(result, "", found)
    clean[NONFINITE_KEY] = found
    return json.dumps(clean, indent=indent, allow_nan=False)

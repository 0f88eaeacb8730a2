"""The error the evaluation raises, and short descriptions of the values it complains about."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor


class EvaluationError(ValueError):
    """A test loader or the model's output cannot be scored; the message names the task."""

    #: set by a count-based scorer's ``result`` (which scores every task at once): the row of the
    #: task it is about, so that the evaluation loop can name that task
    task_row: int | None = None


def _describe(value: Any, depth: int = 0) -> str:
    """A short description of a model output: tensors as ``Tensor[8, 3] float32``, containers with
    their elements (one level deep)."""
    if isinstance(value, Tensor):
        return f"Tensor{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if depth < 1 and isinstance(value, (tuple, list)):
        inner = ", ".join(_describe(v, depth + 1) for v in value[:6])
        more = ", ..." if len(value) > 6 else ""
        brackets = "()" if isinstance(value, tuple) else "[]"
        return f"{brackets[0]}{inner}{more}{brackets[1]}"
    if depth < 1 and isinstance(value, Mapping):
        items = list(value.items())
        inner = ", ".join(f"{k!r}: {_describe(v, depth + 1)}" for k, v in items[:6])
        return "{" + inner + (", ..." if len(items) > 6 else "") + "}"
    return type(value).__name__


def _what(value: Any) -> str:
    """``_describe`` with an article: ``a Tensor[8] int64``, ``a tuple (...)``, ``an int``."""
    name = type(value).__name__
    shown = _describe(value)
    if shown.startswith("Tensor"):
        name, shown = shown, ""
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name}" + (f" {shown}" if shown and shown != name else "")

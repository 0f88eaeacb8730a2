"""Tensors to the cells of a document and back: NaN (and infinities) are ``null``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["cells", "matrix", "present", "vector"]


def cells(t: Tensor) -> Any:
    """Nested lists of floats with non-finite values as ``None`` (a float or ``None`` for a 0-dim
    tensor)."""
    values = t.detach().to("cpu", torch.float64).numpy()
    out = values.astype(object)
    out[~np.isfinite(values)] = None
    return out.tolist()


def present(value: Tensor | float | None) -> float | None:
    """A number (or 0-dim tensor) as a float, ``None`` where absent (NaN, inf, ``None``)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def vector(values: Sequence[Any]) -> Tensor:
    """``[n]`` float64 from cells (``None`` -> NaN)."""
    return torch.from_numpy(np.array(values, dtype=np.float64).reshape(-1))


def matrix(rows: Sequence[Sequence[Any]], columns: int) -> Tensor:
    """``[n, columns]`` float64 from rows of cells (``None`` -> NaN)."""
    return torch.from_numpy(np.array(rows, dtype=np.float64).reshape(len(rows), columns))

"""Metrics of finite scores that do not fit the dtype: found, recomputed or refused by name.

With ``bounds=None`` a score may be any finite number, up to ``±1.8e308`` in float64 (``±3.4e38``
in float32). Two things can then go wrong, and validation (``validate=True``) tells them apart:

* A *sum* overflows although the value is representable: the mean of ``1e308`` and ``1e308`` is
  ``1e308``, but their sum is ``inf``; a per-stage curve sums whole rows before it divides. Such a
  result is recomputed from the inputs divided by a power of two (exact: only exponents change)
  and multiplied back, so it comes out right.
* A *difference* overflows: ``R[2, 0] - R[0, 0]`` with ``R[2, 0] = 1e308`` and ``R[0, 0] =
  -1e308`` is ``2e308``, beyond the dtype. That transfer or forgetting value has no finite
  representation; it is a ``ValueError`` naming the metric, the task (and stage) and the cells
  with their values, never a silent ``inf`` (which JSON would store as ``null``, an absent value).

Both checks cost one device read of the results, and only run under ``validate``; ordinary
scores never take the recompute path, so their results keep every bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["all_finite", "first_bad", "first_infinite", "no_infinite", "overflow_error", "rescaled"]


def all_finite(*values: Tensor) -> bool:
    """Whether every entry of every tensor is finite (one device read)."""
    flags = [torch.isfinite(v).all() for v in values if v.numel()]
    return bool(torch.stack(flags).all()) if flags else True


def first_bad(values: Tensor) -> tuple[int, ...]:
    """The index of the first non-finite entry (``()`` for a 0-d tensor)."""
    if values.ndim == 0:
        return ()
    return tuple(int(v) for v in (~torch.isfinite(values)).nonzero()[0])


def no_infinite(*values: Tensor) -> bool:
    """Whether no entry of any tensor is ``±inf`` (NaN passes: an absent value, from an absent
    cell; a difference or mean of finite values is never NaN)."""
    flags = [~torch.isinf(v).any() for v in values if v.numel()]
    return bool(torch.stack(flags).all()) if flags else True


def first_infinite(values: Tensor) -> tuple[int, ...]:
    """The index of the first ``±inf`` entry (``()`` for a 0-d tensor)."""
    if values.ndim == 0:
        return ()
    return tuple(int(v) for v in torch.isinf(values).nonzero()[0])


def _scale(tensors: Sequence[Tensor | None], terms: int) -> float:
    """``2**k`` (``k >= 0``) that brings the largest finite magnitude among ``tensors`` to at
    most the dtype's maximum over ``4 * terms``: sums of ``terms`` values, and the difference of
    two such sums, then stay inside the dtype."""
    present = [t for t in tensors if t is not None and t.numel()]
    if not present:
        return 1.0
    dtype = present[0].dtype
    top = max(float(t.masked_fill(~torch.isfinite(t), 0).abs().amax()) for t in present)
    if top == 0.0:
        return 1.0
    max_exponent = math.frexp(torch.finfo(dtype).max)[1]  # 1024 for float64, 128 for float32
    limit_exponent = max_exponent - 2 - math.ceil(math.log2(max(terms, 1)))
    k = math.frexp(top)[1] - limit_exponent
    return math.ldexp(1.0, k) if k > 0 else 1.0


def _multiply(value: Any, factor: float) -> Any:
    if isinstance(value, Tensor):
        return value * factor
    if isinstance(value, Mapping):
        return {k: _multiply(v, factor) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_multiply(v, factor) for v in value)
    return value


def rescaled(
    compute: Callable[..., Any], scores: Tensor, *vectors: Tensor | None, terms: int
) -> Any:
    """``compute(scores / s, *(v / s))`` multiplied back by ``s`` (every tensor, in nested
    dicts and tuples), ``s`` from `_scale`: the metrics are homogeneous of degree one in
    the scores (means, differences, maxima over positive multiples), so this is their value,
    with sums that no longer overflow. Cells far below the largest (by ``2**-1000`` or so) may
    lose digits."""
    s = _scale([scores, *vectors], terms)
    if s == 1.0:
        return compute(scores, *vectors)
    scaled = [None if v is None else v / s for v in vectors]
    return _multiply(compute(scores / s, *scaled), s)


def overflow_error(metric: str, where: str, cells: Sequence[tuple[str, Tensor]]) -> ValueError:
    """The error for ``metric`` at ``where`` (``"task 0"``, ``"stage 3, task 1"``) whose
    ``cells`` (``(name, 0-d tensor)``) are finite but combine beyond the dtype."""
    dtype = cells[0][1].dtype if cells else torch.float64
    shown = ", ".join(f"{name} = {value.item()!r}" for name, value in cells)
    return ValueError(
        f"{metric} of {where} overflows {str(dtype).removeprefix('torch.')}: it combines {shown}, "
        f"whose difference lies beyond ±{torch.finfo(dtype).max:.4g}; the scores are finite "
        "(bounds=None allows any finite score) but this metric of them has no finite value: "
        "rescale the scores"
    )

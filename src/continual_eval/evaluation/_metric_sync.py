"""Gathering a torchmetrics metric's states across ranks when a rank may hold no sample.

torchmetrics' own sync gathers each state with one ``all_gather`` whose size every rank must
agree on; a rank that saw no sample of a task holds an empty list where the others hold tensors
``[n, C]``, sends a 1-D placeholder of another shape and dtype, and the collective fails ("Received
data size doesn't match") or hangs. `gathered_states` runs, for every state of every metric in
the tree, the same two collectives on every rank whatever it holds: one ``all_gather`` of a
fixed-size description (present or not, dtype, shape), then one ``all_gather`` of the state padded
to the largest shape (skipped on every rank when no rank holds one). It then reduces the parts as
torchmetrics' sync would (``cat`` states concatenated, tensor states stacked and reduced) and
holds the reduced states in the metric while its ``compute`` runs (without a sync), so it sees
every rank's samples: the value one process computes on the whole test set.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from continual_eval.evaluation._torchmetrics_adapter import (
    is_cat_reduction,
    metrics_in,
    state_reductions,
)
from continual_eval.evaluation.errors import EvaluationError

__all__ = ["gather_tensor", "gathered_states"]

#: the dtypes a state may have on the wire (their index is sent); bool travels as uint8
_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
#: the most dimensions a state may have
_MAX_DIMS = 8


def _all_gather(tensor: Tensor, group: Any) -> list[Tensor]:
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return parts


def _describe(local: Tensor | None, device: torch.device) -> Tensor:
    """``[kind, dtype index, ndim, *shape, -1...]`` (int64, fixed length); kind 0: no tensor,
    1: a tensor, 2: a tensor the gather cannot carry (raised on every rank after the gather)."""
    meta = torch.full((3 + _MAX_DIMS,), -1, dtype=torch.int64, device=device)
    meta[0] = 0
    if local is not None:
        if local.dtype not in _DTYPES or local.ndim > _MAX_DIMS:
            meta[0] = 2
            return meta
        meta[0], meta[1], meta[2] = 1, _DTYPES.index(local.dtype), local.ndim
        meta[3 : 3 + local.ndim] = torch.tensor(local.shape, dtype=torch.int64)
    return meta


def gather_tensor(
    local: Tensor | None, what: str, device: torch.device, group: Any = None
) -> list[Tensor | None]:
    """Every rank's ``local`` (``None`` where a rank has none), in rank order, on ``device``.

    Two collectives on every rank (one when no rank holds a tensor); ranks holding tensors of
    different dtypes or numbers of dimensions raise the same
    [`EvaluationError`][continual_eval.evaluation.EvaluationError] on every rank.
    """
    metas = [m.tolist() for m in _all_gather(_describe(local, device), group)]
    if any(m[0] == 2 for m in metas):
        raise EvaluationError(
            f"{what}: a rank holds a tensor of a dtype or number of dimensions the cross-rank "
            f"gather does not carry (dtypes {[str(d) for d in _DTYPES]}, up to {_MAX_DIMS} "
            "dimensions)"
        )
    present = [m for m in metas if m[0] == 1]
    if not present:
        return [None] * len(metas)
    kinds = {(m[1], m[2]) for m in present}
    if len(kinds) > 1:
        shown = [(str(_DTYPES[d]), n) for d, n in sorted(kinds)]
        raise EvaluationError(
            f"{what}: the ranks hold tensors of different dtypes or dimensions {shown}; a state "
            "must have the same dtype and number of dimensions on every rank"
        )
    dtype_index, ndim = present[0][1], present[0][2]
    shapes = [tuple(m[3 : 3 + ndim]) if m[0] == 1 else None for m in metas]
    largest = [max(s[d] for s in shapes if s is not None) for d in range(ndim)]
    dtype = _DTYPES[dtype_index]
    wire = torch.uint8 if dtype == torch.bool else dtype
    buffer = torch.zeros(largest, dtype=wire, device=device)
    if local is not None:
        buffer[tuple(slice(0, n) for n in local.shape)] = local.to(device=device, dtype=wire)
    parts = _all_gather(buffer, group)
    return [
        None if shape is None else part[tuple(slice(0, n) for n in shape)].to(dtype)
        for part, shape in zip(parts, shapes, strict=True)
    ]


def _gather_list(value: list[Tensor], fn: Any, what: str, device: torch.device, group: Any) -> Any:
    """A list state: ``cat`` states concatenated across ranks (``[]`` when no rank holds one),
    others element by element, rank by rank, then reduced by ``fn`` (when not ``None``)."""
    from torchmetrics.utilities.data import dim_zero_cat

    if is_cat_reduction(fn):
        local = dim_zero_cat(value) if value else None
        parts = [p for p in gather_tensor(local, what, device, group) if p is not None]
        return dim_zero_cat(parts) if parts else []
    count = torch.tensor([len(value)], dtype=torch.int64, device=device)
    counts = [int(c) for c in _all_gather(count, group)]
    per_rank: list[list[Tensor]] = [[] for _ in counts]
    for i in range(max(counts)):
        mine = value[i] if i < len(value) else None
        for rank, part in enumerate(gather_tensor(mine, f"{what}[{i}]", device, group)):
            if part is not None:
                per_rank[rank].append(part)
    flat = [t for parts in per_rank for t in parts]
    return fn(flat) if fn is not None else flat


def _gather_tensor_state(
    value: Tensor, fn: Any, what: str, device: torch.device, group: Any
) -> Tensor:
    """A tensor state: stacked across ranks and reduced by ``fn``, as torchmetrics' sync does
    (``cat`` states of different lengths concatenated)."""
    parts = [p for p in gather_tensor(value, what, device, group) if p is not None]
    if len({p.shape for p in parts}) == 1:
        stacked = torch.stack(parts)
        return fn(stacked) if fn is not None else stacked
    if is_cat_reduction(fn):
        return torch.cat(parts)
    raise EvaluationError(
        f"{what} has different shapes on the ranks ({sorted({tuple(p.shape) for p in parts})}) "
        "and is not a 'cat' state; a tensor state must keep its declared shape"
    )


@contextmanager
def gathered_states(metric: Any, name: str, device: torch.device) -> Iterator[None]:
    """Within the block, every state of ``metric`` (and of every metric inside it) holds its
    reduction over all ranks of the metric's ``process_group`` (default: the whole world),
    gathered on ``device`` and put back on the device the state was on; the rank's own states
    are restored afterwards (as torchmetrics' ``unsync`` does), so ``reset`` finds them as
    declared."""
    saved = []
    try:
        for member in metrics_in(metric):
            group = getattr(member, "process_group", None)
            for state, fn in state_reductions(member).items():
                what = f"metric {name}: state {state!r} of {type(member).__name__}"
                value = getattr(member, state)
                saved.append((member, state, value))
                setattr(member, state, _reduced(value, fn, what, device, group, member.device))
        yield
    finally:
        for member, state, value in reversed(saved):
            setattr(member, state, value)


def _reduced(
    value: Any, fn: Any, what: str, device: torch.device, group: Any, metric_device: Any
) -> Any:
    """One state reduced over the ranks, on the device it was on."""
    if isinstance(value, list):
        reduced = _gather_list(value, fn, what, device, group)
    elif isinstance(value, Tensor):
        reduced = _gather_tensor_state(value, fn, what, device, group)
    else:
        raise EvaluationError(f"{what} is {type(value).__name__}, not a tensor or a list")
    home = value.device if isinstance(value, Tensor) else metric_device
    if isinstance(reduced, Tensor):
        return reduced.to(home)
    if isinstance(reduced, list):
        return [t.to(home) if isinstance(t, Tensor) else t for t in reduced]
    return reduced

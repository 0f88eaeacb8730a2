"""Tensors the functional layer keeps between calls: the cached triangle masks over ``(stage,
task)`` and a per-thread scratch workspace (a fresh multi-megabyte allocation costs more in page
faults than the pass that fills it)."""

from __future__ import annotations

import functools
import math
import threading
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["TriangleMasks", "scratch_for", "triangle_masks", "used_cells", "workspace"]


class TriangleMasks(NamedTuple):
    """Boolean ``[T, T]`` masks over ``(i, j)`` = (stage, task)."""

    used: Tensor  # j <= i + 1: the cells the GEM metrics read
    untrained: Tensor  # j > i: task j not yet trained at stage i
    old: Tensor  # j < i: task j followed by training at stage i
    #: the used cells that must hold a value: all but the old-task cells off the final row
    #: (``j < i < T-1``), which may be absent (NaN: not evaluated, ``eval_old_tasks_every``)
    required: Tensor


@functools.lru_cache(maxsize=8)
def triangle_masks(num_tasks: int, device: torch.device | str = "cpu") -> TriangleMasks:
    """The masks for ``T`` tasks, cached per ``(T, device)``; callers must not modify them."""
    idx = torch.arange(num_tasks, device=device)
    offset = idx.unsqueeze(0) - idx.unsqueeze(1)  # j - i
    absent_ok = (offset < 0) & (idx < num_tasks - 1).unsqueeze(1)
    return TriangleMasks(
        used=offset <= 1, untrained=offset > 0, old=offset < 0, required=(offset <= 1) & ~absent_ok
    )


_WORKSPACE = threading.local()
#: scratch buffers up to this size are kept between calls (per thread, dtype and device): a fresh
#: multi-megabyte allocation costs more in page faults than the pass that fills it.
WORKSPACE_MAX_BYTES = 64 * 2**20


def workspace(shape: tuple[int, ...], like: Tensor) -> Tensor:
    """A scratch tensor of ``shape`` with ``like``'s dtype and device, reused between calls on this
    thread when small enough. Its contents are garbage; results must never alias it."""
    numel = math.prod(shape)
    if numel * like.element_size() > WORKSPACE_MAX_BYTES:
        return like.new_empty(shape)
    # inference tensors cannot be written outside inference mode (nor normal ones inside it
    # by autograd-visible ops), so each mode keeps its own buffer
    key = (like.dtype, like.device, torch.is_inference_mode_enabled())
    buffers: dict[tuple[torch.dtype, torch.device, bool], Tensor]
    buffers = _WORKSPACE.__dict__.setdefault("buffers", {})
    flat = buffers.get(key)
    if flat is None or flat.numel() < numel:
        flat = buffers[key] = like.new_empty(numel)
    return flat[:numel].view(shape)


def scratch_for(x: Tensor, shape: tuple[int, ...] | None = None) -> Tensor | None:
    """A `workspace` buffer to write a result derived from ``x`` into, or ``None`` (allocate
    fresh) when autograd records ``x``: ``out=`` arguments do not support differentiation."""
    if torch.is_grad_enabled() and x.requires_grad:
        return None
    return workspace(tuple(x.shape) if shape is None else shape, x)


def used_cells(num_tasks: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean [T, T] mask of the cells the GEM metrics read: ``j <= i + 1`` (a fresh copy)."""
    return triangle_masks(num_tasks, torch.device(device or "cpu")).used.clone()

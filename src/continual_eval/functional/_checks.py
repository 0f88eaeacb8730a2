"""Input validation shared by the functional layer.

Every check names what is wrong and where (the cell ``scores[i, j]`` or ``baseline[j]``). Validation
synchronises with the device (it reads values back), which is why every public function takes a
``validate`` flag that hot loops can turn off.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import NamedTuple

import torch
from torch import Tensor

FORGETTING_CONVENTIONS = ("peak", "chaudhry")


class TriangleMasks(NamedTuple):
    """Boolean ``[T, T]`` masks over ``(i, j)`` = (stage, task)."""

    used: Tensor  # j <= i + 1: the cells the GEM metrics read
    untrained: Tensor  # j > i: task j not yet trained at stage i
    old: Tensor  # j < i: task j followed by training at stage i


@functools.lru_cache(maxsize=8)
def triangle_masks(num_tasks: int, device: torch.device | str = "cpu") -> TriangleMasks:
    """The masks for ``T`` tasks, cached per ``(T, device)``; callers must not modify them."""
    idx = torch.arange(num_tasks, device=device)
    offset = idx.unsqueeze(0) - idx.unsqueeze(1)  # j - i
    return TriangleMasks(used=offset <= 1, untrained=offset > 0, old=offset < 0)


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
    buffers = _WORKSPACE.__dict__.setdefault("buffers", {})
    flat = buffers.get(key)
    if flat is None or flat.numel() < numel:
        flat = buffers[key] = like.new_empty(numel)
    return flat[:numel].view(shape)


def scratch_for(x: Tensor, shape: tuple[int, ...] | None = None) -> Tensor | None:
    """A :func:`workspace` buffer to write a result derived from ``x`` into, or ``None`` (allocate
    fresh) when autograd records ``x``: ``out=`` arguments do not support differentiation."""
    if torch.is_grad_enabled() and x.requires_grad:
        return None
    return workspace(tuple(x.shape) if shape is None else shape, x)


def used_cells(num_tasks: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean [T, T] mask of the cells the GEM metrics read: ``j <= i + 1`` (a fresh copy)."""
    return triangle_masks(num_tasks, torch.device(device or "cpu")).used.clone()


def check_forgetting_convention(convention: str) -> None:
    if convention not in FORGETTING_CONVENTIONS:
        raise ValueError(
            f"unknown forgetting convention {convention!r}; "
            f"expected one of {FORGETTING_CONVENTIONS}"
        )


def _check_float(name: str, tensor: Tensor) -> None:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {tensor.dtype}")


def _first_bad_cell(values: Tensor, mask: Tensor, what: str) -> tuple[int, ...] | None:
    """Index of the first cell selected by ``mask`` that fails ``what`` ('finite' or 'unit')."""
    bad = ~torch.isfinite(values) if what == "finite" else (values < 0) | (values > 1)
    bad &= mask
    if not bool(bad.any()):
        return None
    return tuple(int(v) for v in bad.nonzero()[0])


def check_cells(
    name: str,
    values: Tensor,
    mask: Tensor,
    cell_desc: str,
    unit_interval: bool = True,
    index_prefix: tuple[int, ...] = (),
) -> None:
    """Raise ``ValueError`` naming the first cell selected by ``mask`` that is not finite (or, with
    ``unit_interval``, not in [0, 1]); ``index_prefix`` is prepended to the reported index. The
    value is printed with ``repr`` (every digit): ``1 + 1e-12`` must not read as ``1``."""
    for kind in ("finite", "unit") if unit_interval else ("finite",):
        cell = _first_bad_cell(values, mask, kind)
        if cell is None:
            continue
        index, value = ", ".join(map(str, index_prefix + cell)), values[cell].item()
        if kind == "finite":
            raise ValueError(
                f"{name}[{index}] is {value!r}; {cell_desc} must be finite "
                "(NaN is allowed only in cells no metric reads)"
            )
        raise ValueError(
            f"{name}[{index}] = {value!r} is outside [0, 1]; accuracies must lie in [0, 1]"
        )


def check_scores(scores: Tensor, *, unit_interval: bool = True) -> None:
    """Validate an accuracy matrix: square 2-D floating tensor, used cells finite and in [0, 1]."""
    _check_float("scores", scores)
    if scores.ndim != 2 or scores.shape[0] != scores.shape[1] or scores.shape[0] < 1:
        raise ValueError(
            f"scores must be a square [T, T] matrix with T >= 1, got shape {tuple(scores.shape)}"
        )
    with torch.no_grad():
        values = scores.detach()
        if unit_interval:  # fast path: two reductions over the used cells (NaN fails both tests)
            used = torch.tril(values, diagonal=1, out=scratch_for(values))
            if bool(used.amin() >= 0) and bool(used.amax() <= 1):
                return
        mask = triangle_masks(scores.shape[0], scores.device).used
        check_cells("scores", values, mask, "used cells (j <= i + 1)", unit_interval)


def check_vector(
    name: str, vector: Tensor, scores: Tensor, *, skip_first: bool, unit_interval: bool = True
) -> None:
    """Validate a per-task vector (baseline or reference) against ``scores``' task count."""
    _check_float(name, vector)
    num_tasks = scores.shape[0]
    if vector.ndim != 1 or vector.shape[0] != num_tasks:
        raise ValueError(
            f"{name} must have shape [T] = [{num_tasks}] to match scores, got {tuple(vector.shape)}"
        )
    if vector.dtype != scores.dtype:
        raise TypeError(f"{name} dtype {vector.dtype} does not match scores dtype {scores.dtype}")
    if vector.device != scores.device:
        raise ValueError(f"{name} is on {vector.device} but scores is on {scores.device}")
    with torch.no_grad():
        mask = torch.ones(num_tasks, dtype=torch.bool, device=vector.device)
        if skip_first:
            mask[0] = False
        desc = f"{name}[1:]" if skip_first else name
        check_cells(name, vector.detach(), mask, desc, unit_interval)

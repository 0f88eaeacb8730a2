"""Input validation shared by the functional layer.

Every check names what is wrong and where (the cell ``scores[i, j]`` or ``baseline[j]``). Validation
synchronises with the device (it reads values back), which is why every public function takes a
``validate`` flag that hot loops can turn off.

``bounds`` is the validation range of a score: ``(lo, hi)`` checks ``lo <= cell <= hi`` (either end
may be infinite), ``None`` checks nothing but finiteness. The default, `UNIT_BOUNDS`, is the
accuracy range ``[0, 1]``.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from continual_eval.functional._workspace import scratch_for, triangle_masks

FORGETTING_CONVENTIONS = ("peak", "chaudhry")
#: the default validation range: accuracies
UNIT_BOUNDS: tuple[float, float] = (0.0, 1.0)


def check_forgetting_convention(convention: str) -> None:
    if convention not in FORGETTING_CONVENTIONS:
        raise ValueError(
            f"unknown forgetting convention {convention!r}; "
            f"expected one of {FORGETTING_CONVENTIONS}"
        )


def check_direction(higher_is_better: bool) -> None:
    """``higher_is_better`` must be a ``bool``: a string such as ``"min"`` would read as true."""
    if not isinstance(higher_is_better, bool):
        raise TypeError(
            f"higher_is_better must be True or False, got {higher_is_better!r} "
            f"({type(higher_is_better).__name__})"
        )


def resolve_bounds(bounds: tuple[float, float] | None) -> tuple[float, float] | None:
    """``bounds`` as a ``(lo, hi)`` pair of floats, or ``None`` (no range check).

    Raises ``TypeError`` for anything but ``None`` or two real numbers, and ``ValueError`` for a
    NaN end or ``lo > hi``. Either end may be infinite: ``(0.0, math.inf)`` bounds a loss below."""
    if bounds is None or bounds is UNIT_BOUNDS:
        return bounds
    if (
        isinstance(bounds, (str, bytes))
        or not hasattr(bounds, "__len__")
        or len(bounds) != 2
        or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in bounds)
    ):
        raise TypeError(f"bounds must be None or a pair (lo, hi) of real numbers, got {bounds!r}")
    lo, hi = float(bounds[0]), float(bounds[1])
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"bounds must satisfy lo <= hi (neither NaN), got {bounds!r}")
    return lo, hi


def _bound_text(value: float) -> str:
    """An end of ``bounds`` with every digit, whole numbers without ``.0``: ``[0, 1]``."""
    if math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def _check_float(name: str, tensor: Tensor) -> None:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {tensor.dtype}")


def _first_bad_cell(
    values: Tensor, mask: Tensor, bounds: tuple[float, float] | None
) -> tuple[int, ...] | None:
    """Index of the first cell selected by ``mask`` that is not finite (``bounds=None``) or not in
    ``[lo, hi]`` (``bounds=(lo, hi)``; NaN fails no comparison, so check finiteness first)."""
    if bounds is None:
        bad = ~torch.isfinite(values)
    else:
        lo, hi = bounds
        bad = (values < lo) | (values > hi)
    bad &= mask
    if not bool(bad.any()):
        return None
    return tuple(int(v) for v in bad.nonzero()[0])


def check_cells(
    name: str,
    values: Tensor,
    mask: Tensor,
    cell_desc: str,
    bounds: tuple[float, float] | None = UNIT_BOUNDS,
    index_prefix: tuple[int, ...] = (),
) -> None:
    """Raise ``ValueError`` naming the first cell selected by ``mask`` that is not finite or (unless
    ``bounds`` is ``None``) not in ``[lo, hi]``; ``index_prefix`` is prepended to the reported
    index. The value is printed with ``repr`` (every digit): ``1 + 1e-12`` must not read as
    ``1``."""
    for check in (None, bounds) if bounds is not None else (None,):
        cell = _first_bad_cell(values, mask, check)
        if cell is None:
            continue
        index, value = ", ".join(map(str, index_prefix + cell)), values[cell].item()
        if check is None:
            raise ValueError(
                f"{name}[{index}] is {value!r}; {cell_desc} must be finite "
                "(NaN is allowed only in cells no metric reads and, as an absent cell, in "
                "an old task's cell R[i, j], j < i < T-1)"
            )
        if check == UNIT_BOUNDS:
            raise ValueError(
                f"{name}[{index}] = {value!r} is outside [0, 1]; accuracies must lie in [0, 1]"
            )
        lo, hi = _bound_text(check[0]), _bound_text(check[1])
        raise ValueError(
            f"{name}[{index}] = {value!r} is outside [{lo}, {hi}]; scores must lie within "
            f"bounds = ({lo}, {hi}) (bounds=None checks only that they are finite)"
        )


def check_scores(scores: Tensor, *, bounds: tuple[float, float] | None = UNIT_BOUNDS) -> None:
    """Validate a score matrix: square 2-D floating tensor, used cells finite and within
    ``bounds`` (``None``: finite only). An old task's cell off the final row, ``R[i, j]`` with
    ``j < i < T-1``, may be NaN: absent (not evaluated); the metrics that read it are NaN."""
    _check_float("scores", scores)
    if scores.ndim != 2 or scores.shape[0] != scores.shape[1] or scores.shape[0] < 1:
        raise ValueError(
            f"scores must be a square [T, T] matrix with T >= 1, got shape {tuple(scores.shape)}"
        )
    lo, hi = (-math.inf, math.inf) if bounds is None else bounds
    with torch.no_grad():
        values = scores.detach()
        # fast path: two reductions over the used cells; NaN fails every comparison and an
        # infinite end is compared strictly, so +-inf fails too
        used = torch.tril(values, diagonal=1, out=scratch_for(values))
        if not lo <= 0.0 <= hi:  # the zeros tril leaves above the used cells must pass as well
            unused = ~triangle_masks(scores.shape[0], scores.device).used
            used.masked_fill_(unused, lo if math.isfinite(lo) else hi)
        low_ok = used.amin() >= lo if math.isfinite(lo) else used.amin() > lo
        if bool(low_ok) and bool(used.amax() <= hi if math.isfinite(hi) else used.amax() < hi):
            return
        masks = triangle_masks(scores.shape[0], scores.device)
        check_cells("scores", values, masks.required, "used cells (j <= i + 1)", bounds)
        # the old-task cells off the final row may be absent (NaN); a value there is checked
        present = (masks.used & ~masks.required) & ~torch.isnan(values)
        check_cells("scores", values, present, "used cells (j <= i + 1)", bounds)


def check_vector(
    name: str,
    vector: Tensor,
    scores: Tensor,
    *,
    skip_first: bool,
    bounds: tuple[float, float] | None = UNIT_BOUNDS,
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
        check_cells(name, vector.detach(), mask, desc, bounds)

r"""Metrics of the accuracy matrix after the final stage.

Notation (zero-based): ``R[i, j]`` is the score (accuracy by default) on task ``j`` after training
stage ``i``, ``R`` is ``[T, T]``; ``b[j]`` is task ``j``'s score before any training (the untrained
baseline). A metric only reads the cells ``j <= i + 1`` (the lower triangle and the first
superdiagonal) and ``b[1:]``; every other cell may hold NaN and never reaches a result, because
cells are *selected* (``masked_fill``, ``tril``), never multiplied by a mask.

Absent cells: an old task's cell off the final row, ``R[i, j]`` with ``j < i < T-1``, may be NaN
(not evaluated: ``ContinualEvalCallback(eval_old_tasks_every=k)``). Validation accepts it, and it
propagates to exactly the metrics that read it, never replaced by another cell: the forgetting
of task ``j`` (its peak reads every row), the mean forgetting, the average incremental accuracy,
and in the curves every metric of stage ``i`` that reads row ``i`` (ACC, BWT, forgetting) and the
later forgetting and AIA. ACC, BWT, FWT, learning accuracy and intransigence read only the
diagonal, the superdiagonal and the final row, which must hold values.

All averages weight tasks equally (not examples). With ``T = 1`` no task has been followed by
training: ACC is ``R[0, 0]`` and every transfer or forgetting metric is zero.

Score direction and range. Every function takes ``higher_is_better`` and ``bounds``; the defaults
(``True``, ``(0.0, 1.0)``) are seed 000's contract, bit for bit.

* ``higher_is_better=False`` is for a loss, an error rate, a perplexity. ACC, learning accuracy
  and average incremental accuracy stay plain means of ``R`` in the score's own units. Every
  transfer and forgetting metric is signed so that its meaning is kept: a positive BWT or FWT
  still means "better", and forgetting still measures the loss of the *best* value reached, the
  lowest for a loss (never negative under ``"peak"``). Per task ``j``:

  - BWT ``R[j,j] - R[T-1,j]`` (the loss went down after later training: positive);
  - FWT ``b[j] - R[j-1,j]`` (``gem``: lower than the untrained model before training on ``j``)
    or ``b[j] - R[j,j]`` (``isolated``);
  - forgetting ``R[T-1,j] - min_{j<=i<=T-1} R[i,j]`` (``peak``) or
    ``R[T-1,j] - min_{j<=i<=T-2} R[i,j]`` (``chaudhry``);
  - intransigence ``R[j,j] - ref[j]``.

  These are the higher-is-better metrics of ``-R`` (``-b``, ``-ref``), with ACC, learning
  accuracy and average incremental accuracy negated back. Negation is exact in floating point,
  so the two agree bit for bit (up to the sign of a zero).
* ``bounds=(lo, hi)`` is the validation range: every used cell (and ``b[1:]``, ``ref``) must
  satisfy ``lo <= value <= hi``; either end may be infinite. ``bounds=None``: no range check, but
  used values must still be finite. Bounds never change a result; ``validate=False`` skips every
  check.

Conventions where the literature disagrees (written for ``higher_is_better=True``):

* ``forgetting="peak"`` (default; the seed's definition): ``max_{j<=i<=T-1} R[i,j] - R[T-1,j]``,
  the peak includes the final stage, so the drop is never negative.
* ``forgetting="chaudhry"`` (Chaudhry et al., 2018, RWalk): ``max_{j<=i<=T-2} R[i,j] - R[T-1,j]``,
  only peaks strictly before the final stage; it can be negative.
* FWT ``convention="gem"`` (default; Lopez-Paz & Ranzato, 2017): ``R[j-1,j] - b[j]`` with ``b``
  the untrained baseline; ``convention="isolated"``: ``R[j,j] - b[j]`` with ``b`` the accuracy of
  a model trained on task ``j`` alone.

Batches. With ``validate=False`` every function but
[`continual_metrics`][continual_eval.continual_metrics] also takes a stack of matrices
``[..., T, T]`` (``baseline`` and ``reference`` ``[..., T]``) and returns the metric of each,
``[...]`` (per task: ``[..., T-1]``): the paired bootstrap of `intervals` scores thousands of
resampled matrices in one call. Validation checks a single ``[T, T]`` matrix.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from continual_eval.functional._overflow import (
    all_finite,
    first_infinite,
    no_infinite,
    overflow_error,
    rescaled,
)
from continual_eval.functional._validation import (
    UNIT_BOUNDS,
    check_direction,
    check_forgetting_convention,
    check_scores,
    check_vector,
    resolve_bounds,
)
from continual_eval.functional._workspace import (
    scratch_for,
    triangle_masks,
)

FWT_CONVENTIONS = ("gem", "isolated")

Bounds = tuple[float, float] | None


def trained_history(
    scores: Tensor, *, higher_is_better: bool = True, out: Tensor | None = None
) -> Tensor:
    """The *oriented* scores (``scores``, or ``-scores`` for lower-is-better) with the cells of
    tasks not yet trained (``j > i``) made neutral for column maxima over ``j <= i``: ``tril``
    (zeros) when every trained cell is non-negative, as accuracies are, else ``-inf`` (a masked
    fill; always so for a negated loss). Written into ``out`` when given."""
    if not higher_is_better:
        history = torch.neg(scores, out=out)
        untrained = triangle_masks(scores.shape[-1], scores.device).untrained
        return history.masked_fill_(untrained, -math.inf)
    history = torch.tril(scores, out=out)
    if not bool(history.amin() >= 0):  # only unvalidated, negative scores take this path
        history.masked_fill_(triangle_masks(scores.shape[-1], scores.device).untrained, -math.inf)
    return history


def gain(value: Tensor, reference: Tensor, higher_is_better: bool) -> Tensor:
    """How much better ``value`` is than ``reference``: ``value - reference``, or
    ``reference - value`` for lower-is-better (the same bits as ``(-value) - (-reference)``)."""
    return value - reference if higher_is_better else reference - value


def _diagonal(scores: Tensor, offset: int = 0) -> Tensor:
    """The diagonal ``R[j, j + offset]`` of the last two dimensions (leading dimensions kept)."""
    return scores.diagonal(offset=offset, dim1=-2, dim2=-1)


def _check_options(higher_is_better: bool, bounds: Bounds) -> Bounds:
    check_direction(higher_is_better)
    return resolve_bounds(bounds)


def _zero(scores: Tensor) -> Tensor:
    """Zero of ``scores``' dtype and device, with its leading (batch) dimensions."""
    return torch.zeros(scores.shape[:-2], dtype=scores.dtype, device=scores.device)


def _mean(values: Tensor, validate: bool = False) -> Tensor:
    """Equal-weight mean over the last dimension; with ``validate``, ``sum(v / n)`` where the sum
    of finite values overflows although their mean does not (see
    `_overflow`)."""
    mean = values.mean(dim=-1)
    if validate and not all_finite(mean) and all_finite(values):
        mean = (values / values.shape[-1]).sum(dim=-1)
    return mean


def _mean_or_zero(values: Tensor, like: Tensor, validate: bool = False) -> Tensor:
    """Equal-weight mean (`_mean`); zero (not NaN) when there is nothing to average
    (T = 1)."""
    return _mean(values, validate) if values.shape[-1] else _zero(like)


def _cell(name: str, tensor: Tensor, *index: int) -> tuple[str, Tensor]:
    return f"{name}[{', '.join(map(str, index))}]", tensor[index]


def _check_per_task(
    metric: str,
    values: Tensor,
    cells: Callable[[int], list[tuple[str, Tensor]]],
    first_task: int = 0,
) -> None:
    """Raise `overflow_error` for the first task whose value is infinite (the inputs were
    validated finite, so a difference of them overflowed; NaN is an absent value, from an absent
    cell); entry ``k`` is task ``first_task + k``, whose inputs ``cells(k)`` names."""
    if not no_infinite(values):
        (k,) = first_infinite(values)
        raise overflow_error(metric, f"task {first_task + k}", cells(k))


def _bwt_cells(scores: Tensor) -> Callable[[int], list[tuple[str, Tensor]]]:
    last = scores.shape[0] - 1
    return lambda j: [_cell("scores", scores, last, j), _cell("scores", scores, j, j)]


def _fwt_cells(
    scores: Tensor, baseline: Tensor, convention: str
) -> Callable[[int], list[tuple[str, Tensor]]]:
    def cells(k: int) -> list[tuple[str, Tensor]]:
        j = k + 1
        before = (j - 1, j) if convention == "gem" else (j, j)
        return [_cell("scores", scores, *before), _cell("baseline", baseline, j)]

    return cells


def _forgetting_cells(
    scores: Tensor, convention: str, higher_is_better: bool
) -> Callable[[int], list[tuple[str, Tensor]]]:
    last = scores.shape[0] - 1

    def cells(j: int) -> list[tuple[str, Tensor]]:
        column = scores[j : (last if convention == "chaudhry" else last + 1), j]
        best = j + int(column.argmax() if higher_is_better else column.argmin())
        return [_cell("scores", scores, best, j), _cell("scores", scores, last, j)]

    return cells


def _intransigence_cells(
    scores: Tensor, reference: Tensor
) -> Callable[[int], list[tuple[str, Tensor]]]:
    return lambda j: [_cell("reference", reference, j), _cell("scores", scores, j, j)]


def backward_transfer_per_task(
    scores: Tensor,
    *,
    higher_is_better: bool = True,
    bounds: Bounds = UNIT_BOUNDS,
    validate: bool = True,
) -> Tensor:
    r"""Per-task backward transfer for ``j < T-1``; shape ``[T-1]``.

    ``R[T-1, j] - R[j, j]``; for lower-is-better ``R[j, j] - R[T-1, j]``: positive means later
    training made task ``j`` better than just after it was learned.
    """
    bounds = _check_options(higher_is_better, bounds)
    if validate:
        check_scores(scores, bounds=bounds)
    out = gain(scores[..., -1, :-1], _diagonal(scores)[..., :-1], higher_is_better)
    if validate:
        _check_per_task("backward transfer", out, _bwt_cells(scores))
    return out


def forward_transfer_per_task(
    scores: Tensor,
    baseline: Tensor,
    *,
    convention: str = "gem",
    higher_is_better: bool = True,
    bounds: Bounds = UNIT_BOUNDS,
    validate: bool = True,
) -> Tensor:
    r"""Per-task forward transfer for ``j >= 1``; shape ``[T-1]``.

    ``gem``: ``R[j-1, j] - b[j]`` (the score on task j just before training it, over the untrained
    baseline). ``isolated``: ``R[j, j] - b[j]`` with ``b`` the score of a model trained on task j
    alone (the convention of handbook-style tutorials). For lower-is-better the difference is
    reversed (``b[j] - R[j-1, j]``, ``b[j] - R[j, j]``): positive always means better than ``b``.
    """
    if convention not in FWT_CONVENTIONS:
        raise ValueError(
            f"unknown FWT convention {convention!r}; expected one of {FWT_CONVENTIONS}"
        )
    bounds = _check_options(higher_is_better, bounds)
    if validate:
        check_scores(scores, bounds=bounds)
        check_vector("baseline", baseline, scores, skip_first=True, bounds=bounds)
    before = _diagonal(scores, 1) if convention == "gem" else _diagonal(scores)[..., 1:]
    out = gain(before, baseline[..., 1:], higher_is_better)
    if validate:
        _check_per_task("forward transfer", out, _fwt_cells(scores, baseline, convention), 1)
    return out


def forgetting_per_task(
    scores: Tensor,
    *,
    convention: str = "peak",
    higher_is_better: bool = True,
    bounds: Bounds = UNIT_BOUNDS,
    validate: bool = True,
) -> Tensor:
    r"""Per-task forgetting for ``j < T-1``: the drop from the best value reached; shape ``[T-1]``.

    ``peak``: ``max_{j<=i<=T-1} R[i,j] - R[T-1,j]`` (non-negative). ``chaudhry``:
    ``max_{j<=i<=T-2} R[i,j] - R[T-1,j]`` (may be negative). For lower-is-better, the best is the
    minimum: ``R[T-1,j] - min_{j<=i<=T-1} R[i,j]`` (``peak``, non-negative) and
    ``R[T-1,j] - min_{j<=i<=T-2} R[i,j]`` (``chaudhry``). Avalanche's per-task "forgetting"
    ``R[j,j] - R[T-1,j]`` is minus
    [`backward_transfer_per_task`][continual_eval.functional.backward_transfer_per_task].
    """
    check_forgetting_convention(convention)
    bounds = _check_options(higher_is_better, bounds)
    if validate:
        check_scores(scores, bounds=bounds)
    if scores.shape[-1] == 1:
        return scores.new_empty((*scores.shape[:-2], 0))
    history = trained_history(scores, higher_is_better=higher_is_better, out=scratch_for(scores))
    if convention == "chaudhry":
        history = history[..., :-1, :]  # peaks strictly before the final stage
    best = history.amax(dim=-2)[..., :-1]  # of the oriented scores: -min R for lower-is-better
    final = scores[..., -1, :-1]
    out = best - final if higher_is_better else best + final
    if validate:
        _check_per_task("forgetting", out, _forgetting_cells(scores, convention, higher_is_better))
    return out


def intransigence_per_task(
    scores: Tensor,
    reference: Tensor,
    *,
    higher_is_better: bool = True,
    bounds: Bounds = UNIT_BOUNDS,
    validate: bool = True,
) -> Tensor:
    r"""Per-task intransigence ``reference[j] - R[j, j]``; shape ``[T]`` (Chaudhry et al., 2018).

    ``reference[j]`` is the score a model reaches on task ``j`` trained on it alone or jointly
    on all tasks; positive values mean sequential training learned task ``j`` less well. For
    lower-is-better: ``R[j, j] - reference[j]`` (still positive when learned less well).
    """
    bounds = _check_options(higher_is_better, bounds)
    if validate:
        check_scores(scores, bounds=bounds)
        check_vector("reference", reference, scores, skip_first=False, bounds=bounds)
    out = gain(reference, _diagonal(scores), higher_is_better)
    if validate:
        _check_per_task("intransigence", out, _intransigence_cells(scores, reference))
    return out


def average_accuracy(
    scores: Tensor,
    *,
    higher_is_better: bool = True,
    bounds: Bounds = UNIT_BOUNDS,
    validate: bool = True,
) -> Tensor:
    r"""ACC ``= (1/T) sum_j R[T-1, j]``: the mean final score over all tasks, in the score's own
    units whatever its direction."""
    bounds = _check_options(higher_is_better, bounds)
    if validate:
        check_scores(scores, bounds=bounds)
    return _mean(scores[..., -1, :], validate)


def backward_transfer(
    scores: Tensor,
    *,
    higher_is_better: bool = True,
    bounds: Bounds = UNIT_BOUNDS,
    validate: bool = True,
) -> Tensor:
    r"""BWT ``= 1/(T-1) sum_{j<T-1} (R[T-1,j] - R[j,j])`` (reversed difference for
    lower-is-better: positive means improved); zero for ``T = 1``."""
    per_task = backward_transfer_per_task(
        scores, higher_is_better=higher_is_better, bounds=bounds, validate=validate
    )
    return _mean_or_zero(per_task, scores, validate)


def forward_transfer(
    scores: Tensor,
    baseline: Tensor,
    *,
    convention: str = "gem",
    higher_is_better: bool = True,
    bounds: Bounds = UNIT_BOUNDS,
    validate: bool = True,
) -> Tensor:
    r"""FWT ``= 1/(T-1) sum_{j>=1} (R[j-1,j] - b[j])`` (GEM; ``b[j] - R[j-1,j]`` for
    lower-is-better); zero for ``T = 1``."""
    per_task = forward_transfer_per_task(
        scores,
        baseline,
        convention=convention,
        higher_is_better=higher_is_better,
        bounds=bounds,
        validate=validate,
    )
    return _mean_or_zero(per_task, scores, validate)


def forgetting(
    scores: Tensor,
    *,
    convention: str = "peak",
    higher_is_better: bool = True,
    bounds: Bounds = UNIT_BOUNDS,
    validate: bool = True,
) -> Tensor:
    r"""Forgetting ``= 1/(T-1) sum_{j<T-1} F_j``
    ([`forgetting_per_task`][continual_eval.functional.forgetting_per_task]); zero for T = 1."""
    per_task = forgetting_per_task(
        scores,
        convention=convention,
        higher_is_better=higher_is_better,
        bounds=bounds,
        validate=validate,
    )
    return _mean_or_zero(per_task, scores, validate)


def learning_accuracy(
    scores: Tensor,
    *,
    higher_is_better: bool = True,
    bounds: Bounds = UNIT_BOUNDS,
    validate: bool = True,
) -> Tensor:
    r"""Learning accuracy ``= (1/T) sum_j R[j, j]``: how well each task is learned when trained,
    in the score's own units whatever its direction."""
    bounds = _check_options(higher_is_better, bounds)
    if validate:
        check_scores(scores, bounds=bounds)
    return _mean(_diagonal(scores), validate)


def average_incremental_accuracy(
    scores: Tensor,
    *,
    higher_is_better: bool = True,
    bounds: Bounds = UNIT_BOUNDS,
    validate: bool = True,
) -> Tensor:
    r"""Average incremental accuracy ``= (1/T) sum_i (1/(i+1)) sum_{j<=i} R[i, j]`` (Rebuffi et al.,
    2017): the mean over stages of the score on the tasks seen so far, in the score's own units
    whatever its direction."""
    bounds = _check_options(higher_is_better, bounds)
    if validate:
        check_scores(scores, bounds=bounds)
    value = _incremental_mean(scores)
    if validate and not all_finite(value):  # row sums overflowed: the mean itself is finite
        value = rescaled(_incremental_mean, scores, terms=scores.shape[-1])
    return value


def _incremental_mean(scores: Tensor) -> Tensor:
    T = scores.shape[-1]
    # tril selects: NaN above the diagonal never enters
    seen_sums = torch.tril(scores, out=scratch_for(scores)).sum(dim=-1)
    seen = torch.arange(1, T + 1, dtype=scores.dtype, device=scores.device)
    return (seen_sums / seen).mean(dim=-1)


def intransigence(
    scores: Tensor,
    reference: Tensor,
    *,
    higher_is_better: bool = True,
    bounds: Bounds = UNIT_BOUNDS,
    validate: bool = True,
) -> Tensor:
    r"""Intransigence ``= (1/T) sum_j (reference[j] - R[j, j])`` (Chaudhry et al., 2018;
    ``R[j, j] - reference[j]`` for lower-is-better)."""
    per_task = intransigence_per_task(
        scores, reference, higher_is_better=higher_is_better, bounds=bounds, validate=validate
    )
    return _mean(per_task, validate)


def continual_metrics(
    scores: Tensor,
    baseline: Tensor,
    *,
    forgetting: str = "peak",
    higher_is_better: bool = True,
    bounds: Bounds = UNIT_BOUNDS,
    validate: bool = True,
) -> dict[str, Tensor]:
    r"""The GEM metrics and peak forgetting of an accuracy matrix.

    Args:
        scores: ``R`` of shape ``[T, T]``, ``R[i, j]`` the score on task ``j`` after stage ``i``.
            Cells ``j > i + 1`` are never read and may be NaN.
        baseline: ``b`` of shape ``[T]``, each task's score before any training; ``b[0]`` is
            never read and may be NaN.
        forgetting: ``"peak"`` (default, non-negative) or ``"chaudhry"`` (peaks strictly before
            the final stage, may be negative).
        higher_is_better: ``False`` for a loss: BWT, FWT and forgetting are then signed so that
            positive BWT/FWT still mean better and forgetting is the rise above the lowest value
            reached (see the module notes); ACC stays the mean final score.
        bounds: validation range ``(lo, hi)`` of every used value (default ``[0, 1]``), or
            ``None`` for no range check (values must still be finite).
        validate: check shapes, dtypes and that every used value is finite and within
            ``bounds`` (reads values back from the device; turn off in hot loops).

    Returns:
        ``{"acc", "bwt", "fwt", "forgetting"}``, each a 0-dim tensor in ``scores``' dtype and
        device: ACC ``= mean_j R[T-1,j]``, BWT ``= mean_{j<T-1} (R[T-1,j] - R[j,j])``,
        FWT ``= mean_{j>=1} (R[j-1,j] - b[j])``, forgetting as selected (the differences
        reversed for lower-is-better). For ``T = 1``: ACC is ``R[0, 0]`` and the other three are
        zero. Inputs are not modified; no state is kept.

    Example:
        >>> import torch
        >>> nan = float("nan")
        >>> R = torch.tensor([[0.5, 0.2, nan], [0.9, 0.6, 0.3], [0.7, 0.8, 0.9]])
        >>> b = torch.tensor([nan, 0.1, 0.15])
        >>> {k: round(v.item(), 4) for k, v in continual_metrics(R, b).items()}
        {'acc': 0.8, 'bwt': 0.2, 'fwt': 0.125, 'forgetting': 0.1}
        >>> loss = continual_metrics(-R, -b, higher_is_better=False, bounds=None)
        >>> {k: round(v.item(), 4) for k, v in loss.items()}  # the same but ACC (own units)
        {'acc': -0.8, 'bwt': 0.2, 'fwt': 0.125, 'forgetting': 0.1}
    """
    check_forgetting_convention(forgetting)
    bounds = _check_options(higher_is_better, bounds)
    if validate:
        check_scores(scores, bounds=bounds)
        check_vector("baseline", baseline, scores, skip_first=True, bounds=bounds)
    if scores.shape[0] == 1:
        zero = _zero(scores)
        return {
            "acc": scores[0, 0].clone(),
            "bwt": zero,
            "fwt": zero.clone(),
            "forgetting": zero.clone(),
        }
    result = _gem_metrics(scores, baseline, forgetting, higher_is_better, bounds, False)
    if validate and not all_finite(*result.values()):
        # an overflow: each metric again with its own checks, which name the cells of a
        # difference beyond the dtype or recompute a mean whose sum overflowed
        result = _gem_metrics(scores, baseline, forgetting, higher_is_better, bounds, True)
    return result


def _gem_metrics(
    scores: Tensor,
    baseline: Tensor,
    convention: str,
    hib: bool,
    bounds: Bounds,
    validate: bool,
) -> dict[str, Tensor]:
    """ACC, BWT, FWT and forgetting of checked inputs (``validate``: the overflow checks)."""
    options: dict[str, Any] = {"higher_is_better": hib, "bounds": bounds}
    per_task = forgetting_per_task(scores, convention=convention, **options, validate=validate)
    return {
        "acc": _mean(scores[-1], validate),
        "bwt": backward_transfer(scores, **options, validate=validate),
        "fwt": forward_transfer(scores, baseline, **options, validate=validate),
        "forgetting": _mean_or_zero(per_task, scores, validate),
    }

r"""Metrics of the accuracy matrix after the final stage.

Notation (zero-based): ``R[i, j]`` is the accuracy on task ``j`` after training stage ``i``,
``R`` is ``[T, T]``; ``b[j]`` is task ``j``'s accuracy before any training (the untrained
baseline). A metric only reads the cells ``j <= i + 1`` (the lower triangle and the first
superdiagonal) and ``b[1:]``; every other cell may hold NaN and never reaches a result, because
cells are *selected* (``masked_fill``, ``tril``), never multiplied by a mask.

All averages weight tasks equally (not examples). With ``T = 1`` no task has been followed by
training: ACC is ``R[0, 0]`` and every transfer or forgetting metric is zero.

Conventions where the literature disagrees:

* ``forgetting="peak"`` (default; the seed's definition): ``max_{j<=i<=T-1} R[i,j] - R[T-1,j]``,
  the peak includes the final stage, so the drop is never negative.
* ``forgetting="chaudhry"`` (Chaudhry et al., 2018, RWalk): ``max_{j<=i<=T-2} R[i,j] - R[T-1,j]``,
  only peaks strictly before the final stage; it can be negative.
* FWT ``convention="gem"`` (default; Lopez-Paz & Ranzato, 2017): ``R[j-1,j] - b[j]`` with ``b``
  the untrained baseline; ``convention="isolated"``: ``R[j,j] - b[j]`` with ``b`` the accuracy of
  a model trained on task ``j`` alone.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from continual_eval.functional._checks import (
    check_forgetting_convention,
    check_scores,
    check_vector,
    scratch_for,
    triangle_masks,
)

FWT_CONVENTIONS = ("gem", "isolated")


def trained_history(scores: Tensor, *, out: Tensor | None = None) -> Tensor:
    """``scores`` with the cells of tasks not yet trained (``j > i``) made neutral for column
    maxima over ``j <= i``: ``tril`` (zeros) when every trained cell is non-negative, as
    accuracies are, else ``-inf`` (slower: a masked fill). Written into ``out`` when given."""
    history = torch.tril(scores, out=out)
    if not bool(history.amin() >= 0):  # only unvalidated, negative scores take this path
        history.masked_fill_(triangle_masks(scores.shape[0], scores.device).untrained, -math.inf)
    return history


def _zero(scores: Tensor) -> Tensor:
    return torch.zeros((), dtype=scores.dtype, device=scores.device)


def _mean_or_zero(values: Tensor, like: Tensor) -> Tensor:
    """Equal-weight mean; zero (not NaN) when there is nothing to average (T = 1)."""
    return values.mean() if values.numel() else _zero(like)


def backward_transfer_per_task(scores: Tensor, *, validate: bool = True) -> Tensor:
    r"""Per-task backward transfer ``R[T-1, j] - R[j, j]`` for ``j < T-1``; shape ``[T-1]``."""
    if validate:
        check_scores(scores)
    return scores[-1, :-1] - scores.diagonal()[:-1]


def forward_transfer_per_task(
    scores: Tensor, baseline: Tensor, *, convention: str = "gem", validate: bool = True
) -> Tensor:
    r"""Per-task forward transfer for ``j >= 1``; shape ``[T-1]``.

    ``gem``: ``R[j-1, j] - b[j]`` (accuracy on task j just before training it, over the untrained
    baseline). ``isolated``: ``R[j, j] - b[j]`` with ``b`` the accuracy of a model trained on task j
    alone (the convention of handbook-style tutorials).
    """
    if convention not in FWT_CONVENTIONS:
        raise ValueError(
            f"unknown FWT convention {convention!r}; expected one of {FWT_CONVENTIONS}"
        )
    if validate:
        check_scores(scores)
        check_vector("baseline", baseline, scores, skip_first=True)
    before = scores.diagonal(offset=1) if convention == "gem" else scores.diagonal()[1:]
    return before - baseline[1:]


def forgetting_per_task(
    scores: Tensor, *, convention: str = "peak", validate: bool = True
) -> Tensor:
    r"""Per-task forgetting for ``j < T-1``; shape ``[T-1]``.

    ``peak``: ``max_{j<=i<=T-1} R[i,j] - R[T-1,j]`` (non-negative). ``chaudhry``:
    ``max_{j<=i<=T-2} R[i,j] - R[T-1,j]`` (may be negative). Avalanche's per-task "forgetting"
    ``R[j,j] - R[T-1,j]`` is minus :func:`backward_transfer_per_task`.
    """
    check_forgetting_convention(convention)
    if validate:
        check_scores(scores)
    if scores.shape[0] == 1:
        return scores.new_empty(0)
    history = trained_history(scores, out=scratch_for(scores))
    if convention == "chaudhry":
        history = history[:-1]  # peaks strictly before the final stage
    return history.amax(dim=0)[:-1] - scores[-1, :-1]


def intransigence_per_task(scores: Tensor, reference: Tensor, *, validate: bool = True) -> Tensor:
    r"""Per-task intransigence ``reference[j] - R[j, j]``; shape ``[T]`` (Chaudhry et al., 2018).

    ``reference[j]`` is the accuracy a model reaches on task ``j`` trained on it alone or jointly
    on all tasks; positive values mean sequential training learned task ``j`` less well.
    """
    if validate:
        check_scores(scores)
        check_vector("reference", reference, scores, skip_first=False)
    return reference - scores.diagonal()


def average_accuracy(scores: Tensor, *, validate: bool = True) -> Tensor:
    r"""ACC ``= (1/T) sum_j R[T-1, j]``: mean final accuracy over all tasks."""
    if validate:
        check_scores(scores)
    return scores[-1].mean()


def backward_transfer(scores: Tensor, *, validate: bool = True) -> Tensor:
    r"""BWT ``= 1/(T-1) sum_{j<T-1} (R[T-1,j] - R[j,j])``; zero for ``T = 1``."""
    return _mean_or_zero(backward_transfer_per_task(scores, validate=validate), scores)


def forward_transfer(
    scores: Tensor, baseline: Tensor, *, convention: str = "gem", validate: bool = True
) -> Tensor:
    r"""FWT ``= 1/(T-1) sum_{j>=1} (R[j-1,j] - b[j])`` (GEM); zero for ``T = 1``."""
    per_task = forward_transfer_per_task(scores, baseline, convention=convention, validate=validate)
    return _mean_or_zero(per_task, scores)


def forgetting(scores: Tensor, *, convention: str = "peak", validate: bool = True) -> Tensor:
    r"""Forgetting ``= 1/(T-1) sum_{j<T-1} F_j`` (:func:`forgetting_per_task`); zero for T = 1."""
    return _mean_or_zero(
        forgetting_per_task(scores, convention=convention, validate=validate), scores
    )


def learning_accuracy(scores: Tensor, *, validate: bool = True) -> Tensor:
    r"""Learning accuracy ``= (1/T) sum_j R[j, j]``: how well each task is learned when trained."""
    if validate:
        check_scores(scores)
    return scores.diagonal().mean()


def average_incremental_accuracy(scores: Tensor, *, validate: bool = True) -> Tensor:
    r"""Average incremental accuracy ``= (1/T) sum_i (1/(i+1)) sum_{j<=i} R[i, j]`` (Rebuffi et al.,
    2017): the mean over stages of the accuracy on the tasks seen so far."""
    if validate:
        check_scores(scores)
    T = scores.shape[0]
    # tril selects: NaN above the diagonal never enters
    seen_sums = torch.tril(scores, out=scratch_for(scores)).sum(dim=1)
    seen = torch.arange(1, T + 1, dtype=scores.dtype, device=scores.device)
    return (seen_sums / seen).mean()


def intransigence(scores: Tensor, reference: Tensor, *, validate: bool = True) -> Tensor:
    r"""Intransigence ``= (1/T) sum_j (reference[j] - R[j, j])`` (Chaudhry et al., 2018)."""
    return intransigence_per_task(scores, reference, validate=validate).mean()


def continual_metrics(
    scores: Tensor, baseline: Tensor, *, forgetting: str = "peak", validate: bool = True
) -> dict[str, Tensor]:
    r"""The GEM metrics and peak forgetting of an accuracy matrix.

    Args:
        scores: ``R`` of shape ``[T, T]``, ``R[i, j]`` the accuracy on task ``j`` after stage ``i``.
            Cells ``j > i + 1`` are never read and may be NaN.
        baseline: ``b`` of shape ``[T]``, each task's accuracy before any training; ``b[0]`` is
            never read and may be NaN.
        forgetting: ``"peak"`` (default, non-negative) or ``"chaudhry"`` (peaks strictly before
            the final stage, may be negative).
        validate: check shapes, dtypes and that every used cell is finite and in ``[0, 1]``
            (reads values back from the device; turn off in hot loops).

    Returns:
        ``{"acc", "bwt", "fwt", "forgetting"}``, each a 0-dim tensor in ``scores``' dtype and
        device: ACC ``= mean_j R[T-1,j]``, BWT ``= mean_{j<T-1} (R[T-1,j] - R[j,j])``,
        FWT ``= mean_{j>=1} (R[j-1,j] - b[j])``, forgetting as selected. For ``T = 1``: ACC is
        ``R[0, 0]`` and the other three are zero. Inputs are not modified; no state is kept.

    Example:
        >>> import torch
        >>> nan = float("nan")
        >>> R = torch.tensor([[0.5, 0.2, nan], [0.9, 0.6, 0.3], [0.7, 0.8, 0.9]])
        >>> b = torch.tensor([nan, 0.1, 0.15])
        >>> {k: round(v.item(), 4) for k, v in continual_metrics(R, b).items()}
        {'acc': 0.8, 'bwt': 0.2, 'fwt': 0.125, 'forgetting': 0.1}
    """
    check_forgetting_convention(forgetting)
    if validate:
        check_scores(scores)
        check_vector("baseline", baseline, scores, skip_first=True)
    if scores.shape[0] == 1:
        zero = _zero(scores)
        return {
            "acc": scores[0, 0].clone(),
            "bwt": zero,
            "fwt": zero.clone(),
            "forgetting": zero.clone(),
        }
    return {
        "acc": average_accuracy(scores, validate=False),
        "bwt": backward_transfer(scores, validate=False),
        "fwt": forward_transfer(scores, baseline, validate=False),
        "forgetting": _mean_or_zero(
            forgetting_per_task(scores, convention=forgetting, validate=False), scores
        ),
    }

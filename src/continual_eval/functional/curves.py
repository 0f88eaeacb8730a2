r"""Every accuracy-matrix metric after every stage, in one vectorised pass.

``curve[s]`` equals the metric of the leading sub-matrix ``R[:s+1, :s+1]`` and ``b[:s+1]``: the
value a run would have reported had it stopped after stage ``s``. All curves are computed from
``O(T^2)`` intermediates (running column maxima, row sums); nothing is ``O(T^3)``, and no Python
loop runs over tasks.

``higher_is_better`` and ``bounds`` are as in `accuracy_matrix`.
A lower-is-better score is served by the same scan on its negation (written straight into the
scan's buffer instead of the ``tril`` copy, so it costs what the default costs); every difference
is then reversed, which gives the same bits as the higher-is-better metrics of ``-R``.
"""

from __future__ import annotations

import math
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
    check_forgetting_convention,
    check_scores,
    check_vector,
)
from continual_eval.functional._workspace import (
    triangle_masks,
    workspace,
)
from continual_eval.functional.accuracy_matrix import (
    Bounds,
    _cell,
    _check_options,
    _check_per_task,
    _intransigence_cells,
    _mean,
    gain,
    trained_history,
)
from continual_eval.functional.family import CURVE_KEYS as FAMILY_CURVE_KEYS

#: the keys of [`continual_metrics_curve`][continual_eval.functional.continual_metrics_curve], from
#: the metric family (`continual_eval.functional.family`)
CURVE_KEYS = FAMILY_CURVE_KEYS


_PEAK_BLOCK = 32


def _running_max_rows(x: Tensor, spare: Tensor) -> Tensor:
    """Running maximum along dim -2 (rows) by doubling: ``ceil(log2(rows))`` whole-tensor
    ``maximum`` passes, ping-ponging between ``x`` and the same-shaped ``spare`` buffer (both are
    overwritten); returns the buffer holding the result."""
    rows, step = x.shape[-2], 1
    while step < rows:
        torch.maximum(x[..., step:, :], x[..., :-step, :], out=spare[..., step:, :])
        spare[..., :step, :] = x[..., :step, :]
        x, spare = spare, x
        step *= 2
    return x


def _scan_peak(
    scores: Tensor, higher_is_better: bool = True
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Running column maxima of `trained_history` (of ``-R`` for lower-is-better; unmasked:
    ``P[s, j]`` for ``s < j`` is 0 or ``-inf``), ``sum_{j<=s} R[s, j]`` (of ``R`` itself) and a
    free ``[T, T]`` scratch buffer of the workspace (``None`` under autograd).

    Blocked scan without autograd: running maxima inside blocks of 32 stages, then across block
    ends: about ``log2(32) + 2`` element-wise passes over a ``[T, T]`` buffer (``cummax``, which
    also tracks indices, is several times slower). ``cummax`` when autograd records ``scores``.
    The row sums are read from the history before the scan overwrites it when the history is
    ``tril(R)`` (the default), else from ``tril(R)`` written into the second buffer, which the
    scan overwrites next: no ``[T, T]`` allocation either way.
    """
    T = scores.shape[0]
    if torch.is_grad_enabled() and scores.requires_grad:
        history = trained_history(scores, higher_is_better=higher_is_better)
        return history.cummax(dim=0).values, torch.tril(scores).sum(dim=1), None
    block = min(_PEAK_BLOCK, T)
    num_blocks = -(-T // block)
    buffers = workspace((2, num_blocks * block, T), scores)
    history = trained_history(scores, higher_is_better=higher_is_better, out=buffers[0, :T])
    upper_is_zero = higher_is_better and (T == 1 or bool(history[0, -1] == 0))
    seen_sums = (history if upper_is_zero else torch.tril(scores, out=buffers[1, :T])).sum(dim=1)
    buffers[0, T:] = 0.0  # padding rows come after every real row: they never reach one
    shape = (num_blocks, block, T)
    peak = _running_max_rows(buffers[0].view(shape), buffers[1].view(shape))
    spare = buffers[1] if peak.data_ptr() == buffers[0].data_ptr() else buffers[0]
    if num_blocks > 1:
        ends = peak[:, -1].clone()  # best of each block; then best up to each block's end
        ends = _running_max_rows(ends, torch.empty_like(ends))
        torch.maximum(peak[1:], ends[:-1].unsqueeze(1), out=peak[1:])
    # views into the workspace
    return peak.view(num_blocks * block, T)[:T], seen_sums, spare[:T]


def running_peak(scores: Tensor, *, higher_is_better: bool = True) -> Tensor:
    r"""``P[s, j] = max_{j <= i <= s} R[i, j]`` (``-inf`` where ``s < j``): each task's best
    score from the stage it was trained up to stage ``s``. For lower-is-better the best is the
    minimum, ``min_{j <= i <= s} R[i, j]`` (``+inf`` where ``s < j``). ``O(T^2)`` memory and work.
    """
    _check_options(higher_is_better, None)
    peak = _scan_peak(scores, higher_is_better)[0]
    untrained = triangle_masks(scores.shape[0], scores.device).untrained
    if not higher_is_better:  # the scan ran on -R
        return torch.neg(peak).masked_fill_(untrained, math.inf)  # fresh, not the workspace
    return peak.masked_fill(untrained, -math.inf)  # a fresh tensor, not the workspace


def continual_metrics_curve(
    scores: Tensor,
    baseline: Tensor,
    *,
    forgetting: str = "peak",
    higher_is_better: bool = True,
    bounds: Bounds = UNIT_BOUNDS,
    validate: bool = True,
) -> dict[str, Tensor]:
    r"""Per-stage curves of ACC, BWT, FWT, forgetting, learning accuracy and average incremental
    accuracy, each of shape ``[T]``.

    At stage ``s`` (zero-based; ``s`` old tasks):

    * ``acc[s] = 1/(s+1) sum_{j<=s} R[s,j]``
    * ``bwt[s] = 1/s sum_{j<s} (R[s,j] - R[j,j])``, 0 at ``s = 0``
    * ``fwt[s] = 1/s sum_{1<=j<=s} (R[j-1,j] - b[j])``, 0 at ``s = 0``
    * ``forgetting[s] = 1/s sum_{j<s} (max_{j<=i<=s} R[i,j] - R[s,j])`` (``peak``; ``chaudhry``
      takes the max over ``j<=i<=s-1``), 0 at ``s = 0``
    * ``learning_accuracy[s] = 1/(s+1) sum_{j<=s} R[j,j]``
    * ``average_incremental_accuracy[s] = 1/(s+1) sum_{k<=s} acc[k]``

    For lower-is-better, the differences in BWT, FWT and forgetting are reversed and the max is a
    min (``forgetting[s] = 1/s sum_{j<s} (R[s,j] - min_{j<=i<=s} R[i,j])``); ``acc``,
    ``learning_accuracy`` and ``average_incremental_accuracy`` are unchanged.

    ``curve[key][-1]`` equals [`continual_metrics`][continual_eval.continual_metrics] (and the
    scalar functions) on the full matrix. Arguments as in
    [`continual_eval.functional.continual_metrics`][continual_eval.continual_metrics].
    """
    check_forgetting_convention(forgetting)
    bounds = _check_options(higher_is_better, bounds)
    if validate:
        check_scores(scores, bounds=bounds)
        check_vector("baseline", baseline, scores, skip_first=True, bounds=bounds)
    return _checked_curves(scores, baseline, forgetting, higher_is_better, validate)[0]


def _checked_curves(
    scores: Tensor, baseline: Tensor, forgetting: str, higher_is_better: bool, validate: bool
) -> tuple[dict[str, Tensor], Tensor]:
    """`_curves`; with ``validate``, a non-finite value of finite inputs is explained: a
    term (a difference of two cells) beyond the dtype raises naming its stage, task and cells,
    and otherwise (a row sum overflowed) the curves are recomputed from rescaled inputs
    (`_overflow`)."""
    curve, final = _curves(scores, baseline, forgetting, higher_is_better)
    if not validate or all_finite(*curve.values(), final):
        return curve, final
    _check_terms(scores, baseline, forgetting, higher_is_better)

    def compute(r: Tensor, b: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        return _curves(r, b, forgetting, higher_is_better)

    out: tuple[dict[str, Tensor], Tensor] = rescaled(
        compute, scores, baseline, terms=scores.shape[0]
    )
    return out


def _check_terms(scores: Tensor, baseline: Tensor, forgetting: str, higher_is_better: bool) -> None:
    """Raise naming the first term of a curve (BWT ``R[s,j] - R[j,j]``, FWT ``R[j-1,j] - b[j]``,
    forgetting ``P[s,j] - R[s,j]``, signed by the direction) whose difference is not finite."""
    T = scores.shape[0]
    old = triangle_masks(T, scores.device).old  # j < s
    diag = scores.diagonal()
    bwt = gain(scores, diag.unsqueeze(0).expand(T, T), higher_is_better).masked_fill(~old, 0.0)
    peak = running_peak(scores, higher_is_better=higher_is_better)
    if forgetting == "chaudhry":  # the peak before stage s
        peak = torch.cat([peak[:1], peak[:-1]])
    drop = gain(peak, scores, higher_is_better).masked_fill(~old, 0.0)
    for metric, terms in (("backward transfer", bwt), ("forgetting", drop)):
        if not no_infinite(terms):  # NaN: an absent cell's term
            s, j = first_infinite(terms)
            if metric == "backward transfer":
                cells = [_cell("scores", scores, s, j), _cell("scores", scores, j, j)]
            else:
                last = s - 1 if forgetting == "chaudhry" else s
                column = scores[j : last + 1, j]
                best = j + int(column.argmax() if higher_is_better else column.argmin())
                cells = [_cell("scores", scores, best, j), _cell("scores", scores, s, j)]
            raise overflow_error(metric, f"stage {s}, task {j}", cells)
    fwt = gain(scores.diagonal(offset=1), baseline[1:], higher_is_better)
    _check_per_task(
        "forward transfer",
        fwt,
        lambda k: [_cell("scores", scores, k, k + 1), _cell("baseline", baseline, k + 1)],
        1,
    )


def _curves(
    scores: Tensor, baseline: Tensor, forgetting: str, higher_is_better: bool = True
) -> tuple[dict[str, Tensor], Tensor]:
    """The curves and the final per-task forgetting, from one scan (inputs already checked).

    Lower-is-better: the scan runs on ``-R`` and every sum that enters a difference is negated
    (exactly) before it does, so each result has the bits of the higher-is-better one of ``-R``.
    """
    T = scores.shape[0]
    seen = torch.arange(1, T + 1, dtype=scores.dtype, device=scores.device)  # s + 1
    old = (seen - 1).clamp(min=1)  # s, with 1 at s = 0 where every numerator is 0

    # P[s, j] = max_{j<=i<=s} R[i, j] (of -R for lower-is-better); above the diagonal it is 0 or
    # -inf, which tril drops.
    peak, seen_sums, spare = _scan_peak(scores, higher_is_better)  # sum_{j<=s} R[s,j]
    upper_is_zero = T == 1 or bool(peak[0, -1] == 0)
    peak_sums = (peak if upper_is_zero else torch.tril(peak, out=spare)).sum(dim=1)  # P[s,s]
    diag = scores.diagonal()
    old_sums = seen_sums - diag  # sum_{j<s} R[s,j]
    diag_sums = diag.cumsum(0)  # sum_{j<=s} R[j,j]
    acc = seen_sums / seen

    gains = gain(scores.diagonal(offset=1), baseline[1:], higher_is_better)  # j = 1..T-1
    fwt_sums = torch.cat([gains.new_zeros(1), gains.cumsum(0)])

    # the sums of the oriented scores (-x is exact: these are the sums of -R, bit for bit)
    oriented_seen = seen_sums if higher_is_better else -seen_sums
    oriented_old = old_sums if higher_is_better else -old_sums
    if forgetting == "peak":
        drop_sums = peak_sums - oriented_seen
        final_peak = peak[T - 1, : T - 1]
    else:  # chaudhry: sum_{j<s} max_{j<=i<=s-1} R[i,j] = peak_sums[s-1]
        drop_sums = torch.cat([peak_sums.new_zeros(1), peak_sums[:-1]]) - oriented_old
        final_peak = peak[T - 2, : T - 1] if T > 1 else peak.new_empty(0)
    last = scores[T - 1, : T - 1]
    final_drop = final_peak - last if higher_is_better else final_peak + last
    curve = {
        "acc": acc,
        "bwt": gain(old_sums, diag_sums - diag, higher_is_better) / old,
        "fwt": fwt_sums / old,
        "forgetting": drop_sums / old,
        "learning_accuracy": diag_sums / seen,
        "average_incremental_accuracy": acc.cumsum(0) / seen,
    }
    return curve, final_drop  # a fresh tensor, not the workspace


def all_continual_metrics(
    scores: Tensor,
    baseline: Tensor,
    reference: Tensor | None = None,
    *,
    forgetting: str = "peak",
    higher_is_better: bool = True,
    bounds: Bounds = UNIT_BOUNDS,
    validate: bool = True,
) -> dict[str, Any]:
    r"""The whole metric family from one validation and one scan of ``R``.

    Returns the final values (0-dim: ``acc``, ``bwt``, ``fwt``, ``forgetting``,
    ``learning_accuracy``, ``average_incremental_accuracy``, and ``intransigence`` when
    ``reference`` is given), ``"curve"``
    ([`continual_metrics_curve`][continual_eval.functional.continual_metrics_curve]: every metric
    after every stage) and ``"per_task"`` (``bwt``, ``fwt``, ``forgetting`` of shape ``[T-1]``, and
    ``intransigence`` ``[T]``), each equal to the single-purpose function of the same name, with the
    same ``higher_is_better`` and ``bounds``.
    """
    check_forgetting_convention(forgetting)
    bounds = _check_options(higher_is_better, bounds)
    if validate:
        check_scores(scores, bounds=bounds)
        check_vector("baseline", baseline, scores, skip_first=True, bounds=bounds)
        if reference is not None:
            check_vector("reference", reference, scores, skip_first=False, bounds=bounds)
    curve, forgetting_per_task = _checked_curves(
        scores, baseline, forgetting, higher_is_better, validate
    )
    diag = scores.diagonal()
    per_task = {
        "bwt": gain(scores[-1, :-1], diag[:-1], higher_is_better),
        "fwt": gain(scores.diagonal(offset=1), baseline[1:], higher_is_better),
        "forgetting": forgetting_per_task,
    }
    result: dict[str, Any] = {key: values[-1] for key, values in curve.items()}
    if reference is not None:
        per_task["intransigence"] = gain(reference, diag, higher_is_better)
        if validate:
            cells = _intransigence_cells(scores, reference)
            _check_per_task("intransigence", per_task["intransigence"], cells)
        result["intransigence"] = _mean(per_task["intransigence"], validate)
    result["curve"] = curve
    result["per_task"] = per_task
    return result

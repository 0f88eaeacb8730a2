r"""Every accuracy-matrix metric after every stage, in one vectorised pass.

``curve[s]`` equals the metric of the leading sub-matrix ``R[:s+1, :s+1]`` and ``b[:s+1]``: the
value a run would have reported had it stopped after stage ``s``. All curves are computed from
``O(T^2)`` intermediates (running column maxima, row sums); nothing is ``O(T^3)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from continual_eval.functional._checks import (
    check_forgetting_convention,
    check_scores,
    check_vector,
)
from continual_eval.functional.accuracy_matrix import select_used_cells

CURVE_KEYS = (
    "acc",
    "bwt",
    "fwt",
    "forgetting",
    "learning_accuracy",
    "average_incremental_accuracy",
)


def running_peak(scores: Tensor) -> Tensor:
    r"""``P[s, j] = max_{j <= i <= s} R[i, j]`` (``-inf`` where ``s < j``): each task's best
    accuracy from the stage it was trained up to stage ``s``."""
    T = scores.shape[0]
    idx = torch.arange(T, device=scores.device)
    learned = idx.unsqueeze(1) >= idx.unsqueeze(0)
    neg_inf = torch.full((), float("-inf"), dtype=scores.dtype, device=scores.device)
    return torch.where(learned, scores, neg_inf).cummax(dim=0).values


def continual_metrics_curve(
    scores: Tensor, baseline: Tensor, *, forgetting: str = "peak", validate: bool = True
) -> dict[str, Tensor]:
    r"""Per-stage curves of ACC, BWT, FWT, forgetting, learning accuracy and average incremental
    accuracy, each of shape ``[T]``.

    With ``n_s = s`` old tasks at stage ``s`` (zero-based):

    * ``acc[s] = 1/(s+1) sum_{j<=s} R[s,j]``
    * ``bwt[s] = 1/s sum_{j<s} (R[s,j] - R[j,j])``, 0 at ``s = 0``
    * ``fwt[s] = 1/s sum_{1<=j<=s} (R[j-1,j] - b[j])``, 0 at ``s = 0``
    * ``forgetting[s] = 1/s sum_{j<s} (max_{j<=i<=s} R[i,j] - R[s,j])`` (``peak``; ``chaudhry``
      takes the max over ``j<=i<=s-1``), 0 at ``s = 0``
    * ``learning_accuracy[s] = 1/(s+1) sum_{j<=s} R[j,j]``
    * ``average_incremental_accuracy[s] = 1/(s+1) sum_{k<=s} acc[k]``

    ``curve[key][-1]`` equals :func:`continual_metrics` (and the scalar functions) on the full
    matrix. Arguments as in :func:`continual_eval.functional.continual_metrics`.
    """
    check_forgetting_convention(forgetting)
    if validate:
        check_scores(scores)
        check_vector("baseline", baseline, scores, skip_first=True)
    T = scores.shape[0]
    dtype, device = scores.dtype, scores.device
    R = select_used_cells(scores)
    seen = torch.arange(1, T + 1, dtype=dtype, device=device)  # tasks seen after stage s: s+1
    old = (seen - 1).clamp(
        min=1
    )  # tasks followed by training at stage s: s (1 for s=0 to avoid 0/0)

    diag = R.diagonal()
    row_sums = torch.tril(R).sum(dim=1)  # sum_{j<=s} R[s, j]
    old_diag_sums = diag.cumsum(0) - diag  # sum_{j<s} R[j, j]
    acc = row_sums / seen
    bwt = (row_sums - diag - old_diag_sums) / old  # s = 0: (R00 - R00 - 0) / 1 = 0

    gains = R.diagonal(offset=1) - baseline[1:]  # R[j-1, j] - b[j], j = 1..T-1
    fwt = torch.cat([gains.new_zeros(1), gains.cumsum(0)]) / old

    peak = running_peak(R)
    if forgetting == "chaudhry":
        peak = torch.cat([torch.full_like(peak[:1], float("-inf")), peak[:-1]])
    idx = torch.arange(T, device=device)
    old_cells = idx.unsqueeze(0) < idx.unsqueeze(1)  # j < s
    drops = torch.where(old_cells, peak - R, torch.zeros((), dtype=dtype, device=device))
    forgetting_curve = drops.sum(dim=1) / old

    return {
        "acc": acc,
        "bwt": bwt,
        "fwt": fwt,
        "forgetting": forgetting_curve,
        "learning_accuracy": diag.cumsum(0) / seen,
        "average_incremental_accuracy": acc.cumsum(0) / seen,
    }

r"""Metrics of continual evaluation *inside* training stages: the stability gap.

Evaluating only at task boundaries hides the transient collapse of old-task accuracy right after a
new task starts (De Lange, van de Ven & Tuytelaars, "Continual evaluation for lifelong learning:
identifying the stability gap", ICLR 2023). These functions read per-step evaluation curves:

* ``accuracy``: ``[N, T]``, the accuracy of task ``j`` at evaluation ``n`` (NaN where task ``j``
  was not evaluated);
* ``stage``: ``[N]`` integers, the training stage (task index) during which evaluation ``n`` ran;
  the evaluation at the end of stage ``k`` belongs to stage ``k``; non-decreasing;
* ``steps``: ``[N]``, the global training step of each evaluation (for recovery times).

Every stage ``k`` must end with an evaluation of task ``k`` (the boundary evaluation, i.e. the row
``R[k, :]`` of the accuracy matrix). Undefined values are NaN, never 0: min-ACC at stage 0 (no
old task), a gap that never recovers within the next stage.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_curves(accuracy: Tensor, stage: Tensor, steps: Tensor | None = None) -> None:
    if not accuracy.is_floating_point() or accuracy.ndim != 2:
        raise ValueError(
            "accuracy must be a floating [N, T] tensor, "
            f"got {accuracy.dtype} {tuple(accuracy.shape)}"
        )
    if stage.ndim != 1 or stage.shape[0] != accuracy.shape[0] or stage.is_floating_point():
        raise ValueError(
            f"stage must be an integer [N] = [{accuracy.shape[0]}] tensor, "
            f"got {stage.dtype} {tuple(stage.shape)}"
        )
    if stage.numel() and (bool((stage[1:] < stage[:-1]).any()) or int(stage.min()) < 0):
        raise ValueError(
            "stage must be non-negative and non-decreasing (evaluations in training order)"
        )
    if stage.numel() and int(stage.max()) >= accuracy.shape[1]:
        raise ValueError(f"stage {int(stage.max())} has no task column (T = {accuracy.shape[1]})")
    if steps is not None and (steps.shape != stage.shape or bool((steps[1:] < steps[:-1]).any())):
        raise ValueError("steps must have shape [N] and be non-decreasing")


def _num_stages(stage: Tensor) -> int:
    return int(stage.max()) + 1 if stage.numel() else 0


def stage_minima(accuracy: Tensor, stage: Tensor) -> Tensor:
    r"""``M[s, j] = min { accuracy[n, j] : stage[n] = s }``, ``[S, T]`` (NaN where task ``j`` was
    not evaluated during stage ``s``)."""
    S, (N, T) = _num_stages(stage), accuracy.shape
    inf = torch.full((), float("inf"), dtype=accuracy.dtype, device=accuracy.device)
    values = torch.where(torch.isnan(accuracy), inf, accuracy)
    minima = torch.full((S, T), float("inf"), dtype=accuracy.dtype, device=accuracy.device)
    minima.scatter_reduce_(0, stage.view(N, 1).expand(N, T), values, reduce="amin")
    return minima.masked_fill(torch.isinf(minima), float("nan"))


def boundary_indices(stage: Tensor) -> Tensor:
    """Index of the last evaluation of each stage (its boundary evaluation), ``[S]``."""
    index = torch.arange(stage.shape[0], device=stage.device)
    last = torch.full((_num_stages(stage),), -1, dtype=torch.long, device=stage.device)
    return last.scatter_reduce_(0, stage, index, reduce="amax")


def _old_task_minimum(accuracy: Tensor, stage: Tensor) -> Tensor:
    """``L[k, i] = min { accuracy[n, i] : i < stage[n] <= k }``: task i's worst accuracy after it
    was trained, up to the end of stage k; ``[S, T]``, NaN where undefined (``i >= k``)."""
    minima = stage_minima(accuracy, stage)
    S = minima.shape[0]
    s = torch.arange(S, device=accuracy.device).unsqueeze(1)
    i = torch.arange(accuracy.shape[1], device=accuracy.device).unsqueeze(0)
    after = torch.where(
        (s > i) & ~torch.isnan(minima), minima, torch.full_like(minima, float("inf"))
    )
    running = after.cummin(dim=0).values
    return running.masked_fill(torch.isinf(running), float("nan"))


def min_accuracy(accuracy: Tensor, stage: Tensor, *, validate: bool = True) -> Tensor:
    r"""min-ACC after each stage, ``[S]`` (De Lange et al., 2023, eq. 4):

    ``min-ACC[k] = 1/k sum_{i<k} min_{n: i < stage[n] <= k} accuracy[n, i]``, the mean over old
    tasks of their worst accuracy since they were trained. NaN at ``k = 0`` (no old task).
    """
    if validate:
        _check_curves(accuracy, stage)
    worst = _old_task_minimum(accuracy, stage)
    S = worst.shape[0]
    k = torch.arange(S, device=accuracy.device)
    old = k.unsqueeze(0) < k.unsqueeze(1)  # i < k
    old = torch.nn.functional.pad(old, (0, worst.shape[1] - S)) if worst.shape[1] > S else old
    total = torch.where(old, worst, torch.zeros_like(worst)).sum(dim=1)
    result = total / k.clamp(min=1).to(accuracy.dtype)
    return result.masked_fill(k == 0, float("nan"))


def worst_case_accuracy(accuracy: Tensor, stage: Tensor, *, validate: bool = True) -> Tensor:
    r"""WC-ACC after each stage, ``[S]`` (De Lange et al., 2023, eq. 5), with ``k+1`` tasks seen:

    ``WC-ACC[k] = 1/(k+1) accuracy[n_k, k] + (1 - 1/(k+1)) min-ACC[k]``, where ``n_k`` is stage
    ``k``'s boundary evaluation; at ``k = 0`` it is the current task's accuracy.
    """
    if validate:
        _check_curves(accuracy, stage)
    last = boundary_indices(stage)
    S = last.shape[0]
    k = torch.arange(S, device=accuracy.device)
    current = accuracy[last, k]
    seen = (k + 1).to(accuracy.dtype)
    combined = current / seen + (1 - 1 / seen) * min_accuracy(accuracy, stage, validate=False)
    return torch.where(k == 0, current, combined)  # NaN stays NaN where min-ACC is undefined


def stability_gap(
    accuracy: Tensor, stage: Tensor, steps: Tensor, *, tolerance: float = 0.0, validate: bool = True
) -> dict[str, Tensor]:
    r"""Per task ``j < S-1``, the stability gap it suffers when task ``j+1`` starts training.

    Returns tensors of shape ``[S-1]``:

    * ``boundary``: ``accuracy[n_j, j]`` at the end of stage ``j`` (its just-learned accuracy);
    * ``minimum``: its lowest accuracy during stage ``j+1``;
    * ``depth``: ``boundary - minimum`` (the gap; negative if it only improved);
    * ``recovery_steps``: global steps from the boundary to the first evaluation, at or after the
      minimum within stage ``j+1``, with accuracy ``>= boundary - tolerance``; 0 when the depth is
      within ``tolerance``; NaN when it had not recovered by the end of stage ``j+1``.
    """
    if validate:
        _check_curves(accuracy, stage, steps)
    last = boundary_indices(stage)
    S = last.shape[0]
    if S < 2:
        empty = accuracy.new_empty(0)
        return {"boundary": empty, "minimum": empty, "depth": empty, "recovery_steps": empty}
    tasks = torch.arange(S - 1, device=accuracy.device)
    boundary = accuracy[last[:-1], tasks]
    history = accuracy[:, : S - 1]  # [N, S-1]
    in_next = stage.unsqueeze(1) == (tasks + 1).unsqueeze(0)  # evaluation n is in stage j+1
    inf = torch.full((), float("inf"), dtype=accuracy.dtype, device=accuracy.device)
    during = torch.where(in_next & ~torch.isnan(history), history, inf)
    minimum, argmin = during.min(dim=0)
    minimum = minimum.masked_fill(torch.isinf(minimum), float("nan"))
    depth = boundary - minimum

    index = torch.arange(accuracy.shape[0], device=accuracy.device).unsqueeze(1)
    recovered = in_next & (index >= argmin) & (history >= (boundary - tolerance))
    first = torch.where(recovered, index, accuracy.shape[0]).amin(dim=0)
    found = first < accuracy.shape[0]
    step_values = steps.to(accuracy.dtype)
    elapsed = step_values[first.clamp(max=accuracy.shape[0] - 1)] - step_values[last[:-1]]
    nan = torch.full_like(elapsed, float("nan"))
    recovery = torch.where(found, elapsed, nan)
    recovery = torch.where(depth <= tolerance, torch.zeros_like(recovery), recovery)
    recovery = recovery.masked_fill(torch.isnan(depth), float("nan"))
    return {"boundary": boundary, "minimum": minimum, "depth": depth, "recovery_steps": recovery}

r"""Metrics of continual evaluation *inside* training stages: the stability gap.

Evaluating only at task boundaries hides the transient collapse of old-task accuracy right after a
new task starts (De Lange, van de Ven & Tuytelaars, "Continual evaluation for lifelong learning:
identifying the stability gap", ICLR 2023). These functions read per-step evaluation curves:

* ``accuracy``: ``[N, T]``, the accuracy of task ``j`` at evaluation ``n`` (NaN where task ``j``
  was not evaluated);
* ``stage``: ``[N]`` integers, the training stage (task index) during which evaluation ``n`` ran;
  the evaluation at the end of stage ``k`` belongs to stage ``k``; non-decreasing;
* ``steps``: ``[N]``, the global training step of each evaluation (for recovery times).

Every stage ``k`` from 0 to the last must end with an evaluation of task ``k`` (the boundary
evaluation, i.e. the row ``R[k, :]`` of the accuracy matrix). With ``validate=True`` (the default)
a stage sequence that skips a stage, does not start at 0 or goes backwards, and steps that go
backwards or do not match ``stage`` in length, are refused with an error naming the position.
With ``validate=False`` nothing is checked, but a stage with no evaluation is never read from
another stage's evaluations: what it would supply (its boundary accuracy and step, its min-ACC and
WC-ACC) is NaN.

Undefined values are NaN, never 0: min-ACC at stage 0 (no old task), a gap that never recovers
within the next stage, anything read from a boundary evaluation that is NaN.

Direction: with ``higher_is_better=False`` (a loss) "worst" means highest. min-ACC becomes the mean
of each old task's *maximum* since it was trained, WC-ACC mixes that worst value with the current
task's, and the stability gap's ``minimum`` is the worst (highest) value during the next stage,
its ``depth`` is ``worst - boundary`` (positive: a gap) and recovery means coming back to
``<= boundary + tolerance``. Each is computed as the higher-is-better function of ``-accuracy``
with the values (not depths or steps) negated back: exactly, bit for bit. The curves' values are
never range-checked (NaN marks "not evaluated"), so these functions take no ``bounds``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from continual_eval.functional._validation import (
    check_direction,
)


def _first(mask: Tensor) -> int:
    """Position of the first ``True`` in a 1-D boolean tensor that has one."""
    return int(mask.nonzero()[0, 0])


def _check_curves(accuracy: Tensor, stage: Tensor, steps: Tensor | None = None) -> None:
    """Shapes and dtypes, then the stage sequence (starts at 0, each next evaluation in the same
    stage or the next one) and the steps (finite, non-decreasing); errors name the position."""
    if not isinstance(accuracy, Tensor) or not accuracy.is_floating_point() or accuracy.ndim != 2:
        raise ValueError(
            "accuracy must be a floating [N, T] tensor, "
            f"got {getattr(accuracy, 'dtype', type(accuracy).__name__)} "
            f"{tuple(getattr(accuracy, 'shape', ()))}"
        )
    num_evals = accuracy.shape[0]
    if (
        not isinstance(stage, Tensor)
        or stage.ndim != 1
        or stage.shape[0] != num_evals
        or stage.is_floating_point()
        or stage.is_complex()
        or stage.dtype == torch.bool
    ):
        raise ValueError(
            f"stage must be an integer [N] = [{num_evals}] tensor (one stage per evaluation), "
            f"got {getattr(stage, 'dtype', type(stage).__name__)} "
            f"{tuple(getattr(stage, 'shape', ()))}"
        )
    if num_evals:
        stage = stage.detach()
        backwards = stage[1:] < stage[:-1]  # comparisons, not differences: no unsigned wrap
        if bool(backwards.any()):
            n = _first(backwards) + 1
            raise ValueError(
                f"stage[{n}] = {int(stage[n])} is less than stage[{n - 1}] = {int(stage[n - 1])}; "
                "stages must be non-decreasing (evaluations in training order)"
            )
        first = int(stage[0])
        if first < 0:
            raise ValueError(f"stage[0] = {first} is negative; stages are task indices")
        if first > 0:
            raise ValueError(
                f"stage 0 has no evaluation: stage[0] = {first}; the curves must start in stage 0 "
                "and every stage up to the last must end with its boundary evaluation"
            )
        skips = stage[1:] > stage[:-1] + 1
        if bool(skips.any()):
            n = _first(skips) + 1
            missing = int(stage[n - 1]) + 1
            raise ValueError(
                f"stage {missing} has no evaluation: stage[{n}] = {int(stage[n])} follows "
                f"stage[{n - 1}] = {int(stage[n - 1])}; every stage up to the last must end with "
                "its boundary evaluation"
            )
        if int(stage[-1]) >= accuracy.shape[1]:
            raise ValueError(
                f"stage[{num_evals - 1}] = {int(stage[-1])} has no task column "
                f"(accuracy has T = {accuracy.shape[1]})"
            )
    if steps is None:
        return
    if not isinstance(steps, Tensor) or steps.shape != stage.shape:
        raise ValueError(
            f"steps must have shape [N] = [{num_evals}] like stage (one step per evaluation), "
            f"got {tuple(getattr(steps, 'shape', ()))}"
        )
    steps = steps.detach()
    if steps.is_floating_point() and not bool(torch.isfinite(steps).all()):
        n = _first(~torch.isfinite(steps))
        raise ValueError(f"steps[{n}] is {steps[n].item()!r}; steps must be finite")
    if num_evals and bool((steps[1:] < steps[:-1]).any()):
        n = _first(steps[1:] < steps[:-1]) + 1
        raise ValueError(
            f"steps[{n}] = {steps[n].item()!r} is less than steps[{n - 1}] = "
            f"{steps[n - 1].item()!r}; steps must be non-decreasing"
        )


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
    """Index of the last evaluation of each stage (its boundary evaluation), ``[S]``; ``-1`` for a
    stage with no evaluation (mask it: as an index, -1 would read the last evaluation)."""
    index = torch.arange(stage.shape[0], device=stage.device)
    last = torch.full((_num_stages(stage),), -1, dtype=torch.long, device=stage.device)
    return last.scatter_reduce_(0, stage, index, reduce="amax")


def _boundaries(stage: Tensor) -> tuple[Tensor, Tensor]:
    """`boundary_indices` made safe to index with: ``(index, present)``, where ``index`` is
    0 for a stage with no evaluation and ``present`` is ``False`` there."""
    last = boundary_indices(stage)
    present = last >= 0
    return last.clamp(min=0), present


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


def min_accuracy(
    accuracy: Tensor, stage: Tensor, *, higher_is_better: bool = True, validate: bool = True
) -> Tensor:
    r"""min-ACC after each stage, ``[S]`` (De Lange et al., 2023, eq. 4):

    ``min-ACC[k] = 1/k sum_{i<k} min_{n: i < stage[n] <= k} accuracy[n, i]``, the mean over old
    tasks of their worst accuracy since they were trained. NaN at ``k = 0`` (no old task), where an
    old task has no evaluation in stages ``i+1..k``, and (``validate=False``) for a stage with no
    evaluation. ``higher_is_better=False``: the worst is the ``max`` (``-min_accuracy(-accuracy)``).
    """
    check_direction(higher_is_better)
    if validate:
        _check_curves(accuracy, stage)
    if not higher_is_better:
        return torch.neg(min_accuracy(torch.neg(accuracy), stage, validate=False))
    present = _boundaries(stage)[1]
    worst = _old_task_minimum(accuracy, stage)
    S = worst.shape[0]
    k = torch.arange(S, device=accuracy.device)
    old = k.unsqueeze(0) < k.unsqueeze(1)  # i < k
    old = torch.nn.functional.pad(old, (0, worst.shape[1] - S)) if worst.shape[1] > S else old
    total = torch.where(old, worst, torch.zeros_like(worst)).sum(dim=1)
    result = total / k.clamp(min=1).to(accuracy.dtype)
    return result.masked_fill((k == 0) | ~present, float("nan"))


def worst_case_accuracy(
    accuracy: Tensor, stage: Tensor, *, higher_is_better: bool = True, validate: bool = True
) -> Tensor:
    r"""WC-ACC after each stage, ``[S]`` (De Lange et al., 2023, eq. 5), with ``k+1`` tasks seen:

    ``WC-ACC[k] = 1/(k+1) accuracy[n_k, k] + (1 - 1/(k+1)) min-ACC[k]``, where ``n_k`` is stage
    ``k``'s boundary evaluation; at ``k = 0`` it is the current task's accuracy. NaN where min-ACC
    is undefined and (``validate=False``) for a stage with no evaluation (no boundary).
    ``higher_is_better=False``: min-ACC's worst is the ``max``
    (``-worst_case_accuracy(-accuracy)``).
    """
    check_direction(higher_is_better)
    if validate:
        _check_curves(accuracy, stage)
    if not higher_is_better:
        return torch.neg(worst_case_accuracy(torch.neg(accuracy), stage, validate=False))
    last, present = _boundaries(stage)
    S = last.shape[0]
    k = torch.arange(S, device=accuracy.device)
    current = accuracy[last, k].masked_fill(~present, float("nan"))
    seen = (k + 1).to(accuracy.dtype)
    combined = current / seen + (1 - 1 / seen) * min_accuracy(accuracy, stage, validate=False)
    return torch.where(k == 0, current, combined)  # NaN stays NaN where min-ACC is undefined


def stability_gap(
    accuracy: Tensor,
    stage: Tensor,
    steps: Tensor,
    *,
    tolerance: float = 0.0,
    higher_is_better: bool = True,
    validate: bool = True,
) -> dict[str, Tensor]:
    r"""Per task ``j < S-1``, the stability gap it suffers when task ``j+1`` starts training.

    Returns tensors of shape ``[S-1]``:

    * ``boundary``: ``accuracy[n_j, j]`` at the end of stage ``j`` (its just-learned accuracy);
    * ``minimum``: its lowest accuracy during stage ``j+1``;
    * ``depth``: ``boundary - minimum`` (the gap; negative if it only improved);
    * ``recovery_steps``: global steps from the boundary to the first evaluation, at or after the
      minimum within stage ``j+1``, with accuracy ``>= boundary - tolerance``; 0 when the depth is
      within ``tolerance``; NaN when it had not recovered by the end of stage ``j+1``.

    Undefined entries are NaN: ``minimum`` when task ``j`` was not evaluated during stage ``j+1``,
    ``boundary`` when stage ``j`` has no evaluation (``validate=False`` only), and ``depth`` and
    ``recovery_steps`` whenever either is.

    ``higher_is_better=False`` (a loss): ``minimum`` is the worst, i.e. *highest*, value during
    stage ``j+1``, ``depth = minimum - boundary`` (positive: a gap) and recovery is the first
    evaluation at or after it with a value ``<= boundary + tolerance`` (the same keys, computed as
    the function of ``-accuracy`` with ``boundary`` and ``minimum`` negated back).
    """
    check_direction(higher_is_better)
    if validate:
        _check_curves(accuracy, stage, steps)
    if not higher_is_better:
        flipped = stability_gap(
            torch.neg(accuracy), stage, steps, tolerance=tolerance, validate=False
        )
        for key in ("boundary", "minimum"):
            flipped[key] = torch.neg(flipped[key])
        return flipped
    last, present = _boundaries(stage)
    S = last.shape[0]
    if S < 2:
        empty = accuracy.new_empty(0)
        return {"boundary": empty, "minimum": empty, "depth": empty, "recovery_steps": empty}
    tasks = torch.arange(S - 1, device=accuracy.device)
    boundary = accuracy[last[:-1], tasks].masked_fill(~present[:-1], float("nan"))
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

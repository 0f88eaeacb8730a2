r"""Anytime and plasticity metrics of per-step evaluation curves.

The inputs are the curves the callback records with ``eval_every_n_steps``
(``ContinualEvalCallback.curves()``, or
[`ContinualResults.curves()`][continual_eval.results.ContinualResults.curves] of a run read
back), the same as `continual_eval.functional.stability`'s:

* ``accuracy``: ``[N, T]`` floating, the score of task ``j`` at evaluation ``n`` (NaN where task
  ``j`` was not evaluated; the callback scores the tasks ``j <= stage[n]``);
* ``stage``: ``[N]`` integers, the training stage (task index) of evaluation ``n``, starting at 0,
  non-decreasing, no stage skipped; the evaluation at the end of stage ``k`` (its *boundary*)
  belongs to stage ``k``;
* ``steps``: ``[N]``, the optimizer step of each evaluation (the callback's cumulative counter,
  which starts at 0 and continues across fits), non-decreasing.

Stage starts. Stage 0 starts at step 0; stage ``k > 0`` starts at the step of stage ``k-1``'s
boundary evaluation (the model there is the model stage ``k`` starts from). "Step ``b`` of stage
``k``" is the evaluation of stage ``k`` at step ``start_k + b``.

The callback records no evaluation at a stage's start: the scores there come from the accuracy
matrix instead. Every function here takes ``initial``, ``[T]``: ``initial[k]`` is the score of
task ``k`` at the start of stage ``k`` (before its first optimizer step), which
[`stage_start_accuracy`][continual_eval.functional.stage_start_accuracy] reads from ``R`` and ``b``
(``b[0]``, then ``R[k-1, k]``). With ``initial=None`` only the recorded evaluations are read.

Absent values are NaN, never 0 (``results.json`` shows them as ``null``): a metric whose
evaluations are missing (a stage without the steps it needs, a NaN score where one is read, a
curve spanning no steps) is NaN. The curves' values are not range-checked (NaN marks "not
evaluated"); ``validate=True`` (the default) checks the shapes and the stage and step sequences
(errors name the position), ``validate=False`` skips every check.

Direction. Anytime accuracy, the learning curve and its area are plain means of scores in the
score's own units (for a loss, lower is better). The normalised forward transfer takes ``best``,
the best attainable score (``1`` for accuracy in ``[0, 1]``, ``0`` for a loss), so that a
positive value always means the continual learner learned the task faster than the reference.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from continual_eval.functional.stability import _boundaries, _check_curves, _num_stages

__all__ = [
    "ANYTIME_RULES",
    "anytime_accuracy",
    "auc_forward_transfer",
    "auc_forward_transfer_per_task",
    "learning_curve",
    "learning_curve_area",
    "seen_task_accuracy",
    "stage_auc",
    "stage_start_accuracy",
]


def _check_initial(name: str, vector: Tensor | None, accuracy: Tensor) -> None:
    """A per-task vector ``[T]`` of the accuracy's dtype and device (NaN allowed)."""
    if vector is None:
        return
    if not isinstance(vector, Tensor) or not vector.is_floating_point():
        raise TypeError(
            f"{name} must be a floating torch.Tensor, "
            f"got {getattr(vector, 'dtype', type(vector).__name__)}"
        )
    num_tasks = accuracy.shape[1]
    if vector.ndim != 1 or vector.shape[0] != num_tasks:
        raise ValueError(
            f"{name} must have shape [T] = [{num_tasks}] like accuracy's task columns, "
            f"got {tuple(vector.shape)}"
        )
    if vector.dtype != accuracy.dtype:
        raise TypeError(f"{name} dtype {vector.dtype} does not match accuracy's {accuracy.dtype}")
    if vector.device != accuracy.device:
        raise ValueError(f"{name} is on {vector.device} but accuracy is on {accuracy.device}")


def _stage_starts(stage: Tensor, steps: Tensor) -> tuple[Tensor, Tensor]:
    """``(start [S], known [S])``: stage 0 starts at step 0, stage ``k`` at the step of stage
    ``k-1``'s boundary evaluation; ``known`` is ``False`` where that stage has no evaluation
    (``validate=False`` only). ``start`` has ``steps``' dtype."""
    last, present = _boundaries(stage)
    if last.numel() == 0:
        return steps.new_zeros(0), present
    start = torch.cat([steps.new_zeros(1), steps[last[:-1]]])
    known = torch.cat([present.new_ones(1), present[:-1]])
    return start, known


def _own_scores(accuracy: Tensor, stage: Tensor) -> Tensor:
    """``accuracy[n, stage[n]]``, ``[N]``: each evaluation's score of the task being trained."""
    index = torch.arange(accuracy.shape[0], device=accuracy.device)
    return accuracy[index, stage]


def _nan(like: Tensor) -> Tensor:
    return torch.full((), float("nan"), dtype=like.dtype, device=like.device)


def stage_start_accuracy(scores: Tensor, baseline: Tensor, *, validate: bool = True) -> Tensor:
    r"""``a[k]``, the score of task ``k`` at the start of stage ``k`` (before its first step),
    ``[T]``: ``b[0]`` for ``k = 0`` and ``R[k-1, k]`` for ``k >= 1``.

    ``scores`` is the accuracy matrix ``R`` (``[S, T]`` with ``S <= T`` stages recorded),
    ``baseline`` the untrained model's ``b`` (``[T]``). NaN where the cell is NaN or its stage
    ``k-1`` is not recorded. This is the ``initial`` the curve functions take: the callback
    records ``b`` for every task and ``R[k-1, k]`` always, but no curve point at a stage's start.

    >>> R = torch.tensor([[0.9, 0.3, 0.2], [0.8, 0.9, 0.4]], dtype=torch.float64)
    >>> stage_start_accuracy(R, torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64)).tolist()
    [0.1, 0.3, 0.4]
    """
    if validate:
        if not isinstance(scores, Tensor) or not scores.is_floating_point() or scores.ndim != 2:
            raise ValueError(
                "scores must be a floating [S, T] tensor, "
                f"got {getattr(scores, 'dtype', type(scores).__name__)} "
                f"{tuple(getattr(scores, 'shape', ()))}"
            )
        if scores.shape[0] > scores.shape[1]:
            raise ValueError(
                f"scores has {scores.shape[0]} stages (rows) for {scores.shape[1]} tasks"
            )
        _check_initial("baseline", baseline, scores)
    num_stages, num_tasks = scores.shape
    if num_tasks == 0:
        return baseline.clone()
    start = torch.full_like(baseline, float("nan"))
    start[0] = baseline[0]
    rows = min(num_stages, num_tasks - 1)
    index = torch.arange(rows, device=scores.device)
    start[1 : rows + 1] = scores[index, index + 1]
    return start


#: the rules of [`anytime_accuracy`][continual_eval.functional.anytime_accuracy]
ANYTIME_RULES = ("trapezoid", "koh")


def _check_weights(weights: Tensor | None, accuracy: Tensor) -> None:
    _check_initial("weights", weights, accuracy)
    if weights is not None and not bool((weights > 0).all() & torch.isfinite(weights).all()):
        bad = int((~((weights > 0) & torch.isfinite(weights))).nonzero()[0, 0])
        raise ValueError(
            f"weights[{bad}] is {weights[bad].item()!r}; task weights (e.g. test-set sizes) "
            "must be positive and finite"
        )


def seen_task_accuracy(
    accuracy: Tensor, stage: Tensor, *, weights: Tensor | None = None, validate: bool = True
) -> Tensor:
    r"""``f[n] = 1/(stage[n]+1) sum_{j <= stage[n]} accuracy[n, j]``, ``[N]``: the mean score over
    the tasks seen so far (the current one included) at each evaluation; NaN where one of them
    was not evaluated.

    ``weights`` ``[T]`` (e.g. the test-set sizes ``n_j``) weights the tasks instead:
    ``f[n] = sum_{j <= stage[n]} w_j accuracy[n, j] / sum_{j <= stage[n]} w_j``; with the
    test-set sizes this is the accuracy over the pooled test items of the seen tasks, Koh et
    al.'s ``f`` (accuracy on the test data of the seen classes)."""
    if validate:
        _check_curves(accuracy, stage)
        _check_weights(weights, accuracy)
    tasks = torch.arange(accuracy.shape[1], device=accuracy.device)
    seen = tasks.unsqueeze(0) <= stage.unsqueeze(1)
    if weights is None:
        total = torch.where(seen, accuracy, torch.zeros_like(accuracy)).sum(dim=1)
        return total / (stage + 1).to(accuracy.dtype)
    w = torch.where(seen, weights.unsqueeze(0), torch.zeros_like(accuracy))
    return torch.where(seen, accuracy * w, torch.zeros_like(accuracy)).sum(dim=1) / w.sum(dim=1)


def anytime_accuracy(
    accuracy: Tensor,
    stage: Tensor,
    steps: Tensor,
    *,
    initial: Tensor | None = None,
    rule: str = "trapezoid",
    weights: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    r"""Anytime accuracy ``A_AUC``, 0-dim: the seen-task score averaged over training (Koh et
    al., "Online Continual Learning on Class Incremental Blurry Task Configuration with Anytime
    Inference", ICLR 2022).

    Koh et al. evaluate every ``dn`` training samples and define ``A_AUC = sum_{i=1}^{k} f(i dn)
    dn``, with ``f`` the accuracy on the test data of the classes seen so far; their code
    reports it divided by the span ``k dn``, i.e. the plain mean of ``f`` over the evaluations.
    Two rules, with ``f`` = `seen_task_accuracy` (the mean over seen tasks, or with
    ``weights`` = the test-set sizes the accuracy over their pooled items, Koh et al.'s ``f``):

    * ``rule="trapezoid"`` (default): the area under ``f`` over optimizer steps by the
      trapezoid rule, divided by the span: ``A_AUC = 1/(s_{N-1} - s_0) sum_{n=1}^{N-1} (s_n -
      s_{n-1}) (f_n + f_{n-1}) / 2`` with ``s`` = ``steps``. Uneven evaluations are weighted by
      the steps they stand for. The first point: the area starts at the first recorded
      evaluation (``s_0``) unless ``initial`` is given, in which case the point ``(step 0,
      initial[0])`` (task 0's untrained score, ``b[0]``) is put first and the span is ``[0,
      s_{N-1}]``. At a stage boundary the seen set grows by one task; the segment between a
      stage's last evaluation and the next stage's first interpolates linearly between their
      means. NaN when the curve spans no steps (fewer than two points, or all at one step).
    * ``rule="koh"``: Koh et al.'s literal estimate, ``A_AUC = 1/N sum_n f_n``, the mean of
      ``f`` over the recorded evaluations (equal weights; ``steps`` only validated). It equals
      ``sum_i f(i dn) dn / (k dn)`` when the evaluations are every ``dn`` samples (or optimizer
      steps at a fixed batch size) from ``dn`` on: record them so (``eval_every_n_steps = dn``
      and stage ends on that grid) to reproduce their number. ``initial`` is refused: their sum
      has no point at step 0.

    On an even grid the two differ only at the ends: the trapezoid gives the first and last
    points half weight. NaN when a seen task's score is NaN at some evaluation.

    >>> acc = torch.tensor([[0.5, float("nan")], [0.7, float("nan")], [0.6, 0.2]])
    >>> stage, steps = torch.tensor([0, 0, 1]), torch.tensor([10, 20, 30])
    >>> # f = [0.5, 0.7, 0.4]; (10 * 0.6 + 10 * 0.55) / 20
    >>> round(anytime_accuracy(acc, stage, steps).item(), 6)
    0.575
    >>> round(anytime_accuracy(acc, stage, steps, rule="koh").item(), 6)  # (0.5 + 0.7 + 0.4) / 3
    0.533333
    """
    if rule not in ANYTIME_RULES:
        raise ValueError(f"unknown anytime-accuracy rule {rule!r}; expected one of {ANYTIME_RULES}")
    if validate:
        _check_curves(accuracy, stage, steps)
        _check_initial("initial", initial, accuracy)
        _check_weights(weights, accuracy)
    if rule == "koh" and initial is not None:
        raise ValueError(
            'rule="koh" takes no initial point: Koh et al.\'s sum runs over the evaluations '
            "after dn, 2 dn, ... samples, none at step 0"
        )
    f = seen_task_accuracy(accuracy, stage, weights=weights, validate=False)
    if rule == "koh":
        return f.mean() if f.numel() else _nan(accuracy)
    x = steps.to(accuracy.dtype)
    if initial is not None and f.numel():
        f = torch.cat([initial[:1], f])
        x = torch.cat([x.new_zeros(1), x])
    if f.numel() < 2:
        return _nan(accuracy)
    area = ((x[1:] - x[:-1]) * (f[1:] + f[:-1]) / 2).sum()
    span = x[-1] - x[0]
    return torch.where(span > 0, area / span, _nan(accuracy))


def learning_curve(
    accuracy: Tensor,
    stage: Tensor,
    steps: Tensor,
    beta: int,
    *,
    initial: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    r"""``a[k, b]``, the score of task ``k`` after ``b`` optimizer steps of its own stage ``k``,
    ``b = 0..beta``; ``[S, beta+1]`` (Chaudhry et al., "Efficient Lifelong Learning with A-GEM",
    ICLR 2019: ``a_{k,b,k}``, with ``b`` counted in mini-batches there, optimizer steps here).

    ``a[k, b]`` is read from the evaluation of stage ``k`` at step ``start_k + b`` (see the
    module's stage starts); ``a[k, 0]`` is ``initial[k]`` when ``initial`` is given (the score
    before the stage's first step,
    [`stage_start_accuracy`][continual_eval.functional.stage_start_accuracy]), else an evaluation of
    stage ``k`` at step ``start_k`` if there is one. NaN where no evaluation stands for that step:
    the curves need an evaluation at every one of the first ``beta`` steps of every stage
    (``eval_every_n_steps=1``, or stages shorter than ``beta`` leave NaN). The column means are
    A-GEM's ``Z_b``.
    """
    if validate:
        _check_curves(accuracy, stage, steps)
        _check_initial("initial", initial, accuracy)
        if not isinstance(beta, numbers.Integral) or isinstance(beta, bool) or beta < 0:
            raise ValueError(f"beta must be a non-negative integer, got {beta!r}")
    beta = int(beta)
    S, N, width = _num_stages(stage), accuracy.shape[0], beta + 1
    start, known = _stage_starts(stage, steps)
    table = torch.full((S * width,), float("nan"), dtype=accuracy.dtype, device=accuracy.device)
    if N:
        rel = steps - start[stage]
        use = known[stage] & (rel >= 0) & (rel <= beta)
        if steps.is_floating_point():
            use &= rel == rel.floor()  # only whole steps stand for a step b
        cell = stage * width + rel.clamp(0, beta).to(torch.long)
        index = torch.arange(N, device=accuracy.device)
        last = torch.full((S * width,), -1, dtype=torch.long, device=accuracy.device)
        last.scatter_reduce_(0, cell[use], index[use], reduce="amax")  # the last at that step
        own = _own_scores(accuracy, stage)
        table = torch.where(last >= 0, own[last.clamp(min=0)], table)
    table = table.view(S, width)
    if initial is not None:
        table[:, 0] = initial[:S]
    return table


def learning_curve_area(
    accuracy: Tensor,
    stage: Tensor,
    steps: Tensor,
    beta: int,
    *,
    initial: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    r"""Learning curve area ``LCA_beta``, 0-dim (Chaudhry et al., "Efficient Lifelong Learning
    with A-GEM", ICLR 2019):

    ``LCA_beta = 1/(beta+1) sum_{b=0}^{beta} Z_b``, ``Z_b = 1/S sum_k a[k, b]``, with ``a`` =
    [`learning_curve`][continual_eval.functional.learning_curve] (``b`` in optimizer steps from the
    stage's start; ``b = 0`` is the score before the stage's first step) and the ``S`` stages the
    curves hold (pass only finished stages). NaN (absent) unless the curves hold steps ``0..beta``
    of every stage, and for no stage at all. ``LCA_0`` is the mean score of each task just before it
    is trained (``Z_0``).

    >>> nan = float("nan")
    >>> acc = torch.tensor([[0.4, nan], [0.6, nan], [0.8, nan], [0.9, 0.5], [0.9, 0.7]])
    >>> stage, steps = torch.tensor([0, 0, 0, 1, 1]), torch.tensor([1, 2, 3, 4, 5])
    >>> initial = torch.tensor([0.1, 0.2])  # b[0], R[0, 1]
    >>> # a = [[0.1, 0.4, 0.6], [0.2, 0.5, 0.7]]; Z = [0.15, 0.45, 0.65]
    >>> round(learning_curve_area(acc, stage, steps, 2, initial=initial).item(), 6)
    0.416667
    """
    table = learning_curve(accuracy, stage, steps, beta, initial=initial, validate=validate)
    return table.mean(dim=0).mean() if table.numel() else _nan(accuracy)


def stage_auc(
    accuracy: Tensor,
    stage: Tensor,
    steps: Tensor,
    *,
    initial: Tensor | None = None,
    validate: bool = True,
) -> Tensor:
    r"""``AUC_k``, ``[S]``: the area under task ``k``'s score during its own stage ``k``, divided
    by the span it covers, i.e. the stage's mean score of the task being learned (Wolczyk et al.,
    "Continual World: A Robotic Benchmark For Continual Reinforcement Learning", NeurIPS 2021:
    ``AUC_i = 1/Delta int_{i Delta}^{(i+1) Delta} p_i(t) dt``).

    The trapezoid rule over stage ``k``'s evaluations of task ``k``, divided by their span (the
    stage's last step minus its first evaluation's). With ``initial``, the point
    ``(start_k, initial[k])`` is put first and the span is the whole stage, ``[start_k,
    boundary step]``. NaN where a score read is NaN or the stage's points span no steps.

    For the reference ``AUC^ref`` of
    [`auc_forward_transfer`][continual_eval.functional.auc_forward_transfer], call this on the
    curves of the reference run: one run that re-initialises the model at each stage gives ``[T]``
    at once; for ``T`` single-task runs, stack ``stage_auc(...)[0]`` of each.
    """
    if validate:
        _check_curves(accuracy, stage, steps)
        _check_initial("initial", initial, accuracy)
    S, N = _num_stages(stage), accuracy.shape[0]
    if S == 0:
        return accuracy.new_empty(0)
    own = _own_scores(accuracy, stage)
    x = steps.to(accuracy.dtype)
    same = stage[1:] == stage[:-1]
    segment = (x[1:] - x[:-1]) * (own[1:] + own[:-1]) / 2
    area = torch.zeros(S, dtype=accuracy.dtype, device=accuracy.device)
    area.index_add_(0, stage[1:], torch.where(same, segment, torch.zeros_like(segment)))
    index = torch.arange(N, device=accuracy.device)
    first = torch.full((S,), N, dtype=torch.long, device=accuracy.device)
    first.scatter_reduce_(0, stage, index, reduce="amin")
    last, present = _boundaries(stage)
    first = first.clamp(max=N - 1)  # a stage without evaluations (validate=False): masked below
    begin = x[first]
    if initial is not None:
        start, known = _stage_starts(stage, steps)
        start = start.to(accuracy.dtype)
        area = area + (begin - start) * (initial[:S] + own[first]) / 2
        begin = start.masked_fill(~known, float("nan"))
    span = x[last] - begin
    ok = present & (span > 0)
    return torch.where(ok, area / span.masked_fill(~ok, 1), torch.full_like(area, float("nan")))


def auc_forward_transfer_per_task(
    accuracy: Tensor,
    stage: Tensor,
    steps: Tensor,
    reference_auc: Tensor,
    *,
    initial: Tensor | None = None,
    best: float = 1.0,
    validate: bool = True,
) -> Tensor:
    r"""Continual World's normalised forward transfer per task, ``[S]`` (Wolczyk et al., NeurIPS
    2021): ``FT_k = (AUC_k - AUC_k^ref) / (best - AUC_k^ref)``.

    ``AUC_k`` = [`stage_auc`][continual_eval.functional.stage_auc] of these curves (with
    ``initial``), ``reference_auc`` ``[T]`` the same area for a reference that learns task ``k``
    alone from scratch (NaN: no reference). ``best`` is the best attainable score: ``1`` (the
    paper's success rate, accuracy in ``[0, 1]``) gives ``(AUC - AUC^ref) / (1 - AUC^ref)``; ``0``
    for a loss gives ``(AUC^ref - AUC) / AUC^ref``. Positive: learned faster than the reference; at
    most 1. NaN where either area is NaN or the reference already attains ``best``
    (``AUC^ref = best``).
    """
    if validate:
        _check_curves(accuracy, stage, steps)
        _check_initial("initial", initial, accuracy)
        _check_initial("reference_auc", reference_auc, accuracy)
        if not isinstance(best, numbers.Real) or isinstance(best, bool) or not math.isfinite(best):
            raise ValueError(f"best must be a finite real number, got {best!r}")
    auc = stage_auc(accuracy, stage, steps, initial=initial, validate=False)
    reference = reference_auc[: auc.shape[0]]
    room = best - reference
    ok = room != 0
    ratio = (auc - reference) / room.masked_fill(~ok, 1)
    return torch.where(ok, ratio, torch.full_like(ratio, float("nan")))


def auc_forward_transfer(
    accuracy: Tensor,
    stage: Tensor,
    steps: Tensor,
    reference_auc: Tensor,
    *,
    initial: Tensor | None = None,
    best: float = 1.0,
    validate: bool = True,
) -> Tensor:
    r"""Continual World's forward transfer ``FT = 1/S sum_k FT_k``, 0-dim (Wolczyk et al.,
    NeurIPS 2021), over the ``S`` stages the curves hold (pass only finished stages);
    ``FT_k`` from
    [`auc_forward_transfer_per_task`][continual_eval.functional.auc_forward_transfer_per_task]. NaN
    (absent) when any ``FT_k`` is, and for no stage.

    >>> nan = float("nan")
    >>> acc = torch.tensor([[0.2, nan], [0.6, nan], [0.5, 0.4], [0.5, 1.0]])
    >>> stage, steps = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 10, 10, 20])
    >>> # AUC = [0.4, 0.7]; reference [0.4, 0.4]: FT = [0, 0.3 / 0.6]
    >>> ft = auc_forward_transfer(acc, stage, steps, torch.tensor([0.4, 0.4]))
    >>> round(ft.item(), 6)
    0.25
    """
    per_task = auc_forward_transfer_per_task(
        accuracy, stage, steps, reference_auc, initial=initial, best=best, validate=validate
    )
    return per_task.mean() if per_task.numel() else _nan(accuracy)

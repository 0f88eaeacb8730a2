"""Anytime and plasticity metrics of step curves: values by hand, plain-loop references on random
curves in the callback's format, and the absent (NaN) cases."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from continual_eval import functional as F
from continual_eval.step_curves import StepCurves

NAN = float("nan")


# ---------------------------------------------------------------------------- plain-loop references
def ref_stage_starts(stage: list[int], steps: list[float]) -> list[float]:
    """Stage 0 starts at step 0, stage k at the step of stage k-1's last evaluation."""
    S = max(stage) + 1 if stage else 0
    starts = [0.0]
    for k in range(1, S):
        starts.append(float([s for s, g in zip(steps, stage, strict=True) if g == k - 1][-1]))
    return starts


def ref_trapezoid(points: list[tuple[float, float]]) -> float:
    if len(points) < 2 or points[-1][0] - points[0][0] <= 0:
        return NAN
    area = 0.0
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        area += (x1 - x0) * (y0 + y1) / 2
    return area / (points[-1][0] - points[0][0])


def ref_anytime(acc, stage, steps, initial=None) -> float:
    points = []
    for row, k, s in zip(acc, stage, steps, strict=True):
        total = 0.0
        for j in range(k + 1):
            total += row[j]
        points.append((float(s), total / (k + 1)))
    if initial is not None and points:
        points.insert(0, (0.0, initial[0]))
    return ref_trapezoid(points)


def ref_learning_curve(acc, stage, steps, beta, initial=None) -> list[list[float]]:
    starts = ref_stage_starts(stage, steps)
    table = []
    for k in range(len(starts)):
        row = []
        for b in range(beta + 1):
            value = NAN
            for n in range(len(stage)):  # the last evaluation of stage k at step start_k + b
                if stage[n] == k and steps[n] - starts[k] == b:
                    value = acc[n][k]
            row.append(value)
        if initial is not None:
            row[0] = initial[k]
        table.append(row)
    return table


def ref_lca(acc, stage, steps, beta, initial=None) -> float:
    table = ref_learning_curve(acc, stage, steps, beta, initial)
    if not table:
        return NAN
    total = 0.0
    for b in range(beta + 1):
        z = 0.0
        for k in range(len(table)):
            z += table[k][b]
        total += z / len(table)
    return total / (beta + 1)


def ref_stage_auc(acc, stage, steps, initial=None) -> list[float]:
    starts = ref_stage_starts(stage, steps)
    out = []
    for k in range(len(starts)):
        points = [(float(steps[n]), acc[n][k]) for n in range(len(stage)) if stage[n] == k]
        if initial is not None:
            points.insert(0, (starts[k], initial[k]))
        out.append(ref_trapezoid(points))
    return out


def ref_ft_per_task(acc, stage, steps, reference, initial=None, best=1.0) -> list[float]:
    out = []
    for k, auc in enumerate(ref_stage_auc(acc, stage, steps, initial)):
        room = best - reference[k]
        out.append(NAN if room == 0 else (auc - reference[k]) / room)
    return out


def ref_mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else NAN


def same(actual: torch.Tensor | float, expected: float) -> bool:
    value = float(actual)
    if math.isnan(expected):
        return math.isnan(value)
    return value == pytest.approx(expected, rel=1e-9, abs=1e-12)


def assert_same(actual: torch.Tensor, expected) -> None:
    flat_actual = actual.flatten().tolist()
    flat_expected = torch.tensor(expected, dtype=torch.float64).flatten().tolist()
    assert len(flat_actual) == len(flat_expected)
    for a, e in zip(flat_actual, flat_expected, strict=True):
        assert same(a, e), (flat_actual, flat_expected)


# ------------------------------------------------------------------ curves like the callback's
def callback_curves(
    stage_lengths: list[int], every: int, num_tasks: int, rng: random.Random, nan_rate: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(accuracy, stage, steps)`` as ``StepCurves`` records them: every ``every`` global steps
    inside a stage and at its end (replacing a per-step row at the same step), tasks after the
    stage NaN."""
    curves = StepCurves()
    step = 0
    for k, length in enumerate(stage_lengths):
        for _ in range(length):
            step += 1
            if step % every == 0:
                curves.add(step, k, random_row(num_tasks, rng, nan_rate), full=False)
        curves.add(step, k, random_row(num_tasks, rng, nan_rate), full=True)
    steps, stage, scores = curves.tensors(num_tasks)
    return scores, stage, steps


def random_row(num_tasks: int, rng: random.Random, nan_rate: float) -> torch.Tensor:
    return torch.tensor(
        [NAN if rng.random() < nan_rate else round(rng.random(), 3) for _ in range(num_tasks)],
        dtype=torch.float64,
    )


def as_lists(acc, stage, steps):
    return acc.tolist(), stage.tolist(), steps.tolist()


# ---------------------------------------------------------------------------- by hand
# Two tasks. Stage 0: steps 1..4, stage 1: steps 5..7 (it starts at step 4, stage 0's end).
# Evaluations every step (eval_every_n_steps=1); stage 0's rows score task 0 only.
HAND_ACC = torch.tensor(
    [
        [0.2, NAN],  # step 1
        [0.4, NAN],  # step 2
        [0.6, NAN],  # step 3
        [0.8, NAN],  # step 4: end of stage 0
        [0.6, 0.5],  # step 5 (stage 1, b = 1)
        [0.7, 0.7],  # step 6 (b = 2)
        [0.8, 0.9],  # step 7: end of stage 1 (b = 3)
    ],
    dtype=torch.float64,
)
HAND_STAGE = torch.tensor([0, 0, 0, 0, 1, 1, 1])
HAND_STEPS = torch.tensor([1, 2, 3, 4, 5, 6, 7])
# The accuracy matrix of this run: b = [0.1, 0.3], R = [[0.8, 0.4], [0.8, 0.9]].
HAND_R = torch.tensor([[0.8, 0.4], [0.8, 0.9]], dtype=torch.float64)
HAND_B = torch.tensor([0.1, 0.3], dtype=torch.float64)


def test_stage_start_accuracy_reads_b0_then_the_superdiagonal():
    assert F.stage_start_accuracy(HAND_R, HAND_B).tolist() == [0.1, 0.4]
    R = torch.tensor([[0.9, 0.2, 0.3], [0.8, 0.7, NAN]], dtype=torch.float64)
    b = torch.tensor([0.05, 0.1, 0.1], dtype=torch.float64)
    assert_same(F.stage_start_accuracy(R, b), [0.05, 0.2, NAN])  # R[1, 2] not evaluated
    assert_same(F.stage_start_accuracy(R[:1], b), [0.05, 0.2, NAN])  # stage 1 not recorded
    assert F.stage_start_accuracy(R[:0], b).tolist()[0] == 0.05


def test_anytime_accuracy_by_hand():
    # seen-task means f = [0.2, 0.4, 0.6, 0.8, 0.55, 0.7, 0.85] at steps 1..7 (unit widths)
    f = F.seen_task_accuracy(HAND_ACC, HAND_STAGE)
    assert f.tolist() == pytest.approx([0.2, 0.4, 0.6, 0.8, 0.55, 0.7, 0.85])
    # trapezoid: sum of (f[n-1] + f[n]) / 2 = 0.3 + 0.5 + 0.7 + 0.675 + 0.625 + 0.775 = 3.575
    # over the span 7 - 1 = 6
    assert F.anytime_accuracy(HAND_ACC, HAND_STAGE, HAND_STEPS).item() == pytest.approx(3.575 / 6)
    # with the untrained model at step 0 (b[0] = 0.1): + (0.1 + 0.2) / 2, over 7
    initial = F.stage_start_accuracy(HAND_R, HAND_B)
    value = F.anytime_accuracy(HAND_ACC, HAND_STAGE, HAND_STEPS, initial=initial)
    assert value.item() == pytest.approx((3.575 + 0.15) / 7)


def test_learning_curve_area_by_hand():
    initial = F.stage_start_accuracy(HAND_R, HAND_B)  # [b[0], R[0, 1]] = [0.1, 0.4]
    table = F.learning_curve(HAND_ACC, HAND_STAGE, HAND_STEPS, 3, initial=initial)
    # task 0 at steps 0..3 of stage 0 (global 0..3); task 1 at steps 0..3 of stage 1 (global 4..7)
    assert_same(table, [[0.1, 0.2, 0.4, 0.6], [0.4, 0.5, 0.7, 0.9]])
    # Z = [0.25, 0.35, 0.55, 0.75]
    lca = F.learning_curve_area(HAND_ACC, HAND_STAGE, HAND_STEPS, 3, initial=initial)
    assert lca.item() == pytest.approx((0.25 + 0.35 + 0.55 + 0.75) / 4)
    assert F.learning_curve_area(HAND_ACC, HAND_STAGE, HAND_STEPS, 0, initial=initial).item() == (
        pytest.approx(0.25)
    )
    # stage 1 has only 3 steps: LCA_4 is absent
    assert math.isnan(F.learning_curve_area(HAND_ACC, HAND_STAGE, HAND_STEPS, 4, initial=initial))
    # without initial there is no evaluation at step 0 of any stage: absent
    assert math.isnan(F.learning_curve_area(HAND_ACC, HAND_STAGE, HAND_STEPS, 1))
    assert_same(F.learning_curve(HAND_ACC, HAND_STAGE, HAND_STEPS, 1), [[NAN, 0.2], [NAN, 0.5]])


def test_auc_forward_transfer_by_hand():
    initial = F.stage_start_accuracy(HAND_R, HAND_B)
    auc = F.stage_auc(HAND_ACC, HAND_STAGE, HAND_STEPS, initial=initial)
    # task 0 over [0, 4]: points 0.1, 0.2, 0.4, 0.6, 0.8 -> (0.15 + 0.3 + 0.5 + 0.7) / 4 = 0.4125
    # task 1 over [4, 7]: points 0.4, 0.5, 0.7, 0.9 -> (0.45 + 0.6 + 0.8) / 3 = 0.616667
    assert auc.tolist() == pytest.approx([0.4125, 1.85 / 3])
    # without initial: from the first evaluation, (0.3 + 0.5 + 0.7) / 3 and (0.6 + 0.8) / 2
    plain = F.stage_auc(HAND_ACC, HAND_STAGE, HAND_STEPS)
    assert plain.tolist() == pytest.approx([0.5, 0.7])
    reference = torch.tensor([0.4125, 0.5], dtype=torch.float64)
    ft = F.auc_forward_transfer_per_task(
        HAND_ACC, HAND_STAGE, HAND_STEPS, reference, initial=initial
    )
    # task 0: same as its reference -> 0; task 1: (0.616667 - 0.5) / (1 - 0.5) = 0.233333
    assert ft.tolist() == pytest.approx([0.0, (1.85 / 3 - 0.5) / 0.5])
    total = F.auc_forward_transfer(HAND_ACC, HAND_STAGE, HAND_STEPS, reference, initial=initial)
    assert total.item() == pytest.approx((1.85 / 3 - 0.5) / 0.5 / 2)


def test_forward_transfer_for_a_loss_uses_best_zero():
    # a loss curve: lower is better; the learner's area 0.2 vs the reference's 0.4 -> +0.5
    loss = torch.tensor([[0.3], [0.1]], dtype=torch.float64)
    stage, steps = torch.tensor([0, 0]), torch.tensor([0, 10])
    reference = torch.tensor([0.4], dtype=torch.float64)
    ft = F.auc_forward_transfer(loss, stage, steps, reference, best=0.0)
    assert ft.item() == pytest.approx((0.4 - 0.2) / 0.4)


# ---------------------------------------------------------------------------- absent cases
def test_absent_cases_are_nan_never_zero():
    empty_acc = torch.zeros(0, 2, dtype=torch.float64)
    empty = torch.zeros(0, dtype=torch.int64)
    assert math.isnan(F.anytime_accuracy(empty_acc, empty, empty))
    assert math.isnan(F.learning_curve_area(empty_acc, empty, empty, 2))
    assert F.learning_curve(empty_acc, empty, empty, 2).shape == (0, 3)
    assert F.stage_auc(empty_acc, empty, empty).shape == (0,)
    ref = torch.tensor([0.5, 0.5], dtype=torch.float64)
    assert math.isnan(F.auc_forward_transfer(empty_acc, empty, empty, ref))

    one = torch.tensor([[0.5, NAN]], dtype=torch.float64)
    stage, steps = torch.tensor([0]), torch.tensor([10])
    assert math.isnan(F.anytime_accuracy(one, stage, steps))  # a single point spans no steps
    assert math.isnan(F.stage_auc(one, stage, steps)[0])
    initial = torch.tensor([0.1, 0.2], dtype=torch.float64)
    # with the stage's start the single point spans [0, 10]
    assert F.stage_auc(one, stage, steps, initial=initial)[0].item() == pytest.approx(0.3)
    assert F.anytime_accuracy(one, stage, steps, initial=initial).item() == pytest.approx(0.3)

    # a seen task not evaluated (NaN) at one evaluation: A_AUC and that stage's area are absent
    gap = HAND_ACC.clone()
    gap[5, 0] = NAN
    assert math.isnan(F.anytime_accuracy(gap, HAND_STAGE, HAND_STEPS))
    gap[5, 1] = NAN
    auc = F.stage_auc(gap, HAND_STAGE, HAND_STEPS)
    assert not math.isnan(auc[0]) and math.isnan(auc[1])
    assert math.isnan(F.auc_forward_transfer(gap, HAND_STAGE, HAND_STEPS, ref))

    # the reference already at the best score: FT undefined for that task
    perfect = torch.tensor([1.0, 0.5], dtype=torch.float64)
    ft = F.auc_forward_transfer_per_task(HAND_ACC, HAND_STAGE, HAND_STEPS, perfect)
    assert math.isnan(ft[0]) and not math.isnan(ft[1])
    # no reference for a task (NaN): absent too
    missing = torch.tensor([0.3, NAN], dtype=torch.float64)
    assert math.isnan(F.auc_forward_transfer(HAND_ACC, HAND_STAGE, HAND_STEPS, missing))


def test_lca_absent_when_evaluations_are_sparse():
    # eval_every_n_steps = 2: steps 1, 3, ... of a stage are missing
    acc, stage, steps = callback_curves([6, 6], every=2, num_tasks=2, rng=random.Random(0))
    initial = torch.tensor([0.1, 0.1], dtype=torch.float64)
    assert math.isnan(F.learning_curve_area(acc, stage, steps, 2, initial=initial))
    assert not math.isnan(F.learning_curve_area(acc, stage, steps, 0, initial=initial))


# ------------------------------------------------------------------ random curves vs loops
@pytest.mark.parametrize("case", range(150))
def test_random_curves_match_the_loops(case: int):
    rng = random.Random(case)
    T = rng.randint(1, 4)
    S = rng.randint(1, T)
    lengths = [rng.randint(0, 6) for _ in range(S)]
    every = rng.choice([1, 1, 2, 3])
    nan_rate = rng.choice([0.0, 0.0, 0.05])
    acc, stage, steps = callback_curves(lengths, every, T, rng, nan_rate)
    initial = random_row(T, rng, 0.0) if rng.random() < 0.6 else None
    beta = rng.randint(0, 4)
    reference = torch.tensor([rng.choice([0.2, 0.5, 1.0]) for _ in range(T)], dtype=torch.float64)
    best = rng.choice([1.0, 0.0])
    a, g, s = as_lists(acc, stage, steps)
    init = initial.tolist() if initial is not None else None
    ref = reference.tolist()

    assert same(F.anytime_accuracy(acc, stage, steps, initial=initial), ref_anytime(a, g, s, init))
    assert_same(
        F.learning_curve(acc, stage, steps, beta, initial=initial),
        ref_learning_curve(a, g, s, beta, init),
    )
    assert same(
        F.learning_curve_area(acc, stage, steps, beta, initial=initial),
        ref_lca(a, g, s, beta, init),
    )
    assert_same(F.stage_auc(acc, stage, steps, initial=initial), ref_stage_auc(a, g, s, init))
    per_task = ref_ft_per_task(a, g, s, ref, init, best)
    assert_same(
        F.auc_forward_transfer_per_task(acc, stage, steps, reference, initial=initial, best=best),
        per_task,
    )
    assert same(
        F.auc_forward_transfer(acc, stage, steps, reference, initial=initial, best=best),
        ref_mean(per_task),
    )


def test_dense_curves_give_every_lca():
    # eval_every_n_steps = 1 and stages of >= beta steps: LCA_beta is present for every beta
    rng = random.Random(7)
    acc, stage, steps = callback_curves([5, 7, 6], every=1, num_tasks=3, rng=rng)
    initial = random_row(3, rng, 0.0)
    for beta in range(6):
        value = F.learning_curve_area(acc, stage, steps, beta, initial=initial)
        assert same(value, ref_lca(*as_lists(acc, stage, steps), beta, initial.tolist()))
        assert not math.isnan(value)
    assert math.isnan(F.learning_curve_area(acc, stage, steps, 6, initial=initial))


def test_float32_and_float_steps():
    acc = HAND_ACC.float()
    initial = F.stage_start_accuracy(HAND_R.float(), HAND_B.float())
    for steps in (HAND_STEPS, HAND_STEPS.double()):
        lca = F.learning_curve_area(acc, HAND_STAGE, steps, 3, initial=initial)
        assert lca.dtype == torch.float32
        assert lca.item() == pytest.approx(0.475, rel=1e-6)
        assert F.stage_auc(acc, HAND_STAGE, steps, initial=initial).dtype == torch.float32
    # a float step between whole steps stands for no step b
    half = HAND_STEPS.double()
    half[4] = 4.5
    table = F.learning_curve(HAND_ACC, HAND_STAGE, half, 1)
    assert math.isnan(table[1, 1])


def test_inputs_are_not_modified():
    acc, stage, steps = HAND_ACC.clone(), HAND_STAGE.clone(), HAND_STEPS.clone()
    initial = F.stage_start_accuracy(HAND_R, HAND_B)
    kept = initial.clone()
    F.learning_curve(acc, stage, steps, 2, initial=initial)
    F.stage_auc(acc, stage, steps, initial=initial)
    F.anytime_accuracy(acc, stage, steps, initial=initial)
    assert torch.equal(initial, kept)
    assert torch.equal(acc.isnan(), HAND_ACC.isnan())
    assert torch.equal(acc.nan_to_num(), HAND_ACC.nan_to_num())
    assert torch.equal(stage, HAND_STAGE) and torch.equal(steps, HAND_STEPS)


# ---------------------------------------------------------------------------- validation
def test_validation_names_the_problem():
    with pytest.raises(ValueError, match="beta must be a non-negative integer"):
        F.learning_curve_area(HAND_ACC, HAND_STAGE, HAND_STEPS, -1)
    with pytest.raises(ValueError, match="beta must be a non-negative integer"):
        F.learning_curve(HAND_ACC, HAND_STAGE, HAND_STEPS, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"initial must have shape \[T\] = \[2\]"):
        F.anytime_accuracy(HAND_ACC, HAND_STAGE, HAND_STEPS, initial=torch.zeros(3).double())
    with pytest.raises(TypeError, match="initial dtype"):
        F.stage_auc(HAND_ACC, HAND_STAGE, HAND_STEPS, initial=torch.zeros(2))
    with pytest.raises(ValueError, match="stage 1 has no evaluation"):
        F.anytime_accuracy(HAND_ACC, torch.tensor([0, 0, 0, 0, 2, 2, 2]), HAND_STEPS)
    with pytest.raises(ValueError, match="steps must be non-decreasing"):
        F.stage_auc(HAND_ACC, HAND_STAGE, torch.tensor([1, 2, 3, 4, 5, 7, 6]))
    with pytest.raises(ValueError, match="reference_auc must have shape"):
        F.auc_forward_transfer(HAND_ACC, HAND_STAGE, HAND_STEPS, torch.zeros(1).double())
    with pytest.raises(ValueError, match="best must be a finite real number"):
        F.auc_forward_transfer(
            HAND_ACC, HAND_STAGE, HAND_STEPS, torch.zeros(2).double(), best=math.inf
        )
    with pytest.raises(ValueError, match="scores has 3 stages"):
        F.stage_start_accuracy(torch.zeros(3, 2).double(), HAND_B)
    with pytest.raises(ValueError, match="baseline must have shape"):
        F.stage_start_accuracy(HAND_R, torch.zeros(3).double())

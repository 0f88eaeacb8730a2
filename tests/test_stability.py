"""Stability-gap metrics (De Lange et al., 2023): values by hand and a plain-loop reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from continual_eval import functional as F

NAN = float("nan")

# 3 tasks; stage 0 has 2 evaluations, stage 1 four, stage 2 three; the last of each is the boundary.
ACC = torch.tensor(
    [
        [0.5, NAN, NAN],
        [0.9, 0.1, NAN],  # end of stage 0: task 0 learned to 0.9
        [0.4, 0.5, NAN],  # task 1 starts: task 0 collapses to 0.4 (the stability gap)
        [0.7, 0.8, NAN],
        [0.85, 0.9, NAN],  # task 0 back within 0.05 of 0.9
        [0.88, 0.95, 0.2],  # end of stage 1
        [0.6, 0.5, 0.7],
        [0.7, 0.96, 0.8],
        [0.65, 0.9, 0.9],  # end of stage 2
    ],
    dtype=torch.float64,
)
STAGE = torch.tensor([0, 0, 1, 1, 1, 1, 2, 2, 2])
STEPS = torch.tensor([5, 10, 12, 14, 16, 20, 22, 24, 30])


def test_min_acc_and_wc_acc_by_hand():
    # min-ACC[1]: task 0's worst during stage 1 = 0.4.
    # min-ACC[2]: mean(task 0 worst over stages 1-2 = 0.4, task 1 worst during stage 2 = 0.5).
    min_acc = F.min_accuracy(ACC, STAGE)
    assert math.isnan(min_acc[0].item())
    assert min_acc[1:].tolist() == pytest.approx([0.4, 0.45])
    # WC-ACC[k] = acc(current)/(k+1) + (1 - 1/(k+1)) min-ACC[k]
    wc = F.worst_case_accuracy(ACC, STAGE)
    assert wc.tolist() == pytest.approx([0.9, 0.95 / 2 + 0.4 / 2, 0.9 / 3 + 2 / 3 * 0.45])


def test_stability_gap_by_hand():
    gap = F.stability_gap(ACC, STAGE, STEPS, tolerance=0.05)
    assert gap["boundary"].tolist() == pytest.approx([0.9, 0.95])
    assert gap["minimum"].tolist() == pytest.approx([0.4, 0.5])
    assert gap["depth"].tolist() == pytest.approx([0.5, 0.45])
    # task 0: boundary at step 10, back to >= 0.85 at step 16; task 1: boundary 20, 0.96 at 24.
    assert gap["recovery_steps"].tolist() == [6.0, 4.0]
    strict = F.stability_gap(ACC, STAGE, STEPS)  # tolerance 0: task 0 never regains 0.9
    assert math.isnan(strict["recovery_steps"][0].item())
    assert strict["recovery_steps"][1].item() == 4.0


def test_no_drop_means_zero_recovery_and_single_stage_is_empty():
    acc = torch.tensor([[0.8, NAN], [0.9, 0.2], [0.95, 0.5], [0.97, 0.9]], dtype=torch.float64)
    stage = torch.tensor([0, 0, 1, 1])
    gap = F.stability_gap(acc, stage, torch.tensor([1, 2, 3, 4]))
    assert gap["depth"].tolist() == pytest.approx([0.9 - 0.95])
    assert gap["recovery_steps"].tolist() == [0.0]
    single = F.stability_gap(acc[:2], stage[:2], torch.tensor([1, 2]))
    assert all(v.numel() == 0 for v in single.values())


def test_bad_curves_are_named():
    with pytest.raises(ValueError, match="non-decreasing"):
        F.min_accuracy(ACC, STAGE.flip(0))
    with pytest.raises(ValueError, match=r"integer \[N\] = \[9\]"):
        F.min_accuracy(ACC, STAGE[:3])
    with pytest.raises(ValueError, match="no task column"):
        F.min_accuracy(ACC[:, :2], STAGE)
    with pytest.raises(ValueError, match="steps must"):
        F.stability_gap(ACC, STAGE, STEPS.flip(0))


# ---------------------------------------------------------------- plain-loop reference
def reference(acc: list[list[float]], stage: list[int], steps: list[int], tol: float):
    S = max(stage) + 1
    last = [max(n for n in range(len(stage)) if stage[n] == k) for k in range(S)]
    min_acc, wc = [], []
    for k in range(S):
        worst = []
        for i in range(k):
            vals = [
                acc[n][i] for n in range(len(stage)) if i < stage[n] <= k and acc[n][i] == acc[n][i]
            ]
            worst.append(min(vals))
        min_acc.append(sum(worst) / k if k else NAN)
        wc.append(acc[last[k]][k] / (k + 1) + (1 - 1 / (k + 1)) * (min_acc[k] if k else 0.0))
    depth, recovery = [], []
    for j in range(S - 1):
        boundary = acc[last[j]][j]
        during = [n for n in range(len(stage)) if stage[n] == j + 1]
        low_n = min(during, key=lambda n: (acc[n][j], n))
        depth.append(boundary - acc[low_n][j])
        if depth[-1] <= tol:
            recovery.append(0.0)
            continue
        back = [n for n in during if n >= low_n and acc[n][j] >= boundary - tol]
        recovery.append(float(steps[back[0]] - steps[last[j]]) if back else NAN)
    return min_acc, wc, depth, recovery


@st.composite
def curves(draw):
    T = draw(st.integers(1, 5))
    counts = [draw(st.integers(1, 5)) for _ in range(T)]
    unit = st.floats(0.0, 1.0, allow_nan=False)
    acc, stage = [], []
    for k, count in enumerate(counts):
        for _ in range(count):
            acc.append([draw(unit) if j <= k + 1 else NAN for j in range(T)])
            stage.append(k)
    gaps = [draw(st.integers(1, 4)) for _ in stage]
    steps = [sum(gaps[: n + 1]) for n in range(len(stage))]
    return acc, stage, steps, draw(st.sampled_from([0.0, 0.05, 0.2]))


@settings(max_examples=150, deadline=None)
@given(curves())
def test_matches_plain_loop_reference(data):
    acc, stage, steps, tol = data
    A = torch.tensor(acc, dtype=torch.float64)
    s, n = torch.tensor(stage), torch.tensor(steps)
    min_acc, wc, depth, recovery = reference(acc, stage, steps, tol)
    assert F.min_accuracy(A, s).tolist() == pytest.approx(min_acc, nan_ok=True)
    assert F.worst_case_accuracy(A, s).tolist() == pytest.approx(wc)
    gap = F.stability_gap(A, s, n, tolerance=tol)
    assert gap["depth"].tolist() == pytest.approx(depth)
    assert gap["recovery_steps"].tolist() == pytest.approx(recovery, nan_ok=True)


def test_wc_acc_stays_undefined_where_min_acc_is():
    # stage 1 never evaluates task 0: min-ACC[1] is undefined, so WC-ACC[1] is too (not 0.8 / 2)
    acc = torch.tensor([[0.9, NAN], [NAN, 0.8]], dtype=torch.float64)
    wc = F.worst_case_accuracy(acc, torch.tensor([0, 1]))
    assert wc[0].item() == pytest.approx(0.9)
    assert math.isnan(wc[1].item())


# ---------------------------------------------------------------- stage sequences (issue 9, item 8)
def test_a_missing_stage_is_named():
    # stage 1 never evaluated: every boundary after it would be read from the wrong evaluation
    acc = ACC[[0, 1, 6, 7, 8]]
    with pytest.raises(
        ValueError, match=r"stage 1 has no evaluation: stage\[2\] = 2 follows stage"
    ):
        F.min_accuracy(acc, torch.tensor([0, 0, 2, 2, 2]))
    with pytest.raises(ValueError, match=r"stage 0 has no evaluation: stage\[0\] = 1"):
        F.worst_case_accuracy(ACC[2:], STAGE[2:])
    with pytest.raises(ValueError, match=r"stage 1 has no evaluation"):
        F.stability_gap(acc, torch.tensor([0, 0, 2, 2, 2]), torch.arange(5))


def test_bad_sequences_name_the_position():
    stage = STAGE.clone()
    stage[4] = 0
    with pytest.raises(ValueError, match=r"stage\[4\] = 0 is less than stage\[3\] = 1"):
        F.min_accuracy(ACC, stage)
    with pytest.raises(ValueError, match=r"stage\[0\] = -1 is negative"):
        F.min_accuracy(ACC, STAGE - 1)
    steps = STEPS.clone()
    steps[6] = 11
    with pytest.raises(ValueError, match=r"steps\[6\] = 11 is less than steps\[5\] = 20"):
        F.stability_gap(ACC, STAGE, steps)
    with pytest.raises(ValueError, match=r"steps must have shape \[N\] = \[9\].*got \(8,\)"):
        F.stability_gap(ACC, STAGE, STEPS[:8])
    float_steps = STEPS.double()
    float_steps[3] = NAN
    with pytest.raises(ValueError, match=r"steps\[3\] is nan"):
        F.stability_gap(ACC, STAGE, float_steps)


def reference_with_gaps(acc: list[list[float]], stage: list[int], steps: list[int], tol: float):
    """As :func:`reference`, for curves where some stages have no evaluation: what a missing stage
    would supply (its boundary, its minima) is undefined (NaN); everything else is read as is."""
    S = max(stage) + 1
    rows = {k: [n for n in range(len(stage)) if stage[n] == k] for k in range(S)}
    last = {k: rows[k][-1] for k in range(S) if rows[k]}

    def finite(x: float) -> bool:
        return x == x

    min_acc, wc = [], []
    for k in range(S):
        if k not in last:
            min_acc.append(NAN)
            wc.append(NAN)
            continue
        worst = []
        for i in range(k):
            vals = [acc[n][i] for n in range(len(stage)) if i < stage[n] <= k and finite(acc[n][i])]
            worst.append(min(vals) if vals else NAN)
        min_acc.append(sum(worst) / k if k else NAN)
        current = acc[last[k]][k]
        wc.append(current if k == 0 else current / (k + 1) + (1 - 1 / (k + 1)) * min_acc[k])
    boundary, minimum, depth, recovery = [], [], [], []
    for j in range(S - 1):
        boundary.append(acc[last[j]][j] if j in last else NAN)
        during = [n for n in rows[j + 1] if finite(acc[n][j])]
        low_n = min(during, key=lambda n: (acc[n][j], n)) if during else None
        minimum.append(acc[low_n][j] if during else NAN)
        depth.append(boundary[-1] - minimum[-1])
        if not finite(depth[-1]):
            recovery.append(NAN)
            continue
        if depth[-1] <= tol:
            recovery.append(0.0)
            continue
        back = [n for n in during if n >= low_n and acc[n][j] >= boundary[-1] - tol]
        recovery.append(float(steps[back[0]] - steps[last[j]]) if back else NAN)
    return min_acc, wc, boundary, minimum, depth, recovery


@st.composite
def curves_with_gaps(draw):
    T = draw(st.integers(2, 5))
    counts = [draw(st.integers(0, 3)) for _ in range(T - 1)] + [draw(st.integers(1, 3))]
    unit = st.floats(0.0, 1.0, allow_nan=False)
    acc, stage = [], []
    for k, count in enumerate(counts):
        for _ in range(count):
            acc.append([draw(unit) if j <= k + 1 else NAN for j in range(T)])
            stage.append(k)
    gaps = [draw(st.integers(1, 4)) for _ in stage]
    steps = [sum(gaps[: n + 1]) for n in range(len(stage))]
    return acc, stage, steps, draw(st.sampled_from([0.0, 0.05]))


@settings(max_examples=150, deadline=None)
@given(curves_with_gaps())
def test_unvalidated_missing_stages_are_undefined_never_misread(data):
    acc, stage, steps, tol = data
    A = torch.tensor(acc, dtype=torch.float64)
    s, n = torch.tensor(stage), torch.tensor(steps)
    min_acc, wc, boundary, minimum, depth, recovery = reference_with_gaps(acc, stage, steps, tol)
    assert F.min_accuracy(A, s, validate=False).tolist() == pytest.approx(min_acc, nan_ok=True)
    assert F.worst_case_accuracy(A, s, validate=False).tolist() == pytest.approx(wc, nan_ok=True)
    gap = F.stability_gap(A, s, n, tolerance=tol, validate=False)
    assert gap["boundary"].tolist() == pytest.approx(boundary, nan_ok=True)
    assert gap["minimum"].tolist() == pytest.approx(minimum, nan_ok=True)
    assert gap["depth"].tolist() == pytest.approx(depth, nan_ok=True)
    assert gap["recovery_steps"].tolist() == pytest.approx(recovery, nan_ok=True)
    if len(set(stage)) < max(stage) + 1:  # the validated path refuses what it would misread
        with pytest.raises(ValueError, match="has no evaluation"):
            F.stability_gap(A, s, n, tolerance=tol)


def test_boundary_indices_mark_missing_stages():
    assert F.boundary_indices(torch.tensor([0, 0, 2, 2, 3])).tolist() == [1, -1, 3, 4]

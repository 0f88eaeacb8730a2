"""The pure functions of continual_eval.functional.online against plain Python loops."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from online_helpers import blind_mode

from continual_eval.functional.online import (
    area_under_curve,
    binned_counts,
    cumulative_accuracy,
    held_out_curves,
    label_delay_accuracy,
    last_label,
    lookahead_counts,
    near_future_accuracy,
    prequential_accuracy,
    recent_mode,
    segment_index,
    windowed_accuracy,
)


@pytest.mark.parametrize("window", [1, 2, 5, 17])
def test_recent_mode_equals_a_plain_counter(window):
    rng = random.Random(window)
    labels = [rng.choice([0, 1, 2, 3, 3, 5]) for _ in range(120)]
    ends = [rng.randint(0, len(labels)) for _ in range(60)] + [0, len(labels)]
    got = recent_mode(torch.tensor(labels), torch.tensor(ends), window, num_classes=6)
    expected = [blind_mode(labels[:e], window) for e in ends]
    assert got.tolist() == expected


def test_recent_mode_over_everything_continues_from_earlier_counts():
    rng = random.Random(3)
    stream = [rng.choice([0, 1, 1, 2]) for _ in range(90)]
    split = 37  # the labels before `split` are known only by their counts and last positions
    before, after = stream[:split], stream[split:]
    counts = torch.bincount(torch.tensor(before), minlength=3)
    last = torch.full((3,), -(2**62))
    for i, label in enumerate(before):
        last[label] = i - split
    ends = list(range(len(after) + 1))
    got = recent_mode(
        torch.tensor(after),
        torch.tensor(ends),
        None,
        num_classes=3,
        counts_before=counts,
        last_seen_before=last,
    )
    assert got.tolist() == [blind_mode(stream[: split + e], None) for e in ends]


def test_recent_mode_hand_made():
    labels = torch.tensor([2, 2, 0, 0, 1])
    ends = torch.tensor([0, 1, 2, 3, 4, 5])
    # windows of 3: [], [2], [2,2], [2,2,0], [2,0,0], [0,0,1]
    assert recent_mode(labels, ends, 3, num_classes=3).tolist() == [-1, 2, 2, 2, 0, 0]
    # window 2: ..., [2,0] tie -> 0 (more recent), [0,0], [0,1] tie -> 1
    assert recent_mode(labels, ends, 2, num_classes=3).tolist() == [-1, 2, 2, 0, 0, 1]
    assert last_label(labels, ends).tolist() == [-1, 2, 2, 0, 0, 1]
    assert last_label(labels, torch.tensor([0]), before=4).tolist() == [4]


def test_blind_inputs_are_checked():
    with pytest.raises(ValueError, match="ends must lie in"):
        recent_mode(torch.tensor([0, 1]), torch.tensor([3]), 2, num_classes=2)
    with pytest.raises(ValueError, match="not below num_classes"):
        recent_mode(torch.tensor([0, 4]), torch.tensor([2]), 2, num_classes=3)
    with pytest.raises(ValueError, match="window must be"):
        recent_mode(torch.tensor([0]), torch.tensor([1]), 0, num_classes=1)
    with pytest.raises(ValueError, match="labels must be an integer"):
        last_label(torch.tensor([0.5]), torch.tensor([1]))


def _random_table(seed: int, T: int = 9, M: int = 4):
    g = torch.Generator().manual_seed(seed)
    total = torch.randint(1, 6, (T, M), generator=g)
    for k in range(T):
        for m in range(M):
            if k + m >= T:
                total[k, m] = 0
    correct = (torch.rand(T, M, generator=g) * (total + 1)).floor().long().clamp(max=total)
    return correct, total


@pytest.mark.parametrize("seed", [0, 1])
def test_lookahead_scores_equal_plain_loops(seed):
    correct, total = _random_table(seed)
    T, M = correct.shape
    assert prequential_accuracy(correct, total).item() == pytest.approx(
        sum(int(correct[k, 0]) for k in range(T)) / sum(int(total[k, 0]) for k in range(T))
    )
    for d in range(M):
        num = sum(int(correct[k, d]) for k in range(T) if k + d < T)
        den = sum(int(total[k, d]) for k in range(T) if k + d < T)
        assert near_future_accuracy(correct, total, d).item() == pytest.approx(num / den)
        # label delay: stream step t scored by the model of step max(0, t - d)
        num = den = 0
        for t in range(T):
            k = max(0, t - d)
            num += int(correct[k, t - k])
            den += int(total[k, t - k])
        assert label_delay_accuracy(correct, total, d).item() == pytest.approx(num / den)
    c, n = lookahead_counts(correct, total, 2, label_delay=True)
    assert int(c[0]) == int(correct[0, :3].sum()) and int(n[1]) == int(total[1, 2])


def test_lookahead_table_is_checked():
    with pytest.raises(ValueError, match=r"cell \[0, 1\]: correct = 3 with total = 2"):
        prequential_accuracy(torch.tensor([[1, 3]]), torch.tensor([[2, 2]]))
    with pytest.raises(ValueError, match="reads column 2"):
        near_future_accuracy(torch.tensor([[1, 1]]), torch.tensor([[2, 2]]), 2)
    with pytest.raises(ValueError, match="delay must be"):
        near_future_accuracy(torch.tensor([[1]]), torch.tensor([[2]]), -1)
    nan = near_future_accuracy(torch.tensor([[1, 0]]), torch.tensor([[2, 0]]), 1)
    assert math.isnan(nan.item())


def test_aggregation_equals_plain_loops():
    rng = random.Random(5)
    total = [rng.randint(0, 6) for _ in range(30)]
    correct = [rng.randint(0, t) for t in total]
    c, n = torch.tensor(correct), torch.tensor(total)
    cum = cumulative_accuracy(c, n)
    for i in range(30):
        den = sum(total[: i + 1])
        expected = sum(correct[: i + 1]) / den if den else math.nan
        assert (math.isnan(expected) and math.isnan(cum[i])) or cum[i] == pytest.approx(expected)
    win = windowed_accuracy(c, n, 4)
    for i in range(30):
        lo = max(0, i - 3)
        den = sum(total[lo : i + 1])
        expected = sum(correct[lo : i + 1]) / den if den else math.nan
        assert (math.isnan(expected) and math.isnan(win[i])) or win[i] == pytest.approx(expected)
    positions = [rng.randint(-5, 130) for _ in range(30)]
    edges = [0, 10, 55, 100, 120]
    bc, bn = binned_counts(torch.tensor(positions), c, n, torch.tensor(edges))
    for b in range(4):
        inside = [i for i, p in enumerate(positions) if edges[b] <= p < edges[b + 1]]
        assert int(bc[b]) == sum(correct[i] for i in inside)
        assert int(bn[b]) == sum(total[i] for i in inside)


def test_held_out_curves_equal_plain_loops():
    g = torch.Generator().manual_seed(2)
    E, J = 8, 3
    A = torch.rand(E, J, generator=g, dtype=torch.float64)
    positions = [0, 5, 10, 30, 31, 60, 61, 90]
    starts = [0, 30, 60]
    seg = segment_index(torch.tensor(positions), torch.tensor(starts))
    expected_seg = [sum(s < p for s in starts) - 1 for p in positions]
    assert seg.tolist() == expected_seg
    curves = held_out_curves(A, seg)

    def mean(values):
        return sum(values) / len(values) if values else math.nan

    for e in range(E):
        s = expected_seg[e]
        expected = {
            "seen": mean([float(A[e, j]) for j in range(J) if j <= s]),
            "past": mean([float(A[e, j]) for j in range(J) if j < s]),
            "current": mean([float(A[e, j]) for j in range(J) if j == s]),
            "future": mean([float(A[e, j]) for j in range(J) if j > s]),
            "forgetting": mean(
                [
                    max(float(A[f, j]) for f in range(e + 1) if expected_seg[f] >= j)
                    - float(A[e, j])
                    for j in range(J)
                    if j < s
                ]
            ),
        }
        for name, value in expected.items():
            got = float(curves[name][e])
            assert (math.isnan(value) and math.isnan(got)) or got == pytest.approx(value), name


def test_area_under_curve_is_the_trapezoid_mean():
    values = [0.2, float("nan"), 0.6, 0.5]
    positions = [0, 10, 30, 70]
    kept = [(0, 0.2), (30, 0.6), (70, 0.5)]
    area = sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in itertools.pairwise(kept))
    got = area_under_curve(torch.tensor(values), torch.tensor(positions))
    assert got.item() == pytest.approx(area / 70)
    assert math.isnan(area_under_curve(torch.tensor([0.3]), torch.tensor([4])).item())


def test_segments_are_checked():
    with pytest.raises(ValueError, match="beginning at 0"):
        segment_index(torch.tensor([1]), torch.tensor([5, 10]))
    with pytest.raises(ValueError, match="non-decreasing"):
        held_out_curves(torch.zeros(2, 1, dtype=torch.float64), torch.tensor([1, 0]))

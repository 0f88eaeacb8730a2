"""Item-level forgetting (continual_eval.functional.items) on a hand-made toy, and against a
plain loop over tasks, stages and items on random records."""

from __future__ import annotations

import math

import pytest
import torch

from continual_eval.functional import intervals as iv
from continual_eval.functional import items as it

NAN = math.nan


def _bools(rows: list[str]) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in row] for row in rows])


# task 0: 5 items after stages 0, 1, 2; task 1: 3 items; task 2: 2 items
TOY = [
    _bools(["11110", "01111", "00111"]),
    _bools(["000", "110", "011"]),
    _bools(["10", "10", "11"]),
]
TOY_BASELINE = [_bools(["00001"])[0], _bools(["100"])[0], _bools(["01"])[0]]


def test_hand_made_toy():
    moves = it.item_transitions(TOY, baseline=TOY_BASELINE)
    # task 0, by hand. baseline -> stage 0: 00001 -> 11110: 1 lost (item 4), 4 gained.
    # stage 0 -> 1: 11110 -> 01111: item 0 lost, item 4 gained. 1 -> 2: item 1 lost.
    assert moves.right_to_wrong[:, 0].tolist() == [1.0, 1.0, 1.0]
    assert moves.wrong_to_right[:, 0].tolist() == [4.0, 1.0, 0.0]
    # against the diagonal R[0, 0] = 11110: stage 1 loses item 0, gains item 4; stage 2 loses
    # items 0 and 1, gains item 4
    assert moves.forgotten[:, 0].tolist() == [0.0, 1.0, 2.0]
    assert moves.recovered[:, 0].tolist() == [0.0, 1.0, 1.0]
    assert moves.forgotten_once[:, 0].tolist() == [0.0, 1.0, 2.0]  # items 0, then 0 and 1
    # task 1: R[0, 1] = 000 (before training on it) -> R[1, 1] = 110 -> R[2, 1] = 011
    r2w, w2r = moves.right_to_wrong[:, 1].tolist(), moves.wrong_to_right[:, 1].tolist()
    assert math.isnan(r2w[0]) and r2w[1:] == [0.0, 1.0]
    assert math.isnan(w2r[0]) and w2r[1:] == [2.0, 1.0]
    assert moves.forgotten[1:, 1].tolist() == [0.0, 1.0]  # item 0
    assert moves.recovered[1:, 1].tolist() == [0.0, 1.0]  # item 2
    assert moves.forgotten_once[1:, 1].tolist() == [0.0, 1.0]
    assert math.isnan(moves.forgotten[0, 1])  # task 1 not learned yet at stage 0
    # task 2: learned at stage 2 (10 -> 11): nothing forgotten
    assert moves.wrong_to_right[2, 2].item() == 1.0 and moves.forgotten_once[2, 2].item() == 0.0
    assert moves.num_items.tolist() == [5.0, 3.0, 2.0]
    assert moves.forgotten_once_fraction.tolist() == [2 / 5, 1 / 3, 0.0]
    # without a baseline, stage 0 has no previous evaluation
    plain = it.item_transitions(TOY)
    assert math.isnan(plain.right_to_wrong[0, 0]) and plain.right_to_wrong[1, 0].item() == 1.0
    assert it.forgetting_events(TOY)[0].tolist() == [1, 1, 0, 0, 0]
    assert it.forgetting_events(TOY)[1].tolist() == [1, 0, 0]


def _loop(items, baseline):
    T = len(items)
    out = {k: [[NAN] * T for _ in range(T)] for k in ("r2w", "w2r", "lost", "back", "once")}
    for j, task in enumerate(items):
        v = task.tolist()
        n = len(v[0])
        for i in range(j, T):
            prev = (baseline[j].tolist() if baseline is not None else None) if i == 0 else v[i - 1]
            if prev is not None:
                out["r2w"][i][j] = sum(prev[k] and not v[i][k] for k in range(n))
                out["w2r"][i][j] = sum(not prev[k] and v[i][k] for k in range(n))
            out["lost"][i][j] = sum(v[j][k] and not v[i][k] for k in range(n))
            out["back"][i][j] = sum(not v[j][k] and v[i][k] for k in range(n))
            out["once"][i][j] = sum(
                any(v[s - 1][k] and not v[s][k] for s in range(j + 1, i + 1)) for k in range(n)
            )
    return out


@pytest.mark.parametrize("with_baseline", [True, False])
def test_random_records_against_a_plain_loop(with_baseline: bool):
    g = torch.Generator().manual_seed(4)
    T, sizes = 5, [9, 17, 1, 64, 70]
    items = [torch.rand(T, n, generator=g) < 0.6 for n in sizes]
    base = [torch.rand(n, generator=g) < 0.3 for n in sizes] if with_baseline else None
    moves = it.item_transitions(items, baseline=base)
    want = _loop(items, base)
    for name, key in [
        ("right_to_wrong", "r2w"),
        ("wrong_to_right", "w2r"),
        ("forgotten", "lost"),
        ("recovered", "back"),
        ("forgotten_once", "once"),
    ]:
        got = getattr(moves, name)
        expected = torch.tensor(want[key], dtype=torch.float64)
        assert torch.equal(got.isnan(), expected.isnan()), name
        assert torch.equal(got.nan_to_num(-1), expected.nan_to_num(-1)), name
    # the accuracy change since the diagonal is exactly (recovered - forgotten) / n
    for j, task in enumerate(items):
        acc = task.double().mean(dim=1)
        change = (moves.recovered[j:, j] - moves.forgotten[j:, j]) / sizes[j]
        assert torch.allclose(change, acc[j:] - acc[j], rtol=0, atol=1e-15)
    # packed bits give the same
    packed = it.item_transitions(
        [iv.pack_bits(x) for x in items],
        baseline=None if base is None else [iv.pack_bits(b) for b in base],
    )
    assert torch.equal(packed.forgotten_once.nan_to_num(-1), moves.forgotten_once.nan_to_num(-1))
    events = it.forgetting_events(items)
    assert [int((e > 0).sum()) for e in events] == moves.forgotten_once[-1].int().tolist()


def test_bad_records_are_refused_by_name():
    with pytest.raises(TypeError, match=r"items\[1\] must be a bool tensor .* got torch.float32"):
        it.item_transitions([TOY[0], TOY[1].float(), TOY[2]])
    with pytest.raises(ValueError, match=r"items\[2\] must have shape \[T, n_j\] with T = 3"):
        it.item_transitions([TOY[0], TOY[1], TOY[2][:2]])
    with pytest.raises(ValueError, match=r"baseline\[0\] must be a bool \[n_j\] = \[5\]"):
        it.item_transitions(TOY, baseline=[TOY_BASELINE[1], *TOY_BASELINE[1:]])
    with pytest.raises(ValueError, match="baseline must be a sequence of 3"):
        it.item_transitions(TOY, baseline=TOY_BASELINE[:2])
    with pytest.raises(TypeError, match="non-empty sequence"):
        it.item_transitions([])

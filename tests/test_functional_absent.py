"""Absent cells (``eval_old_tasks_every``): an old task's cell off the final row, ``R[i, j]`` with
``j < i < T-1``, may be NaN. Every metric of the functional layer is then NaN exactly when it reads
an absent cell, and otherwise equal to its value on the full matrix, checked per metric against a
plain-Python definition that records the cells it reads (written from the README's formulas, not
from the code)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

import continual_eval.functional as F
from continual_eval import ContinualMetrics

NAN = float("nan")
T = 6
#: stages 1..T-2 whose old tasks were skipped (stage 0 has none, stage T-1 is the final row)
SKIPPED = (2, 4)


class Cells:
    """R, b and ref read through ``r(i, j)``/``b(j)``/``ref(j)``, remembering whether an absent
    cell was read."""

    def __init__(self, R: list[list[float]], b: list[float], ref: list[float], hib: bool) -> None:
        self.R, self.bv, self.refv, self.hib, self.absent = R, b, ref, hib, False

    def r(self, i: int, j: int) -> float:
        value = self.R[i][j]
        self.absent |= math.isnan(value)
        return value

    def b(self, j: int) -> float:
        return self.bv[j]

    def ref(self, j: int) -> float:
        return self.refv[j]

    def gain(self, value: float, reference: float) -> float:
        return value - reference if self.hib else reference - value

    def best(self, values: list[float]) -> float:
        return max(values) if self.hib else min(values)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


# plain definitions of the metrics of the prefix R[:s+1, :s+1] (the value after stage s)
def acc(c: Cells, s: int) -> float:
    return _mean([c.r(s, j) for j in range(s + 1)])


def bwt_task(c: Cells, s: int, j: int) -> float:
    return c.gain(c.r(s, j), c.r(j, j))


def fwt_task(c: Cells, s: int, j: int) -> float:
    return c.gain(c.r(j - 1, j), c.b(j))


def forgetting_task(c: Cells, s: int, j: int, convention: str) -> float:
    last = s if convention == "peak" else s - 1
    peak = c.best([c.r(i, j) for i in range(j, last + 1)])
    return peak - c.r(s, j) if c.hib else c.r(s, j) - peak


def learning_accuracy(c: Cells, s: int) -> float:
    return _mean([c.r(j, j) for j in range(s + 1)])


def aia(c: Cells, s: int) -> float:
    return _mean([acc(c, k) for k in range(s + 1)])


def intransigence_task(c: Cells, s: int, j: int) -> float:
    return c.gain(c.ref(j), c.r(j, j))


def plain(c: Cells, fn: Callable[[Cells], float]) -> float:
    """``fn``'s value, NaN when it read an absent cell."""
    c.absent = False
    value = fn(c)
    return NAN if c.absent else value


def matrices(hib: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    R = torch.rand(T, T, generator=g, dtype=torch.float64)
    b, ref = torch.rand(T, generator=g, dtype=torch.float64), torch.rand(T, generator=g)
    absent = R.clone()
    for i in SKIPPED:
        absent[i, :i] = NAN
    if not hib:  # a loss: the same shapes, negated
        return -R, -absent, -b, -ref.double()
    return R, absent, b, ref.double()


def _assert_same(got: torch.Tensor, want: list[float], full: torch.Tensor) -> None:
    got_list = got.reshape(-1).tolist()
    assert len(got_list) == len(want)
    for value, expected, whole in zip(got_list, want, full.reshape(-1).tolist(), strict=True):
        if math.isnan(expected):
            assert math.isnan(value)  # absent: never computed from other cells
        else:
            assert value == pytest.approx(expected, abs=1e-12)
            assert value == whole  # present: bit for bit the full run's value


@pytest.mark.parametrize("hib", [True, False])
@pytest.mark.parametrize("convention", ["peak", "chaudhry"])
def test_every_metric_is_absent_exactly_when_it_reads_an_absent_cell(hib, convention):
    full, R, b, ref = matrices(hib)
    c = Cells(R.tolist(), b.tolist(), ref.tolist(), hib)
    opts = {"higher_is_better": hib, "bounds": None if not hib else (0.0, 1.0)}
    last = T - 1
    per_task = {
        "bwt": [plain(c, lambda c, j=j: bwt_task(c, last, j)) for j in range(last)],
        "fwt": [plain(c, lambda c, j=j: fwt_task(c, last, j)) for j in range(1, T)],
        "forgetting": [
            plain(c, lambda c, j=j: forgetting_task(c, last, j, convention)) for j in range(last)
        ],
        "intransigence": [
            plain(c, lambda c, j=j: intransigence_task(c, last, j)) for j in range(T)
        ],
    }
    # the per-task functions
    _assert_same(
        F.backward_transfer_per_task(R, **opts),
        per_task["bwt"],
        F.backward_transfer_per_task(full, **opts),
    )
    _assert_same(
        F.forward_transfer_per_task(R, b, **opts),
        per_task["fwt"],
        F.forward_transfer_per_task(full, b, **opts),
    )
    got = F.forgetting_per_task(R, convention=convention, **opts)
    _assert_same(
        got, per_task["forgetting"], F.forgetting_per_task(full, convention=convention, **opts)
    )
    got = F.intransigence_per_task(R, ref, **opts)
    _assert_same(got, per_task["intransigence"], F.intransigence_per_task(full, ref, **opts))
    # the scalar functions: a mean is absent when one of its terms is
    scalars: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], float]] = {
        "acc": (lambda M: F.average_accuracy(M, **opts), plain(c, lambda c: acc(c, last))),
        "bwt": (lambda M: F.backward_transfer(M, **opts), _mean(per_task["bwt"])),
        "fwt": (lambda M: F.forward_transfer(M, b, **opts), _mean(per_task["fwt"])),
        "forgetting": (
            lambda M: F.forgetting(M, convention=convention, **opts),
            _mean(per_task["forgetting"]),
        ),
        "learning_accuracy": (
            lambda M: F.learning_accuracy(M, **opts),
            plain(c, lambda c: learning_accuracy(c, last)),
        ),
        "average_incremental_accuracy": (
            lambda M: F.average_incremental_accuracy(M, **opts),
            plain(c, lambda c: aia(c, last)),
        ),
        "intransigence": (
            lambda M: F.intransigence(M, ref, **opts),
            _mean(per_task["intransigence"]),
        ),
    }
    family = F.all_continual_metrics(R, b, ref, forgetting=convention, **opts)
    whole = F.all_continual_metrics(full, b, ref, forgetting=convention, **opts)
    gem = F.continual_metrics(R, b, forgetting=convention, **opts)
    gem_whole = F.continual_metrics(full, b, forgetting=convention, **opts)
    for key, (fn, expected) in scalars.items():
        _assert_same(fn(R), [expected], fn(full))
        _assert_same(family[key], [expected], whole[key])
        if key in gem:
            _assert_same(gem[key], [expected], gem_whole[key])
    assert math.isnan(scalars["forgetting"][1])
    assert math.isnan(scalars["average_incremental_accuracy"][1])
    assert not math.isnan(scalars["bwt"][1])  # BWT reads only the diagonal and the final row
    for key in per_task:
        _assert_same(family["per_task"][key], per_task[key], whole["per_task"][key])
    # the curves: every metric after every stage s, from the prefix R[:s+1, :s+1]
    curve_defs: dict[str, Callable[[Cells, int], float]] = {
        "acc": acc,
        "bwt": lambda c, s: _mean([bwt_task(c, s, j) for j in range(s)]),
        "fwt": lambda c, s: _mean([fwt_task(c, s, j) for j in range(1, s + 1)]),
        "forgetting": lambda c, s: _mean([forgetting_task(c, s, j, convention) for j in range(s)]),
        "learning_accuracy": learning_accuracy,
        "average_incremental_accuracy": aia,
    }
    curves = F.continual_metrics_curve(R, b, forgetting=convention, **opts)
    whole_curves = F.continual_metrics_curve(full, b, forgetting=convention, **opts)
    for key, define in curve_defs.items():
        want = [plain(c, lambda c, s=s, define=define: define(c, s)) for s in range(T)]
        assert any(math.isnan(v) for v in want) == (key not in ("fwt", "learning_accuracy"))
        _assert_same(curves[key], want, whole_curves[key])
        _assert_same(family["curve"][key], want, whole_curves[key])


def test_the_diagonal_the_superdiagonal_and_the_final_row_must_be_present():
    _, R, b, _ = matrices(True)
    for cell in ((3, 3), (2, 3), (T - 1, 0)):
        bad = R.clone()
        bad[cell] = NAN
        with pytest.raises(ValueError, match=rf"scores\[{cell[0]}, {cell[1]}\] is nan"):
            F.continual_metrics(bad, b)
    bad = R.clone()
    bad[2, 0] = math.inf  # an absent cell is NaN, never inf
    with pytest.raises(ValueError, match=r"scores\[2, 0\] is inf"):
        F.continual_metrics(bad, b)
    bad[2, 0] = 1.5  # a present old-task cell is still checked against the bounds
    with pytest.raises(ValueError, match=r"scores\[2, 0\] = 1.5 is outside \[0, 1\]"):
        F.forgetting(bad)


def test_continual_metrics_metric_takes_absent_cells():
    full, R, b, _ = matrices(True)
    metric = ContinualMetrics(T, dtype=torch.float64)
    metric.update_baseline(b)
    for row in R:
        metric.update(row)
    out = metric.compute()
    whole = F.continual_metrics(full, b, validate=False)
    assert math.isnan(out["forgetting"])
    assert out["acc"] == whole["acc"] and out["bwt"] == whole["bwt"] and out["fwt"] == whole["fwt"]
    clone = ContinualMetrics(T, dtype=torch.float64)
    clone.load_state_dict(metric.state_dict())  # a recorded absent cell loads back
    assert torch.equal(clone.scores.isnan(), R.isnan())
    final = ContinualMetrics(2, dtype=torch.float64)
    final.update(torch.tensor([0.5, 0.5], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"scores\[1, 0\] is nan"):  # the final row: required
        final.update(torch.tensor([NAN, 0.5], dtype=torch.float64))

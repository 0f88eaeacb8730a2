"""Intervals of the step-curve metrics (continual_eval.functional._step_intervals).

* the batched metrics equal `continual_eval.functional.stability` / `plasticity` (the public
  functions, one run at a time) on random curves, both directions;
* the resamples are the matrix bootstrap's (``resample_weights`` of the same sizes and seed);
* coverage by simulation (seeded): 2000 simulated runs with known item probabilities
  (correlated across an item's evaluations), the nominal 95% intervals of min-ACC, WC-ACC, the
  gap depth, the stage areas, anytime accuracy, LCA and the AUC forward transfer cover the truth
  in 94-96% of them where the curve's minimum is clear, and so does the hull of the percentile
  and basic intervals of the minimum metrics on a flat stretch near the minimum (where each alone
  undercovers: 82-85% and 93%); exact ties of eight evaluations undercover a little (about 92%;
  measured and asserted, as the ``intervals`` section states);
* the gap's recovery steps (a first passage on the evaluation grid, NaN: not recovered within
  the stage): toy curves whose interval is known, and coverage by simulation of a clear, a
  slow, a flat and a double-dip recovery, no gap, and plateaus that never come back (at least
  95% at nominal 95%, 97-100% measured: conservative).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from continual_eval import functional as F
from continual_eval.functional import _step_intervals as si
from continual_eval.functional import intervals as iv

NAN = math.nan


def _random_curves(B: int, T: int, per_stage: int, seed: int):
    """``B`` runs of curves ``[B, N, T]`` (tasks after the stage NaN), R ``[B, T, T]``, b."""
    g = torch.Generator().manual_seed(seed)
    stage = torch.arange(T).repeat_interleave(per_stage)
    steps = torch.arange(1, len(stage) + 1) * 3
    A = torch.rand(B, len(stage), T, generator=g, dtype=torch.float64)
    A[:, torch.arange(T).unsqueeze(0) > stage.unsqueeze(1)] = NAN
    R = torch.rand(B, T, T, generator=g, dtype=torch.float64)
    b = torch.rand(B, T, generator=g, dtype=torch.float64)
    return A, R, b, stage, steps


@pytest.mark.parametrize("tolerance", [0.0, 0.1])
@pytest.mark.parametrize("higher_is_better", [True, False])
def test_batched_family_equals_the_public_functions(higher_is_better, tolerance):
    A, R, b, stage, steps = _random_curves(40, 4, 3, seed=1)
    steps = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])  # every step: LCA_2 defined
    ref = torch.tensor([0.3, 0.5, 0.4, 0.6], dtype=torch.float64)
    best = 1.0 if higher_is_better else 0.0
    got = si.step_family(
        A, R, b, stage, steps, higher_is_better=higher_is_better, lca_beta=2,
        reference_auc=ref, best=best, tolerance=tolerance,
    )  # fmt: skip
    hib = {"higher_is_better": higher_is_better}
    recovered = got["gap_recovery_steps"]  # every case met: recovered, not, no gap
    assert bool((recovered > 0).any() and recovered.isnan().any() and (recovered == 0).any())
    for r in range(A.shape[0]):
        acc, scores, base = A[r], R[r], b[r]
        initial = F.stage_start_accuracy(scores, base)
        gap = F.stability_gap(acc, stage, steps, tolerance=tolerance, **hib)
        want = {
            "min_acc": F.min_accuracy(acc, stage, **hib),
            "wc_acc": F.worst_case_accuracy(acc, stage, **hib),
            "gap_boundary": gap["boundary"],
            "gap_minimum": gap["minimum"],
            "gap_depth": gap["depth"],
            "gap_recovery_steps": gap["recovery_steps"],
            "stage_auc": F.stage_auc(acc, stage, steps, initial=initial),
            "anytime_accuracy": F.anytime_accuracy(acc, stage, steps, initial=initial),
            "lca": F.learning_curve_area(acc, stage, steps, 2, initial=initial),
            "auc_forward_transfer_per_task": F.auc_forward_transfer_per_task(
                acc, stage, steps, ref, initial=initial, best=best
            ),
            "auc_forward_transfer": F.auc_forward_transfer(
                acc, stage, steps, ref, initial=initial, best=best
            ),
        }
        assert set(got) == set(want)
        for key, value in want.items():
            torch.testing.assert_close(got[key][r], value, rtol=0, atol=1e-12, equal_nan=True)


def test_the_resamples_are_the_matrix_bootstraps():
    """Task j's weights of resample r are `resample_weights`' (the matrix metrics' draws): a
    statistic that reads one cell has the cell interval `paired_bootstrap` gives it."""
    g = torch.Generator().manual_seed(3)
    sizes = [37, 64, 101]
    T = 3
    stage = torch.tensor([0, 0, 1, 1, 2, 2])
    steps = torch.tensor([2, 4, 6, 8, 10, 12])
    E = 1 + T + len(stage)
    values = [torch.rand(E, n, generator=g) < 0.6 for n in sizes]
    evaluated = torch.ones(E, T, dtype=torch.bool)
    for n_, st in enumerate(stage.tolist()):
        evaluated[1 + T + n_, st + 1 :] = False
    # the stage-end curve rows equal R's rows (the same evaluation)
    for k in range(T):
        for j in range(k + 1):
            values[j][1 + T + 2 * k + 1] = values[j][1 + k]
    res = si.step_bootstrap(values, evaluated, stage, steps, T, resamples=400, seed=5)
    items = [v[1 : 1 + T] for v in values]
    matrix = iv.paired_bootstrap(items, baseline=[v[0] for v in values], resamples=400, seed=5)
    # WC-ACC at stage 0 is R[0, 0]: the same resampled values; its interval is the hull of the
    # percentile one and the basic one, [2 est - q_hi, 2 est - q_lo]
    est, low, high = (t[0, 0] for t in (matrix.cells.estimate, matrix.cells.low, matrix.cells.high))
    hull_low, hull_high = torch.minimum(low, 2 * est - high), torch.maximum(high, 2 * est - low)
    torch.testing.assert_close(res["wc_acc"].low[0], hull_low, rtol=0, atol=1e-12)
    torch.testing.assert_close(res["wc_acc"].high[0], hull_high, rtol=0, atol=1e-12)
    weights = iv.resample_weights(sizes, resamples=400, seed=5)
    kept = (weights[0] * values[0][1 + T + 1].double()).sum(1) / weights[0].sum(1)
    lo, hi = np.quantile(kept.numpy(), [0.025, 0.975])
    estimate = values[0][1 + T + 1].double().mean().item()
    want_low, want_high = min(lo, 2 * estimate - hi), max(hi, 2 * estimate - lo)
    assert res["wc_acc"].low[0].item() == pytest.approx(want_low, abs=1e-12)
    assert res["wc_acc"].high[0].item() == pytest.approx(want_high, abs=1e-12)


def test_the_basic_intervals_stay_within_the_bounds():
    """WC-ACC at stage 0 of one task scored 99 of 100 at every evaluation: reflected about the
    estimate 0.99 its upper end would pass 1 (the resamples reach down to about 0.97); with
    the scores' bounds it stops at 1, without them it does not."""
    stage, steps = torch.tensor([0, 0]), torch.tensor([1, 2])
    values = [torch.ones(1 + 1 + 2, 100, dtype=torch.bool)]
    values[0][:, 0] = False
    evaluated = torch.ones(4, 1, dtype=torch.bool)
    free = si.step_bootstrap(values, evaluated, stage, steps, 1, resamples=400, seed=0)
    kept = si.step_bootstrap(
        values, evaluated, stage, steps, 1, bounds=(0.0, 1.0), resamples=400, seed=0
    )
    assert free["wc_acc"].estimate[0].item() == pytest.approx(0.99)
    assert free["wc_acc"].high[0].item() > 1.0
    assert kept["wc_acc"].high[0].item() == 1.0
    assert kept["wc_acc"].low[0].item() == free["wc_acc"].low[0].item() < 0.99


# ---------------------------------------------------------------------------- simulation
#: true curves: 3 tasks, 4 evaluations per stage at steps 1..12 (every step; the 4th of each
#: stage is its end), a clear dip of each old task at the start of the next stage
DIP = {
    0: [0.50, 0.70, 0.80, 0.85, 0.60, 0.72, 0.78, 0.80, 0.74, 0.76, 0.77, 0.78],
    1: [None] * 4 + [0.40, 0.60, 0.70, 0.80, 0.55, 0.70, 0.75, 0.78],
    2: [None] * 8 + [0.30, 0.50, 0.60, 0.70],
}
#: the same with a flat stretch at task 0's minimum (four evaluations within 0.01)
FLAT = {**DIP, 0: [0.50, 0.70, 0.80, 0.85, 0.61, 0.60, 0.61, 0.62, 0.60, 0.61, 0.62, 0.61]}
UPPER = {(0, 1): 0.30, (0, 2): 0.20, (1, 2): 0.25}  # R[i, j], j > i
BASE = [0.10, 0.12, 0.15]
REF_AUC = torch.tensor([0.6, 0.55, 0.5], dtype=torch.float64)


def _truth(curves):
    T = 3
    stage = torch.arange(T).repeat_interleave(4)
    steps = torch.arange(1, 13)
    A = torch.tensor(
        [[NAN if curves[j][n] is None else curves[j][n] for j in range(T)] for n in range(12)],
        dtype=torch.float64,
    )
    R = torch.tensor(
        [[A[4 * i + 3, j].item() if j <= i else UPPER[(i, j)] for j in range(T)] for i in range(T)],
        dtype=torch.float64,
    )
    b = torch.tensor(BASE, dtype=torch.float64)
    return A, R, b, stage, steps


def _simulate(curves, runs: int, n: int, rho: float, seed: int):
    """Per run and task ``[E, n]`` items: row 0 b, rows 1..3 R, rows 4.. the curves (a stage
    end's curve row is R's row); item k is right at evaluation e iff ``sqrt(rho) z_k +
    sqrt(1 - rho) e_ke < Phi^-1(p_e)`` (P = p_e exactly, correlated across evaluations)."""
    A, R, b, stage, _ = _truth(curves)
    T, N = 3, 12
    E = 1 + T + N
    p = torch.full((E, T), 0.5, dtype=torch.float64)
    p[0], p[1 : 1 + T], p[1 + T :] = b, R, torch.nan_to_num(A, nan=0.5)
    evaluated = torch.ones(E, T, dtype=torch.bool)
    evaluated[1 + T :] = ~torch.isnan(A)
    cut = np.vectorize(NormalDist().inv_cdf)(p.numpy())  # [E, T]
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((runs, T, 1, n))
    noise = rng.standard_normal((runs, T, E, n))
    latent = math.sqrt(rho) * z + math.sqrt(1 - rho) * noise
    right = latent < cut.T[None, :, :, None]  # [runs, T, E, n]
    for k in range(T):  # a stage end's curve row is the stage-end evaluation itself
        right[:, :, 1 + T + 4 * k + 3] = right[:, :, 1 + k]
    return torch.from_numpy(right), evaluated, stage


def _coverage(curves, runs=2000, n=256, resamples=500):
    A, R, b, stage, steps = _truth(curves)
    truth = si.step_family(
        A[None], R[None], b[None], stage, steps, lca_beta=3, reference_auc=REF_AUC, best=1.0
    )
    right, evaluated, _ = _simulate(curves, runs, n, rho=0.6, seed=7)
    covered: dict[str, list[torch.Tensor]] = {}
    for first in range(0, runs, 250):  # 250 runs per call, each resampled independently
        res = si.step_bootstrap(
            list(right[first : first + 250].transpose(0, 1)), evaluated, stage, steps, 3,
            lca_beta=3, reference_auc=REF_AUC, best=1.0, resamples=resamples, seed=first,
        )  # fmt: skip
        for key, t in res.items():
            covered.setdefault(key, []).append(_covers(key, t, truth[key][0]))
    undefined = {key: torch.isnan(v[0]) for key, v in truth.items()}
    undefined["gap_recovery_steps"] = torch.isnan(truth["gap_depth"][0])  # NaN: not recovered
    return {
        key: torch.cat(v).double().mean(dim=0).masked_fill(undefined[key], NAN)
        for key, v in covered.items()
    }


def _covers(key: str, t: iv.IntervalTensors, want: torch.Tensor) -> torch.Tensor:
    """``low <= want <= high``; for the recovery steps NaN is "not recovered within the stage",
    after every step (+inf), in the truth and in the interval's ends."""
    low, high = t.low, t.high
    if key == "gap_recovery_steps":
        low, high, want = (v.nan_to_num(math.inf) for v in (low, high, want))
    return (low <= want) & (want <= high)


def test_coverage_of_the_curve_metrics_by_simulation():
    """2000 simulated runs of 256 items per task (500 resamples each): each nominal 95%
    interval covers the truth in 93-97% of them (MC s.e. 0.49 points), pooled over every
    defined value 94-96% (min-ACC at stage 0 is undefined, NaN, and left out)."""
    coverage = _coverage(DIP)
    recovery = coverage.pop("gap_recovery_steps")  # conservative by design (its own tests)
    assert bool((recovery >= 0.95).all()), recovery
    values = torch.cat([v.reshape(-1) for v in coverage.values()])
    values = values[~torch.isnan(values)]
    assert bool(((values >= 0.93) & (values <= 0.97)).all()), coverage
    assert 0.94 <= values.mean().item() <= 0.96, coverage
    for key in ("min_acc", "wc_acc", "gap_depth", "lca", "auc_forward_transfer"):
        assert key in coverage


def test_a_flat_minimum_is_covered_by_the_hull():
    """Where four to eight evaluations sit within 0.02 of task 0's minimum, the plug-in minimum
    is biased low: the percentile interval of min-ACC (measured 82-85% in 1000 runs) and the
    basic one (93%) each undercover, their hull covers 94-96% (measured 94.1-96.7% over the
    minimum metrics); the linear curve metrics keep their coverage."""
    coverage = _coverage(FLAT, runs=1000)
    for key in ("min_acc", "wc_acc", "gap_minimum", "gap_depth"):
        values = coverage[key][~torch.isnan(coverage[key])]
        assert bool(((values >= 0.935) & (values <= 0.975)).all()), (key, coverage[key])
    assert 0.93 <= coverage["stage_auc"][0].item() <= 0.97, coverage["stage_auc"]


@pytest.mark.slow
def test_exact_ties_of_the_minimum_undercover_a_little():
    """Eight evaluations exactly at task 0's minimum (the bootstrap of a minimum is
    inconsistent at ties): the hull covers about 92% (the basic interval alone 91-92%), as the
    ``intervals`` section's ``unavailable["min_acc_ties"]`` states; never below 90%."""
    coverage = _coverage({**DIP, 0: [0.50, 0.70, 0.80, 0.85] + [0.60] * 8}, runs=1000)
    for key in ("min_acc", "wc_acc", "gap_minimum", "gap_depth"):
        values = coverage[key][~torch.isnan(coverage[key])]
        assert bool(((values >= 0.90) & (values <= 0.975)).all()), (key, coverage[key])


# ---------------------------------------------------------------- the gap's recovery steps
def _toy(counts: list[int], n: int = 100):
    """Task 0 right on its first ``count`` items (of ``n``) at each evaluation: all of them at
    its boundary (step 10, stage 0's one evaluation), ``counts`` at steps 20, 30, ... of stage 1;
    task 1 right on every item. Returns ``step_bootstrap``'s inputs (2 stages)."""
    N = 1 + len(counts)
    stage, steps = torch.tensor([0] + [1] * len(counts)), torch.arange(1, N + 1) * 10
    rows = [n, n, counts[-1], n, *counts]  # b, R[0], R[1], the curve (stage ends as R's rows)
    task0 = torch.stack([torch.arange(n) < c for c in rows])
    evaluated = torch.ones(3 + N, 2, dtype=torch.bool)
    evaluated[3, 1] = False  # task 1 is not scored in stage 0
    return [task0, torch.ones(3 + N, n, dtype=torch.bool)], evaluated, stage, steps


@pytest.mark.parametrize(
    ("counts", "estimate", "low", "high"),
    [
        # the dip and the half-way point are many standard errors from the boundary: certain
        ([0, 50, 100], 30.0, 30.0, 30.0),
        ([100, 100, 100], 0.0, 0.0, 0.0),  # no gap
        ([0, 50, 50], NAN, NAN, NAN),  # certainly not recovered within the stage
        # one item short of the boundary: the estimate never recovers, yet half of the
        # resamples leave that item out and recover at step 30: from 20 steps to never
        ([0, 99, 99], NAN, 20.0, NAN),
    ],
)
def test_recovery_interval_of_toy_curves(counts, estimate, low, high):
    values, evaluated, stage, steps = _toy(counts)
    got = si.step_bootstrap(values, evaluated, stage, steps, 2, resamples=400, seed=0)
    gap = got["gap_recovery_steps"]
    assert got["gap_depth"].estimate[0].item() == pytest.approx(1 - min(counts) / 100)
    want = torch.tensor([estimate, low, high], dtype=torch.float64)
    torch.testing.assert_close(torch.cat(gap), want, rtol=0, atol=0, equal_nan=True)


def test_recovery_interval_is_undefined_without_a_gap_value():
    """Task 0 not scored during stage 1 (validate=False curves): depth, recovery and its ends
    are all NaN ("undefined", not "not recovered")."""
    values, evaluated, stage, steps = _toy([0, 50, 100])
    evaluated[4:, 0] = False
    got = si.step_bootstrap(values, evaluated, stage, steps, 2, resamples=50, seed=0)
    assert math.isnan(got["gap_depth"].estimate[0].item())
    assert all(math.isnan(t[0].item()) for t in got["gap_recovery_steps"])


def test_a_loss_recovery_interval_is_the_negated_scores():
    """Lower is better: the interval of a loss curve is the score's of the negated items (the
    recovery is a step count: not negated), with a tolerance."""
    g = torch.Generator().manual_seed(2)
    values, evaluated, stage, steps = _toy([10, 60, 90, 95, 97])
    noisy = [
        v.double() + 0.3 * torch.rand(v.shape, generator=g, dtype=torch.float64) for v in values
    ]
    options = {"tolerance": 0.05, "resamples": 300, "seed": 4}
    score = si.step_bootstrap(noisy, evaluated, stage, steps, 2, **options)
    loss = si.step_bootstrap(
        [-v for v in noisy], evaluated, stage, steps, 2, higher_is_better=False, **options
    )
    torch.testing.assert_close(
        torch.cat(loss["gap_recovery_steps"]),
        torch.cat(score["gap_recovery_steps"]),
        equal_nan=True,
    )
    assert score["gap_recovery_steps"].estimate.item() > 0


@pytest.mark.parametrize("tolerance", [math.nan, math.inf, "0.1", True])
def test_a_bad_tolerance_is_refused(tolerance):
    values, evaluated, stage, steps = _toy([0, 50, 100])
    with pytest.raises(ValueError, match="tolerance must be a finite number"):
        si.step_bootstrap(values, evaluated, stage, steps, 2, tolerance=tolerance, resamples=5)


#: task 0 during stage 1 (12 evaluations, steps 5..16) after its boundary 0.85 at step 4:
#: the true curves, the recovery step the truth has (tolerance 0: back at >= 0.85)
RECOVERY = {
    # back at 0.90 two steps after 0.80: recovery 6 (step 10)
    "clear": [0.60, 0.66, 0.72, 0.76, 0.80, 0.90, 0.91, 0.91, 0.92, 0.92, 0.92, 0.92],
    # creeping up 0.005-0.01 per step across the boundary: recovery 8 (0.855 at step 12)
    "slow": [0.60, 0.70, 0.76, 0.80, 0.82, 0.835, 0.845, 0.855, 0.86, 0.865, 0.87, 0.87],
    # levelling off 0.01 below the boundary: never (NaN)
    "never": [0.60, 0.72, 0.78, 0.81, 0.82, 0.83, 0.835, 0.835, 0.84, 0.84, 0.84, 0.84],
    # reaching the boundary exactly and staying there: recovery 5 (0.85 at step 9)
    "flat": [0.60, 0.75, 0.84, 0.845, 0.85, 0.85, 0.85, 0.855, 0.85, 0.85, 0.85, 0.85],
    # no gap: 0.01 to 0.05 above the boundary throughout: 0
    "none": [0.86, 0.87, 0.86, 0.87, 0.88, 0.88, 0.89, 0.89, 0.90, 0.90, 0.90, 0.90],
    # two dips, the first (0.60) a little deeper than the second (0.62): recovery after the
    # first, 3 (0.88 at step 7)
    "double": [0.60, 0.75, 0.88, 0.90, 0.75, 0.62, 0.70, 0.80, 0.90, 0.91, 0.91, 0.92],
    # 30 evaluations 0.01 below the boundary (dense evaluation of a plateau): never
    "never_long": [0.60, 0.72, 0.78, 0.81, 0.82, 0.83] + [0.84] * 30,
    # 10 at 0.84, 10 at 0.845, then 10 at 0.855: recovery 27 (step 31)
    "slow_long": [0.60, 0.72, 0.78, 0.81, 0.82, 0.83] + [0.84] * 10 + [0.845] * 10 + [0.855] * 10,
}
_TASK_1 = [0.30, 0.50, 0.60, 0.70, 0.75, 0.78, 0.80, 0.81, 0.82, 0.82] + [0.83] * 30


def _recovery_truth(curve: list[float]):
    """Task 0's true curve (stage 0: 0.50, 0.70, 0.80, 0.85 at steps 1..4, then ``curve``) and
    task 1's during stage 1; ``(A [N, 2], stage, steps)``."""
    K = len(curve)
    A = torch.full((4 + K, 2), NAN, dtype=torch.float64)
    A[:, 0] = torch.tensor([0.50, 0.70, 0.80, 0.85, *curve], dtype=torch.float64)
    A[4:, 1] = torch.tensor(_TASK_1[:K], dtype=torch.float64)
    return A, torch.tensor([0] * 4 + [1] * K), torch.arange(1, 5 + K)


def _simulate_recovery(curve: list[float], runs: int, n: int, rho: float, seed: int):
    """Items ``[runs, 2, E, n]`` as `_simulate`'s (P(right) exactly the curve's value at every
    evaluation, correlated across an item's evaluations), rows b, R[0], R[1], the curves."""
    A, stage, steps = _recovery_truth(curve)
    N = A.shape[0]
    E = 3 + N
    p = torch.full((E, 2), 0.5, dtype=torch.float64)
    p[0], p[1], p[2] = torch.tensor([0.1, 0.1]), torch.tensor([0.85, 0.2]), A[N - 1]
    p[3:] = torch.nan_to_num(A, nan=0.5)
    evaluated = torch.ones(E, 2, dtype=torch.bool)
    evaluated[3:] = ~torch.isnan(A)
    cut = np.vectorize(NormalDist().inv_cdf)(p.numpy())
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((runs, 2, 1, n))
    noise = rng.standard_normal((runs, 2, E, n))
    right = math.sqrt(rho) * z + math.sqrt(1 - rho) * noise < cut.T[None, :, :, None]
    right[:, :, 3 + 3], right[:, :, 3 + N - 1] = right[:, :, 1], right[:, :, 2]  # stage ends
    return torch.from_numpy(right), evaluated, stage, steps


def _recovery_coverage(curve: list[float], runs: int = 1000, n: int = 256, resamples: int = 400):
    """Of ``runs`` simulated runs, the fraction whose nominal 95% recovery interval holds the
    true curve's recovery step (NaN, "not recovered", after every step), and the fraction
    whose interval reaches "not recovered" (high NaN); every interval holds its estimate."""
    A, stage, steps = _recovery_truth(curve)
    truth = F.stability_gap(A, stage, steps)["recovery_steps"][0].nan_to_num(math.inf)
    right, evaluated, stage, steps = _simulate_recovery(curve, runs, n, rho=0.6, seed=11)
    covered, open_ended = [], []
    for first in range(0, runs, 250):
        res = si.step_bootstrap(
            list(right[first : first + 250].transpose(0, 1)), evaluated, stage, steps, 2,
            resamples=resamples, seed=first,
        )["gap_recovery_steps"]  # fmt: skip
        estimate, low, high = (t[:, 0].nan_to_num(math.inf) for t in res)
        assert bool(((low <= estimate) & (estimate <= high)).all())
        covered.append((low <= truth) & (truth <= high))
        open_ended.append(torch.isinf(high))
    return torch.cat(covered).double().mean().item(), torch.cat(open_ended).double().mean().item()


@pytest.mark.parametrize("case", ["clear", "slow", "never_long"])
def test_recovery_interval_coverage_by_simulation(case):
    """1000 simulated runs of 256 items per task, 400 resamples: the nominal 95% interval of
    the recovery steps holds the truth in at least 95% of them; it is conservative (measured:
    clear 100%, slow 99.4%, the plateau that never comes back 97.0%, 98.0% in 4000 runs; MC
    s.e. about 0.5 points). The clear recovery is pinned to its step or the next few; the slow
    one and the plateau reach "not recovered" in most runs (their margins are within the noise
    of 256 items)."""
    coverage, open_ended = _recovery_coverage(RECOVERY[case])
    assert coverage >= 0.95, (case, coverage)
    if case == "clear":
        assert open_ended < 0.10, open_ended
    else:
        assert open_ended > 0.80, open_ended


@pytest.mark.slow
@pytest.mark.parametrize("case", ["never", "flat", "none", "double", "slow_long"])
def test_recovery_interval_coverage_of_harder_curves(case):
    """The same for a curve levelling off 0.01 below the boundary, one that reaches it exactly,
    one without a gap, two dips of nearly equal depth and a slow crossing over 30 evaluations
    (measured 99.2%, 99.0%, 99.9%, 99.2%, 97.4%). Measured while choosing the construction
    (1000 runs each): the percentile interval of the resampled recovery steps alone covers
    80% (never), 39% and 45% (the two plateaus); the recovery steps of a pointwise 95% band
    87-88% on the plateaus; the band's edges alone 67-77% with the two dips."""
    coverage, _ = _recovery_coverage(RECOVERY[case])
    assert coverage >= 0.95, (case, coverage)

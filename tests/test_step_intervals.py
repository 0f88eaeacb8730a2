"""Intervals of the step-curve metrics (continual_eval.functional._step_intervals).

* the batched metrics equal `continual_eval.functional.stability` / `plasticity` (the public
  functions, one run at a time) on random curves, both directions;
* the resamples are the matrix bootstrap's (``resample_weights`` of the same sizes and seed);
* coverage by simulation (seeded): 2000 simulated runs with known item probabilities
  (correlated across an item's evaluations), the nominal 95% intervals of min-ACC, WC-ACC, the
  gap depth, the stage areas, anytime accuracy, LCA and the AUC forward transfer cover the truth
  in 94-96% of them where the curve's minimum is clear; a flat stretch near the minimum
  undercovers a little (about 93% with the basic interval of the minimum metrics; measured and
  asserted, as the ``intervals`` section states).
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


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_batched_family_equals_the_public_functions(higher_is_better):
    A, R, b, stage, steps = _random_curves(5, 4, 3, seed=1)
    steps = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])  # every step: LCA_2 defined
    ref = torch.tensor([0.3, 0.5, 0.4, 0.6], dtype=torch.float64)
    best = 1.0 if higher_is_better else 0.0
    got = si.step_family(
        A, R, b, stage, steps, higher_is_better=higher_is_better, lca_beta=2,
        reference_auc=ref, best=best,
    )  # fmt: skip
    hib = {"higher_is_better": higher_is_better}
    for r in range(A.shape[0]):
        acc, scores, base = A[r], R[r], b[r]
        initial = F.stage_start_accuracy(scores, base)
        gap = F.stability_gap(acc, stage, steps, **hib)
        want = {
            "min_acc": F.min_accuracy(acc, stage, **hib),
            "wc_acc": F.worst_case_accuracy(acc, stage, **hib),
            "gap_boundary": gap["boundary"],
            "gap_minimum": gap["minimum"],
            "gap_depth": gap["depth"],
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
    # WC-ACC at stage 0 is R[0, 0]: the same resampled values, reflected about the estimate
    # (WC-ACC's interval is the basic one, [2 est - q_hi, 2 est - q_lo])
    est = matrix.cells.estimate[0, 0]
    basic_low, basic_high = 2 * est - matrix.cells.high[0, 0], 2 * est - matrix.cells.low[0, 0]
    torch.testing.assert_close(res["wc_acc"].low[0], basic_low, rtol=0, atol=1e-12)
    torch.testing.assert_close(res["wc_acc"].high[0], basic_high, rtol=0, atol=1e-12)
    weights = iv.resample_weights(sizes, resamples=400, seed=5)
    kept = (weights[0] * values[0][1 + T + 1].double()).sum(1) / weights[0].sum(1)
    lo, hi = np.quantile(kept.numpy(), [0.025, 0.975])
    estimate = values[0][1 + T + 1].double().mean().item()
    assert res["wc_acc"].low[0].item() == pytest.approx(2 * estimate - hi, abs=1e-12)
    assert res["wc_acc"].high[0].item() == pytest.approx(2 * estimate - lo, abs=1e-12)


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
            want = truth[key][0]
            covered.setdefault(key, []).append((t.low <= want) & (want <= t.high))
    return {
        key: torch.cat(v).double().mean(dim=0).masked_fill(torch.isnan(truth[key][0]), NAN)
        for key, v in covered.items()
    }


def test_coverage_of_the_curve_metrics_by_simulation():
    """2000 simulated runs of 256 items per task (500 resamples each): each nominal 95%
    interval covers the truth in 93-97% of them (MC s.e. 0.49 points), pooled over every
    defined value 94-96% (min-ACC at stage 0 is undefined, NaN, and left out)."""
    coverage = _coverage(DIP)
    values = torch.cat([v.reshape(-1) for v in coverage.values()])
    values = values[~torch.isnan(values)]
    assert bool(((values >= 0.93) & (values <= 0.97)).all()), coverage
    assert 0.94 <= values.mean().item() <= 0.96, coverage
    for key in ("min_acc", "wc_acc", "gap_depth", "lca", "auc_forward_transfer"):
        assert key in coverage


def test_a_flat_minimum_undercovers_a_little():
    """Where four to eight evaluations sit within 0.02 of task 0's minimum, the plug-in minimum
    is biased low; the basic interval of min-ACC and the gap's minimum, reflected about the
    estimate, covers about 93% (the percentile interval measured 82-85% in 1000 runs), still
    below nominal (stated in the section's ``unavailable``, not claimed); the gap's depth and
    the linear curve metrics keep their coverage."""
    coverage = _coverage(FLAT, runs=1000)
    for key, at in (("min_acc", 1), ("min_acc", 2), ("gap_minimum", 0), ("wc_acc", 2)):
        assert 0.90 <= coverage[key][at].item() < 0.95, (key, coverage[key])
    assert 0.93 <= coverage["gap_depth"][0].item() <= 0.97, coverage["gap_depth"]
    assert 0.93 <= coverage["stage_auc"][0].item() <= 0.97, coverage["stage_auc"]

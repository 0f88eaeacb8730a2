"""The paired bootstrap of the class-incremental numbers over items and their labels
(`continual_eval.functional._class_il_intervals`):

* every statistic and its interval against a plain loop over resamples, items and classes
  (the same double-or-nothing weights, `resample_weights`), the estimates against the
  ``class_incremental`` section's values of a confusion matrix built item by item;
* the task-weighted seen accuracy of the last stage and its mean over stages are the matrix's
  ACC and average incremental accuracy, intervals included (the same draws);
* coverage by simulation (seeded): 2000 runs of known per-class item probabilities, the nominal
  95% intervals of mean class accuracy, AMCA and per-class forgetting cover the truth in 94-96%;
* bad labels refused by name.
"""

from __future__ import annotations

import math
import warnings
from statistics import NormalDist

import numpy as np
import pytest
import torch

import continual_eval.functional as F
from continual_eval.functional._class_il_intervals import class_il_bootstrap
from continual_eval.results import ClassIncrementalResults

# three tasks, classes listed out of id order, class 7 of no task
TASK_CLASSES = [[2, 0], [5, 1, 3], [4, 6]]
SIZES = [23, 70, 41]


def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    T = len(TASK_CLASSES)
    labels = [
        torch.tensor(c)[torch.randint(0, len(c), (n,), generator=g)]
        for c, n in zip(TASK_CLASSES, SIZES, strict=True)
    ]
    items = [torch.rand(T, n, generator=g) < 0.3 + 0.5 * torch.rand(1, generator=g) for n in SIZES]
    class_task = F.check_task_classes(TASK_CLASSES, num_classes=8).class_task
    return items, labels, class_task


def _plain_statistics(items, labels, weights, forgetting):
    """Every statistic of one resample (``weights[j]``: task j's item weights), by loops."""
    T = len(items)
    classes = sorted(c for cs in TASK_CLASSES for c in cs)
    task_of = {c: j for j, cs in enumerate(TASK_CLASSES) for c in cs}
    acc = [[math.nan] * 8 for _ in range(T)]
    cells = [[math.nan] * T for _ in range(T)]
    pooled = []
    for i in range(T):
        hits_all = n_all = 0.0
        for j in range(i + 1):
            hits = n = 0.0
            for k in range(len(labels[j])):
                w = float(weights[j][k])
                hits += w * bool(items[j][i, k])
                n += w
            cells[i][j] = hits / n
        for c in classes:
            j = task_of[c]
            if j > i:
                continue
            hits = n = 0.0
            for k in range(len(labels[j])):
                if int(labels[j][k]) == c:
                    w = float(weights[j][k])
                    hits += w * bool(items[j][i, k])
                    n += w
            hits_all, n_all = hits_all + hits, n_all + n
            if n > 0:
                acc[i][c] = hits / n
        pooled.append(hits_all / n_all)
    seen_task = [sum(cells[i][: i + 1]) / (i + 1) for i in range(T)]
    old_task = [math.nan] + [sum(cells[i][:i]) / i for i in range(1, T)]

    def nanmean(values):
        kept = [v for v in values if not math.isnan(v)]
        return sum(kept) / len(kept) if kept else math.nan

    mca = [nanmean(acc[i]) for i in range(T)]
    amca = [sum(mca[: i + 1]) / (i + 1) for i in range(T)]

    def forgetting_after(last):
        out = []
        for c in range(8):
            history = [acc[k][c] for k in range(last + 1)]
            final, earlier = history[-1], [v for v in history[:-1] if not math.isnan(v)]
            if math.isnan(final) or not earlier:
                out.append(math.nan)
                continue
            peak = max(earlier + ([final] if forgetting == "peak" else []))
            out.append(peak - final)
        return out

    per_stage = [nanmean(forgetting_after(i)) for i in range(T)]
    return {
        "seen_accuracy_task": seen_task,
        "old_accuracy_task": old_task,
        "seen_accuracy_sample": pooled,
        "average_incremental_accuracy_task": sum(seen_task) / T,
        "average_incremental_accuracy_sample": sum(pooled) / T,
        "mean_class_accuracy": mca,
        "amca_per_stage": amca,
        "class_forgetting": forgetting_after(T - 1),
        "mean_class_forgetting_per_stage": per_stage,
    }


@pytest.mark.parametrize("forgetting", ["peak", "chaudhry"])
def test_statistics_and_intervals_match_a_plain_loop(forgetting: str):
    items, labels, class_task = _case()
    resamples, seed = 60, 5
    got = class_il_bootstrap(
        items, labels, class_task, forgetting=forgetting, resamples=resamples, seed=seed
    )
    weights = F.resample_weights(SIZES, resamples=resamples, seed=seed)
    ones = [torch.ones(n) for n in SIZES]
    estimate = _plain_statistics(items, labels, ones, forgetting)
    samples = [
        _plain_statistics(items, labels, [w[r] for w in weights], forgetting)
        for r in range(resamples)
    ]
    assert set(got) == set(estimate)
    for key, value in got.items():
        want = torch.tensor(estimate[key], dtype=torch.float64)
        torch.testing.assert_close(value.estimate, want, rtol=0, atol=1e-12, equal_nan=True)
        drawn = np.array([sample[key] for sample in samples], dtype=np.float64)
        with warnings.catch_warnings():  # all-NaN columns: undefined statistics
            warnings.simplefilter("ignore", RuntimeWarning)
            ends = np.nanquantile(drawn, [0.025, 0.975], axis=0)
        for end, table in zip(ends, (value.low, value.high), strict=True):
            torch.testing.assert_close(
                table, torch.from_numpy(np.asarray(end)), rtol=0, atol=1e-12, equal_nan=True
            )


def test_estimates_are_the_class_incremental_sections_values():
    """A confusion matrix built item by item (a wrong item predicted as another seen class)
    gives the section's measures; the bootstrap's estimates equal them."""
    items, labels, class_task = _case(1)
    T = len(items)
    conf = torch.zeros(T, 8, 8, dtype=torch.int64)
    for i in range(T):
        seen = sorted(c for cs in TASK_CLASSES[: i + 1] for c in cs)
        for j in range(i + 1):
            for k in range(SIZES[j]):
                c = int(labels[j][k])
                wrong = seen[(seen.index(c) + 1) % len(seen)]
                conf[i, c, c if items[j][i, k] else wrong] += 1
    for forgetting in ("peak", "chaudhry"):
        section = ClassIncrementalResults.compute(TASK_CLASSES, conf, forgetting=forgetting)
        got = class_il_bootstrap(items, labels, class_task, forgetting=forgetting, resamples=20)
        want = {
            "seen_accuracy_task": section.seen_accuracy["task"],
            "old_accuracy_task": section.old_accuracy["task"],
            "seen_accuracy_sample": section.seen_accuracy["sample"],
            "mean_class_accuracy": section.mean_class_accuracy,
            "amca_per_stage": section.amca_per_stage,
            "class_forgetting": section.class_forgetting,
            "mean_class_forgetting_per_stage": section.mean_class_forgetting_per_stage,
        }
        for key, value in want.items():
            torch.testing.assert_close(got[key].estimate, value, rtol=0, atol=1e-12, equal_nan=True)
        for w in ("task", "sample"):
            assert got[f"average_incremental_accuracy_{w}"].estimate.item() == pytest.approx(
                section.average_incremental_accuracy[w], abs=1e-12
            )


def test_task_weighted_seen_accuracy_is_the_matrix_acc_and_aia():
    """seen_accuracy_task[-1] is ACC and its mean over stages the average incremental accuracy
    of the task-agnostic matrix: with the same seed the intervals are the matrix's own."""
    items, labels, class_task = _case(2)
    got = class_il_bootstrap(items, labels, class_task, resamples=500, seed=9)
    matrix = F.paired_bootstrap(items, resamples=500, seed=9)
    pairs = [
        ("average_incremental_accuracy_task", None, "average_incremental_accuracy"),
        ("seen_accuracy_task", -1, "acc"),
    ]
    for key, at, metric in pairs:
        mine = [t if at is None else t[at] for t in got[key]]
        theirs = matrix.metrics[metric]
        for a, b in zip(mine, theirs, strict=True):
            assert a.item() == pytest.approx(b.item(), abs=1e-12), (key, metric)


# ---------------------------------------------------------------------------- coverage
# 3 tasks x 2 classes; TRUE[c][i]: class c's accuracy after stage i (None: not seen yet).
# Every class that can forget peaks once, well above its other stages (the bootstrap of a
# maximum is unreliable at ties); the last task's classes have no forgetting (NaN).
TRUE = [
    [0.85, 0.70, 0.55],
    [0.60, 0.82, 0.62],
    [None, 0.90, 0.70],
    [None, 0.80, 0.58],
    [None, None, 0.75],
    [None, None, 0.65],
]
COVERAGE_TASKS = [[0, 1], [2, 3], [4, 5]]


def _simulated(runs: int, per_class: int, rho: float, seed: int):
    """``runs`` runs; each class ``per_class`` test items, item k right after stage i with
    probability ``TRUE[c][i]``, correlated across stages (Gaussian copula, latent correlation
    ``rho``)."""
    rng = np.random.default_rng(seed)
    items, labels = [], []
    for _j, classes in enumerate(COVERAGE_TASKS):
        cut = np.array(
            [[NormalDist().inv_cdf(TRUE[c][i] or 0.5) for i in range(3)] for c in classes]
        )  # [class, stage]
        n = per_class * len(classes)
        shared = rng.standard_normal((runs, 1, n))
        latent = math.sqrt(rho) * shared + math.sqrt(1 - rho) * rng.standard_normal((runs, 3, n))
        which = np.repeat(np.arange(len(classes)), per_class)
        right = latent < cut[which].T[None]  # [run, stage, item]
        items.append(torch.from_numpy(right))
        labels.append(torch.tensor(classes)[torch.from_numpy(which)])
    return items, labels


def test_coverage_of_mean_class_accuracy_amca_and_class_forgetting_by_simulation():
    """2000 simulated runs (seeded), 120 items per class: the nominal 95% intervals cover the
    truth (the statistics of the true per-class accuracies) in 94-96% of the runs: AMCA, the
    mean per-class forgetting, and pooled over the stages (mean class accuracy) and over the
    four classes that forget (per-class forgetting), each single one within 93-97% (one
    coverage estimate has a Monte Carlo standard error of 0.49 points)."""
    items, labels = _simulated(2000, 120, 0.6, seed=0)
    class_task = F.check_task_classes(COVERAGE_TASKS).class_task
    got = class_il_bootstrap(items, labels, class_task, resamples=1000, seed=0)
    nan = float("nan")
    accuracy = torch.tensor(
        [[nan if TRUE[c][i] is None else TRUE[c][i] for c in range(6)] for i in range(3)],
        dtype=torch.float64,
    )
    mca = torch.nanmean(accuracy, dim=1)
    forgetting = F.per_class_forgetting(accuracy)
    truth = {
        "mean_class_accuracy": mca,
        "amca": torch.cumsum(mca, 0)[-1:] / 3,
        "class_forgetting": forgetting[:4],
        "mean_class_forgetting": F.mean_class_forgetting(accuracy).reshape(1),
    }

    def covered(key: str, at: slice | int) -> torch.Tensor:
        source = {
            "amca": "amca_per_stage",
            "mean_class_forgetting": "mean_class_forgetting_per_stage",
        }
        value = got[source.get(key, key)]
        low, high = (t[:, at] for t in (value.low, value.high))
        if low.ndim == 1:
            low, high = low[:, None], high[:, None]
        return ((low <= truth[key]) & (truth[key] <= high)).double().mean(dim=0)

    results = {
        "mean_class_accuracy": covered("mean_class_accuracy", slice(None)),
        "amca": covered("amca", -1),
        "class_forgetting": covered("class_forgetting", slice(0, 4)),
        "mean_class_forgetting": covered("mean_class_forgetting", -1),
    }
    for key, coverage in results.items():
        assert 0.94 <= coverage.mean().item() <= 0.96, (key, results)
        assert bool(((coverage >= 0.93) & (coverage <= 0.97)).all()), (key, results)


def test_bad_labels_are_refused_by_name():
    items, labels, class_task = _case()
    wrong = [labels[0], labels[1].clone(), labels[2]]
    wrong[1][4] = 2  # a class of task 0
    with pytest.raises(ValueError, match=r"labels\[1\] item 4 is class 2, not a class of task 1"):
        class_il_bootstrap(items, wrong, class_task, resamples=5)
    with pytest.raises(ValueError, match=r"labels\[2\] must be an integer \[\.\.\., 41\]"):
        class_il_bootstrap(items, [labels[0], labels[1], labels[2][:-1]], class_task, resamples=5)
    with pytest.raises(TypeError, match=r"one \[\.\.\., n_j\] class-id tensor per task"):
        class_il_bootstrap(items, labels[:2], class_task, resamples=5)

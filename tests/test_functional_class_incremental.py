"""Class-incremental evaluation (continual_eval.functional.class_incremental) against plain-loop
references written here from the definitions, on hand-checked and random problems."""

from __future__ import annotations

import math
import random

import pytest
import torch

from continual_eval import functional as F
from continual_eval.functional import class_incremental as ci

NAN = float("nan")


# ---------------------------------------------------------------- plain-loop references
def ref_class_task(task_classes: list[list[int]], num_classes: int) -> list[int]:
    out = [-1] * num_classes
    for t, classes in enumerate(task_classes):
        for c in classes:
            out[c] = t
    return out


def ref_argmax(row: list[float], allowed: list[bool]) -> int:
    """First maximum over the allowed entries; a NaN is the maximum (torch.argmax)."""
    best = None
    for c, value in enumerate(row):
        if not allowed[c]:
            continue
        if best is None:
            best = c
        elif math.isnan(row[best]):
            continue
        elif math.isnan(value) or value > row[best]:
            best = c
    assert best is not None
    return best


def ref_confusion(target: list[int], pred: list[int], C: int) -> list[list[int]]:
    conf = [[0] * C for _ in range(C)]
    for t, p in zip(target, pred, strict=True):
        conf[t][p] += 1
    return conf


def ratio(num: int, den: int) -> float:
    return num / den if den else NAN


def nanmean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else NAN


def ref_per_class(conf, class_task=None, stage=0) -> list[float]:
    out = []
    for c, row in enumerate(conf):
        value = ratio(row[c], sum(row))
        if class_task is not None and not (0 <= class_task[c] <= stage):
            value = NAN
        out.append(value)
    return out


def ref_task_acc(conf, class_task, T) -> list[float]:
    out = []
    for j in range(T):
        correct = sum(conf[c][c] for c in range(len(conf)) if class_task[c] == j)
        total = sum(sum(conf[c]) for c in range(len(conf)) if class_task[c] == j)
        out.append(ratio(correct, total))
    return out


def ref_group(conf, class_task, tasks: list[int], weighting: str) -> float:
    """Accuracy over the classes of ``tasks``, pooled or as a mean of task accuracies."""
    if weighting == "sample":
        correct = total = 0
        for c in range(len(conf)):
            if class_task[c] in tasks:
                correct += conf[c][c]
                total += sum(conf[c])
        return ratio(correct, total)
    T = max(class_task) + 1
    per_task = ref_task_acc(conf, class_task, T)
    return nanmean([per_task[j] for j in tasks if j < T])


def ref_seen(conf, class_task, stage, weighting="sample") -> float:
    return ref_group(conf, class_task, list(range(stage + 1)), weighting)


def ref_old_new(conf, class_task, stage, weighting="sample") -> tuple[float, float]:
    old = ref_group(conf, class_task, list(range(stage)), weighting)
    return old, ref_group(conf, class_task, [stage], "sample")


def ref_forgetting(acc: list[list[float]], convention="peak") -> list[float]:
    S, C = len(acc), len(acc[0])
    out = []
    for c in range(C):
        final = acc[S - 1][c]
        earlier = [acc[k][c] for k in range(S - 1) if not math.isnan(acc[k][c])]
        if math.isnan(final) or not earlier:
            out.append(NAN)
            continue
        best = max([*earlier, final]) if convention == "peak" else max(earlier)
        out.append(best - final)
    return out


def ref_recency(conf, class_task, stage) -> tuple[float, float]:
    seen = [0 <= t <= stage for t in class_task]
    new = [t == stage for t in class_task]
    n_seen = pred_new = true_new = 0
    for c in range(len(conf)):
        if not seen[c]:
            continue
        for p in range(len(conf)):
            n_seen += conf[c][p]
            if new[p]:
                pred_new += conf[c][p]
            if new[c]:
                true_new += conf[c][p]
    return ratio(pred_new, n_seen), ratio(true_new, n_seen)


def assert_same(actual: torch.Tensor, expected, exact: bool = False) -> None:
    """Equal up to 1e-12 (or bit for bit), NaN where expected is NaN."""
    expected_t = torch.tensor(expected, dtype=torch.float64)
    assert actual.dtype == torch.float64
    assert actual.shape == expected_t.shape
    tol = 0.0 if exact else 1e-12
    torch.testing.assert_close(actual, expected_t, rtol=tol, atol=tol, equal_nan=True)


# ---------------------------------------------------------------- a hand-checked problem
# task 0 = classes {0, 1}, task 1 = classes {2, 3}; stage 0 tests task 0 only, stage 1 both.
HAND_TASKS = [[0, 1], [2, 3]]
HAND_CONFS = [
    [[6, 2, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
    [[2, 0, 6, 0], [0, 0, 0, 2], [0, 0, 4, 0], [0, 0, 1, 1]],
]


def hand():
    return torch.tensor(HAND_CONFS), ci.check_task_classes(HAND_TASKS).class_task


def test_hand_per_class_and_per_task():
    confs, class_task = hand()
    assert_same(
        ci.per_class_accuracy(confs, class_task), [[0.75, 0.5, NAN, NAN], [0.25, 0.0, 1.0, 0.5]]
    )
    assert_same(ci.per_task_accuracy(confs, class_task), [[0.7, NAN], [0.2, 5 / 6]], exact=True)
    assert_same(ci.mean_class_accuracy(confs, class_task), [0.625, 0.4375], exact=True)
    assert ci.average_mean_class_accuracy(confs, class_task).item() == 0.53125


def test_hand_seen_accuracy_two_weightings():
    confs, class_task = hand()
    # stage 1: 7 of 16 seen samples right; per task 2/10 and 5/6
    assert_same(ci.seen_accuracy(confs, class_task), [0.7, 7 / 16], exact=True)
    task_weighted = (0.2 + 5 / 6) / 2
    assert_same(ci.seen_accuracy(confs, class_task, weighting="task"), [0.7, task_weighted])
    assert ci.last_accuracy(confs, class_task).item() == 7 / 16
    assert ci.last_accuracy(confs, class_task, weighting="task").item() == pytest.approx(
        task_weighted, abs=1e-15
    )
    assert ci.average_incremental_seen_accuracy(confs, class_task).item() == pytest.approx(
        (0.7 + 7 / 16) / 2, abs=1e-15
    )
    aia_task = ci.average_incremental_seen_accuracy(confs, class_task, weighting="task")
    assert aia_task.item() == pytest.approx((0.7 + task_weighted) / 2, abs=1e-15)


def test_hand_old_new_forgetting_recency():
    confs, class_task = hand()
    old, new = ci.old_new_accuracy(confs, class_task)
    assert_same(old, [NAN, 0.2], exact=True)
    assert_same(new, [0.7, 5 / 6], exact=True)
    acc = ci.per_class_accuracy(confs, class_task)
    assert_same(ci.per_class_forgetting(acc), [0.5, 0.5, NAN, NAN], exact=True)
    assert ci.mean_class_forgetting(acc).item() == 0.5
    bias = ci.recency_bias(confs, class_task)
    assert_same(bias.prediction_share, [1.0, 14 / 16], exact=True)
    assert_same(bias.sample_share, [1.0, 6 / 16], exact=True)


def test_hand_future_task_rows_are_ignored_by_seen_measures():
    """Stage 0 also tests task 1 (for forward transfer): the seen-class measures do not move."""
    confs, class_task = hand()
    with_future = confs.clone()
    with_future[0, 2] = torch.tensor([3, 1, 0, 0])  # class 2 never predicted before stage 1
    same = {"rtol": 0.0, "atol": 0.0, "equal_nan": True}
    for weighting in ci.SEEN_WEIGHTINGS:
        torch.testing.assert_close(
            ci.seen_accuracy(with_future, class_task, weighting=weighting),
            ci.seen_accuracy(confs, class_task, weighting=weighting),
            **same,
        )
    for fn in (ci.per_class_accuracy, ci.mean_class_accuracy):
        torch.testing.assert_close(fn(with_future, class_task), fn(confs, class_task), **same)
    for a, b in zip(
        ci.recency_bias(with_future, class_task), ci.recency_bias(confs, class_task), strict=True
    ):
        torch.testing.assert_close(a, b, **same)
    # measured as they are: R[0, 1] = 0, and class 2's accuracy 0 when no class_task masks it
    assert ci.per_task_accuracy(with_future, class_task)[0, 1].item() == 0.0
    assert_same(ci.per_class_accuracy(with_future)[0], [0.75, 0.5, 0.0, NAN], exact=True)
    # Avalanche's default class set: every class with a test sample
    assert ci.mean_class_accuracy(with_future)[0].item() == pytest.approx(1.25 / 3, abs=1e-15)


# ------------------------------------------------ task-aware vs task-agnostic on a 3x3 R
AGN_TASKS = [[0, 1], [2, 3], [4, 5]]
# one test sample per class; the distractor class of each true class (weight 5)
DISTRACTOR = {0: 5, 2: 5, 4: 0}


def logits_at(stage: int) -> torch.Tensor:
    """Stage ``stage``'s logits for one sample of each class: 1 on the true class, +2 on every
    class of the newest task (recency bias), +5 on a distractor in another task for classes 0,
    2 and 4. Within each task block the true class stays the maximum: task-aware is always
    right."""
    class_task = ref_class_task(AGN_TASKS, 6)
    rows = []
    for c in range(6):
        row = [float(c2 == c) + 2.0 * (class_task[c2] == stage) for c2 in range(6)]
        if c in DISTRACTOR:
            row[DISTRACTOR[c]] += 5.0
        rows.append(row)
    return torch.tensor(rows)


def accuracy_matrices(all_outputs: bool):
    tc = ci.check_task_classes(AGN_TASKS)
    target = torch.arange(6)
    task_of_sample = tc.class_task[target]
    aware, agnostic = [], []
    for stage in range(3):
        logits = logits_at(stage)
        pred_aware = ci.task_aware_predictions(logits, tc.class_task, task_of_sample)
        pred_agn = ci.task_agnostic_predictions(
            logits, tc.class_task, stage, all_outputs=all_outputs
        )
        aware.append(ci.confusion_counts(target, pred_aware, 6))
        agnostic.append(ci.confusion_counts(target, pred_agn, 6))
        # the loop reference, sample by sample
        rows = logits.tolist()
        ct = tc.class_task.tolist()
        assert pred_aware.tolist() == [
            ref_argmax(rows[n], [ct[c] == ct[n] for c in range(6)]) for n in range(6)
        ]
        allowed = [all_outputs or 0 <= ct[c] <= stage for c in range(6)]
        assert pred_agn.tolist() == [ref_argmax(rows[n], allowed) for n in range(6)]
    return (
        ci.per_task_accuracy(torch.stack(aware), tc.class_task),
        ci.per_task_accuracy(torch.stack(agnostic), tc.class_task),
        torch.stack(aware),
    )


def test_task_aware_and_agnostic_differ_on_every_cell():
    aware, agnostic, _ = accuracy_matrices(all_outputs=True)
    assert_same(aware, [[1.0] * 3] * 3, exact=True)
    assert_same(agnostic, [[0.5, 0, 0], [0, 0.5, 0], [0, 0, 0.5]], exact=True)
    assert bool((aware != agnostic).all())


def test_task_agnostic_seen_restriction_by_hand():
    aware, agnostic, aware_confs = accuracy_matrices(all_outputs=False)
    assert_same(agnostic, [[1.0, 0, 0], [0, 1.0, 0], [0, 0, 0.5]], exact=True)
    # at stage 0 the seen classes are task 0's, so class-IL and task-IL always coincide on
    # R[0, 0]; here R[1, 1] too (the recency offset keeps task 1 right at stage 1)
    assert (aware != agnostic).tolist() == [[False, True, True], [True, False, True], [True] * 3]
    # task-aware predictions never leave the sample's task: the confusion is block-diagonal
    block = ci.check_task_classes(AGN_TASKS).class_task
    off_block = block[:, None] != block[None, :]
    assert int(aware_confs[:, off_block].sum()) == 0


# ---------------------------------------------------------------- predictions
def test_predictions_ties_and_infinities():
    class_task = torch.tensor([0, 1, 0, 1, -1])
    inf = math.inf
    logits = torch.tensor(
        [
            [1.0, 2.0, 1.0, 2.0, 9.0],  # ties: the first maximum (class 0 for task 0)
            [-inf, 3.0, -inf, 0.0, 0.0],  # every task-0 logit -inf: the first task-0 class
            [NAN, 0.0, 1.0, NAN, 0.0],  # NaN is the maximum, as in torch.argmax
        ]
    )
    assert ci.task_aware_predictions(logits, class_task, 0).tolist() == [0, 0, 0]
    assert ci.task_aware_predictions(logits, class_task, 1).tolist() == [1, 1, 3]
    assert ci.task_agnostic_predictions(logits, class_task, 0).tolist() == [0, 0, 0]
    assert ci.task_agnostic_predictions(logits, class_task, 1).tolist() == [1, 1, 0]
    # class 4 belongs to no task: only all_outputs predicts it
    assert ci.task_agnostic_predictions(logits, class_task, 5).tolist() == [1, 1, 0]
    assert ci.task_agnostic_predictions(logits, class_task, 0, all_outputs=True).tolist() == [
        4,
        1,
        0,
    ]
    # a per-sample stage / task tensor
    per_sample = torch.tensor([0, 1, 1])
    assert ci.task_agnostic_predictions(logits, class_task, per_sample).tolist() == [0, 1, 0]
    assert ci.task_aware_predictions(logits, class_task, per_sample).tolist() == [0, 1, 3]


@pytest.mark.parametrize("seed", range(20))
def test_predictions_random_against_loops(seed):
    rng = random.Random(seed)
    C = rng.randint(1, 7)
    class_task = [rng.randint(-1, 2) for _ in range(C)]
    class_task[rng.randrange(C)] = 0
    N = rng.randint(0, 12)
    pool = [-1.0, 0.0, 1.0, -math.inf, math.inf, NAN]
    weights = [5, 5, 5, 1, 1, 1]
    rows = [rng.choices(pool, weights, k=C) for _ in range(N)]
    logits = torch.tensor(rows, dtype=torch.float64).reshape(N, C)
    ct = torch.tensor(class_task)
    for stage in range(3):
        allowed = [0 <= t <= stage for t in class_task]
        got = ci.task_agnostic_predictions(logits, ct, stage)
        assert got.tolist() == [ref_argmax(r, allowed) for r in rows]
        got_all = ci.task_agnostic_predictions(logits, ct, stage, all_outputs=True)
        assert got_all.tolist() == [ref_argmax(r, [True] * C) for r in rows]
    for task in sorted({t for t in class_task if t >= 0}):
        got = ci.task_aware_predictions(logits, ct, task)
        assert got.tolist() == [ref_argmax(r, [t == task for t in class_task]) for r in rows]
    tasks = [rng.choice([t for t in class_task if t >= 0]) for _ in range(N)]
    got = ci.task_aware_predictions(logits, ct, torch.tensor(tasks, dtype=torch.long))
    assert got.tolist() == [
        ref_argmax(r, [t == tasks[n] for t in class_task]) for n, r in enumerate(rows)
    ]


def test_prediction_errors():
    class_task = torch.tensor([0, 0, 2])
    logits = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="task 1 has no class"):
        ci.task_aware_predictions(logits, class_task, 1)
    with pytest.raises(ValueError, match=r"sample 2: task 1 has no class"):
        ci.task_aware_predictions(logits, class_task, torch.tensor([0, 2, 1, 0]))
    with pytest.raises(ValueError, match="stage 0 has no class"):
        ci.task_agnostic_predictions(logits, torch.tensor([-1, 1, 2]), 0)
    with pytest.raises(ValueError, match=r"class_task must be an integer \[C\] = \[3\]"):
        ci.task_aware_predictions(logits, torch.tensor([0, 0]), 0)
    with pytest.raises(ValueError, match="logits must be a floating"):
        ci.task_aware_predictions(torch.zeros(4, 3, dtype=torch.long), class_task, 0)
    with pytest.raises(ValueError, match=r"class_task\[1\] = -2"):
        ci.task_aware_predictions(logits, torch.tensor([0, -2, 1]), 0)


# ---------------------------------------------------------------- confusion counts
def test_confusion_counts_against_loops():
    rng = random.Random(0)
    for C in (1, 2, 5, 13):
        N = rng.randint(0, 200)
        target = [rng.randrange(C) for _ in range(N)]
        pred = [rng.randrange(C) for _ in range(N)]
        conf = ci.confusion_counts(
            torch.tensor(target, dtype=torch.long), torch.tensor(pred, dtype=torch.long), C
        )
        assert conf.dtype == torch.int64
        assert conf.tolist() == ref_confusion(target, pred, C)
    small = ci.confusion_counts(
        torch.tensor([1, 1], dtype=torch.uint8), torch.tensor([0, 1], dtype=torch.int32), 2
    )
    assert small.dtype == torch.int64 and small.tolist() == [[0, 0], [1, 1]]


def test_confusion_counts_errors():
    with pytest.raises(ValueError, match=r"target\[1\] = 3 is not a class id in \[0, 3\)"):
        ci.confusion_counts(torch.tensor([0, 3]), torch.tensor([0, 0]), 3)
    with pytest.raises(ValueError, match=r"pred\[0\] = -1"):
        ci.confusion_counts(torch.tensor([0, 1]), torch.tensor([-1, 0]), 3)
    with pytest.raises(ValueError, match="same shape"):
        ci.confusion_counts(torch.tensor([0, 1]), torch.tensor([0]), 3)
    with pytest.raises(ValueError, match="1-D integer tensor"):
        ci.confusion_counts(torch.tensor([0.0]), torch.tensor([0]), 3)
    with pytest.raises(ValueError, match="positive integer"):
        ci.confusion_counts(torch.tensor([0]), torch.tensor([0]), 0)


# ---------------------------------------------------------------- random problems vs loops
def random_problem(seed: int):
    """A random class-to-task split (some classes of no task) and ``S`` stages of counts, with
    some classes untested at some stages and rows for future tasks."""
    rng = random.Random(seed)
    C = rng.randint(1, 9)
    T = rng.randint(1, C)
    ids = list(range(C))
    rng.shuffle(ids)
    assigned = ids[: rng.randint(T, C)]
    cuts = sorted(rng.sample(range(1, len(assigned)), T - 1))
    task_classes = [assigned[a:b] for a, b in zip([0, *cuts], [*cuts, len(assigned)], strict=True)]
    S = rng.randint(1, T + 1)
    confs = [
        [[0] * C if rng.random() < 0.3 else [rng.randint(0, 3) for _ in range(C)] for _ in range(C)]
        for _ in range(S)
    ]
    return task_classes, C, confs


@pytest.mark.parametrize("seed", range(40))
def test_random_against_loops(seed):
    task_classes, C, confs = random_problem(seed)
    tc = ci.check_task_classes(task_classes, num_classes=C)
    ct = ref_class_task(task_classes, C)
    assert tc.class_task.tolist() == ct
    T, S = len(task_classes), len(confs)
    t = torch.tensor(confs, dtype=torch.long)

    acc_ref = [ref_per_class(confs[s], ct, s) for s in range(S)]
    assert_same(ci.per_class_accuracy(t, tc.class_task), acc_ref, exact=True)
    assert_same(ci.per_class_accuracy(t), [ref_per_class(c) for c in confs], exact=True)
    assert_same(
        ci.per_task_accuracy(t, tc.class_task, num_tasks=T),
        [ref_task_acc(c, ct, T) for c in confs],
        exact=True,
    )
    for weighting in ci.SEEN_WEIGHTINGS:
        seen_ref = [ref_seen(confs[s], ct, s, weighting) for s in range(S)]
        assert_same(
            ci.seen_accuracy(t, tc.class_task, weighting=weighting),
            seen_ref,
            exact=weighting == "sample",
        )
        assert_same(ci.last_accuracy(t, tc.class_task, weighting=weighting), seen_ref[-1])
        assert_same(
            ci.average_incremental_seen_accuracy(t, tc.class_task, weighting=weighting),
            sum(seen_ref) / S,
        )
        old, new = ci.old_new_accuracy(t, tc.class_task, weighting=weighting)
        old_ref, new_ref = zip(
            *(ref_old_new(confs[s], ct, s, weighting) for s in range(S)), strict=True
        )
        assert_same(old, list(old_ref))
        assert_same(new, list(new_ref), exact=True)
    mca_ref = [nanmean(row) for row in acc_ref]
    assert_same(ci.mean_class_accuracy(t, tc.class_task), mca_ref)
    assert_same(ci.average_mean_class_accuracy(t, tc.class_task), sum(mca_ref) / S)
    mca_all = [nanmean(ref_per_class(c)) for c in confs]
    assert_same(ci.average_mean_class_accuracy(t), sum(mca_all) / S)
    for convention in ("peak", "chaudhry"):
        acc = ci.per_class_accuracy(t, tc.class_task)
        forget_ref = ref_forgetting(acc_ref, convention)
        assert_same(ci.per_class_forgetting(acc, convention=convention), forget_ref, exact=True)
        assert_same(ci.mean_class_forgetting(acc, convention=convention), nanmean(forget_ref))
    bias = ci.recency_bias(t, tc.class_task)
    pred_ref, true_ref = zip(*(ref_recency(confs[s], ct, s) for s in range(S)), strict=True)
    assert_same(bias.prediction_share, list(pred_ref), exact=True)
    assert_same(bias.sample_share, list(true_ref), exact=True)

    out, boundaries = ci.confusion_in_arrival_order(t, tc)
    order = [c for classes in task_classes for c in classes]
    order += [c for c in range(C) if c not in order]
    assert out.tolist() == [[[m[a][b] for b in order] for a in order] for m in confs]
    sizes = [len(classes) for classes in task_classes]
    assert boundaries.tolist() == [sum(sizes[:j]) for j in range(T + 1)]


@pytest.mark.parametrize("seed", range(10))
def test_single_matrix_with_first_stage_is_that_stage(seed):
    """Every per-stage function on ``confs[k]`` with ``first_stage=k`` gives entry ``k`` of the
    stacked result (also from a partial stack)."""
    task_classes, C, confs = random_problem(seed)
    class_task = ci.check_task_classes(task_classes, num_classes=C).class_task
    t = torch.tensor(confs, dtype=torch.long)
    for k in range(t.shape[0]):
        for fn in (ci.per_class_accuracy, ci.mean_class_accuracy, ci.seen_accuracy):
            assert_same(
                fn(t[k], class_task, first_stage=k), fn(t, class_task)[k].tolist(), exact=True
            )
            assert_same(
                fn(t[k:], class_task, first_stage=k)[0], fn(t, class_task)[k].tolist(), exact=True
            )
        for fn in (ci.old_new_accuracy, ci.recency_bias):
            single, stacked = fn(t[k], class_task, first_stage=k), fn(t, class_task)
            for a, b in zip(single, stacked, strict=True):
                assert_same(a, b[k].tolist(), exact=True)
        assert_same(
            ci.per_task_accuracy(t[k], class_task),
            ci.per_task_accuracy(t, class_task)[k].tolist(),
            exact=True,
        )


def test_task_weighted_average_matches_accuracy_matrix_module():
    """With every task tested at every stage, the task-weighted average incremental accuracy is
    accuracy_matrix.average_incremental_accuracy of the class-IL accuracy matrix."""
    gen = torch.Generator().manual_seed(3)
    tc = ci.check_task_classes([[4, 1], [0], [2, 3, 5]])
    confs = torch.randint(1, 6, (3, 6, 6), generator=gen)
    R = ci.per_task_accuracy(confs, tc.class_task)
    expected = F.average_incremental_accuracy(R)
    got = ci.average_incremental_seen_accuracy(confs, tc.class_task, weighting="task")
    assert got.item() == pytest.approx(expected.item(), abs=1e-15)
    # and the sample weighting differs here (unequal test-set sizes)
    sample = ci.average_incremental_seen_accuracy(confs, tc.class_task)
    assert abs(sample.item() - got.item()) > 1e-6


# ---------------------------------------------------------------- NaN conventions
def test_nan_conventions():
    class_task = torch.tensor([0, 1])
    empty = torch.zeros(2, 2, 2, dtype=torch.long)
    assert ci.seen_accuracy(empty, class_task).isnan().all()
    assert ci.seen_accuracy(empty, class_task, weighting="task").isnan().all()
    assert ci.mean_class_accuracy(empty, class_task).isnan().all()
    bias = ci.recency_bias(empty, class_task)
    assert bias.prediction_share.isnan().all() and bias.sample_share.isnan().all()
    # one stage only: no old classes, no forgetting
    one = torch.tensor([[[3, 1], [0, 0]]])
    old, new = ci.old_new_accuracy(one, class_task)
    assert old.isnan().all() and new.tolist() == [0.75]
    acc = ci.per_class_accuracy(one, class_task)
    assert ci.per_class_forgetting(acc).isnan().all()
    assert ci.mean_class_forgetting(acc).isnan()
    # a stage with no seen test sample makes the means over stages NaN (not skipped)
    two = torch.cat([one, torch.zeros(1, 2, 2, dtype=torch.long)])
    assert ci.average_incremental_seen_accuracy(two, class_task).isnan()
    assert ci.average_mean_class_accuracy(two, class_task).isnan()
    # a class untested at the final stage has no forgetting; untested earlier stages are skipped
    nan_acc = torch.tensor([[0.5, NAN], [NAN, 0.5], [0.25, NAN]], dtype=torch.float64)
    assert_same(ci.per_class_forgetting(nan_acc), [0.25, NAN], exact=True)
    # new is NaN after the last task (stage 2 of two tasks)
    _, new = ci.old_new_accuracy(one[0], class_task, first_stage=2)
    assert new.isnan()


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("task_classes", "num_classes", "message"),
    [
        ([[0, 1], [1, 2]], None, "class 1 is in task 0 and in task 1; a class belongs to one task"),
        ([[0], [2, 0]], None, "class 0 is in task 0 and in task 1"),
        ([[0, 1], [5]], 5, r"task 1: class id 5 >= num_classes = 5; class ids are 0 \.\. 4"),
        ([[0, 1], []], None, "task 1 has no classes"),
        ([[0], [1, -3]], None, "task 1: class id -3 is negative"),
        ([[0, 2, 2]], None, "task 0 lists class 2 twice"),
        ([], None, "task_classes is empty"),
        ([[0]], 0, "num_classes must be a positive integer"),
    ],
)
def test_check_task_classes_errors(task_classes, num_classes, message):
    with pytest.raises(ValueError, match=message):
        ci.check_task_classes(task_classes, num_classes)


def test_check_task_classes_type_errors():
    with pytest.raises(TypeError, match=r"task 1: class id 1.5 is not an integer"):
        ci.check_task_classes([[0], [1.5]])
    with pytest.raises(TypeError, match="task 0: class id True is not an integer"):
        ci.check_task_classes([[True]])
    with pytest.raises(TypeError, match="task 0: expected a sequence of class ids"):
        ci.check_task_classes([3])
    with pytest.raises(TypeError, match="task 0: classes must be a 1-D integer tensor"):
        ci.check_task_classes([torch.tensor([0.0])])


def test_check_task_classes_normalises():
    tc = ci.check_task_classes([torch.tensor([5, 2]), (0,), [torch.tensor(4)]], num_classes=7)
    assert tc.class_task.dtype == torch.long
    assert tc.class_task.tolist() == [1, -1, 0, -1, 2, 0, -1]
    assert tc.order.tolist() == [5, 2, 0, 4, 1, 3, 6]
    assert tc.boundaries.tolist() == [0, 2, 3, 4]
    assert (tc.num_tasks, tc.num_classes) == (3, 7)
    default = ci.check_task_classes(torch.tensor([[0, 1], [3, 2]]))
    assert default.class_task.tolist() == [0, 0, 1, 1] and default.order.tolist() == [0, 1, 3, 2]


def test_measure_errors():
    class_task = torch.tensor([0, 1])
    confs = torch.ones(2, 2, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="confs must be integer confusion counts"):
        ci.seen_accuracy(confs.double(), class_task)
    with pytest.raises(ValueError, match="confs must be integer confusion counts"):
        ci.seen_accuracy(torch.ones(2, 2, 3, dtype=torch.long), class_task)
    negative = confs.clone()
    negative[1, 0, 1] = -1
    with pytest.raises(ValueError, match=r"confs\[1, 0, 1\] = -1 is negative"):
        ci.per_class_accuracy(negative)
    with pytest.raises(ValueError, match="unknown weighting 'class'"):
        ci.seen_accuracy(confs, class_task, weighting="class")
    with pytest.raises(ValueError, match=r"class_task must be an integer \[C\] = \[2\]"):
        ci.recency_bias(confs, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="first_stage must be a non-negative integer"):
        ci.seen_accuracy(confs, class_task, first_stage=-1)
    with pytest.raises(ValueError, match="unknown forgetting convention"):
        ci.per_class_forgetting(torch.zeros(2, 2), convention="last")
    with pytest.raises(ValueError, match="class_accuracy must be a floating"):
        ci.per_class_forgetting(confs)
    with pytest.raises(ValueError, match="confs has 2 classes but task_classes has 3"):
        ci.confusion_in_arrival_order(confs, ci.check_task_classes([[0, 1, 2]]))


def test_inputs_not_modified_and_exports():
    confs, class_task = hand()
    before = confs.clone(), class_task.clone()
    ci.recency_bias(confs, class_task)
    ci.seen_accuracy(confs, class_task, weighting="task")
    ci.confusion_in_arrival_order(confs, ci.check_task_classes(HAND_TASKS))
    assert torch.equal(confs, before[0]) and torch.equal(class_task, before[1])
    for name in (
        "check_task_classes",
        "task_aware_predictions",
        "task_agnostic_predictions",
        "confusion_counts",
        "seen_accuracy",
        "average_mean_class_accuracy",
        "per_class_forgetting",
        "recency_bias",
        "confusion_in_arrival_order",
    ):
        assert getattr(F, name) is getattr(ci, name)

"""Sparse class-incremental counts: every measure computed from the nonzero cells (a sparse COO
``[S, C, C]``) equals the dense computation (the dense functional path, and the dense
``_measures`` of the code before the counts were sparse, kept here as the reference) on random
counts with classes of no task, classes and tasks without test samples and stages without counts;
the record's per-stage cells, its checkpoint state (``weights_only=True``, and the dense state of
older checkpoints), the ``results.json`` round trip and the cap on the stored cells."""

from __future__ import annotations

import base64
import io
import math
import struct

import pytest
import torch

from continual_eval import functional as F
from continual_eval._class_incremental_recorder import ClassIncrementalRecord
from continual_eval.evaluation import TaskAgnosticAccuracyScorer
from continual_eval.functional import class_incremental as ci
from continual_eval.record import Scored
from continual_eval.results import ClassIncrementalResults, InvalidResultsError
from continual_eval.results.class_incremental import encode_confusion
from continual_eval.results.schema import ClassIncrementalSection


def same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bitwise equal, NaN where NaN."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def random_counts(seed: int, T: int = 5, K: int = 3, extra: int = 2, S: int | None = None):
    """Random task classes (shuffled ids, tasks of 1..K classes, ``extra`` ids of no task) and
    per-stage counts: each class has a fixed number of test samples (some 0: empty classes; one
    task with none at all), spread at every stage over random predicted classes; one stage has
    no counts; the rows of unseen classes hold counts at some stages (future tasks evaluated)."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, K + 1, (T,), generator=g).tolist()
    C = sum(sizes) + extra
    ids = torch.randperm(C, generator=g).tolist()
    task_classes, at = [], 0
    for n in sizes:
        task_classes.append(ids[at : at + n])
        at += n
    class_task = ci.check_task_classes(task_classes, C).class_task
    samples = torch.randint(0, 6, (C,), generator=g)
    samples[torch.randint(0, C, (2,), generator=g)] = 0  # empty classes
    samples[torch.tensor(task_classes[1])] = 0  # an empty task
    S = T if S is None else S
    dense = torch.zeros(S, C, C, dtype=torch.int64)
    for i in range(S):
        if i == 2:
            continue  # a stage without counts
        for c in range(C):
            if class_task[c] > i and (class_task[c] < 0 or bool(torch.rand(1, generator=g) < 0.5)):
                continue  # unseen rows: sometimes counted
            pred = torch.randint(0, C, (int(samples[c]),), generator=g)
            dense[i, c] += torch.bincount(pred, minlength=C)
    return task_classes, class_task, dense


SEEDS = range(6)


@pytest.mark.parametrize("seed", SEEDS)
def test_functional_measures_of_sparse_counts_equal_the_dense_ones(seed):
    _, class_task, dense = random_counts(seed)
    sparse = dense.to_sparse()
    uncoalesced = torch.sparse_coo_tensor(  # every cell split in two entries
        torch.cat([sparse.indices(), sparse.indices()], 1),
        torch.cat([sparse.values() // 2, sparse.values() - sparse.values() // 2]),
        dense.shape,
        check_invariants=True,
    )
    for confs in (sparse, uncoalesced):
        same(F.per_class_accuracy(confs), F.per_class_accuracy(dense))
        same(F.per_class_accuracy(confs, class_task), F.per_class_accuracy(dense, class_task))
        same(F.per_task_accuracy(confs, class_task), F.per_task_accuracy(dense, class_task))
        same(F.mean_class_accuracy(confs, class_task), F.mean_class_accuracy(dense, class_task))
        same(F.average_mean_class_accuracy(confs), F.average_mean_class_accuracy(dense))
        for w in ("sample", "task"):
            same(
                F.seen_accuracy(confs, class_task, weighting=w),
                ci.seen_accuracy(dense, class_task, weighting=w),
            )
            same(
                F.last_accuracy(confs, class_task, weighting=w),
                F.last_accuracy(dense, class_task, weighting=w),
            )
            same(
                F.average_incremental_seen_accuracy(confs, class_task, weighting=w),
                F.average_incremental_seen_accuracy(dense, class_task, weighting=w),
            )
            for a, b in zip(
                F.old_new_accuracy(confs, class_task, weighting=w),
                F.old_new_accuracy(dense, class_task, weighting=w),
                strict=True,
            ):
                same(a, b)
        for a, b in zip(
            F.recency_bias(confs, class_task), F.recency_bias(dense, class_task), strict=True
        ):
            same(a, b)
    # one [C, C] matrix with first_stage, sparse or dense
    for stage in range(len(dense)):
        one = dense[stage].to_sparse()
        same(
            F.seen_accuracy(one, class_task, first_stage=stage),
            F.seen_accuracy(dense[stage], class_task, first_stage=stage),
        )
        for a, b in zip(
            F.recency_bias(one, class_task, first_stage=stage),
            F.recency_bias(dense[stage], class_task, first_stage=stage),
            strict=True,
        ):
            same(a, b)


@pytest.mark.parametrize("seed", SEEDS)
def test_arrival_order_and_encoding_of_sparse_counts(seed):
    task_classes, _, dense = random_counts(seed)
    checked = ci.check_task_classes(task_classes, dense.shape[-1])
    moved, bounds = F.confusion_in_arrival_order(dense.to_sparse(), checked)
    expected, expected_bounds = F.confusion_in_arrival_order(dense, checked)
    assert moved.layout == torch.sparse_coo
    same(moved.to_dense(), expected)
    same(bounds, expected_bounds)
    for matrix in dense:
        assert encode_confusion(matrix.to_sparse()) == encode_confusion(matrix)


def test_sparse_errors_name_the_cell():
    bad = torch.sparse_coo_tensor(torch.tensor([[0], [1], [2]]), torch.tensor([-3]), (2, 3, 3))
    with pytest.raises(ValueError, match=r"confs\[0, 1, 2\] = -3 is negative"):
        F.per_class_accuracy(bad)
    floats = torch.zeros(2, 3, 3).to_sparse()
    with pytest.raises(ValueError, match="confs must be integer confusion counts"):
        F.per_class_accuracy(floats)
    with pytest.raises(ValueError, match="confusion counts must be >= 0"):
        ClassIncrementalResults.compute([[0], [1, 2]], bad)


# ---------------------------------------------------------------- the section's measures
def dense_reference(confusion: torch.Tensor, class_task: torch.Tensor, forgetting: str) -> dict:
    """The measures as the code before the sparse counts computed them: the dense functional
    calls on ``[s, C, C]`` and one forgetting call per stage."""
    accuracy = ci.per_class_accuracy(confusion, class_task)
    nan = torch.tensor(math.nan, dtype=torch.float64)
    curve = [
        ci.mean_class_forgetting(accuracy[: i + 1], convention=forgetting) if i else nan
        for i in range(len(confusion))
    ]
    mca = ci.mean_class_accuracy(confusion, class_task)
    bias = ci.recency_bias(confusion, class_task)
    totals = confusion.sum(-1)
    stage = torch.arange(len(confusion))[:, None]
    seen = (class_task >= 0) & (class_task <= stage) & (totals.sum(-1, keepdim=True) > 0)
    return {
        "test_samples": torch.where(seen, totals, 0).amax(0),
        "per_class_accuracy": accuracy,
        "seen_accuracy": {
            w: ci.seen_accuracy(confusion, class_task, weighting=w) for w in ("sample", "task")
        },
        "old_accuracy": {
            w: ci.old_new_accuracy(confusion, class_task, weighting=w).old
            for w in ("sample", "task")
        },
        "new_accuracy": ci.old_new_accuracy(confusion, class_task).new,
        "mean_class_accuracy": mca,
        "amca_per_stage": torch.cumsum(mca, 0) / torch.arange(1, len(mca) + 1),
        "class_forgetting": ci.per_class_forgetting(accuracy, convention=forgetting),
        "mean_class_forgetting_per_stage": torch.stack(curve).double(),
        "recency_prediction_share": bias.prediction_share,
        "recency_sample_share": bias.sample_share,
    }


def seen_only(dense: torch.Tensor, class_task: torch.Tensor) -> torch.Tensor:
    """The counts a run records: the rows of the seen classes only."""
    stage = torch.arange(len(dense))[:, None]
    seen = (class_task >= 0) & (class_task <= stage)
    return dense * seen[..., None]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("forgetting", ["peak", "chaudhry"])
def test_every_measure_of_the_section_equals_the_dense_computation(seed, forgetting):
    task_classes, class_task, dense = random_counts(seed, T=6, S=6)
    dense = seen_only(dense, class_task)
    section = ClassIncrementalResults.compute(
        task_classes, dense.to_sparse(), forgetting=forgetting
    )
    assert section.confusion.layout == torch.sparse_coo
    same(section.confusion.to_dense(), dense)
    ref = dense_reference(dense, class_task, forgetting)
    for key, expected in ref.items():
        got = getattr(section, key)
        if isinstance(expected, dict):
            for w in expected:
                same(got[w], expected[w])
        else:
            same(got, expected)
    # the undefined values the problem has: an empty task, a stage without counts
    assert torch.isnan(section.per_class_accuracy[:, task_classes[1]]).all()
    assert torch.isnan(section.seen_accuracy["sample"][2])
    # a dense confusion gives the same section
    assert (
        ClassIncrementalResults.compute(task_classes, dense, forgetting=forgetting).to_section()
        == section.to_section()
    )
    # and so does the results.json section read back (counts decoded, measures recomputed)
    again = ClassIncrementalResults.from_section(section.to_section())
    assert again.to_section() == section.to_section()
    same(again.confusion.to_dense(), dense)
    for stage in range(len(dense)):
        same(section.stage_confusion(stage), dense[stage])


def test_a_section_without_stages():
    section = ClassIncrementalResults.compute([[0], [1]], torch.zeros(0, 2, 2, dtype=torch.long))
    assert section.num_stages == 0 and section.num_classes == 2
    assert math.isnan(section.amca) and section.confusion_text == ()


def test_stored_cells_are_capped_when_read(monkeypatch):
    from continual_eval.results import schema

    task_classes, class_task, dense = random_counts(0, T=4, S=4)
    section = ClassIncrementalResults.compute(task_classes, seen_only(dense, class_task))
    document = section.to_section()
    nnz = section.confusion._nnz()
    first = len(document.confusion.stages[0].split())
    monkeypatch.setattr(schema, "MAX_CONFUSION_CELLS", first)
    with pytest.raises(InvalidResultsError) as err:
        check_section(document, 4)
    assert "class_incremental.confusion.stages[1]" in str(err.value)
    assert f"at most {first} nonzero confusion cells" in str(err.value)
    monkeypatch.setattr(schema, "MAX_CONFUSION_CELLS", nnz)
    check_section(document, 4)
    C = document.num_classes  # the per-class tables: stages x classes
    monkeypatch.setattr(schema, "MAX_CLASS_TABLE_CELLS", 4 * C - 1)
    with pytest.raises(InvalidResultsError, match="expected stages \\* num_classes <= "):
        check_section(document, 4)
    monkeypatch.setattr(schema, "MAX_CLASS_TABLE_CELLS", 4 * C)
    check_section(document, 4)


def check_section(section: ClassIncrementalSection, s: int) -> None:
    from continual_eval.results.schema import _Check, _check_class_incremental

    _check_class_incremental(_Check("results.json"), section, len(section.task_classes), s)


# ---------------------------------------------------------------- the record
T_BIG, K = 1000, 2
BIG_CLASSES = [[2 * t, 2 * t + 1] for t in range(T_BIG)]


def blocks_of(stage: int, labels: torch.Tensor, g: torch.Generator, out: torch.Tensor) -> None:
    """The task-agnostic scorer's reduced ``[T, K, C]`` blocks of one stage, written into ``out``:
    each task's test samples (rows ``labels [T, n]``) predicted among the seen classes at
    random."""
    T, n = labels.shape
    pred = torch.randint(0, 2 * min(stage + 1, T), (T, n), generator=g)
    task = torch.arange(T)[:, None].expand(T, n)
    out.zero_().index_put_(
        (task.reshape(-1), labels.reshape(-1), pred.reshape(-1)),
        torch.ones(T * n, dtype=torch.int64),
        accumulate=True,
    )


def new_record(task_classes=BIG_CLASSES) -> ClassIncrementalRecord:
    scorer = TaskAgnosticAccuracyScorer(task_classes)
    return ClassIncrementalRecord(scorer, [f"t{j}" for j in range(len(task_classes))])


@pytest.mark.slow
def test_a_thousand_tasks_of_two_classes_recorded_sparsely_and_round_tripped():
    """T = 1000 tasks x 2 classes (C = 2000; dense per-stage matrices would take 32 GB): the
    record keeps each stage's nonzero cells (at most one per seen test sample), its state goes
    through torch.save / torch.load(weights_only=True), and the section's counts equal a plain
    loop's sums over the blocks of a few stages."""
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, K, (T_BIG, 2), generator=g)  # 2 test samples per task
    record = new_record()
    kept = {}
    blocks = torch.zeros(T_BIG, K, 2 * T_BIG, dtype=torch.int64)
    for stage in range(T_BIG):
        blocks_of(stage, labels, g, blocks)
        scored = Scored({}, {"acc_task_agnostic": blocks}, tuple(range(T_BIG)))
        record.check_stage(stage, scored)
        record.record_stage(stage, scored)
        if stage in (0, 1, 499, 999):
            kept[stage] = blocks.clone()
    assert record.stored_cells <= 2 * sum(range(1, T_BIG + 1))  # <= one per seen test sample
    for stage, blocks in kept.items():  # a plain loop over the seen tasks' nonzero entries
        cells: dict[tuple[int, int], int] = {}
        for j in range(stage + 1):
            for r, p in blocks[j].nonzero().tolist():
                key = (BIG_CLASSES[j][r], p)
                cells[key] = cells.get(key, 0) + int(blocks[j, r, p])
        assert record.stage_counts(stage).tolist() == [
            [t, p, n] for (t, p), n in sorted(cells.items())
        ]
    buffer = io.BytesIO()
    torch.save(record.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert all(m.layout == torch.strided for m in state["cells"].values())  # plain tensors
    again = new_record()
    again.load_state_dict(state)
    assert again.stored_cells == record.stored_cells
    for stage in range(0, T_BIG, 97):
        assert torch.equal(again.stage_counts(stage), record.stage_counts(stage))
        assert again.stage_text(stage) == record.stage_text(stage)
    confusion = record.confusion(T_BIG)
    assert (
        confusion.shape == (T_BIG, 2 * T_BIG, 2 * T_BIG) and confusion._nnz() == record.stored_cells
    )
    section = ClassIncrementalResults.compute(
        BIG_CLASSES, confusion, confusion_text=[record.stage_text(i) for i in range(T_BIG)]
    )
    assert (
        section.test_samples.tolist()
        == torch.bincount(
            (labels + 2 * torch.arange(T_BIG)[:, None]).reshape(-1), minlength=2 * T_BIG
        ).tolist()
    )
    assert again.confusion(T_BIG).indices().equal(confusion.indices())


def small_scored(stage: int, counts: list[list[list[int]]]) -> Scored:
    return Scored({}, {"acc_task_agnostic": torch.tensor(counts)}, (0, 1))


def test_a_stage_past_the_cell_cap_is_refused_and_records_nothing(monkeypatch):
    from continual_eval import _class_incremental_recorder as recorder

    record = new_record([[0, 1], [2]])
    zero = [[0, 0, 0], [0, 0, 0]]
    first = small_scored(0, [[[2, 1, 0], [0, 3, 0]], [[0, 0, 4], zero[0]]])
    record.check_stage(0, first)
    record.record_stage(0, first)
    assert record.stage_counts(0).tolist() == [[0, 0, 2], [0, 1, 1], [1, 1, 3]]
    monkeypatch.setattr(recorder, "MAX_CONFUSION_CELLS", 5)
    second = small_scored(1, [[[1, 1, 1], [0, 3, 0]], [[0, 0, 4], zero[0]]])
    with pytest.raises(ValueError, match=r"stage 1: its confusion counts have 5 nonzero cells"):
        record.check_stage(1, second)
    assert record.stored_cells == 3 and record.stage_counts(1).tolist() == []
    monkeypatch.setattr(recorder, "MAX_CONFUSION_CELLS", 8)
    record.check_stage(1, second)
    record.record_stage(1, second)
    assert record.stage_counts(1).tolist() == [
        [0, 0, 1],
        [0, 1, 1],
        [0, 2, 1],
        [1, 1, 3],
        [2, 2, 4],
    ]
    assert record.stage_text(1) == "0:0:1 0:1:1 0:2:1 1:1:3 2:2:4"


def test_a_state_loads_and_a_bad_one_is_refused():
    record = new_record([[0, 1], [2]])
    cells = torch.tensor([[0, 1, 1], [0, 0, 2], [1, 1, 3]])  # any order: sorted row-major
    record.load_state_dict({"task_classes": [[0, 1], [2]], "cells": {0: cells}})
    assert record.stage_counts(0).tolist() == [[0, 0, 2], [0, 1, 1], [1, 1, 3]]
    dense = torch.tensor([[2, 1, 0], [0, 3, 0], [0, 0, 0]])  # dense per-stage matrices: refused
    with pytest.raises(ValueError, match=r"hold no 'cells'"):
        record.load_state_dict({"task_classes": [[0, 1], [2]], "confusion": {0: dense}})
    with pytest.raises(ValueError, match=r"cell 0 = \[0, 3, 1\] is not"):
        record.load_state_dict(
            {"task_classes": [[0, 1], [2]], "cells": {0: torch.tensor([[0, 3, 1]])}}
        )
    twice = torch.tensor([[0, 1, 1], [0, 1, 2]])
    with pytest.raises(ValueError, match=r"the cell \[0, 1\] is given twice"):
        record.load_state_dict({"task_classes": [[0, 1], [2]], "cells": {0: twice}})
    assert record.stage_counts(0).tolist() == [[0, 0, 2], [0, 1, 1], [1, 1, 3]]  # unchanged


def test_a_sparse_stage_is_plotted_as_its_dense_matrix():
    import matplotlib.pyplot as plt

    from continual_eval import plot_confusion_matrix

    counts = torch.tensor([[5, 2, 0, 1], [0, 4, 0, 0], [0, 0, 0, 0], [1, 0, 2, 2]])
    images = []
    for matrix in (counts, counts.to_sparse()):
        fig, ax = plot_confusion_matrix(matrix, [[2, 0], [1, 3]])
        images.append(ax.images[0].get_array().filled(-1).tolist())
        plt.close(fig)
    assert images[0] == images[1]


def test_the_journal_part_replays_to_the_same_record():
    """A stage's journal line holds its cells (through JSON); replaying them gives the record the
    same counts and section; a bad cell is refused naming the stage and the cell."""
    import json

    from continual_eval.results import ContinualResults, ScoreMatrix

    record = new_record([[0, 1], [2]])
    parts = []
    for stage, counts in enumerate(
        [
            [[[2, 1, 0], [0, 3, 0]], [[0, 0, 4], [0, 0, 0]]],
            [[[1, 1, 1], [0, 3, 0]], [[0, 1, 3], [0, 0, 0]]],
        ]
    ):
        scored = small_scored(stage, counts)
        record.check_stage(stage, scored)
        record.record_stage(stage, scored)
        parts.append(json.loads(json.dumps(record.journal_part(stage))))
    assert record.journal_part(None) is None
    again = ClassIncrementalRecord.from_journal(
        json.loads(json.dumps(record.journal_settings())), ["t0", "t1"]
    )
    for stage, part in enumerate(parts):
        again.replay_part(stage, part)
    assert again.stored_cells == record.stored_cells == 9
    for stage in range(2):
        assert torch.equal(again.stage_counts(stage), record.stage_counts(stage))
    scores = torch.tensor([[0.5, 0.25], [0.5, 0.75]], dtype=torch.float64)
    matrix = ScoreMatrix("accuracy", scores, torch.tensor([0.5, 0.5], dtype=torch.float64))
    base = ContinualResults.from_tensors({"acc": matrix}, task_names=["t0", "t1"])
    assert (
        again.add_to(base).class_incremental.to_section()
        == record.add_to(base).class_incremental.to_section()
    )
    assert parts[0]["dtype"] == "<i4"  # the cells' bytes, not the results.json string
    bad = {"dtype": "<i8", "cells": base64.b64encode(struct.pack("<3q", 3, 0, 1)).decode()}
    with pytest.raises(
        ValueError, match=r"journal's confusion cells of stage 1: cell 0 = \[3, 0, 1\]"
    ):
        again.replay_part(1, bad)
    for part, why in [
        ("3:0:1", r"expected \{'dtype'.* found str \(a journal of an earlier development"),
        ([[0, 0, 1]], r"expected \{'dtype'.* found list"),
        ({"dtype": "<f8", "cells": ""}, r"expected \{'dtype': '<i4' or '<i8'"),
        ({"dtype": "<i4", "cells": "not base64!"}, r"'cells' is not base64 text"),
        ({"dtype": "<i4", "cells": base64.b64encode(bytes(16)).decode()}, r"16 bytes are not"),
    ]:
        with pytest.raises(ValueError, match=r"journal's confusion cells of stage 1: " + why):
            again.replay_part(1, part)
    assert torch.equal(again.stage_counts(1), record.stage_counts(1))  # unchanged
    # a count past int32 is kept exactly (int64 bytes)
    big = new_record([[0, 1], [2]])
    scored = small_scored(0, [[[2**40, 1, 0], [0, 3, 0]], [[0, 0, 4], [0, 0, 0]]])
    big.check_stage(0, scored)
    big.record_stage(0, scored)
    part = json.loads(json.dumps(big.journal_part(0)))
    assert part["dtype"] == "<i8"
    replayed = ClassIncrementalRecord.from_journal(big.journal_settings(), ["t0", "t1"])
    replayed.replay_part(0, part)
    assert torch.equal(replayed.stage_counts(0), big.stage_counts(0))
    assert replayed.stage_text(0) == big.stage_text(0) == "0:0:1099511627776 0:1:1 1:1:3"


# ---------------------------------------------------------------- the record's running sums
def random_run(seed: int, T: int = 6, K: int = 3, extra: int = 2):
    """Task classes over shuffled ids (tasks of 1..K classes, ``extra`` ids of no task) and one
    ``[T, K, C]`` block tensor per stage (the task-agnostic scorer's details): random counts in
    every task's rows, future tasks included, one task without test samples."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, K + 1, (T,), generator=g).tolist()
    C = sum(sizes) + extra
    ids = torch.randperm(C, generator=g).tolist()
    task_classes, at = [], 0
    for n in sizes:
        task_classes.append(ids[at : at + n])
        at += n
    samples = torch.randint(0, 5, (T, K), generator=g)
    samples[1] = 0  # a task without test samples
    stages = []
    for _ in range(T):
        blocks = torch.zeros(T, K, C, dtype=torch.int64)
        for j in range(T):
            for r in range(sizes[j]):
                pred = torch.randint(0, C, (int(samples[j, r]),), generator=g)
                blocks[j, r] = torch.bincount(pred, minlength=C)
        stages.append(blocks)
    return task_classes, C, stages


def plain_confusion(task_classes, C: int, stages) -> torch.Tensor:
    """``[S, C, C]`` dense counts by a plain loop: the seen tasks' blocks, row r of task j's block
    the class ``task_classes[j][r]``."""
    dense = torch.zeros(len(stages), C, C, dtype=torch.int64)
    for i, blocks in enumerate(stages):
        for j in range(i + 1):
            for r, c in enumerate(task_classes[j]):
                for p in range(C):
                    dense[i, c, p] += int(blocks[j, r, p])
    return dense


def record_stages(record: ClassIncrementalRecord, stages, first: int = 0) -> None:
    for stage, blocks in enumerate(stages, first):
        scored = Scored({}, {"acc_task_agnostic": blocks}, tuple(range(len(blocks))))
        record.check_stage(stage, scored)
        record.record_stage(stage, scored)


def functional_section(task_classes, dense: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every per-stage measure by the public functional layer on the dense counts."""
    class_task = F.check_task_classes(task_classes, dense.shape[-1]).class_task
    accuracy = F.per_class_accuracy(dense, class_task)
    bias = F.recency_bias(dense, class_task)
    values = {
        "per_class_accuracy": accuracy,
        "new_accuracy": F.old_new_accuracy(dense, class_task).new,
        "mean_class_accuracy": F.mean_class_accuracy(dense, class_task),
        "class_forgetting": F.per_class_forgetting(accuracy),
        "recency_prediction_share": bias.prediction_share,
        "recency_sample_share": bias.sample_share,
    }
    for w in ("sample", "task"):
        values[f"seen_{w}"] = F.seen_accuracy(dense, class_task, weighting=w)
        values[f"old_{w}"] = F.old_new_accuracy(dense, class_task, weighting=w).old
    return values


def section_values(section: ClassIncrementalResults) -> dict[str, torch.Tensor]:
    values = {
        key: getattr(section, key)
        for key in (
            "per_class_accuracy",
            "new_accuracy",
            "mean_class_accuracy",
            "class_forgetting",
            "recency_prediction_share",
            "recency_sample_share",
        )
    }
    for w in ("sample", "task"):
        values[f"seen_{w}"] = section.seen_accuracy[w]
        values[f"old_{w}"] = section.old_accuracy[w]
    return values


def results_of(num_stages: int, T: int):
    from continual_eval.results import ContinualResults, ScoreMatrix

    scores = torch.full((num_stages, T), 0.5, dtype=torch.float64)
    matrix = ScoreMatrix("accuracy", scores, torch.full((T,), 0.5, dtype=torch.float64))
    return ContinualResults.from_tensors({"acc": matrix}, task_names=[f"t{j}" for j in range(T)])


@pytest.mark.parametrize("seed", range(4))
def test_the_records_running_sums_give_the_functional_measures(seed):
    """The record keeps per stage the sums every measure reads (correct and test samples per
    class, the seen samples predicted as the stage's task): they equal a plain loop's over the
    dense counts, and the section made from them equals, bit for bit, the public functional
    functions on those counts, after every stage, after a stage recorded again, after a
    checkpoint state and after a journal replay (the stage strings through JSON)."""
    import json

    task_classes, C, stages = random_run(seed)
    T = len(task_classes)
    class_task = F.check_task_classes(task_classes, C).class_task
    record = ClassIncrementalRecord(TaskAgnosticAccuracyScorer(task_classes), [""] * T)
    views = {}
    for s in range(1, T + 1):
        record_stages(record, stages[s - 1 : s], first=s - 1)
        dense = plain_confusion(task_classes, C, stages[:s])
        views[s] = (record.confusion(s), dense)
        correct, total, new = record.stage_sums(s)
        for i in range(s):  # a plain loop over the dense counts
            assert correct[i].tolist() == [int(dense[i, c, c]) for c in range(C)]
            assert total[i].tolist() == [int(dense[i, c].sum()) for c in range(C)]
            expected = sum(
                int(dense[i, c, p])
                for c in range(C)
                for p in range(C)
                if 0 <= class_task[c] <= i and class_task[p] == i
            )
            assert int(new[i]) == expected
        section = record.add_to(results_of(s, T)).class_incremental
        reference = functional_section(task_classes, dense)
        for key, value in section_values(section).items():
            same(value, reference[key])
        assert torch.equal(section.confusion.to_dense(), dense)
    for view, dense in views.values():  # the views handed out never change
        assert torch.equal(view.to_dense(), dense)
    # stage 3 recorded again (other counts): the later stages dropped, the earlier views kept
    again = [stages[4], stages[5]]
    record_stages(record, again, first=3)
    dense = plain_confusion(task_classes, C, stages[:3] + again)
    assert record.recorded_stages == 5
    section = record.add_to(results_of(5, T)).class_incremental
    for key, value in section_values(section).items():
        same(value, functional_section(task_classes, dense)[key])
    for view, old in views.values():
        assert torch.equal(view.to_dense(), old)
    expected = section.to_section()
    restored = ClassIncrementalRecord(TaskAgnosticAccuracyScorer(task_classes), [""] * T)
    restored.load_state_dict(record.state_dict())
    replayed = ClassIncrementalRecord.from_journal(record.journal_settings(), [""] * T)
    for stage in range(5):
        part = json.loads(json.dumps(record.journal_part(stage)))
        replayed.replay_part(stage, part)
        assert replayed.stage_text(stage) == record.stage_text(stage)
    for other in (restored, replayed):
        assert other.add_to(results_of(5, T)).class_incremental.to_section() == expected
        assert torch.equal(other.stage_sums(5)[0], record.stage_sums(5)[0])
    # the same as the section computed from the counts alone (no sums given)
    assert ClassIncrementalResults.compute(task_classes, dense).to_section() == expected


def journal_cells(*cells: tuple[int, int, int]) -> dict[str, str]:
    """A journal part of ``cells`` as the journal writes them (int32 bytes, base64)."""
    raw = struct.pack(f"<{3 * len(cells)}i", *(v for cell in cells for v in cell))
    return {"dtype": "<i4", "cells": base64.b64encode(raw).decode()}


def test_a_journal_part_of_bad_cells_is_refused_naming_the_stage():
    record = ClassIncrementalRecord(TaskAgnosticAccuracyScorer([[0, 1], [2]]), ["a", "b"])
    with pytest.raises(ValueError, match=r"stage 0: cell 0 = \[7, 0, 1\]"):
        record.replay_part(0, journal_cells((7, 0, 1)))
    with pytest.raises(ValueError, match=r"stage 0: cell 1 = \[0, 1, -2\]"):
        record.replay_part(0, journal_cells((0, 0, 1), (0, 1, -2)))
    with pytest.raises(ValueError, match=r"stage 0: the cell \[0, 0\] is given twice"):
        record.replay_part(0, journal_cells((0, 0, 1), (0, 0, 2)))
    with pytest.raises(ValueError, match="at most 2 stages"):
        record.replay_part(2, journal_cells((0, 0, 1)))
    assert record.recorded_stages == 0 and record.stored_cells == 0

"""The run record without a Trainer: rows, baseline, curves, costs and the class-incremental
section recorded, refused whole, and round-tripped through a checkpoint file, against plain-loop
references (tests/reference.py) and hand-made counts."""

from __future__ import annotations

import io
import math

import pytest
import torch

from continual_eval._class_incremental_recorder import ClassIncrementalRecord
from continual_eval.evaluation import TaskAgnosticAccuracyScorer, TaskEvaluation
from continual_eval.record import MatrixSpec, RunRecord, Scored
from continual_eval.stage_cost import StageCost
from continual_eval.step_curves import StepCurves
from reference import reference_metrics

NAN = math.nan
T = 3
NAMES = ["a", "b", "c"]
# the rows after each stage and the untrained baseline, of two matrices
ACC = [[0.9, 0.2, 0.1], [0.7, 0.8, 0.3], [0.6, 0.5, 0.95]]
LOSS = [[0.3, 2.0, 2.2], [0.9, 0.4, 1.7], [1.1, 1.2, 0.2]]
BASE = {"acc": [0.3, 0.35, 0.3], "loss": [2.1, 2.3, 2.2]}
TASK_CLASSES = [[0, 1], [2, 3], [4, 5]]


def specs() -> dict[str, MatrixSpec]:
    return {"acc": MatrixSpec("accuracy"), "loss": MatrixSpec("cross_entropy", False, None)}


def row(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def confusion_blocks(stage: int) -> torch.Tensor:
    """``[T, 2, 6]`` blocks as the task-agnostic scorer reports them: row r of task j counts the
    samples of class ``TASK_CLASSES[j][r]`` by predicted class (made-up counts; every class has
    6 test samples at every stage, as fixed test sets give)."""
    blocks = torch.zeros(T, 2, 6, dtype=torch.int64)
    for j in range(T):
        for r, c in enumerate(TASK_CLASSES[j]):
            blocks[j, r, c] = 5 - stage  # right
            blocks[j, r, (c + 2) % 6] = 1 + stage  # taken for a class of the next task
    return blocks


def scored(stage: int, *, agnostic: bool = False) -> Scored:
    rows = {"acc": row(ACC[stage]), "loss": row(LOSS[stage])}
    details = {}
    if agnostic:
        rows["acc_task_agnostic"] = row(ACC[stage])
        details["acc_task_agnostic"] = confusion_blocks(stage)
    return Scored(rows, details, tuple(range(T)))


def baseline(*, agnostic: bool = False) -> Scored:
    rows = {name: row(values) for name, values in BASE.items()}
    if agnostic:
        rows["acc_task_agnostic"] = row(BASE["acc"])
    return Scored(rows, {}, tuple(range(T)))


def cost(stage: int) -> StageCost:
    return StageCost(stage, 1.5 + stage, 0.25, 1000, "process_peak_rss", 10, 10, 32, 4, None)


def class_incremental_record(**kwargs) -> RunRecord:
    agnostic = TaskAgnosticAccuracyScorer(TASK_CLASSES)
    matrices = {**specs(), "acc_task_agnostic": MatrixSpec.of(agnostic)}
    section = ClassIncrementalRecord(agnostic, NAMES)
    return RunRecord(matrices, NAMES, sections=[section], **kwargs)


def filled(record: RunRecord, stages: int = T) -> RunRecord:
    agnostic = "acc_task_agnostic" in record.specs
    record.record_baseline(baseline(agnostic=agnostic))
    for i in range(stages):
        record.record_stage(i, scored(i, agnostic=agnostic), cost(i))
        if record.step_curves:  # the stage end's point of every curve
            record.record_step(3 * (i + 1), i, scored(i, agnostic=agnostic).rows, full=True)
    return record


def test_rows_baseline_and_metrics_equal_the_plain_loops():
    record = filled(RunRecord(specs(), NAMES))
    assert record.num_stages == T and record.baseline_done
    assert record.matrices["acc"].scores.tolist() == ACC
    assert record.matrices["loss"].baseline.tolist() == BASE["loss"]
    results = record.continual_results()
    for name, R, hib in (("acc", ACC, True), ("loss", LOSS, False)):
        expected = reference_metrics(R, BASE[name], "peak", higher_is_better=hib)
        got = results.matrices[name].metrics
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, abs=1e-12), (name, key)
    assert [c.stage for c in results.cost.per_stage] == [0, 1, 2]
    assert results.task_names == tuple(NAMES) and results.run_id == record.run_id


def test_step_curves_and_their_replacement_at_a_stage_end():
    record = RunRecord(specs(), NAMES, step_curves=True)
    record.record_baseline(baseline())
    part = {"acc": row([0.5, NAN, NAN]), "loss": row([1.0, NAN, NAN])}
    assert record.record_step(2, 0, part, full=True) is None
    record.record_stage(0, scored(0))
    # the stage end at the step of the last per-step evaluation replaces it
    replaced = record.record_step(2, 0, scored(0).rows, full=True)
    assert replaced is not None and replaced["acc"][0].item() == 0.5
    record.record_step(5, 1, scored(1).rows, full=False)
    steps, stage, acc = record.curves.tensors(T, "acc")
    assert steps.tolist() == [2, 5] and stage.tolist() == [0, 1]
    assert acc[0, 0].item() == ACC[0][0] and math.isnan(acc[0, 1])  # later tasks NaN
    assert acc[1, :2].tolist() == ACC[1][:2]
    results = record.continual_results()
    assert results.steps is not None and results.steps.full == (True, False)
    assert results.matrices["loss"].step_scores[1, 1].item() == LOSS[1][1]


@pytest.mark.parametrize("bad", ["cell", "missing", "order", "section"])
def test_a_refused_stage_records_nothing(bad):
    record = filled(class_incremental_record(), stages=1)
    before = record.state_dict()
    stage = 1
    good = scored(stage, agnostic=True)
    rows, details = dict(good.rows), dict(good.details)
    if bad == "cell":  # the last matrix's row is the bad one: the first ones must stay unchanged
        rows["acc_task_agnostic"] = row([0.7, 1.5, 0.3])
        match = r"stage 1 produced 'acc_task_agnostic' scores .* 1\.5 is outside \[0, 1\]"
    elif bad == "missing":
        del rows["loss"]
        match = "stage 1 produced 'loss' scores .*: the evaluation has no 'loss' row"
    elif bad == "order":
        stage, match = 2, "stage 2 cannot be recorded after 1 stages"
    else:  # the class-incremental section refuses an evaluation without confusion counts
        details = {}
        match = "no confusion counts of the 'acc_task_agnostic' scorer"
    with pytest.raises(ValueError, match=match):
        record.record_stage(stage, Scored(rows, details, good.task_ids), cost(stage))
    after = record.state_dict()
    assert torch.equal(record.matrices["acc"].scores, row([ACC[0]]))
    assert after["costs"] == before["costs"] and record.num_stages == 1
    torch.testing.assert_close(after["sections"], before["sections"], rtol=0, atol=0)


def test_a_refused_baseline_records_nothing():
    record = RunRecord(specs(), NAMES)
    rows = {"acc": row(BASE["acc"]), "loss": row([2.1, NAN, 2.2])}  # b[1] is read by FWT
    with pytest.raises(ValueError, match=r"untrained model's 'loss' scores \(the baseline\)"):
        record.record_baseline(Scored(rows))
    assert not record.baseline_done
    assert torch.isnan(record.matrices["acc"].baseline).all()


def test_class_incremental_confusion_of_the_seen_tasks_from_the_details():
    record = filled(class_incremental_record())
    section = record.sections["class_incremental"]
    assert isinstance(section, ClassIncrementalRecord)
    confusion = section.confusion(T)
    assert confusion.layout == torch.sparse_coo and confusion.shape == (T, 6, 6)
    dense = confusion.to_dense()
    for stage in range(T):
        expected = torch.zeros(6, 6, dtype=torch.int64)
        blocks = confusion_blocks(stage)
        for j in range(stage + 1):  # the seen tasks only
            for r, c in enumerate(TASK_CLASSES[j]):
                expected[c] += blocks[j, r]
        assert torch.equal(dense[stage], expected), stage
        # one stage's counts on their own: the nonzero cells, row-major
        cells = [[t, p, int(expected[t, p])] for t in range(6) for p in range(6) if expected[t, p]]
        assert section.stage_counts(stage).tolist() == cells, stage
        assert section.stage_text(stage) == " ".join(f"{t}:{p}:{n}" for t, p, n in cells)
    assert section.stored_cells == sum(len(section.stage_counts(i)) for i in range(T))
    results = record.continual_results()
    assert results.class_incremental is not None
    assert [list(c) for c in results.class_incremental.task_classes] == TASK_CLASSES


def test_inverted_class_incremental_accuracies_are_reported_not_raised():
    record = filled(class_incremental_record(), stages=0)
    rows = dict(scored(0, agnostic=True).rows)
    rows["acc_task_aware"] = row([0.5, 0.1, 0.1])  # not a matrix of this record: only compared
    notes = record.record_stage(0, Scored(rows, scored(0, agnostic=True).details, (0, 1, 2)))
    assert len(notes) == 1 and "a (0.5000 < 0.9000)" in notes[0]


def test_state_dict_round_trip_through_a_checkpoint_file_without_a_trainer():
    record = class_incremental_record(step_curves=True, metadata={"method": "finetune"})
    filled(record, stages=2)
    record.record_step(7, 2, scored(2, agnostic=True).rows, full=False)
    record.steps_trained = 7
    buffer = io.BytesIO()
    torch.save(record.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # as Lightning loads checkpoints

    again = class_incremental_record(step_curves=True, metadata={"method": "finetune"})
    again.load_state_dict(state)
    assert again.run_id == record.run_id and again.steps_trained == 7
    assert again.continual_results().to_dict() == record.continual_results().to_dict()
    # and it goes on recording as the original does
    for r in (record, again):
        r.record_stage(2, scored(2, agnostic=True), cost(2))
        r.record_step(9, 2, scored(2, agnostic=True).rows, full=True)
    assert again.continual_results().to_dict() == record.continual_results().to_dict()


def test_a_state_of_other_settings_is_refused_and_changes_nothing():
    state = filled(RunRecord(specs(), NAMES, forgetting="chaudhry")).state_dict()
    other = filled(RunRecord(specs(), NAMES), stages=1)
    with pytest.raises(ValueError, match="forgetting: recorded 'chaudhry', now 'peak'"):
        other.load_state_dict(state)
    assert other.num_stages == 1
    fewer = RunRecord({"acc": MatrixSpec("accuracy")}, NAMES, forgetting="chaudhry")
    with pytest.raises(ValueError, match="scorers: recorded"):
        fewer.load_state_dict(state)
    sections = class_incremental_record(forgetting="chaudhry")
    with pytest.raises(ValueError, match="sections: recorded"):
        sections.load_state_dict(state)
    # a class-incremental state of other task classes
    ci_state = filled(class_incremental_record()).state_dict()
    agnostic = TaskAgnosticAccuracyScorer([[1, 0], [2, 3], [4, 5]])
    moved = RunRecord(
        {**specs(), "acc_task_agnostic": MatrixSpec.of(agnostic)},
        NAMES,
        sections=[ClassIncrementalRecord(agnostic, NAMES)],
    )
    with pytest.raises(ValueError, match="other task_classes"):
        moved.load_state_dict(ci_state)
    assert moved.num_stages == 0 and not moved.baseline_done


def test_scored_from_an_evaluation_spreads_rows_over_the_tasks():
    evaluation = TaskEvaluation(
        task_ids=(0, 2),
        scores=row([0.5, 0.25]),
        correct=torch.tensor([1, 1]),
        total=torch.tensor([2, 4]),
        scores_by_scorer=(row([0.5, 0.25]), row([1.0, 2.0])),
        scorer_names=("accuracy", "cross_entropy"),
        details_by_scorer=(None, "counts"),
    )
    result = Scored.from_evaluation(["acc", "loss"], evaluation, 3)
    assert result.rows["acc"][[0, 2]].tolist() == [0.5, 0.25] and math.isnan(result.rows["acc"][1])
    assert result.details == {"loss": "counts"} and result.task_ids == (0, 2)


def test_step_curves_state_refuses_rows_of_other_lengths():
    curves = StepCurves(["acc", "loss"])
    subset = {"acc": row([0.4, 0.4, 0.3]), "loss": row([1.1, 0.8, 0.6])}
    assert curves.add(4, 0, subset, full=False) is None
    # a stage end at the step of a subset evaluation replaces it; a subset row is not returned
    full = {"acc": row([0.5, 0.4, 0.3]), "loss": row([1.0, 0.8, 0.6])}
    assert curves.add(4, 0, full, full=True) is None
    assert len(curves) == 1 and curves.full == [True]
    state = curves.state_dict()
    again = StepCurves(["acc", "loss"])
    again.load_state_dict(state)
    loss = again.tensors(3, "loss")[2]
    assert loss[0, 0].item() == 1.0 and torch.isnan(loss[0, 1:]).all()  # tasks after stage 0
    state["rows"]["loss"].pop()
    with pytest.raises(ValueError, match="0 'loss' rows"):
        StepCurves(["acc", "loss"]).load_state_dict(state)
    with pytest.raises(ValueError, match="recorded for the scorers"):
        StepCurves(["acc"]).load_state_dict(curves.state_dict())

"""``ContinualResults``, the typed results of a run: every matrix's metric family against the
plain-loop reference (``metrics`` exactly the last point of ``metrics_per_stage``), per-matrix
step curves and stability against hand-written loops in both directions, the document it writes
(accepted by the schema, read back equal), its CSV files, the metric family listed once, and the
step-curves recorder."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from continual_eval import ContinualMetrics
from continual_eval import functional as F
from continual_eval.functional.family import (
    CURVE_KEYS,
    METRIC_FAMILY,
    METRIC_KEYS,
    METRIC_TITLES,
    PER_TASK_KEYS,
    REPORT_KEYS,
)
from continual_eval.report import REPORT_METRICS
from continual_eval.results import (
    ContinualResults,
    InvalidResultsError,
    ReferenceScores,
    RunCost,
    ScoreMatrix,
    Stability,
    StepEvaluations,
    check_results_files,
)
from continual_eval.results.schema import convert_document
from reference import reference_curve, reference_metrics, reference_per_task

NAN = math.nan
T = 3


def stream(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    R = torch.rand(T, T, generator=g, dtype=torch.float64)
    R[0, 2] = NAN  # a cell no metric reads
    return R, torch.rand(T, generator=g, dtype=torch.float64)


def step_evaluations() -> tuple[StepEvaluations, dict[str, torch.Tensor]]:
    """Two evaluations per stage (the second is the stage end), rows for an accuracy and a loss
    matrix; tasks after the stage are NaN."""
    g = torch.Generator().manual_seed(3)
    stage = torch.tensor([0, 0, 1, 1, 2, 2])
    steps = StepEvaluations(torch.tensor([2, 4, 6, 8, 10, 12]), stage, (False, True) * 3)
    rows = {}
    for name, scale in (("acc", 1.0), ("loss", 3.0)):
        values = torch.rand(6, T, generator=g, dtype=torch.float64) * scale
        values[torch.arange(T)[None, :] > stage[:, None]] = NAN
        rows[name] = values
    return steps, rows


def two_matrices(with_steps: bool = True) -> ContinualResults:
    R, b = stream()
    loss, loss_b = 2.0 * stream(1)[0], 2.0 * stream(1)[1]
    steps, rows = step_evaluations()
    return ContinualResults.from_tensors(
        {
            "acc": ScoreMatrix("accuracy", R, b, step_scores=rows["acc"] if with_steps else None),
            "loss": ScoreMatrix(
                "cross_entropy",
                loss,
                loss_b,
                higher_is_better=False,
                bounds=None,
                step_scores=rows["loss"] if with_steps else None,
            ),
        },
        task_names=["a", "b", "c"],
        metadata={"method": "naive", "seed": 0},
        run_id="r0",
        steps=steps if with_steps else None,
    )


def roundtrip(document: dict) -> dict:
    return json.loads(json.dumps(document, allow_nan=False))


def same(a: torch.Tensor, b) -> bool:
    b = torch.as_tensor(b, dtype=torch.float64)
    return a.shape == b.shape and torch.equal(a.nan_to_num(-7.0), b.nan_to_num(-7.0))


# ---------------------------------------------------------------------- the metric family
@pytest.mark.parametrize("stages", [0, 1, 2, 3])
def test_each_matrix_family_equals_the_plain_loops_and_metrics_end_the_curves(stages):
    results = two_matrices(with_steps=False)
    full = two_matrices(with_steps=False)
    if stages < T:  # the same run after fewer stages
        results = ContinualResults.from_tensors(
            {
                name: ScoreMatrix(
                    m.score, m.scores[:stages], m.baseline, m.higher_is_better, m.bounds
                )
                for name, m in full.matrices.items()
            },
            task_names=full.task_names,
        )
    assert results.stages_completed == stages and results.primary_name == "acc"
    for matrix in results:
        assert set(matrix.metrics) == set(METRIC_KEYS)
        assert set(matrix.metrics_per_stage) == set(CURVE_KEYS)
        assert set(matrix.per_task) == set(PER_TASK_KEYS)
        if stages == 0:
            assert all(math.isnan(v) for v in matrix.metrics.values())
            continue
        for key in METRIC_KEYS:  # one pass: exactly the last point, not approximately
            assert matrix.metrics[key] == matrix.metrics_per_stage[key][-1].item()
        R = matrix.scores[:, :stages].tolist()
        b = matrix.baseline[:stages].tolist()
        hib = matrix.higher_is_better
        curve = reference_curve(R, b, higher_is_better=hib)
        for key in CURVE_KEYS:
            assert matrix.metrics_per_stage[key].tolist() == pytest.approx(curve[key], abs=1e-12)
        per_task = reference_per_task(R, b, [0.0] * stages, higher_is_better=hib)
        for key in PER_TASK_KEYS:
            assert matrix.per_task[key].tolist() == pytest.approx(per_task[key], abs=1e-12)
        final = reference_metrics(R, b, higher_is_better=hib)
        assert matrix.metrics == pytest.approx(final, abs=1e-12)


def test_metric_family_is_listed_once():
    assert F.CURVE_KEYS == CURVE_KEYS  # the functional layer reads the family
    R, b = stream()
    assert set(F.continual_metrics_curve(R, b)) == set(CURVE_KEYS)
    assert set(F.all_continual_metrics(R, b)["per_task"]) == set(PER_TASK_KEYS)
    metric = ContinualMetrics(T, dtype=torch.float64)
    metric.update_baseline(b)
    for row in R:
        metric.update(row)
    assert tuple(metric.compute()) == METRIC_KEYS
    assert tuple(REPORT_METRICS) == REPORT_KEYS
    assert {k: METRIC_TITLES[k] for k in REPORT_KEYS} == REPORT_METRICS
    assert {m.key for m in METRIC_FAMILY} == {*CURVE_KEYS, *REPORT_KEYS}
    document = ContinualResults.from_tensors({"acc": ScoreMatrix("accuracy", R, b)}).to_dict()
    assert tuple(document["metrics"]) == METRIC_KEYS
    assert tuple(document["metrics_per_stage"]) == CURVE_KEYS
    assert tuple(document["per_task"]) == PER_TASK_KEYS


# ---------------------------------------------------------------------- step curves
def hand_stability(steps, stages, rows, higher_is_better):
    """min-ACC, WC-ACC and the gap written out with loops; a loss's worst is its maximum."""
    worse = max if not higher_is_better else min
    S = max(stages) + 1
    last = [max(n for n in range(len(stages)) if stages[n] == s) for s in range(S)]
    min_acc, wc_acc = [NAN], [rows[last[0]][0]]
    for k in range(1, S):
        worst = [
            worse(rows[n][i] for n in range(len(rows)) if i < stages[n] <= k) for i in range(k)
        ]
        min_acc.append(sum(worst) / k)
        wc_acc.append(rows[last[k]][k] / (k + 1) + (1 - 1 / (k + 1)) * min_acc[-1])
    depth = []
    for j in range(S - 1):
        boundary = rows[last[j]][j]
        low = worse(rows[n][j] for n in range(len(rows)) if stages[n] == j + 1)
        depth.append(boundary - low if higher_is_better else low - boundary)
    return min_acc, wc_acc, depth


def test_every_matrix_has_its_step_curves_and_stability_in_its_direction():
    results = two_matrices()
    steps, rows = step_evaluations()
    for name, hib in (("acc", True), ("loss", False)):
        matrix = results[name]
        assert same(matrix.step_scores, rows[name])
        got_steps, _, got_rows = results.curves(name)
        assert got_steps.tolist() == steps.step.tolist() and same(got_rows, rows[name])
        min_acc, wc_acc, depth = hand_stability(
            steps.step.tolist(), steps.stage.tolist(), rows[name].tolist(), hib
        )
        assert matrix.stability is not None
        assert math.isnan(matrix.stability.min_acc[0])
        assert matrix.stability.min_acc[1:].tolist() == pytest.approx(min_acc[1:], abs=1e-12)
        assert matrix.stability.wc_acc.tolist() == pytest.approx(wc_acc, abs=1e-12)
        assert matrix.stability.per_task["depth"].tolist() == pytest.approx(depth, abs=1e-12)
    document = roundtrip(results.to_dict())
    back = ContinualResults.from_dict(document)
    # the primary's curves stay at the top level; every matrix holds its own rows
    assert document["curves"]["accuracy"] == document["matrices"]["acc"]["step_scores"]
    assert document["stability"] == document["matrices"]["acc"]["stability"]
    assert document["curves"]["full"] == [False, True] * 3
    for name in ("acc", "loss"):
        _, _, rows_back = back.curves(name)
        assert same(rows_back, rows[name])


def test_stability_reads_completed_stages_only():
    steps, rows = step_evaluations()
    early = Stability.compute(rows["acc"], steps, 2)
    assert len(early.min_acc) == 2 and len(early.per_task["depth"]) == 1
    none = Stability.compute(rows["acc"], steps, 0)
    assert none.min_acc.numel() == 0 and none.to_section().per_task["depth"] == []


# ---------------------------------------------------------------------- documents
def test_document_round_trips_through_its_files(tmp_path):
    two = two_matrices()
    document = roundtrip(two.to_dict())
    assert document["format_version"] == 2 and list(document["matrices"]) == ["acc", "loss"]
    assert document["scores"] == document["matrices"]["acc"]["scores"]
    assert document["matrices"]["loss"]["higher_is_better"] is False
    assert document["matrices"]["loss"]["bounds"] is None
    back = ContinualResults.from_dict(document)
    assert roundtrip(back.to_dict()) == document
    for name in ("acc", "loss"):
        assert same(back[name].scores, two[name].scores)
        assert same(back[name].baseline, two[name].baseline)
        assert back[name].metrics == pytest.approx(two[name].metrics, nan_ok=True)
    path = two.write(tmp_path)
    assert path == tmp_path / "results.json" and check_results_files(tmp_path) is None
    assert sorted(p.name for p in tmp_path.glob("*.csv")) == ["scores.csv", "scores_loss.csv"]
    loaded = ContinualResults.load(tmp_path)
    assert roundtrip(loaded.to_dict()) == document
    lines = (tmp_path / "scores_loss.csv").read_text().splitlines()
    assert [float(v) for v in lines[-1].split(",")[1:]] == two["loss"].scores[-1].tolist()
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["files"]["scores_loss.csv"]["stages"] == T  # the commit record
    assert on_disk == document == two.to_dict()  # to_dict() holds the same files entry


def test_csv_cells_are_data_for_a_spreadsheet(tmp_path):
    """A task named like a formula is neutralised in every CSV (OWASP); numbers stay numbers."""
    R, b = stream()
    names = ['=HYPERLINK("http://evil.test","x")', "+cmd", "-0.5"]
    loss = ScoreMatrix("cross_entropy", -R, b, higher_is_better=False, bounds=None)
    ContinualResults.from_tensors(
        {"acc": ScoreMatrix("accuracy", R, b), "loss": loss}, task_names=names
    ).write(tmp_path)
    for name in ("scores.csv", "scores_loss.csv"):
        rows = list(csv.reader((tmp_path / name).open(newline="")))
        assert rows[0] == ["stage", "'" + names[0], "'+cmd", "-0.5"]
        assert rows[1][0] == "baseline" and rows[2][3] == ""  # R[0, 2] was not evaluated
    negative = list(csv.reader((tmp_path / "scores_loss.csv").open(newline="")))[-1]
    assert [float(v) for v in negative[1:]] == (-R[-1]).tolist()  # negative cells stay numbers


@pytest.mark.parametrize(
    ("mutate", "field", "problem"),
    [
        (lambda d: d.pop("curves"), "matrices.acc.step_scores", "without a curves section"),
        (
            lambda d: d["matrices"]["loss"]["step_scores"].pop(),
            "matrices.loss.step_scores",
            "array of 6 items, found array of 5",
        ),
        (
            lambda d: d["matrices"]["loss"]["step_scores"][0].__setitem__(0, "x"),
            "matrices.loss.step_scores[0][0]",
            "finite number or null",
        ),
        (
            lambda d: d["matrices"]["loss"]["stability"].__setitem__("wc_acc", [0.1] * 4),
            "matrices.loss.stability.wc_acc",
            "at most 3 items",
        ),
    ],
)
def test_schema_checks_per_matrix_curves(mutate, field, problem):
    document = roundtrip(two_matrices().to_dict())
    mutate(document)
    with pytest.raises(InvalidResultsError) as info:
        convert_document(document)
    assert info.value.field == field and problem in info.value.problem


def test_inconsistent_matrices_refused():
    R, b = stream()
    with pytest.raises(ValueError, match=r"matrix 'b' has scores \(2, 3\)"):
        ContinualResults.from_tensors(
            {"a": ScoreMatrix("accuracy", R, b), "b": ScoreMatrix("accuracy", R[:2], b)}
        )
    with pytest.raises(ValueError, match="2 task names for 3 tasks"):
        ContinualResults.from_tensors({"a": ScoreMatrix("accuracy", R, b)}, task_names="ab")
    with pytest.raises(KeyError, match="no matrix 'f1'"):
        two_matrices()["f1"]


def test_stale_temporaries_of_every_csv_removed(tmp_path):
    import subprocess
    import sys

    from continual_eval.results.files import remove_stale_temporaries

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    names = ["scores_loss.csv", "results.json", "scores.csv", "notes.csv", "scores_x.txt"]
    for name in names:
        (tmp_path / f".{name}.{pid}.tmp").write_text("partial")
    removed = sorted(p.name for p in remove_stale_temporaries(tmp_path))
    assert removed == sorted(f".{n}.{pid}.tmp" for n in names[:3])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f".{n}.{pid}.tmp" for n in names[3:]
    )


# ---------------------------------------------------------------------- cost, reference, plasticity
def with_new_sections(kind: str = "isolated", lca_beta: int | None = 1) -> ContinualResults:
    from continual_eval.stage_cost import StageCost

    R, b = stream()
    steps, rows = step_evaluations()
    costs = tuple(
        StageCost(
            i, 1.5 * (i + 1), 0.25, 1000 + i, "process_peak_rss", 10 * (i + 1), 10, 8, 2, None
        )
        for i in range(T)
    )
    return ContinualResults.from_tensors(
        {"acc": ScoreMatrix("accuracy", R, b, step_scores=rows["acc"])},
        steps=steps,
        cost=RunCost(costs),
        reference=ReferenceScores(
            kind, torch.tensor([0.9, NAN, 0.7]), auc=torch.tensor([0.5, 0.4, 0.6])
        ),
        lca_beta=lca_beta,
    )


def test_new_sections_round_trip_and_follow_the_loops():
    results = with_new_sections()
    document = roundtrip(results.to_dict())
    back = ContinualResults.from_dict(document)
    assert roundtrip(back.to_dict()) == document
    R, _ = stream()
    ref = [0.9, NAN, 0.7]
    section = document["reference"]
    expected = [ref[j] - float(R[j, j]) for j in range(T)]
    assert section["intransigence_per_task"][0] == pytest.approx(expected[0])
    assert section["intransigence_per_task"][1] is None  # no reference for task 1
    assert section["intransigence"] is None and section["per_stage"]["intransigence"][1] is None
    assert section["fwt_isolated_per_task"][1] == pytest.approx(float(R[2, 2]) - 0.7)
    assert section["per_stage"]["fwt_isolated"][0] is None
    cost = document["cost"]
    assert cost["summary"]["train_seconds"] == pytest.approx(1.5 + 3.0 + 4.5)
    assert cost["summary"]["model_size_efficiency"] == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert back.cost.model_size_efficiency_at(1) == pytest.approx(0.75)
    # without stage 0's cost (a run resumed from a checkpoint written before costs were
    # recorded) MS has no reference size: absent in the summary, in every stage's value and in
    # the logs, never the MS of the stages that happen to be recorded
    from dataclasses import replace

    from continual_eval.loggers import stage_scalars

    later = replace(back, cost=RunCost(back.cost.per_stage[1:]))
    assert later.cost.summary["model_size_efficiency"] is None
    assert [later.cost.model_size_efficiency_at(i) for i in range(T)] == [None] * T
    scalars = stage_scalars(later, 2)
    assert "continual/cost/samples" in scalars
    assert "continual/cost/model_size_efficiency" not in scalars
    plasticity = document["matrices"]["acc"]["plasticity"]
    assert plasticity["lca"]["beta"] == 1 and plasticity["auc_forward_transfer"] is not None
    # a joint reference is no isolated training: its FWT is absent, never 0
    joint = roundtrip(with_new_sections("joint", None).to_dict())
    assert joint["reference"]["fwt_isolated"] is None
    assert joint["matrices"]["acc"]["plasticity"]["lca"] is None
    assert ContinualResults.from_dict(joint).primary.plasticity.lca is None


@pytest.mark.parametrize(
    ("mutate", "field", "problem"),
    [
        (lambda d: d["cost"].pop("per_stage"), "cost.per_stage", "missing"),
        (
            lambda d: d["cost"]["per_stage"][0].__setitem__("samples", -1),
            "cost.per_stage[0].samples",
            "integer >= 0",
        ),
        (
            lambda d: d["cost"]["per_stage"][1].__setitem__("stage", 3),
            "cost.per_stage[1].stage",
            r"integer in \[0, 2\]",
        ),
        (
            lambda d: d["cost"]["per_stage"][0].__setitem__("replay_memory", "x"),
            "cost.per_stage[0].replay_memory",
            "integer",
        ),
        (lambda d: d["reference"]["scores"].pop(), "reference.scores", "array of 3 items"),
        (
            lambda d: d["reference"].__setitem__("intransigence", "x"),
            "reference.intransigence",
            "finite",
        ),
        (
            lambda d: d["reference"]["fwt_isolated_per_task"].append(0.1),
            "reference.fwt_isolated_per_task",
            "array of 2 items",
        ),
        (
            lambda d: d["matrices"]["acc"]["plasticity"]["lca"].__setitem__("beta", -1),
            "matrices.acc.plasticity.lca.beta",
            "integer >= 0",
        ),
        (
            lambda d: d["matrices"]["acc"]["plasticity"].__setitem__("anytime_accuracy", "x"),
            "matrices.acc.plasticity.anytime_accuracy",
            "finite number or null",
        ),
    ],
)
def test_schema_checks_the_new_sections(mutate, field, problem):
    document = roundtrip(with_new_sections().to_dict())
    mutate(document)
    with pytest.raises(InvalidResultsError, match=problem) as err:
        convert_document(document)
    assert err.value.field == field


def test_scoring_mode_round_trips_and_unknown_modes_are_refused():
    """``scoring`` (teacher-forced / free-running) goes into the matrix's section, reads back,
    is absent for a score that is neither, and a file or a scorer with another value is
    refused naming it."""
    import copy

    from continual_eval.record import MatrixSpec
    from continual_eval.results import ContinualResults, InvalidResultsError, ScoreMatrix

    R = torch.tensor([[2.0, 9.0], [3.0, 1.5]], dtype=torch.float64)
    b = torch.tensor([20.0, 20.0], dtype=torch.float64)
    acc = torch.tensor([[0.9, 0.1], [0.6, 0.95]], dtype=torch.float64)
    results = ContinualResults.from_tensors(
        {
            "acc": ScoreMatrix("accuracy", acc, torch.tensor([0.5, 0.5], dtype=torch.float64)),
            "ppl": ScoreMatrix(
                "perplexity",
                R,
                b,
                higher_is_better=False,
                bounds=(1.0, math.inf),
                scoring="teacher-forced",
            ),
        }
    )
    document = results.to_dict()
    assert document["matrices"]["ppl"]["scoring"] == "teacher-forced"
    assert "scoring" not in document["matrices"]["acc"]
    assert ContinualResults.from_dict(document)["ppl"].scoring == "teacher-forced"
    broken = copy.deepcopy(document)
    broken["matrices"]["ppl"]["scoring"] = "beam-search"
    with pytest.raises(InvalidResultsError, match=r"matrices\.ppl\.scoring"):
        ContinualResults.from_dict(broken)

    class Odd:
        name, higher_is_better, bounds, scoring = "odd", True, (0.0, 1.0), "sometimes"

    with pytest.raises(ValueError, match="scorer 'odd': scoring must be one of"):
        MatrixSpec.of(Odd())

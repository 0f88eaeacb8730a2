"""The results.json schema: it accepts every document the callback writes (a real run with
per-step curves, documents with and without curves, a large T quickly) and refuses a malformed,
hostile or oversized one with an error naming the file and the JSON path of the field: wrong
types, lengths, cells outside their matrix's bounds, a top level that disagrees with the primary
matrix, impossible confusion counts."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from continual_eval import StepEvaluation
from continual_eval.experiments.logistic import CircleGridTasks, LogisticClassifier
from continual_eval.experiments.stream import fit_stream
from continual_eval.results import (
    ClassIncrementalResults,
    ContinualResults,
    InvalidResultsError,
    ReferenceScores,
    ScoreMatrix,
    StepEvaluations,
)
from continual_eval.results.files import read_document
from continual_eval.results.schema import (
    MAX_DEPTH,
    MAX_NAME_LENGTH,
    MAX_TASKS,
    convert_document,
    decode_document,
)


def results(
    T: int = 3, s: int = 3, curves: bool = True, seed: int = 0, **options: Any
) -> ContinualResults:
    """A run as the callback records it: R, baseline, curves with a subset, metadata."""
    g = torch.Generator().manual_seed(seed)
    R = torch.rand(s, T, generator=g, dtype=torch.float64)
    R[:1, -1] = float("nan")  # an unevaluated cell is null
    baseline = torch.rand(T, generator=g, dtype=torch.float64)
    steps, rows = None, None
    if curves:
        N = 2 * T
        subset = {"size": 10, "seed": 0, "samples_per_task": [10] * T, "rule": "first 10"}
        steps = StepEvaluations(torch.arange(N) * 3, torch.arange(N) // 2, subset=subset)
        rows = torch.rand(N, T, generator=g, dtype=torch.float64)
    meta = {"experiment": "e", "method": "m", "seed": 3, "reference": [0.9] * T, "cfg": {"a": [1]}}
    return ContinualResults.from_tensors(
        {"acc": ScoreMatrix("accuracy", R, baseline, step_scores=rows)},
        metadata=meta,
        steps=steps,
        **options,
    )


def document(T: int = 3, s: int = 3, curves: bool = True, seed: int = 0) -> dict[str, Any]:
    return results(T, s, curves, seed).to_dict()


def roundtrip(doc: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(doc, allow_nan=False))


def refused(doc: Any, tmp_path: Path) -> InvalidResultsError:
    """The error reading ``doc`` from a file (``1e999`` is how a hand-made file gets an infinite
    number past the JSON writer)."""
    file = tmp_path / "results.json"
    file.write_text(json.dumps(doc).replace("Infinity", "1e999"))
    with pytest.raises(InvalidResultsError) as info:
        read_document(file)
    err = info.value
    assert err.source == str(file) and str(err).startswith(f"{file}: ")
    assert "\n" not in str(err)
    return err


@pytest.mark.parametrize(("T", "s", "curves"), [(3, 3, True), (3, 0, False), (4, 1, True)])
def test_accepts_what_the_model_writes(tmp_path: Path, T: int, s: int, curves: bool) -> None:
    doc = roundtrip(document(T, s, curves))
    assert roundtrip(json.loads(json.dumps(doc))) == doc
    convert_document(doc)
    results(T, s, curves).write(tmp_path)  # the writer's own file, with its commit record
    assert read_document(tmp_path / "results.json").num_tasks == T


def test_accepts_real_run_with_curves(tmp_path: Path) -> None:
    trainer = pl.Trainer(
        max_epochs=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    callback = fit_stream(
        trainer,
        LogisticClassifier(lr=0.8),
        CircleGridTasks(),
        callback_kwargs={
            "dirpath": tmp_path,
            "log_images": False,
            "verbose": False,
            "eval_every_n_steps": StepEvaluation(2, subset=20),
        },
        metadata={"experiment": "logistic", "method": "sgd", "seed": 0},
        reference="joint",
    )
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["curves"] is not None and written["stages_completed"] == 3
    assert written["metadata"]["reference"] is not None  # the joint reference, one per task
    assert written["files"]["scores.csv"]["stages"] == 3  # to_dict() holds the same entry
    assert ContinualResults.load(tmp_path).to_dict() == written
    convert_document(roundtrip(callback.results()))
    assert read_document(tmp_path / "joint_reference").stages_completed == 1


def test_large_T_is_fast() -> None:
    T = 500
    data = json.dumps(document(T, T, curves=True)).encode()
    start = time.perf_counter()
    decode_document(data)
    elapsed = time.perf_counter() - start
    assert elapsed < 3.0, elapsed  # about 0.2 s here (250k + 500k cells)


def _set(path: str, value: Any) -> Any:
    """A mutation setting the JSON path ``a.b.1`` of a document to ``value``."""

    def mutate(doc: dict[str, Any]) -> None:
        parts = path.split(".")
        target: Any = doc
        for part in parts[:-1]:
            target = target[int(part)] if isinstance(target, list) else target[part]
        last = parts[-1]
        if value is _DELETE:
            del target[last]
        elif isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value

    return mutate


def _both(path: str, value: Any) -> Any:
    """Set ``path`` at the top level and in the primary matrix (they repeat each other)."""
    top, inner = _set(path, value), _set(f"matrices.acc.{path}", value)

    def mutate(doc: dict[str, Any]) -> None:
        top(doc)
        inner(doc)

    return mutate


_DELETE = object()
DEEP: Any = 0.5
for _ in range(MAX_DEPTH):
    DEEP = [DEEP]

BAD_FIELDS = [
    (
        _set("scores.2.1", "0.5"),
        "scores[2][1]",
        'expected a finite number or null, found string "0.5"',
    ),
    (_both("scores.1", [0.1, 0.2]), "matrices.acc.scores[1]", "array of 3 items, found array of 2"),
    (_both("scores", [[0.1, 0.2, 0.3]]), "matrices.acc.scores", "array of 3 items"),
    (_set("num_tasks", "3"), "num_tasks", "integer in [0, 2000], found string"),
    (_set("num_tasks", True), "num_tasks", "found boolean true"),
    (_set("num_tasks", MAX_TASKS + 1), "num_tasks", "integer in [0, 2000], found integer 2001"),
    (_set("num_tasks", 0), "num_tasks", "(0 only in a document with an online section)"),
    (_set("stages_completed", 4), "stages_completed", "integer in [0, 3]"),
    (_set("task_names", ["a", "b"]), "task_names", "array of 3 items"),
    (_set("task_names.1", 7), "task_names[1]", "string of at most 200 characters, found integer 7"),
    (_set("task_names.0", "x" * (MAX_NAME_LENGTH + 1)), "task_names[0]", "found string of 201"),
    (_set("baseline", _DELETE), "baseline", "missing"),
    (_set("baseline.0", math.inf), "baseline[0]", "found number inf"),
    (_set("metrics", []), "metrics", "expected an object, found array"),
    (_set("metrics.acc", "high"), "metrics.acc", "finite number or null"),
    (_set("metrics_per_stage.acc", [0.1]), "metrics_per_stage.acc", "array of 3 items"),
    (_set("per_task.bwt.0", {}), "per_task.bwt[0]", "found object"),
    (_set("conventions.score", ["accuracy"]), "conventions.score", "found array"),
    (_set("metadata", "x"), "metadata", "expected an object"),
    (_set("metadata.reference.0", "a"), "metadata.reference[0]", "finite number or null"),
    (_set("metadata.reference", [0.9]), "metadata.reference", "array of 3 items"),
    (_set("metadata.seed", [1]), "metadata.seed", "or true or false or null, found array"),
    (_set("metadata.method", {"a": 1}), "metadata.method", "found object"),
    (_set("metadata.cfg", DEEP), "metadata.cfg" + "[0]" * (MAX_DEPTH - 2), "nested deeper than 32"),
    (_set("curves.accuracy.1", None), "curves.accuracy[1]", "expected an array, found null"),
    (_set("curves.stage.0", 99), "curves.stage[0]", "integer in [0, 2]"),
    (_set("curves.step", _DELETE), "curves.step", "missing"),
    (_set("curves.full.0", 1), "curves.full[0]", "expected true or false, found integer 1"),
    (_set("curves.subset.samples_per_task", [1]), "curves.subset.samples_per_task", "array of 3"),
    (_set("stability.min_acc.0", "x"), "stability.min_acc[0]", "finite number or null"),
    (_set("matrices.acc.step_scores.1", [0.1]), "matrices.acc.step_scores[1]", "array of 3 items"),
    (_set("matrices.acc.step_scores", [[0.1] * 3]), "matrices.acc.step_scores", "array of 6"),
    (
        _set("matrices.acc.stability.min_acc.0", "x"),
        "matrices.acc.stability.min_acc[0]",
        "finite number or null",
    ),
    (_set("matrices.acc.bounds", [0, "1"]), "matrices.acc.bounds[1]", "finite number or null"),
    (_set("matrices.acc.bounds", [0, 1, 2]), "matrices.acc.bounds", "array of 2 items"),
    (_set("matrices.acc.bounds", [1, 0]), "matrices.acc.bounds", "lo <= hi"),
    (_set("matrices", {}), "matrices", "an object of 1 to 64 entries, found object with 0 keys"),
    (_set("matrices", {"a" * 201: {}}), "matrices (a key)", "found string of 201 characters"),
    (_set("format_version", 3), "format_version", "expected one of (2), found integer 3"),
    (_set("run_id", 12), "run_id", "found integer 12"),
    (
        _set("files", {"scores.csv": {"sha256": "zz", "stages": 3}}),
        'files["scores.csv"].sha256',
        "hex",
    ),
    (_set("files", {"scores.csv": {"sha256": "0" * 64}}), 'files["scores.csv"].stages', "missing"),
    (_set("files", {"../x": {"sha256": "0" * 64, "stages": 1}}), "files (a key)", "a file name"),
]


@pytest.mark.parametrize(("mutate", "field", "problem"), BAD_FIELDS)
def test_refuses_bad_field(tmp_path: Path, mutate: Any, field: str, problem: str) -> None:
    doc = roundtrip(document())
    mutate(doc)
    err = refused(doc, tmp_path)
    assert err.field == field and problem in err.problem, str(err)


# ---------------------------------------------------------------------- values from elsewhere
OUT_OF_BOUNDS = [
    (_both("scores.2.1", 1e308), "matrices.acc.scores[2][1]", "number 1e+308"),
    (_both("scores.0.0", -5), "matrices.acc.scores[0][0]", "number -5.0"),
    (_both("baseline.1", 1.5), "matrices.acc.baseline[1]", "number 1.5"),
    (_set("matrices.acc.step_scores.3.0", 2.0), "matrices.acc.step_scores[3][0]", "number 2.0"),
    (_set("metadata.reference.2", -0.1), "metadata.reference[2]", "number -0.1"),
]


@pytest.mark.parametrize(("mutate", "field", "found"), OUT_OF_BOUNDS)
def test_cells_outside_their_bounds_refused(
    tmp_path: Path, mutate: Any, field: str, found: str
) -> None:
    doc = roundtrip(document())
    if field.startswith("matrices.acc.step_scores"):
        doc["curves"]["accuracy"][3][0] = 2.0  # the top level repeats the primary's rows
    mutate(doc)
    err = refused(doc, tmp_path)
    what = "the primary matrix's bounds" if field.startswith("metadata") else "the matrix's bounds"
    assert err.field == field
    assert err.problem == f"expected a value in [0.0, 1.0] ({what}), found {found}"


def test_unbounded_matrix_takes_any_finite_cell(tmp_path: Path) -> None:
    cells = torch.full((1, 2), 1e300, dtype=torch.float64)
    loss = ScoreMatrix("cross_entropy", cells, torch.zeros(2), False, None)
    ContinualResults.from_tensors({"loss": loss}).write(tmp_path)
    assert ContinualResults.load(tmp_path).primary.scores[0, 0] == 1e300


def test_reference_outside_the_primary_bounds_refused(tmp_path: Path) -> None:
    reference = ReferenceScores("isolated", torch.tensor([0.9, 0.8, 0.7]))
    doc = roundtrip(results(reference=reference).to_dict())
    doc["reference"]["scores"][1] = 3.0
    err = refused(doc, tmp_path)
    assert err.field == "reference.scores[1]" and "primary matrix's bounds" in err.problem
    doc = roundtrip(results(reference=reference).to_dict())
    doc["reference"]["auc"] = [0.5, -1.0, 0.5]
    assert refused(doc, tmp_path).field == "reference.auc[1]"


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("scores", [[0.5, 0.5, None], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]], "scores[0][0]"),
        ("baseline", [0.0, 0.0, 0.0], "baseline[0]"),
        ("metrics", {"acc": 0.1, "bwt": 0.1, "fwt": 0.1, "forgetting": 0.1}, "metrics.acc"),
    ],
)
def test_top_level_must_equal_the_primary_matrix(
    tmp_path: Path, key: str, value: Any, field: str
) -> None:
    doc = roundtrip(document())
    doc[key] = value
    err = refused(doc, tmp_path)
    assert err.field == field
    assert f"as matrices.acc.{field}" in err.problem and "repeats the primary" in err.problem


def test_top_level_curves_and_stability_must_equal_the_primary(tmp_path: Path) -> None:
    doc = roundtrip(document())
    doc["curves"]["accuracy"][2][0] = 0.123
    assert refused(doc, tmp_path).field == "curves.accuracy[2][0]"
    doc = roundtrip(document())
    doc["stability"]["wc_acc"][1] = 0.123
    assert refused(doc, tmp_path).field == "stability.wc_acc[1]"


# ---------------------------------------------------------------------- class-incremental counts
def class_il_document() -> dict[str, Any]:
    """Two tasks of two classes, 3 test samples per class (counts of 2 stages)."""
    confusion = torch.tensor(
        [
            [[2, 1, 0, 0], [0, 3, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
            [[1, 0, 2, 0], [0, 2, 0, 1], [0, 0, 3, 0], [0, 1, 0, 2]],
        ]
    )
    section = ClassIncrementalResults.compute([[0, 1], [2, 3]], confusion)
    R = torch.tensor([[0.8, float("nan")], [0.5, 0.83]], dtype=torch.float64)
    matrix = ScoreMatrix("accuracy", R, torch.tensor([0.5, 0.5], dtype=torch.float64))
    return roundtrip(
        ContinualResults.from_tensors({"acc": matrix}, class_incremental=section).to_dict()
    )


def test_class_incremental_records_test_samples_and_round_trips(tmp_path: Path) -> None:
    doc = class_il_document()
    section = doc["class_incremental"]
    assert section["test_samples"] == [3, 3, 3, 3]
    assert section["confusion"]["stages"][0] == "0:0:2 0:1:1 1:1:3"
    back = ContinualResults.from_dict(doc)
    assert back.class_incremental is not None
    assert back.class_incremental.test_samples.tolist() == [3, 3, 3, 3]
    assert roundtrip(back.to_dict()) == doc


@pytest.mark.parametrize(
    ("stage", "text", "field", "problem"),
    [
        (0, "0:0:1000000 0:1:1 1:1:3", "stages[0]", "class 0 to add up to its 3 test samples"),
        (1, "0:0:9007199254740992 0:2:2", "stages[1]", "class 0 to add up to its 3 test"),
        (1, "0:0:9007199254740993", "stages[1] cell 0", "a count in [1, 2**53]"),
        (
            0,
            "0:0:2 0:1:1",
            "stages[0]",
            "class 1 to add up to its 3 test samples (test_samples[1]), found 0",
        ),
        (0, "0:0:2 0:1:1 1:1:3 2:2:1", "stages[0] cell 3", "the true one of a task <= 0"),
        (0, "0:0:2 0:1:1 1:1:3 0:0:1", "stages[0] cell 3", "each cell once"),
        (0, "0:0:2 0:9:1 1:1:3", "stages[0] cell 1", "class ids below 4"),
        (0, "0:0:2  1:1:3", "stages[0]", "true:predicted:count cells"),
        (0, "0:0:-2", "stages[0]", "true:predicted:count cells"),
        # non-ASCII digits (Arabic-Indic three): decimal to Python's int, not to the parser
        (0, "0:0:2 0:1:1 1:1:\u0663", "stages[0]", "true:predicted:count cells"),
        (0, "0:0:2 0:1:1 1:1:3 ", "stages[0]", "true:predicted:count cells"),
    ],
)
def test_impossible_confusion_counts_refused(
    tmp_path: Path, stage: int, text: str, field: str, problem: str
) -> None:
    doc = class_il_document()
    doc["class_incremental"]["confusion"]["stages"][stage] = text
    err = refused(doc, tmp_path)
    assert err.field == f"class_incremental.confusion.{field}" and problem in err.problem, err


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda s: s.__setitem__("test_samples", [3, 3, 3]), "class_incremental.test_samples"),
        (lambda s: s.__setitem__("test_samples", [2**60] * 4), "class_incremental.test_samples"),
        (lambda s: s["task_classes"][1].append(0), "class_incremental.task_classes[1][2]"),
        (lambda s: s.__setitem__("num_classes", 10**6), "class_incremental.num_classes"),
        (lambda s: s["task_classes"].pop(), "class_incremental.task_classes"),
        (lambda s: s["confusion"]["stages"].pop(), "class_incremental.confusion.stages"),
        (lambda s: s.__setitem__("prediction", "any"), "class_incremental.prediction"),
        (lambda s: s["class_order"].__setitem__(1, 4), "class_incremental.class_order[1]"),
        (
            lambda s: s["seen_accuracy"].__setitem__("sample", [0.5]),
            "class_incremental.seen_accuracy.sample",
        ),
    ],
)
def test_class_incremental_section_checked(tmp_path: Path, edit: Any, field: str) -> None:
    doc = class_il_document()
    edit(doc["class_incremental"])
    assert refused(doc, tmp_path).field == field


def test_compute_refuses_test_sets_that_change_between_stages() -> None:
    confusion = torch.tensor([[[2, 1], [0, 0]], [[1, 1], [0, 3]]])
    with pytest.raises(ValueError, match="class 0 has 2 test samples at stage 1 but 3"):
        ClassIncrementalResults.compute([[0], [1]], confusion)


# ---------------------------------------------------------------------- the file as a whole
def test_unknown_keys_ignored_metadata_depth_bounded(tmp_path: Path) -> None:
    doc = roundtrip(document())
    doc["added_later"] = {"x": [1, {"y": "z"}]}
    doc["matrices"]["acc"]["added_later"] = DEEP
    file = tmp_path / "results.json"
    file.write_text(json.dumps(doc))
    assert "added_later" not in ContinualResults.load(file).to_dict()
    doc["metadata"]["deep"] = DEEP
    with pytest.raises(InvalidResultsError, match=r"metadata\.deep\[0\]"):
        convert_document(doc)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"metadata": {"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}", "nested too deeply"),
        (b"[" * 100_000 + b"]" * 100_000, "expected `object`, found `array`"),
        (b'{"format_version": NaN}', 'at "NaN}" (NaN and Infinity are not JSON'),
        (b'{"format_version": 2, "num_tasks": ' + b"9" * 5000 + b"}", "num_tasks"),
        (b'{"format_version": 2,', "not valid JSON: input data was truncated"),
        (b'{"task_names": ["\xff"]}', "not UTF-8 text (invalid byte at offset 17)"),
        (b"[]", "expected an object, found array of 0 items"),
    ],
)
def test_refuses_bad_file(tmp_path: Path, content: bytes, problem: str) -> None:
    file = tmp_path / "results.json"
    file.write_bytes(content)
    with pytest.raises(InvalidResultsError, match=f"^{file}: ") as info:
        read_document(file)
    assert problem in str(info.value), str(info.value)


def test_size_limit_and_special_files(tmp_path: Path) -> None:
    file = tmp_path / "results.json"
    file.write_text(json.dumps(document()))
    size = file.stat().st_size
    assert read_document(file, max_bytes=size).num_tasks == 3
    with pytest.raises(InvalidResultsError, match=f"file of {size} bytes exceeds the limit"):
        read_document(file, max_bytes=size - 1)
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no results\.json"):
        read_document(tmp_path / "dir.json")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(InvalidResultsError, match="not a regular file"):
        read_document(fifo)


# ---------------------------------------------------------------------- the report command
HOSTILE = [
    (_both("scores.2.1", 1e308), "matrices.acc.scores[2][1]"),
    (_both("scores.0.0", -5), "matrices.acc.scores[0][0]"),
    (_set("scores.2.1", 0.01), "scores[2][1]"),  # the top level disagrees with matrices.acc
    (_set("metadata.reference.0", 7.0), "metadata.reference[0]"),
]


@pytest.mark.parametrize(("mutate", "field"), HOSTILE)
def test_report_exits_2_naming_file_and_field(tmp_path: Path, capsys, mutate, field) -> None:
    from continual_eval.report import main as report_main

    doc = roundtrip(document())
    mutate(doc)
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(doc))
    assert report_main([str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"continual-eval report: {run / 'results.json'}: {field}: expected "
    ), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("count", [10**6, 2**53])
def test_report_refuses_impossible_confusion_counts(tmp_path: Path, capsys, count: int) -> None:
    from continual_eval.report import main as report_main

    doc = class_il_document()
    doc["class_incremental"]["confusion"]["stages"][1] = f"0:0:{count} 1:1:3 2:2:3 3:3:3"
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(doc))
    assert report_main([str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "class_incremental.confusion.stages[1]: expected the counts of class 0" in err

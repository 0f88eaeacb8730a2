"""The results.json validator: it accepts every document the callback writes (a real run with
per-step curves, ``build_results`` with and without curves, a large T quickly) and refuses a
malformed or oversized one with an error naming the file and the JSON path of the field."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from continual_eval import StepEvaluation
from continual_eval import results as results_module
from continual_eval.experiments.logistic import CircleGridTasks, LogisticClassifier
from continual_eval.experiments.stream import fit_stream
from continual_eval.results import build_curves, build_results, write_results
from continual_eval.results_schema import (
    FORMAT_VERSION,
    MAX_DEPTH,
    MAX_NAME_LENGTH,
    MAX_TASKS,
    InvalidResultsError,
    read_results_json,
    validate_results,
)


def document(T: int = 3, s: int = 3, curves: bool = True, seed: int = 0) -> dict[str, Any]:
    """A document as the callback builds it: R, baseline, curves with a subset, metadata."""
    g = torch.Generator().manual_seed(seed)
    R = torch.rand(s, T, generator=g, dtype=torch.float64)
    R[:1, -1] = float("nan")  # an unevaluated cell is null
    baseline = torch.rand(T, generator=g, dtype=torch.float64)
    step_curves = None
    if curves:
        N = 2 * T
        stage = torch.arange(N) // 2
        subset = {"size": 10, "seed": 0, "samples_per_task": [10] * T}
        step_curves = build_curves(
            torch.arange(N) * 3,
            stage,
            torch.rand(N, T, generator=g, dtype=torch.float64),
            stages_completed=s,
            subset=subset,
        )
    meta = {"experiment": "e", "method": "m", "seed": 3, "reference": [0.9] * T, "cfg": {"a": [1]}}
    return build_results(R, baseline, metadata=meta, step_curves=step_curves)


def roundtrip(doc: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(doc, allow_nan=False))


def test_format_version_matches_writer() -> None:
    assert FORMAT_VERSION == results_module.FORMAT_VERSION


@pytest.mark.parametrize(("T", "s", "curves"), [(3, 3, True), (3, 0, False), (4, 1, True)])
def test_accepts_build_results(tmp_path: Path, T: int, s: int, curves: bool) -> None:
    doc = roundtrip(document(T, s, curves))
    assert validate_results(doc) == doc
    write_results(tmp_path, document(T, s, curves))  # the writer's own file, with its extras
    assert read_results_json(tmp_path / "results.json")["num_tasks"] == T


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
        reference=True,
    )
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["curves"] is not None and written["stages_completed"] == 3
    assert written["metadata"]["reference"] is not None  # the joint reference, one per task
    assert read_results_json(tmp_path / "results.json") == written
    validate_results(roundtrip(callback.results()))
    joint = tmp_path / "joint_reference" / "results.json"
    assert read_results_json(joint)["stages_completed"] == 1


def test_large_T_is_fast() -> None:
    T = 500
    doc = roundtrip(document(T, T, curves=True))
    start = time.perf_counter()
    validate_results(doc)
    elapsed = time.perf_counter() - start
    assert elapsed < 3.0, elapsed  # about 0.1 s here (250k + 500k cells)


def _set(path: str, value: Any) -> Any:
    """A mutation setting the JSON path ``a.b[1]`` of a document to ``value``."""

    def mutate(doc: dict[str, Any]) -> None:
        parts = path.replace("]", "").replace("[", ".").split(".")
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


_DELETE = object()
DEEP: Any = 0.5
for _ in range(MAX_DEPTH):
    DEEP = [DEEP]

BAD_FIELDS = [
    ("scores.2.1", "0.5", "scores[2][1]", "finite number or null, found string"),
    ("scores.1", [0.1, 0.2], "scores[1]", "array of 3 items, found array of 2"),
    ("scores", [[0.1, 0.2, 0.3]], "scores", "array of 3 items"),
    ("num_tasks", "3", "num_tasks", "integer in [1, 2000], found string"),
    ("num_tasks", True, "num_tasks", "found boolean true"),
    ("num_tasks", MAX_TASKS + 1, "num_tasks", "integer in [1, 2000], found integer 2001"),
    ("stages_completed", 4, "stages_completed", "integer in [0, 3]"),
    ("task_names", ["a", "b"], "task_names", "array of 3 items"),
    ("task_names.1", 7, "task_names[1]", "string of at most 200 characters, found integer 7"),
    ("task_names.0", "x" * (MAX_NAME_LENGTH + 1), "task_names[0]", "found string of 201"),
    ("baseline", _DELETE, "baseline", "missing"),
    ("baseline.0", 1e999, "baseline[0]", "found number inf"),
    ("metrics", [], "metrics", "expected an object, found array"),
    ("metrics.acc", "high", "metrics.acc", "finite number or null"),
    ("metrics_per_stage.acc", [0.1], "metrics_per_stage.acc", "array of 3 items"),
    ("per_task.bwt.0", {}, "per_task.bwt[0]", "found object"),
    ("conventions.score", ["accuracy"], "conventions.score", "found array"),
    ("metadata", "x", "metadata", "expected an object"),
    ("metadata.reference.0", "a", "metadata.reference[0]", "finite number or null"),
    ("metadata.reference", [0.9], "metadata.reference", "array of 3 items"),
    ("metadata.seed", [1], "metadata.seed", "a number, a boolean or null, found array"),
    ("metadata.method", {"a": 1}, "metadata.method", "found object"),
    ("metadata.cfg", DEEP, "metadata.cfg" + "[0]" * (MAX_DEPTH - 2), "nested deeper than 32"),
    ("curves.accuracy.1", None, "curves.accuracy[1]", "expected an array, found null"),
    ("curves.stage.0", 99, "curves.stage[0]", "integer in [0, 2]"),
    ("curves.step", _DELETE, "curves.step", "missing"),
    ("curves.full.0", 1, "curves.full[0]", "boolean"),
    ("curves.subset.samples_per_task", [1], "curves.subset.samples_per_task", "array of 3"),
    ("stability.min_acc.0", "x", "stability.min_acc[0]", "finite number or null"),
    ("matrices.acc.step_scores.1", [0.1], "matrices.acc.step_scores[1]", "array of 3 items"),
    ("matrices.acc.step_scores", [[0.1] * 3], "matrices.acc.step_scores", "array of 6 items"),
    (
        "matrices.acc.stability.min_acc.0",
        "x",
        "matrices.acc.stability.min_acc[0]",
        "finite number or null",
    ),
    ("matrices.acc.bounds", [0, "1"], "matrices.acc.bounds[1]", "a number or null"),
    ("format_version", 3, "format_version", "expected one of (1, 2), found integer 3"),
    ("run_id", 12, "run_id", "found integer 12"),
    ("files", {"scores.csv": {"sha256": "zz", "stages": 3}}, 'files["scores.csv"].sha256', "hex"),
    ("files", {"scores.csv": {"sha256": "0" * 64}}, 'files["scores.csv"].stages', "missing"),
]


@pytest.mark.parametrize(("path", "value", "field", "problem"), BAD_FIELDS)
def test_refuses_bad_field(tmp_path: Path, path: str, value: Any, field: str, problem: str) -> None:
    doc = roundtrip(document())
    _set(path, value)(doc)
    file = tmp_path / "results.json"
    # json.dumps writes inf as the constant Infinity (refused by the parser); 1e999 is how a
    # hand-made file gets an infinite number past the parser
    file.write_text(json.dumps(doc).replace("Infinity", "1e999"))
    with pytest.raises(InvalidResultsError) as info:
        read_results_json(file)
    err = info.value
    assert err.field == field and err.source == str(file)
    message = str(err)
    assert message.startswith(f"{file}: {field}: ") and problem in message
    assert "\n" not in message


def test_unknown_keys_accepted_within_depth() -> None:
    doc = roundtrip(document())
    doc["added_later"] = {"x": [1, {"y": "z"}]}
    doc["run_id"] = "0123abcd"
    validate_results(doc)
    doc["added_later"] = DEEP
    with pytest.raises(InvalidResultsError, match=r"added_later\[0\]"):
        validate_results(doc)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply to parse"),
        (b'{"format_version": NaN}', "non-standard constant NaN"),
        (b'{"format_version": 1, "num_tasks": ' + b"9" * 5000 + b"}", "digits"),
        (b'{"format_version": 1,', "not valid JSON: Expecting property name"),
        (b'{"task_names": ["\xff"]}', "not UTF-8 text (invalid byte at offset 17)"),
        (b"[]", "expected an object, found array of 0 items"),
    ],
)
def test_refuses_bad_file(tmp_path: Path, content: bytes, problem: str) -> None:
    file = tmp_path / "results.json"
    file.write_bytes(content)
    with pytest.raises(InvalidResultsError, match=f"^{file}: ") as info:
        read_results_json(file)
    assert problem in str(info.value)


def test_size_limit_and_special_files(tmp_path: Path) -> None:
    file = tmp_path / "results.json"
    file.write_text(json.dumps(document()))
    size = file.stat().st_size
    assert read_results_json(file, max_bytes=size)["num_tasks"] == 3
    with pytest.raises(InvalidResultsError, match=f"file of {size} bytes exceeds the limit"):
        read_results_json(file, max_bytes=size - 1)
    with pytest.raises(InvalidResultsError, match="not a regular file"):
        read_results_json(tmp_path)

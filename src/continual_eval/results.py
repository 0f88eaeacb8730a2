"""The files :class:`~continual_eval.ContinualEvalCallback` writes after each stage; their reader.

The results of a run are one typed object, :class:`ContinualResults` (defined in
:mod:`continual_eval.continual_results`): per scorer a :class:`MatrixResults` with the rows so
far, the baseline, the metric family of one functional pass, the per-task values and the step
curves. ``results.json`` is its document (:meth:`ContinualResults.to_dict`, ``format_version`` 2:
the primary matrix at the top level as in version 1, every matrix under ``matrices``; version-1
files still load); ``scores.csv`` holds the primary matrix as a table (``baseline`` row, then one
row per stage; an empty field is a cell that was not evaluated) and ``scores_<name>.csv`` every
other one. Every file is replaced atomically (temporary file + ``os.replace``), so a crash leaves
the previous complete version.

The functions taking or returning a ``dict`` (:func:`build_results`, :func:`load_results`,
:func:`write_results`, :func:`results_to_tensors`, :func:`results_to_curves`) are the dict view
of the same document, kept for existing code.

The set is kept consistent: the CSV files are written first and ``results.json`` last, naming the
SHA-256 of each CSV it was written with (``files``), so ``results.json`` is the commit record; a
write interrupted between them leaves a CSV one stage ahead, which :func:`check_results_files`
reports and the callback repairs when the run resumes. Temporary files of writers that died are
removed by :func:`remove_stale_temporaries` when a run starts. Each document carries the
``run_id`` of the run that wrote it; a run never writes into a directory that holds another run's
results (see ``ContinualEvalCallback(overwrite=...)``).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from continual_eval._files import replace_atomically
from continual_eval.continual_results import (
    ContinualResults,
    MatrixResults,
    ScoreMatrix,
    Stability,
    StepEvaluations,
    matrix_key,
)
from continual_eval.functional.family import (
    CURVE_KEYS,
    METRIC_FAMILY,
    METRIC_KEYS,
    PER_TASK_KEYS,
    REPORT_KEYS,
)
from continual_eval.results_schema import FORMAT_VERSION, read_results_json

__all__ = [
    "CURVE_KEYS",
    "FORMAT_VERSION",
    "METRIC_FAMILY",
    "METRIC_KEYS",
    "PER_TASK_KEYS",
    "REPORT_KEYS",
    "RESULTS_FILE",
    "SCORES_FILE",
    "ContinualResults",
    "MatrixResults",
    "ScoreMatrix",
    "Stability",
    "StepEvaluations",
    "build_curves",
    "build_results",
    "check_results_files",
    "default_results_dir",
    "load_results",
    "matrix_key",
    "new_version_dir",
    "read_run_id",
    "remove_stale_temporaries",
    "results_to_curves",
    "results_to_tensors",
    "scores_csv_name",
    "write_results",
    "write_scores_csv",
]

RESULTS_FILE = "results.json"
SCORES_FILE = "scores.csv"


def default_results_dir(trainer: Any, dirpath: str | os.PathLike[str] | None = None) -> Path:
    """Where a run's ``results.json`` goes; every run gets its own directory.

    ``dirpath`` when given; else, by the Trainer's first logger: its ``log_dir`` (TensorBoard,
    CSV: already one ``version_N`` per run), the W&B run's own files directory
    (``experiment.dir``, uploaded with the run), or ``default_root_dir/continual_eval/<run id>``
    for other loggers with a run id (MLflow); without a logger a new
    ``default_root_dir/continual_eval/version_N``, numbered as Lightning numbers its logs.
    """
    if dirpath is not None:
        return Path(dirpath)
    root = Path(trainer.default_root_dir)
    for logger in trainer.loggers[:1]:
        log_dir = getattr(logger, "log_dir", None)
        if log_dir:
            return Path(log_dir)
        if type(logger).__name__ == "WandbLogger":
            return Path(logger.experiment.dir)
        version = getattr(logger, "version", None)
        if version is not None and str(version):
            return root / "continual_eval" / str(version)
        save_dir = getattr(logger, "save_dir", None)
        if save_dir:
            return new_version_dir(Path(save_dir) / "continual_eval")
    return new_version_dir(root / "continual_eval")


def new_version_dir(parent: str | os.PathLike[str]) -> Path:
    """Create and return ``parent/version_N`` with ``N`` one more than the highest existing
    (0 for the first); the directory is claimed with an exclusive ``mkdir``, so two runs starting
    together never share one."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    existing = [
        int(p.name.removeprefix("version_"))
        for p in parent.iterdir()
        if p.is_dir() and p.name.startswith("version_") and p.name[8:].isdigit()
    ]
    version = max(existing, default=-1) + 1
    while True:
        path = parent / f"version_{version}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            version += 1


def _cells(values: Sequence[Any]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def build_results(
    scores: Tensor,
    baseline: Tensor,
    *,
    task_names: Sequence[str] | None = None,
    forgetting: str = "peak",
    score_name: str = "accuracy",
    metadata: Mapping[str, Any] | None = None,
    validate: bool = False,
    step_curves: Mapping[str, Any] | None = None,
    run_id: str | None = None,
    matrices: Mapping[str, ScoreMatrix] | None = None,
) -> dict[str, Any]:
    """The ``results.json`` document (``format_version`` 2) for ``s`` completed stages: the dict
    view of :meth:`ContinualResults.from_tensors(...).to_dict() <ContinualResults.to_dict>`.

    Args:
        scores: ``[s, T]`` rows of the primary R so far (NaN = not evaluated), ``0 <= s <= T``.
        baseline: ``[T]`` untrained scores of the primary scorer (NaN = not evaluated).
        task_names: defaults to ``task_0 .. task_{T-1}``.
        forgetting: forgetting convention passed to the functional layer.
        score_name: what a primary cell holds (e.g. ``"accuracy"``).
        metadata: free-form, JSON-serialisable.
        validate: check the cells the metrics read (off by default: the caller already did).
        step_curves: the ``curves`` and ``stability`` sections from :func:`build_curves`
            (per-step evaluation of the primary matrix); its rows become the primary matrix's
            ``step_scores`` (when its :class:`ScoreMatrix` has none) and its stability is
            recomputed with the primary's direction. Left out of the document when ``None``.
        run_id: the identifier of the run writing the document (left out when ``None``).
        matrices: every scorer's :class:`ScoreMatrix` by name, the primary first (its rows must
            be ``scores``/``baseline``); default: the primary alone, named by
            :func:`matrix_key`.
    """
    scores = torch.as_tensor(scores, dtype=torch.float64).cpu()
    baseline = torch.as_tensor(baseline, dtype=torch.float64).cpu()
    T = scores.shape[1]
    if not matrices:
        matrices = {matrix_key(score_name): ScoreMatrix(score_name, scores, baseline)}
    steps, tolerance = None, 0.0
    if step_curves is not None:
        curves = step_curves["curves"]
        steps = StepEvaluations.from_dict(curves)
        tolerance = float((step_curves.get("stability") or {}).get("tolerance", 0.0))
        rows = torch.tensor([_cells(r) for r in curves["accuracy"]], dtype=torch.float64)
        matrices = dict(matrices)
        first = next(iter(matrices))
        if matrices[first].step_scores is None:
            matrices[first] = replace(matrices[first], step_scores=rows.reshape(-1, T))
    return ContinualResults.from_tensors(
        matrices,
        task_names=task_names,
        forgetting=forgetting,
        metadata=metadata,
        run_id=run_id,
        steps=steps,
        tolerance=tolerance,
        validate=validate,
    ).to_dict()


def build_curves(
    steps: Tensor,
    stage: Tensor,
    accuracy: Tensor,
    *,
    stages_completed: int,
    full: Sequence[bool] | None = None,
    step_counter: str = "",
    score_name: str = "accuracy",
    subset: Mapping[str, Any] | None = None,
    tolerance: float = 0.0,
    higher_is_better: bool = True,
) -> dict[str, Any]:
    """The ``curves`` and ``stability`` sections of ``results.json`` for one matrix (the dict
    view of :class:`StepEvaluations` and :meth:`Stability.compute`).

    ``curves`` holds every evaluation so far: ``step`` ``[N]``, ``stage`` ``[N]`` and ``accuracy``
    ``[N, T]`` (``None`` = not evaluated), ``full`` ``[N]`` (whole test sets, else a subset).
    ``stability`` reads the evaluations of the ``stages_completed`` finished stages only:
    ``min_acc``/``wc_acc`` per stage and, per task ``j`` (stages ``j+1``), the gap ``depth``,
    ``boundary``, ``minimum`` and ``recovery_steps`` (``None`` when undefined or never recovered),
    from :mod:`continual_eval.functional.stability` (De Lange et al., ICLR 2023), in the
    direction ``higher_is_better``.
    """
    evaluations = StepEvaluations(
        step=torch.as_tensor(steps, dtype=torch.int64),
        stage=torch.as_tensor(stage, dtype=torch.int64),
        full=tuple(full) if full is not None else (),
        step_counter=step_counter,
        subset=dict(subset) if subset is not None else None,
    )
    accuracy = torch.as_tensor(accuracy, dtype=torch.float64).cpu()
    stability = Stability.compute(
        accuracy,
        evaluations,
        stages_completed,
        higher_is_better=higher_is_better,
        tolerance=tolerance,
    )
    return {
        "curves": evaluations.to_dict(accuracy, score_name),
        "stability": stability.to_dict(),
    }


def _named_matrix(results: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The section of matrix ``name`` in a version-2 document's ``matrices``."""
    matrices = results.get("matrices") or {}
    if name not in matrices:
        raise KeyError(
            f"these results hold no matrix {name!r}; they hold {sorted(matrices) or 'one'}"
        )
    return matrices[name]  # type: ignore[no-any-return]


def results_to_curves(
    results: Mapping[str, Any], name: str | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """``(step [N], stage [N], scores [N, T])`` of a document's per-step evaluations (NaN where
    ``None``): the primary matrix's (``curves.accuracy``), or the matrix ``name``'s
    (``matrices[name].step_scores``)."""
    if results.get("curves") is None:
        raise ValueError("these results hold no curves (run with eval_every_n_steps)")
    c, T = results["curves"], int(results["num_tasks"])
    rows = c["accuracy"]
    if name is not None:
        section = _named_matrix(results, name)
        if "step_scores" in section:
            rows = section["step_scores"]
        elif name != next(iter(results["matrices"])):
            raise KeyError(f"the matrix {name!r} of these results holds no step curves")
    steps = torch.tensor(c["step"], dtype=torch.int64)
    stage = torch.tensor(c["stage"], dtype=torch.int64)
    scores = torch.tensor([_cells(row) for row in rows], dtype=torch.float64).reshape(-1, T)
    return steps, stage, scores


_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.tmp$")


def _atomic_write(path: Path, text: str, *, durable: bool = True) -> None:
    """Replace ``path`` by ``text`` atomically (:func:`continual_eval._files.replace_atomically`;
    ``durable``: fsync first)."""
    replace_atomically(
        path, lambda tmp: tmp.write_text(text, encoding="utf-8", newline=""), durable=durable
    )


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - another user's live process
        return True
    return True


def _is_results_file(name: str) -> bool:
    """``results.json``, ``scores.csv`` or a ``scores_<name>.csv``."""
    return name in (RESULTS_FILE, SCORES_FILE) or (
        name.startswith("scores_") and name.endswith(".csv")
    )


def remove_stale_temporaries(dirpath: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files (``.NAME.PID.tmp``) that writers killed mid-write left in
    ``dirpath``; temporaries of live processes are kept. Returns the removed paths."""
    dirpath = Path(dirpath)
    removed: list[Path] = []
    if not dirpath.is_dir():
        return removed
    for path in dirpath.iterdir():
        match = _TEMPORARY.match(path.name)
        if match is None or not _is_results_file(match["name"]):
            continue
        if not _pid_alive(int(match["pid"])):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _csv_field(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _scores_csv_text(results: Mapping[str, Any], matrix: Mapping[str, Any] | None = None) -> str:
    """The CSV of ``matrix`` (a ``matrices`` section; default: the top-level, primary one)."""
    T = int(results["num_tasks"])
    names = results.get("task_names") or [f"task_{j}" for j in range(T)]
    matrix = results if matrix is None else matrix
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["stage", *names])
    writer.writerow(["baseline", *(_csv_field(v) for v in matrix["baseline"])])
    for i, row in enumerate(matrix["scores"]):
        writer.writerow([i, *(_csv_field(v) for v in row)])
    return buf.getvalue()


def scores_csv_name(name: str, primary: bool) -> str:
    """``scores.csv`` for the primary matrix, ``scores_<name>.csv`` for the others."""
    return SCORES_FILE if primary else f"scores_{name}.csv"


def _csv_files(results: Mapping[str, Any]) -> dict[str, str]:
    """File name -> CSV text for every matrix of the document (the primary as ``scores.csv``)."""
    files = {SCORES_FILE: _scores_csv_text(results)}
    for k, (name, section) in enumerate((results.get("matrices") or {}).items()):
        if k > 0:
            files[scores_csv_name(name, primary=False)] = _scores_csv_text(results, section)
    return files


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _document(results: Mapping[str, Any] | ContinualResults) -> Mapping[str, Any]:
    return results.to_dict() if isinstance(results, ContinualResults) else results


def write_scores_csv(
    path: str | os.PathLike[str],
    results: Mapping[str, Any] | ContinualResults,
    name: str | None = None,
) -> Path:
    """Write the CSV of the matrix ``name`` (default: the primary one) atomically: a header
    ``stage,<task names>``; a ``baseline`` row; one row per stage (an empty field is a cell that
    was not evaluated)."""
    path = Path(path)
    document = _document(results)
    section = None if name is None else (document.get("matrices") or {})[name]
    _atomic_write(path, _scores_csv_text(document, section))
    return path


def write_results(
    dirpath: str | os.PathLike[str], results: Mapping[str, Any] | ContinualResults
) -> Path:
    """Write ``scores.csv`` (and ``scores_<name>.csv`` per further matrix) and then
    ``results.json`` into ``dirpath``, each atomically; return the JSON path. ``results`` is a
    :class:`ContinualResults` or its document (:meth:`ContinualResults.write` calls this).

    ``results.json`` is written last and records the SHA-256 and stage count of every CSV
    written with it (``files``): it is the commit record of the set.
    """
    dirpath = Path(dirpath)
    results = _document(results)
    csv_files = _csv_files(results)
    stages = int(results["stages_completed"])
    document = dict(results)
    document["files"] = {
        name: {"sha256": _sha256(text), "stages": stages} for name, text in csv_files.items()
    }
    text = json.dumps(document, indent=2, allow_nan=False) + "\n"  # serialisable before writing
    for name, csv_text in csv_files.items():
        # one fsync per stage: results.json, the commit record naming each CSV's hash, is the
        # durable one; a CSV lost to a power cut is detected (check_results_files) and rewritten
        # by the resumed run
        _atomic_write(dirpath / name, csv_text, durable=False)
    json_path = dirpath / RESULTS_FILE
    _atomic_write(json_path, text)
    return json_path


def check_results_files(dirpath: str | os.PathLike[str]) -> str | None:
    """``None`` when ``results.json`` and the CSV files in ``dirpath`` belong together, else why
    not (a write interrupted between them, or a file edited by hand). ``results.json`` is
    authoritative; files written before ``files`` was recorded are not checked."""
    dirpath = Path(dirpath)
    results = _read_document(dirpath / RESULTS_FILE)
    for name, recorded in (results.get("files") or {}).items():
        csv_path = dirpath / name
        if Path(name).name != name:
            return f"{dirpath / RESULTS_FILE} names {name!r}, not a file of the directory"
        if not csv_path.is_file():
            return f"{csv_path} is missing"
        with open(csv_path, encoding="utf-8", newline="") as fh:
            actual = _sha256(fh.read())
        if actual != recorded["sha256"]:
            return (
                f"{csv_path} is not the file {dirpath / RESULTS_FILE} was written with (it "
                f"records {recorded['stages']} stages); results.json is authoritative"
            )
    return None


def read_run_id(dirpath: str | os.PathLike[str]) -> tuple[bool, str | None, int | None]:
    """``(exists, run_id, stages_completed)`` of the ``results.json`` in ``dirpath``; a file that
    cannot be read as a results document gives ``(True, None, None)``."""
    path = Path(dirpath) / RESULTS_FILE
    if not path.is_file():
        return False, None, None
    try:
        with open(path, encoding="utf-8") as fh:
            document = json.load(fh)
        run_id = document.get("run_id")
        stages = document.get("stages_completed")
        return (
            True,
            run_id if isinstance(run_id, str) else None,
            stages if isinstance(stages, int) else None,
        )
    except (OSError, ValueError, AttributeError, RecursionError):
        return True, None, None


def _read_document(path: Path) -> dict[str, Any]:
    """Parse and validate (:mod:`continual_eval.results_schema`): a malformed or hostile file
    raises :class:`~continual_eval.results_schema.InvalidResultsError` naming the field."""
    return read_results_json(path)


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a ``results.json`` (or the directory holding one) written by the callback: the dict
    view; :meth:`ContinualResults.load` gives the typed object.

    Returns the document as written (``None`` for cells that were not evaluated or metrics that are
    undefined), without the write bookkeeping (``files``, see :func:`check_results_files`). Use
    :func:`results_to_tensors` for ``(scores, baseline)`` tensors with NaN.

    Raises:
        FileNotFoundError: no ``results.json`` there.
        InvalidResultsError: (a ``ValueError``) the file is not a valid results document; the
            message names the file and the field (e.g. ``scores[2][1]``).
    """
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {RESULTS_FILE} at {path}")
    results = _read_document(path)
    results.pop("files", None)
    return results


def results_to_tensors(
    results: Mapping[str, Any], name: str | None = None
) -> tuple[Tensor, Tensor]:
    """``(scores [s, T], baseline [T])`` as float64 tensors, NaN where the document has ``None``:
    the primary matrix, or the matrix ``name`` of a version-2 document's ``matrices``."""
    T = int(results["num_tasks"])
    section: Mapping[str, Any] = results if name is None else _named_matrix(results, name)

    scores = torch.tensor([_cells(r) for r in section["scores"]], dtype=torch.float64)
    baseline = torch.tensor(_cells(section["baseline"]), dtype=torch.float64)
    return scores.reshape(-1, T), baseline

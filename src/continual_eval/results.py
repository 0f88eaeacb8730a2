"""The files :class:`~continual_eval.ContinualEvalCallback` writes after each stage; their reader.

``results.json`` (``format_version`` 1) holds the accuracy matrix rows so far, the baseline, the
metrics of ``R[:s, :s]`` and their per-stage curves, per-task transfer and forgetting, the
conventions used and free-form metadata; ``scores.csv`` holds the same matrix as a table
(``baseline`` row, then one row per stage; an empty field is a cell that was not evaluated). Both
are replaced atomically (temporary file + ``os.replace``), so a crash leaves the previous complete
version.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from continual_eval.functional import CURVE_KEYS, all_continual_metrics, continual_metrics
from continual_eval.functional.stability import (
    min_accuracy,
    stability_gap,
    worst_case_accuracy,
)

__all__ = [
    "FORMAT_VERSION",
    "RESULTS_FILE",
    "SCORES_FILE",
    "build_curves",
    "build_results",
    "default_results_dir",
    "load_results",
    "results_to_curves",
    "results_to_tensors",
    "write_results",
    "write_scores_csv",
]

FORMAT_VERSION = 1
RESULTS_FILE = "results.json"
SCORES_FILE = "scores.csv"
METRIC_KEYS = ("acc", "bwt", "fwt", "forgetting")
PER_TASK_KEYS = ("bwt", "fwt", "forgetting")


def default_results_dir(trainer: Any, dirpath: str | os.PathLike | None = None) -> Path:
    """Where a run's ``results.json`` goes: ``dirpath`` when given, else the first logger's
    ``log_dir`` (TensorBoard, CSV), else its ``save_dir`` (W&B, MLflow), else
    ``trainer.default_root_dir``; as ``Trainer.log_dir`` decides, without its broadcast."""
    if dirpath is not None:
        return Path(dirpath)
    for logger in trainer.loggers[:1]:
        for attr in ("log_dir", "save_dir"):
            path = getattr(logger, attr, None)
            if path:
                return Path(path)
    return Path(trainer.default_root_dir)


def _float_or_none(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _list(t: Tensor) -> list[Any]:
    """Nested lists of floats with NaN/inf as ``None``."""
    if t.ndim == 0:
        return _float_or_none(t.item())  # type: ignore[return-value]
    return [_list(x) if x.ndim else _float_or_none(x.item()) for x in t.detach().cpu().double()]


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
) -> dict[str, Any]:
    """The ``results.json`` document for ``s`` completed stages.

    Args:
        scores: ``[s, T]`` rows of R so far (NaN = not evaluated), ``0 <= s <= T``.
        baseline: ``[T]`` untrained scores (NaN = not evaluated).
        task_names: defaults to ``task_0 .. task_{T-1}``.
        forgetting: forgetting convention passed to the functional layer.
        score_name: what a cell holds (e.g. ``"accuracy"``).
        metadata: free-form, JSON-serialisable.
        validate: check the cells the metrics read (off by default: the caller already did).
        step_curves: the ``curves`` and ``stability`` sections from :func:`build_curves` (per-step
            evaluation); left out of the document when ``None``.
    """
    scores = torch.as_tensor(scores, dtype=torch.float64).cpu()
    baseline = torch.as_tensor(baseline, dtype=torch.float64).cpu()
    s, T = scores.shape
    names = list(task_names) if task_names is not None else [f"task_{j}" for j in range(T)]
    if len(names) != T:
        raise ValueError(f"{len(names)} task names for {T} tasks")
    metrics: dict[str, Any] = dict.fromkeys(METRIC_KEYS)
    curves: dict[str, list[Any]] = {k: [] for k in CURVE_KEYS}
    per_task: dict[str, list[Any]] = {k: [] for k in PER_TASK_KEYS}
    if s > 0:
        R, b = scores[:, :s], baseline[:s]
        metrics = {
            k: _list(v)
            for k, v in continual_metrics(R, b, forgetting=forgetting, validate=validate).items()
        }
        family = all_continual_metrics(R, b, forgetting=forgetting, validate=False)
        curves = {k: _list(family["curve"][k]) for k in CURVE_KEYS}
        per_task = {k: _list(family["per_task"][k]) for k in PER_TASK_KEYS}
    document = {
        "format_version": FORMAT_VERSION,
        "num_tasks": T,
        "task_names": names,
        "stages_completed": s,
        "scores": _list(scores) if s else [],
        "baseline": _list(baseline),
        "metrics": metrics,
        "metrics_per_stage": curves,
        "per_task": per_task,
        "conventions": {
            "indexing": "zero-based",
            "weighting": "equal-task",
            "forgetting": forgetting,
            "fwt": "R[j-1,j] - b[j] (GEM)",
            "score": score_name,
        },
        "metadata": dict(metadata or {}),
    }
    if step_curves is not None:
        document.update(step_curves)
    return document


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
) -> dict[str, Any]:
    """The ``curves`` and ``stability`` sections of ``results.json``.

    ``curves`` holds every evaluation so far: ``step`` ``[N]``, ``stage`` ``[N]`` and ``accuracy``
    ``[N, T]`` (``None`` = not evaluated), ``full`` ``[N]`` (whole test sets, else a subset).
    ``stability`` reads the evaluations of the ``stages_completed`` finished stages only:
    ``min_acc``/``wc_acc`` per stage and, per task ``j`` (stages ``j+1``), the gap ``depth``,
    ``boundary``, ``minimum`` and ``recovery_steps`` (``None`` when undefined or never recovered),
    from :mod:`continual_eval.functional.stability` (De Lange et al., ICLR 2023).
    """
    steps = torch.as_tensor(steps, dtype=torch.int64).cpu()
    stage = torch.as_tensor(stage, dtype=torch.int64).cpu()
    accuracy = torch.as_tensor(accuracy, dtype=torch.float64).cpu()
    full_list = [True] * len(steps) if full is None else [bool(f) for f in full]
    curves = {
        "step": steps.tolist(),
        "stage": stage.tolist(),
        "accuracy": _list(accuracy) if len(steps) else [],
        "full": full_list,
        "score": score_name,
        "step_counter": step_counter,
        "subset": dict(subset) if subset is not None else None,
    }
    done = stage < stages_completed
    acc, stg, stp = accuracy[done], stage[done], steps[done]
    stability: dict[str, Any] = {
        "min_acc": [],
        "wc_acc": [],
        "per_task": {"boundary": [], "minimum": [], "depth": [], "recovery_steps": []},
        "tolerance": tolerance,
        "source": "De Lange, van de Ven & Tuytelaars, ICLR 2023 (min-ACC eq. 4, WC-ACC eq. 5)",
    }
    if stages_completed > 0 and len(stg):
        gap = stability_gap(acc, stg, stp, tolerance=tolerance)
        stability["min_acc"] = _list(min_accuracy(acc, stg, validate=False))
        stability["wc_acc"] = _list(worst_case_accuracy(acc, stg, validate=False))
        stability["per_task"] = {k: _list(v) for k, v in gap.items()}
    return {"curves": curves, "stability": stability}


def results_to_curves(results: Mapping[str, Any]) -> tuple[Tensor, Tensor, Tensor]:
    """``(step [N], stage [N], accuracy [N, T])`` from a document's ``curves`` section (NaN where
    ``None``)."""
    if results.get("curves") is None:
        raise ValueError("these results hold no curves (run with eval_every_n_steps)")
    c, T = results["curves"], int(results["num_tasks"])
    steps = torch.tensor(c["step"], dtype=torch.int64)
    stage = torch.tensor(c["stage"], dtype=torch.int64)
    rows = [[math.nan if v is None else float(v) for v in row] for row in c["accuracy"]]
    return steps, stage, torch.tensor(rows, dtype=torch.float64).reshape(-1, T)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _csv_field(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def write_scores_csv(path: str | os.PathLike, results: Mapping[str, Any]) -> Path:
    """Write ``scores.csv`` atomically: ``stage,task_0,...``; a ``baseline`` row; one row per
    stage."""
    path = Path(path)
    T = int(results["num_tasks"])
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["stage", *(f"task_{j}" for j in range(T))])
    writer.writerow(["baseline", *(_csv_field(v) for v in results["baseline"])])
    for i, row in enumerate(results["scores"]):
        writer.writerow([i, *(_csv_field(v) for v in row)])
    _atomic_write(path, buf.getvalue())
    return path


def write_results(dirpath: str | os.PathLike, results: Mapping[str, Any]) -> Path:
    """Write ``results.json`` and ``scores.csv`` into ``dirpath`` atomically; return the JSON
    path."""
    dirpath = Path(dirpath)
    json_path = dirpath / RESULTS_FILE
    _atomic_write(json_path, json.dumps(results, indent=2, allow_nan=False) + "\n")
    write_scores_csv(dirpath / SCORES_FILE, results)
    return json_path


def load_results(path: str | os.PathLike) -> dict[str, Any]:
    """Read a ``results.json`` (or the directory holding one) written by the callback.

    Returns the document as written (``None`` for cells that were not evaluated or metrics that are
    undefined). Use :func:`results_to_tensors` for ``(scores, baseline)`` tensors with NaN.
    """
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {RESULTS_FILE} at {path}")
    with open(path, encoding="utf-8") as fh:
        results = json.load(fh)
    version = results.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path}: unsupported format_version {version!r} (expected {FORMAT_VERSION})"
        )
    missing = {"num_tasks", "scores", "baseline", "stages_completed"} - results.keys()
    if missing:
        raise ValueError(f"{path}: missing keys {sorted(missing)}")
    return results


def results_to_tensors(results: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """``(scores [s, T], baseline [T])`` as float64 tensors, NaN where the document has ``None``."""
    T = int(results["num_tasks"])

    def conv(values: Sequence[Any]) -> list[float]:
        return [math.nan if v is None else float(v) for v in values]

    scores = torch.tensor([conv(r) for r in results["scores"]], dtype=torch.float64).reshape(-1, T)
    baseline = torch.tensor(conv(results["baseline"]), dtype=torch.float64)
    return scores, baseline

"""References of the primary scorer: what [`train_reference`][continual_eval.train_reference]
measured ([`Reference`][continual_eval.Reference],
[`ReferenceCurve`][]) and what
``ContinualEvalCallback(reference=...)`` accepts, resolved into a
[`ReferenceScores`][continual_eval.results.ReferenceScores] (no Lightning here: the report reads
references too).

Accepted (every form holds scores of the callback's primary scorer, one per task):

* a ``[T]`` tensor or a sequence of numbers (``None``/NaN: no reference for that task): kind
  ``"given"``;
* a mapping ``{"scores": [T], "auc": [T] (optional), "kind": str (optional)}``: per-task scores
  and, optionally, the reference's per-task areas ``AUC_j^ref`` under its learning curves (the
  normalised forward transfer's reference);
* a [`Reference`][continual_eval.Reference] from [`train_reference`][continual_eval.train_reference]
  (its curves, with ``eval_every_n_steps``, give the areas);
* a path: a reference run's ``results.json`` (or the directory holding one): the final row of its
  primary matrix, kind from its ``metadata["reference_run"]`` (``"given"`` when absent); or the
  directory of an isolated or cumulative reference (``task_0/results.json``,
  ``task_1/results.json``, ...: what ``train_reference(..., kind="isolated" or "cumulative",
  dirpath=...)`` and ``continual-eval fit`` write), ``R[0, 0]`` of each, with the areas of their
  curves when they were recorded; the kind from their ``metadata["reference_run"]``.

Per-item values (`reference_items`, the intransigence interval of ``item_records=``): a
[`Reference`][continual_eval.Reference] holds them in ``items`` when its runs recorded the primary
matrix's items (``train_reference(..., callback_kwargs={"item_records": ...})``). A reference
run's ``results.json`` does not hold them (its ``items`` section holds counts and transitions
only); its directory's stage journal (``stages.jsonl``, beside ``results.json``) does, and a path
reads them from there. Tensors, mappings and paths without a journal of items give none.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from continual_eval.functional.intervals import PackedBits, unpack_bits
from continual_eval.functional.plasticity import stage_auc
from continual_eval.results.files import RESULTS_FILE
from continual_eval.results.model import REFERENCE_SCORE_KINDS, ContinualResults, ReferenceScores
from continual_eval.results.schema import MAX_TEXT_LENGTH

__all__ = [
    "Reference",
    "ReferenceCurve",
    "check_reference_length",
    "curve_auc",
    "reference_items",
    "resolve_reference",
]

#: one task's per-item values: ``[n_j]`` bool or packed (0/1 items), else float64
Items = Tensor | PackedBits


@dataclass(frozen=True)
class ReferenceCurve:
    """One reference run's learning curve on its task.

    Attributes:
        step: ``[N]`` int64, optimizer steps since that reference model started training (the
            per-step evaluations every ``eval_every_n_steps`` steps, then the end of training).
        scores: ``[N]`` float64, the score on its task at each step.
    """

    step: Tensor
    scores: Tensor


@dataclass(frozen=True)
class Reference:
    """What [`train_reference`][continual_eval.train_reference] measured.

    Attributes:
        kind: ``"isolated"``, ``"joint"`` or ``"cumulative"``.
        scores: ``ref``, ``[T]`` float64: ``ref[j]`` is the reference score on task ``j``'s test
            set (isolated: copy ``j``, trained on task ``j`` alone; joint: the one joint copy;
            cumulative: copy ``j``, trained on tasks ``0..j``).
        baseline: ``[T]`` float64, the untrained copies' scores (the continual run's ``b`` when
            the copies start from its initial weights).
        epochs: epochs each reference model trained (the per-task budget ``E``; the joint copy
            trains ``E`` epochs over the union).
        steps_trained: optimizer steps each reference model took (``T`` values for isolated and
            cumulative, one
            for joint).
        score_name: the primary scorer's name (what ``scores`` holds, e.g. ``"accuracy"``).
        higher_is_better: the primary scorer's direction.
        task_names: one name per task.
        curves: with ``eval_every_n_steps`` (isolated only): one
            [`ReferenceCurve`][] per task, copy ``j``'s curve
            on task ``j``; else ``None``.
        results_dirs: where each reference run's ``results.json`` went (empty without
            ``dirpath``).
        items: with per-item records of the primary matrix (``item_records`` in
            ``callback_kwargs``): per task ``j`` the reference's ``[n_j]`` items on task ``j``'s
            test set, in its order (the cells of ``scores``: isolated and cumulative, copy ``j``'s;
            joint, the joint copy's), [`PackedBits`][continual_eval.functional.intervals.PackedBits]
            for 0/1
            items, else float64; ``None`` otherwise.
    """

    kind: str
    scores: Tensor
    baseline: Tensor
    epochs: int
    steps_trained: tuple[int, ...]
    score_name: str
    higher_is_better: bool
    task_names: tuple[str, ...]
    curves: tuple[ReferenceCurve, ...] | None = None
    results_dirs: tuple[Path, ...] = ()
    items: tuple[Items, ...] | None = None

    def to_list(self) -> list[float | None]:
        """``scores`` as JSON cells (``None`` for a NaN), as ``results.json`` stores
        ``metadata["reference"]``."""
        return [None if v != v else float(v) for v in self.scores.tolist()]


_WHAT = "ContinualEvalCallback(reference=...)"


def curve_auc(step: Tensor, scores: Tensor, initial: float) -> float:
    """``AUC`` of one reference model's learning curve on its task: the trapezoid area under
    ``(0, initial), (step[n], scores[n])`` divided by the span (its mean score over its training;
    [`stage_auc`][continual_eval.functional.stage_auc] of a one-stage curve). NaN without a
    point."""
    values = torch.as_tensor(scores, dtype=torch.float64).reshape(-1, 1)
    if values.numel() == 0:
        return math.nan
    steps = torch.as_tensor(step, dtype=torch.int64).reshape(-1)
    stage = torch.zeros(len(steps), dtype=torch.int64)
    start = torch.tensor([initial], dtype=torch.float64)
    return float(stage_auc(values, stage, steps, initial=start)[0])


def _scores_vector(values: Any, what: str) -> Tensor:
    """A 1-D float64 tensor of finite numbers or NaN (``None`` -> NaN)."""
    if isinstance(values, Tensor):
        if values.is_complex() or values.dtype == torch.bool:
            raise TypeError(f"{_WHAT}: {what} must hold real numbers, got {values.dtype}")
        vector = values.detach().to("cpu", torch.float64)
    elif isinstance(values, Sequence) and not isinstance(values, (str, bytes)):
        cells = []
        for j, value in enumerate(values):
            if value is None:
                cells.append(math.nan)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                cells.append(float(value))
            elif isinstance(value, Tensor) and value.numel() == 1 and not value.is_complex():
                cells.append(float(value.item()))
            else:
                raise TypeError(
                    f"{_WHAT}: {what}[{j}] is {value!r}; expected a number or None (absent)"
                )
        vector = torch.tensor(cells, dtype=torch.float64)
    else:
        raise TypeError(
            f"{_WHAT}: {what} must be a [T] tensor or a sequence of numbers, got "
            f"{type(values).__name__}"
        )
    if vector.ndim != 1 or vector.numel() == 0:
        raise ValueError(
            f"{_WHAT}: {what} must be one score per task, shape [T] with T >= 1, got "
            f"{tuple(vector.shape)}"
        )
    bad = torch.isinf(vector).nonzero()
    if len(bad):
        j = int(bad[0])
        raise ValueError(f"{_WHAT}: {what}[{j}] is {vector[j].item()}; scores must be finite")
    return vector


def _check_bounds(vector: Tensor, scorer: Any, what: str) -> None:
    bounds = getattr(scorer, "bounds", None)
    if bounds is None:
        return
    lo, hi = float(bounds[0]), float(bounds[1])
    outside = ((vector < lo) | (vector > hi)).nonzero()
    if len(outside):
        j = int(outside[0])
        raise ValueError(
            f"{_WHAT}: {what}[{j}] = {vector[j].item()!r} is outside the primary scorer "
            f"{scorer.name!r}'s range [{lo}, {hi}]: the reference must hold that scorer's scores"
        )


def _check_scorer(score_name: str, higher_is_better: bool, scorer: Any, source: str) -> None:
    """The reference's score must be the primary scorer's, in the same direction."""
    if score_name != scorer.name or bool(higher_is_better) != bool(scorer.higher_is_better):
        direction = "higher" if higher_is_better else "lower"
        primary = "higher" if scorer.higher_is_better else "lower"
        raise ValueError(
            f"{_WHAT}: {source} holds {score_name!r} scores ({direction} is better), but the "
            f"callback's primary scorer is {scorer.name!r} ({primary} is better); the reference "
            "metrics compare R[j, j] with the reference score of the same scorer. Train or pass "
            "a reference of the primary scorer (or make that scorer the first)"
        )


def _kind(value: Any, source: str) -> str:
    if value not in REFERENCE_SCORE_KINDS:
        raise ValueError(
            f"{_WHAT}: {source} has kind {value!r}; expected one of {REFERENCE_SCORE_KINDS}"
        )
    return str(value)


def _source(text: str) -> str:
    return text if len(text) <= MAX_TEXT_LENGTH else "..." + text[-(MAX_TEXT_LENGTH - 3) :]


def _from_reference(reference: Reference, scorer: Any) -> ReferenceScores:
    """A [`Reference`][continual_eval.Reference] of
    [`train_reference`][continual_eval.train_reference]."""
    _check_scorer(reference.score_name, reference.higher_is_better, scorer, "the Reference")
    scores = _scores_vector(reference.scores, "Reference.scores")
    auc = None
    if reference.curves is not None:
        baseline = torch.as_tensor(reference.baseline, dtype=torch.float64).reshape(-1)
        if len(reference.curves) != len(scores) or len(baseline) != len(scores):
            raise ValueError(
                f"{_WHAT}: the Reference has {len(scores)} scores but {len(reference.curves)} "
                f"curves and {len(baseline)} baseline values"
            )
        auc = torch.tensor(
            [
                curve_auc(curve.step, curve.scores, float(baseline[j]))
                for j, curve in enumerate(reference.curves)
            ],
            dtype=torch.float64,
        )
    return ReferenceScores(_kind(reference.kind, "the Reference"), scores, auc, "train_reference")


def _from_run(results: ContinualResults, path: Path, scorer: Any) -> ReferenceScores:
    """The final row of a reference run's primary matrix."""
    matrix = results.primary
    _check_scorer(matrix.score, matrix.higher_is_better, scorer, str(path))
    if matrix.num_stages == 0:
        raise ValueError(f"{_WHAT}: {path} holds no trained stage (stages_completed = 0)")
    run = results.metadata.get("reference_run")
    kind = run if run in REFERENCE_SCORE_KINDS else "given"
    scores = matrix.scores[-1].clone()
    return ReferenceScores(kind, scores, None, _source(str(path)))


def _from_isolated_dir(directory: Path, scorer: Any) -> ReferenceScores:
    """``task_j/results.json`` of an isolated reference: ``R[0, 0]`` of each, and the area under
    its curve when it has one."""
    runs: list[ContinualResults] = []
    while (directory / f"task_{len(runs)}" / RESULTS_FILE).is_file():
        runs.append(ContinualResults.load(directory / f"task_{len(runs)}"))
    scores, areas = [], []
    for j, run in enumerate(runs):
        where = directory / f"task_{j}"
        matrix = run.primary
        _check_scorer(matrix.score, matrix.higher_is_better, scorer, str(where))
        if run.num_tasks != 1 or matrix.num_stages != 1:
            raise ValueError(
                f"{_WHAT}: {where} is not a one-task reference run ({run.num_tasks} tasks, "
                f"{matrix.num_stages} stages)"
            )
        scores.append(float(matrix.scores[0, 0]))
        if run.steps is not None and matrix.step_scores is not None:
            areas.append(
                curve_auc(run.steps.step, matrix.step_scores[:, 0], float(matrix.baseline[0]))
            )
    auc = torch.tensor(areas, dtype=torch.float64) if len(areas) == len(runs) else None
    vector = torch.tensor(scores, dtype=torch.float64)
    kinds = {run.metadata.get("reference_run") for run in runs}
    kind = "cumulative" if kinds == {"cumulative"} else "isolated"
    return ReferenceScores(kind, vector, auc, _source(str(directory)))


def _from_path(path: Path, scorer: Any) -> ReferenceScores:
    if path.is_file() or (path / RESULTS_FILE).is_file():
        return _from_run(ContinualResults.load(path), path, scorer)
    if (path / "task_0" / RESULTS_FILE).is_file():
        return _from_isolated_dir(path, scorer)
    raise FileNotFoundError(
        f"{_WHAT}: {path} is neither a results.json, a directory holding one, nor an isolated "
        "reference's directory (task_0/results.json, task_1/results.json, ...)"
    )


def _from_mapping(value: Mapping[Any, Any]) -> ReferenceScores:
    """``{"scores": [T], "auc": [T] (optional), "kind": str (optional)}``."""
    if "scores" not in value:
        raise ValueError(
            f"{_WHAT}: a mapping needs 'scores' (and optionally 'auc', 'kind'), got keys "
            f"{sorted(map(str, value))}"
        )
    unknown = set(value) - {"scores", "auc", "kind"}
    if unknown:
        raise ValueError(f"{_WHAT}: unknown keys {sorted(map(str, unknown))}")
    scores = _scores_vector(value["scores"], "scores")
    auc = None
    if value.get("auc") is not None:
        auc = _scores_vector(value["auc"], "auc")
        if auc.shape != scores.shape:
            raise ValueError(f"{_WHAT}: 'auc' has {auc.numel()} values for {scores.numel()} scores")
    return ReferenceScores(_kind(value.get("kind", "given"), "the mapping"), scores, auc, "mapping")


def _check_item_means(items: Sequence[Items], resolved: ReferenceScores) -> None:
    """Each task's reference score must be the mean of its items (the same reference)."""
    if len(items) != resolved.scores.numel():
        raise ValueError(
            f"{_WHAT}: the reference holds items of {len(items)} tasks and "
            f"{resolved.scores.numel()} scores"
        )
    for j, entry in enumerate(items):
        values = unpack_bits(entry) if isinstance(entry, PackedBits) else entry
        mean, score = float(values.double().mean()), float(resolved.scores[j])
        if score == score and abs(mean - score) > 1e-9 + 1e-6 * abs(score):
            raise ValueError(
                f"{_WHAT}: the reference's items of task {j} have mean {mean!r}, its score is "
                f"{score!r}: items and scores of different reference runs"
            )


def reference_items(
    value: Any,
    resolved: ReferenceScores | None,
    path_items: Callable[[Path], list[Items] | None] | None = None,
) -> tuple[list[Items] | None, str | None]:
    """``(items, note)`` of ``reference=`` ``value`` (resolved as ``resolved``): the reference
    model's per-item values of the primary matrix, one ``[n_j]`` entry per task (a
    [`Reference`][continual_eval.Reference]'s ``items``; for a path, ``path_items(path)``: the
    callback reads its stage journal, a module the results do not import), checked against the
    scores, and, when it has none, why (what the ``intervals`` section states for
    intransigence); ``(None, None)`` without a reference."""
    if resolved is None:
        return None, None
    items: list[Items] | None = None
    if isinstance(value, Reference) and value.items is not None:
        items = list(value.items)
    elif isinstance(value, (str, os.PathLike)) and path_items is not None:
        items = path_items(Path(value))
    if items is not None:
        _check_item_means(items, resolved)
        return items, None
    where = f"{resolved.kind!r} from {resolved.source or 'the argument'}"
    return None, (
        f"the reference ({where}) holds scores only, not its per-item values: the paired "
        "interval of intransigence resamples the reference's items of each task with the run's "
        "(train_reference with item_records in callback_kwargs records them)"
    )


def resolve_reference(value: Any, scorer: Any) -> ReferenceScores | None:
    """``value`` (see the module docstring) as
    [`ReferenceScores`][continual_eval.results.ReferenceScores] of ``scorer`` (the primary one);
    ``None`` for ``None``. Raises ``TypeError``/``ValueError`` naming what is wrong (a score of
    another scorer or direction, a non-finite or out-of-range score) and ``FileNotFoundError`` for a
    path holding no reference."""
    if value is None:
        return None
    if isinstance(value, Reference):
        resolved = _from_reference(value, scorer)
    elif isinstance(value, (str, os.PathLike)):
        resolved = _from_path(Path(value), scorer)
    elif isinstance(value, Mapping):
        resolved = _from_mapping(value)
    else:
        resolved = ReferenceScores("given", _scores_vector(value, "reference"), None, "tensor")
    _check_bounds(resolved.scores, scorer, "reference")
    if resolved.auc is not None:
        _check_bounds(resolved.auc, scorer, "reference auc")
    return resolved


def check_reference_length(reference: ReferenceScores | None, num_tasks: int) -> None:
    """One reference score per task: a clear ``ValueError`` otherwise."""
    if reference is None or reference.scores.numel() == num_tasks:
        return
    raise ValueError(
        f"{_WHAT}: the reference ({reference.source or reference.kind}) has "
        f"{reference.scores.numel()} scores but the run has {num_tasks} tasks (test dataloaders); "
        "it needs one reference score per task, in task order. Nothing was trained"
    )

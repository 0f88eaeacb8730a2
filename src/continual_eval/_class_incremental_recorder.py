"""What ``ContinualEvalCallback(task_classes=...)`` adds: the two class-incremental scorers
(`class_incremental_scorers`) and the record's section of the confusion counts of every
stage (`ClassIncrementalRecord`, its checkpoint state and the ``class_incremental``
section of ``results.json``).

The counts are kept sparsely, per stage: the nonzero cells of the stage's ``[C, C]`` matrix as
an ``[nnz, 3]`` int64 tensor of ``(true, predicted, count)`` rows (24 bytes per cell; at most one
cell per test sample of the seen tasks), so the memory follows what was measured, not
``stages x C**2`` (T = 1000 tasks of 2 classes: 2000 classes, 32 GB as dense matrices)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import math
import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from continual_eval.evaluation.class_incremental import (
    AGNOSTIC_NAME,
    AWARE_NAME,
    TaskAgnosticAccuracyScorer,
    TaskAwareAccuracyScorer,
)
from continual_eval.functional.class_incremental import TaskClasses
from continual_eval.record import Scored
from continual_eval.results import ClassIncrementalResults, ContinualResults
from continual_eval.results.class_incremental import encode_cells, sparse_confusion
from continual_eval.results.schema import (
    MAX_CLASS_TABLE_CELLS,
    MAX_CLASSES,
    MAX_CONFUSION_CELLS,
)

__all__ = [
    "ClassIncrementalRecord",
    "baseline_labels",
    "check_class_id_bounds",
    "class_incremental_scorers",
]


@contextlib.contextmanager
def baseline_labels(scorers: Mapping[str, Any], items: Any) -> Iterator[None]:
    """While in the block, the task-agnostic scorer keeps its samples' labels beside its items
    (``keep_labels``) when the per-item records (``items``, the record's ``items`` section or
    ``None``) keep its items: the baseline evaluation, so that the test items' classes are
    recorded once (the per-class intervals, `continual_eval._item_record`)."""
    scorer = scorers.get(AGNOSTIC_NAME)
    on = (
        isinstance(scorer, TaskAgnosticAccuracyScorer)
        and items is not None
        and AGNOSTIC_NAME in getattr(items, "binary", {})
    )
    if on:
        scorer.keep_labels = True  # type: ignore[union-attr]
    try:
        yield
    finally:
        if on:
            scorer.keep_labels = False  # type: ignore[union-attr]


def _ids(classes: Any) -> list[Any]:
    """One task's class ids as a list, without sizing anything by their values (a tensor is
    flattened; something that is not a collection of ids is left to ``check_task_classes``)."""
    if isinstance(classes, Tensor):
        return classes.reshape(-1).tolist()
    if isinstance(classes, Iterable) and not isinstance(classes, (str, bytes)):
        return list(classes)
    return []


def check_class_id_bounds(task_classes: Any) -> None:
    """Refuse ``task_classes`` whose class ids, or whose ``tasks x classes`` per-class table
    cells, exceed what ``results.json`` holds (`MAX_CLASSES`,
    `MAX_CLASS_TABLE_CELLS`): read id by id, before anything is
    sized by them (a per-id table of an id of 10**9 would take gigabytes). The confusion counts
    are capped where they are recorded (`MAX_CONFUSION_CELLS` nonzero
    cells in all, see `ClassIncrementalRecord.check_stage`). Other problems (no
    class, a negative or non-integer id, a class in two tasks) are left to
    [`check_task_classes`][continual_eval.functional.class_incremental.check_task_classes]."""
    tasks = task_classes.tolist() if isinstance(task_classes, Tensor) else task_classes
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Iterable):
        return
    largest, num_tasks = -1, 0
    for task, classes in enumerate(tasks):
        num_tasks += 1
        for c in _ids(classes):
            if isinstance(c, bool) or not isinstance(c, numbers.Integral):
                continue
            c = int(c)
            if c >= MAX_CLASSES:
                raise ValueError(
                    f"task_classes: task {task} lists class id {c}; results.json holds at most "
                    f"{MAX_CLASSES} classes (ids 0 .. {MAX_CLASSES - 1}), and a model has one "
                    "output per class id"
                )
            largest = max(largest, c)
    C = largest + 1
    if num_tasks * C > MAX_CLASS_TABLE_CELLS:
        raise ValueError(
            f"task_classes: {num_tasks} tasks over class ids 0 .. {C - 1} would record per-class "
            f"tables of {num_tasks} stages x {C} classes; results.json holds at most "
            f"{MAX_CLASS_TABLE_CELLS} such cells (stages x classes)"
        )


def class_incremental_scorers(task_classes: Any, names: Iterable[str]) -> dict[str, Any]:
    """The matrices ``acc_task_aware`` and ``acc_task_agnostic`` of ``task_classes`` (bounds
    checked first, `check_class_id_bounds`), refused when ``names`` (the user's scorers)
    already hold one of them. The task-aware scorer leaves the check of targets outside a task's
    classes to the task-agnostic one, which counts them on the same batches."""
    taken = set(names)
    for name in (AWARE_NAME, AGNOSTIC_NAME):
        if name in taken:
            raise ValueError(
                f"scorers already name a matrix {name!r}; with task_classes the callback adds "
                f"the matrices {AWARE_NAME!r} and {AGNOSTIC_NAME!r} itself: rename yours"
            )
    check_class_id_bounds(task_classes)
    return {
        AWARE_NAME: TaskAwareAccuracyScorer(task_classes, check_targets=False),
        AGNOSTIC_NAME: TaskAgnosticAccuracyScorer(task_classes),
    }


class ClassIncrementalRecord:
    """The record's class-incremental section (`RecordSection`):
    after every stage, the confusion counts of the seen tasks (``j <= i``) from the task-agnostic
    scorer's details, and a warning naming the tasks where the task-aware accuracy is below the
    task-agnostic one (impossible with a right ``task_classes``).

    Each stage's counts are kept on their own, sparsely: `stage_counts` gives its
    ``[nnz, 3]`` int64 ``(true, predicted, count)`` cells (row-major, counts >= 1; at most one
    cell per test sample of the seen tasks), `journal_part` their bytes for the stage journal,
    `stage_text` their ``results.json`` string (made when results are built: on the rebuild
    thread), `stage_sums` the per-class sums every measure reads. The cells
    of all stages lie in buffers that grow by doubling (32 bytes a cell, at most twice that
    allocated), so `confusion` is a view made in ``O(1)`` and `add_to` computes the measures
    from the sums in ``O(s * C)``, reading no stored cell. Recording a stage costs
    ``O(T * K * C)`` (one scan of the scorer's reduced blocks, ``K`` the most classes of a task)
    plus ``O(nnz + C)`` for its cells and sums (a sort when the task classes are not listed in
    increasing id order), whatever the stage index;
    nothing of earlier stages is touched. The stored cells of all stages together are capped at
    `MAX_CONFUSION_CELLS`: a stage that would pass it is refused (`check_stage`) before anything
    of it is recorded.

    Args:
        scorer: the run's task-agnostic scorer (its task classes and class count).
        task_names: one name per task, for the warnings.
    """

    key = "class_incremental"

    def __init__(self, scorer: TaskAgnosticAccuracyScorer, task_names: Sequence[str]) -> None:
        #: the task classes as given (plain ints), one list per task
        self.task_classes: list[list[int]] = [list(c) for c in scorer.class_lists]
        self._checked: TaskClasses = scorer.task_classes
        self.num_classes = scorer.num_class_ids
        self.task_names = list(task_names)
        if len(self.task_classes) != len(self.task_names):
            raise ValueError(
                f"task_classes has {len(self.task_classes)} class-id lists for "
                f"{len(self.task_names)} test dataloaders; give one list per task"
            )
        # [T, K] long: the true class of row r of task j's confusion block (-1: a row past the
        # task's class count, which the scorer leaves at 0)
        K = scorer.max_task_classes
        table = torch.full((len(self.task_classes), K), -1, dtype=torch.long)
        sizes = torch.tensor([len(c) for c in self.task_classes], dtype=torch.long)
        table[torch.arange(K) < sizes[:, None]] = torch.tensor(
            [c for classes in self.task_classes for c in classes], dtype=torch.long
        )
        self._row_class = table
        self._class_task = scorer.task_classes.class_task.to("cpu", torch.long)
        self._clear()
        self._pending: tuple[int, Scored, Tensor] | None = None  # check_stage's cells

    def _clear(self) -> None:
        """No stage recorded."""
        # every stored cell, stage after stage (row-major within a stage: coalesced order), in
        # buffers that grow by doubling: (stage, true, predicted) [3, capacity] and the counts
        # [capacity]; the first ``_offsets[-1]`` are used, stage i's are
        # ``_offsets[i] .. _offsets[i + 1]``. Filled cells are never changed (a buffer is
        # replaced, not written over, when stages are recorded again), so the sparse tensors
        # `confusion` hands out are views of them, made in O(1).
        self._index = torch.zeros(3, 0, dtype=torch.long)
        self._values = torch.zeros(0, dtype=torch.long)
        self._offsets = [0]
        # per stage, as each is recorded: the sums every measure reads (`stage_sums`)
        T, C = len(self.task_classes), self.num_classes
        self._correct = torch.zeros(T, C, dtype=torch.long)
        self._total = torch.zeros(T, C, dtype=torch.long)
        self._new_predictions = torch.zeros(T, dtype=torch.long)
        # stage -> encode_cells() of it, made once, on the thread that builds the results (the
        # rebuild thread): a new dict whenever stored stages are recorded again (a snapshot of
        # `deferred_add_to` keeps the dict of its own cells)
        self._encoded: dict[int, str] = {}

    # ------------------------------------------------------------------ recording
    def record_baseline(self, scored: Scored) -> None:
        """Nothing: the counts start with the first stage."""

    def check_stage(self, stage: int, scored: Scored) -> None:
        """The evaluation must hold the task-agnostic scorer's confusion blocks of every seen
        task, and its nonzero cells must fit under `MAX_CONFUSION_CELLS`
        with those of the other stages."""
        blocks = scored.details.get(AGNOSTIC_NAME)
        seen = [j for j in scored.task_ids if j <= stage]
        if blocks is None or len(blocks) != len(scored.task_ids) or len(seen) != stage + 1:
            raise ValueError(
                f"stage {stage}: the evaluation holds no confusion counts of the "
                f"{AGNOSTIC_NAME!r} scorer for the seen tasks 0 .. {stage}"
            )
        cells = self._stage_cells(stage, scored)
        others = self._offsets[min(stage, self.recorded_stages)]
        if others + len(cells) > MAX_CONFUSION_CELLS:
            raise ValueError(
                f"stage {stage}: its confusion counts have {len(cells)} nonzero cells, and the "
                f"stages recorded before hold {others}; results.json holds at most "
                f"{MAX_CONFUSION_CELLS} nonzero confusion cells in all (at most one per test "
                "sample of the seen tasks per stage): evaluate fewer test samples per task"
            )
        self._pending = (stage, scored, cells)

    def _stage_cells(self, stage: int, scored: Scored) -> Tensor:
        """The ``[nnz, 3]`` ``(true, predicted, count)`` cells of the seen tasks' blocks, summed
        into one ``[C, C]`` matrix (row = true class id), row-major: from the nonzero entries of
        the blocks, never a dense ``[C, C]``."""
        blocks = scored.details[AGNOSTIC_NAME]  # [tasks, K, C] int64 (or one [K, C] per task)
        if not isinstance(blocks, Tensor):
            blocks = torch.stack([torch.as_tensor(b) for b in blocks])
        tasks = torch.tensor(scored.task_ids, dtype=torch.long)
        position, row, pred = blocks.nonzero(as_tuple=True)
        count = blocks[position, row, pred]
        task = tasks[position]
        true = self._row_class[task, row]
        keep = (task <= stage) & (true >= 0)
        true, pred, count = true[keep], pred[keep], count[keep]
        # a class is in one task: (true, pred) is distinct across the blocks; row-major order
        # (already so when the tasks' class ids increase in the order they are listed)
        key = true * self.num_classes + pred
        if not bool((key[1:] > key[:-1]).all()):
            order = torch.argsort(key)
            true, pred, count = true[order], pred[order], count[order]
        return torch.stack([true, pred, count], 1)

    def record_stage(self, stage: int, scored: Scored) -> list[str]:
        """Record the stage's confusion counts (the cells `check_stage` made for the same
        evaluation, or made now); returns the inverted-accuracy warning."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == stage and pending[1] is scored:
            cells = pending[2]
        else:
            cells = self._stage_cells(stage, scored)
        self._append(stage, cells)
        return self._inverted(stage, scored.rows)

    @property
    def recorded_stages(self) -> int:
        """The stages recorded (0 .. ``recorded_stages - 1``; a stage skipped is empty)."""
        return len(self._offsets) - 1

    def _append(self, stage: int, cells: Tensor) -> None:
        """Record stage ``stage``'s ``[nnz, 3]`` row-major cells (distinct, counts >= 1) and
        their sums (`stage_sums`), ``O(nnz + C)``: the next stage, or again a stage recorded
        before (the later ones dropped), or a later one (the stages between left empty)."""
        if stage >= len(self.task_classes):
            raise ValueError(
                f"stage {stage}: confusion counts of at most {len(self.task_classes)} stages "
                "(one per task) are recorded"
            )
        if stage < self.recorded_stages:  # new buffers: views handed out stay as they were
            end = self._offsets[stage]
            self._index, self._values = self._index[:, :end].clone(), self._values[:end].clone()
            del self._offsets[stage + 1 :]
            self._correct[stage:] = 0
            self._total[stage:] = 0
            self._new_predictions[stage:] = 0
            kept = self._encoded.copy()  # one C call: the rebuild thread may add to it meanwhile
            self._encoded = {k: v for k, v in kept.items() if k < stage}
        while self.recorded_stages < stage:
            self._offsets.append(self._offsets[-1])
        start, n = self._offsets[-1], len(cells)
        if start + n > self._values.numel():  # grow by doubling (amortised O(1) a cell)
            capacity = max(2 * self._values.numel(), start + n, 1024)
            index = torch.zeros(3, capacity, dtype=torch.long)
            values = torch.zeros(capacity, dtype=torch.long)
            index[:, :start] = self._index[:, :start]
            values[:start] = self._values[:start]
            self._index, self._values = index, values
        true, pred, count = cells[:, 0], cells[:, 1], cells[:, 2]
        self._index[0, start : start + n] = stage
        self._index[1, start : start + n] = true
        self._index[2, start : start + n] = pred
        self._values[start : start + n] = count
        self._offsets.append(start + n)
        # the sums of `sums_of_counts` (results.class_incremental), of this stage's cells alone
        right = true == pred
        self._total[stage].index_add_(0, true, count)
        self._correct[stage].index_add_(0, true[right], count[right])
        true_task = self._class_task[true]
        to_new = (true_task >= 0) & (true_task <= stage) & (self._class_task[pred] == stage)
        self._new_predictions[stage] = count[to_new].sum()

    def _inverted(self, stage: int, rows: Mapping[str, Tensor]) -> list[str]:
        aware, agnostic = rows.get(AWARE_NAME), rows.get(AGNOSTIC_NAME)
        if aware is None or agnostic is None:
            return []
        cells = [
            f"{self.task_names[j]} ({a:.4f} < {b:.4f})"
            for j, (a, b) in enumerate(zip(aware.tolist(), agnostic.tolist(), strict=True))
            if math.isfinite(a) and math.isfinite(b) and a < b
        ]
        if not cells:
            return []
        return [
            f"ContinualEvalCallback: after stage {stage} the task-aware accuracy is below the "
            f"task-agnostic one on {len(cells)} task(s): "
            + ", ".join(cells[:10])
            + (", ..." if len(cells) > 10 else "")
            + ". The argmax over a task's own classes is right whenever the argmax over a "
            "superset of them is, so this cannot happen when task_classes matches the model's "
            "outputs and the test sets: check the class ids of task_classes"
        ]

    # ------------------------------------------------------------------ results
    def stage_counts(self, stage: int) -> Tensor:
        """Stage ``stage``'s counts: ``[nnz, 3]`` int64 ``(true, predicted, count)`` rows of the
        nonzero cells, row-major (empty for a stage not recorded). Each stage's counts stand on
        their own (not a difference to another stage)."""
        if not 0 <= stage < self.recorded_stages:
            return torch.zeros(0, 3, dtype=torch.int64)
        a, b = self._offsets[stage], self._offsets[stage + 1]
        return torch.stack([self._index[1, a:b], self._index[2, a:b], self._values[a:b]], 1)

    def stage_text(self, stage: int) -> str:
        """Stage ``stage``'s ``confusion.stages`` string of ``results.json``
        (``"true:predicted:count ..."``), made once per recorded stage."""
        return _stage_text(self._snapshot(stage + 1), stage)

    def _snapshot(self, num_stages: int) -> tuple[Tensor, Tensor, list[int], dict[int, str]]:
        """What the first ``num_stages`` stages' strings are made from, later and on another
        thread: views of the stored cells (never written over), their offsets, the string
        cache of these cells."""
        n = min(num_stages, self.recorded_stages)
        return self._index, self._values, self._offsets[: n + 1], self._encoded

    @property
    def stored_cells(self) -> int:
        """The nonzero cells recorded, all stages together (24 bytes each)."""
        return self._offsets[-1]

    def confusion(self, num_stages: int) -> Tensor:
        """``[num_stages, C, C]`` int64 as a coalesced sparse COO tensor: each recorded stage's
        counts (no dense ``[S, C, C]``): a view of the stored cells, made in ``O(1)``."""
        C = self.num_classes
        if num_stages > len(self.task_classes):
            return sparse_confusion([self.stage_counts(stage) for stage in range(num_stages)], C)
        n = self._offsets[min(num_stages, self.recorded_stages)]
        return torch.sparse_coo_tensor(
            self._index[:, :n],
            self._values[:n],
            (num_stages, C, C),
            is_coalesced=True,
            check_invariants=False,
        )

    def stage_sums(self, num_stages: int) -> tuple[Tensor, Tensor, Tensor]:
        """The sums of the first ``num_stages`` stages' counts that every class-incremental
        measure reads, kept as each stage is recorded: correct predictions and test samples per
        stage and class (``[s, C]`` int64: the diagonal and the row sums) and the seen-class
        samples predicted as a class of the stage's own task (``[s]``); see
        [`ClassIncrementalResults.compute`][continual_eval.results.ClassIncrementalResults.compute]'s
        ``stage_counts``. Copies (``O(s * C)``)."""
        return (
            self._correct[:num_stages].clone(),
            self._total[:num_stages].clone(),
            self._new_predictions[:num_stages].clone(),
        )

    def add_to(self, results: ContinualResults) -> ContinualResults:
        """``results`` with the ``class_incremental`` section of its stages: the measures from
        the sums kept per stage (`stage_sums`, ``O(s * C)``), the counts a view of the stored
        cells and their text encoded once per stage, so that no stored cell is read again."""
        return self.deferred_add_to(results.primary.num_stages)(results)

    def deferred_add_to(self, num_stages: int) -> Callable[[ContinualResults], ContinualResults]:
        """`add_to` for results of the first ``num_stages`` stages, as a function to call later
        (on the background writer of `RunRecord.deferred_results`): what it reads is taken now,
        in ``O(s * C)`` (copies of the sums; the counts a view of cells that are never written
        over; the stage strings, immutable), so that stages recorded meanwhile do not change it."""
        sums = None if num_stages > len(self.task_classes) else self.stage_sums(num_stages)
        confusion = self.confusion(num_stages)
        snapshot = self._snapshot(num_stages)  # the strings are made when `add` runs
        task_classes, checked = self.task_classes, self._checked  # set once, never changed

        def add(results: ContinualResults) -> ContinualResults:
            section = ClassIncrementalResults.compute(
                task_classes,
                confusion,
                forgetting=results.forgetting,
                confusion_text=_stage_texts(snapshot, num_stages),
                checked=checked,
                stage_counts=sums,
            )
            return dataclasses.replace(results, class_incremental=section)

        return add

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The task classes and, per stage, its ``[nnz, 3]`` int64 cells (plain tensors:
        ``torch.load(weights_only=True)`` reads them)."""
        return {
            "task_classes": [list(c) for c in self.task_classes],
            "cells": {stage: self.stage_counts(stage) for stage in range(self.recorded_stages)},
        }

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore the recorded counts (``cells``: per stage its ``[nnz, 3]`` cells); a state of
        other ``task_classes``, or one without ``cells``, is refused (nothing changes)."""
        if state is None:
            raise ValueError("the state holds no class-incremental counts")
        recorded = [list(c) for c in state["task_classes"]]
        if recorded != self.task_classes:
            raise ValueError(
                f"the state was recorded with other task_classes ({recorded}, now "
                f"{self.task_classes}); resume with the recorded task_classes, or start a new run"
            )
        if "cells" not in state:
            raise ValueError(
                "the state's class-incremental counts hold no 'cells' (per stage its "
                "(true, predicted, count) cells): it was not written by this version"
            )
        cells = {
            int(stage): _checked_cells(stage, m, self.num_classes)
            for stage, m in state["cells"].items()
        }
        beyond = [stage for stage in cells if not 0 <= stage < len(self.task_classes)]
        if beyond:
            raise ValueError(
                f"the state holds confusion counts of stage {beyond[0]}; a run of "
                f"{len(self.task_classes)} tasks has stages 0 .. {len(self.task_classes) - 1}"
            )
        self._clear()
        for stage, stage_cells in sorted(cells.items()):
            self._append(stage, stage_cells)
        self._pending = None

    # ------------------------------------------------------------------ journal
    def journal_settings(self) -> dict[str, Any]:
        return {"task_classes": [list(c) for c in self.task_classes]}

    @classmethod
    def from_journal(
        cls, settings: Mapping[str, Any], task_names: Sequence[str]
    ) -> ClassIncrementalRecord:
        check_class_id_bounds(settings["task_classes"])
        return cls(TaskAgnosticAccuracyScorer(settings["task_classes"]), task_names)

    def journal_part(self, stage: int | None) -> dict[str, str] | None:
        """The stage's nonzero confusion cells (`stage_counts`) as the little-endian bytes of
        their ``[nnz, 3]`` array, base64 (``{"dtype": "<i4" or "<i8", "cells": ...}``: int32
        when every value fits): a copy, so the hook's journal line costs little per cell (the
        ``results.json`` string is made on the rebuild thread); the baseline: nothing."""
        if stage is None:
            return None
        cells = self.stage_counts(stage).numpy()
        dtype = "<i4" if not len(cells) or int(cells.max()) <= np.iinfo(np.int32).max else "<i8"
        raw = np.ascontiguousarray(cells, dtype=dtype).tobytes()
        return {"dtype": dtype, "cells": base64.b64encode(raw).decode("ascii")}

    def replay_part(self, stage: int | None, part: Any) -> None:
        """Record a journal line's cells of ``stage`` (`journal_part`'s), refused, naming the
        stage and the cell, unless class ids are below ``C``, counts >= 1 and each cell given
        once."""
        if stage is None:
            return
        where = f"the journal's confusion cells of stage {stage}"
        if (
            not isinstance(part, Mapping)
            or part.get("dtype") not in _JOURNAL_DTYPES
            or not isinstance(part.get("cells"), str)
        ):
            raise ValueError(
                f"{where}: expected {{'dtype': '<i4' or '<i8', 'cells': base64 text}}, found "
                f"{type(part).__name__} (a journal of an earlier development version is not "
                "read: start a new run)"
            )
        try:
            raw = base64.b64decode(part["cells"], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{where}: 'cells' is not base64 text") from None
        width = 3 * np.dtype(part["dtype"]).itemsize
        if len(raw) % width:
            raise ValueError(
                f"{where}: {len(raw)} bytes are not whole (true, predicted, count) cells of "
                f"{width} bytes"
            )
        cells = torch.from_numpy(np.frombuffer(raw, dtype=part["dtype"]).astype(np.int64))
        self._append(stage, _checked_cells(stage, cells, self.num_classes, "the journal's"))


#: the journal's cell types: little-endian int32 or int64
_JOURNAL_DTYPES = ("<i4", "<i8")


def _stage_texts(
    snapshot: tuple[Tensor, Tensor, list[int], dict[int, str]], num_stages: int
) -> list[str]:
    """The ``results.json`` strings of the first ``num_stages`` stages of a `_snapshot`."""
    return [_stage_text(snapshot, stage) for stage in range(num_stages)]


def _stage_text(snapshot: tuple[Tensor, Tensor, list[int], dict[int, str]], stage: int) -> str:
    """Stage ``stage``'s ``results.json`` string of a `_snapshot` (``""``: a stage not
    recorded), encoded once per cache (`encode_cells`)."""
    index, values, offsets, cache = snapshot
    if stage + 1 >= len(offsets):  # not recorded (not cached: it may be recorded later)
        return ""
    text = cache.get(stage)
    if text is None:
        a, b = offsets[stage], offsets[stage + 1]
        text = encode_cells(torch.stack([index[1, a:b], index[2, a:b], values[a:b]], 1))
        cache[stage] = text
    return text


def _checked_cells(stage: Any, given: Any, C: int, source: str = "the state's") -> Tensor:
    """A state's (or journal line's) ``[nnz, 3]`` cells of one stage as int64, sorted row-major;
    refused unless class ids are below ``C``, counts >= 1 and each cell given once."""
    cells = torch.as_tensor(given).to("cpu", torch.int64).reshape(-1, 3).clone()
    bad = (cells[:, :2] < 0).any(1) | (cells[:, :2] >= C).any(1) | (cells[:, 2] < 1)
    if bool(bad.any()):
        n = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{source} confusion cells of stage {stage}: cell {n} = {cells[n].tolist()} is not "
            f"(true, predicted, count) with class ids below {C} and a count >= 1"
        )
    key, order = torch.sort(cells[:, 0] * C + cells[:, 1])
    repeated = (torch.diff(key) == 0).nonzero()
    if len(repeated):
        raise ValueError(
            f"{source} confusion cells of stage {stage}: the cell "
            f"{cells[order[int(repeated[0, 0])], :2].tolist()} is given twice"
        )
    return cells[order]

"""What ``ContinualEvalCallback(task_classes=...)`` adds: the two class-incremental scorers
(`class_incremental_scorers`) and the record's section of the confusion counts of every
stage (`ClassIncrementalRecord`, its checkpoint state and the ``class_incremental``
section of ``results.json``)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

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
from continual_eval.results.class_incremental import encode_confusion
from continual_eval.results.schema import MAX_CLASSES, MAX_CONFUSION_CELLS

__all__ = ["ClassIncrementalRecord", "check_class_id_bounds", "class_incremental_scorers"]


def _ids(classes: Any) -> list[Any]:
    """One task's class ids as a list, without sizing anything by their values (a tensor is
    flattened; something that is not a collection of ids is left to ``check_task_classes``)."""
    if isinstance(classes, Tensor):
        return classes.reshape(-1).tolist()
    if isinstance(classes, Iterable) and not isinstance(classes, (str, bytes)):
        return list(classes)
    return []


def check_class_id_bounds(task_classes: Any) -> None:
    """Refuse ``task_classes`` whose class ids, or whose ``tasks x classes**2`` confusion cells,
    exceed what ``results.json`` holds (`MAX_CLASSES`,
    `MAX_CONFUSION_CELLS`): read id by id, before anything is
    sized by them (a per-id table of an id of 10**9 would take gigabytes). Other problems (no
    class, a negative or non-integer id, a class in two tasks) are left to
    [`check_task_classes`][continual_eval.functional.check_task_classes]."""
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
    if num_tasks * C * C > MAX_CONFUSION_CELLS:
        raise ValueError(
            f"task_classes: {num_tasks} tasks over class ids 0 .. {C - 1} would record "
            f"{num_tasks} confusion matrices of {C} x {C} counts; results.json holds at most "
            f"{MAX_CONFUSION_CELLS} confusion cells (stages x classes**2)"
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
        self._confusion: dict[int, Tensor] = {}  # stage -> [C, C] int64 (CPU)
        self._encoded: dict[int, str] = {}  # stage -> encode_confusion() of it, made once

    # ------------------------------------------------------------------ recording
    def record_baseline(self, scored: Scored) -> None:
        """Nothing: the counts start with the first stage."""

    def check_stage(self, stage: int, scored: Scored) -> None:
        """The evaluation must hold the task-agnostic scorer's confusion blocks of every seen
        task."""
        blocks = scored.details.get(AGNOSTIC_NAME)
        seen = [j for j in scored.task_ids if j <= stage]
        if blocks is None or len(blocks) != len(scored.task_ids) or len(seen) != stage + 1:
            raise ValueError(
                f"stage {stage}: the evaluation holds no confusion counts of the "
                f"{AGNOSTIC_NAME!r} scorer for the seen tasks 0 .. {stage}"
            )

    def record_stage(self, stage: int, scored: Scored) -> list[str]:
        """Record the stage's confusion counts: the reduced blocks of the seen tasks summed into
        one ``[C, C]`` matrix (row = true class id); returns the inverted-accuracy warning."""
        blocks = scored.details[AGNOSTIC_NAME]
        confusion = torch.zeros(self.num_classes, self.num_classes, dtype=torch.int64)
        for task, block in zip(scored.task_ids, blocks, strict=True):
            if task <= stage:
                classes = torch.tensor(self.task_classes[task], dtype=torch.long)
                confusion.index_add_(0, classes, block[: len(classes)])
        self._confusion[stage] = confusion
        self._encoded.pop(stage, None)
        return self._inverted(stage, scored.rows)

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
    def confusion(self, num_stages: int) -> Tensor:
        """``[num_stages, C, C]`` int64: each recorded stage's counts."""
        C = self.num_classes
        out = torch.zeros(num_stages, C, C, dtype=torch.int64)
        for stage, matrix in self._confusion.items():
            if stage < num_stages:
                out[stage] = matrix
        return out

    def add_to(self, results: ContinualResults) -> ContinualResults:
        """``results`` with the ``class_incremental`` section of its stages."""
        num_stages = results.primary.num_stages
        confusion = self.confusion(num_stages)
        for stage in range(num_stages):
            if stage not in self._encoded:
                self._encoded[stage] = encode_confusion(confusion[stage])
        section = ClassIncrementalResults.compute(
            self.task_classes,
            confusion,
            forgetting=results.forgetting,
            confusion_text=[self._encoded[stage] for stage in range(num_stages)],
            checked=self._checked,
        )
        return dataclasses.replace(results, class_incremental=section)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "task_classes": [list(c) for c in self.task_classes],
            "confusion": {stage: m.clone() for stage, m in sorted(self._confusion.items())},
        }

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore the recorded counts; a state of other ``task_classes`` is refused (nothing
        changes)."""
        if state is None:
            raise ValueError("the state holds no class-incremental counts")
        recorded = [list(c) for c in state["task_classes"]]
        if recorded != self.task_classes:
            raise ValueError(
                f"the state was recorded with other task_classes ({recorded}, now "
                f"{self.task_classes}); resume with the recorded task_classes, or start a new run"
            )
        self._confusion = {
            int(stage): torch.as_tensor(m).to("cpu", torch.int64).clone()
            for stage, m in state["confusion"].items()
        }
        self._encoded = {}

    # ------------------------------------------------------------------ journal
    def journal_settings(self) -> dict[str, Any]:
        return {"task_classes": [list(c) for c in self.task_classes]}

    @classmethod
    def from_journal(
        cls, settings: Mapping[str, Any], task_names: Sequence[str]
    ) -> ClassIncrementalRecord:
        check_class_id_bounds(settings["task_classes"])
        return cls(TaskAgnosticAccuracyScorer(settings["task_classes"]), task_names)

    def journal_part(self, stage: int | None) -> list[list[int]] | None:
        """The stage's nonzero confusion cells as ``[true, predicted, count]`` (the baseline:
        nothing)."""
        if stage is None:
            return None
        counts = self._confusion[stage]
        cells = counts.nonzero()
        return torch.cat([cells, counts[cells[:, 0], cells[:, 1]].unsqueeze(1)], 1).tolist()

    def replay_part(self, stage: int | None, part: Any) -> None:
        if stage is None:
            return
        cells = torch.tensor(part, dtype=torch.int64).reshape(-1, 3)
        if len(cells) and (cells[:, :2].min() < 0 or cells[:, :2].max() >= self.num_classes):
            raise ValueError(
                f"stage {stage}: a confusion cell outside the {self.num_classes} classes"
            )
        confusion = torch.zeros(self.num_classes, self.num_classes, dtype=torch.int64)
        confusion[cells[:, 0], cells[:, 1]] = cells[:, 2]
        self._confusion[stage] = confusion
        self._encoded.pop(stage, None)

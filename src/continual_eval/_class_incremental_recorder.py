"""What ``ContinualEvalCallback(task_classes=...)`` keeps besides its matrices: the two
class-incremental scorers it adds, and the confusion counts of every stage (its checkpoint state
and the ``class_incremental`` section of ``results.json``)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from continual_eval.evaluation.class_incremental import (
    AGNOSTIC_NAME,
    AWARE_NAME,
    TaskAgnosticAccuracyScorer,
    TaskAwareAccuracyScorer,
)
from continual_eval.results import ClassIncrementalResults
from continual_eval.results.class_incremental import encode_confusion
from continual_eval.results.schema import MAX_CLASSES, MAX_CONFUSION_CELLS

__all__ = ["ClassIncrementalRecorder"]


class ClassIncrementalRecorder:
    """The callback's class-incremental part: adds ``acc_task_aware`` and ``acc_task_agnostic``
    to its scorers, collects each stage's confusion counts of the seen tasks (``j <= i``) from
    the task-agnostic scorer after the stage's evaluation, and checks every stage's two rows
    against each other."""

    def __init__(self, task_classes: Any, scorers: dict[str, Any]) -> None:
        for name in (AWARE_NAME, AGNOSTIC_NAME):
            if name in scorers:
                raise ValueError(
                    f"scorers already name a matrix {name!r}; with task_classes the callback adds "
                    f"the matrices {AWARE_NAME!r} and {AGNOSTIC_NAME!r} itself: rename yours"
                )
        self.aware = TaskAwareAccuracyScorer(task_classes)
        self.agnostic = TaskAgnosticAccuracyScorer(task_classes)
        # the task-agnostic scorer checks the same targets against the same task's classes
        self.aware.check_targets = False
        #: the task classes as given (plain ints), one list per task
        self.task_classes: list[list[int]] = [list(c) for c in self.agnostic.class_lists]
        T, C = len(self.task_classes), self.agnostic.num_class_ids
        if C > MAX_CLASSES or T * C * C > MAX_CONFUSION_CELLS:
            raise ValueError(
                f"task_classes: {T} tasks over class ids 0 .. {C - 1} would record {T} confusion "
                f"matrices of {C} x {C} counts; results.json holds at most {MAX_CLASSES} classes "
                f"and {MAX_CONFUSION_CELLS} confusion cells (stages x classes**2)"
            )
        scorers[AWARE_NAME] = self.aware
        scorers[AGNOSTIC_NAME] = self.agnostic
        self._confusion: dict[int, Tensor] = {}  # stage -> [C, C] int64 (CPU)
        self._encoded: dict[int, str] = {}  # stage -> encode_confusion() of it, made once
        self._warned: set[int] = set()

    @classmethod
    def attach(cls, task_classes: Any, scorers: dict[str, Any]) -> ClassIncrementalRecorder | None:
        """``None`` without ``task_classes``; else a recorder whose scorers are now in
        ``scorers`` (after the user's, so the primary matrix stays theirs)."""
        if task_classes is None:
            return None
        return cls(task_classes, scorers)

    @property
    def num_classes(self) -> int:
        return self.agnostic.num_class_ids

    def check_num_tasks(self, num_tasks: int) -> None:
        """One class-id list per test dataloader."""
        if len(self.task_classes) != num_tasks:
            raise ValueError(
                f"task_classes has {len(self.task_classes)} class-id lists for {num_tasks} test "
                "dataloaders; give one list per task"
            )

    def reset(self) -> None:
        self._confusion = {}
        self._encoded = {}
        self._warned = set()

    # ------------------------------------------------------------------ recording
    def record_stage(
        self,
        stage: int,
        rows: Mapping[str, Tensor],
        *,
        task_names: Sequence[str],
        warn: bool = True,
    ) -> None:
        """After stage ``stage``'s evaluation: its confusion counts (the reduced blocks of the
        seen tasks ``j <= stage``) and, with ``warn``, a warning naming the cells where the
        task-aware accuracy is below the task-agnostic one."""
        C = self.num_classes
        confusion = torch.zeros(C, C, dtype=torch.int64)
        for task, block in self.agnostic.last_confusion.items():
            if task <= stage:
                classes = torch.tensor(self.task_classes[task], dtype=torch.long)
                confusion.index_add_(0, classes, block[: len(classes)])
        self._confusion[stage] = confusion
        self._encoded.pop(stage, None)
        if warn and stage not in self._warned:
            self._warn_inverted(stage, rows, task_names)

    def _warn_inverted(
        self, stage: int, rows: Mapping[str, Tensor], task_names: Sequence[str]
    ) -> None:
        aware, agnostic = rows.get(AWARE_NAME), rows.get(AGNOSTIC_NAME)
        if aware is None or agnostic is None:
            return
        cells = [
            f"{task_names[j]} ({a:.4f} < {b:.4f})"
            for j, (a, b) in enumerate(zip(aware.tolist(), agnostic.tolist(), strict=True))
            if math.isfinite(a) and math.isfinite(b) and a < b
        ]
        if not cells:
            return
        self._warned.add(stage)
        warnings.warn(
            f"ContinualEvalCallback: after stage {stage} the task-aware accuracy is below the "
            f"task-agnostic one on {len(cells)} task(s): "
            + ", ".join(cells[:10])
            + (", ..." if len(cells) > 10 else "")
            + ". The argmax over a task's own classes is right whenever the argmax over a "
            "superset of them is, so this cannot happen when task_classes matches the model's "
            "outputs and the test sets: check the class ids of task_classes",
            stacklevel=3,
        )

    # ------------------------------------------------------------------ results
    def confusion(self, num_stages: int) -> Tensor:
        """``[num_stages, C, C]`` int64: each recorded stage's counts, zeros for a stage without
        (recorded before this state existed)."""
        C = self.num_classes
        out = torch.zeros(num_stages, C, C, dtype=torch.int64)
        for stage, matrix in self._confusion.items():
            if stage < num_stages:
                out[stage] = matrix
        return out

    def results(self, num_stages: int, forgetting: str) -> ClassIncrementalResults:
        """The ``class_incremental`` section of the stages so far."""
        confusion = self.confusion(num_stages)
        for stage in range(num_stages):
            if stage not in self._encoded:
                self._encoded[stage] = encode_confusion(confusion[stage])
        return ClassIncrementalResults.compute(
            self.task_classes,
            confusion,
            forgetting=forgetting,
            confusion_text=[self._encoded[stage] for stage in range(num_stages)],
            checked=self.agnostic.task_classes,
        )

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "task_classes": [list(c) for c in self.task_classes],
            "confusion": {stage: m.clone() for stage, m in sorted(self._confusion.items())},
        }

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore the recorded counts; ``None`` (a checkpoint written without them): none, so
        the stages recorded there have no confusion counts. A state of other ``task_classes`` is
        refused."""
        self._encoded = {}
        if state is None:
            self._confusion = {}
            return
        recorded = [list(c) for c in state.get("task_classes", [])]
        if recorded != self.task_classes:
            raise ValueError(
                "ContinualEvalCallback: the checkpoint's state was recorded with other "
                f"task_classes ({recorded}, now {self.task_classes}); resume with the recorded "
                "task_classes, or start a new run"
            )
        self._confusion = {
            int(stage): torch.as_tensor(m).to("cpu", torch.int64).clone()
            for stage, m in state.get("confusion", {}).items()
        }

"""The step curves of a run: every evaluation inside a stage (``eval_every_n_steps``) and at its
end, as ``(step, stage, scores, full)`` rows, with the rule that a stage-end evaluation replaces a
per-step one taken at the same step."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["StepCurves"]


class StepCurves:
    """Rows ``(step, stage, scores [T], full)``; ``scores`` holds the tasks ``<= stage`` (NaN for
    later tasks), ``full`` says whether the whole test sets were scored (else a fixed subset)."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.stages: list[int] = []
        self.scores: list[Tensor] = []
        self.full: list[bool] = []

    def __len__(self) -> int:
        return len(self.steps)

    def clear(self) -> None:
        self.steps, self.stages, self.scores, self.full = [], [], [], []

    def add(self, step: int, stage: int, row: Tensor, full: bool) -> Tensor | None:
        """Append a row (its tasks after ``stage`` set to NaN). A row for the same ``(step,
        stage)`` as the last one replaces it (a stage end at the step of a per-step evaluation);
        the replaced row is returned when it was a whole-test-set row, else ``None``."""
        row = row.clone()
        row[stage + 1 :] = math.nan
        replaced = None
        if self.steps and self.steps[-1] == step and self.stages[-1] == stage:
            self.steps.pop()
            self.stages.pop()
            replaced = self.scores.pop()
            if not self.full.pop():
                replaced = None
        self.steps.append(step)
        self.stages.append(stage)
        self.scores.append(row)
        self.full.append(full)
        return replaced

    def tensors(self, num_tasks: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(step [N] int64, stage [N] int64, scores [N, T] float64)``."""
        scores = (
            torch.stack(self.scores)
            if self.scores
            else torch.zeros(0, num_tasks, dtype=torch.float64)
        )
        return (
            torch.tensor(self.steps, dtype=torch.int64),
            torch.tensor(self.stages, dtype=torch.int64),
            scores,
        )

    def state_dict(self) -> dict[str, Any]:
        """The rows under the checkpoint keys of the callback's state (``curve_*``)."""
        return {
            "curve_step": list(self.steps),
            "curve_stage": list(self.stages),
            "curve_scores": [row.clone() for row in self.scores],
            "curve_full": list(self.full),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.steps = [int(s) for s in state.get("curve_step", [])]
        self.stages = [int(s) for s in state.get("curve_stage", [])]
        self.scores = [row.double() for row in state.get("curve_scores", [])]
        self.full = [bool(f) for f in state.get("curve_full", [True] * len(self.steps))]
        if not len(self.steps) == len(self.stages) == len(self.scores) == len(self.full):
            raise ValueError(
                "the checkpoint's step curves have rows of different lengths: "
                f"{len(self.steps)} steps, {len(self.stages)} stages, {len(self.scores)} score "
                f"rows, {len(self.full)} flags"
            )

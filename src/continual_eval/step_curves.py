"""The step curves of a run: every evaluation inside a stage (``eval_every_n_steps``) and at its
end, as ``(step, stage, scores per scorer, full)`` rows, with the rule that a stage-end evaluation
replaces a per-step one taken at the same step."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["StepCurves"]


class StepCurves:
    """Rows ``(step, stage, {scorer: scores [T]}, full)``; ``scores`` holds the tasks
    ``<= stage`` (NaN for later tasks), ``full`` says whether the whole test sets were scored
    (else a fixed subset). Every evaluation scores every scorer of ``names`` (the primary first).
    """

    def __init__(self, names: Sequence[str] = ("acc",)) -> None:
        if not names:
            raise ValueError("StepCurves needs at least one scorer name")
        #: the scorers, the primary first
        self.names: list[str] = list(names)
        self.steps: list[int] = []
        self.stages: list[int] = []
        #: scorer -> its rows, one per evaluation
        self.rows: dict[str, list[Tensor]] = {name: [] for name in self.names}
        self.full: list[bool] = []

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def primary(self) -> str:
        return self.names[0]

    @property
    def scores(self) -> list[Tensor]:
        """The primary scorer's rows."""
        return self.rows[self.primary]

    def clear(self) -> None:
        self.steps, self.stages, self.full = [], [], []
        self.rows = {name: [] for name in self.names}

    def last(self) -> dict[str, Tensor]:
        """The rows of the last evaluation, scorer -> ``[T]``."""
        return {name: rows[-1] for name, rows in self.rows.items()}

    def add(
        self, step: int, stage: int, rows: Mapping[str, Tensor] | Tensor, full: bool
    ) -> dict[str, Tensor] | None:
        """Append an evaluation: ``rows`` maps every scorer to its row ``[T]`` (a tensor alone is
        the primary scorer's row; the others are then NaN), tasks after ``stage`` set to NaN. An
        evaluation at the same ``(step, stage)`` as the last one replaces it (a stage end at the
        step of a per-step evaluation); the replaced rows are returned when they were
        whole-test-set rows, else ``None``."""
        if isinstance(rows, Tensor):
            rows = {self.primary: rows}
        missing = [name for name in self.names if name not in rows]
        if len(missing) == len(self.names):
            raise ValueError(f"no row for any scorer of {self.names}")
        num_tasks = next(len(rows[name]) for name in self.names if name in rows)
        new: dict[str, Tensor] = {}
        for name in self.names:
            row = (
                rows[name].detach().cpu().double().clone()
                if name in rows
                else torch.full((num_tasks,), math.nan, dtype=torch.float64)
            )
            row[stage + 1 :] = math.nan
            new[name] = row
        replaced = None
        if self.steps and self.steps[-1] == step and self.stages[-1] == stage:
            self.steps.pop()
            self.stages.pop()
            replaced = {name: self.rows[name].pop() for name in self.names}
            if not self.full.pop():
                replaced = None
        self.steps.append(step)
        self.stages.append(stage)
        for name in self.names:
            self.rows[name].append(new[name])
        self.full.append(full)
        return replaced

    def tensors(self, num_tasks: int, name: str | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(step [N] int64, stage [N] int64, scores [N, T] float64)`` of the scorer ``name``
        (default: the primary one)."""
        if name is not None and name not in self.rows:
            raise KeyError(f"no step curves for {name!r}; the scorers are {self.names}")
        rows = self.rows[self.primary if name is None else name]
        scores = torch.stack(rows) if rows else torch.zeros(0, num_tasks, dtype=torch.float64)
        return (
            torch.tensor(self.steps, dtype=torch.int64),
            torch.tensor(self.stages, dtype=torch.int64),
            scores,
        )

    def state_dict(self) -> dict[str, Any]:
        """The rows as plain values and CPU tensors: ``step``, ``stage``, ``full`` (one each per
        evaluation) and ``rows`` (scorer -> its rows)."""
        return {
            "step": list(self.steps),
            "stage": list(self.stages),
            "full": list(self.full),
            "rows": {name: [row.clone() for row in self.rows[name]] for name in self.names},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the rows by `state_dict`'s; refused (nothing changes) when the lengths
        differ or the scorers are not `names`."""
        steps = [int(s) for s in state["step"]]
        stages = [int(s) for s in state["stage"]]
        full = [bool(f) for f in state["full"]]
        recorded = state["rows"]
        if sorted(recorded) != sorted(self.names):
            raise ValueError(
                f"the step curves were recorded for the scorers {sorted(recorded)}, not "
                f"{sorted(self.names)}"
            )
        rows = {name: [row.double() for row in recorded[name]] for name in self.names}
        lengths = {len(steps), len(stages), len(full), *(len(r) for r in rows.values())}
        if len(lengths) != 1:
            raise ValueError(
                "the step curves have rows of different lengths: "
                f"{len(steps)} steps, {len(stages)} stages, {len(full)} flags, "
                + ", ".join(f"{len(r)} {name!r} rows" for name, r in rows.items())
            )
        self.steps, self.stages, self.full, self.rows = steps, stages, full, rows

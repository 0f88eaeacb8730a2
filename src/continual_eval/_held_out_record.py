"""The held-out sets' part of a `RunRecord`: each set's scores with
every matrix at the baseline and after every stage (sets never trained; not part of ``R``).
Their rows arrive in `Scored.held_out`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from continual_eval.functional._validation import check_cells
from continual_eval.results.held_out import HeldOutResults

if TYPE_CHECKING:
    from continual_eval.record import MatrixSpec, Scored
    from continual_eval.results import ContinualResults

__all__ = ["HeldOutRecord"]


class HeldOutRecord:
    """The held-out sets ``names`` scored with the matrices ``specs`` (a record section)."""

    key = "held_out"

    def __init__(self, names: Sequence[str], specs: Mapping[str, MatrixSpec]) -> None:
        self.names = list(names)
        self.specs = dict(specs)
        self.baseline: dict[str, Tensor] = {}
        self.rows: dict[str, list[Tensor]] = {name: [] for name in self.specs}

    def _checked(self, scored: Scored, what: str) -> dict[str, Tensor]:
        """Each matrix's held-out row ``[H]`` of ``scored``: every cell finite and within the
        matrix's bounds (the functional layer's cell check), else a ``ValueError`` naming
        ``what``, the matrix and the set."""
        rows = {}
        for name, spec in self.specs.items():
            row = scored.held_out.get(name)
            if row is None or row.shape != (len(self.names),):
                raise ValueError(f"{what} has no {name} scores of the held-out sets {self.names}")
            row = row.detach().to(torch.float64)
            try:
                check_cells(
                    f"{name} held-out",
                    row,
                    torch.ones_like(row, dtype=torch.bool),
                    "every held-out cell",
                    spec.bounds,
                )
            except ValueError as err:
                raise ValueError(f"{what} (held-out sets {self.names}): {err}") from err
            rows[name] = row
        return rows

    def record_baseline(self, scored: Scored) -> None:
        self.baseline = {
            name: row.clone() for name, row in self._checked(scored, "the baseline").items()
        }

    def check_stage(self, stage: int, scored: Scored) -> None:
        self._checked(scored, f"stage {stage}")

    def record_stage(self, stage: int, scored: Scored) -> list[str]:
        """Record stage ``stage``'s rows (checked by `check_stage` before anything of the
        stage was recorded)."""
        for name in self.specs:
            row = scored.held_out[name].detach().to(torch.float64).clone()
            self.rows[name] = [*self.rows[name][:stage], row]
        return []

    def state_dict(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "baseline": {name: row.clone() for name, row in self.baseline.items()},
            "rows": {name: [row.clone() for row in rows] for name, rows in self.rows.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        if state is None or list(state["names"]) != self.names:
            recorded = None if state is None else list(state["names"])
            raise ValueError(f"held-out sets: recorded {recorded}, now {self.names}")
        self.baseline = {name: row.double() for name, row in state["baseline"].items()}
        self.rows = {name: [row.double() for row in rows] for name, rows in state["rows"].items()}

    # ------------------------------------------------------------------ journal
    def journal_settings(self) -> dict[str, Any]:
        return {"names": list(self.names)}

    @classmethod
    def from_journal(
        cls, settings: Mapping[str, Any], specs: Mapping[str, MatrixSpec]
    ) -> HeldOutRecord:
        return cls([str(name) for name in settings["names"]], specs)

    def journal_part(self, stage: int | None) -> dict[str, list[float]]:
        """Each matrix's held-out row of the baseline or of ``stage``."""
        rows = self.baseline if stage is None else {n: r[stage] for n, r in self.rows.items()}
        return {name: row.tolist() for name, row in rows.items()}

    def replay_part(self, stage: int | None, part: Mapping[str, Any]) -> None:
        rows = {name: torch.tensor(part[name], dtype=torch.float64) for name in self.specs}
        if stage is None:
            self.baseline = rows
        else:
            for name, row in rows.items():
                self.rows[name] = [*self.rows[name][:stage], row]

    def add_to(self, results: ContinualResults) -> ContinualResults:
        """``results`` with the ``held_out`` section of its stages."""
        H, s = len(self.names), results.primary.num_stages
        nan = torch.full((H,), float("nan"), dtype=torch.float64)
        held_out = HeldOutResults(
            names=tuple(self.names),
            baseline={name: self.baseline.get(name, nan) for name in self.specs},
            scores={
                name: torch.stack(rows[:s]) if s else torch.zeros(0, H, dtype=torch.float64)
                for name, rows in self.rows.items()
            },
            higher_is_better={name: spec.higher_is_better for name, spec in self.specs.items()},
        )
        return dataclasses.replace(results, held_out=held_out)

"""The ``held_out`` section: sets scored at the baseline and after every stage but never trained.

A held-out set measures what continual training does to abilities outside the task sequence
(a "general" set of a language model, say): per set and score matrix, the untrained model's
score ``b_h``, the score after every stage ``s_h[i]``, the change against the baseline
``delta_h[i] = s_h[i] - b_h`` (TRACE's general-ability delta, Wang et al., 2023, in the score's
own units) and the worst drop ``max_i (b_h - s_h[i])`` for a higher-is-better score
(``max_i (s_h[i] - b_h)`` for a lower-is-better one: a loss that rose), negative when the set
never fell below its baseline. The sets never enter ``R`` or its metrics (ACC, BWT, ...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from continual_eval.results import schema
from continual_eval.results._convert import cells, matrix, vector

__all__ = ["HeldOutResults"]


@dataclass(frozen=True)
class HeldOutResults:
    """Held-out sets of one run (see the module docstring).

    Attributes:
        names: the sets, in the order given (``H`` of them).
        baseline: matrix name -> the untrained scores ``[H]`` float64.
        scores: matrix name -> the scores after each stage ``[s, H]`` float64.
        higher_is_better: matrix name -> its direction (from the matrix).
    """

    names: tuple[str, ...]
    baseline: Mapping[str, Tensor]
    scores: Mapping[str, Tensor]
    higher_is_better: Mapping[str, bool]

    @property
    def num_stages(self) -> int:
        return int(next(iter(self.scores.values())).shape[0]) if self.scores else 0

    def delta(self, name: str) -> Tensor:
        """``s_h[i] - b_h`` of matrix ``name``, ``[s, H]``."""
        return self.scores[name] - self.baseline[name]

    def worst_drop(self, name: str) -> Tensor:
        """The largest loss against the baseline over the stages in matrix ``name``'s direction,
        ``[H]`` (NaN before the first stage or where every stage is NaN)."""
        drop = -self.delta(name) if self.higher_is_better[name] else self.delta(name)
        if drop.shape[0] == 0:
            return torch.full((len(self.names),), math.nan, dtype=torch.float64)
        finite = ~torch.isnan(drop)
        worst = torch.where(finite, drop, torch.tensor(-math.inf, dtype=drop.dtype)).amax(0)
        return torch.where(finite.any(0), worst, torch.tensor(math.nan, dtype=drop.dtype))

    def summary(self, name: str) -> dict[str, dict[str, float]]:
        """Set -> ``{"baseline", "final", "delta", "worst_drop"}`` of matrix ``name`` (the
        final stage's score and change; NaN where not measured)."""
        final = (
            self.scores[name][-1]
            if self.num_stages
            else torch.full((len(self.names),), math.nan, dtype=torch.float64)
        )
        worst, delta = self.worst_drop(name), final - self.baseline[name]
        return {
            h: {
                "baseline": float(self.baseline[name][k]),
                "final": float(final[k]),
                "delta": float(delta[k]),
                "worst_drop": float(worst[k]),
            }
            for k, h in enumerate(self.names)
        }

    # ------------------------------------------------------------------ the file
    def to_section(self) -> schema.HeldOutSection:
        return schema.HeldOutSection(
            names=list(self.names),
            matrices={
                name: schema.HeldOutMatrixSection(
                    baseline=cells(self.baseline[name]),
                    scores=cells(self.scores[name]),
                    delta=cells(self.delta(name)),
                    worst_drop=cells(self.worst_drop(name)),
                )
                for name in self.scores
            },
        )

    @classmethod
    def from_section(
        cls, section: schema.HeldOutSection, higher_is_better: Mapping[str, bool]
    ) -> HeldOutResults:
        """From a checked section; ``delta`` and ``worst_drop`` are recomputed from the scores
        (``higher_is_better``: each matrix's direction, from its own section)."""
        H = len(section.names)
        return cls(
            names=tuple(section.names),
            baseline={n: vector(m.baseline) for n, m in section.matrices.items()},
            scores={n: matrix(m.scores, H) for n, m in section.matrices.items()},
            higher_is_better={n: bool(higher_is_better[n]) for n in section.matrices},
        )

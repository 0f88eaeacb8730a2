r"""Budgeted stage-end evaluation: a fixed subset per task (``stage_eval_subset``) and old tasks
scored only every ``k`` stages (``eval_old_tasks_every``), the callback's arguments, the tasks a
stage end scores, and the ``stage_evaluation`` part of a `RunRecord` (settings only: no per-stage
state; the skipped cells are the NaN cells of the matrices).

The price of a subset of ``n`` samples: one cell is a mean of ``n`` 0/1 items, whose binomial
standard error is `\sqrt{p(1-p)/n} \le 0.5/\sqrt{n}` (n = 500: 0.022; n = 2000: 0.011).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from continual_eval.evaluation.loaders import STRATIFIED_RULE, UNIFORM_RULE
from continual_eval.results import schema

if TYPE_CHECKING:  # pragma: no cover
    from continual_eval.record import Scored
    from continual_eval.results import ContinualResults

__all__ = ["StageBudget", "StageBudgetRecord"]

#: which stages score the old tasks, as ``results.json`` states it
OLD_TASKS_RULE = (
    "stage i scores its old tasks j < i when (i + 1) % {k} == 0 or i == T - 1 (the final row); "
    "the diagonal R[i, i] and the later tasks are scored at every stage"
)


def _check_int(name: str, value: object, *, positive: bool) -> None:
    if value is None and positive:
        return
    if not isinstance(value, int) or isinstance(value, bool) or (positive and value < 1):
        kind = "a positive int or None" if positive else "an int"
        raise ValueError(f"{name} must be {kind}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class StageBudget:
    """The callback's ``stage_eval_subset``, ``stage_eval_seed`` and ``eval_old_tasks_every``,
    checked."""

    subset: int | None = None
    seed: int = 0
    old_tasks_every: int | None = None

    def __post_init__(self) -> None:
        _check_int("stage_eval_subset", self.subset, positive=True)
        _check_int("stage_eval_seed", self.seed, positive=False)
        _check_int("eval_old_tasks_every", self.old_tasks_every, positive=True)

    @property
    def active(self) -> bool:
        return self.subset is not None or self.old_tasks_every is not None

    def old_tasks_due(self, stage: int, num_tasks: int) -> bool:
        """Whether stage ``stage`` scores its old tasks (`OLD_TASKS_RULE`)."""
        k = self.old_tasks_every
        return k is None or (stage + 1) % k == 0 or stage == num_tasks - 1

    def stage_tasks(self, stage: int, num_tasks: int, evaluate: str) -> list[int]:
        """The tasks stage ``stage`` scores: every task (``evaluate="all"``) or ``j <= stage + 1``
        (``"needed"``), without the old tasks ``j < stage`` when they are not due."""
        end = num_tasks if evaluate == "all" else min(stage + 2, num_tasks)
        first = 0 if self.old_tasks_due(stage, num_tasks) else stage
        return list(range(first, end))

    def settings(self) -> dict[str, Any]:
        """What a checkpoint's rows depend on."""
        return {"subset": self.subset, "seed": self.seed, "old_tasks_every": self.old_tasks_every}


class StageBudgetRecord:
    """The ``stage_evaluation`` section of a `RunRecord` (a record section): the settings and,
    with a subset, each task's subset size and rule; refuses a stage whose row is absent for a
    task it scored, and a state recorded with other settings."""

    key = "stage_evaluation"

    def __init__(self, budget: StageBudget, num_tasks: int) -> None:
        self.budget = budget
        self.num_tasks = num_tasks
        self.samples_per_task: list[int] = []
        self.rules: list[str] = []

    def set_subsets(self, samples_per_task: Sequence[int], rules: Sequence[str]) -> None:
        """Each task's subset size and rule (``"stratified"`` or ``"uniform"``), known once the
        loaders are."""
        self.samples_per_task, self.rules = list(samples_per_task), list(rules)

    def record_baseline(self, scored: Scored) -> None:
        return None

    def check_stage(self, stage: int, scored: Scored) -> None:
        """The diagonal and, when due, the old tasks are scored; a task skipped at this stage is
        NaN in every row (absent, never a stale value)."""
        if self.budget.old_tasks_due(stage, self.num_tasks):
            return
        for name, row in scored.rows.items():
            present = ~torch.isnan(row[:stage])
            if bool(present.any()):
                j = int(present.nonzero()[0, 0])
                raise ValueError(
                    f"stage {stage}: the {name!r} row holds a score for task {j}, which "
                    f"eval_old_tasks_every={self.budget.old_tasks_every} skips at this stage"
                )

    def record_stage(self, stage: int, scored: Scored) -> list[str]:
        return []

    def state_dict(self) -> dict[str, Any]:
        return {"settings": self.budget.settings()}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        if state is None:
            return
        recorded, now = dict(state.get("settings", {})), self.budget.settings()
        if recorded != now:
            raise ValueError(
                "the state was recorded with other stage-evaluation settings; resuming would mix "
                f"rows scored on other subsets or stages: recorded {recorded!r}, now {now!r}"
            )

    # the stage journal: settings only, nothing per stage (the skipped cells are the rows' NaN)
    def journal_settings(self) -> dict[str, Any]:
        settings = self.budget.settings()
        settings.update(samples_per_task=list(self.samples_per_task), rules=list(self.rules))
        return settings

    @classmethod
    def from_journal(cls, settings: Mapping[str, Any], num_tasks: int) -> StageBudgetRecord:
        budget = StageBudget(settings["subset"], settings["seed"], settings["old_tasks_every"])
        record = cls(budget, num_tasks)
        record.set_subsets(
            [int(n) for n in settings["samples_per_task"]], [str(r) for r in settings["rules"]]
        )
        return record

    def journal_part(self, stage: int | None) -> None:
        return None

    def replay_part(self, stage: int | None, part: Any) -> None:
        return None

    def section(self) -> schema.StageEvaluationSection:
        budget, subset = self.budget, None
        if budget.subset is not None:
            subset = schema.StageSubsetSection(
                size=budget.subset,
                seed=budget.seed,
                samples_per_task=list(self.samples_per_task),
                rule_per_task=list(self.rules),  # type: ignore[arg-type]
                rules={"stratified": STRATIFIED_RULE, "uniform": UNIFORM_RULE},
                standard_error_bound=[
                    0.5 / math.sqrt(n) if n else 0.5 for n in self.samples_per_task
                ],
            )
        every = budget.old_tasks_every
        return schema.StageEvaluationSection(
            subset=subset,
            old_tasks_every=every,
            old_tasks_rule=OLD_TASKS_RULE.format(k=every) if every else "",
        )

    def add_to(self, results: ContinualResults) -> ContinualResults:
        return dataclasses.replace(results, stage_evaluation=self.section())

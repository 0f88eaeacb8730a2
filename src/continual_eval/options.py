r"""Option objects of [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback]: settings that
belong together, checked when built.

``ContinualEvalCallback(eval_every_n_steps=k)`` is the short form of
``eval_every_n_steps=StepEvaluation(every_n_steps=k)``; the object also carries the fixed subset
the per-step evaluations score.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StepEvaluation"]


def _positive_int(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        kind = "a positive int or None" if allow_none else "a positive int"
        raise ValueError(f"{name} must be {kind}, got {value!r}")


@dataclass(frozen=True)
class StepEvaluation:
    r"""Evaluation inside every stage: also score the tasks seen so far and the current one
    (``j <= stage``) every ``every_n_steps`` optimizer steps.

    Args:
        every_n_steps: ``k``, counted by the callback's cumulative optimizer-step counter (it
            continues across fits).
        subset: score a fixed subset of ``n`` samples per task at these evaluations (stage ends
            always use the whole test sets): task ``j`` uses
            ``sorted(randperm(len_j, generator=manual_seed(subset_seed + j))[:n])``. One accuracy
            from ``n`` samples has binomial standard error `\sqrt{p(1-p)/n} \le
            0.5/\sqrt{n}` (n=500: <= 0.022, n=2000: <= 0.011, one sigma); the subset is fixed, so
            successive points of a curve share it and their differences are less noisy.
            ``None`` (default): the whole test sets.
        subset_seed: seed of the subsets.
    """

    every_n_steps: int
    subset: int | None = None
    subset_seed: int = 0

    def __post_init__(self) -> None:
        _positive_int("every_n_steps", self.every_n_steps)
        _positive_int("subset", self.subset, allow_none=True)
        if not isinstance(self.subset_seed, int) or isinstance(self.subset_seed, bool):
            raise ValueError(f"subset_seed must be an int, got {self.subset_seed!r}")

    @classmethod
    def of(cls, value: int | StepEvaluation | None) -> StepEvaluation | None:
        """``eval_every_n_steps`` as given to the callback: an int ``k`` (the short form), a
        [`StepEvaluation`][continual_eval.StepEvaluation], or ``None`` (off)."""
        if value is None or isinstance(value, StepEvaluation):
            return value
        _positive_int("eval_every_n_steps", value, allow_none=True)
        return cls(every_n_steps=value)

"""One task's counts: what is wrong with them (in words, naming the problem), and every task's
counts summed across ranks in one collective."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from continual_eval.evaluation.errors import EvaluationError
from continual_eval.evaluation.scorers import _OUT_OF_RANGE, Scorer, scorer_label


def _nonfinite_problem(watch: Sequence[float], world_size: int) -> str | None:
    """The output watch's reduced ``[nonfinite, predictions, first bad batch + 1 per rank]``,
    in words (``None``: every prediction finite)."""
    nonfinite, predictions = int(watch[0]), int(watch[1])
    if not nonfinite:
        return None
    first = [int(b) for b in watch[2:]]
    if world_size <= 1:
        where = f"first in batch {first[0] - 1} of the test dataloader"
    else:
        where = "first in batch " + ", ".join(
            f"{b - 1} of rank {r}'s shard" for r, b in enumerate(first) if b > 0
        )
    return (
        f"the model returned non-finite scores for {nonfinite} of the {predictions} "
        f"predictions (a NaN or +inf score, or all scores -inf), {where}; an argmax over them "
        "picks an arbitrary class. Check the model (e.g. a diverged training step, a NaN in "
        "the weights) and this task's inputs"
    )


def _task_problems(
    row: Sequence[Sequence[float]], scorers: Sequence[Scorer], world_size: int
) -> list[str]:
    """What is wrong with one task's reduced counts (one list per scorer, then the output
    watch's), in words; each message once, whichever scorers found it."""
    problems: list[str] = []
    nonfinite = _nonfinite_problem(row[-1], world_size)
    if nonfinite is not None:
        problems.append(nonfinite)
    for scorer, counts in zip(scorers, row, strict=False):
        messages = getattr(scorer, "target_problems", (_OUT_OF_RANGE,))
        num_problems = getattr(scorer, "num_problems", None)
        end = len(counts) if num_problems is None else min(len(counts), 2 + num_problems)
        for k in range(2, end):
            count = int(counts[k])
            if count > 0:
                message = messages[k - 2] if k - 2 < len(messages) else _OUT_OF_RANGE
                text = message.format(n=count)
                if text not in problems:
                    problems.append(text)
    return problems


def _raise_for_task(
    row: Sequence[Sequence[float]], label: str, scorers: Sequence[Scorer], world_size: int
) -> None:
    if int(row[0][1]) == 0:
        raise EvaluationError(
            f"{label}: the loader yielded no sample; is its dataset empty or is drop_last=True "
            "with fewer samples than batch_size?"
        )
    problems = _task_problems(row, scorers, world_size)
    if problems:
        raise EvaluationError(f"{label}: " + "; and ".join(problems))


def _local_counts(scorer: Scorer, device: torch.device) -> Tensor:
    """``scorer.local_counts()`` on ``device``: 1-D, int64 unless floating (float sums)."""
    counts = scorer.local_counts()
    if not isinstance(counts, Tensor) or counts.ndim != 1 or counts.numel() < 2:
        raise EvaluationError(
            f"{scorer_label(scorer)}: local_counts() must return a 1-D tensor [value, total, ...], "
            f"got {counts!r}"
        )
    dtype = counts.dtype if counts.is_floating_point() else torch.int64
    return counts.to(device=device, dtype=dtype)


@dataclass(frozen=True)
class _Reduced:
    """Tasks' counts summed across ranks: row ``k`` holds task ``k``'s count vectors (one per
    scorer, then the output watch's) side by side, in their promoted dtype; ``host`` is the same
    on the host (one read for every task)."""

    packed: Tensor
    sizes: list[int]
    dtypes: list[torch.dtype]
    host: list[list[float]]

    def part(self, i: int) -> Tensor:
        """Vector ``i`` of every row, ``[tasks, K_i]``, in its own dtype."""
        start = sum(self.sizes[:i])
        return self.packed[:, start : start + self.sizes[i]].to(self.dtypes[i])

    def host_row(self, k: int) -> list[list[float]]:
        """Row ``k`` on the host, split into its vectors (the last one with whatever was appended
        to the row on the host)."""
        row, out, start = self.host[k], [], 0
        for size in self.sizes[:-1]:
            out.append(row[start : start + size])
            start += size
        out.append(row[start:])
        return out


def _columns(rows: Sequence[Sequence[Tensor]]) -> list[Tensor]:
    """Per-task count vectors (``rows[k][i]``: task ``k``'s vector ``i``) as one ``[tasks, K_i]``
    tensor per vector ``i`` (one stack per scorer, not one op per task)."""
    sizes = [v.numel() for v in rows[0]]
    if any([v.numel() for v in row] != sizes for row in rows):
        raise EvaluationError(
            "a scorer's local_counts() changed length between tasks; it must return the same "
            "number of entries for every task (and on every rank)"
        )
    return [torch.stack([row[i] for row in rows]) for i in range(len(sizes))]


def _reduce_counts(
    columns: Sequence[Tensor], all_reduce: Callable[[Tensor], Tensor] | None
) -> _Reduced:
    """Sum every task's count vectors across ranks in ONE collective call (none without
    ``all_reduce``), each vector coming back in its own dtype. ``columns[i]``: vector ``i`` (one
    per scorer, then the output watch's) of every task, ``[tasks, K_i]``.

    All int64 (accuracy, top-k, integer metric states): reduced as int64, exactly. When a scorer
    holds float sums (a loss, a float metric state), the whole call is reduced as one float64
    tensor: integer counts below 2**53 are exact in float64 and cast back, and float sums are exact
    up to the order of summation (rank 0's sum plus rank 1's, ...), so no second collective is
    needed.
    """
    dtypes = [c.dtype for c in columns]
    dtype = functools.reduce(torch.promote_types, dtypes)
    if dtype.is_floating_point and columns[0].device.type != "mps":
        dtype = torch.promote_types(dtype, torch.float64)  # a float16 sum: integers stay exact
    packed = torch.cat([c.to(dtype) for c in columns], dim=1)  # a new tensor: reduced in place
    if all_reduce is not None:
        packed = all_reduce(packed)
    return _Reduced(packed, [c.shape[1] for c in columns], dtypes, packed.tolist())

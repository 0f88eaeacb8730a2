"""Held-out sets scored over the stream, through the evaluation engine.

Each evaluation scores every held-out set with
[`continual_eval.evaluation.evaluate_tasks`][continual_eval.evaluation.evaluate_tasks] (eval mode,
no gradient, train/eval flags and RNG states restored, each set sharded across ranks without padding
and the counts summed: exact under DDP), on this rank's shards of a `TaskLoaders`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from continual_eval.evaluation import evaluate_tasks
from continual_eval.evaluation.guards import grad_free_context
from continual_eval.evaluation.task_loaders import TaskLoaders

if TYPE_CHECKING:
    from lightning.pytorch import LightningModule, Trainer

__all__ = ["HeldOutSets"]


class HeldOutSets:
    """The held-out loaders of a run, their names and (optionally) the stream position where
    each one's segment starts."""

    def __init__(
        self,
        loaders: Sequence[Any],
        names: Sequence[str] | None,
        segment_starts: Sequence[int] | None,
    ) -> None:
        loaders = list(loaders)
        if not loaders:
            raise ValueError("OnlineEvalCallback: held_out is empty; give at least one loader")
        names = [f"held_out_{j}" for j in range(len(loaders))] if names is None else list(names)
        if len(names) != len(loaders) or len(set(names)) != len(names):
            raise ValueError(
                f"OnlineEvalCallback: held_out_names must name each of the {len(loaders)} held-out "
                f"loaders once, got {names}"
            )
        if segment_starts is not None:
            starts = list(segment_starts)
            if (
                len(starts) != len(loaders)
                or any(isinstance(s, bool) or not isinstance(s, int) for s in starts)
                or starts[:1] != [0]
                or any(b <= a for a, b in itertools.pairwise(starts))
            ):
                raise ValueError(
                    "OnlineEvalCallback: segment_starts must give, for each held-out loader, the "
                    "stream position (training samples before it) where its segment starts: "
                    f"increasing integers beginning at 0, one per loader; got {starts}"
                )
            segment_starts = starts
        self.names = names
        self.segment_starts: list[int] | None = segment_starts
        self.loaders = TaskLoaders(loaders, names)

    def __len__(self) -> int:
        return len(self.names)

    def shard(self, trainer: Trainer) -> None:
        """This rank's unpadded shards (once per fit)."""
        self.loaders.shard(trainer.global_rank, trainer.world_size)

    def next_boundary(self, done: int) -> float:
        """The stream position where the first segment not yet ended (``done``) ends; infinite
        without segment starts or when only the last segment is left."""
        starts = self.segment_starts
        if starts is None or done + 1 >= len(starts):
            return float("inf")
        return starts[done + 1]

    def ended_segments(self, position: int, done: int) -> list[int]:
        """The segments ``done, done+1, ...`` that end at or before ``position`` (the next one
        starts there)."""
        starts = self.segment_starts
        if starts is None:
            return []
        return [j for j in range(done, len(starts) - 1) if starts[j + 1] <= position]

    def evaluate(
        self, trainer: Trainer, pl_module: LightningModule, *, inference_mode: bool
    ) -> tuple[list[float], float]:
        """``(score per set, wall seconds)``, the same on every rank."""
        start = time.perf_counter()
        world = trainer.world_size
        device = trainer.strategy.root_device
        tasks = list(range(len(self.names)))
        evaluation = evaluate_tasks(
            pl_module,
            self.loaders.for_evaluation(
                tasks, device=device, rank=trainer.global_rank, world_size=world
            ),
            tasks,
            scorers=["accuracy"],
            device=device,
            forward_context=trainer.precision_plugin.forward_context,
            convert_input=trainer.precision_plugin.convert_input,
            grad_context=partial(grad_free_context, inference_mode),
            all_reduce=partial(trainer.strategy.reduce, reduce_op="sum") if world > 1 else None,
            rank=trainer.global_rank,
            world_size=world,
            task_names=self.names,
            unsharded=self.loaders.unsharded,
        )
        scores = evaluation.scores.to(torch.float64).tolist()
        return scores, time.perf_counter() - start

"""One object owning a run's test loaders: the loaders per task, their fixed per-step subsets,
this rank's unpadded shards of both, one spare sample per task (lockstep evaluation), and the
batch cache wrapping."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from continual_eval.evaluation.cache import BatchCache, cache_safety
from continual_eval.evaluation.loaders import (
    shard_dataloader,
    spare_dataloader,
    stage_subset_dataloader,
    subset_dataloader,
)

if TYPE_CHECKING:
    from continual_eval.options import StepEvaluation

__all__ = ["TaskLoaders"]


class TaskLoaders:
    """The test loaders of tasks ``0..T-1`` as an evaluation reads them.

    Args:
        loaders: one test loader per task (index = task id).
        task_names: names for error messages.
        subset_size: ``n`` for the fixed per-step subsets (``None``: none); task ``j``'s subset is
            `subset_dataloader` with seed ``subset_seed + j``.
        subset_seed: seed of the subsets.
        cache: ``None`` (auto: the loaders the per-step evaluations read, when
            [`cache_safety`][continual_eval.evaluation.cache_safety] deems them safe and
            ``per_step`` is on), ``True`` (every loader) or ``False`` (never).
        cache_max_bytes: cap of the `BatchCache`.
        per_step: whether evaluations inside stages happen (they make the auto cache worth it).
        stage_subset_size: ``n`` for the fixed subsets the baseline and stage-end evaluations
            (and per-step ones without a subset of their own) score instead of the whole test
            sets of the first ``num_tasks`` loaders (``None``: whole sets); task ``j``'s is
            `stage_subset_dataloader` with seed ``stage_subset_seed + j``.
        stage_subset_seed: seed of the stage-end subsets.
        num_tasks: how many of ``loaders`` are tasks (the rest, held-out sets, stay whole).
    """

    def __init__(
        self,
        loaders: Sequence[Any],
        task_names: Sequence[str],
        *,
        subset_size: int | None = None,
        subset_seed: int = 0,
        cache: bool | None = None,
        cache_max_bytes: int = 256 * 2**20,
        per_step: bool = False,
        stage_subset_size: int | None = None,
        stage_subset_seed: int = 0,
        num_tasks: int | None = None,
    ) -> None:
        self.loaders = list(loaders)
        self.task_names = list(task_names)
        self.subset_size, self.subset_seed = subset_size, subset_seed
        self.cache_mode, self.per_step = cache, per_step
        #: held-out sets: the last ``num_held_out`` loaders, after the tasks' (see ``for_steps``)
        self.num_held_out = 0
        self.subsets: list[Any] | None = None
        self.subset_sizes: list[int] = []
        if subset_size is not None:
            built = []
            for j, loader in enumerate(self.loaders):
                try:
                    built.append(subset_dataloader(loader, subset_size, subset_seed + j))
                except ValueError as err:
                    raise ValueError(
                        f"StepEvaluation(subset=...): test dataloader {j} "
                        f"({self.task_names[j]!r}): {err}"
                    ) from err
            self.subsets = [loader for loader, _ in built]
            self.subset_sizes = [len(indices) for _, indices in built]
        #: per task, the stage-end subset's dataset indices and rule (empty without one)
        self.stage_indices: list[torch.Tensor] = []
        self.stage_rules: list[str] = []
        if stage_subset_size is not None:
            for j in range(len(self.loaders) if num_tasks is None else num_tasks):
                try:
                    loader, indices, rule = stage_subset_dataloader(
                        self.loaders[j], stage_subset_size, stage_subset_seed + j
                    )
                except ValueError as err:
                    raise ValueError(
                        f"stage_eval_subset: test dataloader {j} ({self.task_names[j]!r}): {err}"
                    ) from err
                self.loaders[j] = loader
                self.stage_indices.append(indices)
                self.stage_rules.append(rule)
        self.cache_safe = [cache_safety(loader) is None for loader in self.loaders]
        self.cache = BatchCache(cache_max_bytes)
        self.rank_loaders: list[Any] = list(self.loaders)
        self.rank_subsets: list[Any] = list(self.subsets or [])
        self.unsharded: frozenset[int] = frozenset()
        #: per task, a loader of one sample of its test set (``None``: none can be built), what a
        #: rank without a batch of the task runs the model on in a lockstep evaluation
        self.spare_loaders: list[Any] = [None] * len(self.loaders)
        self._cache_reported = False

    @classmethod
    def for_steps(
        cls,
        loaders: Sequence[Any],
        task_names: Sequence[str],
        steps: StepEvaluation | None,
        held_out: Mapping[str, Any] | None = None,
        *,
        cache: bool | None = None,
        cache_max_bytes: int = 256 * 2**20,
        stage_subset_size: int | None = None,
        stage_subset_seed: int = 0,
    ) -> TaskLoaders:
        """The loaders of a run whose in-stage evaluations follow ``steps`` (``None``: none; else
        its fixed subset per task and seed), the ``held_out`` sets' (name -> loader) after the
        tasks' (loader ``T + h``)."""
        held_out = held_out or {}
        task_loaders = cls(
            [*loaders, *held_out.values()],
            [*task_names, *(f"held-out set {name!r}" for name in held_out)],
            subset_size=None if steps is None else steps.subset,
            subset_seed=0 if steps is None else steps.subset_seed,
            cache=cache,
            cache_max_bytes=cache_max_bytes,
            per_step=steps is not None,
            stage_subset_size=stage_subset_size,
            stage_subset_seed=stage_subset_seed,
            num_tasks=len(loaders),
        )
        task_loaders.num_held_out = len(held_out)
        return task_loaders

    def __len__(self) -> int:
        return len(self.loaders)

    def shard(self, rank: int, world_size: int, *, in_order: bool = False) -> frozenset[int]:
        """This rank's unpadded shards of every loader and subset (and, with several ranks, the
        spare loaders); returns the tasks whose loader cannot be sharded (only rank 0 counts
        them). ``in_order`` (per-item records): shuffling loaders read in index order in one
        process too."""
        sharded = [
            shard_dataloader(
                loader, rank, world_size, task=j, task_name=self.task_names[j], in_order=in_order
            )
            for j, loader in enumerate(self.loaders)
        ]
        self.rank_loaders = [loader for loader, _ in sharded]
        self.unsharded = frozenset(j for j, (_, ok) in enumerate(sharded) if not ok)
        self.rank_subsets = [
            shard_dataloader(loader, rank, world_size)[0] for loader in self.subsets or []
        ]
        self.spare_loaders = [
            spare_dataloader(loader) if world_size > 1 else None for loader in self.loaders
        ]
        return self.unsharded

    def _cached(self, task: int, per_step_loader: bool) -> bool:
        if self.cache_mode is not None:
            return self.cache_mode
        return self.per_step and per_step_loader and self.cache_safe[task]

    def for_evaluation(
        self,
        task_ids: Sequence[int],
        *,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
        subset: bool = False,
    ) -> list[Any]:
        """This rank's loaders (or subsets) for an evaluation of ``task_ids`` on ``device``, those
        the cache serves wrapped by it. The cache is dropped when the device, the rank, the world
        size, the loader or dataset objects or the subset rule change."""
        loaders = list(self.rank_subsets if subset else self.rank_loaders)
        per_step = subset or self.subsets is None
        wanted = [j for j in task_ids if self._cached(j, per_step)]
        if not wanted:
            return loaders
        self.cache.set_key(
            (
                str(device),
                rank,
                world_size,
                tuple(id(loader) for loader in self.loaders),
                tuple(id(getattr(loader, "dataset", None)) for loader in self.loaders),
                self.subset_size,
                self.subset_seed,
            )
        )
        for j in wanted:
            slot = ("subset" if subset else "full", j)
            loaders[j] = self.cache.wrap(slot, loaders[j], device)
        return loaders

    def cache_report(self, device: torch.device) -> str | None:
        """A one-time line on what the cache holds (``None`` before it holds anything, and after
        the line was given once)."""
        cache = self.cache
        if self._cache_reported or not cache.num_cached:
            return None
        self._cache_reported = True
        refused = cache.num_refused
        return (
            f"[continual-eval] caching collated test batches on {device}: {cache.num_cached} test "
            f"loader(s), {cache.nbytes / 2**20:.1f} MB so far (cap {cache.max_bytes / 2**20:.0f} "
            "MB"
            + (f"; {refused} too large, read each time" if refused else "")
            + "); cache_test_batches=False turns it off"
        )

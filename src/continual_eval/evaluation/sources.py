"""Where each task's test batches come from: the batch cache, the fast path, a shared worker
pool, or the loader itself."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any, NamedTuple

import torch

from continual_eval.evaluation.cache import _CachedLoader
from continual_eval.evaluation.fast_path import _FastBatches, fast_loader
from continual_eval.evaluation.lockstep import known_length
from continual_eval.evaluation.pools import _pool_settings, _worker_pool, _WorkerPool


class _TaskSource(NamedTuple):
    """One task's batches as the loop reads them."""

    #: the batches
    batches: Iterable[Any]
    #: the batches are already on the evaluation device (no move needed)
    on_device: bool
    #: the batches are the engine's own tensors (fast path, cache), which nothing writes to
    #: after they were yielded
    owned: bool
    #: the exact number of batches, ``None`` when only iterating tells
    length: int | None


def _raw(loader: Any) -> Any:
    """The loader under a cache wrapper."""
    return loader.loader if isinstance(loader, _CachedLoader) else loader


def _pooled(dataloaders: Sequence[Any]) -> dict[int, tuple[_WorkerPool, int]]:
    """``task -> (pool, position)`` for every loader that a shared worker pool reads: loaders
    the fast path cannot read, grouped by equal worker settings (over all tasks, so that a pool
    outlives evaluations of different task sets)."""
    groups: dict[Hashable, list[int]] = {}
    for k, dl in enumerate(dataloaders):
        raw = _raw(dl)
        settings = _pool_settings(raw)
        if settings is not None and fast_loader(raw) is raw:
            groups.setdefault(settings, []).append(k)
    pooled: dict[int, tuple[_WorkerPool, int]] = {}
    for members in groups.values():
        pool = _worker_pool([_raw(dataloaders[k]) for k in members])
        for position, k in enumerate(members):
            pooled[k] = (pool, position)
    return pooled


def _batch_sources(
    dataloaders: Sequence[Any], tasks: Sequence[int], device: torch.device
) -> dict[int, _TaskSource]:
    """For each of ``tasks``: its `_TaskSource`.

    A cached loader that holds its batches yields them as they are; other loaders go through
    `fast_loader` (batches made on ``device``), else a worker pool shared by the loaders
    with equal worker settings, else as given (a cached loader keeps what they yield).
    """
    pin = device.type not in ("cpu", "mps", "meta") and torch.accelerator.is_available()
    pooled = _pooled(dataloaders)
    sources: dict[int, _TaskSource] = {}
    selections: dict[int, tuple[_WorkerPool, list[int]]] = {}
    for j in tasks:
        dl = dataloaders[j]
        cached = isinstance(dl, _CachedLoader)
        if cached and dl.cache.cached(dl.slot):
            batches = dl.cache.batches(dl.slot)
            sources[j] = _TaskSource(batches, True, True, len(batches))
            continue
        source: Iterable[Any]
        if j in pooled:
            pool, position = pooled[j]
            selections.setdefault(id(pool), (pool, []))[1].append(position)
            source = pool.view(position)
        else:
            source = fast_loader(_raw(dl), pin_memory=pin, device=device)
        fast = isinstance(source, _FastBatches)
        on_device = isinstance(source, _FastBatches) and source.device == device
        length = known_length(source)
        if cached:  # the cache moves what it keeps (and what it reads while it may keep it)
            source, on_device = (
                dl.fill_from(source, on_device=on_device),
                on_device or not dl.cache.refused(dl.slot),
            )
        sources[j] = _TaskSource(source, on_device, fast, length)
    for pool, selected in selections.values():
        pool.start(selected)
    return sources

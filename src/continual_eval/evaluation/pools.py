"""One persistent worker pool per group of test loaders with equal worker settings.

Switched by `continual_eval.evaluation.switches.POOLED_LOADERS`, read at call time.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from continual_eval.evaluation import switches
from continual_eval.evaluation.fast_path import _batch_slices, _draw_base_seed, _read_order

#: Pools kept alive between evaluations (most recently used last); older ones are shut down.
_MAX_POOLS = 2
_POOLS: list[_WorkerPool] = []


class _TaskConcat(torch.utils.data.Dataset[Any]):
    """Several tasks' datasets end to end; a batch (never across two datasets) is fetched as its
    own task's DataLoader fetches it (``__getitems__`` when the dataset has one)."""

    def __init__(self, datasets: Sequence[Any]) -> None:
        self.datasets = list(datasets)
        self.offsets = [0]
        for d in self.datasets:
            self.offsets.append(self.offsets[-1] + len(d))

    def __len__(self) -> int:
        return self.offsets[-1]

    def _locate(self, index: int) -> tuple[Any, int]:
        import bisect

        k = bisect.bisect_right(self.offsets, index) - 1
        return self.datasets[k], index - self.offsets[k]

    def __getitem__(self, index: int) -> Any:
        dataset, local = self._locate(index)
        return dataset[local]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        dataset, first = self._locate(indices[0])
        local = [first + i - indices[0] for i in indices]
        getitems = getattr(dataset, "__getitems__", None)
        if getitems:
            return list(getitems(local))
        return [dataset[i] for i in local]


class _TaskBatchSampler(Sampler[list[int]]):
    """The batches of the selected tasks, each task's as its own loader makes them."""

    def __init__(self, task_batches: Sequence[list[list[int]]]) -> None:
        self.task_batches = task_batches
        self.selected: list[int] = []

    def __iter__(self) -> Iterator[list[int]]:
        for k in self.selected:
            yield from self.task_batches[k]

    def __len__(self) -> int:
        return sum(len(self.task_batches[k]) for k in self.selected)


def _pool_settings(loader: Any) -> Hashable | None:
    """What must be equal for two loaders to share a worker pool, or ``None`` (not poolable)."""
    if not switches.POOLED_LOADERS or _read_order(loader) is None or loader.num_workers == 0:
        return None
    if loader.worker_init_fn is not None:
        return None  # it may read get_worker_info().dataset, which a pool replaces
    return (
        loader.num_workers,
        loader.collate_fn,
        loader.pin_memory,
        loader.pin_memory_device,
        loader.timeout,
        loader.multiprocessing_context,
        loader.prefetch_factor,
        getattr(loader, "in_order", True),
    )


class _WorkerPool:
    """One persistent-worker DataLoader reading the batches of several test loaders."""

    def __init__(self, loaders: Sequence[DataLoader[Any]]) -> None:
        self._members = [weakref.ref(dl) for dl in loaders]
        self._datasets = [weakref.ref(dl.dataset) for dl in loaders]
        self._lengths = [len(dl.dataset) for dl in loaders]  # type: ignore[arg-type]
        concat = _TaskConcat([dl.dataset for dl in loaders])
        task_batches = []
        for dl, offset in zip(loaders, concat.offsets, strict=False):
            order, size, drop_last = _read_order(dl)  # type: ignore[misc]
            task_batches.append(
                [
                    [offset + int(i) for i in order[s : s + size]]
                    for s in _batch_slices(len(order), size, drop_last)
                ]
            )
        self.sampler = _TaskBatchSampler(task_batches)
        first = loaders[0]
        self.loader = DataLoader(
            concat,
            batch_sampler=self.sampler,
            num_workers=first.num_workers,
            collate_fn=first.collate_fn,
            pin_memory=first.pin_memory,
            timeout=first.timeout,
            multiprocessing_context=first.multiprocessing_context,
            generator=torch.Generator(),  # its seed draws leave the global generator alone
            prefetch_factor=first.prefetch_factor,
            persistent_workers=True,
            pin_memory_device=first.pin_memory_device,
        )
        self._iterator: Iterator[Any] | None = None

    def serves(self, loaders: Sequence[DataLoader[Any]]) -> bool:
        """Whether this pool reads exactly ``loaders``, over unchanged datasets."""
        return (
            len(loaders) == len(self._members)
            and all(ref() is dl for ref, dl in zip(self._members, loaders, strict=True))
            and all(
                ref() is dl.dataset and len(dl.dataset) == n  # type: ignore[arg-type]
                for ref, dl, n in zip(self._datasets, loaders, self._lengths, strict=True)
            )
        )

    def alive(self) -> bool:
        return all(ref() is not None for ref in self._members)

    def start(self, selected: list[int]) -> None:
        """Begin a pass over the batches of the members at positions ``selected``, in order."""
        self.sampler.selected = selected
        self._iterator = iter(self.loader)

    def view(self, position: int) -> _PoolView:
        return _PoolView(self, position)

    def close(self) -> None:
        iterator = self.loader._iterator
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
        self.loader._iterator = None
        self._iterator = None


class _PoolView:
    """One task's batches, taken from its pool's current pass."""

    def __init__(self, pool: _WorkerPool, position: int) -> None:
        self.pool, self.position = pool, position

    def __len__(self) -> int:
        return len(self.pool.sampler.task_batches[self.position])

    def __iter__(self) -> Iterator[Any]:
        loader = self.pool._members[self.position]()
        assert loader is not None and self.pool._iterator is not None
        _draw_base_seed(loader)
        iterator = self.pool._iterator
        for _ in range(len(self)):
            yield next(iterator)


def _worker_pool(loaders: Sequence[DataLoader[Any]]) -> _WorkerPool:
    """The kept pool reading ``loaders``, else a new one (shutting down the least recently used
    pool past `_MAX_POOLS` and pools whose loaders are gone)."""
    for pool in list(_POOLS):
        if not pool.alive():
            _POOLS.remove(pool)
            pool.close()
    for pool in _POOLS:
        if pool.serves(loaders):
            _POOLS.remove(pool)
            _POOLS.append(pool)
            return pool
    pool = _WorkerPool(loaders)
    _POOLS.append(pool)
    while len(_POOLS) > _MAX_POOLS:
        _POOLS.pop(0).close()
    return pool

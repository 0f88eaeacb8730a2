"""Collated test batches kept on the evaluation device, and when caching them is safe."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Any

import torch
from lightning.pytorch.utilities import move_data_to_device
from torch import Tensor
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    IterableDataset,
    SequentialSampler,
    Subset,
    TensorDataset,
    default_collate,
)

from continual_eval.evaluation.fast_path import fast_loader
from continual_eval.evaluation.loaders import _ShardSampler
from continual_eval.evaluation.lockstep import known_length

#: A dataset that sets this attribute to ``True`` declares that ``dataset[i]`` always returns the
#: same sample (no random transform), so its collated batches may be cached.
DETERMINISTIC_ATTR = "continual_eval_deterministic"


def _deterministic_dataset(dataset: Any) -> bool:
    if getattr(dataset, DETERMINISTIC_ATTR, False) is True:
        return True
    if isinstance(dataset, TensorDataset):
        return True
    if isinstance(dataset, Subset):
        return _deterministic_dataset(dataset.dataset)
    if isinstance(dataset, ConcatDataset):
        return all(_deterministic_dataset(d) for d in dataset.datasets)
    return False


def cache_safety(loader: Any) -> str | None:
    """``None`` when caching ``loader``'s collated batches is safe, else the reason it is not.

    The heuristic: a torch ``DataLoader`` over a map-style dataset, read in order (a
    ``SequentialSampler`` in a plain ``BatchSampler``), with the default collate function, over a
    ``TensorDataset`` (or ``Subset``/``ConcatDataset`` of them) or a dataset declaring
    ``continual_eval_deterministic = True``. Random transforms cannot be detected in general.
    """
    if not isinstance(loader, DataLoader):
        return f"{type(loader).__name__} is not a torch DataLoader"
    if isinstance(loader.dataset, IterableDataset):
        return "an iterable dataset"
    sampler = loader.sampler
    if type(sampler) not in (SequentialSampler, _ShardSampler):
        return f"its sampler is a {type(sampler).__name__}, not a SequentialSampler"
    if type(loader.batch_sampler) is not BatchSampler:
        return "a custom batch sampler"
    if loader.collate_fn is not default_collate:
        return "a custom collate_fn"
    if not _deterministic_dataset(loader.dataset):
        return (
            f"{type(loader.dataset).__name__} may apply random transforms (declare "
            f"`{DETERMINISTIC_ATTR} = True` on the dataset, or pass cache_test_batches=True)"
        )
    return None


class BatchCache:
    """Collated test batches kept on the evaluation device after their first pass.

    Entries are addressed by a hashable ``slot`` (e.g. ``("full", task)``); the whole cache is
    dropped when ``key`` changes (device, rank, loader identities). A loader's batches are kept only
    once it was read to the end; one that would push the total past ``max_bytes`` is not cached
    (and not retried until the cache is dropped).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self.key: Hashable = None
        self._entries: dict[Hashable, list[Any]] = {}
        self._refused: set[Hashable] = set()
        self.nbytes = 0

    def clear(self) -> None:
        self._entries.clear()
        self._refused.clear()
        self.nbytes = 0

    def set_key(self, key: Hashable) -> None:
        """Drop everything if ``key`` differs from the key the entries were made under."""
        if key != self.key:
            self.clear()
            self.key = key

    @property
    def num_cached(self) -> int:
        return len(self._entries)

    @property
    def num_refused(self) -> int:
        return len(self._refused)

    def cached(self, slot: Hashable) -> bool:
        return slot in self._entries

    def refused(self, slot: Hashable) -> bool:
        """Whether ``slot``'s batches did not fit (they are read each time)."""
        return slot in self._refused

    def batches(self, slot: Hashable) -> list[Any]:
        """The batches kept for ``slot`` (on the device)."""
        return self._entries[slot]

    def wrap(self, slot: Hashable, loader: Iterable[Any], device: torch.device) -> Iterable[Any]:
        """An iterable over ``loader``'s batches on ``device``, from the cache once filled."""
        return _CachedLoader(self, slot, loader, device)


class _CachedLoader:
    def __init__(
        self, cache: BatchCache, slot: Hashable, loader: Iterable[Any], device: torch.device
    ) -> None:
        self.cache, self.slot, self.loader, self.device = cache, slot, loader, device

    def __len__(self) -> int:
        if self.cache.cached(self.slot):
            return len(self.cache.batches(self.slot))
        length = known_length(self.loader)
        if length is None:
            raise TypeError(f"{type(self.loader).__name__} has no exact length")
        return length

    def __iter__(self) -> Iterator[Any]:
        source = fast_loader(self.loader, device=self.device)
        return self.fill_from(source, on_device=getattr(source, "device", None) == self.device)

    def fill_from(self, source: Iterable[Any], *, on_device: bool = False) -> Iterator[Any]:
        """The cached batches, else ``source``'s (``self.loader``'s batches, possibly read by the
        fast path or a worker pool) moved to the device (unless ``on_device``: there already),
        kept when they fit."""
        cache, slot = self.cache, self.slot
        if slot in cache._entries:
            yield from cache._entries[slot]
            return
        if slot in cache._refused:
            yield from source
            return
        kept: list[Any] | None = []
        size = 0
        for batch in source:
            if not on_device:
                batch = move_data_to_device(batch, self.device)
            if kept is not None:
                size += _nbytes(batch)
                if cache.nbytes + size > cache.max_bytes:
                    kept = None
                    cache._refused.add(slot)
                else:
                    kept.append(batch)
            yield batch
        if kept is not None:
            cache._entries[slot] = kept
            cache.nbytes += size


def _nbytes(batch: Any) -> int:
    if isinstance(batch, Tensor):
        return batch.numel() * batch.element_size()
    if isinstance(batch, (list, tuple)):
        return sum(_nbytes(b) for b in batch)
    if isinstance(batch, dict):
        return sum(_nbytes(b) for b in batch.values())
    return 0

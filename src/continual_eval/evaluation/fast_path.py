"""Tensor-backed test sets read a batch at a time, without per-sample fetch and collate.

Switched by `continual_eval.evaluation.switches.FAST_PATH`, read at call time.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    SequentialSampler,
    Subset,
    TensorDataset,
    default_collate,
)

from continual_eval.evaluation import switches
from continual_eval.evaluation.loaders import _ShardSampler

#: Persistent-worker loaders whose first ``iter()`` (the only one that draws a seed) was mimicked.
_SEEDED_PERSISTENT: weakref.WeakSet[DataLoader[Any]] = weakref.WeakSet()


def _draw_base_seed(loader: DataLoader[Any]) -> None:
    """Draw the base seed ``iter(loader)`` draws from ``loader.generator`` (the global torch
    generator when ``None``), so that a model that draws random numbers in its forward sees the
    same global RNG state when its batches come from the fast path or a worker pool."""
    if loader.num_workers > 0 and loader.persistent_workers:
        # only the first iter() of a persistent-worker loader creates an iterator and draws
        if loader._iterator is not None or loader in _SEEDED_PERSISTENT:
            return
        _SEEDED_PERSISTENT.add(loader)
    torch.empty((), dtype=torch.int64).random_(generator=loader.generator)


def _read_order(loader: Any) -> tuple[Sequence[int], int, bool] | None:
    """``(indices, batch_size, drop_last)`` of a plain DataLoader over a map-style dataset read in
    a fixed order (a ``SequentialSampler`` or one of our shards in a plain ``BatchSampler``), else
    ``None``."""
    if type(loader) is not DataLoader or isinstance(loader.dataset, IterableDataset):
        return None
    batch_sampler, sampler = loader.batch_sampler, loader.sampler
    if type(batch_sampler) is not BatchSampler or batch_sampler.sampler is not sampler:
        return None
    if type(sampler) is SequentialSampler:
        indices: Sequence[int] = range(len(sampler))
    elif type(sampler) is _ShardSampler:
        indices = sampler.indices
    else:
        return None
    return indices, batch_sampler.batch_size, batch_sampler.drop_last


def _batch_slices(num_indices: int, batch_size: int, drop_last: bool) -> range:
    """Start offsets of the batches a ``BatchSampler`` makes of ``num_indices`` indices."""
    end = num_indices - num_indices % batch_size if drop_last else num_indices
    return range(0, end, batch_size)


def _index_tensor(indices: Any) -> Tensor | None:
    """``indices`` (a list, range, array or tensor of integers) as a 1-D int64 tensor."""
    if isinstance(indices, range):
        return torch.arange(indices.start, indices.stop, indices.step, dtype=torch.int64)
    try:
        t = torch.as_tensor(indices)
    except (TypeError, ValueError, RuntimeError):
        return None
    if t.ndim != 1 or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        return None
    return t.to(device="cpu", dtype=torch.int64)


def _tensor_rows(dataset: Any, order: Sequence[int]) -> tuple[tuple[Tensor, ...], Any] | None:
    """``(tensors, rows)``: the ``TensorDataset`` under ``dataset`` (itself or a chain of
    ``Subset``) and the rows of its tensors that ``dataset[i]`` for ``i`` in ``order`` reads (a
    ``range`` when they are evenly spaced: consecutive, or a strided shard), or ``None``.

    Exact types only: a subclass may override ``__getitem__`` (a transform, a side effect).
    """
    rows: Any = order
    while type(dataset) is Subset:
        mapping = _index_tensor(dataset.indices)
        if mapping is None:
            return None
        rows = mapping[_index_tensor(rows)]
        dataset = dataset.dataset
    if type(dataset) is not TensorDataset or not dataset.tensors:
        return None
    tensors = tuple(dataset.tensors)
    n = tensors[0].shape[0] if tensors[0].ndim else -1
    if any(
        not isinstance(t, Tensor)
        or t.layout != torch.strided
        or not t.is_contiguous()
        or t.ndim == 0
        or t.shape[0] != n
        for t in tensors
    ):
        return None
    if isinstance(rows, range) and rows.step > 0 and (not rows or 0 <= rows[0] <= rows[-1] < n):
        return tensors, rows
    rows = _index_tensor(rows)
    if rows is None or (rows.numel() and (int(rows.min()) < -n or int(rows.max()) >= n)):
        return None  # the DataLoader raises its own IndexError
    rows = torch.where(rows < 0, rows + n, rows)
    if rows.numel() and bool((rows == torch.arange(int(rows[0]), int(rows[0]) + len(rows))).all()):
        return tensors, range(int(rows[0]), int(rows[0]) + len(rows))
    return tensors, rows


def _batched_fetch(dataset: Any) -> bool:
    """Whether the DataLoader reads ``dataset`` with its own ``__getitems__`` (a ``Subset`` only
    when the dataset under it has one: else ``Subset.__getitems__`` reads sample by sample)."""
    while type(dataset) is Subset:
        dataset = dataset.dataset
    return callable(getattr(type(dataset), "__getitems__", None)) and bool(
        getattr(dataset, "__getitems__", None)
    )


#: bytes of one tensor's rows copied at a time, then split into batches (one copy and one split
#: per chunk instead of one slice and one copy per batch)
CHUNK_BYTES = 4 * 2**20


class _FastBatches:
    """The batches of a DataLoader over tensors read by copying the tensors' rows a chunk of
    batches at a time and splitting the copy (or by the dataset's own ``__getitems__``), equal to
    the DataLoader's: same order, sizes, last batch, dtype, shape and strides, a contiguous tensor
    per element that no other batch and not the dataset shares, in a list as ``default_collate``
    returns for a ``TensorDataset``'s tuples.

    ``device``: where the batches are made (a chunk is copied there at once; ``None``: on the
    dataset's device, pinned with ``pin_memory``).
    """

    def __init__(
        self,
        loader: DataLoader[Any],
        order: Sequence[int],
        batch_size: int,
        drop_last: bool,
        tensor_rows: tuple[tuple[Tensor, ...], Any] | None,
        pin_memory: bool,
        device: torch.device | None = None,
    ) -> None:
        self.loader, self.order, self.batch_size = loader, order, batch_size
        self.starts = _batch_slices(len(order), batch_size, drop_last)
        self.tensor_rows, self.pin_memory = tensor_rows, pin_memory
        self.device: torch.device | None = None
        if tensor_rows is not None:
            devices = {t.device for t in tensor_rows[0]}
            if device is not None:
                self.device = device
            elif len(devices) == 1:
                self.device = devices.pop()

    def __len__(self) -> int:
        return len(self.starts)

    def _chunk(self, t: Tensor, rows: Any, start: int, stop: int) -> Tensor:
        """A fresh contiguous copy of rows ``start:stop`` of ``t`` (pinned, or on the device)."""
        if isinstance(rows, range):  # evenly spaced rows: a (strided) slice
            picked = rows[start:stop]
            part, fresh = t[picked.start : picked.stop : picked.step], False
        else:
            part, fresh = t.index_select(0, rows[start:stop].to(t.device)), True
        target = self.device if self.device is not None else t.device
        if target != t.device:
            if self.pin_memory and t.device.type == "cpu":
                part = torch.empty(part.shape, dtype=part.dtype, pin_memory=True).copy_(part)
            return part.to(
                target, non_blocking=self.pin_memory, memory_format=torch.contiguous_format
            )
        if self.pin_memory and t.device.type == "cpu":
            return torch.empty(part.shape, dtype=part.dtype, pin_memory=True).copy_(part)
        return part if fresh else part.clone(memory_format=torch.contiguous_format)

    def _rows_per_chunk(self, tensors: Sequence[Tensor]) -> int:
        """A whole number of batches whose rows of the widest tensor fit `CHUNK_BYTES`."""
        row_bytes = max(math.prod(t.shape[1:]) * t.element_size() for t in tensors)
        return self.batch_size * max(1, CHUNK_BYTES // max(1, row_bytes * self.batch_size))

    def __iter__(self) -> Iterator[Any]:
        _draw_base_seed(self.loader)
        size, n = self.batch_size, len(self.order)
        if self.tensor_rows is not None:
            if not self.starts:
                return
            tensors, rows = self.tensor_rows
            end = min(self.starts[-1] + size, n)
            step = self._rows_per_chunk(tensors)
            for first in range(0, end, step):
                stop = min(first + step, end)
                parts = [torch.split(self._chunk(t, rows, first, stop), size) for t in tensors]
                for batch in zip(*parts, strict=True):
                    yield list(batch)
            return
        dataset: Any = self.loader.dataset
        for start in self.starts:
            batch = default_collate(dataset.__getitems__(list(self.order[start : start + size])))
            yield _pin(batch) if self.pin_memory else batch


def _pin(batch: Any) -> Any:
    from lightning_utilities import apply_to_collection

    return apply_to_collection(
        batch, Tensor, lambda t: t.pin_memory() if t.device.type == "cpu" else t
    )


def fast_loader(
    loader: Any, *, pin_memory: bool = False, device: torch.device | None = None
) -> Iterable[Any]:
    """``loader``'s batches without the DataLoader's per-sample fetch and collate, when that is
    exact; else ``loader`` itself.

    The fast path takes a torch ``DataLoader`` (exactly, not a subclass) read in order (a
    ``SequentialSampler``, or a shard of `shard_dataloader`, in a plain ``BatchSampler``)
    with the default collate function over

    * a ``TensorDataset`` (exactly), or a ``Subset`` (chain) of one: the rows of a chunk of
      batches (`CHUNK_BYTES` per tensor) are copied at once (a slice, or one
      ``index_select`` for scattered indices) and split into the batches;
    * a dataset defining ``__getitems__`` (or a ``Subset`` of one), read with ``num_workers=0``:
      ``default_collate(dataset.__getitems__(batch_indices))``, what the DataLoader does.

    The batches equal the DataLoader's (order, batch size, last partial batch, ``drop_last``,
    dtype, the list structure of ``default_collate``), and the global RNG advances as
    ``iter(loader)`` advances it. Anything else (a custom sampler, batch sampler or collate
    function, a dataset whose ``__getitem__`` may transform samples, a DataLoader subclass) keeps
    the DataLoader. ``device``: make a tensor dataset's batches there (one copy per chunk; the
    result's ``device`` attribute says where they are); ``pin_memory``: stage host copies in
    page-locked memory (for a non-blocking copy to an accelerator). ``FAST_PATH = False`` turns
    it off.
    """
    unchanged: Iterable[Any] = loader
    if not switches.FAST_PATH:
        return unchanged
    read = _read_order(loader)
    if read is None or loader.collate_fn is not default_collate:
        return unchanged
    order, batch_size, drop_last = read
    tensor_rows = _tensor_rows(loader.dataset, order)
    if tensor_rows is None and not (loader.num_workers == 0 and _batched_fetch(loader.dataset)):
        return unchanged
    return _FastBatches(loader, order, batch_size, drop_last, tensor_rows, pin_memory, device)

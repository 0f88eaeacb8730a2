r"""Stream positions of the samples a rank trains, and reading batches ahead of training.

**The global stream order.** The stream is what the training loop consumes, over all ranks and
epochs, in order. Epoch ``e`` starts at stream position `o_e` (the valid samples of the
epochs before it); in it rank ``r`` of ``W`` trains its ``i``-th sample at position
`o_e + r + W i`. This is how a ``DistributedSampler`` (which Lightning puts into the
training loader under DDP) interleaves a dataset: rank ``r`` reads the dataset order's entries
``r, r + W, r + 2W, ...``, so training step ``k`` of ``W`` ranks with per-rank batch size ``B``
trains exactly the positions `[o_e + kWB, o_e + (k+1)WB)`, the same samples one process
with batch size ``WB`` trains at step ``k``. Positions at or beyond the epoch's dataset length
are the sampler's padding (duplicates of the first samples): trained, never scored. Without a
``DistributedSampler`` (one process, or a loader the ranks shard themselves) the same formula
defines the order; the ranks must then train equally many samples per step (checked per
window).

**Reading ahead.** The batch ``m`` steps ahead of a training step that starts at position ``c``
is the global batch `[c + mG, c + (m+1)G)`, `G = WB`; rank ``r`` reads its share
`c + mG + r + Wj`, `j < B`, so the ranks together score each future sample once.
Source ``"stream"``: ``stream[p]`` of a user-supplied indexable stream (any epoch, up to
``len(stream)``). Source ``"train_loader"``: the training loader's own dataset order of the
current epoch (its batch sampler's indices, materialised once per epoch; a sampler that draws its
order when iterated, e.g. ``RandomSampler``, cannot be read ahead and is refused), so nothing past
the epoch's end. Either way the samples are collated with the training loader's ``collate_fn``
(tensor-backed datasets are sliced, as the evaluation engine's fast path does) and moved with a
plain device move.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
    Subset,
    default_collate,
)

from continual_eval.evaluation.fast_path import fast_loader
from continual_eval.stage_cost import batch_samples

__all__ = ["LookaheadReader", "StreamLayout", "readable_order", "valid_samples"]


def valid_samples(loader: Any) -> int | None:
    """How many samples of an epoch of ``loader`` are stream samples over all ranks: a
    ``DistributedSampler`` without ``drop_last`` pads its dataset to a multiple of the world
    size, so only ``len(dataset)`` of its positions are valid; ``None``: every position is."""
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, DistributedSampler) and not sampler.drop_last:
        return len(sampler.dataset)  # type: ignore[arg-type]
    return None


def readable_order(loader: Any) -> str | None:
    """``None`` when ``loader``'s order can be read ahead (a map-style dataset under a
    ``SequentialSampler`` or a ``DistributedSampler``, which fixes its order from its seed and
    epoch), else why not."""
    if not isinstance(loader, DataLoader):
        return f"the training loader is a {type(loader).__name__}, not a DataLoader"
    if isinstance(loader.dataset, IterableDataset):
        return "the training dataset is an IterableDataset, which has no order to read ahead in"
    sampler = getattr(loader.batch_sampler, "sampler", None)
    if type(sampler) not in (SequentialSampler, DistributedSampler):
        return (
            f"the training loader's sampler is a {type(sampler).__name__}, whose order is drawn "
            "when it is iterated (a stream has a fixed order: shuffle=False)"
        )
    return None


class StreamLayout:
    """Where this rank's samples sit in the global stream (see the module docstring)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.offset = 0  # the stream position of the current epoch's first sample
        self.local = 0  # samples this rank consumed in the current epoch
        self.epoch_batches = 0  # batches this rank consumed in the current epoch
        self.epoch_limit: int | None = None  # valid positions of the epoch (None: no padding)
        self.epoch: int | None = None  # the epoch in progress

    def batch_start(self) -> int:
        """The stream position where the next training step starts (all ranks)."""
        return self.offset + self.world_size * self.local

    def first_position(self, local: int) -> int:
        """The position of this rank's ``local``-th sample of the epoch."""
        return self.offset + self.rank + self.world_size * local

    def valid_count(self, local: int, n: int) -> int:
        """How many of this rank's samples ``local .. local + n - 1`` of the epoch are stream
        samples (not padding)."""
        if self.epoch_limit is None:
            return n
        W = self.world_size
        last = -(-(self.epoch_limit - self.rank) // W)  # slots with r + W i < limit
        return max(0, min(n, last - local))

    def advance(self, n: int) -> None:
        self.local += n
        self.epoch_batches += 1

    def consumed(self) -> int:
        """Valid stream samples of all ranks trained in the current epoch so far."""
        done = self.world_size * self.local
        return done if self.epoch_limit is None else min(done, self.epoch_limit)

    def end_epoch(self) -> None:
        self.offset += self.consumed()
        self.local = self.epoch_batches = 0
        self.epoch = None

    def state_dict(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "local": self.local,
            "epoch_batches": self.epoch_batches,
            "epoch_limit": self.epoch_limit,
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.offset, self.local = int(state["offset"]), int(state["local"])
        self.epoch_batches = int(state["epoch_batches"])
        self.epoch_limit = state["epoch_limit"]
        self.epoch = state["epoch"]


class LookaheadReader:
    """Reads this rank's share of the batch ``m`` steps ahead of the current training step.

    One reader per offset ``m``: a DataLoader over this rank's future slots from the current one
    on (read through the evaluation engine's `fast_loader`),
    advanced one batch per training step, so that each future batch is read once per offset and
    no loader is built per step; it is rebuilt whenever the training step it expects is not the
    one asked for (an epoch's start, a resume, the label-delay head).
    """

    def __init__(self, stream: Any | None, batch_size: int) -> None:
        self.stream = stream
        self.source = "stream" if stream is not None else "train_loader"
        self.batch_size = batch_size
        self._order: torch.Tensor | None = None  # the epoch's dataset indices on this rank
        self._dataset: Any = None
        self._collate: Callable[[list[Any]], Any] = default_collate
        self._started = False
        #: offset -> (the local slot its next batch starts at, its batches)
        self._readers: dict[int, tuple[int, Iterator[Any]]] = {}

    def ready(self) -> bool:
        """Whether `begin_epoch` has run in this process."""
        return self._started

    def begin_epoch(self, loader: DataLoader[Any]) -> None:
        """Take the epoch's order (train_loader source) and the collate function."""
        self._collate = loader.collate_fn or default_collate
        self._started = True
        self._readers = {}
        if self.stream is None:
            order = [i for batch in loader.batch_sampler for i in batch]  # type: ignore[union-attr]
            self._order = torch.tensor(order, dtype=torch.int64)
            self._dataset = loader.dataset

    def _open(self, layout: StreamLayout, local: int) -> Iterator[Any] | None:
        """The batches of this rank's slots ``local, local + 1, ...`` (``None``: none left)."""
        W, B = layout.world_size, self.batch_size
        first = layout.first_position(local)
        if self.stream is not None:
            # the stream's positions first, first + W, ... below len(stream)
            indices: list[int] = list(range(first, len(self.stream), W))
            dataset = self.stream
        else:
            assert self._order is not None
            end = min(len(self._order), local + layout.valid_count(local, len(self._order)))
            indices = self._order[local:end].tolist()
            dataset = self._dataset
        if not indices:
            return None
        loader = DataLoader(
            Subset(dataset, indices), batch_size=B, shuffle=False, collate_fn=self._collate
        )
        return iter(fast_loader(loader))

    def read(self, layout: StreamLayout, m: int) -> tuple[Any, int, int] | None:
        """``(batch, first position, samples)`` of this rank's share of the global batch ``m``
        steps ahead (positions ``first + W j``), or ``None`` when the stream holds none of it."""
        local = layout.local + m * self.batch_size
        expected, batches = self._readers.pop(m, (None, None))
        if expected != local or batches is None:
            batches = self._open(layout, local)
            if batches is None:
                return None
        batch = next(batches, None)
        if batch is None:
            return None
        n = batch_samples(batch)
        assert n is not None
        self._readers[m] = (local + n, batches)
        return batch, layout.first_position(local), n

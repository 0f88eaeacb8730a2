r"""Stream positions of the samples a rank trains, and reading batches ahead of training.

**The global stream order.** The stream is what the training loop consumes, over all ranks and
epochs, in order. Epoch ``e`` starts at stream position :math:`o_e` (the valid samples of the
epochs before it); in it rank ``r`` of ``W`` trains its ``i``-th sample at position
:math:`o_e + r + W i`. This is how a ``DistributedSampler`` (which Lightning puts into the
training loader under DDP) interleaves a dataset: rank ``r`` reads the dataset order's entries
``r, r + W, r + 2W, ...``, so training step ``k`` of ``W`` ranks with per-rank batch size ``B``
trains exactly the positions :math:`[o_e + kWB, o_e + (k+1)WB)`, the same samples one process
with batch size ``WB`` trains at step ``k``. Positions at or beyond the epoch's dataset length
are the sampler's padding (duplicates of the first samples): trained, never scored. Without a
``DistributedSampler`` (one process, or a loader the ranks shard themselves) the same formula
defines the order; the ranks must then train equally many samples per step (checked per
window).

**Reading ahead.** The batch ``m`` steps ahead of a training step that starts at position ``c``
is the global batch :math:`[c + mG, c + (m+1)G)`, :math:`G = WB`; rank ``r`` reads its share
:math:`c + mG + r + Wj`, :math:`j < B`, so the ranks together score each future sample once.
Source ``"stream"``: ``stream[p]`` of a user-supplied indexable stream (any epoch, up to
``len(stream)``). Source ``"train_loader"``: the training loader's own dataset order of the
current epoch (its batch sampler's indices, materialised once per epoch; a sampler that draws its
order when iterated, e.g. ``RandomSampler``, cannot be read ahead and is refused), so nothing past
the epoch's end. Either way the samples are collated with the training loader's ``collate_fn``
(tensor-backed datasets are sliced, as the evaluation engine's fast path does) and moved with a
plain device move.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
    Subset,
)
from torch.utils.data._utils.collate import default_collate

from continual_eval.evaluation import fast_loader

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
    sampler = loader.batch_sampler.sampler if loader.batch_sampler is not None else None
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
    """Reads this rank's share of the batch ``m`` steps ahead of the current training step."""

    def __init__(self, stream: Any | None, batch_size: int) -> None:
        self.stream = stream
        self.source = "stream" if stream is not None else "train_loader"
        self.batch_size = batch_size
        self._order: torch.Tensor | None = None  # the epoch's dataset indices on this rank
        self._dataset: Any = None
        self._collate: Callable[[list[Any]], Any] = default_collate
        self._started = False

    def ready(self) -> bool:
        """Whether :meth:`begin_epoch` has run in this process."""
        return self._started

    def begin_epoch(self, loader: DataLoader) -> None:
        """Take the epoch's order (train_loader source) and the collate function."""
        self._collate = loader.collate_fn or default_collate
        self._started = True
        if self.stream is None:
            order = [i for batch in loader.batch_sampler for i in batch]  # type: ignore[union-attr]
            self._order = torch.tensor(order, dtype=torch.int64)
            self._dataset = loader.dataset

    def read(self, layout: StreamLayout, m: int) -> tuple[Any, int, int] | None:
        """``(batch, first position, samples)`` of this rank's share of the global batch ``m``
        steps ahead (positions ``first + W j``), or ``None`` when the stream holds none of it."""
        W, B = layout.world_size, self.batch_size
        local = layout.local + m * B
        first = layout.first_position(local)
        if self.stream is not None:
            # positions first + W j < len(stream)
            n = min(B, max(0, -(-(len(self.stream) - first) // W)))
            if n == 0:
                return None
            indices: Any = range(first, first + W * n, W)
            dataset = self.stream
        else:
            assert self._order is not None
            n = min(layout.valid_count(local, B), max(0, len(self._order) - local))
            if n == 0:
                return None
            indices = self._order[local : local + n].tolist()
            dataset = self._dataset
        loader = DataLoader(
            Subset(dataset, list(indices)), batch_size=n, shuffle=False, collate_fn=self._collate
        )
        return next(iter(fast_loader(loader))), first, n

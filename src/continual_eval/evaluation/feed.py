"""What one task's forward outputs feed: the non-finite-output watch and every scorer, with the
batch-additive scorers fed groups of consecutive batches concatenated (one update per group)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

import continual_eval.evaluation.scorers as scorers_module
from continual_eval.evaluation.errors import EvaluationError
from continual_eval.evaluation.scorers import Scorer, checked_update, scorer_batch_error


class _OutputWatch:
    """Watches one task's predictions for non-finite ones, with no host sync per batch.

    A prediction is one score vector over the class dimension (dim 1) when ``preds`` has one more
    dimension than ``target``, else one element. It is non-finite when its top score is NaN or
    infinite: a NaN or ``+inf`` anywhere in the vector, or every score ``-inf``; ``-inf`` scores
    next to finite ones (masked classes) are fine. Per update (a batch, or a group of consecutive
    batches concatenated) this costs a max, an ``isfinite`` and a sum on the device, and keeps one
    flag per row (sample) of the update; `_watch_counts` turns the watches of every task
    into counts in a few ops for all tasks, and only a task with a non-finite prediction reads its
    flags back (`_first_bad_batches`).
    """

    def __init__(self) -> None:
        self.finite: list[Tensor] = []  # per float update: finite predictions (device scalar)
        self.sizes: list[int] = []  # per float update: predictions
        self.batches: list[int] = []  # per float update: the index of its first batch
        self.rows: list[Sequence[int]] = []  # per float update: rows (samples) per batch
        self.flags: list[Tensor] = []  # per float update: per row, all its predictions finite

    def update(
        self, preds: Tensor, target: Tensor, batch_index: int, sizes: Sequence[int] = ()
    ) -> None:
        """Watch ``preds``: one batch, or with ``sizes`` (rows per batch) a group of consecutive
        batches concatenated along dim 0, the first of them batch ``batch_index``."""
        if not preds.is_floating_point():
            return
        top = preds.amax(dim=1) if preds.ndim == target.ndim + 1 and preds.ndim >= 2 else preds
        finite = (top - top) == 0  # torch.isfinite in 2 kernels: x - x is 0 iff x is finite
        self.finite.append(finite.sum())
        self.sizes.append(top.numel())
        self.batches.append(batch_index)
        n = finite.shape[0] if finite.ndim else 1
        self.rows.append(sizes or (n,))
        self.flags.append(finite if finite.ndim == 1 else finite.reshape(n, -1).all(dim=1))


def _watch_counts(watches: Sequence[_OutputWatch], device: torch.device) -> Tensor:
    """``[tasks, 2]`` int64, row ``k`` ``[nonfinite, predictions]`` of ``watches[k]``; a fixed
    number of ops for all tasks."""
    out = torch.zeros(len(watches), 2, dtype=torch.int64, device=device)
    finite = [f for w in watches for f in w.finite]
    if not finite:
        return out
    host = torch.tensor(
        [
            [n for w in watches for n in w.sizes],
            [k for k, w in enumerate(watches) for _ in w.sizes],
        ],
        dtype=torch.int64,
    ).to(device)
    sizes, rows = host[0], host[1]
    out[:, 0].index_add_(0, rows, sizes - torch.stack(finite).to(device, torch.int64))
    out[:, 1].index_add_(0, rows, sizes)
    return out


def _first_bad_batch(watch: _OutputWatch) -> int | None:
    """The index of the first batch holding a non-finite prediction (``None``: none); reads
    the watch's row flags back to the host."""
    for flags, first, rows in zip(watch.flags, watch.batches, watch.rows, strict=True):
        bad = (~flags).nonzero()
        if bad.numel():
            row, end = int(bad[0, 0]), 0
            for offset, n in enumerate(rows):
                end += n
                if row < end:
                    return first + offset
    return None


def _first_bad_batches(
    watches: Sequence[_OutputWatch], rank: int, world_size: int, device: torch.device
) -> Tensor:
    """``[len(watches), W]`` int64: column ``rank`` holds each watch's first bad batch + 1 (0:
    none), the other columns 0, so that a sum across ranks gives every rank's."""
    out = torch.zeros(len(watches), max(world_size, 1), dtype=torch.int64)
    for k, watch in enumerate(watches):
        first = _first_bad_batch(watch)
        out[k, rank] = 0 if first is None else first + 1
    return out.to(device)


def _group_key(preds: Tensor, target: Tensor) -> tuple[Any, ...] | None:
    """What two batches must share to be concatenated along dim 0 (``None``: this batch is fed
    alone: not plain strided tensors with a batch dimension of equal length)."""
    if type(preds) is not Tensor or type(target) is not Tensor:
        return None
    shape, target_shape = preds.shape, target.shape
    if (
        not shape
        or not target_shape
        or shape[0] != target_shape[0]
        or preds.layout != torch.strided
        or target.layout != torch.strided
    ):
        return None
    return (shape[1:], preds.dtype, preds.device, target_shape[1:], target.dtype, target.device)


def _copy(t: Tensor) -> Tensor:
    """A copy of ``t`` that a later forward pass cannot overwrite (e.g. a CUDA-graph output)."""
    return (t.detach() if t.requires_grad else t).clone()


class _TaskFeed:
    """Feeds one task's ``(preds, target)`` pairs to the output watch and every scorer.

    Scorers that are not ``batch_additive`` get each batch as the step returned it, at once. The
    batch-additive scorers and the watch get copies of consecutive batches concatenated along dim
    0, one update per group: a group ends when a batch does not fit it (another shape beyond dim 0,
    dtype or device), when its copies reach `BUFFER_BYTES`, and at the end of the task
    (`flush`). A batch that cannot be concatenated (0-d, or not as many predictions as
    targets) or that alone holds `BUFFER_BYTES` is fed alone, uncopied, after the group
    before it. Without batch-additive scorers the watch too sees every batch alone and nothing is
    copied.
    """

    def __init__(self, scorers: Sequence[Scorer], watch: _OutputWatch) -> None:
        self.each = [s for s in scorers if getattr(s, "batch_additive", False) is not True]
        self.grouped = [s for s in scorers if getattr(s, "batch_additive", False) is True]
        # (scorer, its checked update): errors name the scorer and the batch (scorers.py)
        self._each = [(s, checked_update(s)) for s in self.each]
        self._grouped = [(s, checked_update(s)) for s in self.grouped]
        self.watch = watch
        self._preds: list[Tensor] = []
        self._targets: list[Tensor] = []
        self._sizes: list[int] = []
        self._first = 0  # the group's first batch index
        self._key: tuple[Any, ...] | None = None
        self._bytes = 0

    def add(self, preds: Tensor, target: Tensor, batch_index: int, owned: bool = False) -> None:
        """Feed one batch's output. ``owned``: ``target`` is the engine's own tensor (a batch
        the fast path or the cache made), which nothing writes to later, so it is held, not
        copied."""
        if not self.grouped:
            self.watch.update(preds, target, batch_index)
        for s, update in self._each:
            try:
                update(preds, target)
            except EvaluationError as err:
                raise scorer_batch_error(s, err, batch_index) from err
        if not self.grouped:
            return
        key = _group_key(preds, target)
        size = preds.nbytes + target.nbytes if key is not None else 0
        alone = key is None or size >= scorers_module.BUFFER_BYTES
        if alone or key != self._key:
            # the group held goes first: its batches precede this one (the watch's first bad
            # batch is the first flagged update, and a group's batches must be consecutive)
            self.flush()
        if alone:
            self._feed(preds, target, batch_index, ())  # a big batch is not copied
            return
        if not self._preds:
            self._key, self._first = key, batch_index
        self._preds.append(_copy(preds))
        self._targets.append(target if owned else _copy(target))
        self._sizes.append(preds.shape[0])
        self._bytes += size
        if self._bytes >= scorers_module.BUFFER_BYTES:
            self.flush()

    def flush(self) -> None:
        """Feed the group held (if any)."""
        if not self._preds:
            return
        preds, target = self._preds, self._targets
        sizes, first = self._sizes, self._first
        self._preds, self._targets, self._sizes = [], [], []
        self._key, self._bytes = None, 0
        if len(preds) == 1:
            self._feed(preds[0], target[0], first, ())
        else:
            self._feed(torch.cat(preds), torch.cat(target), first, sizes)

    def _feed(self, preds: Tensor, target: Tensor, first: int, sizes: Sequence[int]) -> None:
        self.watch.update(preds, target, first, sizes)
        for s, update in self._grouped:
            try:
                update(preds, target)
            except EvaluationError as err:
                raise scorer_batch_error(s, err, first, max(len(sizes), 1)) from err

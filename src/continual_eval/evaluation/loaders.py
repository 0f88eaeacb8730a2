"""Test loaders for exact evaluation: unpadded shards per rank, seeded subsets, re-built loaders."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
)

from continual_eval.evaluation.errors import EvaluationError


class _ShardSampler(Sampler[int]):
    """Strided shard ``rank, rank + world, ...`` of ``base``: no padding, no duplicates (a
    ``range`` stays a ``range``)."""

    def __init__(self, base: Sequence[int] | range, rank: int, world_size: int) -> None:
        self.indices: Sequence[int] = (
            base[rank::world_size] if isinstance(base, range) else list(base)[rank::world_size]
        )

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class _UnreproducibleError(Exception):
    """The loader reads a sample set that no re-built loader can read (a random one)."""


def _distributed_sampler_types() -> tuple[type, ...]:
    """Distributed samplers whose samples are known: torch's and Lightning's unpadded fork."""
    try:
        from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
    except ImportError:  # pragma: no cover - an internal module of Lightning
        return (DistributedSampler,)
    return (DistributedSampler, UnrepeatedDistributedSampler)


def _distributed_indices(
    loader: DataLoader[Any], sampler: DistributedSampler[Any], n: int
) -> Sequence[int]:
    """The samples a loader over a ``DistributedSampler`` means: what all its replicas read
    together, without the padding (for ``drop_last=False`` the whole dataset; for
    ``shuffle=False, drop_last=True`` the first ``num_samples * num_replicas``)."""
    if type(sampler) not in _distributed_sampler_types():
        raise _UnreproducibleError(
            f"its sampler, {type(sampler).__name__}, is a DistributedSampler subclass whose "
            "samples cannot be known, and each rank's copy reads only part of the test set; use "
            "torch's DistributedSampler, or a plain (sequential) sampler: continual-eval shards "
            "test sets itself"
        )
    if len(sampler.dataset) != n:  # type: ignore[arg-type]
        raise _UnreproducibleError(
            f"its DistributedSampler draws from {len(sampler.dataset)} samples but the loader's "  # type: ignore[arg-type]
            f"dataset has {n}"
        )
    replicas, batch_size = sampler.num_replicas, loader.batch_size
    assert batch_size is not None
    # samples per replica: num_samples for torch's sampler (total_size is padded to a multiple of
    # num_replicas), ceil or floor of n / num_replicas for the unpadded fork (total_size = n)
    per_replica = {len(range(r, sampler.total_size, replicas)) for r in range(replicas)}
    if loader.drop_last and any(k % batch_size for k in per_replica):
        shown = " or ".join(str(k) for k in sorted(per_replica, reverse=True))
        raise _UnreproducibleError(
            f"drop_last=True on the DataLoader drops each replica's last partial batch (its "
            f"{type(sampler).__name__} gives each of {replicas} replicas {shown} samples, "
            f"batch_size={batch_size}), which depends on the number of processes; pass "
            "drop_last=False to the DataLoader"
        )
    if type(sampler) is not DistributedSampler or not sampler.drop_last or sampler.total_size == n:
        return range(n)
    if not sampler.shuffle:
        return range(sampler.total_size)
    raise _UnreproducibleError(
        f"DistributedSampler(shuffle=True, drop_last=True) drops a random {n - sampler.total_size}"
        f" of the {n} samples (drawn from seed + epoch, which set_epoch changes), so the test set "
        "is not fixed; pass drop_last=False to the DistributedSampler (every sample, once: "
        "continual-eval never pads) or shuffle=False"
    )


def _sampled_indices(loader: Any) -> Sequence[int] | None:
    """The fixed set of dataset indices ``loader`` reads, in index order, or ``None`` when it is not
    a DataLoader over a map-style dataset with a batch size whose sampler reads a fixed set
    (sequential, random without replacement, a subset, a distributed sampler, or one of our
    shards).

    ``drop_last=True`` with a partial last batch: a sequential sampler reads all but the last
    ``len % batch_size`` indices; a shuffling one drops a random tail, which raises
    `_UnreproducibleError`, as does a distributed sampler whose samples cannot be known.
    """
    if (
        not isinstance(loader, DataLoader)
        or isinstance(loader.dataset, IterableDataset)
        or loader.batch_size is None
    ):
        return None
    sampler, n = loader.sampler, len(loader.dataset)  # type: ignore[arg-type]
    ordered = True
    indices: Sequence[int]
    if isinstance(sampler, DistributedSampler):
        return _distributed_indices(loader, sampler, n)
    if type(sampler) is SequentialSampler:
        indices = range(n)
    elif type(sampler) is RandomSampler and not sampler.replacement and sampler.num_samples == n:
        indices, ordered = range(n), False
    elif type(sampler) is SubsetRandomSampler:
        indices, ordered = sorted(int(i) for i in sampler.indices), False
    elif type(sampler) is _ShardSampler:
        indices = sampler.indices
    else:
        return None
    tail = len(indices) % loader.batch_size
    if not loader.drop_last or tail == 0:
        return indices
    if ordered:
        return indices[: len(indices) - tail]
    raise _UnreproducibleError(
        f"drop_last=True with a shuffling {type(sampler).__name__}: the loader drops a random "
        f"{tail} of its {len(indices)} samples (batch_size={loader.batch_size}) on every pass, so "
        f"every evaluation would score a different subset and the samples cannot be split "
        f"exactly across processes; pass drop_last=False (score all {len(indices)}) or "
        f"shuffle=False (every evaluation then drops the same last {tail})"
    )


def _loader_label(loader: Any, task: int | None, task_name: str | None) -> str:
    """``task 3 ('cars'), test dataloader 3``, or a description of ``loader`` without a task."""
    if task is not None:
        return f"task {task} ({task_name or f'task_{task}'!r}), test dataloader {task}"
    if not isinstance(loader, DataLoader):
        return f"test dataloader ({type(loader).__name__})"
    dataset = loader.dataset
    size = f" of {len(dataset)} samples" if hasattr(dataset, "__len__") else ""
    return (
        f"test dataloader (DataLoader over {type(dataset).__name__}{size}, "
        f"batch_size={loader.batch_size}, {type(loader.sampler).__name__}, "
        f"drop_last={loader.drop_last})"
    )


def _rebuild_loader(loader: DataLoader[Any], dataset: Any, **options: Any) -> DataLoader[Any]:
    """A DataLoader over ``dataset`` with ``loader``'s batch size, collate function and worker
    settings, keeping the last partial batch; ``options`` (sampler, shuffle, generator) are passed
    on."""
    kwargs: dict[str, Any] = {
        "batch_size": loader.batch_size,
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "drop_last": False,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "persistent_workers": loader.persistent_workers,
        **options,
    }
    if kwargs["num_workers"] > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    else:  # options only a multi-process loader takes
        kwargs.update(persistent_workers=False, multiprocessing_context=None)
    return DataLoader(dataset, **kwargs)


def shard_dataloader(
    loader: Any,
    rank: int,
    world_size: int,
    *,
    task: int | None = None,
    task_name: str | None = None,
    in_order: bool = False,
) -> tuple[Any, bool]:
    """Return ``(loader for this rank, sharded)``.

    The indices the loader reads (the whole map-style dataset, a ``SubsetRandomSampler``'s subset,
    a sequential loader's samples before a ``drop_last`` tail) are split into strided, unpadded
    shards (any shuffling is dropped: a score does not depend on the order), so the counts summed
    over ranks equal the counts of one process.

    A ``DistributedSampler`` (e.g. a ``test_dataloader()`` built for ``trainer.test``) means its
    whole dataset, whatever the sampler's ``num_replicas``/``rank``: what all its replicas read
    together without the padding. It is re-sharded over ``world_size`` ranks, and in a single
    process (``world_size=1``) re-built over that whole set; its shuffle/seed only matter with
    ``drop_last=True``.

    Loaders that cannot be re-built over the same samples (iterable datasets, custom samplers or
    batch samplers, non-DataLoader iterables) come back unchanged with ``sharded=False``: the
    caller then counts them on rank 0 only. With ``world_size <= 1`` every loader except one over a
    ``DistributedSampler`` comes back unchanged, after the same check as on several ranks;
    with ``in_order`` (per-item records: item ``k`` is the ``k``-th sample read) a shuffling
    loader is re-built to read its samples in index order in one process too.

    Raises:
        EvaluationError: the samples are not the same on every pass, so they can be reproduced
            neither by a later evaluation nor on several ranks (``drop_last=True`` with a
            shuffling sampler and a partial last batch; a ``DistributedSampler`` dropping a random
            tail, or a subclass of unknown behaviour); the same rule in one process and in many.
            The message names ``task`` and ``task_name`` when given, else describes the loader,
            and says how to fix it.
    """
    distributed = isinstance(getattr(loader, "sampler", None), DistributedSampler)
    try:
        indices = _sampled_indices(loader)
    except _UnreproducibleError as err:
        raise EvaluationError(f"{_loader_label(loader, task, task_name)}: {err}") from None
    shuffled = in_order and type(getattr(loader, "sampler", None)) is not SequentialSampler
    if world_size <= 1 and not distributed and not (shuffled and indices is not None):
        return loader, True
    if indices is None:
        return loader, False
    shard = _ShardSampler(indices, rank, max(world_size, 1))
    rebuilt = _rebuild_loader(loader, loader.dataset, sampler=shard, generator=loader.generator)
    return rebuilt, True


def spare_dataloader(loader: Any) -> DataLoader[Any] | None:
    """A loader of one real sample of ``loader``'s test set (the first index it reads), in the
    main process, or ``None`` when its samples cannot be known (see `shard_dataloader`) or
    it has none.

    Lockstep evaluation (`lockstep`) runs the model on it, and
    discards the output, on a process that holds no sample of the task while the others score
    theirs: under a strategy whose forward pass is a collective every process must call the model
    equally often.
    """
    try:
        indices = _sampled_indices(loader)
    except _UnreproducibleError:
        return None
    if not indices:
        return None
    first = _ShardSampler(indices[:1], 0, 1)
    return _rebuild_loader(loader, loader.dataset, sampler=first, num_workers=0)


def subset_dataloader(loader: Any, size: int, seed: int) -> tuple[Any, Tensor]:
    """A loader over a fixed, seeded subset of ``loader``'s map-style dataset, in index order.

    With ``I`` the indices the loader reads (``range(len(dataset))``, a ``SubsetRandomSampler``'s
    subset, a sequential loader's samples before a ``drop_last`` tail, a ``DistributedSampler``'s
    whole dataset), the subset is
    ``sorted(I[randperm(len(I), generator=Generator().manual_seed(seed))[:size]])`` (all of ``I``
    when ``size >= len(I)``). Returns ``(loader, dataset indices)``.

    Raises:
        ValueError: ``loader`` is not a DataLoader with a batch size over a map-style dataset whose
            sampler reads a fixed set of samples.
    """
    try:
        readable = _sampled_indices(loader)
    except _UnreproducibleError as err:
        raise EvaluationError(f"a test subset needs a fixed set of samples: {err}") from None
    if readable is None:
        raise ValueError(
            "a test subset needs a torch DataLoader with batch_size set over a map-style dataset, "
            "read by a sequential, random (without replacement), SubsetRandomSampler or "
            f"DistributedSampler sampler; got {type(loader).__name__}"
            + (
                f" over {type(loader.dataset).__name__} with {type(loader.sampler).__name__}"
                if isinstance(loader, DataLoader)
                else ""
            )
        )
    pool = torch.as_tensor(list(readable), dtype=torch.long)
    perm = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))
    indices = pool[perm[: min(size, len(pool))]].sort().values
    subset = Subset(loader.dataset, indices.tolist())
    return _rebuild_loader(loader, subset, shuffle=False), indices


#: how a stage-end subset is drawn, as ``results.json`` states it per task
STRATIFIED_RULE = (
    "stratified by class: of the N samples the loader reads (class c: m_c), class c gets "
    "n_c = floor(n m_c / N), plus one for the n - sum n_c classes of largest remainder "
    "(ties: the smaller label); within a class, the first n_c in the order of "
    "randperm(N, generator=manual_seed(seed + j)); sorted by index"
)
UNIFORM_RULE = "uniform: sorted(randperm(N, generator=manual_seed(seed + j))[:n])"


def dataset_labels(dataset: Any) -> Tensor | None:
    """The class labels of a map-style ``dataset`` read without a pass over it, ``[len]``
    int64, else ``None``: a ``TensorDataset``'s second tensor, a ``targets`` attribute (the
    torchvision convention), or those of a ``Subset``'s dataset at its indices; only integer
    labels of one per sample count (floating targets are no classes)."""
    if isinstance(dataset, Subset):
        inner = dataset_labels(dataset.dataset)
        if inner is None:
            return None
        return inner[torch.as_tensor(list(dataset.indices), dtype=torch.long)]
    tensors = getattr(dataset, "tensors", None)
    if isinstance(dataset, torch.utils.data.TensorDataset) and tensors is not None:
        labels: Any = tensors[1] if len(tensors) >= 2 else None
    else:
        labels = getattr(dataset, "targets", None)
    if labels is None:
        return None
    try:
        values: Tensor = torch.as_tensor(labels)
        n = len(dataset)
    except (TypeError, ValueError, RuntimeError):
        return None
    if values.shape != (n,) or values.is_floating_point() or values.is_complex():
        return None
    return values.to(torch.long)


def stratified_choice(labels: Tensor, size: int, generator: torch.Generator) -> Tensor:
    """Positions (sorted) of ``size`` of the ``N`` samples with ``labels [N]``, stratified by
    class as `STRATIFIED_RULE` states (largest-remainder quotas, each class's samples in the
    order of one ``randperm(N)``); all of them when ``size >= N``."""
    N = labels.numel()
    perm = torch.randperm(N, generator=generator)
    if size >= N:
        return torch.arange(N)
    _, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    exact = size * counts
    quota, remainder = exact // N, exact % N
    extra = size - int(quota.sum())
    # largest remainders first; a stable sort keeps the smaller label first among ties
    ranked = torch.sort(-remainder, stable=True).indices
    quota[ranked[:extra]] += 1
    by_class = torch.sort(inverse[perm], stable=True)  # each class's samples in randperm order
    start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(N) - start[by_class.values]
    chosen = perm[by_class.indices][rank < quota[by_class.values]]
    return chosen.sort().values


def stage_subset_dataloader(loader: Any, size: int, seed: int) -> tuple[Any, Tensor, str]:
    """A loader over a fixed, seeded subset of ``size`` of ``loader``'s samples, stratified by
    class when `dataset_labels` reads the labels (`STRATIFIED_RULE`), else uniform
    (`UNIFORM_RULE`, the draw of `subset_dataloader`); ``(loader, dataset indices, rule)``.
    The draw uses the samples the loader reads (as `subset_dataloader`), never the rank or the
    world size: every process count gets the same subset."""
    try:
        readable = _sampled_indices(loader)
    except _UnreproducibleError as err:
        raise EvaluationError(f"a test subset needs a fixed set of samples: {err}") from None
    labels = None if readable is None else dataset_labels(loader.dataset)
    if readable is None or labels is None:
        subset, indices = subset_dataloader(loader, size, seed)
        return subset, indices, "uniform"
    pool = torch.as_tensor(list(readable), dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    indices = pool[stratified_choice(labels[pool], size, generator)].sort().values
    subset = Subset(loader.dataset, indices.tolist())
    return _rebuild_loader(loader, subset, shuffle=False), indices, "stratified"

"""Evaluation engine: score a module on several task test loaders, exactly, on every rank.

Kept apart from :class:`~continual_eval.callback.ContinualEvalCallback`'s hook plumbing so that
other callers (evaluation every k steps inside a stage, cached device batches) can reuse it.

:func:`evaluate_tasks` runs the module in eval mode under a no-grad/inference context, restores
every submodule's own ``training`` flag and the RNG states afterwards, moves batches with a plain
device move (no user transfer hooks), and reduces per-task counts across ranks with one collective
per call. Under data parallelism each map-style test set is sharded *without padding*
(:func:`shard_dataloader`), so the reduced counts equal the single-process counts exactly.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from lightning.pytorch.utilities import move_data_to_device
from torch import Tensor, nn
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
)
from torch.utils.data._utils.collate import default_collate

__all__ = [
    "DETERMINISTIC_ATTR",
    "AccuracyScorer",
    "BatchCache",
    "EvaluationError",
    "MetricScorer",
    "Scorer",
    "TaskEvaluation",
    "cache_safety",
    "default_batch_step",
    "evaluate_tasks",
    "preserve_rng_state",
    "preserve_training_flags",
    "shard_dataloader",
    "subset_dataloader",
]

#: ``step(module, batch, task_id) -> (preds, target)``
BatchStep = Callable[[nn.Module, Any, int], tuple[Tensor, Tensor]]


class EvaluationError(ValueError):
    """A test loader or the model's output cannot be scored; the message names the task."""


@dataclass(frozen=True)
class TaskEvaluation:
    """Per-task result of :func:`evaluate_tasks`, identical on every rank.

    ``scores[k]`` is the score on ``task_ids[k]``; ``correct``/``total`` are the reduced counts
    (``correct`` is NaN-free only for count-based scorers; ``total`` is the number of samples
    scored).
    """

    task_ids: tuple[int, ...]
    scores: Tensor
    correct: Tensor
    total: Tensor


class Scorer(Protocol):
    """Accumulates one task's predictions; ``result`` may run collectives (call it on all ranks)."""

    name: str
    count_based: bool

    def start(self, device: torch.device) -> None: ...

    def update(self, preds: Tensor, target: Tensor) -> None: ...

    def local_counts(self) -> Tensor:
        """``[correct, total, bad]`` on this rank (int64); ``bad`` > 0 flags invalid targets."""
        ...

    def result(self, reduced_counts: Tensor) -> Tensor: ...


def _class_dim_problem(preds: Tensor, target: Tensor) -> str | None:
    if preds.shape[0] != target.shape[0]:
        return f"the model returned {preds.shape[0]} predictions for {target.shape[0]} targets"
    if preds.ndim == target.ndim + 1:
        if preds.shape[2:] != target.shape[1:]:
            return (
                f"prediction shape {tuple(preds.shape)} does not fit target shape "
                f"{tuple(target.shape)}"
            )
    elif preds.shape != target.shape:
        return (
            f"prediction shape {tuple(preds.shape)} does not fit target shape {tuple(target.shape)}"
        )
    return None


class AccuracyScorer:
    """Accuracy by argmax over dim 1 of ``preds`` (or ``preds`` as labels when shaped like
    ``target``).

    Counts stay on the device (no host sync per batch); targets outside ``[0, num_classes)`` are
    flagged and reported after the task.
    """

    name = "accuracy"
    count_based = True

    def start(self, device: torch.device) -> None:
        self._correct = torch.zeros((), dtype=torch.int64, device=device)
        self._total = 0  # host int: batch sizes are known without a device sync
        self._lowest = torch.zeros((), dtype=torch.int64, device=device)
        self._highest = torch.zeros((), dtype=torch.int64, device=device)
        self._num_classes: int | None = None

    def update(self, preds: Tensor, target: Tensor) -> None:
        problem = _class_dim_problem(preds, target)
        if problem is not None:
            raise EvaluationError(problem)
        if preds.ndim == target.ndim + 1:
            if self._num_classes is None:
                self._num_classes = preds.shape[1]
            elif preds.shape[1] != self._num_classes:
                raise EvaluationError(
                    f"the model returned {preds.shape[1]} classes after {self._num_classes}"
                )
            if target.numel():
                lowest, highest = torch.aminmax(target)
                self._lowest = torch.minimum(self._lowest, lowest)
                self._highest = torch.maximum(self._highest, highest)
            preds = preds.argmax(dim=1)
        elif preds.is_floating_point() and not target.is_floating_point():
            raise EvaluationError(
                f"the model returned floating scores of shape {tuple(preds.shape)}, the targets' "
                "shape, so there is no class dimension to take the argmax of; return class logits "
                "[N, C] (for one binary logit z: torch.stack([-z, z], 1) / 2), integer labels, "
                "or define `continual_eval_step` returning them"
            )
        self._correct += (preds == target).sum()
        self._total += target.numel()

    def local_counts(self) -> Tensor:
        bad = torch.zeros((), dtype=torch.int64, device=self._correct.device)
        if self._num_classes is not None:
            bad = ((self._lowest < 0) | (self._highest >= self._num_classes)).long()
        total = torch.tensor(self._total, dtype=torch.int64, device=self._correct.device)
        return torch.stack([self._correct, total, bad])

    def result(self, reduced_counts: Tensor) -> Tensor:
        correct, total = reduced_counts[..., 0], reduced_counts[..., 1]
        return correct.double() / total.double()


class MetricScorer:
    """Any torchmetrics metric (its state reduced by torchmetrics' sync: exact on unpadded
    shards)."""

    count_based = False

    def __init__(self, metric: Any) -> None:
        from torchmetrics import Metric

        if isinstance(metric, Metric):
            self._metric = metric.clone()
        elif callable(metric):
            self._metric = metric()
            if not isinstance(self._metric, Metric):
                raise TypeError(
                    f"`metric` factory returned {self._metric!r}, not a torchmetrics Metric"
                )
        else:
            raise TypeError(f"`metric` must be a torchmetrics Metric or a factory, got {metric!r}")
        self.name = type(self._metric).__name__

    def start(self, device: torch.device) -> None:
        self._metric.reset()
        self._metric.to(device)
        self._counts = torch.zeros(3, dtype=torch.int64, device=device)

    def update(self, preds: Tensor, target: Tensor) -> None:
        problem = _class_dim_problem(preds, target)
        if problem is not None:
            raise EvaluationError(problem)
        if (
            preds.ndim == target.ndim + 1
            and target.dtype != torch.bool
            and not target.is_floating_point()
        ):
            num_classes = preds.shape[1]
            self._counts[2] += ((target < 0) | (target >= num_classes)).sum()
        self._counts[1] += target.shape[0]
        self._metric.update(preds, target)

    def local_counts(self) -> Tensor:
        return self._counts

    def result(self, reduced_counts: Tensor) -> Tensor:
        return self._metric.compute().detach().double().reshape(())


def default_batch_step(module: nn.Module, batch: Any, task_id: int) -> tuple[Tensor, Tensor]:
    """``(x, y)`` -> ``(module(x), y)``; ``(x, y, t)`` -> ``(module(x, t), y)``.

    A LightningModule may instead define ``continual_eval_step(batch, task_id) -> (preds, target)``.
    """
    hook = getattr(module, "continual_eval_step", None)
    if callable(hook):
        return hook(batch, task_id)
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        return module(x), y
    if isinstance(batch, (tuple, list)) and len(batch) == 3:
        x, y, t = batch
        return module(x, t), y
    raise EvaluationError(
        f"cannot score a batch of type {type(batch).__name__}"
        + (f" with {len(batch)} elements" if isinstance(batch, (tuple, list)) else "")
        + "; expected (x, y) or (x, y, task_id), or define `continual_eval_step(batch, task_id)` "
        "on the LightningModule returning (preds, target)"
    )


class _ShardSampler(Sampler[int]):
    """Strided shard ``rank, rank + world, ...`` of ``range(n)``: no padding, no duplicates."""

    def __init__(self, base: Sequence[int] | range, rank: int, world_size: int) -> None:
        self.indices = list(base)[rank::world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def _sampled_indices(loader: Any) -> Sequence[int] | None:
    """The fixed set of dataset indices ``loader`` reads, in index order, or ``None`` when it is not
    a DataLoader over a map-style dataset with a batch size whose sampler reads a fixed set
    (sequential, random without replacement, a subset, or one of our shards)."""
    if (
        not isinstance(loader, DataLoader)
        or isinstance(loader.dataset, IterableDataset)
        or loader.batch_size is None
    ):
        return None
    sampler, n = loader.sampler, len(loader.dataset)  # type: ignore[arg-type]
    if type(sampler) is SequentialSampler:
        return range(n)
    if type(sampler) is RandomSampler and not sampler.replacement and sampler.num_samples == n:
        return range(n)
    if type(sampler) is SubsetRandomSampler:
        return sorted(int(i) for i in sampler.indices)
    if type(sampler) is _ShardSampler:
        return sampler.indices
    return None


def _rebuildable(loader: Any) -> bool:
    """Whether :func:`_rebuild_loader` can re-create ``loader`` over the same samples."""
    return _sampled_indices(loader) is not None


def _rebuild_loader(loader: DataLoader, dataset: Any, **options: Any) -> DataLoader:
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
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    return DataLoader(dataset, **kwargs)


def shard_dataloader(loader: Any, rank: int, world_size: int) -> tuple[Any, bool]:
    """Return ``(loader for this rank, sharded)``.

    The indices the loader reads (the whole map-style dataset, or a ``SubsetRandomSampler``'s
    subset) are split into strided, unpadded shards (any shuffling is dropped: a score does not
    depend on the order). Loaders that cannot be re-built over the same samples (iterable datasets,
    custom samplers or batch samplers, non-DataLoader iterables) come back unchanged with
    ``sharded=False``: the caller then counts them on rank 0 only.
    """
    if world_size <= 1:
        return loader, True
    indices = _sampled_indices(loader)
    if indices is None:
        return loader, False
    shard = _ShardSampler(indices, rank, world_size)
    rebuilt = _rebuild_loader(loader, loader.dataset, sampler=shard, generator=loader.generator)
    return rebuilt, True


def subset_dataloader(loader: Any, size: int, seed: int) -> tuple[Any, Tensor]:
    """A loader over a fixed, seeded subset of ``loader``'s map-style dataset, in index order.

    With ``I`` the indices the loader reads (``range(len(dataset))``, or a
    ``SubsetRandomSampler``'s subset), the subset is
    ``sorted(I[randperm(len(I), generator=Generator().manual_seed(seed))[:size]])`` (all of ``I``
    when ``size >= len(I)``). Returns ``(loader, dataset indices)``.

    Raises:
        ValueError: ``loader`` is not a DataLoader with a batch size over a map-style dataset whose
            sampler reads a fixed set of samples.
    """
    readable = _sampled_indices(loader)
    if readable is None:
        raise ValueError(
            "a test subset needs a torch DataLoader with batch_size set over a map-style dataset, "
            "read by a sequential, random (without replacement) or SubsetRandomSampler sampler; "
            f"got {type(loader).__name__}"
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

    def wrap(self, slot: Hashable, loader: Iterable[Any], device: torch.device) -> Iterable[Any]:
        """An iterable over ``loader``'s batches on ``device``, from the cache once filled."""
        return _CachedLoader(self, slot, loader, device)


class _CachedLoader:
    def __init__(
        self, cache: BatchCache, slot: Hashable, loader: Iterable[Any], device: torch.device
    ) -> None:
        self.cache, self.slot, self.loader, self.device = cache, slot, loader, device

    def __iter__(self) -> Iterator[Any]:
        cache, slot = self.cache, self.slot
        if slot in cache._entries:
            yield from cache._entries[slot]
            return
        if slot in cache._refused:
            yield from self.loader
            return
        kept: list[Any] | None = []
        size = 0
        for batch in self.loader:
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


@contextmanager
def preserve_training_flags(module: nn.Module) -> Iterator[None]:
    """Put ``module`` in eval mode; restore every submodule's own ``training`` flag afterwards."""
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


@contextmanager
def preserve_rng_state(device: torch.device | None = None) -> Iterator[None]:
    """Restore Python, NumPy, torch CPU and (if used) CUDA RNG states on exit.

    Iterating a DataLoader draws a seed from the global torch generator; without this, attaching an
    evaluator would change the training that follows it.
    """
    py_state = random.getstate()
    np_state = None
    try:
        import numpy as np

        np_state = np.random.get_state()
    except ImportError:  # pragma: no cover
        np = None  # type: ignore[assignment]
    cuda = device is not None and device.type == "cuda" and torch.cuda.is_available()
    with torch.random.fork_rng(devices=[device] if cuda else [], enabled=True):
        try:
            yield
        finally:
            random.setstate(py_state)
            if np_state is not None:
                np.random.set_state(np_state)


def grad_free_context(inference_mode: bool = True) -> AbstractContextManager:
    """``torch.inference_mode`` unless a gloo process group is up (as Lightning's loops decide)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        return torch.no_grad()
    return torch.inference_mode() if inference_mode else torch.no_grad()


def evaluate_tasks(
    module: nn.Module,
    dataloaders: Sequence[Any],
    task_ids: Sequence[int],
    *,
    scorer: Scorer | None = None,
    device: torch.device | str | None = None,
    step: BatchStep = default_batch_step,
    forward_context: Callable[[], AbstractContextManager] = nullcontext,
    convert_input: Callable[[Any], Any] | None = None,
    grad_context: Callable[[], AbstractContextManager] = grad_free_context,
    all_reduce: Callable[[Tensor], Tensor] | None = None,
    rank: int = 0,
    world_size: int = 1,
    task_names: Sequence[str] | None = None,
    unsharded: Collection[int] = (),
) -> TaskEvaluation:
    """Score ``module`` on ``dataloaders[j]`` for each ``j`` in ``task_ids``.

    Args:
        module: the model; called through ``step`` (default: ``module(x)`` / ``module(x, t)``).
        dataloaders: one test loader per task, already sharded for this rank
        (:func:`shard_dataloader`)
            or, for loaders that could not be sharded, full loaders that only rank 0 counts.
        task_ids: which tasks to score.
        scorer: :class:`AccuracyScorer` (default) or :class:`MetricScorer`.
        device: where batches go (plain move, no user transfer hooks).
        forward_context: e.g. the Trainer's ``precision_plugin.forward_context``.
        convert_input: applied to each batch after the device move, e.g. the Trainer's
            ``precision_plugin.convert_input`` (``*-true`` precisions cast float inputs).
        grad_context: no-grad / inference-mode factory.
        all_reduce: sum-reduction across ranks (e.g. ``strategy.reduce(t, reduce_op="sum")``).
        rank, world_size: this process and the group size; used for unsharded loaders.
        task_names: names for error messages.
        unsharded: tasks whose loader holds the full test set on every rank; only rank 0 counts
        them.

    Returns:
        :class:`TaskEvaluation` with scores and counts, the same on every rank.

    Raises:
        EvaluationError: a task's loader yielded no sample (on any rank), or the output does not fit
            the targets; raised on every rank together.
    """
    scorer = scorer if scorer is not None else AccuracyScorer()
    device = torch.device(device) if device is not None else _module_device(module)
    names = (
        list(task_names)
        if task_names is not None
        else [f"task_{j}" for j in range(len(dataloaders))]
    )
    local = torch.zeros(len(task_ids), 3, dtype=torch.int64, device=device)
    results: list[Tensor] = []
    with preserve_rng_state(device), preserve_training_flags(module), grad_context():
        for k, j in enumerate(task_ids):
            scorer.start(device)
            counts_here = world_size <= 1 or j not in unsharded or rank == 0
            if counts_here:
                try:
                    for batch in dataloaders[j]:
                        batch = move_data_to_device(batch, device)
                        if convert_input is not None:
                            batch = convert_input(batch)
                        with forward_context():
                            preds, target = step(module, batch, j)
                        scorer.update(preds, target)
                except EvaluationError as err:
                    raise EvaluationError(
                        f"task {j} ({names[j]!r}), test dataloader {j}: {err}"
                    ) from err
            local[k] = scorer.local_counts()
            if not scorer.count_based:
                # metric state sync is a collective: every rank computes every task, in order
                total = _reduce(local[k], all_reduce)[1]
                if int(total) == 0:
                    raise _empty_error(j, names[j])
                results.append(scorer.result(total))
    reduced = _reduce(local, all_reduce) if local.numel() else local
    for k, j in enumerate(task_ids):
        if int(reduced[k, 1]) == 0:
            raise _empty_error(j, names[j])
        if int(reduced[k, 2]) > 0:
            raise EvaluationError(
                f"task {j} ({names[j]!r}), test dataloader {j}: targets lie outside the class "
                "dimension of the model output (dim 1); does the model's number of classes fit "
                "this task's labels?"
            )
    if scorer.count_based:
        scores = scorer.result(reduced) if len(task_ids) else torch.zeros(0, dtype=torch.float64)
    else:
        scores = torch.stack(results) if results else torch.zeros(0, dtype=torch.float64)
    return TaskEvaluation(
        task_ids=tuple(task_ids),
        scores=scores.detach().to("cpu", torch.float64),
        correct=reduced[:, 0].cpu() if scorer.count_based else torch.full((len(task_ids),), -1),
        total=reduced[:, 1].cpu(),
    )


def _empty_error(task: int, name: str) -> EvaluationError:
    return EvaluationError(
        f"task {task} ({name!r}), test dataloader {task}: the loader yielded no sample; is its "
        "dataset empty or is drop_last=True with fewer samples than batch_size?"
    )


def _reduce(t: Tensor, all_reduce: Callable[[Tensor], Tensor] | None) -> Tensor:
    return all_reduce(t.clone()) if all_reduce is not None else t


def _module_device(module: nn.Module) -> torch.device:
    for p in module.parameters():
        return p.device
    for b in module.buffers():
        return b.device
    return torch.device("cpu")

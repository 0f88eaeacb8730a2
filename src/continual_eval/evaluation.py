"""Evaluation engine: score a module on several task test loaders, exactly, on every rank.

Kept apart from :class:`~continual_eval.callback.ContinualEvalCallback`'s hook plumbing so that
other callers (evaluation every k steps inside a stage, cached device batches) can reuse it.

:func:`evaluate_tasks` runs the module in eval mode under a no-grad/inference context, restores
every submodule's own ``training`` flag and the RNG states afterwards, moves batches with a plain
device move (no user transfer hooks), and reduces per-task counts across ranks with one collective
per call. Under data parallelism each map-style test set is sharded *without padding*
(:func:`shard_dataloader`), so the reduced counts equal the single-process counts exactly; a test
loader over a ``DistributedSampler`` means its whole dataset, and a loader whose samples cannot be
split exactly (a random ``drop_last`` tail) is refused. Non-finite predictions and targets that are
not labels are counted on the device and reported after each task, naming it.

Reading the batches (exact: the scores are identical with either switch off): tensor-backed test
sets are sliced a batch at a time instead of fetched and collated sample by sample
(:func:`fast_loader`; ``FAST_PATH = False`` turns it off). Test loaders with worker processes
that :func:`fast_loader` cannot read share one persistent worker pool per group of equal settings
(``num_workers``, ``collate_fn``, ``pin_memory``, ``timeout``, ``multiprocessing_context``,
``prefetch_factor``; batch sizes may differ; no ``worker_init_fn``, which may read
``get_worker_info().dataset``): one DataLoader over the concatenated test sets whose batch sampler
yields each task's batches as its own loader makes them, never mixing two tasks. The pool is kept
for the next evaluation while its loaders and datasets are the same objects (a dataset edited in
place after the workers started is not seen: replace the loader), and shut down when they are gone
or more than two pools are kept. ``POOLED_LOADERS = False`` gives each loader its own workers.
"""

from __future__ import annotations

import inspect
import random
import weakref
from collections.abc import (
    Callable,
    Collection,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
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
    DistributedSampler,
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
    "FAST_PATH",
    "POOLED_LOADERS",
    "AccuracyScorer",
    "BatchCache",
    "EvaluationError",
    "MetricScorer",
    "Scorer",
    "TaskEvaluation",
    "cache_safety",
    "default_batch_step",
    "evaluate_tasks",
    "fast_loader",
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
        """``[correct, total, bad, ...]`` on this rank (int64, summed across ranks); an entry from
        index 2 on that is > 0 flags invalid targets, described by ``target_problems[k - 2]`` when
        the scorer defines that tuple (else: targets outside the class dimension)."""
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


_OUT_OF_RANGE = (
    "targets lie outside the class dimension of the model output (dim 1); does the model's "
    "number of classes fit this task's labels?"
)


class AccuracyScorer:
    r"""Accuracy :math:`\frac{1}{N}\sum_n [\hat y_n = y_n]` with :math:`\hat y` the argmax over
    dim 1 of ``preds`` (or ``preds`` itself when it holds integer labels shaped like ``target``).

    Targets are class indices (integers, or floats holding whole numbers), or one-hot (float or
    integer) / probability vectors shaped like float ``preds`` (``[N, C, ...]``, every vector over
    dim 1 non-negative and summing to 1), read as their argmax. Counts and target checks stay on
    the device (no host sync per batch); invalid targets are counted and reported after the task
    (``target_problems``).
    """

    name = "accuracy"
    count_based = True
    #: what a positive entry ``2, 3, 4`` of :meth:`local_counts` means; ``{n}``: that entry
    target_problems = (
        _OUT_OF_RANGE,
        "{n} floating-point targets are not whole numbers, so they are not class indices; pass "
        "integer class labels, or one-hot/probability targets shaped like the predictions [N, C]",
        "{n} target rows shaped like the predictions are not one-hot or probability "
        "vectors (each >= 0 and summing to 1 over dim 1), so their argmax is not a label; for "
        "multi-label targets pass a metric, e.g. metric=torchmetrics.classification."
        "MultilabelAccuracy(num_labels=C)",
    )

    def start(self, device: torch.device) -> None:
        self._device = device
        self._total = 0  # host int: batch sizes are known without a device sync
        # per batch, device scalars reduced once in local_counts (no accumulation op per batch)
        self._hits: list[Tensor] = []
        self._ranges: list[tuple[Tensor, Tensor]] = []  # aminmax of the integer labels
        self._not_whole: list[Tensor] = []
        self._not_distribution: list[Tensor] = []
        self._num_classes: int | None = None
        self._checked: tuple[Any, ...] | None = None  # (shapes[1:], dtypes) last checked
        self._mode = ""

    def _check_num_classes(self, num_classes: int) -> None:
        if self._num_classes is None:
            self._num_classes = num_classes
        elif num_classes != self._num_classes:
            raise EvaluationError(
                f"the model returned {num_classes} classes after {self._num_classes}"
            )

    def _check(self, preds: Tensor, target: Tensor) -> str:
        """The checks that depend only on shapes and dtypes; returns how to score the batch."""
        problem = _class_dim_problem(preds, target)
        if problem is not None:
            raise EvaluationError(problem)
        if (
            (target.is_floating_point() or preds.is_floating_point())
            and preds.ndim >= 2
            and preds.shape == target.shape
        ):
            self._check_num_classes(preds.shape[1])
            return "distribution"  # one-hot (float or integer) / probability targets
        if preds.ndim == target.ndim + 1:
            self._check_num_classes(preds.shape[1])
            return "float_labels" if target.is_floating_point() else "labels"
        if preds.is_floating_point():
            raise EvaluationError(
                f"the model returned floating scores of shape {tuple(preds.shape)}, the targets' "
                "shape, so there is no class dimension to take the argmax of; return class logits "
                "[N, C] (for one binary logit z: torch.stack([-z, z], 1) / 2), integer labels, "
                "or define `continual_eval_step` returning them"
            )
        return "float_same" if target.is_floating_point() else "same"

    def update(self, preds: Tensor, target: Tensor) -> None:
        # shape/dtype checks once per task (and again whenever the batch's layout changes)
        signature = (preds.shape[1:], preds.dtype, target.shape[1:], target.dtype)
        if signature != self._checked or preds.shape[0] != target.shape[0]:
            self._mode = self._check(preds, target)
            self._checked = signature
        mode = self._mode
        if mode == "distribution":
            sums = target.sum(dim=1, dtype=torch.float64)
            eps = torch.finfo(target.dtype).eps if target.is_floating_point() else 0.0
            tolerance = max(1e-4, 2 * target.shape[1] * eps)
            valid = (target >= 0).all(dim=1) & ((sums - 1).abs() <= tolerance)
            self._not_distribution.append((~valid).sum())
            preds, target = preds.argmax(dim=1), target.argmax(dim=1)
        elif mode in ("labels", "float_labels"):
            if mode == "float_labels":
                self._not_whole.append((target.frac() != 0).sum())  # NaN and inf included
                target = target.nan_to_num(nan=-1.0, posinf=-1.0, neginf=-1.0).long()
            if target.numel():
                self._ranges.append(torch.aminmax(target))
            preds = preds.argmax(dim=1)
        elif mode == "float_same":
            self._not_whole.append((target.frac() != 0).sum())
        self._hits.append((preds == target).sum())
        self._total += target.numel()

    def _sum(self, values: list[Tensor]) -> Tensor:
        if not values:
            return torch.zeros((), dtype=torch.int64, device=self._device)
        return torch.stack(values).sum().to(torch.int64)

    def local_counts(self) -> Tensor:
        """``[correct, total, out_of_range, not_whole, not_distribution]`` (int64)."""
        out_of_range = torch.zeros((), dtype=torch.int64, device=self._device)
        if self._num_classes is not None and self._ranges:
            lowest = torch.stack([low for low, _ in self._ranges]).min()
            highest = torch.stack([high for _, high in self._ranges]).max()
            out_of_range = ((lowest < 0) | (highest >= self._num_classes)).long()
        total = torch.tensor(self._total, dtype=torch.int64, device=self._device)
        return torch.stack(
            [
                self._sum(self._hits),
                total,
                out_of_range,
                self._sum(self._not_whole),
                self._sum(self._not_distribution),
            ]
        )

    def result(self, reduced_counts: Tensor) -> Tensor:
        correct, total = reduced_counts[..., 0], reduced_counts[..., 1]
        return correct.double() / total.double()


class MetricScorer:
    """Any torchmetrics metric (its state reduced by torchmetrics' sync: exact on unpadded
    shards); its ``compute()`` must return one finite number per task."""

    count_based = False
    target_problems = (_OUT_OF_RANGE,)

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
        """``[0, samples, out_of_range_targets]`` (int64)."""
        return self._counts

    def result(self, reduced_counts: Tensor) -> Tensor:
        """The metric's ``compute()``: one finite number, else :class:`EvaluationError`."""
        value = self._metric.compute()
        if isinstance(value, (int, float)):
            value = torch.tensor(float(value))
        if not isinstance(value, Tensor):
            shown = (
                f"a dict with keys {sorted(value)}" if isinstance(value, Mapping) else _what(value)
            )
            raise EvaluationError(
                f"metric {self.name} returned {shown}, not one number; continual-eval records one "
                "score per task: pass a metric whose compute() returns a scalar tensor"
            )
        value = value.detach()
        if value.numel() != 1:
            raise EvaluationError(
                f"metric {self.name} returned a tensor of shape {list(value.shape)}, not one "
                "number; continual-eval records one score per task: reduce it in the metric "
                "(e.g. average='macro' or 'micro' instead of average='none')"
            )
        value = value.double().reshape(())
        if not bool(torch.isfinite(value)):
            raise EvaluationError(
                f"metric {self.name} returned {value.item()}, not a finite score; a score must be "
                "defined on every task (e.g. a ratio whose denominator is 0 on this task's "
                "samples, such as the recall of a class absent from its test set)"
            )
        return value


def _describe(value: Any, depth: int = 0) -> str:
    """A short description of a model output: tensors as ``Tensor[8, 3] float32``, containers with
    their elements (one level deep)."""
    if isinstance(value, Tensor):
        return f"Tensor{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if depth < 1 and isinstance(value, (tuple, list)):
        inner = ", ".join(_describe(v, depth + 1) for v in value[:6])
        more = ", ..." if len(value) > 6 else ""
        brackets = "()" if isinstance(value, tuple) else "[]"
        return f"{brackets[0]}{inner}{more}{brackets[1]}"
    if depth < 1 and isinstance(value, Mapping):
        items = list(value.items())
        inner = ", ".join(f"{k!r}: {_describe(v, depth + 1)}" for k, v in items[:6])
        return "{" + inner + (", ..." if len(items) > 6 else "") + "}"
    return type(value).__name__


def _what(value: Any) -> str:
    """``_describe`` with an article: ``a Tensor[8] int64``, ``a tuple (...)``, ``an int``."""
    name = type(value).__name__
    shown = _describe(value)
    if shown.startswith("Tensor"):
        name, shown = shown, ""
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name}" + (f" {shown}" if shown and shown != name else "")


def _model_scores(output: Any) -> Tensor:
    """``output`` if it is one tensor, else an :class:`EvaluationError` saying what it was."""
    if isinstance(output, Tensor):
        return output
    pick = "[0]"
    if isinstance(output, Mapping) and output:
        pick = f"[{next(iter(output))!r}]"
    raise EvaluationError(
        f"the model returned {_what(output)}, not one tensor of class scores; make forward return "
        "the class logits [N, C] (or integer labels [N]), or define "
        "`continual_eval_step(self, batch, task_id)` on the LightningModule returning "
        f"(preds, target), e.g. `x, y = batch; return self(x){pick}, y`"
    )


def _accepts(module: nn.Module, *args: Any) -> bool:
    """Whether ``module.forward`` can be called with ``args`` (its signature binds them)."""
    try:
        inspect.signature(module.forward).bind(*args)
    except TypeError:
        return False
    except ValueError:  # no signature to inspect
        return True
    return True


def default_batch_step(module: nn.Module, batch: Any, task_id: int) -> tuple[Tensor, Tensor]:
    """``(x, y)`` -> ``(module(x), y)``; ``(x, y, t)`` -> ``(module(x, t), y)``.

    A LightningModule may instead define ``continual_eval_step(batch, task_id) -> (preds, target)``.

    Raises:
        EvaluationError: the model returned something other than one tensor, ``continual_eval_step``
            returned something other than a ``(preds, target)`` pair of tensors, a 3-element batch
            met a ``forward`` that takes no task id, or the batch has another structure.
    """
    hook = getattr(module, "continual_eval_step", None)
    if callable(hook):
        output = hook(batch, task_id)
        if (
            not isinstance(output, (tuple, list))
            or len(output) != 2
            or not all(isinstance(v, Tensor) for v in output)
        ):
            raise EvaluationError(
                f"continual_eval_step returned {_what(output)}; it must "
                "return a pair (preds, target) of tensors, e.g. `x, y = batch; return self(x), y`"
            )
        return output[0], output[1]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        return _model_scores(module(x)), y
    if isinstance(batch, (tuple, list)) and len(batch) == 3:
        x, y, t = batch
        try:
            output = module(x, t)
        except TypeError as err:
            if _accepts(module, x, t):
                raise  # raised inside forward: not a signature mismatch
            raise EvaluationError(
                "the batch had 3 elements, so it was scored as module(x, t) (x, y, task_id), but "
                f"{type(module).__name__}.forward does not take a task id ({err}); yield (x, y) "
                "batches, let forward take (x, task_id), or define `continual_eval_step(self, "
                "batch, task_id)` on the LightningModule, e.g. `x, y, _ = batch; return self(x), y`"
            ) from err
        return _model_scores(output), y
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


class _UnreproducibleError(Exception):
    """The loader reads a sample set that no re-built loader can read (a random one)."""


def _distributed_sampler_types() -> tuple[type, ...]:
    """Distributed samplers whose samples are known: torch's and Lightning's unpadded fork."""
    try:
        from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
    except ImportError:  # pragma: no cover - an internal module of Lightning
        return (DistributedSampler,)
    return (DistributedSampler, UnrepeatedDistributedSampler)


def _distributed_indices(loader: DataLoader, sampler: DistributedSampler, n: int) -> Sequence[int]:
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
    :class:`_UnreproducibleError`, as does a distributed sampler whose samples cannot be known.
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
        f"its samples cannot be split exactly across processes; pass drop_last=False (score all "
        f"{len(indices)}) or shuffle=False (one process then drops the last {tail})"
    )


def _loader_label(loader: Any, task: int | None, task_name: str | None) -> str:
    """``task 3 ('cars'), test dataloader 3``, or a description of ``loader`` without a task."""
    if task is not None:
        return f"task {task} ({task_name or f'task_{task}'!r}), test dataloader {task}"
    if not isinstance(loader, DataLoader):
        return f"test dataloader ({type(loader).__name__})"
    dataset = loader.dataset
    size = f" of {len(dataset)} samples" if hasattr(dataset, "__len__") else ""  # type: ignore[arg-type]
    return (
        f"test dataloader (DataLoader over {type(dataset).__name__}{size}, "
        f"batch_size={loader.batch_size}, {type(loader.sampler).__name__}, "
        f"drop_last={loader.drop_last})"
    )


def _rebuildable(loader: Any) -> bool:
    """Whether :func:`_rebuild_loader` can re-create ``loader`` over the same samples."""
    try:
        return _sampled_indices(loader) is not None
    except _UnreproducibleError:
        return False


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


def shard_dataloader(
    loader: Any,
    rank: int,
    world_size: int,
    *,
    task: int | None = None,
    task_name: str | None = None,
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
    ``DistributedSampler`` comes back unchanged.

    Raises:
        EvaluationError: the samples cannot be reproduced on several ranks (``drop_last=True``
            with a shuffling sampler and a partial last batch; a ``DistributedSampler`` dropping a
            random tail, or a subclass of unknown behaviour). The message names ``task`` and
            ``task_name`` when given, else describes the loader, and says how to fix it.
    """
    distributed = isinstance(getattr(loader, "sampler", None), DistributedSampler)
    if world_size <= 1 and not distributed:
        return loader, True
    try:
        indices = _sampled_indices(loader)
    except _UnreproducibleError as err:
        raise EvaluationError(f"{_loader_label(loader, task, task_name)}: {err}") from None
    if indices is None:
        return loader, False
    shard = _ShardSampler(indices, rank, max(world_size, 1))
    rebuilt = _rebuild_loader(loader, loader.dataset, sampler=shard, generator=loader.generator)
    return rebuilt, True


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


# ---------------------------------------------------------------------------------- fast loading
#: Read tensor-backed test sets without the DataLoader (see :func:`fast_loader`). Set to ``False``
#: (``continual_eval.evaluation.FAST_PATH = False``) to read every test set through its DataLoader;
#: the batches, and so the scores, are identical either way.
FAST_PATH = True

#: Evaluate test loaders with worker processes through one persistent worker pool per group of
#: equal DataLoader settings (see :func:`evaluate_tasks`). ``False``: each loader starts its own
#: workers, as a plain ``for batch in loader`` does; the scores are identical either way.
POOLED_LOADERS = True

#: Pools kept alive between evaluations (most recently used last); older ones are shut down.
_MAX_POOLS = 2
_POOLS: list[_WorkerPool] = []
#: Persistent-worker loaders whose first ``iter()`` (the only one that draws a seed) was mimicked.
_SEEDED_PERSISTENT: weakref.WeakSet[DataLoader] = weakref.WeakSet()


def _draw_base_seed(loader: DataLoader) -> None:
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
    try:
        t = torch.as_tensor(list(indices) if isinstance(indices, range) else indices)
    except (TypeError, ValueError, RuntimeError):
        return None
    if t.ndim != 1 or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        return None
    return t.to(device="cpu", dtype=torch.int64)


def _tensor_rows(dataset: Any, order: Sequence[int]) -> tuple[tuple[Tensor, ...], Any] | None:
    """``(tensors, rows)``: the ``TensorDataset`` under ``dataset`` (itself or a chain of
    ``Subset``) and the rows of its tensors that ``dataset[i]`` for ``i`` in ``order`` reads (a
    ``range`` when they are consecutive), or ``None``.

    Exact types only: a subclass may override ``__getitem__`` (a transform, a side effect).
    """
    rows: Any = order
    while type(dataset) is Subset:
        mapping = _index_tensor(dataset.indices)
        if mapping is None:
            return None
        rows = mapping[_index_tensor(rows)]  # type: ignore[index]
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
    if isinstance(rows, range):
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


class _FastBatches:
    """The batches of a DataLoader over tensors read by slicing/indexing them a batch at a time
    (or by the dataset's own ``__getitems__``), equal to the DataLoader's: same order, sizes, last
    batch, dtype, a fresh contiguous tensor per element, in a list as ``default_collate`` returns
    for a ``TensorDataset``'s tuples."""

    def __init__(
        self,
        loader: DataLoader,
        order: Sequence[int],
        batch_size: int,
        drop_last: bool,
        tensor_rows: tuple[tuple[Tensor, ...], Any] | None,
        pin_memory: bool,
    ) -> None:
        self.loader, self.order, self.batch_size = loader, order, batch_size
        self.starts = _batch_slices(len(order), batch_size, drop_last)
        self.tensor_rows, self.pin_memory = tensor_rows, pin_memory

    def __len__(self) -> int:
        return len(self.starts)

    def _take(self, t: Tensor, rows: Any, start: int, stop: int) -> Tensor:
        if isinstance(rows, range):
            part = t[rows.start + start : rows.start + stop]
        else:
            part = t.index_select(0, rows[start:stop].to(t.device))
        if self.pin_memory and t.device.type == "cpu":
            out = torch.empty(part.shape, dtype=part.dtype, pin_memory=True)
            return out.copy_(part)
        if isinstance(rows, range):
            return part.clone(memory_format=torch.contiguous_format)
        return part

    def __iter__(self) -> Iterator[Any]:
        _draw_base_seed(self.loader)
        size, n = self.batch_size, len(self.order)
        if self.tensor_rows is not None:
            tensors, rows = self.tensor_rows
            for start in self.starts:
                stop = min(start + size, n)
                yield [self._take(t, rows, start, stop) for t in tensors]
            return
        dataset = self.loader.dataset
        for start in self.starts:
            batch = default_collate(dataset.__getitems__(list(self.order[start : start + size])))
            yield _pin(batch) if self.pin_memory else batch


def _pin(batch: Any) -> Any:
    from lightning.fabric.utilities.apply_func import apply_to_collection

    return apply_to_collection(
        batch, Tensor, lambda t: t.pin_memory() if t.device.type == "cpu" else t
    )


def fast_loader(loader: Any, *, pin_memory: bool = False) -> Iterable[Any]:
    """``loader``'s batches without the DataLoader's per-sample fetch and collate, when that is
    exact; else ``loader`` itself.

    The fast path takes a torch ``DataLoader`` (exactly, not a subclass) read in order (a
    ``SequentialSampler``, or a shard of :func:`shard_dataloader`, in a plain ``BatchSampler``)
    with the default collate function over

    * a ``TensorDataset`` (exactly), or a ``Subset`` (chain) of one: each batch is a slice of the
      tensors, or one ``index_select`` for scattered indices, copied to a fresh contiguous tensor;
    * a dataset defining ``__getitems__`` (or a ``Subset`` of one), read with ``num_workers=0``:
      ``default_collate(dataset.__getitems__(batch_indices))``, what the DataLoader does.

    The batches equal the DataLoader's (order, batch size, last partial batch, ``drop_last``,
    dtype, the list structure of ``default_collate``), and the global RNG advances as
    ``iter(loader)`` advances it. Anything else (a custom sampler, batch sampler or collate
    function, a dataset whose ``__getitem__`` may transform samples, a DataLoader subclass) keeps
    the DataLoader. ``pin_memory``: copy each batch to page-locked memory (for a non-blocking copy
    to an accelerator). ``FAST_PATH = False`` turns it off.
    """
    if not FAST_PATH:
        return loader
    read = _read_order(loader)
    if read is None or loader.collate_fn is not default_collate:
        return loader
    order, batch_size, drop_last = read
    tensor_rows = _tensor_rows(loader.dataset, order)
    if tensor_rows is None and not (loader.num_workers == 0 and _batched_fetch(loader.dataset)):
        return loader
    return _FastBatches(loader, order, batch_size, drop_last, tensor_rows, pin_memory)


class _TaskConcat(torch.utils.data.Dataset):
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
            return getitems(local)
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
    if not POOLED_LOADERS or _read_order(loader) is None or loader.num_workers == 0:
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

    def __init__(self, loaders: Sequence[DataLoader]) -> None:
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

    def serves(self, loaders: Sequence[DataLoader]) -> bool:
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


def _worker_pool(loaders: Sequence[DataLoader]) -> _WorkerPool:
    """The kept pool reading ``loaders``, else a new one (shutting down the least recently used
    pool past :data:`_MAX_POOLS` and pools whose loaders are gone)."""
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


def _batch_sources(
    dataloaders: Sequence[Any], tasks: Sequence[int], device: torch.device
) -> dict[int, tuple[Iterable[Any], bool]]:
    """For each of ``tasks``: ``(iterable of its batches, batches already on device)``.

    A cached loader that holds its batches yields them as they are; other loaders go through
    :func:`fast_loader`, else a worker pool shared by the loaders (of all tasks, so the pool
    outlives evaluations of different task sets) with equal worker settings, else as given.
    """
    pin = device.type not in ("cpu", "mps", "meta") and torch.accelerator.is_available()
    sources: dict[int, tuple[Iterable[Any], bool]] = {}
    groups: dict[Hashable, list[int]] = {}
    for k, dl in enumerate(dataloaders):
        raw = dl.loader if isinstance(dl, _CachedLoader) else dl
        if fast_loader(raw) is raw and _pool_settings(raw) is not None:
            groups.setdefault(_pool_settings(raw), []).append(k)
    pooled: dict[int, tuple[_WorkerPool, int]] = {}
    for members in groups.values():
        raws = [
            dataloaders[k].loader if isinstance(dataloaders[k], _CachedLoader) else dataloaders[k]
            for k in members
        ]
        pool = _worker_pool(raws)
        for position, k in enumerate(members):
            pooled[k] = (pool, position)
    selections: dict[int, tuple[_WorkerPool, list[int]]] = {}
    for j in tasks:
        dl = dataloaders[j]
        cached = isinstance(dl, _CachedLoader)
        if cached and dl.cache.cached(dl.slot):
            sources[j] = (dl, True)
            continue
        raw = dl.loader if cached else dl
        source: Iterable[Any]
        if j in pooled:
            pool, position = pooled[j]
            selections.setdefault(id(pool), (pool, []))[1].append(position)
            source = pool.view(position)
        else:
            source = fast_loader(raw, pin_memory=pin)
        on_device = cached and dl.slot not in dl.cache._refused
        sources[j] = (dl.fill_from(source) if cached else source, on_device)
    for pool, selected in selections.values():
        pool.start(selected)
    return sources


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
        return self.fill_from(fast_loader(self.loader))

    def fill_from(self, source: Iterable[Any]) -> Iterator[Any]:
        """The cached batches, else ``source``'s (``self.loader``'s batches, possibly read by the
        fast path or a worker pool) moved to the device, kept when they fit."""
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


class _OutputWatch:
    """Counts one task's non-finite predictions, with no host sync per batch.

    A prediction is one score vector over the class dimension (dim 1) when ``preds`` has one more
    dimension than ``target``, else one element. It is non-finite when its top score is NaN or
    infinite: a NaN or ``+inf`` anywhere in the vector, or every score ``-inf``; ``-inf`` scores
    next to finite ones (masked classes) are fine. Per batch this costs a max, an ``isfinite`` and a
    sum on the device; the counts are read after the task.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._finite: list[Tensor] = []  # per float batch: finite predictions (device scalar)
        self._sizes: list[int] = []  # per float batch: predictions
        self._batches: list[int] = []  # per float batch: its index in the loader

    def update(self, preds: Tensor, target: Tensor, batch_index: int) -> None:
        if not preds.is_floating_point():
            return
        top = preds.amax(dim=1) if preds.ndim == target.ndim + 1 and preds.ndim >= 2 else preds
        self._finite.append(torch.isfinite(top).sum())
        self._sizes.append(top.numel())
        self._batches.append(batch_index)

    def counts(self, rank: int, world_size: int) -> Tensor:
        """``[nonfinite, predictions, first_bad_batch + 1 of rank 0, ..., of rank W-1]`` (int64):
        one column per rank (0: none), so a sum across ranks keeps every rank's first bad batch."""
        out = torch.zeros(2 + max(world_size, 1), dtype=torch.int64, device=self.device)
        if not self._finite:
            return out
        sizes = torch.tensor(self._sizes, dtype=torch.int64, device=self.device)
        bad = sizes - torch.stack(self._finite).to(self.device, torch.int64)
        batches = torch.tensor(self._batches, dtype=torch.int64, device=self.device)
        out[0] = bad.sum()
        out[1] = sum(self._sizes)
        flagged = bad > 0
        out[2 + rank] = torch.where(flagged.any(), batches[flagged.int().argmax()] + 1, 0)
        return out


def _step_pair(output: Any, step: BatchStep) -> tuple[Tensor, Tensor]:
    if (
        isinstance(output, (tuple, list))
        and len(output) == 2
        and all(isinstance(v, Tensor) for v in output)
    ):
        return output[0], output[1]
    name = getattr(step, "__qualname__", type(step).__name__)
    raise EvaluationError(
        f"the batch step {name} returned {_what(output)}; it must return a pair (preds, target) "
        "of tensors"
    )


def _task_problems(
    reduced: Tensor, scorer: Scorer, num_scorer_counts: int, world_size: int
) -> list[str]:
    """What is wrong with one task's reduced counts (see :func:`evaluate_tasks`), in words."""
    problems = []
    nonfinite, predictions = int(reduced[num_scorer_counts]), int(reduced[num_scorer_counts + 1])
    if nonfinite:
        first = reduced[num_scorer_counts + 2 :].tolist()
        if world_size <= 1:
            where = f"first in batch {first[0] - 1} of the test dataloader"
        else:
            where = "first in batch " + ", ".join(
                f"{b - 1} of rank {r}'s shard" for r, b in enumerate(first) if b > 0
            )
        problems.append(
            f"the model returned non-finite scores for {nonfinite} of the {predictions} "
            f"predictions (a NaN or +inf score, or all scores -inf), {where}; an argmax over them "
            "picks an arbitrary class. Check the model (e.g. a diverged training step, a NaN in "
            "the weights) and this task's inputs"
        )
    messages = getattr(scorer, "target_problems", (_OUT_OF_RANGE,))
    for k in range(2, num_scorer_counts):
        count = int(reduced[k])
        if count > 0:
            message = messages[k - 2] if k - 2 < len(messages) else _OUT_OF_RANGE
            problems.append(message.format(n=count))
    return problems


def _raise_for_task(
    reduced: Tensor, label: str, scorer: Scorer, num_scorer_counts: int, world_size: int
) -> None:
    if int(reduced[1]) == 0:
        raise EvaluationError(
            f"{label}: the loader yielded no sample; is its dataset empty or is drop_last=True "
            "with fewer samples than batch_size?"
        )
    problems = _task_problems(reduced, scorer, num_scorer_counts, world_size)
    if problems:
        raise EvaluationError(f"{label}: " + "; and ".join(problems))


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
            (:func:`shard_dataloader`) or, for loaders that could not be sharded, full loaders that
            only rank 0 counts.
        task_ids: which tasks to score.
        scorer: :class:`AccuracyScorer` (default) or :class:`MetricScorer`.
        device: where batches go (plain move, no user transfer hooks).
        step: ``(module, batch, task_id) -> (preds, target)``.
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
        EvaluationError: naming the task (index and name) and its test dataloader. Raised on every
            rank together, after the task's counts are reduced: the loader yielded no sample (on
            any rank); the model returned non-finite scores (how many, and the first batch holding
            one); targets that are not labels of the output's class dimension; a metric value that
            is not one finite number. Raised at once, on the rank that met it: an output that does
            not fit the targets, or a model/step output of the wrong structure.
    """
    scorer = scorer if scorer is not None else AccuracyScorer()
    device = torch.device(device) if device is not None else _module_device(module)
    names = (
        list(task_names)
        if task_names is not None
        else [f"task_{j}" for j in range(len(dataloaders))]
    )

    def label(j: int) -> str:
        return _loader_label(dataloaders[j], j, names[j])

    rows: list[Tensor] = []
    num_scorer_counts = 3
    results: list[Tensor] = []
    counted = [j for j in task_ids if world_size <= 1 or j not in unsharded or rank == 0]
    with preserve_rng_state(device), preserve_training_flags(module), grad_context():
        sources = _batch_sources(dataloaders, counted, device)
        for j in task_ids:
            scorer.start(device)
            watch = _OutputWatch(device)
            if j in sources:
                batches, on_device = sources[j]
                try:
                    for batch_index, batch in enumerate(batches):
                        if not on_device:
                            batch = move_data_to_device(batch, device)
                        if convert_input is not None:
                            batch = convert_input(batch)
                        with forward_context():
                            preds, target = _step_pair(step(module, batch, j), step)
                        watch.update(preds, target, batch_index)
                        scorer.update(preds, target)
                except EvaluationError as err:
                    raise EvaluationError(f"{label(j)}: {err}") from err
            scorer_counts = scorer.local_counts().to(device=device, dtype=torch.int64)
            num_scorer_counts = scorer_counts.numel()
            rows.append(torch.cat([scorer_counts, watch.counts(rank, world_size)]))
            if not scorer.count_based:
                # metric state sync is a collective: every rank computes every task, in order
                reduced_row = _reduce(rows[-1], all_reduce)
                _raise_for_task(reduced_row, label(j), scorer, num_scorer_counts, world_size)
                try:
                    results.append(scorer.result(reduced_row[:num_scorer_counts]))
                except EvaluationError as err:
                    raise EvaluationError(f"{label(j)}: {err}") from err
    reduced = (
        _reduce(torch.stack(rows), all_reduce)
        if rows
        else torch.zeros(0, 3, dtype=torch.int64, device=device)
    )
    for k, j in enumerate(task_ids):
        _raise_for_task(reduced[k], label(j), scorer, num_scorer_counts, world_size)
    if scorer.count_based:
        scores = (
            scorer.result(reduced[:, :num_scorer_counts])
            if len(task_ids)
            else torch.zeros(0, dtype=torch.float64)
        )
    else:
        scores = torch.stack(results) if results else torch.zeros(0, dtype=torch.float64)
    return TaskEvaluation(
        task_ids=tuple(task_ids),
        scores=scores.detach().to("cpu", torch.float64),
        correct=reduced[:, 0].cpu() if scorer.count_based else torch.full((len(task_ids),), -1),
        total=reduced[:, 1].cpu(),
    )


def _reduce(t: Tensor, all_reduce: Callable[[Tensor], Tensor] | None) -> Tensor:
    return all_reduce(t.clone()) if all_reduce is not None else t


def _module_device(module: nn.Module) -> torch.device:
    for p in module.parameters():
        return p.device
    for b in module.buffers():
        return b.device
    return torch.device("cpu")

"""The evaluation loop: every task's batches, one forward each, every scorer, one reduction."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.utilities import move_data_to_device
from torch import Tensor, nn

from continual_eval.evaluation.cache import _CachedLoader
from continual_eval.evaluation.errors import EvaluationError
from continual_eval.evaluation.fast_path import fast_loader
from continual_eval.evaluation.guards import (
    grad_free_context,
    preserve_rng_state,
    preserve_training_flags,
)
from continual_eval.evaluation.loaders import _loader_label
from continual_eval.evaluation.pools import _pool_settings, _worker_pool, _WorkerPool
from continual_eval.evaluation.scorers import (
    _OUT_OF_RANGE,
    AccuracyScorer,
    Scorer,
    make_scorer,
)
from continual_eval.evaluation.step import BatchStep, _step_pair, default_batch_step


@dataclass(frozen=True)
class TaskEvaluation:
    """Per-task result of :func:`evaluate_tasks`, identical on every rank.

    ``scores_by_scorer[i][k]`` is scorer ``i``'s score on ``task_ids[k]`` (float64, CPU), aligned
    with the scorers passed (``scorer_names[i]`` is its ``name``; two scorers may share a name);
    ``scores`` is ``scores_by_scorer[0]``, the first scorer's. ``correct``/``total`` are the first
    scorer's reduced counts: ``total`` the number of elements scored; ``correct`` the correct
    predictions of an integer-count scorer (accuracy, top-k), else ``-1``.
    """

    task_ids: tuple[int, ...]
    scores: Tensor
    correct: Tensor
    total: Tensor
    scores_by_scorer: tuple[Tensor, ...] = ()
    scorer_names: tuple[str, ...] = ()


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


def _nonfinite_problem(watch: Tensor, world_size: int) -> str | None:
    """The output watch's reduced ``[nonfinite, predictions, first bad batch + 1 per rank]``,
    in words (``None``: every prediction finite)."""
    nonfinite, predictions = int(watch[0]), int(watch[1])
    if not nonfinite:
        return None
    first = watch[2:].tolist()
    if world_size <= 1:
        where = f"first in batch {first[0] - 1} of the test dataloader"
    else:
        where = "first in batch " + ", ".join(
            f"{b - 1} of rank {r}'s shard" for r, b in enumerate(first) if b > 0
        )
    return (
        f"the model returned non-finite scores for {nonfinite} of the {predictions} "
        f"predictions (a NaN or +inf score, or all scores -inf), {where}; an argmax over them "
        "picks an arbitrary class. Check the model (e.g. a diverged training step, a NaN in "
        "the weights) and this task's inputs"
    )


def _task_problems(row: Sequence[Tensor], scorers: Sequence[Scorer], world_size: int) -> list[str]:
    """What is wrong with one task's reduced counts (one vector per scorer, then the output
    watch's), in words; each message once, whichever scorers found it."""
    problems: list[str] = []
    nonfinite = _nonfinite_problem(row[-1], world_size)
    if nonfinite is not None:
        problems.append(nonfinite)
    for scorer, counts in zip(scorers, row, strict=False):
        messages = getattr(scorer, "target_problems", (_OUT_OF_RANGE,))
        for k in range(2, counts.numel()):
            count = int(counts[k])
            if count > 0:
                message = messages[k - 2] if k - 2 < len(messages) else _OUT_OF_RANGE
                text = message.format(n=count)
                if text not in problems:
                    problems.append(text)
    return problems


def _raise_for_task(
    row: Sequence[Tensor], label: str, scorers: Sequence[Scorer], world_size: int
) -> None:
    if int(row[0][1]) == 0:
        raise EvaluationError(
            f"{label}: the loader yielded no sample; is its dataset empty or is drop_last=True "
            "with fewer samples than batch_size?"
        )
    problems = _task_problems(row, scorers, world_size)
    if problems:
        raise EvaluationError(f"{label}: " + "; and ".join(problems))


def _local_counts(scorer: Scorer, device: torch.device) -> Tensor:
    """``scorer.local_counts()`` on ``device``: 1-D, int64 unless floating (float sums)."""
    counts = scorer.local_counts()
    if not isinstance(counts, Tensor) or counts.ndim != 1 or counts.numel() < 2:
        raise EvaluationError(
            f"scorer {scorer.name}: local_counts() must return a 1-D tensor [value, total, ...], "
            f"got {counts!r}"
        )
    dtype = counts.dtype if counts.is_floating_point() else torch.int64
    return counts.to(device=device, dtype=dtype)


def _reduce_counts(
    rows: list[list[Tensor]], all_reduce: Callable[[Tensor], Tensor] | None
) -> list[list[Tensor]]:
    """Sum every task's count vectors (one per scorer, then the output watch's) across ranks in
    ONE collective call, each vector coming back in its own dtype.

    All int64 (accuracy, top-k, metric bookkeeping): reduced as int64, exactly. When a scorer
    holds float sums (a loss), the whole call is reduced as one float64 tensor: integer counts
    below 2**53 are exact in float64 and cast back, and float sums are exact up to the order of
    summation (rank 0's sum plus rank 1's, ...), so no second collective is needed.
    """
    if all_reduce is None or not rows:
        return rows
    dtype = functools.reduce(torch.promote_types, (v.dtype for row in rows for v in row))
    sizes = [v.numel() for v in rows[0]]
    if any([v.numel() for v in row] != sizes for row in rows):
        raise EvaluationError(
            "a scorer's local_counts() changed length between tasks; it must return the same "
            "number of entries for every task (and on every rank)"
        )
    packed = torch.stack([torch.cat([v.to(dtype) for v in row]) for row in rows])
    reduced = all_reduce(packed.clone())
    return [
        [part.to(v.dtype) for part, v in zip(reduced[k].split(sizes), row, strict=True)]
        for k, row in enumerate(rows)
    ]


def _resolve_scorers(scorer: Scorer | None, scorers: Sequence[Any] | None) -> list[Scorer]:
    if scorer is not None and scorers is not None:
        raise TypeError("evaluate_tasks: pass scorer= (one) or scorers= (several), not both")
    if scorers is None:
        return [scorer if scorer is not None else AccuracyScorer()]
    if isinstance(scorers, (str, bytes)) or not isinstance(scorers, Sequence):
        raise TypeError(f"scorers must be a list of scorers, got {type(scorers).__name__}")
    if not scorers:
        raise ValueError("scorers is empty: give at least one scorer")
    return [make_scorer(spec) for spec in scorers]


def evaluate_tasks(
    module: nn.Module,
    dataloaders: Sequence[Any],
    task_ids: Sequence[int],
    *,
    scorer: Scorer | None = None,
    scorers: Sequence[Any] | None = None,
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
    """Score ``module`` on ``dataloaders[j]`` for each ``j`` in ``task_ids``, with every scorer.

    Each test batch goes through ``step`` (one forward pass) once; its ``(preds, target)`` is
    checked for non-finite predictions once, then fed to every scorer in order.

    Reduction: each task's counts (every scorer's :meth:`~Scorer.local_counts`, then the output
    checks) are summed across ranks by ``all_reduce``: once for all tasks when every scorer is
    count-based, else once per task, right after it, followed by each metric scorer's own sync
    (a collective per task per metric scorer, in scorer order, on every rank). Integer counts
    are reduced exactly; with a float-sum scorer (a loss) the call is reduced as float64, in which
    integer counts below 2**53 stay exact and float sums are exact up to summation order. No host
    sync per batch.

    Args:
        module: the model; called through ``step`` (default: ``module(x)`` / ``module(x, t)``).
        dataloaders: one test loader per task, already sharded for this rank
            (:func:`shard_dataloader`) or, for loaders that could not be sharded, full loaders that
            only rank 0 counts.
        task_ids: which tasks to score.
        scorer: one scorer (default :class:`AccuracyScorer`), used as given.
        scorers: several scorers, each a :class:`Scorer` or a specification for
            :func:`make_scorer` (``"accuracy"``, ``"loss"``, ``"top5"``, a torchmetrics metric, a
            loss callable); not together with ``scorer``.
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
        :class:`TaskEvaluation`, the same on every rank: ``scores_by_scorer`` aligned with the
        scorers, ``scores`` the first scorer's.

    Raises:
        EvaluationError: naming the task (index and name) and its test dataloader. Raised on every
            rank together, after the task's counts are reduced: the loader yielded no sample (on
            any rank); the model returned non-finite scores (how many, and the first batch holding
            one); targets that are not labels of the output's class dimension; non-finite losses;
            a metric value that is not one finite number. Raised at once, on the rank that met it:
            an output that does not fit the targets, or a model/step output of the wrong
            structure.
        TypeError, ValueError: ``scorers`` that :func:`make_scorer` refuses.
    """
    scorer_list = _resolve_scorers(scorer, scorers)
    device = torch.device(device) if device is not None else _module_device(module)
    names = (
        list(task_names)
        if task_names is not None
        else [f"task_{j}" for j in range(len(dataloaders))]
    )

    def label(j: int) -> str:
        return _loader_label(dataloaders[j], j, names[j])

    # metric state sync is a collective: every rank reduces and computes every task, in order
    per_task = not all(s.count_based for s in scorer_list)
    rows: list[list[Tensor]] = []  # per task: each scorer's counts, then the output watch's
    synced: list[list[Tensor | None]] = []  # per task: each non-count-based scorer's result
    counted = [j for j in task_ids if world_size <= 1 or j not in unsharded or rank == 0]
    with preserve_rng_state(device), preserve_training_flags(module), grad_context():
        sources = _batch_sources(dataloaders, counted, device)
        for j in task_ids:
            for s in scorer_list:
                s.start(device)
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
                        for s in scorer_list:
                            s.update(preds, target)
                except EvaluationError as err:
                    raise EvaluationError(f"{label(j)}: {err}") from err
            row = [_local_counts(s, device) for s in scorer_list]
            row.append(watch.counts(rank, world_size))
            if not per_task:
                rows.append(row)
                continue
            row = _reduce_counts([row], all_reduce)[0]
            _raise_for_task(row, label(j), scorer_list, world_size)
            try:
                synced.append(
                    [
                        None if s.count_based else s.result(c)
                        for s, c in zip(scorer_list, row[:-1], strict=True)
                    ]
                )
            except EvaluationError as err:
                raise EvaluationError(f"{label(j)}: {err}") from err
            rows.append(row)
    if not per_task:
        rows = _reduce_counts(rows, all_reduce)
        for row, j in zip(rows, task_ids, strict=True):
            _raise_for_task(row, label(j), scorer_list, world_size)
    scores_by_scorer = []
    for i, s in enumerate(scorer_list):
        if not rows:
            scores = torch.zeros(0, dtype=torch.float64)
        elif s.count_based:
            scores = s.result(torch.stack([row[i] for row in rows]))
        else:
            scores = torch.stack([result[i] for result in synced])  # type: ignore[misc]
        scores_by_scorer.append(scores.detach().to("cpu", torch.float64))
    first = (
        torch.stack([row[0] for row in rows]).cpu()
        if rows
        else torch.zeros(0, 3, dtype=torch.int64)
    )
    integer_counts = scorer_list[0].count_based and not first.is_floating_point()
    return TaskEvaluation(
        task_ids=tuple(task_ids),
        scores=scores_by_scorer[0],
        correct=first[:, 0] if integer_counts else torch.full((len(task_ids),), -1),
        total=first[:, 1].to(torch.int64),
        scores_by_scorer=tuple(scores_by_scorer),
        scorer_names=tuple(s.name for s in scorer_list),
    )


def _module_device(module: nn.Module) -> torch.device:
    for p in module.parameters():
        return p.device
    for b in module.buffers():
        return b.device
    return torch.device("cpu")

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

import continual_eval.evaluation.scorers as scorers_module
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
    MetricScorer,
    Scorer,
    checked_result,
    checked_update,
    make_scorer,
    scorer_batch_error,
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
    ``details_by_scorer[i]`` is what count-based scorer ``i``'s optional
    ``details(reduced_counts)`` returned for the same ``[tasks, K]`` counts its ``result`` got
    (e.g. confusion counts), ``None`` for a scorer without that method.
    """

    task_ids: tuple[int, ...]
    scores: Tensor
    correct: Tensor
    total: Tensor
    scores_by_scorer: tuple[Tensor, ...] = ()
    scorer_names: tuple[str, ...] = ()
    details_by_scorer: tuple[Any, ...] = ()


class _OutputWatch:
    """Counts one task's non-finite predictions, with no host sync per batch.

    A prediction is one score vector over the class dimension (dim 1) when ``preds`` has one more
    dimension than ``target``, else one element. It is non-finite when its top score is NaN or
    infinite: a NaN or ``+inf`` anywhere in the vector, or every score ``-inf``; ``-inf`` scores
    next to finite ones (masked classes) are fine. Per update (a batch, or a group of consecutive
    batches concatenated) this costs a max, an ``isfinite`` and a sum on the device (a group: a few
    more ops to find its first bad batch); the counts are read after the task.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._finite: list[Tensor] = []  # per float update: finite predictions (device scalar)
        self._sizes: list[int] = []  # per float update: predictions
        self._batches: list[int] = []  # per float update: the index of its first batch
        #: per float update: its first bad batch's offset from ``_batches`` (device scalar);
        #: ``None`` for a single batch
        self._offsets: list[Tensor | None] = []

    def update(
        self, preds: Tensor, target: Tensor, batch_index: int, sizes: Sequence[int] = ()
    ) -> None:
        """Watch ``preds``: one batch, or with ``sizes`` (rows per batch) a group of consecutive
        batches concatenated along dim 0, the first of them batch ``batch_index``."""
        if not preds.is_floating_point():
            return
        top = preds.amax(dim=1) if preds.ndim == target.ndim + 1 and preds.ndim >= 2 else preds
        finite = (top - top) == 0  # torch.isfinite in 2 kernels: x - x is 0 iff x is finite
        self._finite.append(finite.sum())
        self._sizes.append(top.numel())
        self._batches.append(batch_index)
        offset = None
        if len(sizes) > 1 and finite.numel():
            bad_rows = ~finite.reshape(finite.shape[0], -1).all(dim=1)
            if sizes[0] > 0 and sizes[-1] <= sizes[0] and all(n == sizes[0] for n in sizes[:-1]):
                offset = bad_rows.int().argmax() // sizes[0]  # equal batches but the last
            else:
                flags = torch.stack([rows.any() for rows in bad_rows.split(list(sizes))])
                offset = flags.int().argmax()
        self._offsets.append(offset)

    def counts(self, rank: int, world_size: int) -> Tensor:
        """``[nonfinite, predictions, first_bad_batch + 1 of rank 0, ..., of rank W-1]`` (int64):
        one column per rank (0: none), so a sum across ranks keeps every rank's first bad batch."""
        out = torch.zeros(2 + max(world_size, 1), dtype=torch.int64, device=self.device)
        if not self._finite:
            return out
        sizes = torch.tensor(self._sizes, dtype=torch.int64, device=self.device)
        bad = sizes - torch.stack(self._finite).to(self.device, torch.int64)
        batches = torch.tensor(self._batches, dtype=torch.int64, device=self.device)
        if any(offset is not None for offset in self._offsets):
            zero = torch.zeros((), dtype=torch.int64, device=self.device)
            offsets = [zero if offset is None else offset for offset in self._offsets]
            batches = batches + torch.stack(offsets).to(self.device, torch.int64)
        out[0] = bad.sum()
        out[1] = sum(self._sizes)
        flagged = bad > 0
        out[2 + rank] = torch.where(flagged.any(), batches[flagged.int().argmax()] + 1, 0)
        return out


def _group_key(preds: Tensor, target: Tensor) -> tuple[Any, ...] | None:
    """What two batches must share to be concatenated along dim 0 (``None``: this batch is fed
    alone: not plain strided tensors with a batch dimension of equal length)."""
    if (
        type(preds) is not Tensor
        or type(target) is not Tensor
        or preds.ndim == 0
        or target.ndim == 0
        or preds.shape[0] != target.shape[0]
        or preds.layout != torch.strided
        or target.layout != torch.strided
    ):
        return None
    return (
        preds.shape[1:],
        preds.dtype,
        preds.device,
        target.shape[1:],
        target.dtype,
        target.device,
    )


def _copy(t: Tensor) -> Tensor:
    """A copy of ``t`` that a later forward pass cannot overwrite (e.g. a CUDA-graph output)."""
    return (t.detach() if t.requires_grad else t).clone()


class _TaskFeed:
    """Feeds one task's ``(preds, target)`` pairs to the output watch and every scorer.

    Scorers that are not ``batch_additive`` get each batch as the step returned it, at once. The
    batch-additive scorers and the watch get copies of consecutive batches concatenated along dim
    0, one update per group: a group ends when a batch does not fit it (another shape beyond dim 0,
    dtype or device), when its copies reach :data:`BUFFER_BYTES`, and at the end of the task
    (:meth:`flush`). A batch that cannot be concatenated (0-d, or not as many predictions as
    targets) or that alone holds :data:`BUFFER_BYTES` is fed alone, uncopied, after the group
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

    def add(self, preds: Tensor, target: Tensor, batch_index: int) -> None:
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
        alone = key is None or preds.nbytes + target.nbytes >= scorers_module.BUFFER_BYTES
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
        self._targets.append(_copy(target))
        self._sizes.append(preds.shape[0])
        self._bytes += preds.nbytes + target.nbytes
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


def _nonfinite_problem(watch: Sequence[float], world_size: int) -> str | None:
    """The output watch's reduced ``[nonfinite, predictions, first bad batch + 1 per rank]``,
    in words (``None``: every prediction finite)."""
    nonfinite, predictions = int(watch[0]), int(watch[1])
    if not nonfinite:
        return None
    first = [int(b) for b in watch[2:]]
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


def _task_problems(
    row: Sequence[Sequence[float]], scorers: Sequence[Scorer], world_size: int
) -> list[str]:
    """What is wrong with one task's reduced counts (one list per scorer, then the output
    watch's), in words; each message once, whichever scorers found it."""
    problems: list[str] = []
    nonfinite = _nonfinite_problem(row[-1], world_size)
    if nonfinite is not None:
        problems.append(nonfinite)
    for scorer, counts in zip(scorers, row, strict=False):
        messages = getattr(scorer, "target_problems", (_OUT_OF_RANGE,))
        num_problems = getattr(scorer, "num_problems", None)
        end = len(counts) if num_problems is None else min(len(counts), 2 + num_problems)
        for k in range(2, end):
            count = int(counts[k])
            if count > 0:
                message = messages[k - 2] if k - 2 < len(messages) else _OUT_OF_RANGE
                text = message.format(n=count)
                if text not in problems:
                    problems.append(text)
    return problems


def _raise_for_task(
    row: Sequence[Sequence[float]], label: str, scorers: Sequence[Scorer], world_size: int
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


@dataclass(frozen=True)
class _Reduced:
    """Tasks' counts summed across ranks: row ``k`` holds task ``k``'s count vectors (one per
    scorer, then the output watch's) side by side, in their promoted dtype; ``host`` is the same
    on the host (one read for every task)."""

    packed: Tensor
    sizes: list[int]
    dtypes: list[torch.dtype]
    host: list[list[float]]

    def part(self, i: int) -> Tensor:
        """Vector ``i`` of every row, ``[tasks, K_i]``, in its own dtype."""
        start = sum(self.sizes[:i])
        return self.packed[:, start : start + self.sizes[i]].to(self.dtypes[i])

    def host_row(self, k: int) -> list[list[float]]:
        """Row ``k`` on the host, split into its vectors."""
        row, out, start = self.host[k], [], 0
        for size in self.sizes:
            out.append(row[start : start + size])
            start += size
        return out


def _reduce_counts(
    rows: list[list[Tensor]], all_reduce: Callable[[Tensor], Tensor] | None
) -> _Reduced:
    """Sum every task's count vectors (one per scorer, then the output watch's) across ranks in
    ONE collective call (none without ``all_reduce``), each vector coming back in its own dtype.

    All int64 (accuracy, top-k, integer metric states): reduced as int64, exactly. When a scorer
    holds float sums (a loss, a float metric state), the whole call is reduced as one float64
    tensor: integer counts below 2**53 are exact in float64 and cast back, and float sums are exact
    up to the order of summation (rank 0's sum plus rank 1's, ...), so no second collective is
    needed.
    """
    dtypes = [v.dtype for v in rows[0]]
    dtype = functools.reduce(torch.promote_types, (v.dtype for row in rows for v in row))
    if dtype.is_floating_point and rows[0][0].device.type != "mps":
        dtype = torch.promote_types(dtype, torch.float64)  # a float16 sum: integers stay exact
    sizes = [v.numel() for v in rows[0]]
    if any([v.numel() for v in row] != sizes for row in rows):
        raise EvaluationError(
            "a scorer's local_counts() changed length between tasks; it must return the same "
            "number of entries for every task (and on every rank)"
        )
    packed = torch.stack([torch.cat([v.to(dtype) for v in row]) for row in rows])
    if all_reduce is not None:
        packed = all_reduce(packed.clone())
    return _Reduced(packed, sizes, dtypes, packed.tolist())


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
    stage: int | None = None,
) -> TaskEvaluation:
    """Score ``module`` on ``dataloaders[j]`` for each ``j`` in ``task_ids``, with every scorer.

    Each test batch goes through ``step`` (one forward pass) once; its ``(preds, target)`` is
    checked for non-finite predictions once and fed to every scorer. Scorers that are not
    ``batch_additive`` get each batch at once, as ``step`` returned it; the batch-additive ones
    (the built-in accuracy, top-k and cross-entropy scorers, the torchmetrics metrics
    :class:`MetricScorer` knows to be) and the non-finite check get copies of a task's
    consecutive batches concatenated, one update per task (or per :data:`BUFFER_BYTES` of
    copies; a batch of another shape beyond dim 0, dtype or device starts a new group), so their
    per-batch work runs once per group.

    Reduction: each task's counts (every scorer's :meth:`~Scorer.local_counts`, then the output
    checks) are summed across ranks by ``all_reduce``: once for all tasks when every scorer is
    count-based (a metric whose states are all sum-reduced tensors is: its states are among its
    counts), else once per task, right after it, followed by each non-count-based metric scorer's
    own sync (a collective per task per such scorer, in scorer order, on every rank). Integer
    counts are reduced exactly; with a float-sum scorer (a loss, a float metric state) the call is
    reduced as float64, in which integer counts below 2**53 stay exact and float sums are exact up
    to summation order. Count-based scores are computed after every task's counts are reduced
    and checked. No host sync per batch.

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
        stage: passed to each scorer's optional ``set_task(task_id, stage)`` before its task:
            ``-1`` for the untrained baseline, ``i`` for stage ``i`` (or an evaluation inside
            it), ``None`` when the evaluation is not tied to a stage.

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
    # scorers that score the raw batch with the module themselves (decoding; Scorer's docstring)
    batch_scorers = [s for s in scorer_list if getattr(s, "needs_batch", False) is True]
    output_scorers = [s for s in scorer_list if getattr(s, "needs_batch", False) is not True]
    rows: list[list[Tensor]] = []  # per task: each scorer's counts, then the output watch's
    reduced: list[_Reduced] = []  # per task (per_task), else one for all tasks
    synced: list[list[Tensor | None]] = []  # per task: each non-count-based scorer's result
    counted = [j for j in task_ids if world_size <= 1 or j not in unsharded or rank == 0]
    with preserve_rng_state(device), preserve_training_flags(module), grad_context():
        sources = _batch_sources(dataloaders, counted, device)
        for j in task_ids:
            for s in scorer_list:
                s.start(device)
                set_task = getattr(s, "set_task", None)
                if set_task is not None:
                    set_task(j, stage)  # optional: scoring that depends on the task or stage
            watch = _OutputWatch(device)
            if j in sources:
                batches, on_device = sources[j]
                feed = _TaskFeed(output_scorers, watch)
                try:
                    for batch_index, batch in enumerate(batches):
                        if not on_device:
                            batch = move_data_to_device(batch, device)
                        if convert_input is not None:
                            batch = convert_input(batch)
                        with forward_context():
                            if output_scorers:  # no forward when every scorer decodes itself
                                preds, target = _step_pair(step(module, batch, j), step)
                            for s in batch_scorers:
                                s.update_batch(module, batch, all_reduce)
                        if output_scorers:
                            feed.add(preds, target, batch_index)
                    feed.flush()
                except EvaluationError as err:
                    raise EvaluationError(f"{label(j)}: {err}") from err
            try:
                if batch_scorers:  # on every rank, with or without batches of this task
                    with forward_context():
                        for s in batch_scorers:
                            s.end_task(module, all_reduce)
                row = [_local_counts(s, device) for s in scorer_list]
            except EvaluationError as err:
                raise EvaluationError(f"{label(j)}: {err}") from err
            row.append(watch.counts(rank, world_size))
            if not per_task:
                rows.append(row)
                continue
            counts = _reduce_counts([row], all_reduce)
            _raise_for_task(counts.host_row(0), label(j), scorer_list, world_size)
            try:
                synced.append(
                    [
                        None if s.count_based else checked_result(s, counts.part(i)[0])
                        for i, s in enumerate(scorer_list)
                    ]
                )
            except EvaluationError as err:
                raise EvaluationError(f"{label(j)}: {err}") from err
            reduced.append(counts)
    if not per_task and rows:
        counts = _reduce_counts(rows, all_reduce)
        for k, j in enumerate(task_ids):
            _raise_for_task(counts.host_row(k), label(j), scorer_list, world_size)
        reduced.append(counts)

    def part(i: int) -> Tensor:
        """Scorer ``i``'s reduced counts of every task, ``[tasks, K_i]``."""
        parts = [counts.part(i) for counts in reduced]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    scores_by_scorer, details_by_scorer = [], []
    for i, s in enumerate(scorer_list):
        details = None
        if not reduced:
            scores = torch.zeros(0, dtype=torch.float64)
        elif s.count_based:
            try:
                scores = checked_result(s, part(i), task_ids)
            except EvaluationError as err:
                if err.task_row is None or not 0 <= err.task_row < len(task_ids):
                    raise
                raise EvaluationError(f"{label(task_ids[err.task_row])}: {err}") from err
            details_of = getattr(s, "details", None)  # optional: e.g. confusion counts
            details = details_of(part(i)) if callable(details_of) else None
        else:
            scores = torch.stack([result[i] for result in synced])  # type: ignore[misc]
        scores_by_scorer.append(scores.detach().to("cpu", torch.float64))
        details_by_scorer.append(details)
    first = part(0).cpu() if reduced else torch.zeros(0, 3, dtype=torch.int64)
    integer_counts = (
        scorer_list[0].count_based
        and not first.is_floating_point()
        and not isinstance(scorer_list[0], MetricScorer)  # its value entry is 0, not a count
    )
    return TaskEvaluation(
        task_ids=tuple(task_ids),
        scores=scores_by_scorer[0],
        correct=first[:, 0] if integer_counts else torch.full((len(task_ids),), -1),
        total=first[:, 1].to(torch.int64),
        scores_by_scorer=tuple(scores_by_scorer),
        scorer_names=tuple(s.name for s in scorer_list),
        details_by_scorer=tuple(details_by_scorer),
    )


def _module_device(module: nn.Module) -> torch.device:
    for p in module.parameters():
        return p.device
    for b in module.buffers():
        return b.device
    return torch.device("cpu")

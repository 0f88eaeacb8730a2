"""The evaluation loop: every task's batches, one forward each, every scorer, one reduction.

Each test batch goes through ``step`` (one forward pass) once; its ``(preds, target)`` is
checked for non-finite predictions once and fed to every scorer. Scorers that are not
``batch_additive`` get each batch at once, as ``step`` returned it; the batch-additive ones
(the built-in accuracy, top-k and cross-entropy scorers, the torchmetrics metrics
`MetricScorer` knows to be) and the non-finite check get copies of a task's
consecutive batches concatenated, one update per task (or per `BUFFER_BYTES` of
copies; a batch of another shape beyond dim 0, dtype or device starts a new group), so their
per-batch work runs once per group.

Reduction: each task's counts (every scorer's
    [`local_counts`][continual_eval.evaluation.Scorer.local_counts], then the output
checks) are summed across ranks by ``all_reduce``: once for all tasks when every scorer is
count-based (a metric whose states are all sum-reduced tensors is: its states are among its
counts), else once per task, right after it, followed by each non-count-based metric scorer's
own sync (a collective per task per such scorer, in scorer order, on every rank). Integer
counts are reduced exactly; with a float-sum scorer (a loss, a float metric state) the call is
reduced as float64, in which integer counts below 2**53 stay exact and float sums are exact up
to summation order. Count-based scores are computed after every task's counts are reduced
and checked. No host sync per batch.

Lockstep (``lockstep`` given: a strategy whose forward pass is a collective, see
`lockstep`): every rank runs every task's loader, the ranks
agree on each task's largest batch count in one collective, and a rank with fewer batches runs
the remaining forward passes on one sample of a batch it already has (or the task's spare
sample), discarding the outputs; ``unsharded`` tasks are iterated by every rank and counted
by rank 0. The scores equal those without lockstep.

Errors: [`EvaluationError`][continual_eval.evaluation.EvaluationError] names the task (index and
    name) and its test dataloader. Raised
on every rank together, after the task's counts are reduced: the loader yielded no sample (on any
rank); the model returned non-finite scores (how many, and the first batch holding one); targets
that are not labels of the output's class dimension; non-finite losses; a metric value that is
not one finite number; in lockstep, a rank without a sample of a task the others score and
nothing to pad with. Raised at once, on the rank that met it: an output that does not fit the
targets, or a model/step output of the wrong structure.

Progress: ``progress`` (an [`EvaluationProgress`][continual_eval.evaluation.EvaluationProgress],
    e.g. a progress bar; the loop imports
nothing of Lightning) hears ``start(total)`` once, before the first batch (``total``: the batches
of every task this rank reads, ``None`` when a loader's length is unknown), then ``advance()``
after each batch scored (lockstep's extra passes are not batches).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import torch
from lightning.pytorch.utilities import move_data_to_device
from lightning_utilities import apply_to_collection
from torch import Tensor, nn

from continual_eval.evaluation._item_gather import gather_items
from continual_eval.evaluation.errors import EvaluationError
from continual_eval.evaluation.feed import (
    _first_bad_batches,
    _OutputWatch,
    _TaskFeed,
    _watch_counts,
)
from continual_eval.evaluation.guards import (
    grad_free_context,
    preserve_rng_state,
    preserve_training_flags,
)
from continual_eval.evaluation.loaders import _loader_label
from continual_eval.evaluation.lockstep import (
    Lockstep,
    StepPlan,
    agree_batch_counts,
    lockstep_batches,
)
from continual_eval.evaluation.reduction import (
    _columns,
    _local_counts,
    _raise_for_task,
    _reduce_counts,
    _Reduced,
)
from continual_eval.evaluation.scorers import (
    AccuracyScorer,
    MetricScorer,
    Scorer,
    checked_result,
    item_support,
    make_scorer,
    scorer_label,
)
from continual_eval.evaluation.sources import _batch_sources, _TaskSource
from continual_eval.evaluation.step import (
    BatchStep,
    _model_scores,
    _step_pair,
    default_batch_step,
)

__all__ = ["EvaluationProgress", "TaskEvaluation", "evaluate_tasks"]


class EvaluationProgress(Protocol):
    """What [`evaluate_tasks`][continual_eval.evaluation.evaluate_tasks] reports its progress to
    (``progress=``): ``start(total)`` once, before the first batch, with the batches of every task
    this rank reads (``None`` when a loader's length is unknown), then ``advance()`` after each
    batch scored."""

    def start(self, total: int | None) -> None: ...

    def advance(self) -> None: ...


@dataclass(frozen=True)
class TaskEvaluation:
    """Per-task result of [`evaluate_tasks`][continual_eval.evaluation.evaluate_tasks], identical on
    every rank.

    ``scores_by_scorer[i][k]`` is scorer ``i``'s score on ``task_ids[k]`` (float64, CPU), aligned
    with the scorers passed (``scorer_names[i]`` is its ``name``; two scorers may share a name);
    ``scores`` is ``scores_by_scorer[0]``, the first scorer's. ``correct``/``total`` are the first
    scorer's reduced counts: ``total`` the number of elements scored; ``correct`` the correct
    predictions of an integer-count scorer (accuracy, top-k), else ``-1``.
    ``details_by_scorer[i]``: what count-based scorer ``i``'s optional ``details(reduced_counts)``
    returned for the same ``[tasks, K]`` counts its ``result`` got (``None`` without the method).
    """

    task_ids: tuple[int, ...]
    scores: Tensor
    correct: Tensor
    total: Tensor
    scores_by_scorer: tuple[Tensor, ...] = ()
    scorer_names: tuple[str, ...] = ()
    details_by_scorer: tuple[Any, ...] = ()
    items_by_scorer: tuple[tuple[Tensor, ...] | None, ...] = ()
    """per scorer, with ``item_scorers``: each task's per-item values ``[n_k]`` in test-set order
    (bool for 0/1 scores, float64 otherwise; CPU, the same on every rank), aligned with
    ``task_ids``; ``None`` for a scorer not recorded (``()`` when none is)"""
    labels_by_scorer: tuple[tuple[Tensor, ...] | None, ...] = ()
    """per scorer whose ``keep_labels`` is set (the class-incremental scorers, recorded): each
    task's sample labels ``[n_k]`` int64, in the items' order, gathered like them; ``()`` when
    none is"""


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


class _Forward:
    """One test batch to ``(preds, target)``: the device move, ``convert_input``, the step under
    ``forward_context`` (each skipped when it would do nothing)."""

    def __init__(
        self,
        module: nn.Module,
        device: torch.device,
        step: BatchStep,
        forward_context: Callable[[], AbstractContextManager[Any]],
        convert_input: Callable[[Any], Any] | None,
    ) -> None:
        self.module, self.device, self.step = module, device, step
        self.context = None if forward_context is nullcontext else forward_context
        self.convert_input = convert_input
        #: the default step on a module without ``continual_eval_step``: an ``(x, y)`` list or
        #: tuple batch is ``module(x), y``, called here without the step's per-batch checks
        #: (the same pair; anything else goes through the step and its errors)
        self.plain = step is default_batch_step and not callable(
            getattr(module, "continual_eval_step", None)
        )

    def prepare(self, batch: Any, on_device: bool) -> Any:
        if not on_device:
            batch = move_data_to_device(batch, self.device)
        if self.convert_input is not None:
            batch = self.convert_input(batch)
        return batch

    def __call__(self, batch: Any, task: int) -> tuple[Tensor, Tensor]:
        if self.plain and (type(batch) is list or type(batch) is tuple) and len(batch) == 2:
            x, y = batch
            if self.context is None:
                preds = self.module(x)
            else:
                with self.context():
                    preds = self.module(x)
            if isinstance(preds, Tensor) and isinstance(y, Tensor):
                return preds, y
            return _step_pair((_model_scores(preds), y), self.step)  # the step's own errors
        if self.context is None:
            return _step_pair(self.step(self.module, batch, task), self.step)
        with self.context():
            return _step_pair(self.step(self.module, batch, task), self.step)


def _first_sample(batch: Any) -> Any:
    """``batch`` cut to its first sample (a view) when its tensors (in any nesting of lists,
    tuples, dicts) share one leading size above 1: what a lockstep pass runs, at the cost of one
    sample; else ``batch`` itself."""
    sizes: set[int] = set()
    apply_to_collection(batch, Tensor, lambda t: sizes.add(t.shape[0] if t.ndim else -1))
    if len(sizes) != 1 or min(sizes) < 2:
        return batch
    return apply_to_collection(batch, Tensor, lambda t: t[:1])


def _owns_target(batch: Any, target: Tensor) -> bool:
    """Whether ``target`` is one of the tensors of ``batch`` (a list or tuple)."""
    if type(batch) is list and len(batch) == 2:  # the fast path's and the cache's batches
        return batch[1] is target or batch[0] is target
    if isinstance(batch, (list, tuple)):
        for t in batch:
            if t is target:
                return True
    return False


class _BatchScorers:
    """The scorers that score the raw batch with the module themselves (``needs_batch``:
    decoding, see [`Scorer`][continual_eval.evaluation.Scorer]), with the loop's ``all_reduce`` for
    their synced steps."""

    def __init__(
        self, scorers: Sequence[Scorer], all_reduce: Callable[[Tensor], Tensor] | None
    ) -> None:
        self.scorers = [s for s in scorers if getattr(s, "needs_batch", False) is True]
        #: whether any scorer takes the step's ``(preds, target)`` (else no step forward runs)
        self.outputs = len(self.scorers) < len(scorers)
        self.all_reduce = all_reduce

    def update(self, forward: _Forward, batch: Any) -> None:
        """One counted batch (never a lockstep pass: those are caught up in `end`)."""
        with forward.context() if forward.context is not None else nullcontext():
            for s in self.scorers:
                s.update_batch(forward.module, batch, self.all_reduce)  # type: ignore[attr-defined]

    def end(self, forward: _Forward) -> None:
        """After a task's batches, on every rank (also one with no batch of it)."""
        with forward.context() if forward.context is not None else nullcontext():
            for s in self.scorers:
                s.end_task(forward.module, self.all_reduce)  # type: ignore[attr-defined]


def _run_task(
    forward: _Forward,
    task: int,
    source: _TaskSource,
    feed: _TaskFeed | None,
    plan: StepPlan | None,
    lockstep: Lockstep | None,
    batch_scorers: _BatchScorers,
    progress: EvaluationProgress | None = None,
) -> None:
    """Every batch of one task through ``forward``, fed to ``feed`` (``None``: this rank does not
    count the task) and to the batch scorers. In lockstep (``plan``), then the passes the plan
    adds, on the first sample of the last batch (or the task's spare sample), their outputs
    discarded. Without output scorers (every scorer decodes itself) no step forward runs.
    ``progress`` advances after every batch."""
    outputs = batch_scorers.outputs
    batches: Any = source.batches
    spare = lockstep.spare_loader(task) if lockstep is not None else None
    if plan is not None:
        assert lockstep is not None
        batches = lockstep_batches(batches, plan, lockstep, forward.device, spare is not None)
    last, pad = None, None
    index = 0
    owned = source.owned
    # batches on the device with no input conversion: `_Forward.prepare` would return them
    ready = source.on_device and forward.convert_input is None
    for batch in batches:
        if batch is None:  # lockstep: a pass the other ranks need, not counted
            if pad is None and last is None:
                assert spare is not None  # agree_batch_counts checked that a spare exists
                pad = forward.prepare(next(iter(spare)), on_device=False)
            elif pad is None:
                pad = _first_sample(last)
            if outputs:
                forward(pad, task)
            continue
        if not ready:
            batch = forward.prepare(batch, source.on_device)
        if outputs:
            preds, target = forward(batch, task)
            if feed is not None:
                feed.add(preds, target, index, owned and _owns_target(batch, target))
        if feed is not None and batch_scorers.scorers:
            batch_scorers.update(forward, batch)
        index += 1
        if plan is not None:
            last = batch
        if progress is not None:
            progress.advance()
    if feed is not None:
        feed.flush()


class _Tally:
    """Every task's counts, reduced across ranks, and the scores and details they give.

    Once for all tasks when every scorer is count-based, else per task, right after it (each
    non-count-based scorer's own sync follows, on every rank in order).
    """

    def __init__(
        self,
        scorers: Sequence[Scorer],
        device: torch.device,
        all_reduce: Callable[[Tensor], Tensor] | None,
        rank: int,
        world_size: int,
        label: Callable[[int], str],
    ) -> None:
        self.scorers, self.device, self.all_reduce = scorers, device, all_reduce
        self.rank, self.world_size, self.label = rank, world_size, label
        self.per_task = not all(s.count_based for s in scorers)
        self.rows: list[list[Tensor]] = []  # per task held: each scorer's counts
        self.watches: list[_OutputWatch] = []  # per task held: its output watch
        self.reduced: list[_Reduced] = []  # per task (per_task), else one for all tasks
        self.synced: list[list[Tensor | None]] = []  # per task: non-count-based results
        #: the scorers whose items are kept, and per such scorer each task's local items
        self.item_scorers: list[int] = []
        self.items: list[list[Tensor]] = []
        #: the recorded scorers that keep their samples' labels too, and per task their labels
        self.label_scorers: list[int] = []
        self.labels: list[list[Tensor]] = []

    def add(self, task: int, watch: _OutputWatch) -> None:
        """Task ``task``'s local counts, read after its batches."""
        try:
            row = [_local_counts(s, self.device) for s in self.scorers]
        except EvaluationError as err:
            raise EvaluationError(f"{self.label(task)}: {err}") from err
        self.rows.append(row)
        self.watches.append(watch)
        for kept, i in zip(self.items, self.item_scorers, strict=True):
            kept.append(self.scorers[i].local_items())  # type: ignore[attr-defined]
        for kept, i in zip(self.labels, self.label_scorers, strict=True):
            kept.append(self.scorers[i].local_item_labels())  # type: ignore[attr-defined]
        if self.per_task:
            counts = self._reduce()
            _raise_for_task(counts.host_row(0), self.label(task), self.scorers, self.world_size)
            try:
                self.synced.append(
                    [
                        None if s.count_based else checked_result(s, counts.part(i)[0])
                        for i, s in enumerate(self.scorers)
                    ]
                )
            except EvaluationError as err:
                raise EvaluationError(f"{self.label(task)}: {err}") from err

    def _reduce(self) -> _Reduced:
        """Reduce the tasks held (one collective) and forget them. A task with a non-finite
        prediction (on any rank) has its first bad batch of every rank appended to its host
        row, ``[nonfinite, predictions, first + 1 of rank 0, ...]``: one more collective, on
        every rank alike (they all read the same reduced counts)."""
        watches = self.watches
        watch = _watch_counts(watches, self.device)
        counts = _reduce_counts([*_columns(self.rows), watch], self.all_reduce)
        self.rows, self.watches = [], []
        bad = [k for k, row in enumerate(counts.host) if row[-2] > 0]
        if bad:
            first = _first_bad_batches(
                [watches[k] for k in bad], self.rank, self.world_size, self.device
            )
            if self.all_reduce is not None:
                first = self.all_reduce(first)
            for k, batches in zip(bad, first.tolist(), strict=True):
                counts.host[k].extend(batches)
        self.reduced.append(counts)
        return counts

    def _part(self, i: int) -> Tensor:
        """Scorer ``i``'s reduced counts of every task, ``[tasks, K_i]``."""
        parts = [counts.part(i) for counts in self.reduced]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _count_based(self, i: int, task_ids: Sequence[int]) -> tuple[Tensor, Any]:
        """Count-based scorer ``i``'s scores of every task, and its details (or ``None``)."""
        scorer, counts = self.scorers[i], self._part(i)
        try:
            scores = checked_result(scorer, counts, task_ids)
        except EvaluationError as err:
            if err.task_row is None or not 0 <= err.task_row < len(task_ids):
                raise
            raise EvaluationError(f"{self.label(task_ids[err.task_row])}: {err}") from err
        details = getattr(scorer, "details", None)
        return scores, details(counts) if callable(details) else None

    def finish(self, task_ids: Sequence[int]) -> TaskEvaluation:
        """Reduce what `add` held (one collective), check it, and score every task."""
        if not self.per_task and self.rows:
            counts = self._reduce()
            for k, j in enumerate(task_ids):
                _raise_for_task(counts.host_row(k), self.label(j), self.scorers, self.world_size)
        scores_by_scorer, details_by_scorer = [], []
        for i, s in enumerate(self.scorers):
            details = None
            if not self.reduced:
                scores = torch.zeros(0, dtype=torch.float64)
            elif s.count_based:
                scores, details = self._count_based(i, task_ids)
            else:
                scores = torch.stack([result[i] for result in self.synced])  # type: ignore[misc]
            scores_by_scorer.append(scores.detach().to("cpu", torch.float64))
            details_by_scorer.append(details)
        first = self._part(0).cpu() if self.reduced else torch.zeros(0, 3, dtype=torch.int64)
        head = self.scorers[0]
        integer_counts = (
            head.count_based
            and not first.is_floating_point()
            and not isinstance(head, MetricScorer)  # its value entry is 0, not a count
        )
        return TaskEvaluation(
            task_ids=tuple(task_ids),
            scores=scores_by_scorer[0],
            correct=first[:, 0] if integer_counts else torch.full((len(task_ids),), -1),
            total=first[:, 1].to(torch.int64),
            scores_by_scorer=tuple(scores_by_scorer),
            scorer_names=tuple(s.name for s in self.scorers),
            details_by_scorer=tuple(details_by_scorer),
        )


def _start_task(scorers: Sequence[Scorer], task: int, stage: int | None, device: Any) -> None:
    """Every scorer starts task ``task``; those with the optional ``set_task`` learn the task
    and the stage."""
    for s in scorers:
        s.start(device)
        set_task = getattr(s, "set_task", None)
        if set_task is not None:
            set_task(task, stage)


def _plans(
    sources: dict[int, _TaskSource],
    task_ids: Sequence[int],
    lockstep: Lockstep,
    device: torch.device,
    label: Callable[[int], str],
) -> dict[int, StepPlan]:
    """Lockstep: every task's agreed forward passes (one collective for all tasks)."""
    lengths = [sources[j].length if j in sources else 0 for j in task_ids]
    can_pad = [lockstep.spare_loader(j) is not None for j in task_ids]
    plans = agree_batch_counts(lengths, can_pad, lockstep, device, [label(j) for j in task_ids])
    return dict(zip(task_ids, plans, strict=True))


def evaluate_tasks(
    module: nn.Module,
    dataloaders: Sequence[Any],
    task_ids: Sequence[int],
    *,
    scorer: Scorer | None = None,
    scorers: Sequence[Any] | None = None,
    device: torch.device | str | None = None,
    step: BatchStep = default_batch_step,
    forward_context: Callable[[], AbstractContextManager[Any]] = nullcontext,
    convert_input: Callable[[Any], Any] | None = None,
    grad_context: Callable[[], AbstractContextManager[Any]] = grad_free_context,
    all_reduce: Callable[[Tensor], Tensor] | None = None,
    rank: int = 0,
    world_size: int = 1,
    task_names: Sequence[str] | None = None,
    unsharded: Collection[int] = (),
    stage: int | None = None,
    lockstep: Lockstep | None = None,
    progress: EvaluationProgress | None = None,
    item_scorers: Collection[int] = (),
) -> TaskEvaluation:
    """Score ``module`` on ``dataloaders[j]`` for each ``j`` in ``task_ids``, with every scorer.

    One forward pass per batch feeds every scorer; counts are summed across ranks in one
    collective (see ``continual_eval.evaluation.loop``'s docstring, and for lockstep too).

    Args:
        module: the model; called through ``step`` (default: ``module(x)`` / ``module(x, t)``).
        dataloaders: one test loader per task, sharded for this rank (`shard_dataloader`),
            or full loaders (``unsharded``) that only rank 0 counts.
        task_ids: which tasks to score.
        scorer: one scorer (default `AccuracyScorer`), used as given.
        scorers: several scorers, each a [`Scorer`][continual_eval.evaluation.Scorer] or a
            specification for [`make_scorer`][continual_eval.evaluation.make_scorer]
            (``"accuracy"``, ``"loss"``, ``"top5"``, a torchmetrics metric, a loss callable); not
            together with ``scorer``.
        device: where batches go (plain move, no user transfer hooks).
        step: ``(module, batch, task_id) -> (preds, target)``.
        forward_context: e.g. the Trainer's ``precision_plugin.forward_context``.
        convert_input: applied to each batch after the device move, e.g. the Trainer's
            ``precision_plugin.convert_input``.
        grad_context: no-grad / inference-mode factory.
        all_reduce: sum-reduction across ranks (e.g. ``strategy.reduce(t, reduce_op="sum")``).
        rank, world_size: this process and the group size; used for unsharded loaders.
        task_names: names for error messages.
        unsharded: tasks whose loader holds the full test set on every rank (rank 0 counts).
        stage: passed to each scorer's optional ``set_task(task_id, stage)`` before its task:
            ``-1`` for the untrained baseline, ``i`` for stage ``i`` (or an evaluation inside it),
            ``None`` when the evaluation is not tied to a stage.
        lockstep: run the ranks' forward passes in step; ``None``: each its own batches only.
        progress: told the number of batches (``start``), then each batch scored (``advance``):
            see [`EvaluationProgress`][continual_eval.evaluation.EvaluationProgress]; ``None``:
            nothing is reported.
        item_scorers: the positions (in the scorers given) of the scorers whose per-item values
            are kept and gathered across ranks by each item's position in its test set
            (``TaskEvaluation.items_by_scorer``; two more sum-reductions; see
            `continual_eval.evaluation._item_gather`): each must be a mean over items
            (`item_support`), and every loader must read its samples in a fixed order (a
            sequential sampler, one of `shard_dataloader`'s shards, an iterable dataset read in
            the same order every time).

    Returns:
        [`TaskEvaluation`][continual_eval.evaluation.TaskEvaluation], the same on every rank:
        ``scores_by_scorer`` aligned with the scorers, ``scores`` the first scorer's.

    Raises:
        EvaluationError: naming the task (index and name) and its test dataloader, on every rank
            together after the task's counts are reduced (see the module docstring), or at once
            on the rank that met an output of the wrong structure or shape.
        TypeError, ValueError: ``scorers`` that
        [`make_scorer`][continual_eval.evaluation.make_scorer] refuses.
    """
    scorer_list = _resolve_scorers(scorer, scorers)
    device = torch.device(device) if device is not None else _module_device(module)
    label = partial(_label, dataloaders, list(task_names or []))
    counted = {j for j in task_ids if world_size <= 1 or j not in unsharded or rank == 0}
    iterated = list(task_ids) if lockstep is not None else [j for j in task_ids if j in counted]
    forward = _Forward(module, device, step, forward_context, convert_input)
    tally = _Tally(scorer_list, device, all_reduce, rank, world_size, label)
    recorded = _item_scorers(scorer_list, item_scorers)
    tally.item_scorers, tally.items = recorded, [[] for _ in recorded]
    labelled = [i for i in recorded if getattr(scorer_list[i], "keep_labels", False) is True]
    tally.label_scorers, tally.labels = labelled, [[] for _ in labelled]
    batch_scorers = _BatchScorers(scorer_list, all_reduce)
    output_scorers = [s for s in scorer_list if s not in batch_scorers.scorers]
    with preserve_rng_state(device), preserve_training_flags(module), grad_context():
        sources = _batch_sources(dataloaders, iterated, device)
        plans = {} if lockstep is None else _plans(sources, task_ids, lockstep, device, label)
        if progress is not None:
            progress.start(_total_batches(sources))
        for j in task_ids:
            _start_task(scorer_list, j, stage, device)
            watch = _OutputWatch()
            if j in sources:
                feed = _TaskFeed(output_scorers, watch) if j in counted else None
                try:
                    _run_task(
                        forward,
                        j,
                        sources[j],
                        feed,
                        plans.get(j),
                        lockstep,
                        batch_scorers,
                        progress,
                    )
                except EvaluationError as err:
                    raise EvaluationError(f"{label(j)}: {err}") from err
            if batch_scorers.scorers:  # on every rank, with or without batches of this task
                try:
                    batch_scorers.end(forward)
                except EvaluationError as err:
                    raise EvaluationError(f"{label(j)}: {err}") from err
            tally.add(j, watch)
    evaluation = tally.finish(task_ids)
    if not recorded:
        return evaluation
    # the labels of the scorers that keep them: more rows of the same gather (float64: exact)
    items = gather_items(
        [*tally.items, *tally.labels],
        [bool(scorer_list[i].items_binary) for i in recorded]  # type: ignore[attr-defined]
        + [False] * len(labelled),
        list(task_ids),
        unsharded=unsharded,
        all_reduce=all_reduce,
        rank=rank,
        world_size=world_size,
        device=device,
        label=label,
    )
    by_scorer: list[tuple[Tensor, ...] | None] = [None] * len(scorer_list)
    for i, values in zip(recorded, items[: len(recorded)], strict=True):
        by_scorer[i] = tuple(values)
    if not labelled:
        return dataclasses.replace(evaluation, items_by_scorer=tuple(by_scorer))
    labels: list[tuple[Tensor, ...] | None] = [None] * len(scorer_list)
    for i, values in zip(labelled, items[len(recorded) :], strict=True):
        labels[i] = tuple(v.round().long() for v in values)
    return dataclasses.replace(
        evaluation, items_by_scorer=tuple(by_scorer), labels_by_scorer=tuple(labels)
    )


def _item_scorers(scorers: Sequence[Scorer], wanted: Collection[int]) -> list[int]:
    """The scorers whose items are kept (checked by `item_support`), their ``keep_items``
    set; every other scorer's ``keep_items`` (where it has one) cleared."""
    recorded = sorted({int(i) for i in wanted})
    for i in recorded:
        if not 0 <= i < len(scorers):
            raise ValueError(f"item_scorers: {i} is no scorer position (0..{len(scorers) - 1})")
        problem = item_support(scorers[i])
        if problem is not None:
            raise TypeError(f"{scorer_label(scorers[i])} keeps no per-item values: {problem}")
    for i, s in enumerate(scorers):
        if i in recorded or hasattr(s, "keep_items"):
            s.keep_items = i in recorded  # type: ignore[attr-defined]
    return recorded


def _total_batches(sources: dict[int, _TaskSource]) -> int | None:
    """The batches of every task read, ``None`` when a loader's length is unknown."""
    lengths = [source.length for source in sources.values()]
    return None if None in lengths else sum(length or 0 for length in lengths)


def _label(dataloaders: Sequence[Any], names: Sequence[str], j: int) -> str:
    """``task 3 ('cars'), test dataloader 3``: task ``j`` in error messages."""
    return _loader_label(dataloaders[j], j, names[j] if j < len(names) else None)


def _module_device(module: nn.Module) -> torch.device:
    for p in module.parameters():
        return p.device
    for b in module.buffers():
        return b.device
    return torch.device("cpu")

r"""Class-incremental scorers: task-aware and task-agnostic accuracy from one forward pass.

A class-incremental model has one output per class id (a single growing head, ``C`` logits);
task ``j`` brings the classes ``task_classes[j]``. The two scorers here restrict the argmax of the
same logits in the two ways of Masana et al., "Class-incremental learning: survey and performance
evaluation" (TPAMI 2022), the functions of
`continual_eval.functional.class_incremental` applied batch by batch:

* [`TaskAwareAccuracyScorer`][]
  (``acc_task_aware``, task-IL): ``R[i, j]`` is the accuracy on task ``j``'s test set with the
  argmax over task ``j``'s classes only (the task is known at test time; Mammoth's
  ``mask_classes``). It does not depend on the stage ``i``.
* [`TaskAgnosticAccuracyScorer`][]
  (``acc_task_agnostic``, class-IL): ``R[i, j]`` is the accuracy on task ``j``'s test set with the
  argmax over the classes of the tasks ``<= max(i, j)``. For ``j <= i`` (the seen tasks, every cell
  the usual metrics read but FWT) that is exactly the classes seen so far, Masana et al.'s class-IL
  accuracy and Mammoth's ``argmax(outputs[:, :n_seen_classes])``. For a task not trained yet
  (``j > i``) its own classes (and those of the tasks before it) are allowed too: restricted to the
  seen classes, a future task's samples could never be right, so ``R[i, j] = 0`` for every ``j > i``
  by construction and forward transfer would be meaningless. The untrained baseline uses ``i = -1``:
  the tasks ``<= j``. ``all_outputs=True`` takes the argmax over every output instead (a plain
  ``logits.argmax(1)``, whatever the stage).

Ties go to the first maximum in class-id order among the allowed classes, as
`torch.argmax` breaks them.

Both are count-based and batch-additive (integer counts, summed exactly across ranks by the
loop's reduction). The evaluation loop calls ``set_task(j, stage)`` right after
``start(device)`` (``evaluate_tasks(..., stage=i)``; ``-1`` for the untrained baseline); the
task-agnostic scorer reads the stage from it (``None``: ``-1``). The task-agnostic scorer also
counts its predictions in a confusion matrix: the rows of task ``j``'s classes (true class, in
``task_classes[j]``'s order) by predicted class id, ``[max_k |task_classes[k]|, C]`` int64 per
task, accumulated on the device with one `torch.bincount` per update and appended to its
local counts after the problem counts (see ``num_problems`` in
[`Scorer`][continual_eval.evaluation.Scorer]), so it reduces exactly with the same collective; its
[`TaskAgnosticAccuracyScorer.details`][]
turns the reduced counts into the blocks, which the loop returns in `details_by_scorer`.

Targets are checked as by the built-in accuracy scorer (class indices, whole-number floats, or
one-hot/probability rows), and also against the task: a target that is not one of
``task_classes[j]`` is counted and reported after the task, naming it and its test dataloader
(``task_classes`` does not match the test sets). A model returning fewer class scores than the
largest class id of ``task_classes`` is an error at its first batch, naming the class and its task.

``task_classes_from_loaders`` reads ``task_classes`` off the test loaders (the sorted label set of
each, one pass).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

from continual_eval.evaluation.errors import EvaluationError
from continual_eval.evaluation.scorers import _LabelScorer
from continual_eval.functional.class_incremental import TaskClasses, check_task_classes

_T = TypeVar("_T")

__all__ = [
    "AGNOSTIC_NAME",
    "AWARE_NAME",
    "TaskAgnosticAccuracyScorer",
    "TaskAwareAccuracyScorer",
    "task_classes_from_loaders",
]

#: the matrix name (and scorer ``name``) of
#: [`TaskAwareAccuracyScorer`][]
AWARE_NAME = "acc_task_aware"
#: the matrix name (and scorer ``name``) of
#: [`TaskAgnosticAccuracyScorer`][]
AGNOSTIC_NAME = "acc_task_agnostic"

_NOT_IN_TASK = (
    "{n} targets are not classes of this task: task_classes lists other class ids for it; does "
    "task_classes match the test dataloaders (the same task order and class ids)?"
)


def _as_task_classes(task_classes: Any) -> tuple[TaskClasses, list[list[int]]]:
    """``check_task_classes`` of ``task_classes`` and the lists as plain ints."""
    checked = check_task_classes(task_classes)
    order, bounds = checked.order.tolist(), checked.boundaries.tolist()
    lists = [order[bounds[j] : bounds[j + 1]] for j in range(checked.num_tasks)]
    return checked, lists


class _ClassIncrementalScorer(_LabelScorer):
    """The label handling of the built-in accuracy scorer, with the argmax restricted to a set of
    class ids chosen per task (and stage); counts targets outside the task's classes."""

    name: str
    higher_is_better = True
    bounds = (0.0, 1.0)
    count_based = True
    batch_additive = True
    needs_class_scores = True
    target_problems: tuple[str, ...] = (*_LabelScorer.target_problems, _NOT_IN_TASK)

    def __init__(self, task_classes: Any) -> None:
        self.task_classes, self.class_lists = _as_task_classes(task_classes)
        #: ``C``: every class id is below it (the largest id + 1)
        self.num_class_ids = self.task_classes.num_classes
        #: the most classes of one task (the rows of a task's confusion block)
        self.max_task_classes = max(len(c) for c in self.class_lists)
        self._task: int | None = None
        #: the stage of the evaluation (``-1``: the untrained baseline), from `set_task`
        self.stage = -1
        self._cache: dict[tuple[Any, ...], Any] = {}

    @property
    def num_problems(self) -> int:
        """Entries after ``[value, total]`` of `local_counts` that are problem counts."""
        return len(self.target_problems)

    @property
    def num_tasks(self) -> int:
        """``T``, the tasks of ``task_classes``."""
        return len(self.class_lists)

    # ------------------------------------------------------------------ protocol
    #: with ``keep_items``: also keep each sample's label (`local_item_labels`), gathered by
    #: the loop beside the items (set by the callback for the baseline evaluation only: the
    #: test items' classes, recorded once for the per-class intervals)
    keep_labels = False

    def start(self, device: torch.device) -> None:
        super().start(device)
        self._task = None
        self._outside: list[Tensor] = []
        self._labels: list[Tensor] = []

    def local_item_labels(self) -> Tensor:
        """Every sample's label on this rank since `start`, in the order fed (int64; the
        samples of `local_items`), kept while ``keep_items`` and ``keep_labels`` are set."""
        if not self._labels:
            return torch.zeros(0, dtype=torch.int64, device=self._device)
        labels = self._labels[0] if len(self._labels) == 1 else torch.cat(self._labels)
        return labels.long()

    def set_task(self, task: int, stage: int | None = None) -> None:
        """The task whose test set the next updates score and the evaluation's stage (``-1``
        for the untrained baseline; ``None``: ``-1``), called by the evaluation loop."""
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < self.num_tasks:
            raise EvaluationError(
                f"{self.name}: task {task!r} is not a task of task_classes (0 .. "
                f"{self.num_tasks - 1}); give one class-id list per test dataloader"
            )
        if stage is not None and (isinstance(stage, bool) or not isinstance(stage, int)):
            raise EvaluationError(f"{self.name}: stage must be an int or None, got {stage!r}")
        if stage is not None and stage < -1:
            raise EvaluationError(f"{self.name}: stage must be >= -1, got {stage}")
        self._task = task
        self.stage = -1 if stage is None else stage

    def local_counts(self) -> Tensor:
        """``[correct, total, out_of_range, not_whole, not_distribution, not_in_task]`` (int64);
        the task-agnostic scorer appends its confusion block."""
        outside = self._sum(self._outside)
        return torch.cat([super().local_counts(), outside.reshape(1)])

    def result(self, reduced_counts: Tensor) -> Tensor:
        correct, total = reduced_counts[..., 0], reduced_counts[..., 1]
        return correct.double() / total.double()

    # ------------------------------------------------------------------ helpers
    def _cached(self, key: tuple[Any, ...], make: Callable[[], _T]) -> _T:
        """A device tensor made once per device and key (small lookups of class ids)."""
        full = (self._device, *key)
        if full not in self._cache:
            self._cache[full] = make()
        value: _T = self._cache[full]
        return value

    def _allowed(self, limit: int) -> tuple[Tensor, tuple[int, int] | None]:
        """The class ids of the tasks ``<= limit`` (``limit = -2``: task ``self._task`` only) as a
        sorted device tensor, and ``(first, end)`` when they are the contiguous range
        ``first .. end - 1`` (then a slice of the scores needs no copy)."""

        def make() -> tuple[Tensor, tuple[int, int] | None]:
            if limit == -2:
                assert self._task is not None
                ids = sorted(self.class_lists[self._task])
            else:  # a stage past the last task (an evaluation after the run): every task
                tasks = range(min(limit, self.num_tasks - 1) + 1)
                ids = sorted(c for k in tasks for c in self.class_lists[k])
            span = (ids[0], ids[-1] + 1) if ids[-1] - ids[0] + 1 == len(ids) else None
            return torch.tensor(ids, dtype=torch.long, device=self._device), span

        return self._cached(("allowed", limit, self._task if limit == -2 else None), make)

    def _rows(self) -> Tensor:
        """``[C + 2]`` long: the position of each label in ``class_lists[task]`` (a confusion
        row), ``max_task_classes`` for a label of no class of the task; index ``label + 1``, with
        labels clamped into ``[-1, C]`` first."""
        task = self._task
        assert task is not None

        def make() -> Tensor:
            rows = torch.full((self.num_class_ids + 2,), self.max_task_classes, dtype=torch.long)
            ids = torch.tensor(self.class_lists[task], dtype=torch.long)
            rows[ids + 1] = torch.arange(len(ids))
            return rows.to(self._device)

        return self._cached(("rows", task), make)

    def _flatten(self, preds: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """``preds [N, C, ...]`` as ``[M, C]`` score rows and the labels as ``[M]``."""
        if self._task is None:
            raise EvaluationError(
                f"{self.name} scores a task's samples against that task's classes: call "
                "set_task(j, stage) after start() (evaluate_tasks does)"
            )
        width = preds.shape[1]
        if width < self.num_class_ids:
            ids = [(c, k) for k, cs in enumerate(self.class_lists) for c in cs if c >= width]
            c, k = max(ids)
            raise EvaluationError(
                f"the model returned {width} class scores per sample, but task_classes names "
                f"class {c} (task {k}); every class id must be below the number of outputs "
                f"(here 0 .. {width - 1})"
            )
        scores = preds if preds.ndim == 2 else preds.movedim(1, -1).reshape(-1, width)
        return scores, labels.reshape(-1)

    def _argmax(self, scores: Tensor, allowed: tuple[Tensor, tuple[int, int] | None]) -> Tensor:
        """The first maximum over the allowed classes, as class ids."""
        ids, span = allowed
        if span is not None:
            return scores[:, span[0] : span[1]].argmax(1) + span[0]
        return ids[scores.index_select(1, ids).argmax(1)]

    def _task_rows(self, labels: Tensor) -> Tensor:
        """Each label's row in the task's confusion block (``max_task_classes``: not a class of
        the task); counts those outside the task."""
        rows = self._rows()[labels.clamp(-1, self.num_class_ids) + 1]
        self._outside.append((rows == self.max_task_classes).sum())
        return rows

    def _predict(self, scores: Tensor) -> Tensor:
        raise NotImplementedError

    def _batch_items(self, preds: Tensor, target: Tensor, labels: Tensor, mode: str) -> Tensor:
        """Each score row's correctness (``[M]`` bool, in the order fed): the per-item records
        of ``item_records=``; their sum is `_batch_value`."""
        scores, flat = self._flatten(preds, labels)
        pred = self._predict(scores)
        self._count(self._task_rows(flat), pred)
        if self.keep_labels:
            self._labels.append(flat)
        return pred == flat

    def _batch_value(self, preds: Tensor, target: Tensor, labels: Tensor, mode: str) -> Tensor:
        return self._batch_items(preds, target, labels, mode).sum()

    def _count(self, rows: Tensor, pred: Tensor) -> None:
        """Hook: accumulate the confusion counts of a batch (nothing here)."""


class TaskAwareAccuracyScorer(_ClassIncrementalScorer):
    """Task-aware (task-IL) accuracy, matrix ``acc_task_aware``: ``R[i, j]`` is the accuracy on
    task ``j``'s test set with the argmax over ``task_classes[j]`` only (the first maximum in
    class-id order), `task_aware_predictions`
    batch by batch. The same restriction at every stage, the baseline included.

    Args:
        task_classes: one list of class ids per task (checked by
            [`check_task_classes`][continual_eval.functional.class_incremental.check_task_classes]:
            no empty
            task, no negative id, no class in two tasks).
        check_targets: count the targets outside the task's classes (``False`` where a
            task-agnostic scorer of the same evaluation counts them already, as
            ``ContinualEvalCallback`` pairs them).
    """

    name = AWARE_NAME

    def __init__(self, task_classes: Any, *, check_targets: bool = True) -> None:
        super().__init__(task_classes)
        if not isinstance(check_targets, bool):
            raise TypeError(f"check_targets must be True or False, got {check_targets!r}")
        self.check_targets = check_targets

    def _predict(self, scores: Tensor) -> Tensor:
        return self._argmax(scores, self._allowed(-2))

    def _batch_items(self, preds: Tensor, target: Tensor, labels: Tensor, mode: str) -> Tensor:
        scores, flat = self._flatten(preds, labels)
        pred = self._predict(scores)
        if self.check_targets:
            self._task_rows(flat)
        if self.keep_labels:
            self._labels.append(flat)
        return pred == flat


class TaskAgnosticAccuracyScorer(_ClassIncrementalScorer):
    """Task-agnostic (class-IL) accuracy, matrix ``acc_task_agnostic``: ``R[i, j]`` is the
    accuracy on task ``j``'s test set with the argmax over the classes of the tasks ``<= max(i,
    j)`` (the seen classes for ``j <= i``; see the module docstring for why a future task ``j >
    i`` brings its own), ``i`` the stage the loop passes to `set_task` (``-1``, the
    baseline, when none). ``all_outputs=True``: the argmax over every output.

    Also counts the confusion of its predictions, per task scored: ``[K, C]`` int64, ``K`` the
    most classes of a task, row ``r`` the true class ``task_classes[j][r]``, column the predicted
    class id (rows past task ``j``'s class count stay 0). The counts follow the accuracy counts in
    [`local_counts`][], so the loop
    sums them across ranks exactly;
    [`details`][]
    gives the reduced
    blocks of the tasks scored, ``[tasks, K, C]``. With ``confusion=False`` nothing is counted (one
    accuracy alone).

    Args:
        task_classes: one list of class ids per task.
        all_outputs: predict among all outputs instead of the allowed tasks' classes. With the
            confusion counts on, the model must then return exactly ``C`` outputs (the largest
            class id + 1), so that every prediction is a column of the matrix.
        confusion: count the confusion matrix (default ``True``).
    """

    name = AGNOSTIC_NAME

    def __init__(
        self, task_classes: Any, *, all_outputs: bool = False, confusion: bool = True
    ) -> None:
        super().__init__(task_classes)
        for option, value in (("all_outputs", all_outputs), ("confusion", confusion)):
            if not isinstance(value, bool):
                raise TypeError(f"{option} must be True or False, got {value!r}")
        self.all_outputs = all_outputs
        self.confusion = confusion

    def start(self, device: torch.device) -> None:
        super().start(device)
        self._conf: Tensor | None = None

    def _predict(self, scores: Tensor) -> Tensor:
        if self.all_outputs:
            if self.confusion and scores.shape[1] != self.num_class_ids:
                raise EvaluationError(
                    f"{self.name} with all_outputs=True counts every prediction in a "
                    f"{self.num_class_ids}-class confusion matrix (task_classes' class ids "
                    f"0 .. {self.num_class_ids - 1}), but the model returned {scores.shape[1]} "
                    "outputs; give task_classes covering every output, or confusion=False"
                )
            return scores.argmax(1)
        assert self._task is not None
        return self._argmax(scores, self._allowed(max(self.stage, self._task)))

    def _count(self, rows: Tensor, pred: Tensor) -> None:
        if not self.confusion:
            return
        width = self.num_class_ids
        size = (self.max_task_classes + 1) * width  # the last row: targets outside the task
        counts = torch.bincount(rows * width + pred, minlength=size)
        self._conf = counts if self._conf is None else self._conf + counts

    def local_counts(self) -> Tensor:
        """``[correct, total, out_of_range, not_whole, not_distribution, not_in_task,
        *confusion]`` (int64): ``confusion`` the ``[K, C]`` block flattened row-major (absent
        with ``confusion=False``)."""
        counts = super().local_counts()
        if not self.confusion:
            return counts
        size = self.max_task_classes * self.num_class_ids
        if self._conf is None:
            block = torch.zeros(size, dtype=torch.int64, device=self._device)
        else:
            block = self._conf[:size]
        return torch.cat([counts, block.to(counts.device)])

    def details(self, reduced_counts: Tensor) -> Tensor | None:
        """The reduced confusion blocks of the tasks scored, ``[tasks, K, C]`` int64 (CPU), in
        the order of the counts' rows (the evaluation's task order); ``None`` with
        ``confusion=False``."""
        if not self.confusion:
            return None
        start = 2 + self.num_problems
        blocks = reduced_counts[:, start:].to("cpu", torch.int64)
        return blocks.reshape(-1, self.max_task_classes, self.num_class_ids)


def _labels(batch: Any, loader: int) -> Tensor:
    """The integer labels of one ``(x, y, ...)`` batch (one-hot rows read as their argmax)."""
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        raise TypeError(
            f"test dataloader {loader}: task_classes_from_loaders reads (x, y) or (x, y, t) "
            f"batches, got {type(batch).__name__}; give task_classes explicitly"
        )
    y = batch[1]
    if not isinstance(y, Tensor):
        y = torch.as_tensor(y)
    if y.is_floating_point():
        if y.ndim == 2:
            return y.argmax(1)
        if bool((y.frac() != 0).any()):
            raise ValueError(
                f"test dataloader {loader}: labels that are not whole numbers; give task_classes "
                "explicitly"
            )
    return y.reshape(-1).long()


def task_classes_from_loaders(test_loaders: Sequence[Any]) -> list[list[int]]:
    """``task_classes`` read from the test sets: the sorted label set of each test loader (one
    pass over each, through the evaluation's fast path for tensor datasets).

    Raises ``ValueError`` for a loader without a sample, for a negative label, and for a class
    found in two test sets (as
    [`check_task_classes`][continual_eval.functional.class_incremental.check_task_classes]
    words it); ``TypeError`` for batches that are not ``(x, y, ...)``.

    Example:
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> x = torch.zeros(4, 2)
        >>> loaders = [DataLoader(TensorDataset(x, torch.tensor([1, 0, 1, 0]))),
        ...            DataLoader(TensorDataset(x, torch.tensor([3, 2, 2, 2])))]
        >>> task_classes_from_loaders(loaders)
        [[0, 1], [2, 3]]
    """
    from continual_eval.evaluation.fast_path import fast_loader

    found: list[list[int]] = []
    for j, loader in enumerate(test_loaders):
        uniques = [torch.unique(_labels(batch, j)) for batch in fast_loader(loader)]
        labels = torch.unique(torch.cat(uniques)) if uniques else torch.zeros(0)
        if labels.numel() == 0:
            raise ValueError(f"test dataloader {j} yielded no sample; it has no classes")
        found.append([int(c) for c in labels.tolist()])
    check_task_classes(found)
    return found

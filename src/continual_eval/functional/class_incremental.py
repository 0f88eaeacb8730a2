r"""Class-incremental evaluation: predictions, confusion counts and per-class measures.

Each training stage ``i`` adds the classes of task ``i``; the model has one output per class id
(``C`` outputs in all). The two evaluation settings of Masana et al., "Class-incremental learning:
survey and performance evaluation" (TPAMI 2022), written as argmax restrictions:

* *task-aware* (task-IL): a test sample of task ``j`` is predicted among task ``j``'s classes only
  (the task is known at test time: task ``j``'s head), `task_aware_predictions`. This is
  Mammoth's ``mask_classes(outputs, dataset, j)`` (every output outside task ``j``'s block set to
  ``-inf``) for any class-to-task assignment, not only contiguous blocks.
* *task-agnostic* (class-IL): after stage ``i`` a sample is predicted among the classes of all
  tasks ``<= i`` (the classes seen so far), `task_agnostic_predictions`; Mammoth's
  class-IL accuracy ``argmax(outputs[:, :n_seen_classes])``. ``all_outputs=True`` takes the
  argmax over every output instead (a plain ``logits.argmax(-1)``).

Both break ties as `torch.argmax` does: the first maximum, in class-id order, among the
allowed classes; a NaN logit among them is the maximum (as in `torch.argmax`).

Inputs and conventions (zero-based; ``C`` classes, ``T`` tasks, ``S`` stages):

* ``class_task``: ``[C]`` integer tensor, the task of each class id, ``-1`` for a class of no task;
  made (with validation) by [`check_task_classes`][].
  Class ``c`` is *seen* at stage ``i`` when ``0 <= class_task[c] <= i``; it is *new* at stage ``i``
  when ``class_task[c] == i`` and *old* when ``class_task[c] < i``.
* ``confs``: integer confusion counts, ``[S, C, C]`` (one matrix per stage) or one ``[C, C]``
  matrix, dense or a sparse COO tensor (`torch.sparse_coo_tensor`, e.g.
  [`ClassIncrementalResults.confusion`][continual_eval.results.ClassIncrementalResults]): the
  measures of a sparse one are computed from its nonzero cells alone (``O(nnz + S * C)``, no dense
  ``[S, C, C]`` temporary) and equal those of its dense form. ``confs[k, c, p]`` counts the test
  samples of true class ``c`` predicted as class ``p`` after training stage ``first_stage + k``
  (``first_stage`` is ``0`` unless given; a single ``[C, C]`` matrix is the stage ``first_stage``,
  and the stage dimension is then dropped from the result). Count *all* test samples of the tasks
  evaluated at that stage, predicted with `task_agnostic_predictions` for that stage;
  [`confusion_counts`][continual_eval.functional.confusion_counts] makes one matrix. Rows of classes
  not seen yet (future tasks evaluated, e.g. for forward transfer) may be present: every seen-class
  measure ignores them.
* Results are ``float64`` (a ratio of counts, correctly rounded), on ``confs``' device.
* Undefined values are NaN, never 0: the accuracy of a class or task with no test sample at that
  stage, a class not seen yet, the old-class accuracy at stage 0, the forgetting of a class with
  no measurement before the final stage. Means over classes or tasks skip NaN entries (and are
  NaN when nothing is left); means over *stages* do not (a stage without a defined value makes
  the mean NaN).

Seen-class accuracy comes in two weightings (``weighting``):

* ``"sample"`` (iCaRL, PyCIL: accuracy on the union of the seen tasks' test sets):
  ``sum_{j<=i} correct[i, j] / sum_{j<=i} n[i, j]``;
* ``"task"`` (the mean of the class-IL accuracy matrix's row, as `accuracy_matrix` averages):
  ``(1/|J|) sum_{j in J} R[i, j]`` with ``R[i, j] = correct[i, j] / n[i, j]`` and ``J`` the tasks
  ``j <= i`` with a test sample at stage ``i``.

They agree when every seen task has the same number of test samples; otherwise the larger test
sets weigh more in ``"sample"``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch
from torch import Tensor

from continual_eval.functional._validation import check_forgetting_convention

#: the accepted values of ``weighting``: per test sample, or per task
SEEN_WEIGHTINGS = ("sample", "task")

_NAN = math.nan


class TaskClasses(NamedTuple):
    """The class-to-task assignment, normalised by
    [`check_task_classes`][].

    Attributes:
        class_task: ``[C]`` long, the task of each class id; ``-1`` for a class of no task.
        order: ``[C]`` long, the class ids in arrival order: task 0's classes as listed, then task
            1's, ..., then the classes of no task in increasing id order.
        boundaries: ``[T + 1]`` long offsets into ``order``: task ``j``'s classes are
            ``order[boundaries[j]:boundaries[j + 1]]``; ``order[boundaries[T]:]`` are the classes
            of no task.
    """

    class_task: Tensor
    order: Tensor
    boundaries: Tensor

    @property
    def num_tasks(self) -> int:
        """``T``, the number of tasks."""
        return self.boundaries.numel() - 1

    @property
    def num_classes(self) -> int:
        """``C``, the number of class ids (outputs)."""
        return self.class_task.numel()


class OldNewAccuracy(NamedTuple):
    """Per-stage accuracy on the old classes (tasks ``< i``) and the new ones (task ``i``)."""

    old: Tensor
    new: Tensor


class RecencyBias(NamedTuple):
    """Per-stage share of the seen-class test samples predicted as a class of the newest task,
    and that task's share of those samples (the unbiased reference)."""

    prediction_share: Tensor
    sample_share: Tensor


# --------------------------------------------------------------------------------------------
# validation


def _is_integer(t: Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"{x.dtype} {tuple(x.shape)}"
    return type(x).__name__


def _class_ids(task: int, classes: object) -> list[int]:
    """One task's class ids as Python ints; errors name the task."""
    if isinstance(classes, Tensor):
        if classes.ndim != 1 or not _is_integer(classes):
            raise TypeError(
                f"task {task}: classes must be a 1-D integer tensor, got {_describe(classes)}"
            )
        return [int(v) for v in classes.tolist()]
    if isinstance(classes, (str, bytes)) or not isinstance(classes, Iterable):
        raise TypeError(
            f"task {task}: expected a sequence of class ids, got {type(classes).__name__}"
        )
    ids: list[int] = []
    for value in classes:
        if isinstance(value, Tensor) and value.ndim == 0 and _is_integer(value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"task {task}: class id {value!r} is not an integer")
        ids.append(int(value))
    return ids


def check_task_classes(
    task_classes: Iterable[Iterable[int]] | Tensor,
    num_classes: int | None = None,
    *,
    device: torch.device | str | None = None,
) -> TaskClasses:
    """Validate one list of class ids per task and normalise it.

    Every task must list at least one class; class ids are integers ``>= 0`` (and
    ``< num_classes`` when given); no id may appear twice in a task or in two tasks. Errors are
    ``ValueError`` (``TypeError`` for a non-integer id) naming the task and the class. Classes
    in ``range(num_classes)`` that no task lists belong to no task (``class_task == -1``).

    Args:
        task_classes: ``task_classes[j]`` lists task ``j``'s class ids (lists, tuples, 1-D
            integer tensors; a ``[T, K]`` tensor gives ``T`` tasks of ``K`` classes).
        num_classes: ``C``, the number of outputs; default ``max id + 1``.
        device: where the returned tensors live (default CPU).

    Returns:
        `TaskClasses` ``(class_task [C], order [C], boundaries [T + 1])``.

    Example:
        >>> tc = check_task_classes([[3, 0], [1, 4]], num_classes=6)
        >>> tc.class_task.tolist(), tc.order.tolist(), tc.boundaries.tolist()
        ([0, 1, -1, 0, 1, -1], [3, 0, 1, 4, 2, 5], [0, 2, 4])
        >>> check_task_classes([[0, 1], [1, 2]])
        Traceback (most recent call last):
        ...
        ValueError: class 1 is in task 0 and in task 1; a class belongs to one task
    """
    if num_classes is not None and (
        isinstance(num_classes, bool)
        or not isinstance(num_classes, numbers.Integral)
        or num_classes < 1
    ):
        raise ValueError(f"num_classes must be a positive integer or None, got {num_classes!r}")
    if isinstance(task_classes, (str, bytes)) or not isinstance(task_classes, Iterable):
        raise TypeError(
            "task_classes must be a sequence of per-task class-id lists, "
            f"got {type(task_classes).__name__}"
        )
    owner: dict[int, int] = {}
    arrival: list[int] = []
    sizes: list[int] = []
    for task, classes in enumerate(task_classes):
        ids = _class_ids(task, classes)
        if not ids:
            raise ValueError(f"task {task} has no classes; every task needs at least one class id")
        for c in ids:
            if c < 0:
                raise ValueError(f"task {task}: class id {c} is negative; class ids are >= 0")
            if num_classes is not None and c >= num_classes:
                raise ValueError(
                    f"task {task}: class id {c} >= num_classes = {num_classes}; "
                    f"class ids are 0 .. {num_classes - 1}"
                )
            if c in owner:
                if owner[c] == task:
                    raise ValueError(f"task {task} lists class {c} twice")
                raise ValueError(
                    f"class {c} is in task {owner[c]} and in task {task}; "
                    "a class belongs to one task"
                )
            owner[c] = task
        arrival.extend(ids)
        sizes.append(len(ids))
    if not sizes:
        raise ValueError("task_classes is empty; expected one list of class ids per task")
    size = int(num_classes) if num_classes is not None else max(owner) + 1
    ids_t = torch.tensor(arrival, dtype=torch.long)
    class_task = torch.full((size,), -1, dtype=torch.long)
    class_task[ids_t] = torch.repeat_interleave(
        torch.arange(len(sizes)), torch.tensor(sizes, dtype=torch.long)
    )
    order = torch.cat([ids_t, (class_task < 0).nonzero().flatten()])
    boundaries = torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(sizes).cumsum(0)])
    return TaskClasses(class_task.to(device), order.to(device), boundaries.to(device))


def _check_class_task(class_task: Tensor, num_classes: int, validate: bool) -> None:
    if (
        not isinstance(class_task, Tensor)
        or class_task.ndim != 1
        or not _is_integer(class_task)
        or class_task.shape[0] != num_classes
    ):
        raise ValueError(
            f"class_task must be an integer [C] = [{num_classes}] tensor (the task of each class "
            f"id, -1 for none; see check_task_classes), got {_describe(class_task)}"
        )
    if validate and num_classes:
        bad = class_task < -1
        if bool(bad.any()):
            c = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"class_task[{c}] = {int(class_task[c])}; task indices are >= 0 "
                "(-1: the class belongs to no task)"
            )


def _check_stage(name: str, stage: int) -> None:
    if isinstance(stage, bool) or not isinstance(stage, numbers.Integral) or stage < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {stage!r}")


def _check_weighting(weighting: str) -> None:
    if weighting not in SEEN_WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}; expected one of {SEEN_WEIGHTINGS}")


def _is_sparse(confs: Tensor) -> bool:
    return confs.layout == torch.sparse_coo


def _stack(confs: Tensor, validate: bool) -> tuple[Tensor, bool]:
    """``confs`` as ``[S, C, C]`` (a sparse COO one coalesced), and whether it was a single
    ``[C, C]`` matrix."""
    if (
        not isinstance(confs, Tensor)
        or confs.ndim not in (2, 3)
        or confs.shape[-1] != confs.shape[-2]
        or not _is_integer(confs)
        or confs.layout not in (torch.strided, torch.sparse_coo)
        or (_is_sparse(confs) and confs.dense_dim() != 0)
    ):
        raise ValueError(
            "confs must be integer confusion counts, [S, C, C] or one [C, C] matrix "
            f"(rows: true class, columns: predicted class), got {_describe(confs)}"
        )
    if _is_sparse(confs):
        return _sparse_stack(confs, validate)
    if validate and confs.numel():
        bad = confs < 0
        if bool(bad.any()):
            cell = tuple(int(v) for v in bad.nonzero()[0])
            index = ", ".join(map(str, cell))
            raise ValueError(f"confs[{index}] = {int(confs[cell])} is negative; counts are >= 0")
    single = confs.ndim == 2
    return (confs.unsqueeze(0) if single else confs), single


def _counts(
    confs: Tensor, class_task: Tensor | None, validate: bool
) -> tuple[Tensor, Tensor, bool]:
    """Per-stage, per-class ``(correct [S, C], total [S, C])`` as int64, and ``single``."""
    stack, single = _stack(confs, validate)
    if class_task is not None:
        _check_class_task(class_task, stack.shape[-1], validate)
    if _is_sparse(stack):
        correct, total = _sparse_counts(stack)
        return correct, total, single
    correct = stack.diagonal(dim1=-2, dim2=-1).long()
    total = stack.sum(-1, dtype=torch.long)
    return correct, total, single


def _sparse_stack(confs: Tensor, validate: bool) -> tuple[Tensor, bool]:
    """A sparse COO ``confs`` coalesced, as ``[S, C, C]``; negative counts refused (naming the
    cell) when ``validate``."""
    confs = confs.coalesce()
    if validate and confs._nnz():
        bad = confs.values() < 0
        if bool(bad.any()):
            n = int(bad.nonzero()[0, 0])
            cell = ", ".join(str(int(v)) for v in confs.indices()[:, n])
            raise ValueError(
                f"confs[{cell}] = {int(confs.values()[n])} is negative; counts are >= 0"
            )
    single = confs.ndim == 2
    if single:
        indices = torch.cat([confs.indices().new_zeros(1, confs._nnz()), confs.indices()])
        confs = _coo(indices, confs.values(), (1, *confs.shape))
    return confs, single


def _coo(indices: Tensor, values: Tensor, size: tuple[int, ...]) -> Tensor:
    """A coalesced sparse COO tensor of ``indices`` that are already sorted and distinct."""
    return torch.sparse_coo_tensor(indices, values, size, is_coalesced=True, check_invariants=False)


def _sparse_cells(stack: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(stage, true, predicted, count)`` of every stored cell of a coalesced sparse
    ``[S, C, C]`` (``[nnz]`` each, ``count`` int64)."""
    stage, true, pred = stack.indices()
    return stage, true, pred, stack.values().long()


def _sum_by(index: Tensor, count: Tensor, size: int) -> Tensor:
    """``out[k] = sum(count[index == k])``, ``[size]`` int64 (exact)."""
    return count.new_zeros(size).index_add_(0, index, count)


def _sparse_counts(stack: Tensor) -> tuple[Tensor, Tensor]:
    """``(correct [S, C], total [S, C])`` of a sparse ``[S, C, C]``: its diagonal and row sums,
    from the stored cells (``O(nnz + S * C)``)."""
    S, C = stack.shape[0], stack.shape[-1]
    stage, true, pred, count = _sparse_cells(stack)
    row = stage * C + true
    diagonal = true == pred
    total = _sum_by(row, count, S * C).view(S, C)
    correct = _sum_by(row[diagonal], count[diagonal], S * C).view(S, C)
    return correct, total


def _stages(num_stages: int, first_stage: int, device: torch.device) -> Tensor:
    """``[S, 1]``: the stage of each confusion matrix, as a column for broadcasting."""
    _check_stage("first_stage", first_stage)
    return torch.arange(first_stage, first_stage + num_stages, device=device).unsqueeze(-1)


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    """``num / den`` in float64, NaN where ``den == 0``."""
    value = num.to(torch.float64) / den.to(torch.float64)
    return torch.where(den > 0, value, _NAN)


def _num_tasks(class_task: Tensor) -> int:
    return int(class_task.max()) + 1 if class_task.numel() else 0


def _task_counts(
    correct: Tensor, total: Tensor, class_task: Tensor, num_tasks: int
) -> tuple[Tensor, Tensor]:
    """Sum per-class counts ``[S, C]`` into per-task counts ``[S, T]`` (classes of no task and
    of tasks ``>= num_tasks`` go to a dropped extra bucket)."""
    in_range = (class_task >= 0) & (class_task < num_tasks)
    bucket = torch.where(in_range, class_task.long(), num_tasks).expand_as(correct)
    shape = (correct.shape[0], num_tasks + 1)
    task_correct = correct.new_zeros(shape).scatter_add_(1, bucket, correct)[:, :num_tasks]
    task_total = total.new_zeros(shape).scatter_add_(1, bucket, total)[:, :num_tasks]
    return task_correct, task_total


def _group_accuracy(
    correct: Tensor,
    total: Tensor,
    class_task: Tensor,
    member: Callable[[Tensor], Tensor],
    weighting: str,
) -> Tensor:
    """Per-stage accuracy over the tasks ``t`` with ``member(t)`` (``[S, ...]`` boolean for task
    indices broadcast against the ``[S, 1]`` stages): pooled counts (``"sample"``) or the mean of
    the member tasks' accuracies that are defined (``"task"``)."""
    if weighting == "sample":
        classes = (class_task >= 0) & member(class_task.unsqueeze(0))  # [S, C]
        return _ratio((correct * classes).sum(-1), (total * classes).sum(-1))
    num_tasks = _num_tasks(class_task)
    task_acc = _ratio(*_task_counts(correct, total, class_task, num_tasks))  # [S, T]
    tasks = member(torch.arange(num_tasks, device=correct.device).unsqueeze(0))  # [S, T]
    return torch.nanmean(task_acc.masked_fill(~tasks, _NAN), dim=-1)


def _squeeze(value: Tensor, single: bool) -> Tensor:
    return value[0] if single else value


# --------------------------------------------------------------------------------------------
# predictions


def _check_logits(logits: Tensor, class_task: Tensor, validate: bool) -> None:
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.ndim < 1:
        raise ValueError(f"logits must be a floating [..., C] tensor, got {_describe(logits)}")
    _check_class_task(class_task, logits.shape[-1], validate)


def _as_index(name: str, value: int | Tensor, like: Tensor) -> Tensor:
    """A stage or task index (an int, or an integer tensor broadcastable to ``logits[..., 0]``)
    as a tensor with a trailing class dimension."""
    if isinstance(value, Tensor):
        if not _is_integer(value):
            raise ValueError(f"{name} must be an int or an integer tensor, got {value.dtype}")
        return value.to(like.device).unsqueeze(-1)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int or an integer tensor, got {value!r}")
    return torch.tensor(int(value), device=like.device)


def _masked_argmax(
    logits: Tensor, allowed: Tensor, index: Tensor, name: str, validate: bool
) -> Tensor:
    """The first maximum of ``logits`` over the ``allowed`` classes (boolean, broadcastable to
    ``logits``): exactly the argmax of the allowed sub-vector, mapped back to class ids.
    ``index``/``name`` (the task or stage asked for) only word the error of an empty choice."""
    allowed = allowed.expand(logits.shape)
    if validate and allowed.numel():
        empty = ~allowed.any(-1)
        if bool(empty.any()):
            at = tuple(int(v) for v in empty.nonzero()[0])
            value = int(index.expand(*logits.shape[:-1], 1)[at]) if at else int(index)
            where = f"sample {at[0] if len(at) == 1 else at}: " if at else ""
            seen = " (no class of a task <= stage)" if name == "stage" else ""
            raise ValueError(f"{where}{name} {value} has no class to predict{seen}")
    pred = logits.masked_fill(~allowed, -math.inf).argmax(-1)
    # all allowed logits -inf: argmax may have picked an earlier disallowed -inf; the first
    # maximum among the allowed classes is then the first allowed class
    first_allowed = allowed.to(torch.uint8).argmax(-1)
    picked_allowed = allowed.gather(-1, pred.unsqueeze(-1)).squeeze(-1)
    return torch.where(picked_allowed, pred, first_allowed)


def task_aware_predictions(
    logits: Tensor, class_task: Tensor, task: int | Tensor, *, validate: bool = True
) -> Tensor:
    """Task-aware (task-IL) predictions: the argmax over task ``task``'s classes only.

    ``pred[n] = argmax_{c: class_task[c] == task[n]} logits[n, c]`` (first maximum in class-id
    order), returned as class ids; Mammoth's ``mask_classes`` followed by an argmax. A sample is
    right when ``pred == target``; the predictions never leave the task, so a confusion matrix of
    them is block-diagonal.

    Args:
        logits: ``[..., C]`` floating outputs over all class ids.
        class_task: ``[C]`` the task of each class (`TaskClasses.class_task`).
        task: the task of every sample (int), or of each sample (integer tensor of
            ``logits.shape[:-1]``, e.g. ``[N]``).
        validate: check that every requested task has a class (one device read-back).

    Returns:
        ``[...]`` long class ids.

    Example:
        >>> class_task = torch.tensor([0, 0, 1, 1])
        >>> logits = torch.tensor([[0.0, 1.0, 5.0, 2.0], [3.0, 3.0, 0.0, 0.0]])
        >>> task_aware_predictions(logits, class_task, 0).tolist()  # a tie: the first maximum
        [1, 0]
        >>> task_aware_predictions(logits, class_task, torch.tensor([1, 1])).tolist()
        [2, 2]
    """
    _check_logits(logits, class_task, validate)
    index = _as_index("task", task, logits)
    allowed = class_task.to(logits.device) == index
    return _masked_argmax(logits, allowed, index, "task", validate)


def task_agnostic_predictions(
    logits: Tensor,
    class_task: Tensor,
    stage: int | Tensor,
    *,
    all_outputs: bool = False,
    validate: bool = True,
) -> Tensor:
    """Task-agnostic (class-IL) predictions after stage ``stage``: the argmax over the seen
    classes.

    ``pred[n] = argmax_{c: 0 <= class_task[c] <= stage} logits[n, c]`` (first maximum in class-id
    order), returned as class ids: Mammoth's class-IL ``argmax(outputs[:, :n_seen_classes])``
    for any assignment of classes to tasks (classes of no task are never predicted). With
    ``all_outputs=True``: ``logits.argmax(-1)`` over every output (future classes included).

    Args:
        logits: ``[..., C]`` floating outputs over all class ids.
        class_task: ``[C]`` the task of each class (`TaskClasses.class_task`).
        stage: the training stage just finished (int), or one per sample (integer tensor of
            ``logits.shape[:-1]``).
        all_outputs: predict among all ``C`` outputs instead of the seen classes.
        validate: check that some class is seen at ``stage`` (one device read-back).

    Returns:
        ``[...]`` long class ids.

    Example:
        >>> class_task = torch.tensor([0, 0, 1, 1])
        >>> logits = torch.tensor([[0.0, 1.0, 5.0, 2.0]])
        >>> task_agnostic_predictions(logits, class_task, 0).tolist()
        [1]
        >>> task_agnostic_predictions(logits, class_task, 1).tolist()
        [2]
    """
    _check_logits(logits, class_task, validate)
    if all_outputs:
        return logits.argmax(-1)
    index = _as_index("stage", stage, logits)
    class_task = class_task.to(logits.device)
    allowed = (class_task >= 0) & (class_task <= index)
    return _masked_argmax(logits, allowed, index, "stage", validate)


def confusion_counts(
    target: Tensor, pred: Tensor, num_classes: int, *, validate: bool = True
) -> Tensor:
    """The ``[C, C]`` int64 confusion matrix: ``conf[c, p] = #{n: target[n] == c, pred[n] == p}``.

    One `torch.bincount` of ``target * C + pred`` (exact integer counts; deterministic, no
    weights). Add the matrices of several batches to accumulate.

    Args:
        target: ``[N]`` integer true class ids.
        pred: ``[N]`` integer predicted class ids.
        num_classes: ``C``.
        validate: check that every id lies in ``[0, C)`` (one device read-back).

    Example:
        >>> confusion_counts(torch.tensor([0, 0, 1, 2]), torch.tensor([0, 1, 1, 1]), 3).tolist()
        [[1, 1, 0], [0, 1, 0], [0, 1, 0]]
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral):
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    for name, ids in (("target", target), ("pred", pred)):
        if not isinstance(ids, Tensor) or ids.ndim != 1 or not _is_integer(ids):
            raise ValueError(f"{name} must be a 1-D integer tensor, got {_describe(ids)}")
    if target.shape != pred.shape:
        raise ValueError(
            f"target and pred must have the same shape, got {tuple(target.shape)} "
            f"and {tuple(pred.shape)}"
        )
    target, pred = target.long(), pred.to(device=target.device, dtype=torch.long)
    if validate and target.numel():
        for name, ids in (("target", target), ("pred", pred)):
            bad = (ids < 0) | (ids >= num_classes)
            if bool(bad.any()):
                n = int(bad.nonzero()[0, 0])
                raise ValueError(
                    f"{name}[{n}] = {int(ids[n])} is not a class id in [0, {num_classes})"
                )
    flat = torch.bincount(target * num_classes + pred, minlength=num_classes * num_classes)
    return flat.reshape(num_classes, num_classes)


# --------------------------------------------------------------------------------------------
# measures from confusion counts


def per_class_accuracy(
    confs: Tensor,
    class_task: Tensor | None = None,
    *,
    first_stage: int = 0,
    validate: bool = True,
) -> Tensor:
    """Per-class accuracy ``conf[c, c] / sum_p conf[c, p]`` at each stage; ``[S, C]`` (``[C]``
    for one matrix).

    NaN where class ``c`` has no test sample at that stage and, when ``class_task`` is given,
    where ``c`` is not seen at that stage (its task is later, or it belongs to no task).

    Example:
        >>> conf = torch.tensor([[3, 1, 0], [0, 0, 0], [2, 0, 2]])
        >>> per_class_accuracy(conf).tolist()
        [0.75, nan, 0.5]
        >>> per_class_accuracy(conf, torch.tensor([0, 0, 1])).tolist()  # stage 0
        [0.75, nan, nan]
    """
    correct, total, single = _counts(confs, class_task, validate)
    if class_task is None:
        return _squeeze(_ratio(correct, total), single)
    stages = _stages(correct.shape[0], first_stage, correct.device)
    return _squeeze(_class_accuracy(correct, total, class_task.to(correct.device), stages), single)


def _class_accuracy(correct: Tensor, total: Tensor, class_task: Tensor, stages: Tensor) -> Tensor:
    """`per_class_accuracy` from the per-stage, per-class counts ``correct``/``total [S, C]``
    (``stages``: ``[S, 1]``): ``correct / total``, NaN where not seen or without a sample."""
    seen = (class_task >= 0) & (class_task <= stages)
    return _ratio(correct, total).masked_fill(~seen, _NAN)


def per_task_accuracy(
    confs: Tensor,
    class_task: Tensor,
    *,
    num_tasks: int | None = None,
    validate: bool = True,
) -> Tensor:
    """The task accuracy of each stage, ``R[i, j] = correct[i, j] / n[i, j]``; ``[S, T]`` (``[T]``
    for one matrix).

    ``correct[i, j]`` and ``n[i, j]`` sum the diagonal and the rows of ``confs[i]`` over task
    ``j``'s classes. With task-agnostic predictions this is the class-IL accuracy matrix (feed it
    to `accuracy_matrix`); every cell is as measured, unseen tasks included (their
    accuracy is 0 under the seen-class restriction, a task's classes never being predicted
    before it is trained). NaN where task ``j`` has no test sample at that stage.

    Args:
        confs: ``[S, C, C]`` or ``[C, C]`` counts.
        class_task: ``[C]`` the task of each class.
        num_tasks: ``T``; default ``class_task.max() + 1``.
        validate: check the counts and ``class_task`` (device read-backs).
    """
    correct, total, single = _counts(confs, class_task, validate)
    class_task = class_task.to(correct.device)
    if num_tasks is None:
        num_tasks = _num_tasks(class_task)
    _check_stage("num_tasks", num_tasks)
    return _squeeze(_ratio(*_task_counts(correct, total, class_task, num_tasks)), single)


def seen_accuracy(
    confs: Tensor,
    class_task: Tensor,
    *,
    weighting: str = "sample",
    first_stage: int = 0,
    validate: bool = True,
) -> Tensor:
    """Accuracy on the seen classes (tasks ``j <= i``) at each stage ``i``; ``[S]`` (a scalar for
    one matrix).

    ``"sample"``: ``sum_{j<=i} correct[i, j] / sum_{j<=i} n[i, j]``, NaN when no seen class has a
    test sample. ``"task"``: the mean of ``R[i, j]`` over the tasks ``j <= i`` that have a test
    sample (so ``(1/(i+1)) sum_{j<=i} R[i, j]`` when all have), NaN when none has.

    Example:
        >>> conf = torch.tensor([[9, 1, 0], [0, 0, 0], [0, 0, 0]])  # stage 0: 9/10
        >>> conf1 = torch.tensor([[5, 0, 5], [0, 0, 0], [0, 0, 2]])  # stage 1
        >>> class_task = torch.tensor([0, 0, 1])
        >>> seen_accuracy(torch.stack([conf, conf1]), class_task).tolist()  # 7/12
        [0.9, 0.5833333333333334]
        >>> seen_accuracy(torch.stack([conf, conf1]), class_task, weighting="task").tolist()
        [0.9, 0.75]
    """
    _check_weighting(weighting)
    correct, total, single = _counts(confs, class_task, validate)
    stages = _stages(correct.shape[0], first_stage, correct.device)
    class_task = class_task.to(correct.device)
    value = _group_accuracy(correct, total, class_task, lambda t: t <= stages, weighting)
    return _squeeze(value, single)


def last_accuracy(
    confs: Tensor,
    class_task: Tensor,
    *,
    weighting: str = "sample",
    first_stage: int = 0,
    validate: bool = True,
) -> Tensor:
    """The seen-class accuracy of the last stage given (``confs[-1]``, at stage
    ``first_stage + S - 1``): [`seen_accuracy`][] of the
    final model; a scalar."""
    value = seen_accuracy(
        confs, class_task, weighting=weighting, first_stage=first_stage, validate=validate
    )
    return value[-1] if value.ndim else value


def average_incremental_seen_accuracy(
    confs: Tensor, class_task: Tensor, *, weighting: str = "sample", validate: bool = True
) -> Tensor:
    """Average incremental accuracy ``(1/S) sum_{i<S} A_i`` with ``A_i`` the seen-class accuracy
    after stage ``i`` ([`seen_accuracy`][]; ``confs[0]`` is
    stage 0); a scalar.

    ``weighting="sample"`` is what iCaRL (Rebuffi et al., 2017) and PyCIL report as average
    (incremental) accuracy; ``"task"`` equals
    [`average_incremental_accuracy`][continual_eval.functional.average_incremental_accuracy] of the
    class-IL accuracy matrix (`per_task_accuracy`) when every task has test samples. NaN
    when some stage's seen accuracy is NaN.
    """
    return seen_accuracy(confs, class_task, weighting=weighting, validate=validate).mean()


def old_new_accuracy(
    confs: Tensor,
    class_task: Tensor,
    *,
    weighting: str = "sample",
    first_stage: int = 0,
    validate: bool = True,
) -> OldNewAccuracy:
    """Accuracy on the old classes (tasks ``j < i``) and on the new ones (task ``i``) at each
    stage ``i``; each ``[S]`` (scalars for one matrix).

    Weighted as [`seen_accuracy`][] (``weighting`` changes
    only ``old``: ``new`` is one task). ``old`` is NaN at stage 0 (no old task) and wherever the old
    classes have no test sample; ``new`` is NaN where task ``i`` has no test sample.

    Example:
        >>> conf1 = torch.tensor([[5, 0, 5], [0, 0, 0], [0, 0, 2]])
        >>> old, new = old_new_accuracy(conf1, torch.tensor([0, 0, 1]), first_stage=1)
        >>> old.item(), new.item()
        (0.5, 1.0)
    """
    _check_weighting(weighting)
    correct, total, single = _counts(confs, class_task, validate)
    stages = _stages(correct.shape[0], first_stage, correct.device)
    class_task = class_task.to(correct.device)
    old = _group_accuracy(correct, total, class_task, lambda t: t < stages, weighting)
    new = _group_accuracy(correct, total, class_task, lambda t: t == stages, "sample")
    return OldNewAccuracy(_squeeze(old, single), _squeeze(new, single))


def mean_class_accuracy(
    confs: Tensor,
    class_task: Tensor | None = None,
    *,
    first_stage: int = 0,
    validate: bool = True,
) -> Tensor:
    """Mean class accuracy at each stage: the mean of
    [`per_class_accuracy`][] over the classes where it
    is defined; ``[S]`` (a scalar for one matrix).

    With ``class_task``: over the seen classes that have a test sample. Without: over every class
    that has a test sample at that stage (Avalanche's ``ClassAccuracy`` with ``classes=None``).
    NaN when no class qualifies.
    """
    accuracy = per_class_accuracy(confs, class_task, first_stage=first_stage, validate=validate)
    return torch.nanmean(accuracy, dim=-1)


def average_mean_class_accuracy(
    confs: Tensor, class_task: Tensor | None = None, *, validate: bool = True
) -> Tensor:
    """Average mean class accuracy (AMCA): ``(1/S) sum_{i<S} (1/|K_i|) sum_{c in K_i} a[i, c]``
    with ``a[i, c]`` the per-class accuracy and ``K_i`` the classes where it is defined at stage
    ``i`` ([`mean_class_accuracy`][continual_eval.functional.mean_class_accuracy]; ``confs[0]`` is
    stage 0); a scalar, NaN if some stage has no such class.

    Matches Avalanche's ``AverageMeanClassAccuracy`` (``avalanche/evaluation/metrics/amca.py``;
    Verwimp et al., CLAD, 2022): the mean over evaluation phases of the mean per-class accuracy of
    the classes with a test sample in that phase, when ``class_task=None`` and ``confs[i]`` holds
    exactly phase ``i``'s evaluation; with ``class_task`` only seen classes count (the same when
    each stage evaluates only the seen tasks). It differs from Avalanche in that (1) Avalanche
    keeps a separate AMCA per task label (ours pools all samples, the single-label class-IL case),
    and (2) Avalanche's ``classes=`` argument counts a tracked class without a test sample as
    accuracy 0, where here it is left out.

    Example:
        >>> conf0 = torch.tensor([[3, 1, 0], [1, 1, 0], [0, 0, 0]])  # classes 0, 1: 0.75, 0.5
        >>> conf1 = torch.tensor([[1, 0, 3], [0, 0, 2], [0, 0, 4]])  # 0.25, 0, 1
        >>> average_mean_class_accuracy(torch.stack([conf0, conf1])).item()  # (0.625 + 5/12) / 2
        0.5208333333333334
    """
    return mean_class_accuracy(confs, class_task, validate=validate).mean()


def per_class_forgetting(class_accuracy: Tensor, *, convention: str = "peak") -> Tensor:
    """Per-class forgetting after the last stage: the drop from the best accuracy reached;
    ``[C]``.

    ``class_accuracy`` is ``[S, C]`` per-class accuracy from stage 0 on, NaN where not measured
    ([`per_class_accuracy`][] with ``class_task``, so
    that stages before a class's task do not count). With ``a`` its defined values:

    * ``"peak"`` (the default, as
      [`forgetting_per_task`][continual_eval.functional.forgetting_per_task]):
      ``max_{k<=S-1} a[k, c] - a[S-1, c]`` (never negative);
    * ``"chaudhry"``: ``max_{k<S-1} a[k, c] - a[S-1, c]``, the peak over earlier stages only (may
      be negative).

    NaN where the final accuracy is NaN or no earlier stage (``k < S-1``) measured the class, so
    with a single stage every entry is NaN.

    Example:
        >>> nan = float("nan")
        >>> acc = torch.tensor([[0.75, nan, nan], [0.5, 0.5, nan], [0.25, 0.75, 0.5]])
        >>> per_class_forgetting(acc).tolist()
        [0.5, 0.0, nan]
        >>> per_class_forgetting(acc, convention="chaudhry").tolist()
        [0.5, -0.25, nan]
    """
    check_forgetting_convention(convention)
    if (
        not isinstance(class_accuracy, Tensor)
        or not class_accuracy.is_floating_point()
        or class_accuracy.ndim != 2
    ):
        raise ValueError(
            f"class_accuracy must be a floating [S, C] tensor, got {_describe(class_accuracy)}"
        )
    return _per_class_forgetting(class_accuracy, convention)


def _per_class_forgetting(class_accuracy: Tensor, convention: str) -> Tensor:
    """`per_class_forgetting` of ``[..., S, C]`` (leading dimensions kept: resamples, runs):
    ``[..., C]``."""
    final = class_accuracy[..., -1, :]
    if class_accuracy.shape[-2] < 2:
        return torch.full_like(final, _NAN)
    earlier = class_accuracy[..., :-1, :]
    defined = (~earlier.isnan()).any(-2) & ~final.isnan()
    history = class_accuracy if convention == "peak" else earlier
    best = history.masked_fill(history.isnan(), -math.inf).amax(-2)
    return torch.where(defined, best - final, _NAN)


def mean_class_forgetting(class_accuracy: Tensor, *, convention: str = "peak") -> Tensor:
    """The mean of [`per_class_forgetting`][continual_eval.functional.per_class_forgetting] over the
    classes where it is defined; a scalar, NaN when it is defined for no class."""
    return torch.nanmean(per_class_forgetting(class_accuracy, convention=convention))


def _class_forgetting_table(class_accuracy: Tensor, *, convention: str = "peak") -> Tensor:
    """``[S, C]``: entry ``[i, c]`` is class ``c``'s
    [`per_class_forgetting`][continual_eval.functional.per_class_forgetting] after the stages
    ``0 .. i`` (``class_accuracy[: i + 1]``; NaN at ``i = 0``), for every ``i`` at once:
    running maxima (`torch.cummax`) instead of one call per stage (``O(S * C)``). Leading
    dimensions (``[..., S, C]``: resamples, runs) are kept."""
    check_forgetting_convention(convention)
    measured = ~class_accuracy.isnan()
    floor = class_accuracy.masked_fill(~measured, -math.inf)
    peak = torch.cummax(floor, -2).values  # best over the stages <= i
    # best and "measured before" over the stages < i (nothing before stage 0)
    earlier_peak = torch.cat(
        [torch.full_like(peak[..., :1, :], -math.inf), peak[..., :-1, :]], dim=-2
    )
    before = torch.cat(
        [torch.zeros_like(measured[..., :1, :]), measured.cumsum(-2)[..., :-1, :] > 0], dim=-2
    )
    best = peak if convention == "peak" else earlier_peak
    per_class = torch.where(before & measured, best - class_accuracy, _NAN)
    return per_class


def _mean_class_forgetting_per_stage(class_accuracy: Tensor, *, convention: str = "peak") -> Tensor:
    """``[S]``: entry ``i`` is
    [`mean_class_forgetting`][continual_eval.functional.mean_class_forgetting] of the stages
    ``0 .. i`` (NaN at ``i = 0``): the mean over classes of `_class_forgetting_table`
    (``O(S * C)``). Leading dimensions (``[..., S, C]``) are kept: ``[..., S]``."""
    return torch.nanmean(_class_forgetting_table(class_accuracy, convention=convention), dim=-1)


def recency_bias(
    confs: Tensor,
    class_task: Tensor,
    *,
    first_stage: int = 0,
    validate: bool = True,
) -> RecencyBias:
    """How much the predictions lean towards the newest task's classes at each stage ``i``;
    each field ``[S]`` (scalars for one matrix).

    Over the test samples of the seen classes (tasks ``<= i``) at stage ``i``:

    * ``prediction_share``: the fraction predicted as a class of task ``i``,
      ``sum_{c seen, p in task i} conf[c, p] / sum_{c seen} n_c``;
    * ``sample_share``: the fraction whose true class is in task ``i``,
      ``sum_{c in task i} n_c / sum_{c seen} n_c``, what an unbiased classifier would predict.

    ``prediction_share > sample_share`` is a bias towards the new classes (Wu et al., BiC, 2019).
    Both are 1 at stage 0 and NaN where no seen class has a test sample. A dense ``confs`` uses an
    ``[S, C, C]`` temporary; a sparse one only its stored cells.

    Example:
        >>> conf1 = torch.tensor([[1, 0, 4], [0, 3, 2], [0, 0, 2]])
        >>> bias = recency_bias(conf1, torch.tensor([0, 0, 1]), first_stage=1)
        >>> bias.prediction_share.item(), bias.sample_share.item()
        (0.6666666666666666, 0.16666666666666666)
    """
    stack, single = _stack(confs, validate)
    num_classes = stack.shape[-1]
    _check_class_task(class_task, num_classes, validate)
    stages = _stages(stack.shape[0], first_stage, stack.device)
    class_task = class_task.to(stack.device)
    if _is_sparse(stack):
        return _sparse_recency_bias(stack, class_task, stages, single)
    seen = (class_task >= 0) & (class_task <= stages)  # [S, C]
    new = class_task == stages  # [S, C]
    seen_rows = stack * seen.unsqueeze(-1)  # [S, C, C], rows of the unseen classes zeroed
    predicted = seen_rows.sum(1, dtype=torch.long)  # [S, C] predictions per class
    total = stack.sum(2, dtype=torch.long)  # [S, C] test samples per class
    bias = _recency_from_counts(total, (predicted * new).sum(-1), class_task, stages)
    return RecencyBias(_squeeze(bias.prediction_share, single), _squeeze(bias.sample_share, single))


def _new_predictions(stack: Tensor, class_task: Tensor, stages: Tensor) -> Tensor:
    """``[S]`` int64: per stage ``i`` of a coalesced sparse ``[S, C, C]``, the test samples of
    the seen classes predicted as a class of task ``i`` (sums over its stored cells)."""
    stage, true, pred, count = _sparse_cells(stack)
    at = stages[:, 0][stage]  # the stage of each cell
    true_task = class_task[true]
    to_new = (true_task >= 0) & (true_task <= at) & (class_task[pred] == at)
    return _sum_by(stage[to_new], count[to_new], stack.shape[0])


def _recency_from_counts(
    total: Tensor, new_predictions: Tensor, class_task: Tensor, stages: Tensor
) -> RecencyBias:
    """`recency_bias` from the per-stage, per-class test samples ``total [S, C]`` and the
    predictions of seen-class samples as the newest task's classes ``new_predictions [S]``."""
    seen = (class_task >= 0) & (class_task <= stages)  # [S, C]
    new = class_task == stages  # [S, C]
    num_seen = (total * seen).sum(-1)
    return RecencyBias(_ratio(new_predictions, num_seen), _ratio((total * new).sum(-1), num_seen))


def _sparse_recency_bias(
    stack: Tensor, class_task: Tensor, stages: Tensor, single: bool
) -> RecencyBias:
    """`recency_bias` of a coalesced sparse ``[S, C, C]``: sums over its stored cells."""
    total = _sparse_counts(stack)[1]
    bias = _recency_from_counts(
        total, _new_predictions(stack, class_task, stages), class_task, stages
    )
    return RecencyBias(_squeeze(bias.prediction_share, single), _squeeze(bias.sample_share, single))


def confusion_in_arrival_order(
    confs: Tensor, task_classes: TaskClasses, *, validate: bool = True
) -> tuple[Tensor, Tensor]:
    """Rows and columns of ``confs`` (``[C, C]`` or ``[S, C, C]``) permuted into arrival order.

    ``out[..., a, b] = confs[..., order[a], order[b]]`` with ``order`` = `TaskClasses.order` (task
    0's classes as listed, then task 1's, ..., then the classes of no task). Returns ``(out,
    boundaries)`` (``out`` sparse when ``confs`` is): task ``j``'s block is ``out[..., b[j]:b[j+1],
    b[j]:b[j+1]]`` with ``b = boundaries`` (``[T + 1]``, on CPU or where ``task_classes`` lives);
    draw lines at ``b[1:-1] - 0.5`` to separate the tasks.

    Example:
        >>> tc = check_task_classes([[2], [0, 1]])
        >>> conf = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
        >>> out, boundaries = confusion_in_arrival_order(conf, tc)
        >>> out.tolist(), boundaries.tolist()
        ([[9, 7, 8], [3, 1, 2], [6, 4, 5]], [0, 1, 3])
    """
    stack, _ = _stack(confs, validate)
    if stack.shape[-1] != task_classes.num_classes:
        raise ValueError(
            f"confs has {stack.shape[-1]} classes but task_classes has {task_classes.num_classes}"
        )
    order = task_classes.order.to(confs.device)
    if _is_sparse(confs):  # the cells relabelled: class order[a] becomes a
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order), device=order.device)
        confs = confs.coalesce()
        indices = confs.indices().clone()
        indices[-2:] = rank[indices[-2:]]
        moved = torch.sparse_coo_tensor(
            indices, confs.values(), confs.shape, check_invariants=False
        )
        return moved.coalesce(), task_classes.boundaries
    return confs.index_select(-2, order).index_select(-1, order), task_classes.boundaries

r"""Scorers: the unit of measurement. Each scorer of a run owns one score matrix `R^m`.

[`evaluate_tasks`][continual_eval.evaluation.evaluate_tasks] runs one forward pass per test batch
and feeds its ``(preds, target)`` to every scorer of the run, in order. A scorer is any object
satisfying [`Scorer`][continual_eval.evaluation.Scorer];
[`make_scorer`][continual_eval.evaluation.make_scorer] builds one from a short specification.

Built-ins:

============================  =======================  ================  ==============
scorer                        ``name``                 higher is better  ``bounds``
============================  =======================  ================  ==============
`AccuracyScorer`              ``accuracy``             yes               ``(0, 1)``
`TopKAccuracyScorer`          ``top{k}_accuracy``      yes               ``(0, 1)``
`LossScorer`                  ``cross_entropy``, or    no                ``None``
                              the loss's name
`MetricScorer`                the metric's class name  the metric's      ``(0, 1)`` or
                                                                         ``None``
============================  =======================  ================  ==============

Exactness under DDP on unpadded shards: count/sum scorers (``count_based = True``) return their
per-rank sums from [`Scorer.local_counts`][continual_eval.evaluation.Scorer.local_counts], which the
loop sums across ranks in its own collectives (int64 counts exactly; float sums exactly up to
summation order, see [`evaluate_tasks`][continual_eval.evaluation.evaluate_tasks]). A torchmetrics
metric whose states are all sum-reduced tensors is count-based too (its states are its local counts,
summed with the others in one collective for all tasks, exactly as its own sync sums them); any
other metric's states are gathered by `MetricScorer` after each task, with the same collectives on
every rank (a rank without samples of the task included). Scorers hold no state between evaluations
([`Scorer.start`][continual_eval.evaluation.Scorer.start] resets them), so a resumed run needs
nothing from them.

Speed: a scorer that declares ``batch_additive = True`` may be fed a task's consecutive batches
concatenated (copies; a group ends once it reaches `BUFFER_BYTES`) in one
[`Scorer.update`][continual_eval.evaluation.Scorer.update] call instead of one call per batch, so
that its per-batch work (target checks, argmax, a torchmetrics update) runs once per task. The
built-in label scorers are batch-additive (integer counts are unchanged; a loss sum changes at most
by its summation order), and so are the torchmetrics metrics that `MetricScorer` knows to be (see
there).
"""

from __future__ import annotations

import contextvars
import inspect
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from continual_eval.evaluation import _torchmetrics_adapter as tm
from continual_eval.evaluation._metric_sync import gathered_states
from continual_eval.evaluation.errors import EvaluationError, _what
from continual_eval.evaluation.language import make_token_scorer

__all__ = [
    "BUFFER_BYTES",
    "AccuracyScorer",
    "LossScorer",
    "MetricScorer",
    "Scorer",
    "TopKAccuracyScorer",
    "make_scorer",
]


#: bytes of copied ``(preds, target)`` at which the evaluation loop feeds the batch-additive
#: scorers the group it holds (one concatenation per task when a task's outputs fit; a group may
#: exceed it by its last batch, and the concatenation is one more copy of the group)
BUFFER_BYTES = 16 * 2**20


class Scorer(Protocol):
    """What [`evaluate_tasks`][continual_eval.evaluation.evaluate_tasks] needs of a scorer.

    Attributes:
        name: what a cell of its matrix holds (``"accuracy"``, ``"cross_entropy"``,
            ``"top5_accuracy"``, a metric's class name).
        higher_is_better: the direction of the score (forgetting and transfer are signed by it).
        bounds: ``(lowest, highest)`` score, or ``None`` when unbounded (e.g. a loss).
        count_based: ``True``: [`result`][continual_eval.evaluation.Scorer.result] is a function of
            the reduced [`local_counts`][continual_eval.evaluation.Scorer.local_counts] alone,
            called once after all tasks with every task's counts; ``False``:
            [`result`][continual_eval.evaluation.Scorer.result] runs its own collectives (e.g. a
            torchmetrics sync) and is called once per task, right after it, on every rank in the
            same order.
        target_problems: (optional) ``target_problems[k - 2]`` describes a positive entry ``k >=
            2`` of [`local_counts`][continual_eval.evaluation.Scorer.local_counts], with ``{n}`` its
            count; without it: targets outside the class dimension.
        num_problems: (optional) how many entries after ``[value, total]`` of
            [`local_counts`][continual_eval.evaluation.Scorer.local_counts] are problem counts; the
            entries after them are further sums that only
            [`result`][continual_eval.evaluation.Scorer.result] reads. Without it: every entry after
            ``total`` is a problem count.
        batch_additive: (optional, default ``False``) ``True`` promises that one
            [`update`][continual_eval.evaluation.Scorer.update] with two batches concatenated along
            dim 0 counts what two calls, one per batch, count (exactly for counts; float sums up to
            summation order) and that [`update`][continual_eval.evaluation.Scorer.update] keeps no
            reference to its arguments. The loop may then feed the scorer a task's consecutive
            batches whose shapes beyond dim 0, dtypes and devices agree as one concatenation of
            copies (up to `BUFFER_BYTES`), once per task when they fit.

    Protocol per task: ``start(device)``, then ``set_task(j, stage)`` (optional method: the index
    of the task about to be scored and the evaluation's stage, ``-1`` for the untrained baseline,
    ``None`` when not tied to a stage, for a scorer whose scoring depends on them),
    ``update(preds, target)`` for each batch (the tensors every scorer sees: an update that
    modifies them in place is refused, see `checked_update`) or group of batches
    (``batch_additive``), then ``local_counts()`` and ``result``. A count-based
    [`result`][continual_eval.evaluation.Scorer.result] that refuses one task's counts raises
    [`EvaluationError`][continual_eval.evaluation.EvaluationError] with ``task_row`` set to that
    task's row, so that the loop names the task. A count-based scorer may also define
    ``details(reduced_counts)``: what it reports besides the scores from the same ``[tasks, K]``
    counts (e.g. confusion counts), returned in `TaskEvaluation.details_by_scorer`.

    Per-item records (``evaluate_tasks(item_scorers=...)``, optional): a scorer whose score is a
    mean over its samples' values defines ``items_binary`` (a bool: 0/1 values) and
    ``local_items()``, the values of the samples fed since ``start`` in the order fed (one per
    sample), kept while the loop has set its ``keep_items`` to ``True`` (see `item_support`).

    Scorers of the raw batch (decoding, e.g.
    `GenerationScorer`) set ``needs_batch = True``:
    instead of ``update(preds, target)`` the loop calls ``update_batch(module, batch,
    all_reduce)`` for each of the task's batches (after the device move and ``convert_input``,
    inside ``forward_context`` and the grad context, after the step's forward; no step forward
    runs when every scorer is such a scorer), then ``end_task(module, all_reduce)`` once after
    the task's batches on every rank, also on a rank that had none; ``all_reduce`` is the loop's
    sum-reduction (``None`` in one process). Both may run collectives through ``all_reduce``
    (synced decoding): every rank calls ``end_task`` once per task, in task order, so a rank with
    fewer batches catches up there; a rank that replays a batch only to keep a sharded model's
    forwards in step must not pass it to ``update_batch``.
    """

    name: str
    higher_is_better: bool
    bounds: tuple[float, float] | None
    count_based: bool

    def start(self, device: torch.device) -> None:
        """Forget the previous task; the task's batches arrive on ``device``."""
        ...

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Score one batch. Raise [`EvaluationError`][continual_eval.evaluation.EvaluationError] for
        an output that cannot be scored; count invalid targets instead (reported after the task on
        every rank, see [`local_counts`][continual_eval.evaluation.Scorer.local_counts]). Avoid host
        syncs (``.item()``, ``int(t)``) here."""
        ...

    def local_counts(self) -> Tensor:
        """``[value, total, problem_0, problem_1, ...]`` on this rank, summed across ranks by the
        loop: ``value`` the numerator (correct predictions, a loss sum), ``total`` the number of
        scored elements (0 on every rank: the task raises "no sample"), then problem counts (> 0:
        the task raises, see ``target_problems``). int64 for counts; a floating dtype (float64)
        for float sums."""
        ...

    def result(self, reduced_counts: Tensor) -> Tensor:
        """The score. ``count_based``: ``reduced_counts`` is ``[tasks, K]`` (every task's summed
        [`local_counts`][continual_eval.evaluation.Scorer.local_counts], in the scorer's dtype),
        return ``[tasks]``; else ``[K]`` of the task just scored, return a scalar."""
        ...


#: the attributes and methods [`make_scorer`][continual_eval.evaluation.make_scorer] requires of a
#: user's scorer object
_PROTOCOL_ATTRIBUTES = ("name", "higher_is_better", "bounds", "count_based")
_PROTOCOL_METHODS = ("start", "update", "local_counts", "result")


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
_NOT_WHOLE = (
    "{n} floating-point targets are not whole numbers, so they are not class indices; pass "
    "integer class labels, or one-hot/probability targets shaped like the predictions [N, C]"
)
_NOT_DISTRIBUTION = (
    "{n} target rows shaped like the predictions are not one-hot or probability "
    "vectors (each >= 0 and summing to 1 over dim 1), so their argmax is not a label; for "
    "multi-label targets pass a metric, e.g. metric=torchmetrics.classification."
    "MultilabelAccuracy(num_labels=C)"
)
_NOT_FINITE_LOSS = (
    "the mean loss is not finite: some per-sample losses are NaN or infinite (e.g. a -inf score "
    "on the true class)"
)


def _float_sum_dtype(device: torch.device) -> torch.dtype:
    """float64 for float sums, float32 where the device has no float64 (MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


_META_OUTPUT = (
    "the model returned a tensor on the meta device, which holds no values (only shapes): were "
    "its parameters materialised? A model built under torch.device('meta') needs real weights "
    "(e.g. to_empty() and a loaded state dict) before it is evaluated"
)


def _refuse_meta(preds: Tensor, target: Tensor) -> None:
    if preds.is_meta:
        raise EvaluationError(_META_OUTPUT)
    if target.is_meta:
        raise EvaluationError(
            "the test batch's target is on the meta device, which holds no values (only shapes)"
        )


def input_versions(preds: Tensor, target: Tensor) -> tuple[int, int] | None:
    """The version counters of ``preds`` and ``target`` (``None`` for inference tensors, which
    keep none). The one place that reads torch's private ``Tensor._version``, why: it is torch's
    only record of in-place writes (every in-place op on a tensor or on a view of it bumps the
    counter it shares; autograd checks saved tensors the same way). Writes that bypass torch's
    ops (through ``.data``, NumPy or the storage) leave it unchanged."""
    if preds.is_inference() or target.is_inference():
        return None
    return preds._version, target._version


def _check_unmodified(
    who: str, before: tuple[int, int] | None, preds: Tensor, target: Tensor
) -> None:
    """Raise naming ``who`` when ``preds`` or ``target`` changed since ``before``."""
    if before is None:
        return
    after = input_versions(preds, target)
    changed = [
        n for n, b, a in zip(("preds", "target"), before, after or before, strict=True) if a != b
    ]
    if changed:
        raise EvaluationError(
            f"{who} modified {' and '.join(changed)} in place; every scorer of the run sees the "
            "same tensors, so an in-place change would alter the others' scores: compute on a "
            "copy (e.g. preds = preds.clone()) or use out-of-place operations"
        )


def _private_inputs(preds: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Inputs a user's loss may be given: the tensors themselves when torch counts their
    in-place writes (checked after the call), else (inference tensors, which count none) copies
    that do count them, so a write is still detected and never reaches another scorer."""
    if not (preds.is_inference() or target.is_inference()):
        return preds, target
    with torch.inference_mode(False):
        return preds.clone(), target.clone()


class _LabelScorer:
    """Target handling shared by the scorers of class-index targets (accuracy, top-k accuracy,
    cross-entropy): which layout a batch has, and on-device counts of invalid targets.

    Targets are class indices (integers, or floats holding whole numbers), or one-hot (float or
    integer) / probability vectors shaped like float ``preds`` (``[N, C, ...]``, every vector over
    dim 1 non-negative and summing to 1), read as their argmax. Checks that depend only on shapes
    and dtypes run once per task (and again when the layout changes); the counts stay on the device
    and are read after the task.
    """

    count_based = True
    higher_is_better = True
    bounds: tuple[float, float] | None = (0.0, 1.0)
    #: every count is a sum over samples: batches may be fed concatenated
    batch_additive = True
    #: what a positive entry ``2, 3, 4`` of `local_counts` means; ``{n}``: that entry
    target_problems: tuple[str, ...] = (_OUT_OF_RANGE, _NOT_WHOLE, _NOT_DISTRIBUTION)
    #: layouts without a class dimension (``preds`` already labels) are refused when set
    needs_class_scores = False

    #: per-item records (`local_items`): set by the evaluation loop for the scorers whose items it
    #: gathers; 0/1 items (``items_binary``) or floats
    keep_items = False
    items_binary = True

    def start(self, device: torch.device) -> None:
        self._device = device
        self._items: list[Tensor] = []  # per update with keep_items: each sample's value
        self._total = 0  # host int: batch sizes are known without a device sync
        # per batch, device scalars reduced once in local_counts (no accumulation op per batch)
        self._values: list[Tensor] = []
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
        """The checks that depend only on shapes, dtypes and the meta device; returns how to
        score the batch."""
        _refuse_meta(preds, target)
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
        if self.needs_class_scores:
            raise EvaluationError(
                f"{self.name} needs class scores [N, C, ...] with one more dimension than the "
                f"targets; the model returned labels of shape {tuple(preds.shape)}"
            )
        return "float_same" if target.is_floating_point() else "same"

    def _batch_value(self, preds: Tensor, target: Tensor, labels: Tensor, mode: str) -> Tensor:
        """This batch's numerator (a device scalar). ``labels``: the class indices (argmax of a
        distribution target; ``target`` itself in the ``same`` layouts)."""
        raise NotImplementedError

    def _batch_items(self, preds: Tensor, target: Tensor, labels: Tensor, mode: str) -> Tensor:
        """Each element's value (``[N]`` for one label per sample), whose sum is
        `_batch_value`; only the scorers with per-item records define it."""
        raise NotImplementedError

    def _kept_value(self, preds: Tensor, target: Tensor, labels: Tensor, mode: str) -> Tensor:
        """`_batch_value` from the per-sample values, which are kept (``keep_items``)."""
        if labels.ndim != 1:
            raise EvaluationError(
                f"per-item records ({self.name}) need one label per sample; the targets have "
                f"shape {tuple(target.shape)} ({tuple(labels.shape)} labels), several per sample"
            )
        items = self._batch_items(preds, target, labels, mode)
        self._items.append(items)
        if items.is_floating_point():
            return items.sum(dtype=getattr(self, "_dtype", torch.float64))
        return items.sum()

    def local_items(self) -> Tensor:
        """Every sample's value on this rank since `start`, in the order fed (bool for 0/1
        scores, float64 otherwise); empty without samples."""
        dtype = torch.bool if self.items_binary else torch.float64
        if not self._items:
            return torch.zeros(0, dtype=dtype, device=self._device)
        items = self._items[0] if len(self._items) == 1 else torch.cat(self._items)
        return items.to(dtype)

    def update(self, preds: Tensor, target: Tensor) -> None:
        signature = (
            preds.shape[1:],
            preds.dtype,
            target.shape[1:],
            target.dtype,
            preds.is_meta or target.is_meta,
        )
        if signature != self._checked or preds.shape[0] != target.shape[0]:
            self._mode = self._check(preds, target)
            self._checked = signature
        mode = self._mode
        labels = target
        if mode == "distribution":
            sums = target.sum(dim=1, dtype=torch.float64)
            eps = torch.finfo(target.dtype).eps if target.is_floating_point() else 0.0
            tolerance = max(1e-4, 2 * target.shape[1] * eps)
            valid = (target >= 0).all(dim=1) & ((sums - 1).abs() <= tolerance)
            self._not_distribution.append((~valid).sum())
            labels = target.argmax(dim=1)
        elif mode in ("labels", "float_labels"):
            if mode == "float_labels":
                self._not_whole.append((target.frac() != 0).sum())  # NaN and inf included
                labels = target.nan_to_num(nan=-1.0, posinf=-1.0, neginf=-1.0).long()
            if labels.numel():
                self._ranges.append(torch.aminmax(labels))
        elif mode == "float_same":
            self._not_whole.append((target.frac() != 0).sum())
        if self.keep_items:
            self._values.append(self._kept_value(preds, target, labels, mode))
        else:
            self._values.append(self._batch_value(preds, target, labels, mode))
        self._total += labels.numel()

    def _sum(
        self, values: list[Tensor], dtype: torch.dtype = torch.int64, zero: Tensor | None = None
    ) -> Tensor:
        """The sum of ``values`` (device scalars) as ``dtype``; ``zero`` (or a new zero) when
        empty. One entry (a task fed as one group) costs no op."""
        if not values:
            return torch.zeros((), dtype=dtype, device=self._device) if zero is None else zero
        total = values[0] if len(values) == 1 else torch.stack(values).sum()
        return total.to(dtype)

    def _label_counts(self, dtype: torch.dtype) -> list[Tensor]:
        """``[total, out_of_range, not_whole, not_distribution]`` as ``dtype`` scalars."""
        zero = torch.zeros((), dtype=dtype, device=self._device)
        out_of_range = zero
        if self._num_classes is not None and self._ranges:
            if len(self._ranges) == 1:
                lowest, highest = self._ranges[0]
            else:
                lowest = torch.stack([low for low, _ in self._ranges]).min()
                highest = torch.stack([high for _, high in self._ranges]).max()
            out_of_range = ((lowest < 0) | (highest >= self._num_classes)).to(dtype)
        total = torch.tensor(self._total, dtype=dtype, device=self._device)
        return [
            total,
            out_of_range,
            self._sum(self._not_whole, dtype, zero),
            self._sum(self._not_distribution, dtype, zero),
        ]

    def local_counts(self) -> Tensor:
        """``[correct, total, out_of_range, not_whole, not_distribution]`` (int64)."""
        return torch.stack([self._sum(self._values), *self._label_counts(torch.int64)])

    def result(self, reduced_counts: Tensor) -> Tensor:
        correct, total = reduced_counts[..., 0], reduced_counts[..., 1]
        return correct.double() / total.double()


class AccuracyScorer(_LabelScorer):
    r"""Accuracy `\frac{1}{N}\sum_n [\hat y_n = y_n]` with `\hat y` the argmax over
    dim 1 of ``preds`` (or ``preds`` itself when it holds integer labels shaped like ``target``).

    Targets are class indices (integers, or floats holding whole numbers), or one-hot (float or
    integer) / probability vectors shaped like float ``preds`` (``[N, C, ...]``, every vector over
    dim 1 non-negative and summing to 1), read as their argmax. Counts and target checks stay on
    the device (no host sync per batch); invalid targets are counted and reported after the task
    (``target_problems``). Exact under DDP: correct/total counts are summed across ranks.
    """

    name = "accuracy"

    def _batch_items(self, preds: Tensor, target: Tensor, labels: Tensor, mode: str) -> Tensor:
        if mode in ("distribution", "labels", "float_labels"):
            preds = preds.argmax(dim=1)
        return preds == labels

    def _batch_value(self, preds: Tensor, target: Tensor, labels: Tensor, mode: str) -> Tensor:
        return self._batch_items(preds, target, labels, mode).sum()


class TopKAccuracyScorer(_LabelScorer):
    r"""Top-k accuracy `\frac{1}{N}\sum_n [\,|\{c : s_{nc} > s_{n y_n}\}| < k\,]`: a
    sample counts as correct when fewer than ``k`` classes score strictly higher than its label
    over dim 1 (so a tie at the k-th place counts in the label's favour; without ties this is "the
    label is among the ``k`` highest scores"). Named ``top{k}_accuracy``; bounds ``(0, 1)``.

    Targets as for `AccuracyScorer` (a one-hot/probability target is read as its argmax);
    ``preds`` must hold class scores ``[N, C, ...]`` with ``C >= k``. Exact under DDP (counts).
    """

    needs_class_scores = True

    def __init__(self, k: int = 5) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        self.k = k
        self.name = f"top{k}_accuracy"

    def _check_num_classes(self, num_classes: int) -> None:
        super()._check_num_classes(num_classes)
        if num_classes < self.k:
            raise EvaluationError(
                f"{self.name} needs at least {self.k} classes; the model returned {num_classes}"
            )

    def _batch_items(self, preds: Tensor, target: Tensor, labels: Tensor, mode: str) -> Tensor:
        assert self._num_classes is not None
        # an out-of-range label is reported after the task; clamped here so gather stays in range
        label_score = preds.gather(1, labels.clamp(0, self._num_classes - 1).unsqueeze(1))
        return (preds > label_score).sum(dim=1) < self.k

    def _batch_value(self, preds: Tensor, target: Tensor, labels: Tensor, mode: str) -> Tensor:
        return self._batch_items(preds, target, labels, mode).sum()


class LossScorer(_LabelScorer):
    r"""Mean loss `\frac{1}{N}\sum_n \ell_n` over the task's test samples; lower is better,
    unbounded (``bounds = None``).

    ``loss_fn=None``: the per-sample cross-entropy ``F.cross_entropy(preds, target,
    reduction="none")`` of class scores ``[N, C, ...]`` (mean over every element for ``[N, C, d1,
    ...]`` outputs, as ``reduction="mean"`` does), named ``cross_entropy``. Targets as for
    `AccuracyScorer`: class indices (invalid ones are counted and reported after the task,
    and clamped into range before the loss so no device assert fires), or one-hot/probability
    targets shaped like ``preds`` (used as soft targets).

    ``loss_fn`` a callable ``(preds, target) -> Tensor``: per-sample losses with a leading batch
    dimension ``[N, ...]`` (the mean is over all their elements), or one scalar, read as the
    batch's mean and weighted by its size `N` = ``preds.shape[0]`` (exact for a plain mean
    over samples). Its targets are not checked. Named ``name``, else the callable's
    ``__name__`` (a class name for an ``nn.Module``), else ``"loss"``.

    Sums: each update's loss sum (a batch's, or with the default cross-entropy, which is
    ``batch_additive``, a group of concatenated batches') is taken in float64 on the device
    (float32 on MPS) and summed across ranks by the loop's reduction, so the mean equals a
    per-batch or single-process sum up to float summation order. A non-finite loss sum (a NaN or
    infinite per-sample loss) is reported after the task. A ``loss_fn`` is called once per batch.

    A ``loss_fn``'s output must be a real floating-point tensor (integers, booleans and complex
    numbers are refused). It never changes what the other scorers see: a call that modifies
    ``preds`` or ``target`` in place is refused naming the loss (torch's version counters; under
    inference mode, where tensors keep none, the loss is given copies, one of each per batch).
    """

    higher_is_better = False
    bounds = None
    items_binary = False

    def __init__(
        self, loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None, name: str | None = None
    ) -> None:
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable (preds, target) -> losses, got {loss_fn!r}")
        self.loss_fn = loss_fn
        if name is None:
            name = "cross_entropy" if loss_fn is None else _callable_name(loss_fn)
        self.name = name
        # a callable's loss may depend on the batch (a mean, a batch statistic): one call a batch
        self.batch_additive = loss_fn is None
        if loss_fn is None:
            self.needs_class_scores = True
            self.target_problems = (_OUT_OF_RANGE, _NOT_WHOLE, _NOT_DISTRIBUTION, _NOT_FINITE_LOSS)
        else:
            self.target_problems = (_NOT_FINITE_LOSS,)

    def start(self, device: torch.device) -> None:
        super().start(device)
        self._dtype = _float_sum_dtype(device)

    def _add(self, losses: Tensor, weight: int | None = None) -> None:
        if weight is None:
            self._values.append(losses.sum(dtype=self._dtype))
        else:
            self._values.append(losses.to(self._dtype) * weight)

    def _batch_value(self, preds: Tensor, target: Tensor, labels: Tensor, mode: str) -> Tensor:
        return self._batch_items(preds, target, labels, mode).sum(dtype=self._dtype)

    def _batch_items(self, preds: Tensor, target: Tensor, labels: Tensor, mode: str) -> Tensor:
        if not preds.is_floating_point():
            raise EvaluationError(
                f"cross-entropy needs floating class scores; the model returned {preds.dtype}"
            )
        if preds.dtype in (torch.float16, torch.bfloat16):
            preds = preds.float()  # as F.cross_entropy accumulates: in float32
        if mode == "distribution":
            losses = F.cross_entropy(preds, target.to(preds.dtype), reduction="none")
        else:
            # F.cross_entropy(preds, labels, reduction="none") = logsumexp(s) - s_y, without
            # the full log_softmax (3x cheaper on small class counts); an out-of-range label is
            # reported after the task, clamped here so no device assert fires
            assert self._num_classes is not None
            picked = preds.gather(1, labels.clamp(0, self._num_classes - 1).unsqueeze(1))
            losses = torch.logsumexp(preds, dim=1) - picked.squeeze(1)
        return losses

    def update(self, preds: Tensor, target: Tensor) -> None:
        if self.loss_fn is None:
            super().update(preds, target)
            return
        _refuse_meta(preds, target)
        given = _private_inputs(preds, target)
        before = input_versions(*given)
        losses = self.loss_fn(*given)
        _check_unmodified(f"loss {self.name}", before, *given)
        if not isinstance(losses, Tensor):
            raise EvaluationError(
                f"loss {self.name} returned {_what(losses)}, not a tensor of per-sample losses"
            )
        if not losses.dtype.is_floating_point:
            raise EvaluationError(
                f"loss {self.name} returned a {str(losses.dtype).removeprefix('torch.')} tensor; "
                "a loss is a real floating-point tensor, one value per sample (or one batch mean)"
            )
        batch = preds.shape[0]
        if self.keep_items and (losses.ndim != 1 or losses.shape[0] != batch):
            raise EvaluationError(
                f"per-item records ({self.name}) need one loss per sample [N] = [{batch}]; loss "
                f"{self.name} returned shape {list(losses.shape)}"
            )
        if self.keep_items:
            self._items.append(losses)
        if losses.ndim == 0:
            self._add(losses, weight=batch)
            self._total += batch
        elif losses.shape[0] == batch:
            self._add(losses)
            self._total += losses.numel()
        else:
            raise EvaluationError(
                f"loss {self.name} returned a tensor of shape {list(losses.shape)} for a batch of "
                f"{batch}; return per-sample losses [N, ...] (reduction='none') or one mean"
            )

    def local_counts(self) -> Tensor:
        """``[loss_sum, total, (out_of_range, not_whole, not_distribution,) not_finite]``, float
        (the bracketed entries for the default cross-entropy only; ``not_finite``: 1 when this
        rank's sum is NaN or infinite)."""
        dtype = self._dtype
        if self.loss_fn is None:
            total, *problems = self._label_counts(dtype)
        else:
            total, problems = torch.tensor(self._total, dtype=dtype, device=self._device), []
        loss_sum = self._sum(self._values, dtype)
        # a NaN/inf loss makes the sum one; x - x is 0 exactly for a finite x, else NaN
        not_finite = (loss_sum - loss_sum != 0).to(dtype)
        return torch.stack([loss_sum, total, *problems, not_finite])

    def result(self, reduced_counts: Tensor) -> Tensor:
        loss_sum, total = reduced_counts[..., 0], reduced_counts[..., 1]
        return loss_sum.double() / total.double()


def _callable_name(fn: Any) -> str:
    name = getattr(fn, "__name__", None)
    if name is None and isinstance(fn, torch.nn.Module):
        name = type(fn).__name__
    if isinstance(name, str) and name.isidentifier():
        return name
    return "loss"


def _summed_states(metric: Any) -> tuple[str, ...] | None:
    """The names of ``metric``'s states when the loop can reduce them across ranks itself, else
    ``None``: every state a tensor (not a list) that torchmetrics' sync sums
    (``dist_reduce_fx="sum"``), of an integer or floating dtype, in a metric that syncs the default
    way (no ``dist_sync_fn`` or ``process_group`` of its own, ``sync_on_compute=True``, no override
    of ``sync``/``_sync_dist``) and holds no child metric. Summing such states in the loop's
    collective is what torchmetrics' own sync does (gather every rank's state, sum)."""
    defaults = tm.state_defaults(metric)
    reductions = tm.state_reductions(metric)
    if not defaults or not tm.default_sync(metric) or len(tm.metrics_in(metric)) > 1:
        return None
    if (
        getattr(metric, "dist_sync_fn", None) is not None
        or getattr(metric, "process_group", None) is not None
        or getattr(metric, "sync_on_compute", True) is not True
    ):
        return None
    for name, default in defaults.items():
        if not isinstance(default, Tensor) or not tm.is_sum_reduction(reductions.get(name)):
            return None
        if default.dtype == torch.bool or default.is_complex():
            return None
    return tuple(defaults)


def _gathers_itself(metric: Any) -> bool:
    """Whether `MetricScorer` gathers ``metric``'s states across ranks itself (so that a
    rank without samples takes part in the same collectives): every metric in it keeps the default
    sync, none has a ``dist_sync_fn`` of its own, and each syncs on compute. A metric with a sync
    of its own (e.g. torchmetrics' detection mAP) is left to it."""
    return all(
        tm.default_sync(m)
        and getattr(m, "dist_sync_fn", None) is None
        and getattr(m, "sync_on_compute", True) is True
        for m in tm.metrics_in(metric)
    )


@contextmanager
def _quiet_compute_warning(quiet: bool) -> Iterator[None]:
    """Silence torchmetrics' "compute was called before update" on a rank that saw no sample
    (its states hold the other ranks' after the gather)."""
    with warnings.catch_warnings():
        if quiet:
            warnings.filterwarnings("ignore", message=r".*was called before the ``update``")
        yield


def _known_batch_additive(metric: Any) -> bool:
    """Whether ``metric``'s ``update`` is torchmetrics' multiclass stat-scores or confusion-matrix
    update, not overridden: integer counts of each sample's argmax (or top-k) against its label,
    however the samples are batched (accuracy, precision, recall, F-beta, specificity, Hamming
    distance, stat scores; Jaccard index, Cohen's kappa, Matthews correlation). Binary, multilabel
    and curve metrics are not: their update decides per batch whether to apply a sigmoid/softmax
    (when some score lies outside [0, 1]), so the same samples batched otherwise can count
    differently."""
    try:
        from torchmetrics.classification import MulticlassConfusionMatrix, MulticlassStatScores
    except ImportError:  # pragma: no cover - another torchmetrics layout
        return False
    if isinstance(metric, MulticlassStatScores):
        return tm.own_update_state(metric, MulticlassStatScores)
    if isinstance(metric, MulticlassConfusionMatrix):
        return type(metric).update is MulticlassConfusionMatrix.update
    return False


class MetricScorer:
    """Any torchmetrics metric (an instance, cloned, or a factory returning one), reduced across
    ranks exactly on unpadded shards; its ``compute()`` must return one finite number per task.

    ``name`` is the metric's class name; ``higher_is_better`` the metric's (a metric that declares
    none, ``None``, is taken as higher-is-better); ``bounds`` ``(0, 1)`` when the metric's plot
    bounds are ``0`` and ``1`` (``plot_lower_bound``/``plot_upper_bound``), else ``None``.

    Reduction (``count_based``): when every state of the metric is a tensor that torchmetrics'
    sync sums (``dist_reduce_fx="sum"``: the stat-score, confusion-matrix, mean and sum metrics;
    and the metric syncs the default way, see below), its states after a task are part of
    `local_counts`: the loop sums them across ranks with every other count in one collective
    for all tasks (``all_reduce``, as for every count-based scorer), and `result` loads each
    task's summed states into the metric and runs its class's ``compute`` (not the instance's
    wrapper: no second sync, no cache), once per task, after the evaluation. That is torchmetrics'
    own sync (gather, sum), so integer states reduce exactly and float states up to summation
    order. Any other metric (list or ``cat`` states, ``max``/``min``/``mean`` reductions, a
    ``process_group`` of its own, child metrics) is reduced right after each task, on every rank:
    the scorer gathers its states itself (`_metric_sync`: a
    fixed-size description, then the states padded to one shape: the same collectives on every
    rank, also on a rank that holds no sample of the task, where torchmetrics' own sync sends a
    placeholder of another shape), reduces them as torchmetrics does and runs ``compute`` without
    another sync. A metric with a sync of its own (a ``dist_sync_fn``, an overridden
    ``sync``/``_sync_dist``) runs it; ``sync_on_compute=False`` is honoured (no sync).

    Errors: an exception of the metric's ``update`` (e.g. a ``num_classes`` that does not fit
    the output) is an [`EvaluationError`][continual_eval.evaluation.EvaluationError] naming the
    metric, chained to the original; an update that modifies ``preds``/``target`` in place is
    refused where torch counts the writes (not on inference tensors).

    Batching (``batch_additive``): ``None`` (default) feeds the metric each task's batches
    concatenated (`BUFFER_BYTES` at a time, see [`Scorer`][continual_eval.evaluation.Scorer]) only
    when that cannot change its states: integer sum-reduced states, ``full_state_update = False``,
    and the update of torchmetrics' multiclass stat-scores or confusion-matrix metrics (accuracy,
    precision, recall, F-beta, specificity, Hamming distance, Jaccard index, Cohen's kappa, Matthews
    correlation with ``multidim_average="global"``), a sum over samples of integer counts; else
    one update per batch. ``True``/``False`` force either (``True`` asserts that the metric's
    update over a concatenation of batches equals its updates over each).
    """

    target_problems = (_OUT_OF_RANGE,)
    #: ``local_counts()[2]`` counts problems; the entries after it are the metric's states
    num_problems = 1

    def __init__(self, metric: Any, *, batch_additive: bool | None = None) -> None:
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
        if batch_additive is not None and not isinstance(batch_additive, bool):
            raise TypeError(f"batch_additive must be None, True or False, got {batch_additive!r}")
        self.name = type(self._metric).__name__
        declared = getattr(self._metric, "higher_is_better", None)
        self.higher_is_better = True if declared is None else bool(declared)
        low = getattr(self._metric, "plot_lower_bound", None)
        high = getattr(self._metric, "plot_upper_bound", None)
        self.bounds: tuple[float, float] | None = (0.0, 1.0) if (low, high) == (0, 1) else None
        self._states = _summed_states(self._metric)
        self.count_based = self._states is not None
        self._state_defaults = tm.state_defaults(self._metric)
        self._gathers = not self.count_based and _gathers_itself(self._metric)
        if batch_additive is None:
            batch_additive = (
                self._states is not None
                and not any(self._state_defaults[n].is_floating_point() for n in self._states)
                and getattr(self._metric, "full_state_update", None) is False
                and _known_batch_additive(self._metric)
            )
        self.batch_additive = batch_additive
        #: per state: (name, shape, dtype), as packed by the last local_counts()
        self._layout: list[tuple[str, torch.Size, torch.dtype]] = []

    def start(self, device: torch.device) -> None:
        self._metric.reset()
        if getattr(self, "_device", None) != device:
            self._metric.to(device)
        self._device = device
        self._total = 0  # host int: no device op per batch
        self._ranges: list[tuple[Tensor, Tensor]] = []  # per integer-labelled update: aminmax
        self._classes: list[int] = []  # its class count

    def update(self, preds: Tensor, target: Tensor) -> None:
        _refuse_meta(preds, target)
        problem = _class_dim_problem(preds, target)
        if problem is not None:
            raise EvaluationError(problem)
        if (
            preds.ndim == target.ndim + 1
            and target.dtype != torch.bool
            and not target.is_floating_point()
            and target.numel()
        ):
            low, high = torch.aminmax(target)
            self._ranges.append((low, high))
            self._classes.append(preds.shape[1])
        self._total += target.shape[0]
        before = input_versions(preds, target)
        try:
            self._metric.update(preds, target)
        except (RuntimeError, ValueError, TypeError, IndexError) as err:
            raise EvaluationError(
                f"metric {self.name}: its update raised {type(err).__name__}: {err}"
            ) from err
        _check_unmodified(f"metric {self.name}", before, preds, target)

    def local_counts(self) -> Tensor:
        """``[0, samples, out_of_range, *states]``: ``out_of_range`` the number of updates (a
        batch, or a group of batches) holding a target outside the class dimension; then, for a
        count-based metric, its states flattened in declaration order. int64, or float64 (float32
        on MPS) when a state is floating."""
        if len(self._ranges) == 1:  # one update (a task fed as one group)
            low, high = self._ranges[0]
            bad = ((low < 0) | (high >= self._classes[0])).to(torch.int64).reshape(1)
        elif self._ranges:
            lows = torch.stack([low for low, _ in self._ranges])
            highs = torch.stack([high for _, high in self._ranges])
            classes = torch.tensor(self._classes, device=self._device)
            bad = ((lows < 0) | (highs >= classes)).sum().reshape(1)
        else:
            bad = torch.zeros(1, dtype=torch.int64, device=self._device)
        head = torch.tensor([0, self._total], dtype=torch.int64, device=self._device)
        if self._states is None:
            return torch.cat([head, bad])
        layout, flat = [], []
        for name in self._states:
            state, default = getattr(self._metric, name), self._state_defaults[name]
            if not isinstance(state, Tensor) or state.shape != default.shape:
                shown = list(state.shape) if isinstance(state, Tensor) else _what(state)
                raise EvaluationError(
                    f"metric {self.name}: state {name!r} is {shown} after the task, declared "
                    f"{list(default.shape)} (add_state); its states are summed across ranks as "
                    "declared: keep their shapes fixed"
                )
            layout.append((name, state.shape, state.dtype))
            flat.append(state.reshape(-1))
        self._layout = layout
        floating = any(t.is_floating_point() for t in flat)
        dtype = _float_sum_dtype(self._device) if floating else torch.int64
        parts = [head, bad, *(t.to(device=self._device) for t in flat)]
        return torch.cat([t.to(dtype) for t in parts])

    def result(self, reduced_counts: Tensor) -> Tensor:
        """The metric's ``compute()``: one finite number per task, else
        [`EvaluationError`][continual_eval.evaluation.EvaluationError] (with ``task_row``, the
        task's row, for a count-based metric). Count-based: ``reduced_counts`` ``[tasks, K]``; each
        task's summed states are loaded into the metric and its compute (without another sync)
        returns its score."""
        if not self.count_based:
            value = self._one_number(self._compute_over_ranks(), None)
            if not bool(torch.isfinite(value)):
                raise self._not_finite(value, None)
            return value
        tasks, start = reduced_counts.shape[0], 3
        states = {}  # name -> every task's summed state [tasks, *shape], a copy of its own
        for name, shape, dtype in self._layout:
            block = reduced_counts[:, start : start + shape.numel()]
            states[name] = block.to(dtype=dtype, copy=True).reshape(tasks, *shape)
            start += shape.numel()
        values = []
        for row in range(tasks):
            for name, state in states.items():
                setattr(self._metric, name, state[row])
            values.append(self._one_number(tm.unwrapped_compute(self._metric), row, convert=False))
        device = values[0].device
        scores = torch.stack([v if v.device == device else v.to(device) for v in values]).double()
        finite = torch.isfinite(scores)
        if not bool(finite.all()):
            row = int((~finite).int().argmax())
            raise self._not_finite(scores[row], row)
        return scores

    def _compute_over_ranks(self) -> Any:
        """The metric's ``compute`` over every rank's samples of the task just scored: its states
        gathered by `gathered_states` (the same
        collectives on every rank, whether it saw samples or not), then computed without another
        sync. A metric with a sync of its own (`_gathers_itself`) runs it; one process
        computes locally."""
        metric = self._metric
        if not (self._gathers and metric.distributed_available_fn()):
            return metric.compute()
        with (
            gathered_states(metric, self.name, self._device),
            tm.sync_disabled(metric),
            _quiet_compute_warning(self._total == 0),
        ):
            return metric.compute()

    def _one_number(self, value: Any, row: int | None, convert: bool = True) -> Tensor:
        """``value`` as a scalar tensor (float64 with ``convert``), else
        [`EvaluationError`][continual_eval.evaluation.EvaluationError]."""
        if isinstance(value, (int, float)):
            value = torch.tensor(float(value))
        if not isinstance(value, Tensor):
            shown = (
                f"a dict with keys {sorted(value)}" if isinstance(value, Mapping) else _what(value)
            )
            raise _row_error(
                f"metric {self.name} returned {shown}, not one number; continual-eval records one "
                "score per task: pass a metric whose compute() returns a scalar tensor",
                row,
            )
        value = value.detach()
        if value.numel() != 1:
            raise _row_error(
                f"metric {self.name} returned a tensor of shape {list(value.shape)}, not one "
                "number; continual-eval records one score per task: reduce it in the metric "
                "(e.g. average='macro' or 'micro' instead of average='none')",
                row,
            )
        return value.double().reshape(()) if convert else value.reshape(())

    def _not_finite(self, value: Tensor, row: int | None) -> EvaluationError:
        return _row_error(
            f"metric {self.name} returned {value.item()}, not a finite score; a score must be "
            "defined on every task (e.g. a ratio whose denominator is 0 on this task's "
            "samples, such as the recall of a class absent from its test set)",
            row,
        )


def item_support(scorer: Any) -> str | None:
    """Why ``scorer``'s per-task score is no mean over per-item values the loop can record
    (``None``: it is). Built-ins: accuracy, top-k accuracy, the losses (per-sample values) and
    `GenerationScorer` (per-prompt text scores; exact match as bits) and the class-incremental
    scorers (each sample's correctness as bits) are; metrics (a torchmetrics ``compute`` is no
    mean over items in general: macro averages, F1, AUROC) and the token scorers (means over
    tokens, not over sequences) are not. A scorer of one's own is when it defines
    ``local_items()`` (the values of the samples fed since ``start``, in the order fed, while
    its ``keep_items`` is set) and ``items_binary`` (a bool: 0/1 values)."""
    if isinstance(scorer, _LabelScorer):
        if type(scorer)._batch_items is _LabelScorer._batch_items:
            return f"{type(scorer).__name__} keeps no per-sample values"
        return None
    if isinstance(scorer, MetricScorer):
        return (
            "a torchmetrics metric's compute() is not a mean over items in general "
            "(macro averages, F1, AUROC)"
        )
    if callable(getattr(scorer, "local_items", None)) and isinstance(
        getattr(scorer, "items_binary", None), bool
    ):
        return None
    return (
        f"{type(scorer).__name__} defines no local_items() and items_binary (per-item values "
        "of a mean over items)"
    )


def checked_update(scorer: Scorer) -> Callable[[Tensor, Tensor], None]:
    """What the evaluation loop calls to feed ``scorer`` a batch: ``scorer.update`` itself for the
    package's scorers (they check their inputs, and a user's loss or metric inside them,
    themselves), else a call that refuses meta tensors, turns an exception of the scorer's into
    an [`EvaluationError`][continual_eval.evaluation.EvaluationError] (chained) and raises when the
    update modified ``preds`` or ``target`` in place (`input_versions`; not detectable on inference
    tensors)."""
    if isinstance(scorer, (_LabelScorer, MetricScorer)):
        return scorer.update
    update = scorer.update

    def checked(preds: Tensor, target: Tensor) -> None:
        _refuse_meta(preds, target)
        before = input_versions(preds, target)
        try:
            update(preds, target)
        except EvaluationError:
            raise
        except Exception as err:
            raise EvaluationError(f"its update raised {type(err).__name__}: {err}") from err
        _check_unmodified("its update", before, preds, target)

    return checked


#: ``id(scorer) -> the key the user gave it in scorers=`` during an evaluation (`scorer_keys`)
_KEYS: contextvars.ContextVar[Mapping[int, str] | None] = contextvars.ContextVar(
    "continual_eval_scorer_keys", default=None
)


@contextmanager
def scorer_keys(scorers: Mapping[str, Scorer]) -> Iterator[None]:
    """While inside: errors name each scorer of ``scorers`` by its key there (`scorer_label`)."""
    token = _KEYS.set({id(s): key for key, s in scorers.items()})
    try:
        yield
    finally:
        _KEYS.reset(token)


def scorer_label(scorer: Scorer) -> str:
    """``scorer 'KEY'`` in messages: the key it has in ``scorers=`` (inside `scorer_keys`),
    with its ``name`` beside when they differ (``scorer 'f1' (name 'proto')``)."""
    keys = _KEYS.get()
    key = None if keys is None else keys.get(id(scorer))
    name = getattr(scorer, "name", None)
    if key is None or key == name:
        return f"scorer {name!r}"
    return f"scorer {key!r} (name {name!r})"


def scorer_batch_error(
    scorer: Scorer, err: EvaluationError, first: int, batches: int = 1
) -> EvaluationError:
    """``err`` (raised while ``scorer`` scored batch ``first``, or the ``batches`` consecutive
    batches from ``first`` fed to it together) as a message naming the batch and the scorer."""
    where = f"batch {first}" if batches <= 1 else f"batches {first}-{first + batches - 1}"
    out = EvaluationError(f"{where}, {scorer_label(scorer)}: {err}")
    out.task_row = err.task_row
    return out


def checked_result(
    scorer: Scorer, reduced_counts: Tensor, task_ids: Sequence[int] | None = None
) -> Tensor:
    """``scorer.result(reduced_counts)``, checked: a real (not complex or boolean) tensor off the
    meta device holding, with ``task_ids`` (a count-based scorer), one score per task ``[tasks]``,
    else one number (returned as a 0-d tensor). Anything else is an
    [`EvaluationError`][continual_eval.evaluation.EvaluationError] naming the scorer (and the
    tasks)."""
    value = scorer.result(reduced_counts)
    want = "one number" if task_ids is None else f"[{len(task_ids)}], one score per task"
    what = f"{scorer_label(scorer)}: result()"
    if task_ids is not None:
        what += f" over the {len(task_ids)} task(s) {list(task_ids)}"
    if not isinstance(value, Tensor):
        raise EvaluationError(f"{what} returned {_what(value)}, not a tensor of {want}")
    if value.is_meta:
        raise EvaluationError(f"{what} returned a tensor on the meta device (no values)")
    if value.is_complex() or value.dtype == torch.bool:
        raise EvaluationError(f"{what} returned a {value.dtype} tensor; scores are real numbers")
    if task_ids is None:
        if value.numel() != 1 or value.ndim > 1:  # 0-d or [1]; [[0.5]] is a matrix
            raise EvaluationError(
                f"{what} returned a tensor of shape {list(value.shape)}, not {want}"
            )
        return value.reshape(())
    if value.ndim != 1 or value.shape[0] != len(task_ids):
        raise EvaluationError(
            f"{what} returned a tensor of shape {list(value.shape)}, not {want} (row k of "
            "reduced_counts holds the k-th task's counts)"
        )
    return value


def _row_error(message: str, row: int | None) -> EvaluationError:
    err = EvaluationError(message)
    err.task_row = row
    return err


_TOP_K = re.compile(r"^top_?(\d+)(_acc|_accuracy)?$")
_STRINGS = (
    "'accuracy'/'acc', 'cross_entropy'/'loss', 'top5' (or 'top_5', 'top5_accuracy'; any k >= 1), "
    "'perplexity'/'ppl', 'token_nll', 'token_accuracy'"
)


def _protocol_gaps(obj: Any) -> list[str]:
    """What ``obj`` lacks of the [`Scorer`][continual_eval.evaluation.Scorer] protocol, in words
    (empty: it satisfies it)."""
    gaps = [f"`{a}`" for a in _PROTOCOL_ATTRIBUTES if not hasattr(obj, a)]
    gaps += [f"method `{m}()`" for m in _PROTOCOL_METHODS if not callable(getattr(obj, m, None))]
    if gaps:
        return gaps
    if not isinstance(obj.name, str) or not obj.name:
        gaps.append(f"`name` must be a non-empty str (got {obj.name!r})")
    for flag in ("higher_is_better", "count_based"):
        if not isinstance(getattr(obj, flag), bool):
            gaps.append(f"`{flag}` must be a bool (got {getattr(obj, flag)!r})")
    bounds = obj.bounds
    if bounds is not None and not (
        isinstance(bounds, tuple)
        and len(bounds) == 2
        and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
        and bounds[0] < bounds[1]
    ):
        gaps.append(f"`bounds` must be None or a tuple (low, high), low < high (got {bounds!r})")
    return gaps


def _binds_no_arguments(fn: Any) -> bool:
    """Whether ``fn()`` is a valid call (an ``nn.Module``: its ``forward``)."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        inspect.signature(target).bind()
    except TypeError:
        return False
    except ValueError:  # no signature to inspect
        return False
    return True


def make_scorer(spec: Any) -> Scorer:
    """A [`Scorer`][continual_eval.evaluation.Scorer] from ``spec``:

    * ``"accuracy"``/``"acc"``: `AccuracyScorer`; ``"cross_entropy"``/``"loss"``:
      `LossScorer` (per-sample cross-entropy); ``"top5"``, ``"top_5"``,
      ``"top5_accuracy"`` (any ``k >= 1``): `TopKAccuracyScorer`; ``"perplexity"``/
      ``"ppl"``, ``"token_nll"``, ``"token_accuracy"``: the token scorers of
      `language` (default options);
    * a torchmetrics ``Metric`` instance, a ``Metric`` subclass or another callable taking no
      argument that returns a ``Metric`` (e.g. ``functools.partial(MulticlassF1Score,
      num_classes=10)``): `MetricScorer`;
    * an object satisfying [`Scorer`][continual_eval.evaluation.Scorer] (returned as it is);
    * any other callable taking ``(preds, target)``: `LossScorer` with it as ``loss_fn``.

    Raises:
        ValueError: an unknown string.
        TypeError: anything else, naming what an object lacks of the
            [`Scorer`][continual_eval.evaluation.Scorer] protocol.
    """
    from torchmetrics import Metric

    if isinstance(spec, str):
        key = spec.strip().lower()
        if key in ("accuracy", "acc"):
            return AccuracyScorer()
        if key in ("cross_entropy", "loss"):
            return LossScorer()
        match = _TOP_K.match(key)
        if match and int(match.group(1)) >= 1:
            return TopKAccuracyScorer(int(match.group(1)))
        token_scorer = make_token_scorer(key)  # evaluation/language.py
        if token_scorer is not None:
            return token_scorer
        hint = " (give k: 'top5')" if key in ("top_k", "topk", "top_k_accuracy") else ""
        raise ValueError(f"unknown scorer {spec!r}{hint}; known strings: {_STRINGS}")
    if isinstance(spec, Metric):
        return MetricScorer(spec)
    if isinstance(spec, type):
        if issubclass(spec, Metric):
            return MetricScorer(spec)
        raise TypeError(
            f"make_scorer got the class {spec.__name__}; pass an instance (a scorer, a metric) "
            "or a loss callable"
        )
    gaps = _protocol_gaps(spec)
    if not gaps:
        return spec
    looks_like_scorer = any(
        callable(getattr(spec, m, None)) for m in ("start", "local_counts", "result")
    )
    if looks_like_scorer:
        raise TypeError(
            f"{type(spec).__name__} does not satisfy the Scorer protocol: " + "; ".join(gaps)
        )
    if callable(spec):
        if _binds_no_arguments(spec):
            made = spec()
            if not isinstance(made, Metric):
                raise TypeError(
                    f"{_callable_name(spec)} takes no argument, so it was read as a metric "
                    f"factory, but it returned {_what(made)}, not a torchmetrics Metric; a loss "
                    "takes (preds, target)"
                )
            return MetricScorer(made)
        return LossScorer(spec)
    raise TypeError(
        f"cannot make a scorer of {_what(spec)}: pass one of {_STRINGS}, a torchmetrics Metric "
        "(or a factory), a loss callable (preds, target) -> per-sample losses, or an object with "
        + ", ".join(f"`{a}`" for a in (*_PROTOCOL_ATTRIBUTES, *_PROTOCOL_METHODS))
    )

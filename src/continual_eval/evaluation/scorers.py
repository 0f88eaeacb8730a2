r"""Scorers: the unit of measurement. Each scorer of a run owns one score matrix :math:`R^m`.

:func:`~continual_eval.evaluation.evaluate_tasks` runs one forward pass per test batch and feeds
its ``(preds, target)`` to every scorer of the run, in order. A scorer is any object satisfying
:class:`Scorer`; :func:`make_scorer` builds one from a short specification.

Built-ins:

============================  =======================  ================  ==============
scorer                        ``name``                 higher is better  ``bounds``
============================  =======================  ================  ==============
:class:`AccuracyScorer`       ``accuracy``             yes               ``(0, 1)``
:class:`TopKAccuracyScorer`   ``top{k}_accuracy``      yes               ``(0, 1)``
:class:`LossScorer`           ``cross_entropy``, or    no                ``None``
                              the loss's name
:class:`MetricScorer`         the metric's class name  the metric's      ``(0, 1)`` or
                                                                         ``None``
============================  =======================  ================  ==============

Exactness under DDP on unpadded shards: count/sum scorers (``count_based = True``) return their
per-rank sums from :meth:`Scorer.local_counts`, which the loop sums across ranks in its own
collectives (int64 counts exactly; float sums exactly up to summation order, see
:func:`~continual_eval.evaluation.evaluate_tasks`); a torchmetrics metric is reduced by its own
state sync. Scorers hold no state between evaluations (:meth:`Scorer.start` resets them), so a
resumed run needs nothing from them.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from continual_eval.evaluation.errors import EvaluationError, _what

__all__ = [
    "AccuracyScorer",
    "LossScorer",
    "MetricScorer",
    "Scorer",
    "TopKAccuracyScorer",
    "make_scorer",
]


class Scorer(Protocol):
    """What :func:`~continual_eval.evaluation.evaluate_tasks` needs of a scorer.

    Attributes:
        name: what a cell of its matrix holds (``"accuracy"``, ``"cross_entropy"``,
            ``"top5_accuracy"``, a metric's class name).
        higher_is_better: the direction of the score (forgetting and transfer are signed by it).
        bounds: ``(lowest, highest)`` score, or ``None`` when unbounded (e.g. a loss).
        count_based: ``True``: :meth:`result` is a function of the reduced :meth:`local_counts`
            alone, called once after all tasks with every task's counts; ``False``: :meth:`result`
            runs its own collectives (e.g. a torchmetrics sync) and is called once per task, right
            after it, on every rank in the same order.
        target_problems: (optional) ``target_problems[k - 2]`` describes a positive entry ``k >=
            2`` of :meth:`local_counts`, with ``{n}`` its count; without it: targets outside the
            class dimension.

    Protocol per task: ``start(device)``, ``update(preds, target)`` for each batch (the tensors
    every scorer sees; do not modify them in place), then ``local_counts()`` and ``result``.
    """

    name: str
    higher_is_better: bool
    bounds: tuple[float, float] | None
    count_based: bool

    def start(self, device: torch.device) -> None:
        """Forget the previous task; the task's batches arrive on ``device``."""
        ...

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Score one batch. Raise :class:`EvaluationError` for an output that cannot be scored;
        count invalid targets instead (reported after the task on every rank, see
        :meth:`local_counts`). Avoid host syncs (``.item()``, ``int(t)``) here."""
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
        :meth:`local_counts`, in the scorer's dtype), return ``[tasks]``; else ``[K]`` of the
        task just scored, return a scalar."""
        ...


#: the attributes and methods :func:`make_scorer` requires of a user's scorer object
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
    #: what a positive entry ``2, 3, 4`` of :meth:`local_counts` means; ``{n}``: that entry
    target_problems: tuple[str, ...] = (_OUT_OF_RANGE, _NOT_WHOLE, _NOT_DISTRIBUTION)
    #: layouts without a class dimension (``preds`` already labels) are refused when set
    needs_class_scores = False

    def start(self, device: torch.device) -> None:
        self._device = device
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

    def update(self, preds: Tensor, target: Tensor) -> None:
        signature = (preds.shape[1:], preds.dtype, target.shape[1:], target.dtype)
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
        self._values.append(self._batch_value(preds, target, labels, mode))
        self._total += labels.numel()

    def _sum(self, values: list[Tensor], dtype: torch.dtype = torch.int64) -> Tensor:
        if not values:
            return torch.zeros((), dtype=dtype, device=self._device)
        return torch.stack(values).sum().to(dtype)

    def _label_counts(self, dtype: torch.dtype) -> list[Tensor]:
        """``[total, out_of_range, not_whole, not_distribution]`` as ``dtype`` scalars."""
        out_of_range = torch.zeros((), dtype=torch.int64, device=self._device)
        if self._num_classes is not None and self._ranges:
            lowest = torch.stack([low for low, _ in self._ranges]).min()
            highest = torch.stack([high for _, high in self._ranges]).max()
            out_of_range = ((lowest < 0) | (highest >= self._num_classes)).long()
        total = torch.tensor(self._total, dtype=dtype, device=self._device)
        return [
            total,
            out_of_range.to(dtype),
            self._sum(self._not_whole, dtype),
            self._sum(self._not_distribution, dtype),
        ]

    def local_counts(self) -> Tensor:
        """``[correct, total, out_of_range, not_whole, not_distribution]`` (int64)."""
        return torch.stack([self._sum(self._values), *self._label_counts(torch.int64)])

    def result(self, reduced_counts: Tensor) -> Tensor:
        correct, total = reduced_counts[..., 0], reduced_counts[..., 1]
        return correct.double() / total.double()


class AccuracyScorer(_LabelScorer):
    r"""Accuracy :math:`\frac{1}{N}\sum_n [\hat y_n = y_n]` with :math:`\hat y` the argmax over
    dim 1 of ``preds`` (or ``preds`` itself when it holds integer labels shaped like ``target``).

    Targets are class indices (integers, or floats holding whole numbers), or one-hot (float or
    integer) / probability vectors shaped like float ``preds`` (``[N, C, ...]``, every vector over
    dim 1 non-negative and summing to 1), read as their argmax. Counts and target checks stay on
    the device (no host sync per batch); invalid targets are counted and reported after the task
    (``target_problems``). Exact under DDP: correct/total counts are summed across ranks.
    """

    name = "accuracy"

    def _batch_value(self, preds: Tensor, target: Tensor, labels: Tensor, mode: str) -> Tensor:
        if mode in ("distribution", "labels", "float_labels"):
            preds = preds.argmax(dim=1)
        return (preds == labels).sum()


class TopKAccuracyScorer(_LabelScorer):
    r"""Top-k accuracy :math:`\frac{1}{N}\sum_n [\,|\{c : s_{nc} > s_{n y_n}\}| < k\,]`: a
    sample counts as correct when fewer than ``k`` classes score strictly higher than its label
    over dim 1 (so a tie at the k-th place counts in the label's favour; without ties this is "the
    label is among the ``k`` highest scores"). Named ``top{k}_accuracy``; bounds ``(0, 1)``.

    Targets as for :class:`AccuracyScorer` (a one-hot/probability target is read as its argmax);
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

    def _batch_value(self, preds: Tensor, target: Tensor, labels: Tensor, mode: str) -> Tensor:
        assert self._num_classes is not None
        # an out-of-range label is reported after the task; clamped here so gather stays in range
        label_score = preds.gather(1, labels.clamp(0, self._num_classes - 1).unsqueeze(1))
        return ((preds > label_score).sum(dim=1) < self.k).sum()


class LossScorer(_LabelScorer):
    r"""Mean loss :math:`\frac{1}{N}\sum_n \ell_n` over the task's test samples; lower is better,
    unbounded (``bounds = None``).

    ``loss_fn=None``: the per-sample cross-entropy ``F.cross_entropy(preds, target,
    reduction="none")`` of class scores ``[N, C, ...]`` (mean over every element for ``[N, C, d1,
    ...]`` outputs, as ``reduction="mean"`` does), named ``cross_entropy``. Targets as for
    :class:`AccuracyScorer`: class indices (invalid ones are counted and reported after the task,
    and clamped into range before the loss so no device assert fires), or one-hot/probability
    targets shaped like ``preds`` (used as soft targets).

    ``loss_fn`` a callable ``(preds, target) -> Tensor``: per-sample losses with a leading batch
    dimension ``[N, ...]`` (the mean is over all their elements), or one scalar, read as the
    batch's mean and weighted by its size :math:`N` = ``preds.shape[0]`` (exact for a plain mean
    over samples). Its targets are not checked. Named ``name``, else the callable's
    ``__name__`` (a class name for an ``nn.Module``), else ``"loss"``.

    Sums: each batch's loss sum is taken in float64 on the device (float32 on MPS) and summed
    across ranks by the loop's reduction, so under DDP the mean equals one process's up to float
    summation order. A non-finite loss sum (a NaN or infinite per-sample loss) is reported after
    the task.
    """

    higher_is_better = False
    bounds = None

    def __init__(
        self, loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None, name: str | None = None
    ) -> None:
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable (preds, target) -> losses, got {loss_fn!r}")
        self.loss_fn = loss_fn
        if name is None:
            name = "cross_entropy" if loss_fn is None else _callable_name(loss_fn)
        self.name = name
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
        return losses.sum(dtype=self._dtype)

    def update(self, preds: Tensor, target: Tensor) -> None:
        if self.loss_fn is None:
            super().update(preds, target)
            return
        losses = self.loss_fn(preds, target)
        if not isinstance(losses, Tensor):
            raise EvaluationError(
                f"loss {self.name} returned {_what(losses)}, not a tensor of per-sample losses"
            )
        batch = preds.shape[0]
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
        problems = self._label_counts(dtype)[1:] if self.loss_fn is None else []
        loss_sum = self._sum(self._values, dtype)
        return torch.stack(
            [
                loss_sum,
                torch.tensor(self._total, dtype=dtype, device=self._device),
                *problems,
                (~torch.isfinite(loss_sum)).to(dtype),  # a NaN/inf loss makes the sum one
            ]
        )

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


class MetricScorer:
    """Any torchmetrics metric (an instance, cloned, or a factory returning one), its state
    reduced by torchmetrics' own sync (exact on unpadded shards); its ``compute()`` must return one
    finite number per task.

    ``name`` is the metric's class name; ``higher_is_better`` the metric's (a metric that declares
    none, ``None``, is taken as higher-is-better); ``bounds`` ``(0, 1)`` when the metric's plot
    bounds are ``0`` and ``1`` (``plot_lower_bound``/``plot_upper_bound``), else ``None``.
    """

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
        declared = getattr(self._metric, "higher_is_better", None)
        self.higher_is_better = True if declared is None else bool(declared)
        low = getattr(self._metric, "plot_lower_bound", None)
        high = getattr(self._metric, "plot_upper_bound", None)
        self.bounds: tuple[float, float] | None = (0.0, 1.0) if (low, high) == (0, 1) else None

    def start(self, device: torch.device) -> None:
        self._metric.reset()
        if getattr(self, "_device", None) != device:
            self._metric.to(device)
        self._device = device
        self._total = 0  # host int: no device op per batch
        self._ranges: list[Tensor] = []  # per integer-labelled batch: [min, max] (aminmax)
        self._classes: list[int] = []  # its class count

    def update(self, preds: Tensor, target: Tensor) -> None:
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
            self._ranges.append(torch.stack([low, high]))
            self._classes.append(preds.shape[1])
        self._total += target.shape[0]
        self._metric.update(preds, target)

    def local_counts(self) -> Tensor:
        """``[0, samples, out_of_range]`` (int64; ``out_of_range``: the number of batches holding a
        target outside the class dimension)."""
        zero = torch.zeros((), dtype=torch.int64, device=self._device)
        bad = zero
        if self._ranges:
            ranges = torch.stack(self._ranges)
            classes = torch.tensor(self._classes, device=self._device)
            bad = ((ranges[:, 0] < 0) | (ranges[:, 1] >= classes)).sum()
        total = torch.tensor(self._total, dtype=torch.int64, device=self._device)
        return torch.stack([zero, total, bad.to(torch.int64)])

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


_TOP_K = re.compile(r"^top_?(\d+)(_acc|_accuracy)?$")
_STRINGS = (
    "'accuracy'/'acc', 'cross_entropy'/'loss', 'top5' (or 'top_5', 'top5_accuracy'; any k >= 1)"
)


def _protocol_gaps(obj: Any) -> list[str]:
    """What ``obj`` lacks of the :class:`Scorer` protocol, in words (empty: it satisfies it)."""
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
    """A :class:`Scorer` from ``spec``:

    * ``"accuracy"``/``"acc"``: :class:`AccuracyScorer`; ``"cross_entropy"``/``"loss"``:
      :class:`LossScorer` (per-sample cross-entropy); ``"top5"``, ``"top_5"``,
      ``"top5_accuracy"`` (any ``k >= 1``): :class:`TopKAccuracyScorer`;
    * a torchmetrics ``Metric`` instance, a ``Metric`` subclass or another callable taking no
      argument that returns a ``Metric`` (e.g. ``functools.partial(MulticlassF1Score,
      num_classes=10)``): :class:`MetricScorer`;
    * an object satisfying :class:`Scorer` (returned as it is);
    * any other callable taking ``(preds, target)``: :class:`LossScorer` with it as ``loss_fn``.

    Raises:
        ValueError: an unknown string.
        TypeError: anything else, naming what an object lacks of the :class:`Scorer` protocol.
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

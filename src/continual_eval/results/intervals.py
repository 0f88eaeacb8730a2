"""The ``intervals`` and ``items`` sections: what one run's per-item records say.

``ContinualEvalCallback(item_records=...)`` keeps every test item's value at the baseline and
after every stage (`continual_eval._item_record`). From them:

* ``intervals``: per recorded matrix, every cell's confidence interval (Wilson for 0/1 items,
  Student t otherwise: [`cell_intervals`][continual_eval.functional.cell_intervals]'s formulas),
  and the metrics' (ACC, BWT, FWT, forgetting, learning accuracy, average incremental accuracy,
  and intransigence when the reference holds its per-item values) by the paired bootstrap over
  test items
  ([`paired_bootstrap`][continual_eval.functional.paired_bootstrap]: one resample of each
  task's items used in every cell of that task), with the confidence, resamples, weights and
  seed stated; with per-step evaluations, the curve metrics' (min-ACC, WC-ACC, the stability
  gap, the stage areas, anytime accuracy, ``LCA_beta``, the AUC forward transfer) by the same
  paired resamples (``step_metrics``); ``unavailable``: metric -> why it has no interval
  (intransigence against a reference of scores only) or what an interval does not cover;
* ``items``: the memory the records hold, the matrices not recorded and why, and per 0/1 matrix
  the item transitions of [`item_transitions`][continual_eval.functional.item_transitions]
  (right -> wrong and wrong -> right against the previous evaluation and against the diagonal,
  the items forgotten at least once).

Both state the error of the finite test set for the trained models as they are, not the
variation between training runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from continual_eval.functional.intervals import DEFAULT_CONFIDENCE, wilson_interval
from continual_eval.results import schema
from continual_eval.results._convert import cells, matrix, present, vector

__all__ = [
    "CLASS_IL_PAIRED",
    "CLASS_IL_UNAVAILABLE",
    "ClassIncrementalIntervals",
    "ClassIncrementalPaired",
    "HeldOutIntervals",
    "IntervalResults",
    "ItemResults",
    "MatrixIntervals",
    "Transitions",
]


#: ``(estimate, low, high)``, tensors of one shape (NaN: undefined)
Triple = tuple[Tensor, Tensor, Tensor]


@dataclass(frozen=True)
class MatrixIntervals:
    """One matrix's intervals: ``low``/``high`` ``[s, T]`` per cell and ``baseline_low`` /
    ``baseline_high`` ``[T]`` (NaN: not evaluated) by ``cell_method``; ``metrics``: name ->
    ``(estimate, low, high)`` by the paired bootstrap; ``per_task``: name -> ``(estimate, low,
    high)`` ``[T-1]`` tensors each (``bwt``, ``forgetting``, ``fwt``: task ``j < s - 1``;
    ``intransigence`` ``[s]``), by the same resamples; ``num_items`` ``[T]``; ``unavailable``:
    metric -> why it has no interval."""

    cell_method: str
    low: Tensor
    high: Tensor
    baseline_low: Tensor
    baseline_high: Tensor
    metrics: Mapping[str, tuple[float, float, float]]
    num_items: tuple[int, ...]
    unavailable: Mapping[str, str] = field(default_factory=dict)
    per_task: Mapping[str, Triple] = field(default_factory=dict)
    #: the step curves' metrics by the same paired resamples (per-step evaluations with
    #: ``item_records``): ``min_acc``, ``wc_acc``, ``stage_auc``,
    #: ``auc_forward_transfer_per_task`` ``[s]``; ``gap_boundary``, ``gap_minimum``,
    #: ``gap_depth``, ``gap_recovery_steps`` ``[s - 1]`` (a recovery's NaN end, where its
    #: depth is defined: not recovered within the stage); their scalars
    #: (``anytime_accuracy``, ``lca``, ``auc_forward_transfer``) are in ``metrics``
    step_metrics: Mapping[str, Triple] = field(default_factory=dict)


def _triple(section: schema.PerTaskIntervalSection) -> Triple:
    return vector(section.estimate), vector(section.low), vector(section.high)


def _triple_section(values: Triple) -> schema.PerTaskIntervalSection:
    estimate, low, high = values
    return schema.PerTaskIntervalSection(estimate=cells(estimate), low=cells(low), high=cells(high))


def _rows_triple(section: schema.RowsIntervalSection, columns: int) -> Triple:
    return tuple(matrix(v, columns) for v in (section.estimate, section.low, section.high))  # type: ignore[return-value]


def _rows_section(values: Triple) -> schema.RowsIntervalSection:
    estimate, low, high = values
    return schema.RowsIntervalSection(estimate=cells(estimate), low=cells(low), high=cells(high))


@dataclass(frozen=True)
class HeldOutIntervals:
    """One matrix's held-out intervals (sets ``h`` in columns, ``H`` of them): every score's
    ``low``/``high`` ``[s, H]`` and the baseline's ``[H]`` by ``cell_method`` (Wilson / t, as the
    task cells), and, by the paired bootstrap over each set's items (one resample of a set's
    items used at the baseline and at every stage), ``delta`` ``s_h[i] - b_h`` ``[s, H]`` and
    ``worst_drop`` ``[H]`` as ``(estimate, low, high)``; ``num_items`` ``[H]``."""

    cell_method: str
    low: Tensor
    high: Tensor
    baseline_low: Tensor
    baseline_high: Tensor
    delta: Triple
    worst_drop: Triple
    num_items: tuple[int, ...]

    def to_section(self) -> schema.HeldOutIntervalsSection:
        return schema.HeldOutIntervalsSection(
            cell_method=self.cell_method,  # type: ignore[arg-type]
            low=cells(self.low),
            high=cells(self.high),
            baseline_low=cells(self.baseline_low),
            baseline_high=cells(self.baseline_high),
            delta=_rows_section(self.delta),
            worst_drop=_triple_section(self.worst_drop),
            num_items=list(self.num_items),
        )

    @classmethod
    def from_section(cls, section: schema.HeldOutIntervalsSection, H: int) -> HeldOutIntervals:
        return cls(
            cell_method=section.cell_method,
            low=matrix(section.low, H),
            high=matrix(section.high, H),
            baseline_low=vector(section.baseline_low),
            baseline_high=vector(section.baseline_high),
            delta=_rows_triple(section.delta, H),
            worst_drop=_triple(section.worst_drop),
            num_items=tuple(section.num_items),
        )


#: the class-incremental numbers without a one-run interval, and why
CLASS_IL_UNAVAILABLE = {
    "recency_sample_share": (
        "task i's share of the seen test samples: a count of the test sets themselves, the same "
        "for every model (the reference the prediction share is read against), not an estimate "
        "from the model's predictions"
    ),
}
#: the class-incremental numbers whose interval is the paired bootstrap over the items of
#: ``acc_task_agnostic`` and their labels (`ClassIncrementalPaired`); each is in
#: ``unavailable``, with the reason, where that bootstrap is not made
CLASS_IL_PAIRED = (
    "seen_accuracy_task",
    "old_accuracy_task",
    "average_incremental_accuracy",
    "mean_class_accuracy",
    "amca",
    "class_forgetting",
)
#: `ClassIncrementalPaired.per_stage`'s entries (``[s]`` each) and `metrics`' (scalars)
PAIRED_PER_STAGE = (
    "seen_accuracy_task",
    "old_accuracy_task",
    "mean_class_accuracy",
    "amca_per_stage",
    "mean_class_forgetting_per_stage",
)
PAIRED_METRICS = (
    "average_incremental_accuracy_task",
    "average_incremental_accuracy_sample",
    "amca",
    "mean_class_forgetting",
)


def _scalar(values: Triple, at: int | None = None) -> tuple[float, float, float]:
    return tuple(float(t if at is None else t[at]) for t in values)  # type: ignore[return-value]


@dataclass(frozen=True)
class ClassIncrementalPaired:
    """The paired percentile bootstrap over ``matrix``'s test items (``acc_task_agnostic``)
    and their labels, one double-or-nothing resample of each task's items used at every stage
    (`continual_eval.functional._class_il_intervals`; the run's ``confidence``, ``resamples``
    and ``seed``, the very draws of the matrix's own bootstrap): ``per_stage`` name ->
    ``(estimate, low, high)`` ``[s]`` (`PAIRED_PER_STAGE`), ``class_forgetting`` ``[C]``,
    ``metrics`` name -> ``(estimate, low, high)`` (`PAIRED_METRICS`: the average incremental
    accuracy in both weightings, AMCA, the mean per-class forgetting after the last stage).
    The task-weighted seen accuracy of the last stage and its mean over stages equal the
    matrix's ACC and average incremental accuracy, intervals included (the same draws)."""

    matrix: str
    per_stage: Mapping[str, Triple]
    class_forgetting: Triple
    metrics: Mapping[str, tuple[float, float, float]]
    method: str = "paired percentile bootstrap over test items and their classes"

    @classmethod
    def from_bootstrap(cls, values: Mapping[str, Any], matrix: str) -> ClassIncrementalPaired:
        """From `class_il_bootstrap`'s statistics (one run)."""
        per_stage = {key: tuple(values[key]) for key in PAIRED_PER_STAGE}
        metrics = {
            "average_incremental_accuracy_task": _scalar(
                values["average_incremental_accuracy_task"]
            ),
            "average_incremental_accuracy_sample": _scalar(
                values["average_incremental_accuracy_sample"]
            ),
            "amca": _scalar(values["amca_per_stage"], -1),
            "mean_class_forgetting": _scalar(values["mean_class_forgetting_per_stage"], -1),
        }
        return cls(matrix, per_stage, tuple(values["class_forgetting"]), metrics)

    def to_section(self) -> schema.ClassIncrementalPairedSection:
        return schema.ClassIncrementalPairedSection(
            method=self.method,
            matrix=self.matrix,
            per_stage={key: _triple_section(v) for key, v in self.per_stage.items()},
            class_forgetting=_triple_section(self.class_forgetting),
            metrics={
                key: schema.MetricIntervalSection(
                    estimate=present(e), low=present(lo), high=present(hi)
                )
                for key, (e, lo, hi) in self.metrics.items()
            },
        )

    @classmethod
    def from_section(cls, section: schema.ClassIncrementalPairedSection) -> ClassIncrementalPaired:
        def number(value: float | None) -> float:
            return math.nan if value is None else float(value)

        return cls(
            matrix=section.matrix,
            per_stage={key: _triple(v) for key, v in section.per_stage.items()},
            class_forgetting=_triple(section.class_forgetting),
            metrics={
                key: (number(v.estimate), number(v.low), number(v.high))
                for key, v in section.metrics.items()
            },
            method=section.method,
        )


@dataclass(frozen=True)
class ClassIncrementalIntervals:
    """The class-incremental intervals. Wilson intervals of the proportions, from the
    confusion counts of
    [`ClassIncrementalResults`][continual_eval.results.ClassIncrementalResults] (each a mean of
    per-item 0/1: the task-agnostic prediction equals the label): ``per_class_accuracy``
    ``[s, C]`` (``conf[i, c, c]`` of ``n_c``), and per stage ``i`` the sample-weighted
    ``seen_accuracy`` (classes of tasks ``<= i``), ``old_accuracy`` (tasks ``< i``) and
    ``new_accuracy`` (task ``i``), and ``recency_prediction_share`` (the seen test samples
    predicted as a class of task ``i``, of all seen test samples: each sample one trial), each
    ``(estimate, low, high)`` (NaN: undefined). ``paired``: the numbers that read each item's
    class across stages, by the paired bootstrap (`ClassIncrementalPaired`; ``None`` where it
    is not made, the reason in ``unavailable``); ``unavailable``: number -> why it has no
    interval."""

    per_class_accuracy: Triple
    seen_accuracy: Triple
    old_accuracy: Triple
    new_accuracy: Triple
    method: str = "wilson"
    unavailable: Mapping[str, str] = field(default_factory=lambda: dict(CLASS_IL_UNAVAILABLE))
    recency_prediction_share: Triple | None = None
    paired: ClassIncrementalPaired | None = None

    @classmethod
    def compute(cls, results: Any, confidence: float) -> ClassIncrementalIntervals:
        """From ``results`` (a `ClassIncrementalResults`): its ``confusion``, ``test_samples``
        and ``task_classes`` (the Wilson part; ``paired`` is added by the item records)."""
        confusion = results.confusion.coalesce()
        s, C = int(confusion.shape[0]), int(confusion.shape[-1])
        index, count = confusion.indices(), confusion.values().to(torch.float64)
        diagonal = index[1] == index[2]
        correct = torch.zeros(s, C, dtype=torch.float64)
        correct.index_put_(
            (index[0][diagonal], index[1][diagonal]), count[diagonal], accumulate=True
        )
        n = results.test_samples.to(torch.float64)
        class_task = torch.full((C,), -1, dtype=torch.int64)
        for t, classes in enumerate(results.task_classes):
            class_task[list(classes)] = t
        stage = torch.arange(s).unsqueeze(1)
        known = (class_task >= 0).unsqueeze(0)
        pools = {
            "seen": known & (class_task.unsqueeze(0) <= stage),
            "old": known & (class_task.unsqueeze(0) < stage),
            "new": class_task.unsqueeze(0) == stage,
        }  # [s, C] each

        def wilson(hits: Tensor, total: Tensor) -> Triple:
            low, high = wilson_interval(hits, total, confidence=confidence)
            return hits / total, low, high

        seen = pools["seen"] & (n > 0)
        estimate, low, high = wilson(correct, n.expand(s, C))
        nan = torch.tensor(math.nan, dtype=torch.float64)
        per_class = (
            torch.where(seen, estimate, nan),
            torch.where(seen, low, nan),
            torch.where(seen, high, nan),
        )

        def pooled(mask: Tensor) -> Triple:
            m = mask.to(torch.float64)
            return wilson((correct * m).sum(1), (n * m).sum(1))

        # recency: the section's own counts (prediction share = new predictions / seen samples)
        share = results.recency_prediction_share.to(torch.float64)
        seen_samples = (n * pools["seen"].to(torch.float64)).sum(1)
        recency = wilson((share * seen_samples).round(), seen_samples)
        return cls(
            per_class_accuracy=per_class,
            seen_accuracy=pooled(pools["seen"]),
            old_accuracy=pooled(pools["old"]),
            new_accuracy=pooled(pools["new"]),
            recency_prediction_share=(share, recency[1], recency[2]),
        )

    def to_section(self) -> schema.ClassIncrementalIntervalsSection:
        return schema.ClassIncrementalIntervalsSection(
            method=self.method,  # type: ignore[arg-type]
            per_class_accuracy=_rows_section(self.per_class_accuracy),
            seen_accuracy=_triple_section(self.seen_accuracy),
            old_accuracy=_triple_section(self.old_accuracy),
            new_accuracy=_triple_section(self.new_accuracy),
            unavailable=dict(self.unavailable),
            recency_prediction_share=None
            if self.recency_prediction_share is None
            else _triple_section(self.recency_prediction_share),
            paired=None if self.paired is None else self.paired.to_section(),
        )

    @classmethod
    def from_section(
        cls, section: schema.ClassIncrementalIntervalsSection
    ) -> ClassIncrementalIntervals:
        rows = section.per_class_accuracy.estimate
        return cls(
            per_class_accuracy=_rows_triple(
                section.per_class_accuracy, len(rows[0]) if rows else 0
            ),
            seen_accuracy=_triple(section.seen_accuracy),
            old_accuracy=_triple(section.old_accuracy),
            new_accuracy=_triple(section.new_accuracy),
            method=section.method,
            unavailable=dict(section.unavailable),
            recency_prediction_share=None
            if section.recency_prediction_share is None
            else _triple(section.recency_prediction_share),
            paired=None
            if section.paired is None
            else ClassIncrementalPaired.from_section(section.paired),
        )


@dataclass(frozen=True)
class IntervalResults:
    """The ``intervals`` section (module notes)."""

    method: str
    confidence: float
    resamples: int
    seed: int
    weights: str
    forgetting_convention: str
    fwt_convention: str
    matrices: Mapping[str, MatrixIntervals]
    #: matrix -> the held-out sets' intervals (`HeldOutIntervals`; empty without held-out sets)
    held_out: Mapping[str, HeldOutIntervals] = field(default_factory=dict)
    #: the held-out sets, in the order of `HeldOutIntervals`' columns
    held_out_names: tuple[str, ...] = ()
    #: number (section or metric) -> why one run gives it no interval
    unavailable: Mapping[str, str] = field(default_factory=dict)
    #: Wilson intervals of the class-incremental proportions (with ``task_classes``)
    class_incremental: ClassIncrementalIntervals | None = None

    def to_section(self) -> schema.IntervalsSection:
        return schema.IntervalsSection(
            held_out_names=list(self.held_out_names),
            method=self.method,
            confidence=self.confidence,
            resamples=self.resamples,
            seed=self.seed,
            weights=self.weights,
            forgetting_convention=self.forgetting_convention,
            fwt_convention=self.fwt_convention,
            matrices={
                name: schema.MatrixIntervalsSection(
                    cell_method=m.cell_method,  # type: ignore[arg-type]
                    low=cells(m.low),
                    high=cells(m.high),
                    baseline_low=cells(m.baseline_low),
                    baseline_high=cells(m.baseline_high),
                    metrics={
                        key: schema.MetricIntervalSection(
                            estimate=present(e), low=present(lo), high=present(hi)
                        )
                        for key, (e, lo, hi) in m.metrics.items()
                    },
                    num_items=list(m.num_items),
                    unavailable=dict(m.unavailable),
                    per_task={key: _triple_section(v) for key, v in m.per_task.items()},
                    step_metrics={key: _triple_section(v) for key, v in m.step_metrics.items()},
                )
                for name, m in self.matrices.items()
            },
            held_out={name: h.to_section() for name, h in self.held_out.items()},
            unavailable=dict(self.unavailable),
            class_incremental=None
            if self.class_incremental is None
            else self.class_incremental.to_section(),
        )

    @classmethod
    def from_section(cls, section: schema.IntervalsSection, num_tasks: int) -> IntervalResults:
        def number(value: float | None) -> float:
            return float("nan") if value is None else float(value)

        return cls(
            method=section.method,
            confidence=section.confidence,
            resamples=section.resamples,
            seed=section.seed,
            weights=section.weights,
            forgetting_convention=section.forgetting_convention,
            fwt_convention=section.fwt_convention,
            matrices={
                name: MatrixIntervals(
                    cell_method=m.cell_method,
                    low=matrix(m.low, num_tasks),
                    high=matrix(m.high, num_tasks),
                    baseline_low=vector(m.baseline_low),
                    baseline_high=vector(m.baseline_high),
                    metrics={
                        key: (number(v.estimate), number(v.low), number(v.high))
                        for key, v in m.metrics.items()
                    },
                    num_items=tuple(m.num_items),
                    unavailable=dict(m.unavailable),
                    per_task={key: _triple(v) for key, v in m.per_task.items()},
                    step_metrics={key: _triple(v) for key, v in m.step_metrics.items()},
                )
                for name, m in section.matrices.items()
            },
            held_out={
                name: HeldOutIntervals.from_section(h, len(section.held_out_names))
                for name, h in section.held_out.items()
            },
            held_out_names=tuple(section.held_out_names),
            unavailable=dict(section.unavailable),
            class_incremental=None
            if section.class_incremental is None
            else ClassIncrementalIntervals.from_section(section.class_incremental),
        )


@dataclass(frozen=True)
class Transitions:
    """One 0/1 matrix's item transitions per stage and task, float64 ``[s, T]`` counts (NaN:
    undefined; see `continual_eval.functional.ItemTransitions`)."""

    right_to_wrong: Tensor
    wrong_to_right: Tensor
    forgotten: Tensor
    recovered: Tensor
    forgotten_once: Tensor
    num_items: tuple[int, ...]
    #: the confidence of `forgotten_once_interval` (the ``intervals`` section's)
    confidence: float = DEFAULT_CONFIDENCE

    @property
    def forgotten_once_fraction(self) -> Tensor:
        """``forgotten_once / n_j`` ``[s, T]``: the fraction of task ``j``'s items forgotten at
        least once (a right -> wrong step between consecutive stages after it was learned)."""
        return self.forgotten_once / torch.tensor(self.num_items, dtype=torch.float64)

    @property
    def forgotten_once_interval(self) -> tuple[Tensor, Tensor]:
        """``(low, high)`` ``[s, T]``: the Wilson interval (at ``confidence``) of
        `forgotten_once_fraction` as the rate at which the task's items (i.i.d. draws of its
        test distribution) are forgotten at least once, ``forgotten_once`` of ``n_j`` trials
        (NaN where undefined)."""
        trials = torch.tensor(self.num_items, dtype=torch.float64).expand_as(self.forgotten_once)
        return wilson_interval(self.forgotten_once, trials, confidence=self.confidence)


_TRANSITION_KEYS = ("right_to_wrong", "wrong_to_right", "forgotten", "recovered", "forgotten_once")


@dataclass(frozen=True)
class ItemResults:
    """The ``items`` section (module notes): ``bits_per_item`` per recorded matrix (1 or 64),
    ``memory_bytes`` held, ``skipped`` (matrix -> why not recorded), ``transitions`` of the 0/1
    matrices."""

    bits_per_item: Mapping[str, int]
    memory_bytes: int
    skipped: Mapping[str, str]
    transitions: Mapping[str, Transitions]

    def to_section(self) -> schema.ItemsSection:
        return schema.ItemsSection(
            bits_per_item=dict(self.bits_per_item),  # type: ignore[arg-type]
            memory_bytes=self.memory_bytes,
            skipped=dict(self.skipped),
            transitions={
                name: schema.TransitionsSection(
                    **{key: cells(getattr(t, key)) for key in _TRANSITION_KEYS},
                    num_items=list(t.num_items),
                    confidence=t.confidence,
                    forgotten_once_low=cells(t.forgotten_once_interval[0]),
                    forgotten_once_high=cells(t.forgotten_once_interval[1]),
                )
                for name, t in self.transitions.items()
            },
        )

    @classmethod
    def from_section(cls, section: schema.ItemsSection, num_tasks: int) -> ItemResults:
        return cls(
            bits_per_item=dict(section.bits_per_item),
            memory_bytes=section.memory_bytes,
            skipped=dict(section.skipped),
            transitions={
                name: Transitions(
                    **{key: matrix(getattr(t, key), num_tasks) for key in _TRANSITION_KEYS},
                    num_items=tuple(t.num_items),
                    confidence=t.confidence,  # the interval follows from the counts
                )
                for name, t in section.transitions.items()
            },
        )

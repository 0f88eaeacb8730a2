"""The metric family of an accuracy matrix, listed once.

Every place that names the metrics reads them from here: the final metrics
([`ContinualMetrics`][continual_eval.ContinualMetrics], ``results.json``'s ``metrics``, the logged
scalars), the per-stage curves
([`continual_metrics_curve`][continual_eval.functional.continual_metrics_curve],
``metrics_per_stage``), the per-task values (``per_task``), the titles and the columns of
``continual-eval report``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CURVE_KEYS",
    "METRIC_FAMILY",
    "METRIC_KEYS",
    "METRIC_TITLES",
    "PER_TASK_KEYS",
    "REPORT_KEYS",
    "MetricSpec",
]


@dataclass(frozen=True)
class MetricSpec:
    """One metric of the family."""

    #: the key in ``metrics``, ``metrics_per_stage``, ``per_task`` and the logged scalars
    key: str
    #: column and axis title (``"ACC"``)
    title: str
    #: one line: what the value is
    description: str
    #: a final metric: in ``ContinualMetrics.compute()``, ``results.json``'s ``metrics`` and the
    #: scalars logged per stage
    final: bool = False
    #: has a per-stage curve (``continual_metrics_curve``, ``metrics_per_stage``)
    curve: bool = False
    #: has per-task values in ``results.json``'s ``per_task`` (``[s - 1]``)
    per_task: bool = False
    #: a column of ``continual-eval report``
    report: bool = False
    #: needs the joint-training reference (``metadata["reference"]``)
    needs_reference: bool = False


#: every metric, in table order
METRIC_FAMILY: tuple[MetricSpec, ...] = (
    MetricSpec(
        "acc",
        "ACC",
        "mean score over the tasks seen, after the last stage",
        final=True,
        curve=True,
        report=True,
    ),
    MetricSpec(
        "bwt",
        "BWT",
        "backward transfer: mean change of each old task since it was trained (GEM)",
        final=True,
        curve=True,
        per_task=True,
        report=True,
    ),
    MetricSpec(
        "fwt",
        "FWT",
        "forward transfer: R[j-1, j] against the untrained baseline b[j] (GEM)",
        final=True,
        curve=True,
        per_task=True,
        report=True,
    ),
    MetricSpec(
        "forgetting",
        "Forgetting",
        "mean drop of each old task from its best score (peak or Chaudhry convention)",
        final=True,
        curve=True,
        per_task=True,
        report=True,
    ),
    MetricSpec(
        "learning_accuracy",
        "LA",
        "learning accuracy: mean of R[j, j] over the tasks seen",
        curve=True,
    ),
    MetricSpec(
        "average_incremental_accuracy",
        "AIA",
        "average incremental accuracy: mean of ACC over the stages so far",
        curve=True,
    ),
    MetricSpec(
        "intransigence",
        "Intransigence",
        "reference (isolated or joint training) minus R[j, j], averaged over the tasks seen",
        report=True,
        needs_reference=True,
    ),
)

#: the final metrics (``ContinualMetrics.compute()``, ``results.json``'s ``metrics``)
METRIC_KEYS: tuple[str, ...] = tuple(m.key for m in METRIC_FAMILY if m.final)
#: the metrics with a per-stage curve (``continual_metrics_curve``, ``metrics_per_stage``)
CURVE_KEYS: tuple[str, ...] = tuple(m.key for m in METRIC_FAMILY if m.curve)
#: the metrics with per-task values in ``results.json``'s ``per_task``
PER_TASK_KEYS: tuple[str, ...] = tuple(m.key for m in METRIC_FAMILY if m.per_task)
#: the columns of ``continual-eval report``, in order
REPORT_KEYS: tuple[str, ...] = tuple(m.key for m in METRIC_FAMILY if m.report)
#: key -> title of every metric
METRIC_TITLES: dict[str, str] = {m.key: m.title for m in METRIC_FAMILY}

"""The results of a continual-learning run as one typed object:
[`ContinualResults`][continual_eval.ContinualResults].

It owns, per scorer ([`MatrixResults`][continual_eval.results.MatrixResults]), the rows of R so far,
the baseline, the metric family computed in ONE
[`all_continual_metrics`][continual_eval.functional.all_continual_metrics] pass (``metrics`` is
exactly the last point of ``metrics_per_stage``), the per-task values and, with per-step evaluation,
the step curves with their stability ([`Stability`][continual_eval.results.Stability]) and
plasticity ([`Plasticity`][continual_eval.results.Plasticity]) metrics; plus the steps of those
evaluations ([`StepEvaluations`][continual_eval.results.StepEvaluations]), what each stage cost
([`RunCost`][continual_eval.results.RunCost]), the primary matrix against a reference
([`ReferenceMetrics`][continual_eval.results.ReferenceMetrics]), the class-incremental record, the
online record ([`OnlineResults`][continual_eval.results.OnlineResults], the ``online`` section), the
conventions, the metadata and the run id.

Each class here is the typed, tensor-holding form of one section of
`Document` (``to_section``/``from_section``): the schema
says what ``results.json`` holds and checks a file; this module says what it means.
[`ContinualResults.from_tensors`][continual_eval.results.ContinualResults.from_tensors] builds the
results from what the callback records,
[`to_dict`][continual_eval.results.ContinualResults.to_dict]/[`from_dict`][continual_eval.results.ContinualResults.from_dict]
convert to and from the document,
[`write`][continual_eval.results.ContinualResults.write]/[`load`][continual_eval.results.ContinualResults.load]
go through the files of `continual_eval.results.files`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import msgspec
import torch
from torch import Tensor

import continual_eval.results.files as files
import continual_eval.results.schema as schema
from continual_eval.functional import all_continual_metrics
from continual_eval.functional._overflow import no_infinite
from continual_eval.functional.accuracy_matrix import (
    forward_transfer_per_task,
    intransigence_per_task,
)
from continual_eval.functional.family import CURVE_KEYS, METRIC_KEYS, PER_TASK_KEYS
from continual_eval.functional.plasticity import (
    anytime_accuracy,
    auc_forward_transfer_per_task,
    learning_curve_area,
    stage_auc,
    stage_start_accuracy,
)
from continual_eval.functional.stability import min_accuracy, stability_gap, worst_case_accuracy
from continual_eval.results._convert import cells, matrix, present, vector
from continual_eval.results.class_incremental import ClassIncrementalResults
from continual_eval.results.held_out import HeldOutResults
from continual_eval.results.intervals import IntervalResults, ItemResults
from continual_eval.results.online import OnlineResults
from continual_eval.results.predictions import PredictionFiles
from continual_eval.stage_cost import StageCost, memory_kind, summarize_costs

__all__ = [
    "ContinualResults",
    "Coverage",
    "MatrixResults",
    "Plasticity",
    "ReferenceMetrics",
    "ReferenceScores",
    "RunCost",
    "ScoreMatrix",
    "Stability",
    "StepEvaluations",
]

#: the per-task stability-gap values ([`stability_gap`][continual_eval.functional.stability_gap])
STABILITY_KEYS = ("boundary", "minimum", "depth", "recovery_steps")
#: where min-ACC, WC-ACC and the stability gap come from
STABILITY_SOURCE = "De Lange, van de Ven & Tuytelaars, ICLR 2023 (min-ACC eq. 4, WC-ACC eq. 5)"
FWT_CONVENTION = "R[j-1,j] - b[j] (GEM; b[j] - R[j-1,j] where lower is better)"
UNIT_BOUNDS = (0.0, 1.0)
#: the kinds of [`ReferenceScores`][continual_eval.results.ReferenceScores]: trained by
#: [`train_reference`][continual_eval.train_reference] (``"isolated"``, ``"joint"``,
#: ``"cumulative"``) or given as scores of unknown provenance (``"given"``)
REFERENCE_SCORE_KINDS = ("isolated", "joint", "cumulative", "given")


def _f64(t: Any) -> Tensor:
    return torch.as_tensor(t, dtype=torch.float64).detach().cpu()


def _empty() -> Tensor:
    return torch.zeros(0, dtype=torch.float64)


def _table(values: Mapping[str, Any]) -> dict[str, Tensor]:
    return {key: vector(column) for key, column in values.items()}


def _cell_table(values: Mapping[str, Tensor]) -> dict[str, Any]:
    return {key: cells(column) for key, column in values.items()}


def _running_mean(values: Tensor) -> Tensor:
    """``out[i] = mean(values[:i+1])`` (NaN from the first NaN on)."""
    counts = torch.arange(1, len(values) + 1, dtype=torch.float64)
    return torch.cumsum(values, 0) / counts


# ---------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class ScoreMatrix:
    """One scorer's raw records, the input of
    [`ContinualResults.from_tensors`][continual_eval.results.ContinualResults.from_tensors].

    ``score``: what its cells hold; ``scores``: the rows so far ``[s, T]`` (NaN = not
    evaluated); ``baseline``: the untrained scores ``[T]``; its direction and its validation range
    (``None`` = unbounded); ``step_scores``: its rows of the per-step evaluations ``[N, T]``
    (``None`` without them); ``scoring``: how a sequence model's outputs were produced
    (``"teacher-forced"`` or ``"free-running"``; ``None`` for a score that is neither).
    """

    score: str
    scores: Tensor
    baseline: Tensor
    higher_is_better: bool = True
    bounds: tuple[float, float] | None = UNIT_BOUNDS
    step_scores: Tensor | None = None
    scoring: schema.Scoring | None = None


@dataclass(frozen=True, eq=False)
class ReferenceScores:
    """A reference for the primary scorer, the input of
    [`ContinualResults.from_tensors`][continual_eval.results.ContinualResults.from_tensors]
    (``reference=``): what the callback's ``reference=`` argument resolves to
    (`continual_eval.results.reference.resolve_reference`)."""

    #: ``"isolated"``, ``"joint"`` or ``"given"`` (see `REFERENCE_SCORE_KINDS`)
    kind: str
    #: ``[T]`` float64: ``ref[j]``, the reference score on task ``j`` (NaN = absent)
    scores: Tensor
    #: ``[T]`` float64: ``AUC_j^ref``, the reference's mean score of task ``j`` over its training
    #: (from its learning curves), for the normalised forward transfer; ``None`` without curves
    auc: Tensor | None = None
    #: where it came from (a path, ``"train_reference"``, ``"tensor"``)
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in REFERENCE_SCORE_KINDS:
            raise ValueError(
                f"reference kind must be one of {REFERENCE_SCORE_KINDS}, got {self.kind!r}"
            )
        scores = _f64(self.scores).reshape(-1)
        object.__setattr__(self, "scores", scores)
        if self.auc is not None:
            auc = _f64(self.auc).reshape(-1)
            if auc.shape != scores.shape:
                raise ValueError(
                    f"reference auc has {auc.numel()} values for {scores.numel()} scores"
                )
            object.__setattr__(self, "auc", auc)


# ---------------------------------------------------------------------- step evaluations
@dataclass(frozen=True, eq=False)
class StepEvaluations:
    """When the per-step evaluations ran (``eval_every_n_steps``); shared by every matrix."""

    #: ``[N]`` int64: the cumulative optimizer step of each evaluation
    step: Tensor
    #: ``[N]`` int64: the stage (task index) it ran in; a stage's last one is its end
    stage: Tensor
    #: ``N`` flags: the whole test sets were scored (else the fixed ``StepEvaluation`` subset)
    full: tuple[bool, ...] = ()
    #: what ``step`` counts
    step_counter: str = ""
    #: the fixed subset of the per-step evaluations (``size``, ``seed``, ``samples_per_task``,
    #: ``rule``), ``None`` for whole test sets
    subset: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        step = torch.as_tensor(self.step, dtype=torch.int64).cpu().reshape(-1)
        stage = torch.as_tensor(self.stage, dtype=torch.int64).cpu().reshape(-1)
        full = tuple(bool(f) for f in self.full) if self.full else (True,) * len(step)
        if not len(step) == len(stage) == len(full):
            raise ValueError(
                f"{len(step)} steps, {len(stage)} stages and {len(full)} flags: one each per "
                "evaluation"
            )
        object.__setattr__(self, "step", step)
        object.__setattr__(self, "stage", stage)
        object.__setattr__(self, "full", full)

    def __len__(self) -> int:
        return len(self.step)

    @classmethod
    def from_section(cls, section: schema.CurvesSection) -> StepEvaluations:
        subset = section.subset
        return cls(
            step=torch.tensor(section.step, dtype=torch.int64),
            stage=torch.tensor(section.stage, dtype=torch.int64),
            full=tuple(section.full),
            step_counter=section.step_counter,
            subset=None if subset is None else msgspec.structs.asdict(subset),
        )

    def to_section(self, scores: Tensor | None, score_name: str) -> schema.CurvesSection:
        """The ``curves`` section with ``scores`` ``[N, T]`` as its ``accuracy`` rows."""
        return schema.CurvesSection(
            step=self.step.tolist(),
            stage=self.stage.tolist(),
            accuracy=cells(scores) if scores is not None and len(self) else [],
            full=list(self.full),
            score=score_name,
            step_counter=self.step_counter,
            subset=None
            if self.subset is None
            else msgspec.convert(self.subset, schema.SubsetSection),
        )


@dataclass(frozen=True, eq=False)
class Stability:
    """Stability metrics of one matrix's step curves over the completed stages (De Lange et al.,
    ICLR 2023), from `continual_eval.functional.stability`; NaN = undefined."""

    #: ``[S]`` min-ACC after each completed stage (NaN at stage 0)
    min_acc: Tensor
    #: ``[S]`` WC-ACC after each completed stage
    wc_acc: Tensor
    #: ``boundary``, ``minimum``, ``depth``, ``recovery_steps``: ``[S - 1]`` each, task ``j``'s
    #: gap while task ``j + 1`` trains
    per_task: dict[str, Tensor] = field(default_factory=dict)
    #: the recovery tolerance
    tolerance: float = 0.0
    #: the paper the definitions follow
    source: str = STABILITY_SOURCE

    @classmethod
    def compute(
        cls,
        scores: Tensor,
        steps: StepEvaluations,
        stages_completed: int,
        *,
        higher_is_better: bool = True,
        tolerance: float = 0.0,
    ) -> Stability:
        """From the rows ``scores [N, T]`` of ``steps``, reading the evaluations of the
        ``stages_completed`` finished stages only."""
        done = steps.stage < stages_completed
        values, stage, step = _f64(scores)[done], steps.stage[done], steps.step[done]
        if stages_completed == 0 or not len(stage):
            return cls(_empty(), _empty(), dict.fromkeys(STABILITY_KEYS, _empty()), tolerance)
        gap = stability_gap(
            values, stage, step, tolerance=tolerance, higher_is_better=higher_is_better
        )
        return cls(
            min_accuracy(values, stage, higher_is_better=higher_is_better, validate=False),
            worst_case_accuracy(values, stage, higher_is_better=higher_is_better, validate=False),
            {key: gap[key].double() for key in STABILITY_KEYS},
            tolerance,
        )

    @classmethod
    def from_section(cls, section: schema.StabilitySection) -> Stability:
        return cls(
            vector(section.min_acc),
            vector(section.wc_acc),
            _table(section.per_task),
            section.tolerance,
            section.source,
        )

    def to_section(self) -> schema.StabilitySection:
        """The ``stability`` section (``null`` for undefined values)."""
        return schema.StabilitySection(
            min_acc=cells(self.min_acc),
            wc_acc=cells(self.wc_acc),
            per_task=_cell_table(self.per_task),
            tolerance=self.tolerance,
            source=self.source,
        )


# ---------------------------------------------------------------------- plasticity
def _best_score(higher_is_better: bool, bounds: tuple[float, float] | None) -> float | None:
    """The best attainable score (the upper bound, or the lower one where lower is better);
    ``None`` when that end is unbounded."""
    if bounds is None:
        return None
    best = float(bounds[1] if higher_is_better else bounds[0])
    return best if math.isfinite(best) else None


def _padded(values: Tensor, s: int) -> Tensor:
    """``values`` cut or NaN-padded to ``s`` entries."""
    out = torch.full((s,), math.nan, dtype=torch.float64)
    out[: min(s, len(values))] = values[:s]
    return out


@dataclass(frozen=True, eq=False)
class Plasticity:
    """Plasticity metrics of one matrix's step curves over the completed stages
    (`continual_eval.functional.plasticity`, with ``initial`` =
    [`stage_start_accuracy`][continual_eval.functional.stage_start_accuracy] of ``R`` and ``b``);
    ``None`` (JSON ``null``) where absent, never 0."""

    #: anytime accuracy ``A_AUC`` (Koh et al., ICLR 2022): the seen-task mean score averaged over
    #: the optimizer steps of the completed stages
    anytime_accuracy: float | None
    #: ``[s]`` ``AUC_k``: the mean score of task ``k`` over its own stage (NaN = absent)
    stage_auc: Tensor
    #: ``beta`` of the learning curve area (``None``: not computed)
    lca_beta: int | None = None
    #: ``LCA_beta`` (Chaudhry et al., ICLR 2019); ``None`` when not computed or when the curves
    #: lack one of the steps ``0..beta`` of a stage
    lca: float | None = None
    #: Continual World's normalised forward transfer (Wolczyk et al., NeurIPS 2021) against the
    #: reference's per-task areas; ``None`` without them
    auc_forward_transfer: float | None = None
    #: ``[s]`` its per-task values ``FT_k`` (NaN = absent); ``None`` without reference areas
    auc_forward_transfer_per_task: Tensor | None = None

    @classmethod
    def compute(
        cls,
        step_scores: Tensor,
        steps: StepEvaluations,
        scores: Tensor,
        baseline: Tensor,
        *,
        lca_beta: int | None = None,
        reference_auc: Tensor | None = None,
        best: float | None = None,
    ) -> Plasticity:
        """From the rows ``step_scores [N, T]`` of ``steps`` (only the evaluations of the
        ``s = len(scores)`` completed stages), ``R = scores [s, T]`` and ``b = baseline [T]``.
        ``reference_auc [T]`` and ``best`` (the best attainable score) give the normalised
        forward transfer."""
        if lca_beta is not None and (
            not isinstance(lca_beta, int) or isinstance(lca_beta, bool) or lca_beta < 0
        ):
            raise ValueError(f"lca_beta must be a non-negative int or None, got {lca_beta!r}")
        scores, baseline = _f64(scores), _f64(baseline)
        s = int(scores.shape[0])
        done = steps.stage < s
        acc, stage, step = _f64(step_scores)[done], steps.stage[done], steps.step[done]
        nan = torch.full((s,), math.nan, dtype=torch.float64)
        with_ft = reference_auc is not None and best is not None
        if s == 0 or not len(stage):
            return cls(None, nan, lca_beta, None, None, nan.clone() if with_ft else None)
        options: dict[str, Any] = {
            "initial": stage_start_accuracy(scores, baseline, validate=False),
            "validate": False,
        }
        lca = None
        if lca_beta is not None:
            lca = present(learning_curve_area(acc, stage, step, lca_beta, **options))
        ft, ft_per_task = None, None
        if with_ft:
            assert reference_auc is not None and best is not None
            reference = _padded(_f64(reference_auc).reshape(-1), len(baseline))
            values = auc_forward_transfer_per_task(
                acc, stage, step, reference, best=best, **options
            )
            ft_per_task = _padded(values, s)
            ft = present(ft_per_task.mean())
        return cls(
            present(anytime_accuracy(acc, stage, step, **options)),
            _padded(stage_auc(acc, stage, step, **options), s),
            lca_beta,
            lca,
            ft,
            ft_per_task,
        )

    @classmethod
    def from_section(cls, section: schema.PlasticitySection) -> Plasticity:
        lca, per_task = section.lca, section.auc_forward_transfer_per_task
        return cls(
            section.anytime_accuracy,
            vector(section.stage_auc),
            None if lca is None else lca.beta,
            None if lca is None else lca.value,
            section.auc_forward_transfer,
            None if per_task is None else vector(per_task),
        )

    def to_section(self) -> schema.PlasticitySection:
        """The ``plasticity`` section (``null`` where absent)."""
        per_task = self.auc_forward_transfer_per_task
        return schema.PlasticitySection(
            anytime_accuracy=present(self.anytime_accuracy),
            stage_auc=cells(self.stage_auc),
            lca=None
            if self.lca_beta is None
            else schema.LcaSection(beta=int(self.lca_beta), value=present(self.lca)),
            auc_forward_transfer=present(self.auc_forward_transfer),
            auc_forward_transfer_per_task=None if per_task is None else cells(per_task),
        )


# ---------------------------------------------------------------------- reference
@dataclass(frozen=True, eq=False)
class ReferenceMetrics:
    """The primary matrix against a reference model (the ``reference`` section of
    ``results.json``), in the primary score's direction; ``None``/NaN where absent.

    Intransigence (Chaudhry et al., 2018): ``ref[j] - R[j, j]`` per task ``j < s`` and its mean
    (``intransigence_per_task``/``intransigence`` of
    [`continual_eval.functional`][continual_eval.functional]). Forward transfer against isolated
    training: ``R[j, j] - ref[j]`` per task ``1 <= j < s`` and its mean
        (``forward_transfer_per_task(..., convention="isolated")``); absent (NaN) for a ``"joint"``
    or ``"cumulative"`` reference, which is no isolated training. For a lower-is-better score
    both differences are reversed (positive: learned less well / better than the reference).
    """

    #: ``"isolated"``, ``"joint"``, ``"cumulative"`` or ``"given"``
    kind: str
    #: the score it holds (the primary matrix's)
    score: str
    #: the score's direction
    higher_is_better: bool
    #: ``[T]`` ``ref``
    scores: Tensor
    #: ``[T]`` the reference's per-task areas ``AUC_j^ref`` (``None`` without curves)
    auc: Tensor | None
    #: mean intransigence over the completed stages (``None``: absent)
    intransigence: float | None
    #: ``[s]`` per-task intransigence
    intransigence_per_task: Tensor
    #: mean forward transfer against the isolated reference over ``1 <= j < s`` (``None``: absent)
    fwt_isolated: float | None
    #: ``[s - 1]`` per-task forward transfer against it (tasks ``j >= 1``)
    fwt_isolated_per_task: Tensor
    #: ``intransigence`` and ``fwt_isolated`` after every completed stage, ``[s]`` each (NaN:
    #: not defined, e.g. ``fwt_isolated`` after stage 0)
    per_stage: dict[str, Tensor] = field(default_factory=dict)
    #: where the reference came from
    source: str = ""

    @classmethod
    def compute(cls, reference: ReferenceScores, matrix: MatrixResults) -> ReferenceMetrics:
        """The metrics of ``matrix`` (the primary one) against ``reference``."""
        T = int(matrix.baseline.shape[0])
        if reference.scores.shape != (T,):
            raise ValueError(f"the reference has {reference.scores.numel()} scores for {T} tasks")
        s = matrix.num_stages
        R, ref, hib = matrix.scores[:, :s], reference.scores[:s], bool(matrix.higher_is_better)
        intransigence = intransigence_per_task(R, ref, higher_is_better=hib, validate=False)
        fwt = _empty()
        if s > 1:
            fwt = forward_transfer_per_task(
                R, ref, convention="isolated", higher_is_better=hib, validate=False
            )
        if reference.kind in ("joint", "cumulative"):  # no isolated training
            fwt = torch.full_like(fwt, math.nan)
        fwt_curve = torch.cat([torch.full((min(s, 1),), math.nan), _running_mean(fwt)])
        per_stage = {"intransigence": _running_mean(intransigence), "fwt_isolated": fwt_curve}
        return cls(
            kind=reference.kind,
            score=matrix.score,
            higher_is_better=hib,
            scores=reference.scores.clone(),
            auc=None if reference.auc is None else reference.auc.clone(),
            intransigence=present(per_stage["intransigence"][-1]) if s else None,
            intransigence_per_task=intransigence.double(),
            fwt_isolated=present(fwt_curve[-1]) if s else None,
            fwt_isolated_per_task=fwt.double(),
            per_stage=per_stage,
            source=reference.source,
        )

    @classmethod
    def from_section(cls, section: schema.ReferenceSection) -> ReferenceMetrics:
        return cls(
            kind=section.kind,
            score=section.score,
            higher_is_better=section.higher_is_better,
            scores=vector(section.scores),
            auc=None if section.auc is None else vector(section.auc),
            intransigence=section.intransigence,
            intransigence_per_task=vector(section.intransigence_per_task),
            fwt_isolated=section.fwt_isolated,
            fwt_isolated_per_task=vector(section.fwt_isolated_per_task),
            per_stage=_table(section.per_stage),
            source=section.source,
        )

    def to_section(self) -> schema.ReferenceSection:
        return schema.ReferenceSection(
            kind=self.kind,  # type: ignore[arg-type]
            score=self.score,
            higher_is_better=bool(self.higher_is_better),
            scores=cells(self.scores),
            auc=None if self.auc is None else cells(self.auc),
            intransigence=present(self.intransigence),
            intransigence_per_task=cells(self.intransigence_per_task),
            fwt_isolated=present(self.fwt_isolated),
            fwt_isolated_per_task=cells(self.fwt_isolated_per_task),
            per_stage=_cell_table(self.per_stage),
            source=self.source,
        )


# ---------------------------------------------------------------------- cost
@dataclass(frozen=True, eq=False)
class RunCost:
    """What each training stage cost (`continual_eval.stage_cost`): the ``cost`` section of
    ``results.json``."""

    #: one `StageCost` per recorded stage, in stage order
    per_stage: tuple[StageCost, ...] = ()

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.per_stage, key=lambda cost: cost.stage))
        object.__setattr__(self, "per_stage", ordered)

    @property
    def summary(self) -> dict[str, Any]:
        """Totals, the largest peak memory and the model-size efficiency
        (`summarize_costs`)."""
        return summarize_costs(self.per_stage)

    @property
    def memory_kind(self) -> str | None:
        """What ``peak_memory_bytes`` measures (``"cuda_max_allocated"``,
        ``"process_peak_rss"``, ``"mixed"``; ``None`` without a stage)."""
        return memory_kind(self.per_stage)

    def at(self, stage: int) -> StageCost | None:
        """The cost of ``stage`` (``None`` when not recorded)."""
        return next((cost for cost in self.per_stage if cost.stage == stage), None)

    def model_size_efficiency_at(self, stage: int) -> float | None:
        """The model-size efficiency over the stages ``<= stage`` (``summary``'s value had the run
        stopped there): ``None`` unless every one of them was recorded (without stage 0's
        parameter count, the reference of MS, it is undefined)."""
        costs = [c for c in self.per_stage if c.stage <= stage]
        value: float | None = summarize_costs(costs)["model_size_efficiency"]
        return value

    @classmethod
    def from_section(cls, section: schema.CostSection) -> RunCost:
        """The stages as recorded (``summary`` and ``memory_kind`` are recomputed)."""
        return cls(tuple(StageCost(**msgspec.structs.asdict(c)) for c in section.per_stage))

    def to_section(self) -> schema.CostSection:
        return schema.CostSection(
            per_stage=[
                schema.StageCostSection(**dataclasses.asdict(cost)) for cost in self.per_stage
            ],
            summary=self.summary,
            memory_kind=self.memory_kind,
        )


# ---------------------------------------------------------------------- coverage
@dataclass(frozen=True)
class Coverage:
    """A run that ended with fewer tasks trained than it has test loaders (the ``coverage``
    section of ``results.json``): ``fit_tasks`` over fewer training loaders than test loaders, or
    one fit over a schedule of fewer stages. R holds every test loader's scores after each of the
    ``tasks_trained`` stages, but every metric (``acc``, ``bwt``, ``fwt``, ``forgetting`` and
    those of the other sections) reads only the first ``tasks_trained x tasks_trained`` block."""

    #: stages trained when the run ended (``stages_completed``)
    tasks_trained: int
    #: the tasks with a test loader (``num_tasks``)
    tasks_evaluated: int

    @property
    def metrics_cover(self) -> str:
        """The block of R the metrics read, ``R[:k, :k]``."""
        k = self.tasks_trained
        return f"R[:{k}, :{k}]"

    def line(self) -> str:
        """The line printed at the end of such a run."""
        k, T = self.tasks_trained, self.tasks_evaluated
        untrained = f"task {k}" if T - k == 1 else f"tasks {k}..{T - 1}"
        return (
            f"[continual-eval] the run ended after {k} of {T} tasks ({k} trained, {T} test "
            f"dataloaders): the metrics cover only the first {k} x {k} block of R "
            f"({self.metrics_cover}); R also holds the scores of the untrained {untrained}, "
            "which no metric reads"
        )

    @classmethod
    def from_section(cls, section: schema.CoverageSection) -> Coverage:
        return cls(section.tasks_trained, section.tasks_evaluated)

    def to_section(self) -> schema.CoverageSection:
        return schema.CoverageSection(
            tasks_trained=self.tasks_trained,
            tasks_evaluated=self.tasks_evaluated,
            metrics_cover=self.metrics_cover,
        )


# ---------------------------------------------------------------------- one matrix
def _direction(higher_is_better: bool, bounds: tuple[float, float] | None) -> dict[str, Any]:
    """Keyword arguments for the functional layer (none for the default accuracy matrix)."""
    if higher_is_better and bounds == UNIT_BOUNDS:
        return {}
    return {"higher_is_better": higher_is_better, "bounds": bounds}


def _family(
    scores: Tensor, baseline: Tensor, forgetting: str, validate: bool, matrix: ScoreMatrix
) -> tuple[dict[str, float], dict[str, Tensor], dict[str, Tensor]]:
    """``(metrics, metrics_per_stage, per_task)`` of ``R [s, T]`` in one pass (NaN without a
    stage)."""
    s = scores.shape[0]
    if s == 0:
        return (
            dict.fromkeys(METRIC_KEYS, math.nan),
            dict.fromkeys(CURVE_KEYS, _empty()),
            dict.fromkeys(PER_TASK_KEYS, _empty()),
        )
    direction = _direction(bool(matrix.higher_is_better), matrix.bounds)
    family = all_continual_metrics(
        scores[:, :s], baseline[:s], forgetting=forgetting, validate=validate, **direction
    )
    if not validate and not no_infinite(*family["curve"].values()):
        # finite cells (checked when recorded) whose metric overflowed: validation recomputes a
        # sum that overflowed, and a difference beyond the dtype raises naming the metric and
        # the cells (never an inf that results.json would store as null)
        family = all_continual_metrics(
            scores[:, :s], baseline[:s], forgetting=forgetting, validate=True, **direction
        )
    curves = {key: family["curve"][key].double() for key in CURVE_KEYS}
    per_task = {key: family["per_task"][key].double() for key in PER_TASK_KEYS}
    return {key: float(curves[key][-1]) for key in METRIC_KEYS}, curves, per_task


@dataclass(frozen=True, eq=False)
class MatrixResults:
    """One scorer's matrix and everything computed from it; undefined values are NaN."""

    #: the ``matrices`` key (the scorer's name)
    name: str
    #: what a cell holds (``"accuracy"``, ``"cross_entropy"``, a metric's class name)
    score: str
    #: ``[s, T]`` float64: ``R[i, j]`` after stage ``i`` on task ``j`` (NaN = not evaluated)
    scores: Tensor
    #: ``[T]`` float64: the untrained model's scores (NaN = not evaluated)
    baseline: Tensor
    #: the score's direction (transfer and forgetting are signed by it)
    higher_is_better: bool = True
    #: the validation range ``(lo, hi)`` (infinite ends allowed), ``None`` = unbounded
    bounds: tuple[float, float] | None = UNIT_BOUNDS
    #: the final metrics of ``R[:s, :s]`` (``acc``, ``bwt``, ``fwt``, ``forgetting``)
    metrics: dict[str, float] = field(default_factory=dict)
    #: every curve metric after every stage, ``[s]`` each; ``metrics[k]`` is its last point
    metrics_per_stage: dict[str, Tensor] = field(default_factory=dict)
    #: per-task ``bwt``, ``fwt``, ``forgetting`` of ``R[:s, :s]``, ``[s - 1]`` each
    per_task: dict[str, Tensor] = field(default_factory=dict)
    #: ``[N, T]`` its rows of the per-step evaluations (``None`` without them)
    step_scores: Tensor | None = None
    #: the stability metrics of ``step_scores`` (``None`` without them)
    stability: Stability | None = None
    #: the plasticity metrics of ``step_scores`` (``None`` without them)
    plasticity: Plasticity | None = None
    #: ``"teacher-forced"`` (the model reads the reference tokens: perplexity, token accuracy)
    #: or ``"free-running"`` (it reads its own generations); ``None`` for other scores. The two
    #: are not comparable: teacher forcing inflates scores
    scoring: schema.Scoring | None = None

    @property
    def num_stages(self) -> int:
        """``s``, the stages recorded."""
        return int(self.scores.shape[0])

    @classmethod
    def from_tensors(
        cls,
        name: str,
        matrix: ScoreMatrix,
        *,
        forgetting: str = "peak",
        validate: bool = False,
        steps: StepEvaluations | None = None,
        tolerance: float = 0.0,
        lca_beta: int | None = None,
        reference_auc: Tensor | None = None,
    ) -> MatrixResults:
        """Compute the metric family of ``matrix`` in one
        [`all_continual_metrics`][continual_eval.functional.all_continual_metrics] pass (``metrics``
        is exactly the last point of ``metrics_per_stage``) and, with ``steps`` and
        ``matrix.step_scores``, its stability and plasticity metrics (``lca_beta``: ``LCA_beta``;
        ``reference_auc [T]``: the reference's per-task areas of the normalised forward transfer).
        ``validate`` checks the cells the metrics read."""
        scores, baseline = _f64(matrix.scores), _f64(matrix.baseline)
        if scores.ndim != 2 or baseline.shape != (scores.shape[1],):
            raise ValueError(
                f"matrix {name!r}: scores must be [s, T] and baseline [T], got "
                f"{tuple(scores.shape)} and {tuple(baseline.shape)}"
            )
        metrics, curves, per_task = _family(scores, baseline, forgetting, validate, matrix)
        hib = bool(matrix.higher_is_better)
        step_scores, stability, plasticity = None, None, None
        if steps is not None and matrix.step_scores is not None:
            step_scores = _f64(matrix.step_scores).reshape(-1, scores.shape[1])
            if len(step_scores) != len(steps):
                raise ValueError(
                    f"matrix {name!r}: {len(step_scores)} step rows for {len(steps)} evaluations"
                )
            s = scores.shape[0]
            stability = Stability.compute(
                step_scores, steps, s, higher_is_better=hib, tolerance=tolerance
            )
            plasticity = Plasticity.compute(
                step_scores,
                steps,
                scores,
                baseline,
                lca_beta=lca_beta,
                reference_auc=reference_auc,
                best=_best_score(hib, matrix.bounds),
            )
        bounds = matrix.bounds
        return cls(
            name=name,
            score=matrix.score,
            scores=scores,
            baseline=baseline,
            higher_is_better=hib,
            bounds=None if bounds is None else (float(bounds[0]), float(bounds[1])),
            metrics=metrics,
            metrics_per_stage=curves,
            per_task=per_task,
            step_scores=step_scores,
            stability=stability,
            plasticity=plasticity,
            scoring=matrix.scoring,
        )

    @classmethod
    def from_section(
        cls, name: str, section: schema.MatrixSection, num_tasks: int
    ) -> MatrixResults:
        """From a ``matrices`` section (values as recorded, ``null`` -> NaN)."""
        bounds = section.bounds
        return cls(
            name=name,
            score=section.score,
            scores=matrix(section.scores, num_tasks),
            baseline=vector(section.baseline),
            higher_is_better=section.higher_is_better,
            bounds=None
            if bounds is None
            else (
                -math.inf if bounds[0] is None else bounds[0],
                math.inf if bounds[1] is None else bounds[1],
            ),
            metrics={key: math.nan if v is None else v for key, v in section.metrics.items()},
            metrics_per_stage=_table(section.metrics_per_stage),
            per_task=_table(section.per_task),
            step_scores=None
            if section.step_scores is None
            else matrix(section.step_scores, num_tasks),
            stability=None
            if section.stability is None
            else Stability.from_section(section.stability),
            plasticity=None
            if section.plasticity is None
            else Plasticity.from_section(section.plasticity),
            scoring=section.scoring,
        )

    def to_section(self, *, steps: bool = True) -> schema.MatrixSection:
        """Its ``matrices`` section (``steps``: with ``step_scores``, ``stability`` and
        ``plasticity``)."""
        with_steps = steps and self.step_scores is not None
        return schema.MatrixSection(
            score=self.score,
            higher_is_better=bool(self.higher_is_better),
            bounds=None if self.bounds is None else [present(v) for v in self.bounds],
            scores=cells(self.scores),
            baseline=cells(self.baseline),
            metrics={key: present(v) for key, v in self.metrics.items()},
            metrics_per_stage=_cell_table(self.metrics_per_stage),
            per_task=_cell_table(self.per_task),
            step_scores=cells(self.step_scores) if with_steps else None,  # type: ignore[arg-type]
            stability=self.stability.to_section() if steps and self.stability else None,
            plasticity=self.plasticity.to_section() if steps and self.plasticity else None,
            scoring=self.scoring,
        )

    def metrics_at(self, stage: int) -> dict[str, float]:
        """The final metrics as they were after ``stage`` (``metrics`` itself for the last one)."""
        if stage == self.num_stages - 1:
            return dict(self.metrics)
        return {
            key: float(self.metrics_per_stage[key][stage])
            for key in METRIC_KEYS
            if key in self.metrics_per_stage and stage < len(self.metrics_per_stage[key])
        }


# ---------------------------------------------------------------------- the run
def _default_conventions(forgetting: str, score: str) -> dict[str, str]:
    return {
        "indexing": "zero-based",
        "weighting": "equal-task",
        "forgetting": forgetting,
        "fwt": FWT_CONVENTION,
        "score": score,
    }


@dataclass(frozen=True, eq=False)
class ContinualResults:
    """Everything a run recorded and computed: what ``results.json`` holds, typed.

    Build it with [`from_tensors`][continual_eval.results.ContinualResults.from_tensors] (the
    callback:
        [`ContinualEvalCallback.continual_results()`][continual_eval.callback.ContinualEvalCallback.continual_results])
        or read it with
        [`load`][continual_eval.results.ContinualResults.load]/[`from_dict`][continual_eval.results.ContinualResults.from_dict];
        [`to_dict`][continual_eval.results.ContinualResults.to_dict] is the ``results.json``
        document and
    [`write`][continual_eval.results.ContinualResults.write] writes it with its CSV files.
    """

    #: ``T`` task names
    task_names: tuple[str, ...]
    #: every scorer's matrix by name, the primary first
    matrices: dict[str, MatrixResults]
    #: the forgetting convention (``"peak"`` or ``"chaudhry"``)
    forgetting: str = "peak"
    #: ``indexing``, ``weighting``, ``forgetting``, ``fwt``, ``score`` (of the primary matrix)
    conventions: dict[str, str] = field(default_factory=dict)
    #: free-form, JSON-serialisable (``experiment``, ``method``, ``seed``, ``reference`` ...)
    metadata: dict[str, Any] = field(default_factory=dict)
    #: the run that wrote it (``None`` when not recorded)
    run_id: str | None = None
    #: the per-step evaluations (``None`` without ``eval_every_n_steps``)
    steps: StepEvaluations | None = None
    #: what each training stage cost (the ``cost`` section; ``None`` when not recorded)
    cost: RunCost | None = None
    #: the primary matrix against a reference model (the ``reference`` section; ``None`` without
    #: one: a reference stored only as ``metadata["reference"]`` is read by
    #:     [`reference`][continual_eval.results.ContinualResults.reference])
    reference_metrics: ReferenceMetrics | None = None
    #: the class-incremental record (``ContinualEvalCallback(task_classes=...)``: the
    #: ``class_incremental`` section); ``None`` without one
    class_incremental: ClassIncrementalResults | None = None
    #: sets scored at the baseline and after every stage but never trained
    #: (``ContinualEvalCallback(held_out_dataloaders=...)``: the ``held_out`` section)
    held_out: HeldOutResults | None = None
    #: the generation scorers' per-cell prediction files
    #: (``ContinualEvalCallback(predictions=N)``: the ``predictions`` section); ``None`` without
    predictions: PredictionFiles | None = None
    #: confidence intervals from the per-item records (``ContinualEvalCallback(item_records=...)``:
    #: the ``intervals`` section); ``None`` without them
    intervals: IntervalResults | None = None
    #: the per-item records' memory and item transitions (the ``items`` section)
    items: ItemResults | None = None
    #: the run ended with fewer tasks trained than test loaders (the ``coverage`` section);
    #: ``None`` otherwise (every task trained, or the run may go on)
    coverage: Coverage | None = None
    #: the online record ([`OnlineEvalCallback`][continual_eval.online.OnlineEvalCallback]: the
    #: ``online`` section); ``None`` without one
    online: OnlineResults | None = None
    #: budgeted stage-end evaluation (``ContinualEvalCallback(stage_eval_subset=...,
    #: eval_old_tasks_every=...)``: the ``stage_evaluation`` section); ``None`` without it
    stage_evaluation: schema.StageEvaluationSection | None = None

    def __post_init__(self) -> None:
        if not self.matrices:
            raise ValueError("ContinualResults needs at least one matrix")
        object.__setattr__(self, "task_names", tuple(self.task_names))
        T = len(self.task_names)
        s = next(iter(self.matrices.values())).num_stages
        for name, m in self.matrices.items():
            if tuple(m.scores.shape) != (s, T) or tuple(m.baseline.shape) != (T,):
                raise ValueError(
                    f"matrix {name!r} has scores {tuple(m.scores.shape)} and baseline "
                    f"{tuple(m.baseline.shape)}; expected ({s}, {T}) and ({T},) like the "
                    "primary matrix and the task names"
                )
        if not self.conventions:
            conventions = _default_conventions(self.forgetting, self.primary.score)
            object.__setattr__(self, "conventions", conventions)

    # ------------------------------------------------------------------ views
    @property
    def num_tasks(self) -> int:
        """``T``."""
        return len(self.task_names)

    @property
    def stages_completed(self) -> int:
        """``s``, the rows of R recorded."""
        return self.primary.num_stages

    @property
    def primary_name(self) -> str:
        """The name of the primary matrix (the first)."""
        return next(iter(self.matrices))

    @property
    def primary(self) -> MatrixResults:
        """The primary matrix: the top level of ``results.json``, ``scores.csv``."""
        return self.matrices[self.primary_name]

    @property
    def complete(self) -> bool:
        """Every task has been trained."""
        return self.stages_completed == self.num_tasks

    @property
    def reference(self) -> Tensor | None:
        """The reference scores of the primary score as a ``[T]`` float64 tensor, NaN where
        ``None``: the ``reference`` section's (`reference_metrics`, the callback's
        ``reference=``) when present, else ``metadata["reference"]`` (how ``continual-eval fit``
        stores its reference); ``None`` when neither is recorded."""
        if self.reference_metrics is not None:
            return self.reference_metrics.scores.clone()
        reference = self.metadata.get("reference")
        if not isinstance(reference, list) or len(reference) != self.num_tasks:
            return None
        return vector(reference)

    def __getitem__(self, name: str) -> MatrixResults:
        if name not in self.matrices:
            raise KeyError(
                f"these results hold no matrix {name!r}; they hold {list(self.matrices)}"
            )
        return self.matrices[name]

    def __iter__(self) -> Iterator[MatrixResults]:
        return iter(self.matrices.values())

    def curves(self, name: str | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(step [N], stage [N], scores [N, T])`` of the per-step evaluations of the matrix
        ``name`` (default: the primary one), NaN = not evaluated."""
        m = self.primary if name is None else self[name]
        if self.steps is None:
            raise ValueError("these results hold no curves (run with eval_every_n_steps)")
        scores = m.step_scores
        if scores is None:
            scores = torch.full((len(self.steps), self.num_tasks), math.nan, dtype=torch.float64)
        return self.steps.step.clone(), self.steps.stage.clone(), scores.clone()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_online(
        cls,
        online: OnlineResults,
        *,
        metadata: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        score: str = "accuracy",
    ) -> ContinualResults:
        """The results of an online run without task stages (``OnlineEvalCallback`` alone): no
        tasks (``num_tasks`` 0, one empty ``score`` matrix) and the ``online`` section."""
        empty = ScoreMatrix(
            score, torch.zeros(0, 0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
        )
        results = cls.from_tensors({score: empty}, task_names=[], metadata=metadata, run_id=run_id)
        return dataclasses.replace(results, online=online)

    @classmethod
    def from_tensors(
        cls,
        matrices: Mapping[str, ScoreMatrix],
        *,
        task_names: Sequence[str] | None = None,
        forgetting: str = "peak",
        metadata: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        steps: StepEvaluations | None = None,
        tolerance: float = 0.0,
        validate: bool = False,
        cost: RunCost | None = None,
        reference: ReferenceScores | None = None,
        lca_beta: int | None = None,
        class_incremental: ClassIncrementalResults | None = None,
        held_out: HeldOutResults | None = None,
        coverage: Coverage | None = None,
    ) -> ContinualResults:
        """Compute everything from each scorer's records (the primary first): the metric
        family of each matrix in one pass, with ``steps`` the stability and plasticity metrics
        of each matrix's ``step_scores``, and with ``reference`` the primary matrix's metrics
        against it.

        Args:
            matrices: name -> [`ScoreMatrix`][continual_eval.results.ScoreMatrix], all with the same
                ``[s, T]`` rows.
            task_names: defaults to ``task_0 .. task_{T-1}``.
            forgetting: the forgetting convention of the functional layer.
            metadata: free-form, JSON-serialisable.
            run_id: the identifier of the run.
            steps: the per-step evaluations (their rows are each matrix's ``step_scores``).
            tolerance: the stability gap's recovery tolerance.
            validate: check the cells the metrics read (off by default: the recorder already
                did).
            cost: what each stage cost (the ``cost`` section).
            reference: a reference of the primary score (the ``reference`` section:
                [`ReferenceMetrics`][continual_eval.results.ReferenceMetrics]; its ``auc`` also
                gives the primary matrix's normalised forward transfer).
            lca_beta: ``beta`` of every matrix's ``LCA_beta`` (``None``: not computed).
            class_incremental: the class-incremental record (its own section).
            held_out: the held-out sets' scores (their own section; never in the metrics).
            coverage: the run ended with fewer tasks trained than test loaders.
        """
        if not matrices:
            raise ValueError("ContinualResults needs at least one matrix")
        first = next(iter(matrices.values()))
        T = int(torch.as_tensor(first.baseline).shape[-1])
        names = list(task_names) if task_names is not None else [f"task_{j}" for j in range(T)]
        if len(names) != T:
            raise ValueError(f"{len(names)} task names for {T} tasks")
        built = {
            name: MatrixResults.from_tensors(
                name,
                m,
                forgetting=forgetting,
                validate=validate,
                steps=steps,
                tolerance=tolerance,
                lca_beta=lca_beta,
                reference_auc=reference.auc if reference is not None and k == 0 else None,
            )
            for k, (name, m) in enumerate(matrices.items())
        }
        primary = next(iter(built.values()))
        return cls(
            task_names=tuple(names),
            matrices=built,
            forgetting=forgetting,
            conventions=_default_conventions(forgetting, first.score),
            metadata=dict(metadata or {}),
            run_id=run_id,
            steps=steps,
            cost=cost,
            reference_metrics=None
            if reference is None
            else ReferenceMetrics.compute(reference, primary),
            class_incremental=class_incremental,
            held_out=held_out,
            coverage=coverage,
        )

    @classmethod
    def from_document(cls, document: schema.Document) -> ContinualResults:
        """From a checked `Document` (values as
        recorded, ``null`` -> NaN; the class-incremental measures recomputed from the counts)."""
        T = document.num_tasks
        matrices = {
            name: MatrixResults.from_section(name, section, T)
            for name, section in document.matrices.items()
        }
        curves, cost, reference = document.curves, document.cost, document.reference
        class_il = document.class_incremental
        return cls(
            task_names=tuple(document.task_names),
            matrices=matrices,
            forgetting=document.conventions.get("forgetting", "peak"),
            conventions=dict(document.conventions),
            metadata=dict(document.metadata),
            run_id=document.run_id,
            steps=None if curves is None else StepEvaluations.from_section(curves),
            cost=None if cost is None else RunCost.from_section(cost),
            reference_metrics=None
            if reference is None
            else ReferenceMetrics.from_section(reference),
            class_incremental=None
            if class_il is None
            else ClassIncrementalResults.from_section(class_il),
            held_out=None
            if document.held_out is None
            else HeldOutResults.from_section(
                document.held_out,
                {name: m.higher_is_better for name, m in document.matrices.items()},
            ),
            predictions=None
            if document.predictions is None
            else PredictionFiles.from_section(document.predictions),
            intervals=None
            if document.intervals is None
            else IntervalResults.from_section(document.intervals, T),
            items=None if document.items is None else ItemResults.from_section(document.items, T),
            coverage=None
            if document.coverage is None
            else Coverage.from_section(document.coverage),
            online=None if document.online is None else OnlineResults.from_section(document.online),
            stage_evaluation=document.stage_evaluation,
        )

    @classmethod
    def from_dict(cls, document: Mapping[str, Any], *, validate: bool = True) -> ContinualResults:
        """From a ``results.json`` document (a ``dict``); ``validate``: check it first like a file
        from elsewhere (`continual_eval.results.schema`; raises
        [`InvalidResultsError`][continual_eval.results.InvalidResultsError] naming the field)."""
        if validate:
            return cls.from_document(schema.convert_document(document))
        return cls.from_document(msgspec.convert(document, schema.Document))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ContinualResults:
        """Read and validate a ``results.json`` (or the directory holding one). When the run's
        stage journal beside it (``stages.jsonl``, see
        [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback]) holds stages the file
        does not yet (``results.json`` is rebuilt at spaced stages, and a run killed between two
        rebuilds leaves it behind): the results of every journaled stage.

        Raises:
            FileNotFoundError: no ``results.json`` (nor journal) there.
            InvalidResultsError: (a ``ValueError``) the file is not a valid results document; the
                message names the file and the field (e.g. ``scores[2][1]``).
        """
        path = Path(path)
        directory = path if path.is_dir() else path.parent
        document: schema.Document | None = None
        try:
            document = files.read_document(path)
        except FileNotFoundError:
            if path.is_file() or not (directory / files.JOURNAL_FILE).is_file():
                raise
        if path.is_dir() or path.name == files.RESULTS_FILE:
            newer = files.replay_newer_journal(directory, document)
            if newer is not None:
                return cast(ContinualResults, newer)
        if document is None:
            raise FileNotFoundError(f"no {files.RESULTS_FILE} at {directory}")
        return cls.from_document(document)

    # ------------------------------------------------------------------ output
    def to_document(self, *, with_files: bool = True) -> schema.Document:
        """The ``results.json`` document as a `Document`
        (see that module for its shape; [`to_dict`][continual_eval.results.ContinualResults.to_dict]
        is its ``dict``), with the ``files`` entry
        [`write`][continual_eval.results.ContinualResults.write] writes (``with_files=False``:
        without it, whose CSV hashes cost as much as the files; what a writer of the files
        computes itself)."""
        document = self._document()
        if not with_files:
            return document
        # the commit record results.json is written with (the CSVs follow from the document)
        return msgspec.structs.replace(document, files=files.file_records(document))

    def _document(self) -> schema.Document:
        """The document without ``files`` (what
        [`write`][continual_eval.results.ContinualResults.write] adds them to)."""
        sections = {
            name: m.to_section(steps=self.steps is not None) for name, m in self.matrices.items()
        }
        primary = sections[self.primary_name]
        curves = stability = None
        if self.steps is not None:
            m = self.primary
            scores = m.step_scores
            if scores is None:
                scores = torch.full((len(self.steps), self.num_tasks), math.nan)
            curves = self.steps.to_section(scores, m.score)
            stability = (
                m.stability
                or Stability.compute(
                    scores, self.steps, self.stages_completed, higher_is_better=m.higher_is_better
                )
            ).to_section()
        return schema.Document(
            format_version=schema.FORMAT_VERSION,
            run_id=self.run_id,
            num_tasks=self.num_tasks,
            task_names=list(self.task_names),
            stages_completed=self.stages_completed,
            scores=primary.scores,
            baseline=primary.baseline,
            metrics=primary.metrics,
            metrics_per_stage=primary.metrics_per_stage,
            per_task=primary.per_task,
            conventions=dict(self.conventions),
            metadata=dict(self.metadata),
            matrices=sections,
            curves=curves,
            stability=stability,
            cost=None if self.cost is None else self.cost.to_section(),
            reference=None
            if self.reference_metrics is None
            else self.reference_metrics.to_section(),
            class_incremental=None
            if self.class_incremental is None
            else self.class_incremental.to_section(),
            held_out=None if self.held_out is None else self.held_out.to_section(),
            predictions=None if self.predictions is None else self.predictions.to_section(),
            intervals=None if self.intervals is None else self.intervals.to_section(),
            items=None if self.items is None else self.items.to_section(),
            coverage=None if self.coverage is None else self.coverage.to_section(),
            online=None if self.online is None else self.online.to_section(),
            stage_evaluation=self.stage_evaluation,
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``results.json`` document as plain JSON values (``format_version`` 2): the top
        level holds the primary matrix (``scores``, ``baseline``, ``metrics``,
        ``metrics_per_stage``, ``per_task``) and, with per-step evaluation, its ``curves`` and
        ``stability``; ``matrices`` every matrix by name with its ``score``,
        ``higher_is_better``, ``bounds``, metric family and step curves; ``cost``,
        ``reference``, ``class_incremental``, ``coverage``, ``held_out``, ``predictions`` and
        ``online`` when recorded; ``files``, the SHA-256 and stage count of every CSV file
        [`write`][continual_eval.results.ContinualResults.write] writes with it. The same document
        as the ``results.json`` [`write`][continual_eval.results.ContinualResults.write] writes, key
        for key."""
        document: dict[str, Any] = msgspec.to_builtins(self.to_document())
        return document

    def write(self, dirpath: str | os.PathLike[str]) -> Path:
        """Write ``scores.csv`` (and ``scores_<name>.csv`` per further matrix), then
        ``results.json`` into ``dirpath``, each atomically
        (`commit_results`); returns the JSON path."""
        return files.commit_results(dirpath, self._document())

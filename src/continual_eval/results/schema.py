"""What ``results.json`` holds, defined once, and the validation of a file from elsewhere.

Every section of the document is one `msgspec` ``Struct`` below (`Document` at the
top): its field types and constraints are both the typed form the model
(`continual_eval.results.model`) is built from and the check of an untrusted file. Decoding
checks every value's type and range (a finite number or ``null`` for a cell, an integer in its
range, a string of at most `MAX_NAME_LENGTH` characters for a name, ...); what a type cannot
say (lengths that follow ``num_tasks`` and ``stages_completed``, cells within their matrix's
``bounds``, the top level repeating the primary matrix, confusion counts that add up to the
recorded test-set sizes) is checked after decoding by `check_document`.

Every failure is one [`InvalidResultsError`][continual_eval.results.InvalidResultsError] (a
``ValueError``) naming the file, the field as a JSON path (``scores[2][1]``,
``matrices.acc.bounds[1]``) and what was expected and found.

Shape (``T = num_tasks``, ``s = stages_completed``, ``N`` = the per-step evaluations, ``C`` =
``class_incremental.num_classes``; "cell" = a finite number or ``null``, ``null`` = not
evaluated or undefined):

* top level: ``format_version`` (`FORMAT_VERSION`), ``run_id``, ``task_names`` (``T``),
  ``matrices`` (name -> `MatrixSection`, the primary first) and a copy of the primary
  matrix's ``scores`` ``[s, T]``, ``baseline`` ``[T]``, ``metrics``, ``metrics_per_stage`` (``s``
  each) and ``per_task`` (``max(s - 1, 0)`` each) that must equal it; ``conventions``,
  ``metadata`` (free-form; ``experiment``, ``method``, ``seed`` short labels, ``reference`` ``T``
  cells); with per-step evaluation ``curves`` (``N`` evaluations; its ``accuracy`` rows and the
  top-level ``stability`` repeat the primary matrix's ``step_scores`` and ``stability``);
  optional ``cost``, ``reference``, ``class_incremental``, ``held_out`` (sets never trained:
  per matrix ``baseline [H]``, ``scores``/``delta [s, H]``, ``worst_drop [H]``),
  ``predictions`` (the per-cell prediction files, `PredictionsSection`), ``intervals``
  and ``items`` (per-item records: `IntervalsSection`, `ItemsSection`); ``coverage``
  when the run ended with fewer tasks trained than it has test loaders (`CoverageSection`);
  ``online`` ([`OnlineSection`][continual_eval.results.schema.OnlineSection], what
  [`OnlineEvalCallback`][continual_eval.online.OnlineEvalCallback] recorded over the stream);
  ``files`` (the commit record of the CSV files, see `continual_eval.results.files`);
* ``num_tasks`` is 0 only in a document with an ``online`` section (an online run without
  ``ContinualEvalCallback``: no task matrix, one empty ``accuracy`` matrix);
* unknown keys are ignored (forward compatibility) and not written back.

Limits on what an untrusted file may hold (beyond them a file is refused, not truncated):
`MAX_FILE_BYTES` bytes, `MAX_TASKS` tasks, `MAX_MATRICES` matrices,
`MAX_NAME_LENGTH` characters per name, `MAX_TEXT_LENGTH` per descriptive string,
`MAX_DEPTH` levels of nesting in ``metadata``, `MAX_CLASSES` classes,
`MAX_CLASS_TABLE_CELLS` stages x classes and `MAX_CONFUSION_CELLS` nonzero confusion cells.
JSON has no ``NaN`` or ``Infinity`` (the writer stores ``null``); numbers beyond the float range
are refused.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, NoReturn

import msgspec
import numpy as np
from msgspec import Meta, Struct

from continual_eval.results._errors import (
    InvalidResultsError,
    describe,
    key_path,
    printable,
    schema_error,
)

__all__ = [
    "FORMAT_VERSION",
    "MAX_CLASSES",
    "MAX_CLASS_TABLE_CELLS",
    "MAX_CONFUSION_CELLS",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_MATRICES",
    "MAX_NAME_LENGTH",
    "MAX_TASKS",
    "MAX_TEXT_LENGTH",
    "ClassIncrementalSection",
    "CostSection",
    "CoverageSection",
    "CurvesSection",
    "Document",
    "HeldOut",
    "HeldOutEvaluation",
    "IntervalsSection",
    "InvalidResultsError",
    "ItemsSection",
    "MatrixSection",
    "OnlineProtocol",
    "OnlineSection",
    "OnlineWindow",
    "PlasticitySection",
    "PredictionFileSection",
    "PredictionsSection",
    "ReferenceSection",
    "ScoreCounts",
    "StabilitySection",
    "WindowCost",
    "check_document",
    "check_online_section",
    "convert_document",
    "decode_document",
    "printable",
]

#: the ``format_version`` written and read
FORMAT_VERSION: Literal[2] = 2
#: largest ``results.json`` (and stage journal) read, in bytes: T = 2000 with full curves fits
#: comfortably, and so do `MAX_CONFUSION_CELLS` confusion cells (about 12 characters each)
MAX_FILE_BYTES = 1024 * 1024 * 1024
#: most tasks a document may hold (``num_tasks``)
MAX_TASKS = 2000
#: most score matrices in one document
MAX_MATRICES = 64
#: longest name: task, matrix, score, metric key, convention, label, ``run_id``
MAX_NAME_LENGTH = 200
#: longest descriptive string (``curves.step_counter``, ``stability.source``, ...)
MAX_TEXT_LENGTH = 1000
#: deepest nesting of arrays and objects in ``metadata`` (the document is level 1)
MAX_DEPTH = 32
#: most class ids of a ``class_incremental`` section (``num_classes``)
MAX_CLASSES = 5000
#: most nonzero confusion cells of a ``class_incremental`` section, all stages together (the
#: counts are stored sparsely: 24 bytes per cell in the record, 32 in the results' sparse tensor,
#: about 12 characters in the file; a stage holds at most one cell per test sample of its seen
#: tasks; T = 1000 tasks of 2 classes with 64 test samples each store at most 32M)
MAX_CONFUSION_CELLS = 2**25
#: most stages x classes of a ``class_incremental`` section (its per-class tables such as
#: ``per_class_accuracy [s, C]``, 8 bytes per cell in memory; T = 1000 tasks of 2 classes: 2M)
MAX_CLASS_TABLE_CELLS = 2**22

_MAX_EXACT_INT = 2**53  # counts and integer cells beyond this are not exact as float64

# ---------------------------------------------------------------------- value types
_FLOAT_MAX = sys.float_info.max
#: a finite number
Finite = Annotated[float, Meta(ge=-_FLOAT_MAX, le=_FLOAT_MAX)]
#: a cell: a finite number, or ``null`` (not evaluated, undefined)
Cell = Finite | None
Cells = list[Cell]
Rows = list[list[Cell]]
Count = Annotated[int, Meta(ge=0)]
Name = Annotated[str, Meta(max_length=MAX_NAME_LENGTH)]
Text = Annotated[str, Meta(max_length=MAX_TEXT_LENGTH)]
#: name -> one cell per stage (or task)
Table = dict[Name, Cells]
Scalars = dict[Name, Cell]
#: ``[lo, hi]``, ``null`` = that end is infinite
Bounds = Annotated[list[Cell], Meta(min_length=2, max_length=2)]
#: how ``metadata.experiment``, ``method`` and ``seed`` may be written (the report shows them)
Label = Name | Annotated[int, Meta(ge=-_MAX_EXACT_INT, le=_MAX_EXACT_INT)] | Finite | bool | None
Sha256 = Annotated[str, Meta(pattern="^[0-9a-f]{64}$")]
#: how a sequence model's score was produced: reading the reference tokens (perplexity, token
#: accuracy) or its own generations; the two are not comparable (teacher forcing inflates scores)
Scoring = Literal["teacher-forced", "free-running"]
SCORING_MODES: tuple[str, ...] = ("teacher-forced", "free-running")


# ---------------------------------------------------------------------- sections
class StabilitySection(Struct, kw_only=True):
    """One matrix's stability metrics
    ([`continual_eval.results.Stability`][continual_eval.results.Stability]): ``min_acc`` and
    ``wc_acc`` per completed stage, ``per_task`` gap values (at most ``T`` each)."""

    min_acc: Cells
    wc_acc: Cells
    per_task: Table
    tolerance: Finite
    source: Text


class LcaSection(Struct, kw_only=True):
    beta: Count
    value: Cell


class PlasticitySection(Struct, kw_only=True):
    """One matrix's plasticity metrics
    ([`continual_eval.results.Plasticity`][continual_eval.results.Plasticity])."""

    anytime_accuracy: Cell
    stage_auc: Cells
    lca: LcaSection | None
    auc_forward_transfer: Cell
    auc_forward_transfer_per_task: Cells | None


class MatrixSection(Struct, kw_only=True, omit_defaults=True):
    """One scorer's matrix
    ([`continual_eval.results.MatrixResults`][continual_eval.results.MatrixResults]):
    ``scores [s, T]``, ``baseline [T]`` within ``bounds``, its metric family and, with per-step
    evaluation, ``step_scores [N, T]`` with their stability and plasticity."""

    score: Name
    higher_is_better: bool
    bounds: Bounds | None
    scores: Rows
    baseline: Cells
    metrics: Scalars
    metrics_per_stage: Table
    per_task: Table
    step_scores: Rows | None = None
    stability: StabilitySection | None = None
    plasticity: PlasticitySection | None = None
    scoring: Scoring | None = None


class SubsetSection(Struct, kw_only=True, omit_defaults=True):
    """The fixed subset of the per-step evaluations."""

    size: Count
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
    samples_per_task: list[Count]
    rule: Text = ""


class CurvesSection(Struct, kw_only=True):
    """When the per-step evaluations ran (``step``, ``stage``, ``full``: ``N`` each) and the
    primary matrix's rows (``accuracy``, ``[N, T]``)."""

    step: list[Count]
    stage: list[Count]
    accuracy: Rows
    full: list[bool]
    score: Name
    step_counter: Text
    subset: SubsetSection | None


class StageCostSection(Struct, kw_only=True):
    """One stage's cost (`continual_eval.stage_cost.StageCost`)."""

    stage: Count
    train_seconds: Finite
    eval_seconds: Finite
    peak_memory_bytes: Count
    memory_kind: Name
    parameters: Count
    trainable_parameters: Count
    samples: Count
    optimizer_steps: Count
    replay_memory: Count | None


class CostSection(Struct, kw_only=True):
    """What each stage cost (``per_stage``, at most ``T``); ``summary`` and ``memory_kind`` are
    recomputed from it when read."""

    per_stage: list[StageCostSection]
    summary: Scalars
    memory_kind: Name | None


class ReferenceSection(Struct, kw_only=True):
    """The primary matrix against a reference model
    ([`continual_eval.results.ReferenceMetrics`][continual_eval.results.ReferenceMetrics]):
    ``scores`` and ``auc`` ``[T]`` within the primary matrix's bounds."""

    kind: Literal["isolated", "joint", "cumulative", "given"]
    score: Name
    higher_is_better: bool
    scores: Cells
    auc: Cells | None
    intransigence: Cell
    intransigence_per_task: Cells
    fwt_isolated: Cell
    fwt_isolated_per_task: Cells
    per_stage: Table
    source: Text


class CoverageSection(Struct, kw_only=True):
    """A run that ended with fewer tasks trained than it has test loaders (``fit_tasks`` over
    fewer training loaders, a schedule of fewer stages): ``tasks_trained`` equals
    ``stages_completed``, ``tasks_evaluated`` equals ``num_tasks`` (the test loaders, scored after
    every stage), and the metrics cover only the first ``tasks_trained x tasks_trained`` block of
    R (``metrics_cover``, e.g. ``R[:2, :2]``)."""

    tasks_trained: Count
    tasks_evaluated: Count
    metrics_cover: Text


class StageSubsetSection(Struct, kw_only=True):
    """The fixed subset the baseline and stage-end evaluations scored, per task: its size
    (``samples_per_task``, at most ``size``), how it was drawn (``rule_per_task``: a key of
    ``rules``) and the price, the binomial standard-error bound ``0.5 / sqrt(n_j)`` of one cell
    (``standard_error_bound``)."""

    size: Annotated[int, Meta(ge=1)]
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
    samples_per_task: list[Count]
    rule_per_task: list[Literal["stratified", "uniform"]]
    rules: dict[Name, Text]
    standard_error_bound: list[Finite]


class StageEvaluationSection(Struct, kw_only=True, omit_defaults=True):
    """Budgeted stage-end evaluation (the ``stage_evaluation`` section): the fixed ``subset`` per
    task (``null``: whole test sets) and ``old_tasks_every`` ``k`` (``null``: every stage), with
    ``old_tasks_rule`` saying which stages score the old tasks; a skipped cell is ``null`` in
    every matrix and so is every metric that reads one."""

    subset: StageSubsetSection | None = None
    old_tasks_every: Annotated[int, Meta(ge=1)] | None = None
    old_tasks_rule: Text = ""


class ConfusionSection(Struct, kw_only=True):
    """Per stage one string of ``true:predicted:count`` cells (see
    `continual_eval.results.class_incremental`)."""

    encoding: Text
    stages: list[str]


class ClassIncrementalSection(Struct, kw_only=True):
    """The class-incremental record
    ([`continual_eval.results.ClassIncrementalResults`][continual_eval.results.ClassIncrementalResults]):
    the counts (``confusion``) and the test samples of each class (``test_samples [C]``: every
    stage's counts of a seen class add up to it) are the record; the measures are recomputed from
    them when read."""

    task_classes: list[list[Count]]
    num_classes: Annotated[int, Meta(ge=1, le=MAX_CLASSES)]
    test_samples: list[Count]
    class_order: list[Count]
    prediction: Literal["seen", "all"]
    forgetting: Name
    confusion: ConfusionSection
    per_class_accuracy: Rows
    seen_accuracy: Table
    last_accuracy: Scalars
    average_incremental_accuracy: Scalars
    old_accuracy: Table
    new_accuracy: Cells
    mean_class_accuracy: Cells
    amca: Cell
    amca_per_stage: Cells
    class_forgetting: Cells
    mean_class_forgetting: Cell
    mean_class_forgetting_per_stage: Cells
    recency_bias: Table
    source: Text


class HeldOutMatrixSection(Struct, kw_only=True):
    """One matrix's scores of the held-out sets: ``baseline [H]``, ``scores [s, H]``, ``delta
    [s, H]`` (against the baseline) and ``worst_drop [H]``."""

    baseline: Cells
    scores: Rows
    delta: Rows
    worst_drop: Cells


class HeldOutSection(Struct, kw_only=True):
    """Sets scored at the baseline and after every stage, never trained
    ([`continual_eval.results.held_out.HeldOutResults`][continual_eval.results.HeldOutResults]):
    their ``names`` and, per score matrix, their scores."""

    names: Annotated[list[Name], Meta(min_length=1, max_length=MAX_TASKS)]
    matrices: dict[Name, HeldOutMatrixSection]


#: the prediction files' folder in the run directory, and their names (``predictions/...``)
PREDICTIONS_DIR = "predictions"
PREDICTIONS_BASELINE = f"{PREDICTIONS_DIR}/baseline.jsonl"
#: most items per cell and scorer a ``predictions`` section may bound its files to
MAX_PREDICTION_ITEMS = 2**31 - 1


def prediction_file_path(stage: int | None) -> str:
    """``predictions/stage_{stage}.jsonl``, or ``predictions/baseline.jsonl`` for ``None``."""
    return PREDICTIONS_BASELINE if stage is None else f"{PREDICTIONS_DIR}/stage_{stage}.jsonl"


class PredictionFileSection(Struct, kw_only=True):
    """One prediction file: its path in the run directory, its number of lines and their
    SHA-256."""

    path: Text
    lines: Count
    sha256: Sha256


class PredictionsSection(Struct, kw_only=True):
    """The per-cell predictions of the generation scorers ``scorers``
    (``ContinualEvalCallback(predictions=max_items)``): one JSON-lines file for the baseline
    and one per stage (``predictions/stage_{i}.jsonl``), each line one item of one cell
    (``task`` or ``held_out``, ``scorer``, ``item``, ``prediction``, ``reference``, ``score``),
    at most ``max_items`` per cell and scorer; ``null`` for an evaluation whose file could not be
    written (the run stopped there)."""

    max_items: Annotated[int, Meta(ge=1, le=MAX_PREDICTION_ITEMS)]
    scorers: Annotated[list[Name], Meta(min_length=1, max_length=MAX_MATRICES)]
    baseline: PredictionFileSection | None = None
    stages: Annotated[list[PredictionFileSection | None], Meta(max_length=MAX_TASKS)]


class MetricIntervalSection(Struct, kw_only=True):
    """One metric's estimate and interval ends (``null``: undefined)."""

    estimate: Cell
    low: Cell
    high: Cell


class PerTaskIntervalSection(Struct, kw_only=True):
    """Estimates and interval ends of a vector ``[n]`` (per task, per held-out set), one length
    for the three (``null``: undefined)."""

    estimate: Cells
    low: Cells
    high: Cells


class RowsIntervalSection(Struct, kw_only=True):
    """Estimates and interval ends of rows ``[s, H]`` (a held-out delta per stage and set)."""

    estimate: Rows
    low: Rows
    high: Rows


class HeldOutIntervalsSection(Struct, kw_only=True):
    """One matrix's held-out intervals (`HeldOutIntervals`): each score's ``low``/``high``
    ``[s, H]`` and the baseline's ``[H]`` by ``cell_method``; ``delta`` ``[s, H]`` and
    ``worst_drop`` ``[H]`` by the paired bootstrap over each set's items; ``num_items`` ``[H]``."""

    cell_method: Literal["wilson", "t"]
    low: Rows
    high: Rows
    baseline_low: Cells
    baseline_high: Cells
    delta: RowsIntervalSection
    worst_drop: PerTaskIntervalSection
    num_items: list[Count]


class ClassIncrementalPairedSection(Struct, kw_only=True):
    """The paired bootstrap of the class-incremental numbers that read each item's class
    (`ClassIncrementalPaired`): over ``matrix``'s items (``acc_task_agnostic``) and their
    labels; ``per_stage`` ``[s]`` each (``seen_accuracy_task``, ``old_accuracy_task``,
    ``mean_class_accuracy``, ``amca_per_stage``, ``mean_class_forgetting_per_stage``),
    ``class_forgetting`` ``[C]``, ``metrics`` scalars (``average_incremental_accuracy_task``,
    ``average_incremental_accuracy_sample``, ``amca``, ``mean_class_forgetting``)."""

    method: Text
    matrix: Name
    per_stage: dict[Name, PerTaskIntervalSection]
    class_forgetting: PerTaskIntervalSection
    metrics: dict[Name, MetricIntervalSection]


class ClassIncrementalIntervalsSection(Struct, kw_only=True):
    """Wilson intervals of the class-incremental proportions (`ClassIncrementalIntervals`):
    ``per_class_accuracy`` ``[s, C]``, the sample-weighted ``seen_accuracy``, ``old_accuracy``
    and ``new_accuracy`` ``[s]``, ``recency_prediction_share`` ``[s]``; ``paired``: the paired
    bootstrap of the per-class and task-weighted numbers; ``unavailable``: number -> why it has
    no interval."""

    method: Literal["wilson"]
    per_class_accuracy: RowsIntervalSection
    seen_accuracy: PerTaskIntervalSection
    old_accuracy: PerTaskIntervalSection
    new_accuracy: PerTaskIntervalSection
    unavailable: dict[Name, Text] = msgspec.field(default_factory=dict)
    recency_prediction_share: PerTaskIntervalSection | None = None
    paired: ClassIncrementalPairedSection | None = None


class MatrixIntervalsSection(Struct, kw_only=True):
    """One matrix's intervals from its per-item records: every cell's ``low``/``high``
    ``[s, T]`` and the baseline's ``[T]`` (``null``: not evaluated) by ``cell_method``
    (``wilson`` for 0/1 items, ``t`` otherwise), the metrics' (ACC, BWT, FWT, forgetting, ...)
    by the paired bootstrap, ``num_items`` ``[T]`` and ``unavailable``: metric -> why it has no
    interval (intransigence against a reference without per-item values; never also in
    ``metrics``)."""

    cell_method: Literal["wilson", "t"]
    low: Rows
    high: Rows
    baseline_low: Cells
    baseline_high: Cells
    metrics: dict[Name, MetricIntervalSection]
    num_items: list[Count]
    unavailable: dict[Name, Text] = msgspec.field(default_factory=dict)
    #: the per-task values' intervals by the same resamples (``bwt``, ``forgetting``, ``fwt``
    #: ``[max(s - 1, 0)]``, ``intransigence`` ``[s]``)
    per_task: dict[Name, PerTaskIntervalSection] = msgspec.field(default_factory=dict)
    #: the step curves' metrics by the same resamples (``min_acc``, ``wc_acc``, ``stage_auc``,
    #: ``auc_forward_transfer_per_task`` ``[s]``; ``gap_boundary``, ``gap_minimum``,
    #: ``gap_depth``, ``gap_recovery_steps`` ``[max(s - 1, 0)]``; a recovery's ``null`` end:
    #: not recovered within the stage)
    step_metrics: dict[Name, PerTaskIntervalSection] = msgspec.field(default_factory=dict)


class IntervalsSection(Struct, kw_only=True):
    """Confidence intervals of one run from its per-item records
    ([`IntervalResults`][continual_eval.results.intervals.IntervalResults]): the settings
    (``confidence``, ``resamples``, ``seed``, ``weights``, ``method`` of the metrics) and per
    recorded matrix its cells' and metrics' intervals."""

    method: Text
    confidence: Annotated[float, Meta(gt=0, lt=1)]
    resamples: Annotated[int, Meta(ge=1)]
    seed: Count
    weights: Name
    forgetting_convention: Name
    fwt_convention: Name
    matrices: dict[Name, MatrixIntervalsSection]
    #: the held-out sets (the columns of ``held_out``), as in the ``held_out`` section
    held_out_names: list[Name] = msgspec.field(default_factory=list)
    held_out: dict[Name, HeldOutIntervalsSection] = msgspec.field(default_factory=dict)
    #: number -> why one run gives it no interval (``stability``, ``plasticity``, ...)
    unavailable: dict[Name, Text] = msgspec.field(default_factory=dict)
    class_incremental: ClassIncrementalIntervalsSection | None = None


class TransitionsSection(Struct, kw_only=True):
    """One 0/1 matrix's item transitions per stage and task ``[s, T]`` (``null``: undefined):
    against the previous evaluation (``right_to_wrong``, ``wrong_to_right``), against the
    diagonal (``forgotten``, ``recovered``), the items forgotten at least once
    (``forgotten_once``) and ``num_items`` ``[T]``; ``forgotten_once_low``/``_high`` ``[s, T]``:
    the Wilson interval (at ``confidence``) of the fraction ``forgotten_once / num_items``
    (derived from the counts: a reader recomputes it)."""

    right_to_wrong: Rows
    wrong_to_right: Rows
    forgotten: Rows
    recovered: Rows
    forgotten_once: Rows
    num_items: list[Count]
    confidence: Annotated[float, Meta(gt=0, lt=1)] = 0.95
    forgotten_once_low: Rows | None = None
    forgotten_once_high: Rows | None = None


class ItemsSection(Struct, kw_only=True):
    """What the per-item records hold
    ([`ItemResults`][continual_eval.results.intervals.ItemResults]): per recorded matrix its bits
    per item and evaluation (``bits_per_item``: 1 for 0/1 items, 64 for floats), the bytes held
    (``memory_bytes``), the matrices not recorded and why (``skipped``), and the item
    transitions of the 0/1 matrices."""

    bits_per_item: dict[Name, Literal[1, 64]]
    memory_bytes: Count
    skipped: dict[Name, Text]
    transitions: dict[Name, TransitionsSection]


# ---------------------------------------------------------------------- online
#: the blind predictors scored beside the learner of an online section: the most frequent label
#: among the ``blind_window`` labels revealed last (``mode``), the last revealed label (``last``),
#: the most frequent label of all revealed so far (``prior``)
BLIND_PREDICTORS = ("mode", "last", "prior")
Seconds = Annotated[float, Meta(ge=0, le=_FLOAT_MAX)]
Positive = Annotated[int, Meta(ge=1)]


class ScoreCounts(Struct, kw_only=True, frozen=True):
    """One score in one window of the ``online`` section: the learner's ``correct`` predictions
    among ``total`` samples, and ``blind[name]``, each blind predictor's correct predictions on
    the same samples (one per ``BLIND_PREDICTORS``)."""

    correct: Count
    total: Count
    blind: dict[Name, Count]


class WindowCost(Struct, kw_only=True, frozen=True):
    """What one window cost (measured by ``continual_eval.stage_cost``).

    ``samples``: training samples consumed, summed over ranks (a ``DistributedSampler``'s padding
    included); ``optimizer_steps``: increments of ``trainer.global_step``; ``train_seconds``: wall
    time of the window's training batches, the callback's per-batch scoring included (clock read
    at window boundaries only, after one CUDA synchronize); ``eval_seconds``: the held-out
    evaluation at the window's end (0 without one); ``scoring_forwards``: the forward passes the
    callback ran for prequential and lookahead scoring, summed over ranks (0 when prequential
    scores reuse the training step's outputs and nothing is read ahead); the rest as in
    ``StageCost``.
    """

    samples: Count
    optimizer_steps: Count
    train_seconds: Seconds
    eval_seconds: Seconds
    scoring_forwards: Count
    peak_memory_bytes: Count
    memory_kind: Name
    parameters: Count
    trainable_parameters: Count


class OnlineWindow(Struct, kw_only=True, frozen=True):
    """``window_batches`` consecutive training batches (the last window may be shorter).

    ``first_batch``/``last_batch``: training batches counted from the run's start (inclusive);
    ``stream_start``/``stream_end``: the stream positions ``[start, end)`` trained in the window
    (samples of all ranks; padding excluded); ``global_step``: optimizer steps of the run at the
    window's end; ``classes_seen``: the distinct labels the stream has shown by the window's
    end (``1 / classes_seen`` is chance for balanced labels); ``scores``: per score
    (``online``, ``near_future/<delay>``, ``label_delay/<delay>``) its counts; ``cost``: the
    window's compute.
    """

    index: Count
    first_batch: Count
    last_batch: Count
    stream_start: Count
    stream_end: Count
    global_step: Count
    classes_seen: Count
    scores: dict[Name, ScoreCounts]
    cost: WindowCost


class HeldOutEvaluation(Struct, kw_only=True, frozen=True):
    """One evaluation on every held-out set, after ``stream_position`` stream samples (the
    number trained; 0: before training), ``batches`` training batches and ``optimizer_steps``
    steps; ``window``: the last window closed before it (``-1``: none); ``segments_ended``: the
    stream segments that ended at this evaluation (their row of ``R``); ``scores``: one cell per
    set (``null``: not evaluated); ``seconds``: its wall time."""

    stream_position: Count
    batches: Count
    optimizer_steps: Count
    window: Annotated[int, Meta(ge=-1)]
    segments_ended: list[Count]
    scores: Cells
    seconds: Seconds


class HeldOut(Struct, kw_only=True):
    """Held-out sets scored over the stream: ``names``, ``segment_starts`` (the stream position
    where each set's segment starts, or ``null`` when the sets are not tied to stream positions),
    the scorer's name and the evaluations in stream order."""

    names: list[Name]
    segment_starts: list[Count] | None
    scorer: Name
    evaluations: list[HeldOutEvaluation]


class OnlineProtocol(Struct, kw_only=True, frozen=True):
    """How the stream was scored.

    ``batch_size``: samples per training batch on one rank; ``global_batch_size``: the stream
    samples of one training step over all ranks (``world_size * batch_size``: a
    ``DistributedSampler`` gives rank ``r`` the positions ``r, r + W, r + 2W, ...``, so step ``k``
    trains the positions ``[k G, (k + 1) G)``); ``near_future_delays``/``label_delays``: in
    batches; ``blind_window``: the labels the ``mode`` predictor counts; ``prequential``:
    ``"outputs"`` (the training step's own predictions) or ``"forward"`` (an eval-mode forward
    before the optimizer step); ``stream_source``: where lookahead batches were read
    (``"train_loader"``, ``"stream"``, ``"none"``).
    """

    world_size: Positive
    batch_size: Count
    global_batch_size: Count
    window_batches: Positive
    near_future_delays: list[Positive]
    label_delays: list[Positive]
    blind_window: Positive
    prequential: Literal["outputs", "forward"]
    stream_source: Literal["train_loader", "stream", "none"]


class OnlineSection(Struct, kw_only=True, omit_defaults=True):
    """The ``online`` section
    ([`continual_eval.results.OnlineResults`][continual_eval.results.OnlineResults]): the
    ``protocol``, one ``OnlineWindow`` per ``window_batches`` training batches in stream order, the
    held-out evaluations over the stream (``held_out``, or ``null``) and ``summary``, derived on
    writing and recomputed when read (the counts are the record)."""

    protocol: OnlineProtocol
    windows: list[OnlineWindow]
    held_out: HeldOut | None = None
    summary: dict[str, Any] | None = None


class FileRecord(Struct, kw_only=True):
    """A CSV file written with the document: its SHA-256 and the stages it holds."""

    sha256: Sha256
    stages: Count


class MetadataLabels(Struct, kw_only=True):
    """The keys of the free-form ``metadata`` that readers interpret."""

    experiment: Label = None
    method: Label = None
    seed: Label = None
    reference: Cells | None = None


class Document(Struct, kw_only=True, omit_defaults=True):
    """A whole ``results.json`` (see the module docstring)."""

    format_version: Literal[2]
    run_id: Name | None = None
    num_tasks: Annotated[int, Meta(ge=0, le=MAX_TASKS)]
    task_names: list[Name]
    stages_completed: Count
    scores: Rows
    baseline: Cells
    metrics: Scalars
    metrics_per_stage: Table
    per_task: Table
    conventions: dict[Name, Name]
    metadata: dict[str, Any]
    matrices: Annotated[dict[Name, MatrixSection], Meta(min_length=1, max_length=MAX_MATRICES)]
    curves: CurvesSection | None = None
    stability: StabilitySection | None = None
    cost: CostSection | None = None
    reference: ReferenceSection | None = None
    class_incremental: ClassIncrementalSection | None = None
    held_out: HeldOutSection | None = None
    predictions: PredictionsSection | None = None
    intervals: IntervalsSection | None = None
    items: ItemsSection | None = None
    coverage: CoverageSection | None = None
    online: OnlineSection | None = None
    stage_evaluation: StageEvaluationSection | None = None
    files: dict[Name, FileRecord] | None = None

    @property
    def primary_name(self) -> str:
        """The first matrix's name."""
        return next(iter(self.matrices))


# ---------------------------------------------------------------------- decoding
_DECODER = msgspec.json.Decoder(Document)


def decode_document(data: bytes, source: str | os.PathLike[str] = "results.json") -> Document:
    """Parse and validate the bytes of a ``results.json``: `Document`, or
    [`InvalidResultsError`][continual_eval.results.InvalidResultsError] naming ``source`` and the
    field (a syntax error with its byte offset, nesting too deep to parse, a value of the wrong type
    or range, the checks of `check_document`)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidResultsError(
            source, "", f"not UTF-8 text (invalid byte at offset {err.start})"
        ) from None
    try:
        document = _DECODER.decode(data)
    except msgspec.ValidationError as err:
        raise schema_error(err, None, source, text=text, root=Document) from None
    except msgspec.DecodeError as err:
        raise InvalidResultsError(source, "", _syntax_problem(str(err), data)) from None
    except RecursionError:
        raise InvalidResultsError(source, "", "nested too deeply to parse") from None
    return check_document(document, source)


def convert_document(obj: Any, source: str | os.PathLike[str] = "results document") -> Document:
    """A parsed document (a ``dict``) as a checked `Document`."""
    try:
        document = msgspec.convert(obj, Document)
    except msgspec.ValidationError as err:
        raise schema_error(err, obj, source, root=Document) from None
    except RecursionError:
        raise InvalidResultsError(source, "", "nested too deeply") from None
    return check_document(document, source)


def _syntax_problem(message: str, data: bytes) -> str:
    """msgspec's syntax error with the text at the offending byte (e.g. ``NaN``)."""
    problem = message.removeprefix("JSON is malformed: ")
    problem = problem[:1].lower() + problem[1:]
    at = re.search(r"\(byte (\d+)\)", problem)
    if at:
        shown = data[int(at[1]) : int(at[1]) + 12].decode("utf-8", "replace")
        problem += f" at {printable(json.dumps(shown))}"
        if shown.startswith(("NaN", "Infinity", "-Infinity")):
            problem += " (NaN and Infinity are not JSON; the writer stores null)"
    return f"not valid JSON: {problem}"


# ---------------------------------------------------------------------- what types cannot say
class _Check:
    """The checks of `check_document` for one file; every failure raises."""

    def __init__(self, source: str | os.PathLike[str]) -> None:
        self.source = source

    def fail(self, field: str, problem: str) -> NoReturn:
        raise InvalidResultsError(self.source, field, problem)

    def length(self, value: Sequence[Any], field: str, n: int, *, most: bool = False) -> None:
        """``n`` items (``most``: at most ``n``)."""
        if len(value) > n or (not most and len(value) != n):
            self.fail(
                field,
                f"expected an array of {'at most ' if most else ''}{n} items, "
                f"found {describe(list(value))}",
            )

    def rows(self, value: list[list[Any]], field: str, n: int | None, columns: int) -> None:
        if n is not None:
            self.length(value, field, n)
        for i, row in enumerate(value):
            if len(row) != columns:
                self.length(row, f"{field}[{i}]", columns)

    def table(self, value: dict[str, list[Any]], field: str, n: int, *, most: bool = False) -> None:
        for key, column in value.items():
            self.length(column, key_path(field, key), n, most=most)

    def within(self, cells: list[Any], field: str, bounds: list[Any] | None, what: str) -> None:
        """Every cell of the (nested) array ``cells`` within ``bounds`` (``[lo, hi]``)."""
        if bounds is None or not cells:
            return
        lo = -math.inf if bounds[0] is None else bounds[0]
        hi = math.inf if bounds[1] is None else bounds[1]
        values = np.array(cells, dtype=np.float64)
        outside = np.argwhere((values < lo) | (values > hi))
        if len(outside):
            index = tuple(int(i) for i in outside[0])
            where = field + "".join(f"[{i}]" for i in index)
            self.fail(
                where,
                f"expected a value in [{lo}, {hi}] ({what}), found "
                f"{describe(float(values[index]))}",
            )

    def same(self, value: Any, field: str, primary: Any, primary_field: str) -> None:
        """``value`` (at ``field``) equal to the primary matrix's (at ``primary_field``)."""
        if value == primary:
            return
        path, wanted, found = _first_difference(primary, value)
        self.fail(
            field + path,
            f"expected {describe(wanted)} as {primary_field}{path} (the top level repeats the "
            f"primary matrix), found {describe(found)}",
        )


def _first_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any]:
    """The first place where ``b`` differs from ``a``: ``(path, a's value, b's value)``."""
    if isinstance(a, Struct) and isinstance(b, Struct):
        a, b = msgspec.structs.asdict(a), msgspec.structs.asdict(b)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        n = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
        return _first_difference(a[n], b[n], f"{path}[{n}]")
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        key = next(k for k in a if a[k] != b[k])
        sub = key_path(path, key)
        return _first_difference(a[key], b[key], sub if path or sub[0] == "[" else "." + sub)
    return path, a, b


def check_document(document: Document, source: str | os.PathLike[str]) -> Document:
    """What a type cannot say: lengths that follow ``T``, ``s`` and ``N``, cells within their
    matrix's ``bounds``, the top level equal to the primary matrix, and the sections' own
    rules. Returns ``document``; raises
    [`InvalidResultsError`][continual_eval.results.InvalidResultsError]."""
    check = _Check(source)
    T, s = document.num_tasks, document.stages_completed
    if T == 0 and document.online is None:
        check.fail(
            "num_tasks",
            f"expected an integer in [1, {MAX_TASKS}] (0 only in a document with an online "
            "section), found integer 0",
        )
    if s > T:
        check.fail("stages_completed", f"expected an integer in [0, {T}], found integer {s}")
    check.length(document.task_names, "task_names", T)
    N = None if document.curves is None else _check_curves(check, document.curves, T)
    for name, matrix in document.matrices.items():
        _check_matrix(check, key_path("matrices", name), matrix, T, s, N)
    primary_name = document.primary_name
    primary = document.matrices[primary_name]
    _check_top_level(check, document, primary, key_path("matrices", primary_name))
    _check_metadata(check, document.metadata, T, primary.bounds)
    if document.stability is not None:
        _check_stability(check, document.stability, "stability", T)
    if document.cost is not None:
        check.length(document.cost.per_stage, "cost.per_stage", T, most=True)
        for i, cost in enumerate(document.cost.per_stage):
            if cost.stage >= T:
                check.fail(
                    f"cost.per_stage[{i}].stage",
                    f"expected an integer in [0, {T - 1}], found integer {cost.stage}",
                )
    if document.reference is not None:
        _check_reference(check, document.reference, T, s, primary.bounds)
    if document.class_incremental is not None:
        _check_class_incremental(check, document.class_incremental, T, s)
    if document.held_out is not None:
        _check_held_out_sets(check, document.held_out, document.matrices, s)
    if document.predictions is not None:
        H = 0 if document.held_out is None else len(document.held_out.names)
        _check_predictions(check, document.predictions, document.matrices, T + H, s)
    if document.intervals is not None:
        _check_intervals(
            check,
            document.intervals,
            document.matrices,
            T,
            s,
            document.held_out,
            document.class_incremental,
        )
    if document.items is not None:
        _check_items(check, document.items, document.matrices, T, s)
    if document.coverage is not None:
        _check_coverage(check, document.coverage, T, s)
    if document.online is not None:
        _check_online(check, document.online, "online")
    if document.stage_evaluation is not None:
        _check_stage_evaluation(check, document.stage_evaluation, T)
    for name, record in (document.files or {}).items():
        if os.path.basename(name) != name or name in ("", ".", ".."):
            check.fail("files (a key)", f"expected a file name, found {describe(name)}")
        if record.stages > T:
            check.fail(
                key_path(key_path("files", name), "stages"),
                f"expected an integer in [0, {T}], found integer {record.stages}",
            )
    return document


def _check_stage_evaluation(check: _Check, section: StageEvaluationSection, T: int) -> None:
    """One subset entry per task, each at most ``size`` samples and drawn by a rule of
    ``rules``."""
    subset = section.subset
    if subset is None:
        return
    field = "stage_evaluation.subset"
    check.length(subset.samples_per_task, f"{field}.samples_per_task", T)
    check.length(subset.rule_per_task, f"{field}.rule_per_task", T)
    check.length(subset.standard_error_bound, f"{field}.standard_error_bound", T)
    for j, n in enumerate(subset.samples_per_task):
        if n > subset.size:
            check.fail(
                f"{field}.samples_per_task[{j}]",
                f"expected an integer in [0, {subset.size}] (the size), found integer {n}",
            )
    for j, rule in enumerate(subset.rule_per_task):
        if rule not in subset.rules:
            check.fail(
                f"{field}.rule_per_task[{j}]",
                f"expected a key of {field}.rules ({sorted(subset.rules)}), found {rule!r}",
            )


def _check_coverage(check: _Check, coverage: CoverageSection, T: int, s: int) -> None:
    """``tasks_trained`` is ``stages_completed`` (below ``T``: a run of every task has no
    coverage section), ``tasks_evaluated`` is ``T``."""
    if coverage.tasks_trained != s or s >= T:
        check.fail(
            "coverage.tasks_trained",
            f"expected stages_completed ({s}) below num_tasks ({T}), found integer "
            f"{coverage.tasks_trained}",
        )
    if coverage.tasks_evaluated != T:
        check.fail(
            "coverage.tasks_evaluated",
            f"expected num_tasks ({T}), found integer {coverage.tasks_evaluated}",
        )


def _check_curves(check: _Check, curves: CurvesSection, T: int) -> int:
    """``step``, ``stage``, ``full`` of one length ``N`` (returned), stages below ``T``."""
    N = len(curves.step)
    check.length(curves.stage, "curves.stage", N)
    check.length(curves.full, "curves.full", N)
    check.rows(curves.accuracy, "curves.accuracy", N, T)
    late = [n for n, stage in enumerate(curves.stage) if stage >= T]
    if late:
        check.fail(
            f"curves.stage[{late[0]}]",
            f"expected an integer in [0, {T - 1}], found integer {curves.stage[late[0]]}",
        )
    if curves.subset is not None:
        check.length(curves.subset.samples_per_task, "curves.subset.samples_per_task", T)
    return N


def _check_stability(check: _Check, section: StabilitySection, field: str, T: int) -> None:
    check.length(section.min_acc, f"{field}.min_acc", T, most=True)
    check.length(section.wc_acc, f"{field}.wc_acc", T, most=True)
    check.table(section.per_task, f"{field}.per_task", T, most=True)


def _check_matrix(
    check: _Check, field: str, matrix: MatrixSection, T: int, s: int, N: int | None
) -> None:
    """One ``matrices`` entry: its shapes and its cells within its bounds."""
    bounds = matrix.bounds
    if bounds is not None and None not in bounds and bounds[0] > bounds[1]:  # type: ignore[operator]
        check.fail(f"{field}.bounds", f"expected lo <= hi, found {bounds}")
    check.rows(matrix.scores, f"{field}.scores", s, T)
    check.length(matrix.baseline, f"{field}.baseline", T)
    check.table(matrix.metrics_per_stage, f"{field}.metrics_per_stage", s)
    check.table(matrix.per_task, f"{field}.per_task", max(s - 1, 0))
    what = "the matrix's bounds"
    check.within(matrix.scores, f"{field}.scores", bounds, what)
    check.within(matrix.baseline, f"{field}.baseline", bounds, what)
    if matrix.step_scores is not None:
        if N is None:
            check.fail(f"{field}.step_scores", "step curves without a curves section")
        check.rows(matrix.step_scores, f"{field}.step_scores", N, T)
        check.within(matrix.step_scores, f"{field}.step_scores", bounds, what)
    if matrix.stability is not None:
        _check_stability(check, matrix.stability, f"{field}.stability", T)
    if matrix.plasticity is not None:
        plasticity = matrix.plasticity
        check.length(plasticity.stage_auc, f"{field}.plasticity.stage_auc", T, most=True)
        if plasticity.auc_forward_transfer_per_task is not None:
            check.length(
                plasticity.auc_forward_transfer_per_task,
                f"{field}.plasticity.auc_forward_transfer_per_task",
                T,
                most=True,
            )


def _check_top_level(check: _Check, document: Document, primary: MatrixSection, field: str) -> None:
    """The top level repeats the primary matrix (and its step rows and stability)."""
    for key in ("scores", "baseline", "metrics", "metrics_per_stage", "per_task"):
        check.same(getattr(document, key), key, getattr(primary, key), f"{field}.{key}")
    if document.curves is not None and primary.step_scores is not None:
        check.same(
            document.curves.accuracy, "curves.accuracy", primary.step_scores, f"{field}.step_scores"
        )
    if document.stability is not None and primary.stability is not None:
        check.same(document.stability, "stability", primary.stability, f"{field}.stability")


def _check_metadata(
    check: _Check, metadata: dict[str, Any], T: int, bounds: list[Any] | None
) -> None:
    """The labels readers show, ``reference`` (``T`` cells within the primary's bounds), and at
    most `MAX_DEPTH` levels of nesting."""
    labels = {
        key: metadata[key]
        for key in ("experiment", "method", "seed", "reference")
        if key in metadata
    }
    try:
        known = msgspec.convert(labels, MetadataLabels)
    except msgspec.ValidationError as err:
        raise schema_error(
            err, labels, check.source, root=MetadataLabels, prefix="metadata"
        ) from None
    if known.reference is not None:
        check.length(known.reference, "metadata.reference", T)
        check.within(known.reference, "metadata.reference", bounds, "the primary matrix's bounds")
    stack: list[tuple[Any, str, int]] = [(metadata, "metadata", 2)]
    while stack:
        item, path, level = stack.pop()
        if level > MAX_DEPTH:
            check.fail(path, f"nested deeper than {MAX_DEPTH} levels of arrays/objects")
        children = enumerate(item) if isinstance(item, list) else item.items()
        for key, child in children:
            if isinstance(child, (list, dict)):
                stack.append((child, key_path(path, key), level + 1))


def _check_held_out_sets(
    check: _Check, section: HeldOutSection, matrices: Mapping[str, MatrixSection], s: int
) -> None:
    """Distinct set names, one entry per score matrix of the document, ``H`` cells per row and
    ``s`` rows, the scores within their matrix's bounds."""
    H = len(section.names)
    if len(set(section.names)) != H:
        check.fail("held_out.names", f"expected distinct names, found {describe(section.names)}")
    if set(section.matrices) != set(matrices):
        check.fail(
            "held_out.matrices",
            f"expected one entry per score matrix ({sorted(matrices)}), found "
            f"{describe(sorted(section.matrices))}",
        )
    for name, m in section.matrices.items():
        field = key_path("held_out.matrices", name)
        check.length(m.baseline, f"{field}.baseline", H)
        check.length(m.worst_drop, f"{field}.worst_drop", H)
        check.rows(m.scores, f"{field}.scores", s, H)
        check.rows(m.delta, f"{field}.delta", s, H)
        what = "the matrix's bounds"
        check.within(m.scores, f"{field}.scores", matrices[name].bounds, what)
        check.within(m.baseline, f"{field}.baseline", matrices[name].bounds, what)


def _check_predictions(
    check: _Check,
    section: PredictionsSection,
    matrices: Mapping[str, MatrixSection],
    cells: int,
    s: int,
) -> None:
    """Distinct scorers, each a matrix of the document; a file per stage (``s``), each at its
    own path (`prediction_file_path`) with at most ``max_items`` lines per scorer and cell
    (``cells``: the tasks and the held-out sets)."""
    if len(set(section.scorers)) != len(section.scorers):
        check.fail(
            "predictions.scorers", f"expected distinct names, found {describe(section.scorers)}"
        )
    for k, name in enumerate(section.scorers):
        if name not in matrices:
            check.fail(
                f"predictions.scorers[{k}]",
                f"expected the name of a score matrix ({sorted(matrices)}), found {describe(name)}",
            )
    check.length(section.stages, "predictions.stages", s)
    most = section.max_items * len(section.scorers) * cells
    entries: list[tuple[str, int | None, PredictionFileSection | None]]
    entries = [("predictions.baseline", None, section.baseline)]
    entries += [(f"predictions.stages[{i}]", i, f) for i, f in enumerate(section.stages)]
    for field, stage, entry in entries:
        if entry is None:
            continue
        if entry.path != prediction_file_path(stage):
            check.fail(
                f"{field}.path",
                f"expected {describe(prediction_file_path(stage))}, found {describe(entry.path)}",
            )
        if entry.lines > most:
            check.fail(
                f"{field}.lines",
                f"expected at most {most} (max_items x scorers x cells), found integer "
                f"{entry.lines}",
            )


def _check_matrix_names(
    check: _Check, field: str, names: Sequence[str], matrices: Mapping[str, MatrixSection]
) -> None:
    unknown = [name for name in names if name not in matrices]
    if unknown:
        check.fail(
            key_path(field, unknown[0]),
            f"expected a score matrix of the document ({sorted(matrices)}), found "
            f"{describe(unknown[0])}",
        )


def _check_intervals(
    check: _Check,
    section: IntervalsSection,
    matrices: Mapping[str, MatrixSection],
    T: int,
    s: int,
    held_out: HeldOutSection | None = None,
    class_incremental: ClassIncrementalSection | None = None,
) -> None:
    """Entries of the document's matrices, ``[s, T]`` cells and ``[T]`` baselines within the
    matrix's bounds, ``low <= high`` where both are given, ``T`` item counts."""
    _check_matrix_names(check, "intervals.matrices", list(section.matrices), matrices)
    for name, m in section.matrices.items():
        field = key_path("intervals.matrices", name)
        bounds = matrices[name].bounds
        check.length(m.num_items, f"{field}.num_items", T)
        for low_key, high_key, rows in (
            ("low", "high", True),
            ("baseline_low", "baseline_high", False),
        ):
            low, high = getattr(m, low_key), getattr(m, high_key)
            for key, value in ((low_key, low), (high_key, high)):
                if rows:
                    check.rows(value, f"{field}.{key}", s, T)
                else:
                    check.length(value, f"{field}.{key}", T)
                check.within(value, f"{field}.{key}", bounds, "the matrix's bounds")
            _check_ordered(check, f"{field}.{low_key}", low, high, high_key)
        both = sorted(set(m.unavailable) & set(m.metrics))
        if both:
            check.fail(
                key_path(f"{field}.unavailable", both[0]),
                "is also in metrics (a metric has an interval or a reason it has none)",
            )
        for key, interval in m.metrics.items():
            _check_ordered(
                check,
                key_path(f"{field}.metrics", key) + ".low",
                interval.low,
                interval.high,
                "high",
            )
        for key, values in m.per_task.items():
            where = key_path(f"{field}.per_task", key)
            n = _PER_TASK_LENGTHS.get(key)
            if n is None:
                check.fail(where, f"expected one of {sorted(_PER_TASK_LENGTHS)}")
            for part in ("estimate", "low", "high"):
                check.length(getattr(values, part), f"{where}.{part}", n(s))
            _check_ordered(check, f"{where}.low", values.low, values.high, "high")
        for key, values in m.step_metrics.items():
            where = key_path(f"{field}.step_metrics", key)
            n = _STEP_METRIC_LENGTHS.get(key)
            if n is None:
                check.fail(where, f"expected one of {sorted(_STEP_METRIC_LENGTHS)}")
            for part in ("estimate", "low", "high"):
                check.length(getattr(values, part), f"{where}.{part}", n(s))
            _check_ordered(check, f"{where}.low", values.low, values.high, "high")
    _check_held_out_intervals(check, section, matrices, held_out, s)
    _check_class_il_intervals(check, section.class_incremental, class_incremental, s)


def _check_class_il_intervals(
    check: _Check,
    section: ClassIncrementalIntervalsSection | None,
    class_incremental: ClassIncrementalSection | None,
    s: int,
) -> None:
    """Present only with a ``class_incremental`` section; ``[s, C]`` / ``[s]`` within
    ``[0, 1]``, ``low <= high``."""
    if section is None:
        return
    field = "intervals.class_incremental"
    if class_incremental is None:
        check.fail(field, "is given without a class_incremental section")
    C = class_incremental.num_classes
    for key in ("per_class_accuracy", "seen_accuracy", "old_accuracy", "new_accuracy"):
        part = getattr(section, key)
        for end in ("estimate", "low", "high"):
            where = f"{field}.{key}.{end}"
            value = getattr(part, end)
            if key == "per_class_accuracy":
                check.rows(value, where, s, C)
            else:
                check.length(value, where, s)
            check.within(value, where, [0.0, 1.0], "[0, 1]")
        _check_ordered(check, f"{field}.{key}.low", part.low, part.high, "high")
    if section.recency_prediction_share is not None:
        _check_triple(
            check, f"{field}.recency_prediction_share", section.recency_prediction_share, s
        )
    if section.paired is not None:
        _check_class_il_paired(check, f"{field}.paired", section.paired, s, C)


#: the paired class-IL entries and the range of their values (forgetting: a difference)
_PAIRED_STAGE_BOUNDS = {
    "seen_accuracy_task": [0.0, 1.0],
    "old_accuracy_task": [0.0, 1.0],
    "mean_class_accuracy": [0.0, 1.0],
    "amca_per_stage": [0.0, 1.0],
    "mean_class_forgetting_per_stage": [-1.0, 1.0],
}
_PAIRED_METRIC_BOUNDS = {
    "average_incremental_accuracy_task": [0.0, 1.0],
    "average_incremental_accuracy_sample": [0.0, 1.0],
    "amca": [0.0, 1.0],
    "mean_class_forgetting": [-1.0, 1.0],
}


def _check_triple(
    check: _Check,
    where: str,
    part: PerTaskIntervalSection,
    n: int,
    bounds: list[float] | None = None,
) -> None:
    """``estimate``/``low``/``high`` of length ``n`` within ``bounds`` (``[0, 1]``),
    ``low <= high``."""
    bounds = [0.0, 1.0] if bounds is None else bounds
    for end in ("estimate", "low", "high"):
        value = getattr(part, end)
        check.length(value, f"{where}.{end}", n)
        check.within(value, f"{where}.{end}", bounds, f"[{bounds[0]:g}, {bounds[1]:g}]")
    _check_ordered(check, f"{where}.low", part.low, part.high, "high")


def _check_class_il_paired(
    check: _Check, field: str, section: ClassIncrementalPairedSection, s: int, C: int
) -> None:
    """Known entries, ``[s]`` per stage and ``[C]`` per class within their ranges, ``low <=
    high``."""
    for key, part in section.per_stage.items():
        bounds = _PAIRED_STAGE_BOUNDS.get(key)
        if bounds is None:
            check.fail(
                key_path(f"{field}.per_stage", key),
                f"expected one of {sorted(_PAIRED_STAGE_BOUNDS)}",
            )
        _check_triple(check, key_path(f"{field}.per_stage", key), part, s, bounds)
    _check_triple(check, f"{field}.class_forgetting", section.class_forgetting, C, [-1.0, 1.0])
    for key, interval in section.metrics.items():
        where = key_path(f"{field}.metrics", key)
        bounds = _PAIRED_METRIC_BOUNDS.get(key)
        if bounds is None:
            check.fail(where, f"expected one of {sorted(_PAIRED_METRIC_BOUNDS)}")
        for end in ("estimate", "low", "high"):
            value = getattr(interval, end)
            if value is not None and not bounds[0] <= value <= bounds[1]:
                check.fail(
                    f"{where}.{end}",
                    f"expected a value in [{bounds[0]:g}, {bounds[1]:g}], found {value!r}",
                )
        _check_ordered(check, f"{where}.low", interval.low, interval.high, "high")


#: per-task interval name -> its length after ``s`` stages
_PER_TASK_LENGTHS = {
    "bwt": lambda s: max(s - 1, 0),
    "forgetting": lambda s: max(s - 1, 0),
    "fwt": lambda s: max(s - 1, 0),
    "intransigence": lambda s: s,
}
#: step-curve interval name -> its length after ``s`` stages
_STEP_METRIC_LENGTHS = {
    "min_acc": lambda s: s,
    "wc_acc": lambda s: s,
    "stage_auc": lambda s: s,
    "auc_forward_transfer_per_task": lambda s: s,
    "gap_boundary": lambda s: max(s - 1, 0),
    "gap_minimum": lambda s: max(s - 1, 0),
    "gap_depth": lambda s: max(s - 1, 0),
    "gap_recovery_steps": lambda s: max(s - 1, 0),
}


def _check_held_out_intervals(
    check: _Check,
    section: IntervalsSection,
    matrices: Mapping[str, MatrixSection],
    held_out: HeldOutSection | None,
    s: int,
) -> None:
    """``held_out_names`` those of the ``held_out`` section, entries of its matrices, scores
    ``[s, H]`` and baselines ``[H]`` within the matrix's bounds, ``low <= high``."""
    names = [] if held_out is None else list(held_out.names)
    if section.held_out and list(section.held_out_names) != names:
        check.fail(
            "intervals.held_out_names",
            f"expected the held_out section's names {names}, found {section.held_out_names}",
        )
    H = len(names)
    known = {} if held_out is None else held_out.matrices
    for name, h in section.held_out.items():
        field = key_path("intervals.held_out", name)
        if name not in known:
            check.fail(field, "names no matrix of the held_out section")
        bounds = matrices[name].bounds if name in matrices else None
        check.length(h.num_items, f"{field}.num_items", H)
        for key, rows in (("low", True), ("high", True), ("baseline_low", False)):
            value = getattr(h, key)
            if rows:
                check.rows(value, f"{field}.{key}", s, H)
            else:
                check.length(value, f"{field}.{key}", H)
            check.within(value, f"{field}.{key}", bounds, "the matrix's bounds")
        check.length(h.baseline_high, f"{field}.baseline_high", H)
        check.within(h.baseline_high, f"{field}.baseline_high", bounds, "the matrix's bounds")
        _check_ordered(check, f"{field}.low", h.low, h.high, "high")
        _check_ordered(check, f"{field}.baseline_low", h.baseline_low, h.baseline_high, "high")
        for part in ("estimate", "low", "high"):
            check.rows(getattr(h.delta, part), f"{field}.delta.{part}", s, H)
            check.length(getattr(h.worst_drop, part), f"{field}.worst_drop.{part}", H)
        _check_ordered(check, f"{field}.delta.low", h.delta.low, h.delta.high, "high")
        worst = h.worst_drop
        _check_ordered(check, f"{field}.worst_drop.low", worst.low, worst.high, "high")


def _check_ordered(check: _Check, field: str, low: Any, high: Any, high_key: str) -> None:
    """``low <= high`` wherever both are numbers (nested lists of equal shape)."""
    lows = np.array(low, dtype=np.float64)
    highs = np.array(high, dtype=np.float64)
    if lows.shape != highs.shape:
        return
    bad = np.argwhere(lows > highs)
    if bad.size:
        index = "".join(f"[{int(i)}]" for i in bad[0])
        check.fail(
            field + index,
            f"expected at most {high_key}{index} ({describe(float(highs[tuple(bad[0])]))}), "
            f"found {describe(float(lows[tuple(bad[0])]))}",
        )


def _check_items(
    check: _Check, section: ItemsSection, matrices: Mapping[str, MatrixSection], T: int, s: int
) -> None:
    """Entries of the document's matrices; transitions ``[s, T]`` of non-negative counts, at
    most ``num_items`` ``[T]``."""
    _check_matrix_names(check, "items.bits_per_item", list(section.bits_per_item), matrices)
    _check_matrix_names(check, "items.skipped", list(section.skipped), matrices)
    _check_matrix_names(check, "items.transitions", list(section.transitions), matrices)
    for name, t in section.transitions.items():
        field = key_path("items.transitions", name)
        check.length(t.num_items, f"{field}.num_items", T)
        for key in ("right_to_wrong", "wrong_to_right", "forgotten", "recovered", "forgotten_once"):
            rows = getattr(t, key)
            check.rows(rows, f"{field}.{key}", s, T)
            values = np.array(rows, dtype=np.float64).reshape(len(rows), T)
            over = np.argwhere((values < 0) | (values > np.array(t.num_items, dtype=np.float64)))
            if over.size:
                i, j = (int(v) for v in over[0])
                check.fail(
                    f"{field}.{key}[{i}][{j}]",
                    f"expected a count in [0, {t.num_items[j]}] (num_items[{j}]), found "
                    f"{describe(float(values[i, j]))}",
                )
        for key in ("forgotten_once_low", "forgotten_once_high"):
            rows = getattr(t, key)
            if rows is None:
                continue
            check.rows(rows, f"{field}.{key}", s, T)
            values = np.array(rows, dtype=np.float64).reshape(len(rows), T)
            outside = np.argwhere((values < 0) | (values > 1))
            if outside.size:
                i, j = (int(v) for v in outside[0])
                check.fail(
                    f"{field}.{key}[{i}][{j}]",
                    f"expected a fraction in [0, 1], found {describe(float(values[i, j]))}",
                )


def _check_reference(
    check: _Check, reference: ReferenceSection, T: int, s: int, bounds: list[Any] | None
) -> None:
    check.length(reference.scores, "reference.scores", T)
    what = "the primary matrix's bounds"
    check.within(reference.scores, "reference.scores", bounds, what)
    if reference.auc is not None:
        check.length(reference.auc, "reference.auc", T)
        check.within(reference.auc, "reference.auc", bounds, what)
    check.length(reference.intransigence_per_task, "reference.intransigence_per_task", s)
    check.length(reference.fwt_isolated_per_task, "reference.fwt_isolated_per_task", max(s - 1, 0))
    check.table(reference.per_stage, "reference.per_stage", s)


# ---------------------------------------------------------------------- class-incremental
#: one stage's cells: ASCII digits only (`\d` would take other scripts' digits, which numpy's
#: parser does not read), at most 16 of them (exact in int64); groups not captured (faster)
_CELL = "[0-9]{1,16}:[0-9]{1,16}:[0-9]{1,16}"
_CONFUSION_TEXT = re.compile(f"{_CELL}(?: {_CELL})*")


def confusion_cells(text: str) -> np.ndarray:
    """``[n, 3]`` int64 ``(true, predicted, count)`` of one stage's confusion string; a
    ``ValueError`` for text that is not ``true:predicted:count`` cells."""
    if not text:
        return np.zeros((0, 3), dtype=np.int64)
    if _CONFUSION_TEXT.fullmatch(text) is None:
        raise ValueError("expected space-separated true:predicted:count cells (decimal integers)")
    # numpy's text parser (its text mode, not the deprecated binary one): exact for the checked
    # numbers of at most 16 digits, 5x faster than splitting into a list of strings
    return np.fromstring(text.replace(":", " "), dtype=np.int64, sep=" ").reshape(-1, 3)


def _check_class_incremental(
    check: _Check, section: ClassIncrementalSection, T: int, s: int
) -> None:
    """Shapes, the task classes (distinct ids below ``C``, no class in two tasks), and every
    stage's counts (see `_check_stage_counts`)."""
    field, C = "class_incremental", section.num_classes
    if s * C > MAX_CLASS_TABLE_CELLS:
        check.fail(
            f"{field}.num_classes",
            f"expected stages * num_classes <= "
            f"{MAX_CLASS_TABLE_CELLS} (here {s} stages), found integer {C}",
        )
    check.length(section.task_classes, f"{field}.task_classes", T)
    owner = np.full(C, T, dtype=np.int64)  # the task of each class id (T: none)
    for j, classes in enumerate(section.task_classes):
        at = f"{field}.task_classes[{j}]"
        if not classes:
            check.fail(at, "expected a non-empty array of class ids, found array of 0 items")
        for k, c in enumerate(classes):
            if c >= C or owner[c] < T:
                check.fail(
                    f"{at}[{k}]",
                    f"expected a class id below {C} of no other task, found integer {c}",
                )
            owner[c] = j
    for key, n in (("test_samples", C), ("class_order", C), ("class_forgetting", C)):
        check.length(getattr(section, key), f"{field}.{key}", n)
    beyond = [k for k, c in enumerate(section.class_order) if c >= C]
    if beyond:
        k = beyond[0]
        check.fail(
            f"{field}.class_order[{k}]",
            f"expected a class id below {C}, found integer {section.class_order[k]}",
        )
    check.rows(section.per_class_accuracy, f"{field}.per_class_accuracy", s, C)
    for key in (
        "new_accuracy",
        "mean_class_accuracy",
        "amca_per_stage",
        "mean_class_forgetting_per_stage",
    ):
        check.length(getattr(section, key), f"{field}.{key}", s)
    for key in ("seen_accuracy", "old_accuracy", "recency_bias"):
        check.table(getattr(section, key), f"{field}.{key}", s)
    samples = np.array(section.test_samples, dtype=np.int64)
    if int(samples.sum()) > _MAX_EXACT_INT:
        check.fail(f"{field}.test_samples", f"expected at most {_MAX_EXACT_INT} samples in all")
    check.length(section.confusion.stages, f"{field}.confusion.stages", s)
    stored = 0
    for i, text in enumerate(section.confusion.stages):
        at = f"{field}.confusion.stages[{i}]"
        stored += _check_stage_counts(check, at, text, i, owner, samples)
        if stored > MAX_CONFUSION_CELLS:
            check.fail(
                at,
                f"expected at most {MAX_CONFUSION_CELLS} nonzero confusion cells in all "
                f"stages, found {stored} up to this stage",
            )


def _check_stage_counts(
    check: _Check, field: str, text: str, stage: int, owner: np.ndarray, samples: np.ndarray
) -> int:
    """One stage's counts: class ids below ``C``, a true class of a task ``<= stage``, counts
    ``>= 1``, each cell once, and every seen class's counts adding up to its test samples (an
    empty string: a stage without counts); returns its number of cells."""
    C = len(owner)
    try:
        cells = confusion_cells(text)
    except ValueError as err:
        check.fail(field, f"{err}, found {describe(text)}")
    if not len(cells):
        return 0
    true, pred, count = cells[:, 0], cells[:, 1], cells[:, 2]
    bad = (true >= C) | (pred >= C) | (count < 1) | (count > _MAX_EXACT_INT)
    bad |= owner[np.minimum(true, C - 1)] > stage
    flat = true * C + pred
    first = np.unique(flat, return_index=True)[1]
    repeated = np.ones(len(flat), dtype=bool)
    repeated[first] = False
    for n in np.flatnonzero(bad | repeated)[:1]:
        cell = ":".join(map(str, cells[n]))
        check.fail(
            f"{field} cell {n}",
            f"expected class ids below {C} (the true one of a task "
            f"<= {stage}), a count in [1, 2**53], each cell once, found {describe(cell)}",
        )
    totals = np.zeros(C, dtype=np.int64)
    np.add.at(totals, true, count)
    seen = owner <= stage
    wrong = np.flatnonzero(seen & (totals != samples))
    if len(wrong):
        c = int(wrong[0])
        check.fail(
            field,
            f"expected the counts of class {c} to add up to its "
            f"{int(samples[c])} test samples (test_samples[{c}]), found {int(totals[c])}",
        )
    return len(cells)


# ---------------------------------------------------------------------- online
def online_score_names(protocol: OnlineProtocol) -> list[str]:
    """The scores of an online section, in protocol order: ``online``, then
    ``near_future/<delay>`` and ``label_delay/<delay>`` per delay."""
    return (
        ["online"]
        + [f"near_future/{d}" for d in protocol.near_future_delays]
        + [f"label_delay/{d}" for d in protocol.label_delays]
    )


def check_online_section(
    section: OnlineSection, source: str | os.PathLike[str], field: str = "online"
) -> OnlineSection:
    """What the types of an ``online`` section cannot say (windows numbered and contiguous in
    batches and stream positions, every window holding the protocol's scores with counts that
    fit their totals, held-out evaluations with one cell per set in stream order); returns
    ``section``, raises ``InvalidResultsError`` naming ``source`` and the field under
    ``field``."""
    _check_online(_Check(source), section, field)
    return section


def _check_online(check: _Check, section: OnlineSection, field: str) -> None:
    protocol = section.protocol
    for key in ("near_future_delays", "label_delays"):
        delays = getattr(protocol, key)
        if delays != sorted(set(delays)):
            check.fail(
                f"{field}.protocol.{key}",
                f"expected increasing delays, each once, found {list(delays)}",
            )
    names = online_score_names(protocol)
    previous: OnlineWindow | None = None
    for k, window in enumerate(section.windows):
        at = f"{field}.windows[{k}]"
        if window.index != k:
            check.fail(
                f"{at}.index",
                f"expected integer {k} (windows are numbered 0, 1, ...), found integer "
                f"{window.index}",
            )
        if window.last_batch < window.first_batch:
            check.fail(
                f"{at}.last_batch",
                f"expected at least first_batch ({window.first_batch}), found integer "
                f"{window.last_batch}",
            )
        if window.stream_end < window.stream_start:
            check.fail(
                f"{at}.stream_end",
                f"expected at least stream_start ({window.stream_start}), found integer "
                f"{window.stream_end}",
            )
        if previous is not None:
            if window.first_batch != previous.last_batch + 1:
                check.fail(
                    f"{at}.first_batch",
                    f"expected integer {previous.last_batch + 1} (the window continues window "
                    f"{k - 1}), found integer {window.first_batch}",
                )
            if window.stream_start != previous.stream_end:
                check.fail(
                    f"{at}.stream_start",
                    f"expected integer {previous.stream_end} (the window continues window "
                    f"{k - 1}), found integer {window.stream_start}",
                )
        if sorted(window.scores) != sorted(names):
            check.fail(
                f"{at}.scores",
                f"expected the scores {names} of the protocol, found {sorted(window.scores)}",
            )
        for name, counts in window.scores.items():
            where = key_path(f"{at}.scores", name)
            if counts.correct > counts.total:
                check.fail(
                    f"{where}.correct",
                    f"expected at most total ({counts.total}), found integer {counts.correct}",
                )
            if sorted(counts.blind) != sorted(BLIND_PREDICTORS):
                check.fail(
                    f"{where}.blind",
                    f"expected the blind predictors {list(BLIND_PREDICTORS)}, found "
                    f"{sorted(counts.blind)}",
                )
            for blind, value in counts.blind.items():
                if value > counts.total:
                    check.fail(
                        key_path(f"{where}.blind", blind),
                        f"expected at most total ({counts.total}), found integer {value}",
                    )
        previous = window
    if section.held_out is not None:
        _check_held_out(check, section.held_out, f"{field}.held_out")


def _check_held_out(check: _Check, held: HeldOut, field: str) -> None:
    J = len(held.names)
    if len(set(held.names)) != J:
        check.fail(f"{field}.names", "expected distinct names")
    starts = held.segment_starts
    if starts is not None:
        check.length(starts, f"{field}.segment_starts", J)
        if starts[:1] != [0] or any(b <= a for a, b in itertools.pairwise(starts)):
            check.fail(
                f"{field}.segment_starts",
                f"expected increasing stream positions starting at 0, found {starts}",
            )
    last = -1
    for e, evaluation in enumerate(held.evaluations):
        at = f"{field}.evaluations[{e}]"
        check.length(evaluation.scores, f"{at}.scores", J)
        check.within(evaluation.scores, f"{at}.scores", [0.0, 1.0], "an accuracy")
        if evaluation.stream_position < last:
            check.fail(
                f"{at}.stream_position",
                f"expected at least {last} (the evaluations are in stream order), found integer "
                f"{evaluation.stream_position}",
            )
        late = [i for i in evaluation.segments_ended if i >= J]
        if late:
            check.fail(
                f"{at}.segments_ended",
                f"expected segment indices below {J} (one per held-out set), found integer "
                f"{late[0]}",
            )
        last = evaluation.stream_position

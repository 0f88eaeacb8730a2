"""The record of a run, in memory and on disk: [`ContinualResults`][continual_eval.ContinualResults]
and the files of a run directory.

* `model`: [`ContinualResults`][continual_eval.ContinualResults] and every section it holds
  ([`MatrixResults`][continual_eval.results.MatrixResults],
  [`StepEvaluations`][continual_eval.results.StepEvaluations],
  [`Stability`][continual_eval.results.Stability],
  [`Plasticity`][continual_eval.results.Plasticity], [`RunCost`][continual_eval.results.RunCost],
  [`ReferenceMetrics`][continual_eval.results.ReferenceMetrics],
  [`Coverage`][continual_eval.results.Coverage]);
  [`ScoreMatrix`][continual_eval.results.ScoreMatrix] and
  [`ReferenceScores`][continual_eval.results.ReferenceScores] are what
  [`ContinualResults.from_tensors`][continual_eval.results.ContinualResults.from_tensors] takes.
* `class_incremental`: [`ClassIncrementalResults`][continual_eval.results.ClassIncrementalResults].
* `held_out`: [`HeldOutResults`][continual_eval.results.HeldOutResults].
* `intervals`: the ``intervals`` and ``items`` sections of a run with per-item records
  ([`IntervalResults`][continual_eval.results.intervals.IntervalResults],
  [`ItemResults`][continual_eval.results.intervals.ItemResults]; not in ``__all__``: reached
  as ``ContinualResults.intervals`` and ``.items``).
* `online`: [`OnlineResults`][continual_eval.results.OnlineResults], the ``online`` section
  (what [`OnlineEvalCallback`][continual_eval.online.OnlineEvalCallback] records over a stream).
* `reference`: [`Reference`][continual_eval.Reference] and `ReferenceCurve`, what
  [`train_reference`][continual_eval.train_reference] measured, and what ``reference=`` accepts.
* `files`: the run directory (choosing and claiming it, writing the
  files atomically with their commit record, reading them back;
  [`check_results_files`][continual_eval.results.check_results_files]).
* `schema`: what ``results.json`` holds, defined once, and the
  validation of a file from elsewhere
  ([`InvalidResultsError`][continual_eval.results.InvalidResultsError] names the file and field).

``ContinualResults.load(run_dir)`` reads a run back; ``results.write(run_dir)`` writes one.
"""

from continual_eval.results.class_incremental import ClassIncrementalResults
from continual_eval.results.files import check_results_files
from continual_eval.results.held_out import HeldOutResults
from continual_eval.results.model import (
    ContinualResults,
    Coverage,
    MatrixResults,
    Plasticity,
    ReferenceMetrics,
    ReferenceScores,
    RunCost,
    ScoreMatrix,
    Stability,
    StepEvaluations,
)
from continual_eval.results.online import OnlineResults
from continual_eval.results.reference import Reference, ReferenceCurve
from continual_eval.results.schema import InvalidResultsError

# the promised API (docs/compatibility.md): other names here are importable, not promised
__all__ = [
    "ClassIncrementalResults",
    "ContinualResults",
    "Coverage",
    "HeldOutResults",
    "InvalidResultsError",
    "MatrixResults",
    "OnlineResults",
    "Plasticity",
    "ReferenceMetrics",
    "ReferenceScores",
    "RunCost",
    "ScoreMatrix",
    "Stability",
    "StepEvaluations",
    "check_results_files",
]

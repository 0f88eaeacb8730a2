"""The record of a run, in memory and on disk: :class:`ContinualResults` and the files of a run
directory.

* :mod:`~continual_eval.results.model`: :class:`ContinualResults` and every section it holds
  (:class:`MatrixResults`, :class:`StepEvaluations`, :class:`Stability`, :class:`Plasticity`,
  :class:`RunCost`, :class:`ReferenceMetrics`); :class:`ScoreMatrix` and
  :class:`ReferenceScores` are what :meth:`ContinualResults.from_tensors` takes.
* :mod:`~continual_eval.results.class_incremental`: :class:`ClassIncrementalResults`.
* :mod:`~continual_eval.results.online`: :class:`OnlineResults`, the ``online`` section
  (what :class:`~continual_eval.online.OnlineEvalCallback` records over a stream).
* :mod:`~continual_eval.results.reference`: :class:`Reference` and :class:`ReferenceCurve`, what
  :func:`~continual_eval.train_reference` measured, and what ``reference=`` accepts.
* :mod:`~continual_eval.results.files`: the run directory (choosing and claiming it, writing the
  files atomically with their commit record, reading them back; :func:`check_results_files`).
* :mod:`~continual_eval.results.schema`: what ``results.json`` holds, defined once, and the
  validation of a file from elsewhere (:class:`InvalidResultsError` names the file and field).

``ContinualResults.load(run_dir)`` reads a run back; ``results.write(run_dir)`` writes one.
"""

from continual_eval.results.class_incremental import ClassIncrementalResults
from continual_eval.results.files import check_results_files
from continual_eval.results.model import (
    ContinualResults,
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

__all__ = [
    "ClassIncrementalResults",
    "ContinualResults",
    "InvalidResultsError",
    "MatrixResults",
    "OnlineResults",
    "Plasticity",
    "Reference",
    "ReferenceCurve",
    "ReferenceMetrics",
    "ReferenceScores",
    "RunCost",
    "ScoreMatrix",
    "Stability",
    "StepEvaluations",
    "check_results_files",
]

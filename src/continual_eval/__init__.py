"""continual-eval: continual-learning evaluation for PyTorch Lightning and torchmetrics.

The public names are imported on first use (PEP 562), so ``import continual_eval`` and the
``continual-eval`` command do not pay for torch and Lightning until a name needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "ContinualEvalCallback": "continual_eval.callback",
    "fit_tasks": "continual_eval.training",
    "scheduled_task": "continual_eval.training",
    "StepEvaluation": "continual_eval.options",
    "continual_metrics": "continual_eval.functional",
    "continual_metrics_curve": "continual_eval.functional",
    "ContinualMetrics": "continual_eval.metric",
    "ContinualResults": "continual_eval.results",
    "MatrixResults": "continual_eval.results",
    "plot_accuracy_curves": "continual_eval.plotting",
    "plot_accuracy_matrix": "continual_eval.plotting",
    "plot_task_trajectories": "continual_eval.plotting",
    "load_results": "continual_eval.results",
    "ClassIncrementalResults": "continual_eval.class_incremental_results",
    "TaskAgnosticAccuracyScorer": "continual_eval.evaluation.class_incremental",
    "TaskAwareAccuracyScorer": "continual_eval.evaluation.class_incremental",
    "task_classes_from_loaders": "continual_eval.evaluation.class_incremental",
    "plot_confusion_matrix": "continual_eval.plotting",
    "results_to_curves": "continual_eval.results",
    "Reference": "continual_eval.references",
    "train_reference": "continual_eval.references",
}

__all__ = [
    "ClassIncrementalResults",
    "ContinualEvalCallback",
    "ContinualMetrics",
    "ContinualResults",
    "MatrixResults",
    "Reference",
    "StepEvaluation",
    "TaskAgnosticAccuracyScorer",
    "TaskAwareAccuracyScorer",
    "__version__",
    "continual_metrics",
    "continual_metrics_curve",
    "fit_tasks",
    "load_results",
    "plot_accuracy_curves",
    "plot_accuracy_matrix",
    "plot_confusion_matrix",
    "plot_task_trajectories",
    "results_to_curves",
    "scheduled_task",
    "task_classes_from_loaders",
    "train_reference",
]

if TYPE_CHECKING:  # pragma: no cover
    from continual_eval.callback import ContinualEvalCallback
    from continual_eval.class_incremental_results import ClassIncrementalResults
    from continual_eval.evaluation.class_incremental import (
        TaskAgnosticAccuracyScorer,
        TaskAwareAccuracyScorer,
        task_classes_from_loaders,
    )
    from continual_eval.functional import continual_metrics, continual_metrics_curve
    from continual_eval.metric import ContinualMetrics
    from continual_eval.options import StepEvaluation
    from continual_eval.plotting import (
        plot_accuracy_curves,
        plot_accuracy_matrix,
        plot_confusion_matrix,
        plot_task_trajectories,
    )
    from continual_eval.references import Reference, train_reference
    from continual_eval.results import (
        ContinualResults,
        MatrixResults,
        load_results,
        results_to_curves,
    )
    from continual_eval.training import fit_tasks, scheduled_task


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'continual_eval' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

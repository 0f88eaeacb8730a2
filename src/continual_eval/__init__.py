"""continual-eval: continual-learning evaluation for PyTorch Lightning and torchmetrics.

The names below are the package's promise (with those of its public subpackages
:mod:`continual_eval.evaluation`, :mod:`continual_eval.functional`,
:mod:`continual_eval.results` and :mod:`continual_eval.stream`); anything else may change
between releases (see docs/architecture.md, "What is public"). They are imported on first use
(PEP 562), so ``import continual_eval`` and the ``continual-eval`` command do not pay for torch
and Lightning until a name needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "ContinualEvalCallback": "continual_eval.callback",
    "StepEvaluation": "continual_eval.options",
    "fit_tasks": "continual_eval.training",
    "scheduled_task": "continual_eval.training",
    "ContinualMetrics": "continual_eval.metric",
    "ContinualResults": "continual_eval.results",
    "continual_metrics": "continual_eval.functional",
    "Reference": "continual_eval.results",
    "train_reference": "continual_eval.references",
    "task_classes_from_loaders": "continual_eval.evaluation.class_incremental",
    "plot_accuracy_curves": "continual_eval.plotting",
    "plot_accuracy_matrix": "continual_eval.plotting",
    "plot_confusion_matrix": "continual_eval.plotting",
    "plot_task_trajectories": "continual_eval.plotting",
}

__all__ = [
    "ContinualEvalCallback",
    "ContinualMetrics",
    "ContinualResults",
    "Reference",
    "StepEvaluation",
    "__version__",
    "continual_metrics",
    "fit_tasks",
    "plot_accuracy_curves",
    "plot_accuracy_matrix",
    "plot_confusion_matrix",
    "plot_task_trajectories",
    "scheduled_task",
    "task_classes_from_loaders",
    "train_reference",
]

if TYPE_CHECKING:  # pragma: no cover
    from continual_eval.callback import ContinualEvalCallback
    from continual_eval.evaluation.class_incremental import task_classes_from_loaders
    from continual_eval.functional import continual_metrics
    from continual_eval.metric import ContinualMetrics
    from continual_eval.options import StepEvaluation
    from continual_eval.plotting import (
        plot_accuracy_curves,
        plot_accuracy_matrix,
        plot_confusion_matrix,
        plot_task_trajectories,
    )
    from continual_eval.references import train_reference
    from continual_eval.results import ContinualResults
    from continual_eval.results.reference import Reference
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

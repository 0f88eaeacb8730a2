"""continual-eval: continual-learning evaluation for PyTorch Lightning and torchmetrics."""

from continual_eval.callback import ContinualEvalCallback, fit_tasks, scheduled_task
from continual_eval.functional import continual_metrics, continual_metrics_curve
from continual_eval.metric import ContinualMetrics
from continual_eval.plotting import (
    plot_accuracy_curves,
    plot_accuracy_matrix,
    plot_task_trajectories,
)
from continual_eval.results import load_results, results_to_curves

__version__ = "0.1.0"

__all__ = [
    "ContinualEvalCallback",
    "ContinualMetrics",
    "__version__",
    "continual_metrics",
    "continual_metrics_curve",
    "fit_tasks",
    "load_results",
    "plot_accuracy_curves",
    "plot_accuracy_matrix",
    "plot_task_trajectories",
    "results_to_curves",
    "scheduled_task",
]

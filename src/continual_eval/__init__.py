"""continual-eval: continual-learning evaluation for PyTorch Lightning and torchmetrics."""

from continual_eval.callback import ContinualEvalCallback, fit_tasks, scheduled_task
from continual_eval.functional import continual_metrics, continual_metrics_curve
from continual_eval.metric import ContinualMetrics
from continual_eval.results import load_results

__version__ = "0.1.0"

__all__ = [
    "ContinualEvalCallback",
    "ContinualMetrics",
    "__version__",
    "continual_metrics",
    "continual_metrics_curve",
    "fit_tasks",
    "load_results",
    "scheduled_task",
]

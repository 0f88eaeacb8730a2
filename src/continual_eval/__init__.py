"""continual-eval: continual-learning evaluation for PyTorch Lightning and torchmetrics."""

from continual_eval.functional import continual_metrics, continual_metrics_curve
from continual_eval.metric import ContinualMetrics

__version__ = "0.1.0"

__all__ = ["ContinualMetrics", "__version__", "continual_metrics", "continual_metrics_curve"]

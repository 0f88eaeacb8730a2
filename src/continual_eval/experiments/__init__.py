"""Runnable experiments: the seed's logistic stream, split digits (naive vs replay), and the
``continual-eval fit`` command that drives them from LightningCLI configs (see ``configs/``)."""

from continual_eval.experiments.digits import DigitsMLP, SplitDigits
from continual_eval.experiments.logistic import CircleGridTasks, LogisticClassifier
from continual_eval.experiments.replay import ReservoirBuffer
from continual_eval.experiments.stream import (
    TaskStreamDataModule,
    fit_stream,
    stream_reference,
)

__all__ = [
    "CircleGridTasks",
    "DigitsMLP",
    "LogisticClassifier",
    "ReservoirBuffer",
    "SplitDigits",
    "TaskStreamDataModule",
    "fit_stream",
    "stream_reference",
]

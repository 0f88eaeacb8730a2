"""Reward-stream metrics for continual reinforcement learning.

Score a policy around change: per-configuration reward, adaptation speed, recovery time,
forgetting, stability, performance gap and nine further rows, per regime label, with the absence
rule (an unavailable metric is ``None``; tables print ``--``) and aggregation across traces,
configurations and seeds. See docs/stream.md.
"""

from typing import Any

from continual_eval.stream.aggregate import aggregate_seeds, relative_adaptation_advantage
from continual_eval.stream.intervals import Intervals, configuration_intervals
from continual_eval.stream.metrics import (
    METRIC_NAMES,
    adaptation_speed,
    compute_all_metrics,
    effective_rank,
    forgetting,
    interval_variance,
    pooled_variance,
    recovery_time,
    tail_means,
)
from continual_eval.stream.rewards import (
    RewardComponent,
    RewardSpec,
    UpperBound,
    analytic_upper_bound,
    data_relative_upper_bound,
    numeric_upper_bound,
    read_ceiling_file,
)
from continual_eval.stream.table import format_markdown, format_seed_table, format_table
from continual_eval.stream.trace import (
    EpisodeStep,
    EpisodeTrace,
    StepRecord,
    read_jsonl,
    write_jsonl,
)

#: what the reward-stream package promises (what docs/stream.md documents)
# the promised API (docs/compatibility.md): other names here are importable, not promised
__all__ = [
    "EpisodeStep",
    "EpisodeTrace",
    "RewardComponent",
    "RewardSpec",
    "RewardStreamCallback",
    "aggregate_seeds",
    "analytic_upper_bound",
    "compute_all_metrics",
    "read_jsonl",
    "record",
    "write_jsonl",
]


def __getattr__(name: str) -> Any:
    # the Lightning callback is imported on first use: the metrics and the CLI need no Lightning
    if name in ("RewardStreamCallback", "record"):
        from continual_eval.stream import callback

        return getattr(callback, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

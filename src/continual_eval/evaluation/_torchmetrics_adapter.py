"""The torchmetrics internals that `MetricScorer` relies on.

Why: torchmetrics has no public API for what an exact cross-rank reduction needs to know of a
metric: its declared states with their defaults (``Metric._defaults``) and their cross-rank
reductions (``Metric._reductions``), whether its class keeps the default state sync (an override
of ``sync`` or ``_sync_dist``), the unwrapped ``compute`` (each instance wraps its class's
``compute`` with a sync and a cache), and which kernel a stat-scores metric updates with
(``MulticlassStatScores._update_state``). `MetricScorer` needs them to sum sum-reduced
states in the evaluation's own collective, to gather every other state itself (so that a rank
holding no sample of a task takes part in exactly the collectives the others run: torchmetrics'
own sync sends such a rank's empty list state as a 1-D tensor of another shape and dtype, which
gloo refuses with "Received data size doesn't match"), and to know which updates may be fed
concatenated batches. Every such access sits here, nowhere else.

Checked on torchmetrics `CHECKED_VERSIONS` (the floor in ``.ci/lowest.txt`` and the newest
installed); ``tests/callback/test_torchmetrics_adapter.py`` pins them and checks each assumption
against the installed version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: the torchmetrics versions every function here was checked against
CHECKED_VERSIONS = ("1.4.0.post0", "1.9.0")

__all__ = [
    "CHECKED_VERSIONS",
    "default_sync",
    "is_cat_reduction",
    "is_sum_reduction",
    "metrics_in",
    "own_update_state",
    "state_defaults",
    "state_reductions",
    "sync_disabled",
    "unwrapped_compute",
]


def state_defaults(metric: Any) -> dict[str, Any]:
    """State name -> its declared default (a tensor or ``[]``), in ``add_state`` order; ``{}``
    when the object declares none."""
    defaults = getattr(metric, "_defaults", None)
    return dict(defaults) if isinstance(defaults, dict) else {}


def state_reductions(metric: Any) -> dict[str, Callable[..., Any] | None]:
    """State name -> the function torchmetrics' sync reduces the gathered states with
    (``dist_reduce_fx``: ``dim_zero_sum`` for ``"sum"``, ``dim_zero_cat`` for ``"cat"``, ...,
    a callable of the user's, or ``None``), in ``add_state`` order."""
    reductions = getattr(metric, "_reductions", None)
    return dict(reductions) if isinstance(reductions, dict) else {}


def is_sum_reduction(fn: Any) -> bool:
    """Whether ``fn`` is torchmetrics' ``dist_reduce_fx="sum"``."""
    from torchmetrics.utilities.data import dim_zero_sum

    return fn is dim_zero_sum


def is_cat_reduction(fn: Any) -> bool:
    """Whether ``fn`` is torchmetrics' ``dist_reduce_fx="cat"``."""
    from torchmetrics.utilities.data import dim_zero_cat

    return fn is dim_zero_cat


def default_sync(metric: Any) -> bool:
    """Whether ``metric``'s class syncs its states the default way: neither ``sync`` nor
    ``_sync_dist`` overridden, except by a class whose states are all its children's
    (``CompositionalMetric``, whose ``_sync_dist`` does nothing)."""
    from torchmetrics import Metric
    from torchmetrics.metric import CompositionalMetric

    cls = type(metric)
    if getattr(cls, "sync", None) is not Metric.sync:
        return False
    sync_dist = getattr(cls, "_sync_dist", None)
    return sync_dist is Metric._sync_dist or sync_dist is CompositionalMetric._sync_dist


def metrics_in(metric: Any) -> list[Any]:
    """``metric`` and every torchmetrics metric inside it (wrappers, compositions), in
    ``modules()`` order: the same order on every rank."""
    from torchmetrics import Metric

    return [m for m in metric.modules() if isinstance(m, Metric)]


def unwrapped_compute(metric: Any) -> Any:
    """``metric``'s class ``compute`` on its current states: no sync, no cache (the instance's
    ``compute`` is its class's wrapped in both)."""
    return type(metric).compute(metric)


@contextmanager
def sync_disabled(metric: Any) -> Iterator[None]:
    """Within the block, ``metric.compute()`` (and every metric inside it) does not sync: each
    metric's ``distributed_available_fn`` (public; torchmetrics' sync asks it whether to run)
    answers ``False``. Used once the states hold every rank's already."""
    members = metrics_in(metric)
    saved = [m.distributed_available_fn for m in members]
    try:
        for m in members:
            m.distributed_available_fn = _not_distributed
        yield
    finally:
        for m, fn in zip(members, saved, strict=True):
            m.distributed_available_fn = fn


def _not_distributed() -> bool:
    return False


def own_update_state(metric: Any, base: type) -> bool:
    """Whether ``metric`` updates through ``base``'s own ``update`` and ``_update_state`` (its
    class overrides neither)."""
    cls = type(metric)
    return cls.update is base.update and getattr(cls, "_update_state", None) is getattr(
        base, "_update_state", None
    )

"""Our warnings, each kind shown once per run.

A run of several tasks (``fit_tasks``, one fit per task, a schedule) meets most conditions we
warn about at every stage (no figure library, an FSDP1 model's parameter counts, a stage
without a training step, a class-incremental section's note); `warn_once` shows the
first of each kind in a run (a run: its ``run_id``, a new one after
[`reset`][continual_eval.callback.ContinualEvalCallback.reset]) and drops the repeats, whatever the
warnings filters say (a notebook or pytest shows every repeat otherwise).
"""

from __future__ import annotations

import warnings

__all__ = ["ONCE_PER_RUN", "warn_once"]

#: what the first warning of a kind says about its repeats
ONCE_PER_RUN = " (warned once per run)"

#: (run id, kind) of every warning shown in this process
_SHOWN: set[tuple[str, str]] = set()


def warn_once(run_id: str | None, kind: str, message: str, *, stacklevel: int = 2) -> bool:
    """``warnings.warn(message)`` (a ``UserWarning``, ``stacklevel`` counted from the caller)
    unless a warning of ``kind`` was already shown for the run ``run_id``; returns whether it
    was shown."""
    key = (run_id or "", kind)
    if key in _SHOWN:
        return False
    _SHOWN.add(key)
    warnings.warn(message + ONCE_PER_RUN, stacklevel=stacklevel + 1)
    return True

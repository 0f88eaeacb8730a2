"""The end of a run with fewer tasks trained than test loaders.

``fit_tasks`` over fewer training loaders than the callback has test loaders, or one fit over a
schedule of fewer stages than tasks, ends a run whose metrics read only the first ``k x k``
block of R. `end_run` records that in the results (their ``coverage`` section, see
[`Coverage`][continual_eval.results.Coverage]), rewrites the files and, with ``verbose``, prints one
line saying so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning.pytorch.utilities import rank_zero_info

if TYPE_CHECKING:  # pragma: no cover
    from lightning.pytorch import Trainer

    from continual_eval.callback import ContinualEvalCallback
    from continual_eval.results import Coverage

__all__ = ["end_run"]


def end_run(callback: ContinualEvalCallback, trainer: Trainer) -> Coverage | None:
    """No stage will be trained after the ones ``callback`` recorded: with fewer stages than
    tasks, record what the metrics cover, rewrite the results files (rank 0) and print the line
    (``verbose``); returns that coverage (``None``: every task trained, or none)."""
    record = callback.record
    if record is None:
        return None
    coverage = record.end_run()
    if coverage is None:
        return None
    if trainer.is_global_zero:  # the callback's own write (results files, spawn hand-over)
        callback._write(trainer)
        callback._directory.wait()  # outside any fit: on disk before the caller reads it
        if callback.verbose:
            rank_zero_info(coverage.line())
    return coverage

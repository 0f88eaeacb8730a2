"""Lightning's console messages that mislead in a task sequence, and a way to silence them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

__all__ = ["LIGHTNING_INFO_LOGGER", "without_cumulative_epoch_message"]

#: the logger of Lightning's rank-zero info messages
LIGHTNING_INFO_LOGGER = "lightning.pytorch.utilities.rank_zero"


class _CumulativeEpochFilter(logging.Filter):
    """Drops Lightning's "`Trainer.fit` stopped: `max_epochs=N` reached." record."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("`Trainer.fit` stopped: `max_epochs=")


@contextlib.contextmanager
def without_cumulative_epoch_message() -> Iterator[None]:
    """Silence Lightning's "`Trainer.fit` stopped: `max_epochs=N` reached." while in the block.

    Every stage of a stream is one ``fit`` on the same Trainer, so ``max_epochs`` counts the
    epochs of every stage so far (72 after the second of 36-epoch stages); the task drivers print
    the stage's own count instead. Other Lightning messages are untouched.
    """
    log = logging.getLogger(LIGHTNING_INFO_LOGGER)
    drop = _CumulativeEpochFilter()
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)

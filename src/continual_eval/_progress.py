"""The progress of the callback's evaluations, shown through the Trainer's progress bar.

With a `TQDMProgressBar` or
`RichProgressBar` enabled, every evaluation gets a bar of its
own (``Continual eval (after stage 1)``), total = the batches of every task it scores, advanced
per batch by the evaluation loop
([`EvaluationProgress`][continual_eval.evaluation.EvaluationProgress]) and gone when the evaluation
ends, as Lightning's validation bar is. Nothing is shown without a progress bar
(``Trainer(enable_progress_bar=False)``), with another kind of progress bar, on a rank other than 0,
or for a callback with ``verbose=False``.

`_RichBar` is the one adapter to Lightning's private names: a `RichProgressBar` has no public
way to add a task to its live display, so it calls the methods its own bars use
(``_init_progress``, ``_add_task``, ``_progress_stopped``) and moves the task through rich's
public ``Progress.update``; checked on the lowest and newest Lightning of CI
(tests/callback/test_evaluation_progress.py runs in both passes).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

if TYPE_CHECKING:  # pragma: no cover
    from lightning.pytorch import Trainer

    from continual_eval.evaluation import EvaluationProgress

__all__ = ["evaluation_description", "evaluation_progress"]

#: what every bar of ours starts with
PREFIX = "Continual eval"


def evaluation_description(stage: int, *, stage_end: bool = False) -> str:
    """The bar's description: the baseline (``stage == -1``), the end of ``stage`` or an
    evaluation inside it."""
    if stage < 0:
        return f"{PREFIX} (baseline)"
    return f"{PREFIX} ({'after' if stage_end else 'during'} stage {stage})"


class _TqdmBar:
    """One evaluation on a `TQDMProgressBar`: a bar from its ``init_validation_tqdm``
    (the position and style of Lightning's validation bar), refreshed at its refresh rate."""

    def __init__(self, callback: TQDMProgressBar, description: str) -> None:
        self.callback, self.description = callback, description
        self.bar: Any = None
        self.done = 0
        self.total: int | None = None

    def start(self, total: int | None) -> None:
        self.bar = self.callback.init_validation_tqdm()
        self.bar.set_description(self.description, refresh=False)
        self.bar.reset(total=total)
        self.total = total

    def advance(self) -> None:
        self.done += 1
        bar = self.bar
        if bar is not None and (
            self.done % self.callback.refresh_rate == 0 or self.done == self.total
        ):
            bar.n = self.done
            bar.refresh()

    def close(self) -> None:
        if self.bar is None:
            return
        if self.bar.n != self.done:
            self.bar.n = self.done
            self.bar.refresh()
        self.bar.close()


class _RichBar:
    """One evaluation on a `RichProgressBar`: a task of its live display (started here
    when the evaluation comes before Lightning's first bar), hidden when the evaluation ends."""

    def __init__(self, callback: RichProgressBar, trainer: Trainer, description: str) -> None:
        self.callback, self.trainer, self.description = callback, trainer, description
        self.task: Any = None
        self.done = 0

    def start(self, total: int | None) -> None:
        callback = self.callback
        if callback.progress is None or callback._progress_stopped:
            callback._init_progress(self.trainer)
        if callback.progress is None:
            return
        self.task = callback._add_task(math.inf if total is None else total, self.description)
        callback.refresh()

    def advance(self) -> None:
        self.done += 1
        progress = self.callback.progress
        if self.task is not None and progress is not None:
            # rich's own Progress API: Lightning's _update changed meaning between versions
            # (2.5: advance by refresh_rate, 2.6: set completed)
            progress.update(self.task, completed=self.done)
            if self.done % max(1, int(self.callback.refresh_rate)) == 0:
                self.callback.refresh()

    def close(self) -> None:
        progress = self.callback.progress
        if self.task is not None and progress is not None:
            progress.update(self.task, completed=self.done)
            progress.refresh()  # drawn once complete
            progress.update(self.task, visible=False)


@contextlib.contextmanager
def evaluation_progress(
    trainer: Trainer, description: str, *, enabled: bool = True
) -> Iterator[EvaluationProgress | None]:
    """The progress hook of one evaluation under ``trainer`` (closed when it ends): a bar of
    the Trainer's enabled TQDM or Rich progress bar on global rank 0, else ``None`` (also when
    not ``enabled``)."""
    bar: _TqdmBar | _RichBar | None = None
    callback = trainer.progress_bar_callback if enabled and trainer.is_global_zero else None
    if isinstance(callback, TQDMProgressBar) and callback.is_enabled:
        bar = _TqdmBar(callback, description)
    elif isinstance(callback, RichProgressBar) and callback.is_enabled:
        bar = _RichBar(callback, trainer, description)
    try:
        yield bar
    finally:
        if bar is not None:
            bar.close()

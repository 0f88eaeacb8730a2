"""Shared piece of the experiment tests: train a task stream quietly on the CPU."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl

from continual_eval import ContinualEvalCallback
from continual_eval.experiments.stream import TaskStreamDataModule, fit_stream


def fit_quietly(
    model: pl.LightningModule,
    data: TaskStreamDataModule,
    out: Path,
    *,
    epochs: int,
    reference: str = "none",
) -> tuple[pl.Trainer, ContinualEvalCallback]:
    """:func:`fit_stream` with ``epochs`` per task on a CPU Trainer without logger, checkpoints,
    progress bar or summary; results.json goes to ``out``; ``reference``: ``"none"``,
    ``"isolated"`` or ``"joint"``. Returns ``(trainer, callback)``."""
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    callback = fit_stream(
        trainer,
        model,
        data,
        callback_kwargs={"dirpath": out, "log_images": False, "verbose": False},
        reference=reference,
    )
    return trainer, callback

"""Send an online evaluation to every logger of a Trainer: scalars per window and per held-out
evaluation (``log_metrics`` at ``trainer.global_step``), the picture and a summary table at the end.

Keys (``{prefix}`` is the callback's ``prefix``, ``online/`` by default; ``{s}`` is ``""`` for the
online score, ``near_future/<d>/`` and ``label_delay/<d>/`` for the others):

* ``{prefix}{s}acc``: the window's accuracy; ``{prefix}{s}acc_cumulative``: over the stream so
  far; ``{prefix}blind_<b>/{s}acc``: blind predictor ``b``'s (``mode``, ``last``, ``prior``) on
  the same samples; each window accuracy (not the cumulative one) with ``.../lo`` and
  ``.../hi``, its 95% Wilson interval from the window's counts (independent trials assumed: it
  undercovers on an autocorrelated stream, see ``docs/online.md``);
* ``{prefix}samples_seen`` (stream position at the window's end), ``{prefix}cost/samples``,
  ``{prefix}cost/optimizer_steps``, ``{prefix}cost/train_seconds``, ``{prefix}cost/eval_seconds``,
  ``{prefix}cost/scoring_forwards`` (the window's);
* held-out: ``{prefix}held_out/<name>``, ``{prefix}held_out/seen``, ``.../past``,
  ``.../forgetting``, with ``{prefix}held_out/samples_seen``.

Loggers take only the finite values (an empty window is absent, not 0). Call on global rank 0.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger

from continual_eval.functional.intervals import wilson_interval
from continual_eval.functional.online import held_out_curves
from continual_eval.online.record import BLIND_PREDICTORS, OnlineResults

__all__ = ["format_summary", "held_out_scalars", "log_final", "log_scalars", "window_scalars"]


def _base(score: str) -> str:
    return "" if score == "online" else f"{score}/"


def window_scalars(results: OnlineResults, index: int, prefix: str) -> dict[str, float]:
    """The scalars of window ``index`` (see the module docstring)."""
    window = results.windows[index]
    out: dict[str, float] = {}
    for score in results.score_names():
        counts = window.scores[score]
        base = _base(score)
        if counts.total:
            keys = [
                f"{prefix}{base}acc",
                *(f"{prefix}blind_{b}/{base}acc" for b in BLIND_PREDICTORS),
            ]
            correct = torch.tensor([counts.correct, *(counts.blind[b] for b in BLIND_PREDICTORS)])
            low, high = wilson_interval(correct, torch.tensor(counts.total))
            for k, key in enumerate(keys):
                out[key] = int(correct[k]) / counts.total
                out[f"{key}/lo"], out[f"{key}/hi"] = float(low[k]), float(high[k])
        cumulative = results.accuracy(score)
        if cumulative is not None:
            out[f"{prefix}{base}acc_cumulative"] = cumulative
    cost = window.cost
    out[f"{prefix}samples_seen"] = float(window.stream_end)
    out[f"{prefix}cost/samples"] = float(cost.samples)
    out[f"{prefix}cost/optimizer_steps"] = float(cost.optimizer_steps)
    out[f"{prefix}cost/train_seconds"] = cost.train_seconds
    out[f"{prefix}cost/eval_seconds"] = cost.eval_seconds
    out[f"{prefix}cost/scoring_forwards"] = float(cost.scoring_forwards)
    return out


def held_out_scalars(results: OnlineResults, prefix: str) -> dict[str, float]:
    """The scalars of the last held-out evaluation."""
    held = results.held_out
    if held is None or not held.evaluations:
        return {}
    last = held.evaluations[-1]
    out = {
        f"{prefix}held_out/{name}": math.nan if v is None else v
        for name, v in zip(held.names, last.scores, strict=True)
    }
    A, _ = results.held_out_matrix()
    curves = held_out_curves(A, results.held_out_segments())
    for name in ("seen", "past", "forgetting"):
        out[f"{prefix}held_out/{name}"] = float(curves[name][-1])
    out[f"{prefix}held_out/samples_seen"] = float(last.stream_position)
    return {k: v for k, v in out.items() if math.isfinite(v)}


def log_scalars(loggers: Sequence[Logger], scalars: dict[str, float], step: int) -> None:
    """``log_metrics`` of the finite scalars on every logger."""
    finite = {k: v for k, v in scalars.items() if math.isfinite(v)}
    if not finite:
        return
    for logger in loggers:
        logger.log_metrics(finite, step=step)


def format_summary(results: OnlineResults, *, markdown: bool = False) -> str:
    """A table of every score: the learner's accuracy, each blind predictor's, the gap to the best
    blind one and the samples scored; then the cost."""
    summary = results.summary()

    def cell(value: float | None) -> str:
        return "--" if value is None else f"{value:.4f}"

    header = ["score", "learner", *[f"blind {b}" for b in BLIND_PREDICTORS], "gap", "samples"]
    rows = []
    for score, entry in summary["scores"].items():
        rows.append(
            [
                score,
                cell(entry["accuracy"]),
                *[cell(entry["blind"][b]) for b in BLIND_PREDICTORS],
                cell(entry["gap_to_best_blind"]),
                str(entry["samples"]),
            ]
        )
    cost = summary["cost"]
    tail = (
        f"{cost['stream_samples']} stream samples, {cost['optimizer_steps']} optimizer steps, "
        f"{cost['train_seconds']:.1f} s training, {cost['eval_seconds']:.1f} s held-out "
        f"evaluation, {cost['scoring_forwards']} scoring forward passes"
    )
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join([*lines, "", tail])
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)) for r in [header, *rows]
    ]
    return "\n".join([*lines, tail])


def log_final(
    loggers: Sequence[Logger], results: OnlineResults, step: int, prefix: str, figure: Any | None
) -> None:
    """The picture and the summary table to the loggers that show them, then ``save()``."""
    for logger in loggers:
        try:
            if isinstance(logger, TensorBoardLogger):
                if figure is not None:
                    logger.experiment.add_figure(f"{prefix}curves", figure, step, close=False)
                logger.experiment.add_text(
                    f"{prefix}summary", format_summary(results, markdown=True), step
                )
            elif isinstance(logger, WandbLogger) and figure is not None:
                import wandb
                from PIL import Image

                buf = io.BytesIO()
                figure.savefig(buf, format="png", dpi=100)
                image = wandb.Image(Image.open(io.BytesIO(buf.getvalue())))
                logger.experiment.log({f"{prefix}curves": image}, step=step)
            elif isinstance(logger, MLFlowLogger):
                if figure is not None:
                    logger.experiment.log_figure(logger.run_id, figure, "online.png")
                logger.experiment.log_dict(logger.run_id, results.to_dict(), "online.json")
        except ModuleNotFoundError as err:
            warnings.warn(
                f"OnlineEvalCallback: nothing logged to {type(logger).__name__} ({err})",
                stacklevel=2,
            )
        logger.save()

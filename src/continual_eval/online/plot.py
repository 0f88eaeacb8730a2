"""The picture of an online evaluation: the learner's online and near-future accuracy beside the
blind predictors' over the stream, and the held-out curves over the stream below them.

matplotlib is optional (``pip install continual-eval[plot]``); it is imported on first use, with
the Agg backend unless a display backend was chosen.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from continual_eval.functional.online import held_out_curves, windowed_accuracy
from continual_eval.online.record import OnlineResults

__all__ = ["ONLINE_PNG", "plot_online"]

#: the picture's file name in the results directory
ONLINE_PNG = "online.png"
#: curves are smoothed over about this many points at most
_POINTS = 60


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError as err:  # pragma: no cover - exercised only without the extra
        raise ModuleNotFoundError(
            "the online picture needs matplotlib: pip install 'continual-eval[plot]'"
        ) from err
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(score: str) -> str:
    if score == "online":
        return "online (prequential)"
    kind, delay = score.split("/")
    return f"near-future, delay {delay}" if kind == "near_future" else f"label delay {delay}"


def plot_online(results: OnlineResults, path: str | Path | None = None) -> Any:
    """A matplotlib figure of ``results`` (saved to ``path`` when given).

    Top: per score, the learner's accuracy (solid) and the best blind predictor's on that score
    (dashed, same colour; the legend names it) over the stream, each a sample-weighted moving
    average over ``ceil(windows / 60)`` windows, against the stream position at the window's end.
    Bottom (with held-out sets): the held-out accuracy on the seen segments (anytime accuracy),
    on the left ones (retention) and the forgetting, with the segment starts as vertical lines.
    """
    plt = _pyplot()
    held = results.held_out is not None and bool(results.held_out.evaluations)
    fig, axes = plt.subplots(
        2 if held else 1, 1, figsize=(12, 7.5 if held else 4.5), squeeze=False, sharex=True
    )
    ax = axes[0, 0]
    positions = results.stream_positions().numpy()
    smooth = max(1, -(-len(results.windows) // _POINTS))
    summary = results.summary()["scores"]
    names = {"mode": "recent mode", "last": "last label", "prior": "most frequent so far"}
    for k, score in enumerate(results.score_names()):
        color = f"C{k}"
        correct, total = results.counts(score)
        if not int(total.sum()):
            continue
        entry = summary[score]
        learner = windowed_accuracy(correct, total, smooth).numpy()
        # the blind predictor that does best on this score over the whole stream
        blinds = {b: v for b, v in entry["blind"].items() if v is not None}
        best = max(blinds, key=lambda b: blinds[b])
        blind, _ = results.counts(score, best)
        blind_curve = windowed_accuracy(blind, total, smooth).numpy()
        ax.plot(
            positions,
            learner,
            color=color,
            lw=1.8,
            label=f"{_label(score)}: {entry['accuracy']:.3f}",
        )
        ax.plot(
            positions,
            blind_curve,
            color=color,
            lw=1.2,
            ls="--",
            label=f"  blind ({names[best]}): {blinds[best]:.3f}",
        )
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("accuracy per window")
    window = results.protocol.window_batches
    ax.set_title(
        f"Online accuracy over the stream ({window} batches per window"
        + (f", moving average of {smooth} windows" if smooth > 1 else "")
        + ")"
    )
    ax.grid(alpha=0.3)
    ax.legend(
        fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False
    )
    if held:
        assert results.held_out is not None
        ax2 = axes[1, 0]
        A, at = results.held_out_matrix()
        curves = held_out_curves(A, results.held_out_segments())
        names = {
            "seen": "seen segments (anytime accuracy)",
            "past": "left segments (retention)",
            "forgetting": "forgetting (peak - now)",
        }
        for k, (name, text) in enumerate(names.items()):
            values = curves[name].numpy()
            if torch.isfinite(curves[name]).any():
                ax2.plot(
                    at.numpy(), values, marker="o", ms=3, lw=1.5, color=f"C{k + 4}", label=text
                )
        for start in results.held_out.segment_starts or []:
            if start > 0:
                ax2.axvline(start, color="0.8", lw=0.8, zorder=0)
        ax2.set_ylim(-0.02, 1.02)
        ax2.set_ylabel("held-out accuracy")
        ax2.set_title("Held-out sets over the stream")
        ax2.grid(alpha=0.3)
        ax2.legend(
            fontsize=7.5,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            borderaxespad=0.0,
            frameon=False,
        )
    axes[-1, 0].set_xlabel("stream position (samples trained)")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig

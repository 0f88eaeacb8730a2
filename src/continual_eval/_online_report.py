"""The online part of ``continual-eval report``: for runs with an ``online`` section
([`OnlineEvalCallback`][continual_eval.online.OnlineEvalCallback]), a table per method of the
learner's online and near-future accuracy beside the best blind predictor's, and per run the picture
of online vs near-future vs blind accuracy over the stream
([`plot_online`][continual_eval.plotting.plot_online]), the table of every score, the compute
totals, the held-out curves' final values and a CSV of the windows (samples seen, optimizer
steps, wall time and every score per window)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from continual_eval._csv import csv_text
from continual_eval.plotting import BLIND_NAMES, online_score_label
from continual_eval.results import OnlineResults
from continual_eval.results.schema import BLIND_PREDICTORS

__all__ = [
    "online_run_lines",
    "online_score_rows",
    "online_summary_lines",
    "online_windows_csv",
]


def _cell(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.4f}"


def _best_blind(entry: dict[str, Any]) -> tuple[str | None, float | None]:
    blinds = {b: v for b, v in entry["blind"].items() if v is not None}
    if not blinds:
        return None, None
    best = max(blinds, key=lambda b: blinds[b])
    return best, blinds[best]


def _with_interval(value: float | None, interval: tuple[float, float] | None) -> str:
    if interval is None or value is None or not math.isfinite(value):
        return _cell(value)
    return f"{_cell(value)} [{_cell(interval[0])}, {_cell(interval[1])}]"


def online_score_rows(online: OnlineResults) -> list[list[str]]:
    """One row per score: its name, the learner's accuracy over the stream, each blind
    predictor's (each ``value [low, high]``, the 95 % batch-means interval over the windows,
    `OnlineResults.accuracy_interval`), the gap to the best one and the samples scored (plain
    text)."""
    rows = []
    for score, entry in online.summary()["scores"].items():
        rows.append(
            [
                online_score_label(score),
                _with_interval(entry["accuracy"], online.accuracy_interval(score)),
                *(
                    _with_interval(entry["blind"][b], online.accuracy_interval(score, b))
                    for b in BLIND_PREDICTORS
                ),
                _cell(entry["gap_to_best_blind"]),
                str(entry["samples"]),
            ]
        )
    return rows


#: the measured coverage of the nominal 95 % Wilson interval of a window accuracy (a fixed
#: predictor, per-class accuracies 0.50..0.95 over 10 classes, windows of 500 predictions, 4000
#: windows, seed 0; ``tests/online/test_online_intervals.py``): independent labels, labels in runs
#: of 10 and of 150 of ``autocorrelated_labels``; and the pooled counts of 2000 streams of 12000
WILSON_COVERAGE = {
    "iid": 0.95875,
    "runs of 10": 0.8705,
    "runs of 150": 0.4095,
    "stream of 12000, runs of 150": 0.4155,  # 2000 streams
}

#: the measured coverage of the nominal 95 % interval of the stream accuracy (batch means,
#: `window_means_interval`, joined with the pooled counts' Wilson interval; 2000 streams of 24
#: windows of 500 predictions, the predictor of `WILSON_COVERAGE`, seed 1;
#: ``tests/online/test_online_intervals.py``): independent labels, runs of 150, and runs of 150
#: with a learner whose accuracy rises by 0.2 over the stream
WINDOWS_COVERAGE = {
    "iid": 0.9635,
    "runs of 150": 0.9445,
    "runs of 150, learning": 0.9445,
}

#: the note under the online score tables (md and html)
INTERVAL_NOTE = (
    "Intervals: the stream accuracies' are 95% batch-means intervals over the windows (the "
    "windows' spread, by successive differences, gives the error, so labels in runs and a "
    "learner better on some classes are accounted for; at least two windows with a "
    "prediction), joined with the Wilson interval of the pooled counts. In a seeded "
    "simulation with the package's stream generator (a fixed predictor whose accuracy "
    "depends on the class, 24 windows of 500 predictions) they covered the true "
    f"accuracy in {WINDOWS_COVERAGE['iid']:.2%} of streams with independent labels, "
    f"{WINDOWS_COVERAGE['runs of 150']:.2%} with runs of 150 (the worked example's stream) and "
    f"{WINDOWS_COVERAGE['runs of 150, learning']:.2%} with a learner improving by 0.2 over the "
    "stream, where the Wilson interval of the pooled counts covered "
    f"{WILSON_COVERAGE['stream of 12000, runs of 150']:.2%}. The per-window intervals (the "
    "windows' CSV, the logs' lo/hi) are Wilson intervals of each window's counts, which treat its "
    "predictions as independent trials: they covered "
    f"{WILSON_COVERAGE['iid']:.2%} of windows with independent labels, "
    f"{WILSON_COVERAGE['runs of 10']:.2%} with runs of 10 and "
    f"{WILSON_COVERAGE['runs of 150']:.2%} with runs of 150; read them as the binomial noise of "
    "the counts, a lower bound on a window's uncertainty."
)

#: the header of [`online_score_rows`][continual_eval._online_report.online_score_rows]
SCORE_HEADER = ["score", "learner", *(f"blind: {BLIND_NAMES[b]}" for b in BLIND_PREDICTORS)]
SCORE_HEADER += ["gap to best blind", "samples"]


def cost_text(online: OnlineResults) -> str:
    """The compute of the whole stream in one sentence."""
    cost = online.summary()["cost"]
    return (
        f"{cost['stream_samples']} stream samples in {cost['windows']} windows of "
        f"{online.protocol.window_batches} batches; {cost['optimizer_steps']} optimizer steps, "
        f"{cost['train_seconds']:.1f} s training, {cost['eval_seconds']:.1f} s held-out "
        f"evaluation, {cost['scoring_forwards']} scoring forward passes (prequential scores: "
        f"{online.protocol.prequential})"
    )


def held_out_text(online: OnlineResults) -> str | None:
    """The held-out curves' final values and the anytime accuracy, or ``None`` without
    held-out sets."""
    held = online.summary()["held_out"]
    if held is None:
        return None
    final = held["final"]
    text = (
        f"held-out sets, {held['evaluations']} evaluations over the stream: anytime accuracy "
        f"{_cell(held['anytime_accuracy'])}; at the end seen {_cell(final['seen'])}, left "
        f"(retention) {_cell(final['past'])}, forgetting {_cell(final['forgetting'])}"
    )
    metrics = held.get("metrics")
    if metrics:
        text += (
            f"; over the segments ACC {_cell(metrics.get('acc'))}, BWT {_cell(metrics.get('bwt'))}"
        )
    return text


def online_windows_csv(online: OnlineResults) -> str:
    """One row per window: its batches, stream positions, compute and, per score, the learner's
    and the blind predictors' accuracy, each with its 95 % Wilson interval (``.../acc_lo``,
    ``.../acc_hi``; `OnlineResults.window_interval`), through the package's CSV writer."""
    scores = online.score_names()
    header = [
        "window",
        "first_batch",
        "last_batch",
        "stream_start",
        "stream_end",
        "samples",
        "optimizer_steps",
        "train_seconds",
        "eval_seconds",
        "scoring_forwards",
        "classes_seen",
    ]
    for score in scores:
        for name in (f"{score}/acc", *(f"{score}/blind_{b}/acc" for b in BLIND_PREDICTORS)):
            header += [name, f"{name}_lo", f"{name}_hi"]
        header.append(f"{score}/samples")
    intervals = {
        (score, b): online.window_interval(score, b)
        for score in scores
        for b in (None, *BLIND_PREDICTORS)
    }
    rows = []
    for k, w in enumerate(online.windows):
        c = w.cost
        row: list[Any] = [
            w.index,
            w.first_batch,
            w.last_batch,
            w.stream_start,
            w.stream_end,
            c.samples,
            c.optimizer_steps,
            round(c.train_seconds, 6),
            round(c.eval_seconds, 6),
            c.scoring_forwards,
            w.classes_seen,
        ]
        for score in scores:
            counts = w.scores[score]
            n = counts.total
            for b in (None, *BLIND_PREDICTORS):
                correct = counts.correct if b is None else counts.blind[b]
                low, high = intervals[score, b]
                row += [correct / n, float(low[k]), float(high[k])] if n else [None] * 3
            row.append(n)
        rows.append(row)
    return csv_text(header, rows)


def online_run_lines(run: Any, out_dir: Path, plain: Callable[[str], str], title: str) -> list[str]:
    """Markdown lines for one run (a [`continual_eval.report.Run`][continual_eval.report.Run])
    with an ``online`` section: the picture (``<label>_online.png``), the score table, the
    compute, the held-out values and the windows' CSV (``<label>_online_windows.csv``), written
    into ``out_dir``; nothing without the section. ``plain`` makes ``title`` safe for a
    matplotlib label."""
    online = getattr(run.results, "online", None)
    if online is None or not online.windows:
        return []
    from continual_eval.plotting import _pyplot, plot_online

    picture = out_dir / f"{run.label}_online.png"
    fig = plot_online(online, picture, title=f"Online evaluation: {plain(title)}")
    _pyplot().close(fig)
    table = out_dir / f"{run.label}_online_windows.csv"
    table.write_text(online_windows_csv(online), encoding="utf-8")
    lines = [
        "### Online evaluation",
        "",
        "Online (prequential, Cai et al. ICCV 2021): each training batch scored before the "
        "optimizer step on it; near-future (Hammoud et al. ICCV 2023): the model scored on the "
        "batch `delay` batches ahead; label delay (Csaba et al. NeurIPS 2024): labels `delay` "
        "batches late. Blind predictors never see the input (recent mode, last label, most "
        "frequent so far): a learner that does not beat them is explained by the stream's label "
        "correlation.",
        "",
        f"![online vs near-future vs blind accuracy]({picture.name})",
        "",
        "| " + " | ".join(SCORE_HEADER) + " |",
        "|---|" + "---:|" * (len(SCORE_HEADER) - 1),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in online_score_rows(online)]
    lines += [
        "",
        INTERVAL_NOTE,
        "",
        f"Compute (Ghunaim et al. CVPR 2023): {cost_text(online)}.",
        "",
    ]
    held = held_out_text(online)
    if held is not None:
        lines += [held[:1].upper() + held[1:] + ".", ""]
    lines += [
        f"Per window (samples seen, optimizer steps, wall time, every score): `{table.name}`.",
        "",
    ]
    return lines


def _mean_std(values: Sequence[float | None]) -> str:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return "n/a"
    mean = math.fsum(finite) / len(finite)
    text = f"{mean:.4f}" if len(finite) < 2 else f"{mean:.4f} ± {statistics.stdev(finite):.4f}"
    return text if len(finite) == len(values) else f"{text} (n={len(finite)})"


def online_summary_lines(summaries: Sequence[Any], escape: Callable[[str], str]) -> list[str]:
    """Markdown lines: per method (``summaries`` of
    [`continual_eval.report.summarise`][continual_eval.report.summarise]) with an ``online``
    section, the mean ± sample std over its runs of every score's learner accuracy and best
    blind accuracy and of the anytime held-out accuracy; nothing when no run has one."""
    rows = []
    scores: list[str] = []
    for summary in summaries:
        sections = [
            run.results.online.summary()
            for run in summary.runs
            if getattr(run.results, "online", None) is not None
        ]
        if sections:
            rows.append((summary.method, sections))
            for section in sections:
                scores += [s for s in section["scores"] if s not in scores]
    if not rows:
        return []
    titles = []
    for score in scores:
        label = online_score_label(score)
        titles += [label, f"{label}: best blind"]
    titles.append("held-out anytime acc")
    lines = [
        "## Online evaluation",
        "",
        "Per method, mean ± sample std over its runs with an `online` section: each score's "
        "accuracy over the stream and that of the best blind predictor on the same samples "
        "(never looks at the input); the anytime accuracy on the held-out sets over the stream. "
        "Each run's picture and tables are under its heading.",
        "",
        "| method | runs | " + " | ".join(titles) + " |",
        "|---|---:|" + "---:|" * len(titles),
    ]
    for method, sections in rows:
        cells = []
        for score in scores:
            entries = [section["scores"].get(score) for section in sections]
            cells.append(_mean_std([None if e is None else e["accuracy"] for e in entries]))
            cells.append(_mean_std([None if e is None else _best_blind(e)[1] for e in entries]))
        held = [section["held_out"] for section in sections]
        cells.append(_mean_std([None if h is None else h["anytime_accuracy"] for h in held]))
        lines.append(f"| {escape(method)} | {len(sections)} | " + " | ".join(cells) + " |")
    return [*lines, ""]

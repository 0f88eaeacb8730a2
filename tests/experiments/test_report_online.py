"""``continual-eval report`` on runs with an ``online`` section: per run the picture of online vs
near-future vs blind accuracy over the stream, its tables and the windows' CSV, a table per
method, the section in report.html; a run without tasks (OnlineEvalCallback alone) shows only
these. The records are built here by hand (no training), with known counts."""

from __future__ import annotations

import csv
import dataclasses
import html
import io
import math

import pytest
import torch
from scipy.stats import binomtest
from scipy.stats import t as student_t

from continual_eval._online_report import INTERVAL_NOTE
from continual_eval.report import main, write_report
from continual_eval.results import ContinualResults, OnlineResults, ScoreMatrix
from continual_eval.results.schema import (
    HeldOut,
    HeldOutEvaluation,
    OnlineProtocol,
    OnlineWindow,
    ScoreCounts,
    WindowCost,
)

WINDOWS, BATCH, WINDOW_BATCHES = 12, 10, 5
N = BATCH * WINDOW_BATCHES  # samples per window


def _counts(correct: int, total: int, blind: tuple[int, int, int]) -> ScoreCounts:
    return ScoreCounts(
        correct=correct, total=total, blind=dict(zip(("mode", "last", "prior"), blind, strict=True))
    )


def online_record(learner: float = 0.6) -> OnlineResults:
    """A stream of ``WINDOWS`` windows: online accuracy 0.9 for the blind ``last`` predictor and
    ``learner`` for the learner; near-future (delay 3): blind at chance (5 of 50), the learner
    a little below its online accuracy; held-out sets over two segments."""
    protocol = OnlineProtocol(
        world_size=1,
        batch_size=BATCH,
        global_batch_size=BATCH,
        window_batches=WINDOW_BATCHES,
        near_future_delays=[3],
        label_delays=[],
        blind_window=20,
        prequential="outputs",
        stream_source="train_loader",
    )
    windows = []
    for k in range(WINDOWS):
        good = round(N * min(1.0, learner + 0.02 * k))
        scores = {
            "online": _counts(good, N, (40, 45, 10)),
            "near_future/3": _counts(good - 5, N, (6, 5, 4)),
        }
        cost = WindowCost(
            samples=N,
            optimizer_steps=WINDOW_BATCHES,
            train_seconds=0.5,
            eval_seconds=0.0,
            scoring_forwards=WINDOW_BATCHES,
            peak_memory_bytes=0,
            memory_kind="none",
            parameters=100,
            trainable_parameters=100,
        )
        windows.append(
            OnlineWindow(
                index=k,
                first_batch=k * WINDOW_BATCHES,
                last_batch=(k + 1) * WINDOW_BATCHES - 1,
                stream_start=k * N,
                stream_end=(k + 1) * N,
                global_step=(k + 1) * WINDOW_BATCHES,
                classes_seen=min(10, k + 2),
                scores=scores,
                cost=cost,
            )
        )
    half = WINDOWS // 2 * N
    evaluations = [
        HeldOutEvaluation(
            stream_position=position,
            batches=position // BATCH,
            optimizer_steps=position // BATCH,
            window=position // N - 1,
            segments_ended=ended,
            scores=scores,
            seconds=0.1,
        )
        for position, ended, scores in [
            (0, [], [0.1, 0.1]),
            (half, [0], [0.8, 0.2]),
            (WINDOWS * N, [1], [0.6, 0.85]),
        ]
    ]
    held = HeldOut(
        names=["first half", "second half"],
        segment_starts=[0, half],
        scorer="accuracy",
        evaluations=evaluations,
    )
    return OnlineResults(protocol, windows, held)


def _online_run(path, method: str, seed: int, learner: float = 0.6):
    online = online_record(learner)
    metadata = {"experiment": "stream", "method": method, "seed": seed}
    ContinualResults.from_online(online, metadata=metadata, run_id=f"{method}{seed}").write(path)
    return online


def _task_run_with_online(path):
    R = torch.tensor([[0.9, 0.2], [0.7, 0.95]], dtype=torch.float64)
    b = torch.tensor([0.1, 0.1], dtype=torch.float64)
    results = ContinualResults.from_tensors(
        {"acc": ScoreMatrix("accuracy", R, b)},
        task_names=["first half", "second half"],
        metadata={"experiment": "stream", "method": "tasks", "seed": 0},
        run_id="tasks0",
    )
    dataclasses.replace(results, online=online_record()).write(path)


def test_online_runs_get_their_picture_tables_and_windows(tmp_path):
    _online_run(tmp_path / "runs" / "sgd_0", "sgd", 0, learner=0.6)
    _online_run(tmp_path / "runs" / "sgd_1", "sgd", 1, learner=0.7)
    _task_run_with_online(tmp_path / "runs" / "tasks_0")
    out = tmp_path / "report"
    report = write_report([tmp_path / "runs"], out)
    text = report.read_text()
    for label, learner in [
        ("stream_sgd_seed0", 0.6),
        ("stream_sgd_seed1", 0.7),
        ("stream_tasks_seed0", 0.6),
    ]:
        assert (out / f"{label}_online.png").stat().st_size > 20_000
        assert f"![online vs near-future vs blind accuracy]({label}_online.png)" in text
        rows = list(csv.DictReader(io.StringIO((out / f"{label}_online_windows.csv").read_text())))
        assert len(rows) == WINDOWS
        assert [int(r["optimizer_steps"]) for r in rows] == [WINDOW_BATCHES] * WINDOWS
        assert float(rows[0]["online/blind_last/acc"]) == pytest.approx(45 / N)
        near = (round(N * (learner + 0.06)) - 5) / N
        assert float(rows[3]["near_future/3/acc"]) == pytest.approx(near)
    # the runs without tasks have no matrix to draw; the one with tasks keeps its pictures
    assert not list(out.glob("stream_sgd_*_matrix*.png"))
    assert (out / "stream_tasks_seed0_matrix.png").is_file()
    assert text.count("### Online evaluation") == 3
    assert "(online, 600 stream samples)" in text
    # the per-method table: sgd over its two runs (mean ± sample std), the blind beside it
    online = [online_record(0.6).accuracy(), online_record(0.7).accuracy()]
    mean, std = sum(online) / 2, math.sqrt(sum((v - sum(online) / 2) ** 2 for v in online))
    section = text.split("## Online evaluation", 1)[1].splitlines()
    row = next(line for line in section if line.startswith("| sgd | 2 | "))
    assert row.split(" | ")[2] == f"{mean:.4f} ± {std:.4f}"
    assert row.split(" | ")[3] == "0.9000 ± 0.0000"  # the best blind predictor: the last label
    assert row.split(" | ")[5] == "0.1200 ± 0.0000"  # near-future: blind at chance
    # the run's score table and compute line
    assert "| near-future, delay 3 | " in text and "Compute (Ghunaim et al. CVPR 2023): 600" in text
    assert "anytime accuracy" in text and "over the segments ACC" in text
    # every accuracy of the run's score table with its batch-means interval over the windows
    # (a plain loop here) joined with scipy's pooled Wilson interval, and the coverage note
    score_row = next(
        line for line in text.splitlines() if line.startswith("| online (prequential) | ")
    )
    first = online_record(0.6)
    correct, total = (c.tolist() for c in first.counts("online"))
    p = sum(correct) / sum(total)
    z = [(c - p * n) / (sum(total) / len(total)) for c, n in zip(correct, total, strict=True)]
    v = sum((z[w + 1] - z[w]) ** 2 for w in range(len(z) - 1)) / (2 * (len(z) - 1))
    half = student_t.ppf(0.975, len(z) - 1) * math.sqrt(v / len(z))
    wilson = binomtest(sum(correct), sum(total)).proportion_ci(0.95, method="wilson")
    low, high = min(wilson.low, max(p - half, 0.0)), max(wilson.high, min(p + half, 1.0))
    assert score_row.split(" | ")[1] == f"{first.accuracy():.4f} [{low:.4f}, {high:.4f}]"
    assert text.count(INTERVAL_NOTE) == 3
    page = (out / "report.html").read_text()
    assert page.count(html.escape(INTERVAL_NOTE, quote=True)) == 3
    assert page.count("Online vs near-future vs blind accuracy over the stream") == 3
    assert "blind: last label" in page


def test_report_command_on_an_online_run_alone(tmp_path, capsys):
    _online_run(tmp_path / "run", "sgd", 0)
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Online evaluation" in text and "metrics.png" not in text  # no task metric to draw
    assert (tmp_path / "out" / "stream_sgd_seed0_online.png").is_file()
    page = (tmp_path / "out" / "report.html").read_text()
    assert "Uncertainty across seeds" not in page and "<h3>Online evaluation</h3>" in page

"""``continual-eval fit --config configs/online_segments.yaml`` in a fresh process (a shorter
stream): ContinualEvalCallback records R over the four segments, OnlineEvalCallback the online
section of the same results.json, and the report draws both."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from continual_eval.online import read_online
from continual_eval.results import ContinualResults

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "online_segments.yaml"


@pytest.mark.slow
def test_fit_online_segments_config(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "continual_eval.cli",
            "fit",
            "--config",
            str(CONFIG),
            "--data.init_args.num_samples",
            "1200",
            "--data.init_args.held_out_per_segment",
            "100",
            "--stream.save_dir",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "MPLBACKEND": "Agg"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "online_segments" / "mlp_sgd" / "version_0"
    results = ContinualResults.load(run)
    assert results.task_names == ("segment_0", "segment_1", "segment_2", "segment_3")
    assert results.complete and results.metadata["method"] == "mlp_sgd"
    online = results.online
    assert online is not None and online.to_dict() == read_online(run).to_dict()
    assert online.protocol.near_future_delays == [1, 45] and online.protocol.label_delays == [5]
    assert online.protocol.stream_source == "stream"  # read ahead across the segments
    assert online.windows[-1].stream_end == 1200
    # near-future at 45 batches: every position but the last 45 batches' is scored
    assert sum(w.scores["near_future/45"].total for w in online.windows) == 1200 - 450
    assert online.held_out is not None and online.held_out.segment_starts == [0, 300, 600, 900]
    # the online callback's held-out rows at the segment ends are the task callback's R
    summary = online.summary()["held_out"]
    assert summary["matrix"] == results.primary.scores.tolist()
    assert summary["metrics"]["acc"] == pytest.approx(results.primary.metrics["acc"])
    report = run / "report"
    text = (report / "report.md").read_text()
    label = "online_segments_mlp_sgd_seed0"
    assert f"![online vs near-future vs blind accuracy]({label}_online.png)" in text
    assert (report / f"{label}_online.png").stat().st_size > 20_000
    assert (report / f"{label}_matrix.png").is_file()
    assert "## Online evaluation" in text and (report / f"{label}_online_windows.csv").is_file()
    assert "Online vs near-future vs blind accuracy" in (report / "report.html").read_text()


def test_connect_online_gives_the_stream_and_the_segments() -> None:
    from continual_eval.experiments.stream import connect_online
    from continual_eval.online import OnlineEvalCallback
    from continual_eval.online.synthetic import AutocorrelatedSegments

    data = AutocorrelatedSegments(num_samples=400, segments=4, held_out_per_segment=20)
    cb = OnlineEvalCallback(verbose=False)
    connect_online(cb, data, epochs=1)
    assert cb.stream is not None and len(cb.stream) == 400
    assert cb.stream[150][1] == data.train_sets[1][50][1]  # the segments in stream order
    assert cb.held_out is not None and cb.held_out.segment_starts == [0, 100, 200, 300]
    assert cb.held_out.names == data.task_names
    several = OnlineEvalCallback(verbose=False)
    connect_online(several, data, epochs=2)  # not one pass: no stream positions to tie to
    assert several.stream is None and several.held_out is not None
    assert several.held_out.segment_starts is None
    data.shuffle = True
    with pytest.raises(ValueError, match="scores a stream in its order"):
        connect_online(OnlineEvalCallback(verbose=False), data, epochs=1)

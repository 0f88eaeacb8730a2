"""The README's main job: ``continual-eval fit --config configs/logistic.yaml`` on its embedded
defaults (CSV + TensorBoard files) runs the stream, prints progress and R, and writes the report."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from continual_eval.cli import main as continual_eval

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "logistic.yaml"


def test_fit_logistic_config(tmp_path: Path, capfd, caplog, monkeypatch) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.chdir(tmp_path)
    assert continual_eval(["fit", "--config", str(CONFIG)]) == 0
    printed = capfd.readouterr()
    text = printed.out + printed.err + caplog.text  # the callback prints through logging
    for i in (1, 2, 3):
        assert f"task {i}/3" in text
    # each stage's own epochs, not Lightning's cumulative counter (36, 72, 108)
    assert (
        "[continual-eval] stage 2/3 (dir110) trained: 36 epochs (epochs 37-72 of the stream)"
        in (text)
    )
    assert "max_epochs=72" not in text and "max_epochs=108" not in text
    assert "tensorboard is not installed" not in text  # the dev install has it
    # the end prints R (baseline row, one row per stage) and the metrics
    assert "R[i, j]" in text and "acc=0.5333" in text and "forgetting=0.7000" in text
    run = tmp_path / "runs" / "logistic" / "version_0"
    assert f"run directory: {Path('runs/logistic/version_0')}" in text
    results = json.loads((run / "results.json").read_text())
    assert results["stages_completed"] == 3
    assert results["metadata"]["experiment"] == "logistic" and results["metadata"]["seed"] == 0
    assert results["scores"][2][2] >= 0.9 and results["metrics"]["forgetting"] > 0.25
    header = (run / "scores.csv").read_text().splitlines()[0]
    assert header == "stage," + ",".join(results["task_names"]) == "stage,dir0,dir110,dir220"
    assert (run / "metrics.csv").is_file()  # CSVLogger
    assert list(run.glob("events.out.tfevents.*"))  # TensorBoardLogger
    report = run / "report"
    assert (report / "report.md").is_file() and (report / "metrics.png").is_file()
    assert len(list(report.glob("*_matrix.png"))) == 1
    # a second run gets the next version directory
    assert continual_eval(["fit", "--config", str(CONFIG), "--stream.report=false"]) == 0
    assert (tmp_path / "runs" / "logistic" / "version_1" / "results.json").is_file()

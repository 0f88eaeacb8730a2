"""``continual-eval report``: its table and summary.csv equal what results.json holds (means and
sample standard deviations computed here with ``statistics``), one run shows no spread, and every
picture is written."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest
import torch

from continual_eval.report import main as report_main
from continual_eval.results import ContinualResults, ScoreMatrix

NAN = math.nan
NAIVE = [
    [[0.99, 0.40, 0.30], [0.60, 0.97, 0.45], [0.52, 0.58, 0.96]],
    [[0.98, 0.37, 0.20], [0.55, 0.99, 0.47], [0.50, 0.61, 0.95]],
    [[1.00, 0.45, 0.33], [0.70, 0.96, 0.40], [0.58, 0.66, 0.94]],
]
REPLAY = [[0.97, 0.41, NAN], [0.93, 0.95, 0.52], [0.90, 0.91, 0.93]]  # one unevaluated cell
BASELINE = [0.5, 0.48, 0.52]
REFERENCE = [0.98, 0.97, 0.96]


def write_run(root: Path, name: str, R: list[list[float]], meta: dict) -> Path:
    run = root / name
    matrix = ScoreMatrix(
        "accuracy",
        torch.tensor(R, dtype=torch.float64),
        torch.tensor(BASELINE, dtype=torch.float64),
    )
    ContinualResults.from_tensors({"acc": matrix}, metadata=meta).write(run)
    return run


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    dirs = [
        write_run(
            tmp_path,
            f"naive/version_{s}",
            R,
            {"method": "naive", "seed": s, "reference": REFERENCE},
        )
        for s, R in enumerate(NAIVE)
    ]
    dirs.append(write_run(tmp_path, "replay/version_0", REPLAY, {"method": "replay", "seed": 0}))
    return dirs


def recorded(run: Path) -> dict:
    with open(run / "results.json") as fh:
        return json.load(fh)


def intransigence(R: list[list[float]], reference: list[float]) -> float:
    return sum(reference[j] - R[j][j] for j in range(len(R))) / len(R)


def test_table_equals_results_json(runs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert report_main([str(r) for r in runs] + ["--out", str(out)]) == 0
    naive = [recorded(r)["metrics"] for r in runs[:3]]
    replay = recorded(runs[3])["metrics"]
    with open(out / "summary.csv") as fh:
        rows = {row["method"]: row for row in csv.DictReader(fh)}
    assert set(rows) == {"naive", "replay"}
    for key in ("acc", "bwt", "fwt", "forgetting"):
        values = [m[key] for m in naive]
        assert float(rows["naive"][f"{key}_mean"]) == pytest.approx(
            statistics.mean(values), abs=1e-12
        )
        assert float(rows["naive"][f"{key}_std"]) == pytest.approx(
            statistics.stdev(values), abs=1e-12
        )
        assert float(rows["replay"][f"{key}_mean"]) == pytest.approx(replay[key], abs=1e-12)
        assert rows["replay"][f"{key}_std"] == ""  # one seed: no spread, not 0
    intr = [intransigence(R, REFERENCE) for R in NAIVE]
    assert float(rows["naive"]["intransigence_mean"]) == pytest.approx(
        statistics.mean(intr), abs=1e-12
    )
    assert rows["replay"]["intransigence_mean"] == ""  # no reference recorded

    table = (out / "report.md").read_text()
    lines = [
        line
        for line in table.splitlines()
        if line.startswith("| naive") or line.startswith("| replay")
    ]
    naive_cells = [c.strip() for c in lines[0].strip("|").split("|")]
    replay_cells = [c.strip() for c in lines[1].strip("|").split("|")]
    assert naive_cells[:3] == ["naive", "3", "0, 1, 2"]
    for cell, key in zip(naive_cells[3:7], ("acc", "bwt", "fwt", "forgetting"), strict=True):
        values = [m[key] for m in naive]
        assert cell == f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"
    for cell, key in zip(replay_cells[3:7], ("acc", "bwt", "fwt", "forgetting"), strict=True):
        assert cell == f"{replay[key]:.4f}"  # no "±" for a single run
    assert replay_cells[7] == "n/a"
    # the recorded ACC is the scalar mean of the final row
    assert replay["acc"] == pytest.approx((0.90 + 0.91 + 0.93) / 3, abs=1e-12)


def test_pictures_written(runs: list[Path], tmp_path: Path) -> None:
    import matplotlib.image as mpimg

    out = tmp_path / "pictures"
    assert report_main([str(tmp_path), "--out", str(out)]) == 0  # folder searched recursively
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "metrics.png" in pngs
    assert len(pngs) == 1 + 2 * len(runs)  # metrics chart + heatmap and trajectories per run
    for name in pngs:
        height, width, _ = mpimg.imread(out / name).shape
        assert height > 200 and width > 200


def test_default_out_and_missing_run(runs: list[Path], tmp_path: Path, capsys) -> None:
    assert report_main([str(runs[3])]) == 0
    assert (runs[3] / "report" / "report.md").is_file()
    assert report_main([str(tmp_path / "nowhere")]) == 1
    assert "no results.json" in capsys.readouterr().err


LOSS = [[0.40, 1.90, 2.10], [0.95, 0.35, 1.80], [1.20, 0.70, 0.30]]
LOSS_BASELINE = [2.2, 2.0, 2.3]


def write_two_matrix_run(root: Path, name: str, primary: str, meta: dict) -> Path:
    """A run with an accuracy and a cross-entropy matrix, ``primary`` first."""
    from continual_eval.results import ContinualResults, ScoreMatrix

    matrices = {
        "acc": ScoreMatrix(
            "accuracy",
            torch.tensor(NAIVE[0], dtype=torch.float64),
            torch.tensor(BASELINE, dtype=torch.float64),
        ),
        "loss": ScoreMatrix(
            "cross_entropy",
            torch.tensor(LOSS, dtype=torch.float64),
            torch.tensor(LOSS_BASELINE, dtype=torch.float64),
            higher_is_better=False,
            bounds=None,
        ),
    }
    order = [primary, *(k for k in matrices if k != primary)]
    results = ContinualResults.from_tensors({k: matrices[k] for k in order}, metadata=meta)
    results.write(root / name)
    return root / name


def test_several_matrices_and_a_lower_is_better_primary(tmp_path: Path) -> None:
    """The columns are the primary matrix's (recorded metrics; intransigence reversed for a
    loss: R[j, j] - reference[j]); every matrix of a run is tabulated; the pictures draw."""
    from continual_eval.report import find_runs, run_metrics
    from continual_eval.results import ContinualResults

    reference = [0.2, 0.25, 0.3]
    acc_run = write_two_matrix_run(tmp_path, "a/version_0", "acc", {"method": "acc_first"})
    loss_run = write_two_matrix_run(
        tmp_path, "b/version_0", "loss", {"method": "loss_first", "reference": reference}
    )
    out = tmp_path / "report"
    assert report_main([str(acc_run), str(loss_run), "--out", str(out)]) == 0
    runs = find_runs([acc_run, loss_run])
    assert all(isinstance(run.results, ContinualResults) for run in runs)
    with open(out / "summary.csv") as fh:
        rows = {row["method"]: row for row in csv.DictReader(fh)}
    for method, run, primary in (("acc_first", acc_run, "acc"), ("loss_first", loss_run, "loss")):
        recorded = json.loads((run / "results.json").read_text())["matrices"]
        assert next(iter(recorded)) == primary
        for key in ("acc", "bwt", "fwt", "forgetting"):
            value = float(rows[method][f"{key}_mean"])
            assert value == recorded[primary]["metrics"][key], (method, key)
    # a loss: BWT positive = improved, forgetting = rise above the lowest value (plain loops)
    bwt = sum(LOSS[j][j] - LOSS[2][j] for j in range(2)) / 2
    assert float(rows["loss_first"]["bwt_mean"]) == pytest.approx(bwt, abs=1e-12)
    intr = sum(LOSS[j][j] - reference[j] for j in range(3)) / 3
    assert float(rows["loss_first"]["intransigence_mean"]) == pytest.approx(intr, abs=1e-12)
    assert run_metrics(runs[1].results) == run_metrics(
        json.loads((loss_run / "results.json").read_text())
    )
    text = (out / "report.md").read_text()
    assert text.count("acc (accuracy)") == 2 and text.count("loss (cross\\_entropy, lower is") == 2
    for label in ("loss_first_version_0", "acc_first_version_0"):
        for kind in ("matrix", "trajectories"):
            assert (out / f"{label}_{kind}.png").stat().st_size > 10_000

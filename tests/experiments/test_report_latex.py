"""``table.tex`` of ``continual-eval report``: a booktabs table whose cells equal the mean ± the
sample std (or the half-width of the Student-t interval, computed here with ``statistics`` and
``scipy``) of the metrics recorded in results.json, the direction of each metric as an arrow, the
best mean of each column in bold (found here with a plain loop); it compiles with pdflatex
(where installed) and the PDF shows the numbers."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
import scipy.stats
import torch

from continual_eval.report import main as report_main
from continual_eval.results import ContinualResults, ScoreMatrix

BASELINE = [0.5, 0.48, 0.52]
REFERENCE = [0.97, 0.96, 0.98]
#: method -> per seed, R (3 x 3): every metric differs between runs
RUNS = {
    "naive": [
        [[0.95, 0.40, 0.30], [0.60, 0.97, 0.45], [0.52, 0.58, 0.96]],
        [[0.93, 0.37, 0.20], [0.55, 0.99, 0.47], [0.50, 0.61, 0.95]],
        [[0.96, 0.45, 0.33], [0.70, 0.96, 0.40], [0.58, 0.66, 0.94]],
    ],
    "replay": [
        [[0.94, 0.41, 0.31], [0.90, 0.95, 0.52], [0.88, 0.91, 0.93]],
        [[0.95, 0.39, 0.35], [0.86, 0.94, 0.50], [0.84, 0.90, 0.95]],
    ],
}
KEYS = ("acc", "bwt", "fwt", "forgetting", "intransigence")
TITLES = ("ACC", "BWT", "FWT", "Forgetting", "Intransigence")
HIGHER = (True, True, True, False, False)


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    dirs = []
    for method, matrices in RUNS.items():
        for seed, R in enumerate(matrices):
            run = tmp_path / "runs" / method / f"version_{seed}"
            score = ScoreMatrix(
                "accuracy",
                torch.tensor(R, dtype=torch.float64),
                torch.tensor(BASELINE, dtype=torch.float64),
            )
            meta = {"method": method, "seed": seed, "reference": REFERENCE}
            ContinualResults.from_tensors({"acc": score}, metadata=meta).write(run)
            dirs.append(run)
    return dirs


def recorded(runs: list[Path]) -> dict[str, dict[str, list[float]]]:
    """method -> metric -> the values results.json holds (intransigence: a plain loop)."""
    out: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        doc = json.loads((run / "results.json").read_text())
        R = doc["scores"]
        values = out.setdefault(doc["metadata"]["method"], {k: [] for k in KEYS})
        for key in KEYS[:4]:
            values[key].append(doc["metrics"][key])
        values["intransigence"].append(sum(REFERENCE[j] - R[j][j] for j in range(3)) / 3)
    return out


def rows_of(tex: str) -> list[list[str]]:
    """The cells of each row between \\midrule and \\bottomrule, split at unescaped ``&``."""
    body = tex.split("\\midrule\n")[1].split("\\bottomrule")[0]
    lines = [line.removesuffix(" \\\\") for line in body.strip().split("\n")]
    return [[c.strip() for c in re.split(r"(?<!\\)&", line)] for line in lines]


def cell(mean: float, half: float | None, bold: bool) -> str:
    body = f"{mean:.3f}" if half is None else f"{mean:.3f} \\pm {half:.3f}"
    return f"$\\mathbf{{{body}}}$" if bold else f"${body}$"


def best_rows(means: list[float], higher: bool) -> set[int]:
    shown = [round(m, 3) for m in means]
    target = max(shown) if higher else min(shown)
    winners = {k for k, v in enumerate(shown) if v == target}
    return set() if len(winners) == len(shown) else winners


@pytest.mark.parametrize("spread", ["std", "ci"])
def test_cells_arrows_and_bold_equal_an_independent_computation(
    runs: list[Path], tmp_path: Path, spread: str
) -> None:
    out = tmp_path / "report"
    assert report_main([str(tmp_path / "runs"), "--out", str(out), "--spread", spread]) == 0
    tex = (out / "table.tex").read_text(encoding="utf-8")
    lines = tex.split("\n")
    assert lines[1:5] == [
        "\\begin{table}[t]",
        "\\centering",
        "\\small",
        "\\setlength{\\tabcolsep}{3pt}",
    ]
    assert "\\begin{tabular}{l r c c c c c}" in lines
    order = [lines.index(rule) for rule in ("\\toprule", "\\midrule", "\\bottomrule")]
    assert order == sorted(order)
    assert tex.rstrip().endswith("\\end{tabular}\n\\end{table}")
    header = lines[order[0] + 1].removesuffix(" \\\\").split(" & ")
    arrows = ["$\\uparrow$" if h else "$\\downarrow$" for h in HIGHER]
    assert header == ["Method", "$n$", *(f"{t} {a}" for t, a in zip(TITLES, arrows, strict=True))]
    values = recorded(runs)
    rows = rows_of(tex)
    assert [r[:2] for r in rows] == [["naive", "3"], ["replay", "2"]]
    for column, (key, higher) in enumerate(zip(KEYS, HIGHER, strict=True)):
        means = [statistics.mean(values[m][key]) for m in RUNS]
        winners = best_rows(means, higher)
        for k, method in enumerate(RUNS):
            xs = values[method][key]
            s = statistics.stdev(xs)
            half = (
                s if spread == "std" else scipy.stats.t.ppf(0.975, len(xs) - 1) * s / len(xs) ** 0.5
            )
            assert rows[k][2 + column] == cell(means[k], half, k in winners), (key, method)
    assert any("\\mathbf" in c for r in rows for c in r)  # the data has winners
    caption = next(line for line in lines if line.startswith("\\caption{"))
    meaning = "sample standard deviation" if spread == "std" else "half-width of the 95\\%"
    assert meaning in caption


def test_one_run_shows_its_value_and_per_task_columns(runs: list[Path], tmp_path: Path) -> None:
    """A method with one run: its values alone; --per-task: the final accuracy on each task
    (the last row of R) under a group heading, mean ± std over the runs."""
    out = tmp_path / "report"
    args = [str(runs[0]), str(runs[3]), str(runs[4]), "--out", str(out), "--per-task"]
    assert report_main(args) == 0
    tex = (out / "table.tex").read_text(encoding="utf-8")
    assert "\\begin{tabular}{l r c c c c c c c c}" in tex
    assert "\\multicolumn{5}{c}{Metrics} & \\multicolumn{3}{c}{Final accuracy per task}" in tex
    assert "\\cmidrule(lr){3-7}\\cmidrule(lr){8-10}" in tex
    rows = rows_of(tex)
    naive_final = RUNS["naive"][0][2]
    assert rows[0][:2] == ["naive", "1"] and "\\pm" not in "".join(rows[0])
    for j in range(3):
        xs = [RUNS["replay"][s][2][j] for s in range(2)]
        winners = best_rows([naive_final[j], statistics.mean(xs)], higher=True)
        assert rows[0][7 + j] == cell(naive_final[j], None, 0 in winners)
        assert rows[1][7 + j] == cell(statistics.mean(xs), statistics.stdev(xs), 1 in winners)


def _pdflatex(tmp_path: Path, table: Path, name: str) -> subprocess.CompletedProcess[str]:
    document = tmp_path / f"{name}.tex"
    document.write_text(
        "\\documentclass{article}\n\\usepackage[textwidth=5.5in]{geometry}\n"
        "\\usepackage{booktabs}\n"
        f"\\begin{{document}}\n\\input{{{table}}}\n\\end{{document}}\n",
        encoding="utf-8",
    )
    proc = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", document.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (tmp_path / f"{name}.pdf").stat().st_size > 1000
    return proc


def test_compiles_with_pdflatex(runs: list[Path], tmp_path: Path) -> None:
    """The table, pasted into an article that loads booktabs, compiles and fits a 5.5 in text
    width (NeurIPS);
    with per-task columns it compiles too (wider: a ``table*`` in a paper). The PDF's text
    holds the method names and the best ACC (read back with mutool where installed)."""
    out, wide = tmp_path / "report", tmp_path / "wide"
    assert report_main([str(tmp_path / "runs"), "--out", str(out), "--no-html"]) == 0
    assert report_main([str(tmp_path / "runs"), "--out", str(wide), "--per-task"]) == 0
    for table in (out / "table.tex", wide / "table.tex"):
        tex = table.read_text(encoding="utf-8")
        assert tex.count("{") - tex.count("\\{") == tex.count("}") - tex.count("\\}")
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (Debian: texlive-latex-base, -recommended)")
    proc = _pdflatex(tmp_path, out / "table.tex", "paper")
    assert "Overfull" not in proc.stdout, proc.stdout[-2000:]
    _pdflatex(tmp_path, wide / "table.tex", "wide")
    if shutil.which("mutool") is None:
        return
    text = subprocess.run(
        ["mutool", "draw", "-F", "txt", str(tmp_path / "paper.pdf")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    acc = statistics.mean(recorded(runs)["replay"]["acc"])
    assert "naive" in text and "replay" in text and f"{acc:.3f}" in text

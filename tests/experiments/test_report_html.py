"""``report.html``: one self-contained file (no request leaves it: inline scripts and styles only,
a Content-Security-Policy of ``default-src 'none'``) with every matrix of every run as a table and
as a Plotly heatmap and trajectories. Opened in headless Chromium (where installed): no console
message at all (errors, CSP violations), a screenshot with content (pixel variance, the heatmaps'
viridis colours), and the rendered DOM holding each heatmap cell's value as written by Plotly."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from continual_eval.report import main as report_main
from continual_eval.results import ContinualResults, ScoreMatrix

ACC = [[0.91, 0.42, 0.33], [0.64, 0.95, 0.47], [0.55, 0.61, 0.97]]
LOSS = [[0.40, 1.90, 2.10], [0.95, 0.35, 1.80], [1.20, 0.70, 0.30]]
BASELINE = [0.51, 0.48, 0.52]
LOSS_BASELINE = [2.2, 2.0, 2.3]


def matrices(shift: float) -> dict[str, ScoreMatrix]:
    f64 = torch.float64
    return {
        "acc": ScoreMatrix(
            "accuracy", torch.tensor(ACC, dtype=f64) - shift, torch.tensor(BASELINE, dtype=f64)
        ),
        "loss": ScoreMatrix(
            "cross_entropy",
            torch.tensor(LOSS, dtype=f64) + shift,
            torch.tensor(LOSS_BASELINE, dtype=f64),
            higher_is_better=False,
            bounds=None,
        ),
    }


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("html")
    for method, base in (("naive", 0.1), ("replay", 0.0)):
        for seed in (0, 1):
            results = ContinualResults.from_tensors(
                matrices(base + 0.01 * seed), metadata={"method": method, "seed": seed}
            )
            results.write(root / "runs" / method / f"version_{seed}")
    out = root / "report"
    assert report_main([str(root / "runs"), "--out", str(out)]) == 0
    return out


def expected_cells() -> list[tuple[str, list[list[float]]]]:
    """(matrix, its rows with the baseline first) of every run, in report order."""
    out = []
    for base in (0.1, 0.0):
        for seed in (0, 1):
            shift = base + 0.01 * seed
            out.append(("acc", [BASELINE, *([v - shift for v in r] for r in ACC)]))
            out.append(("loss", [LOSS_BASELINE, *([v + shift for v in r] for r in LOSS)]))
    return out


def test_one_self_contained_file(report: Path) -> None:
    page = (report / "report.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "default-src 'none'" in page  # the browser refuses every request
    assert not re.search(r"<(script|img|iframe)[^>]*\ssrc=", page)
    assert not re.search(r"<link\b", page) and "@import" not in page
    assert re.search(r"<script>/\*\*\s*\n?\s*\* plotly\.js", page[:2000])  # the library, inline
    figures = json.loads(re.search(r"CONTINUAL_EVAL_FIGURES = (\[.*?\]);", page).group(1))
    # the metric panels, then per run and matrix a heatmap and the trajectories
    assert len(figures) == 1 + 4 * 2 * 2
    assert all(f'id="{f}"' in page for f in figures)
    # each heatmap shows the stage, the task and the value under the cursor
    hover = "trained through: %{customdata[0]}\\u003cbr\\u003etask: %{customdata[1]}"
    assert page.count(hover + "\\u003cbr\\u003evalue: %{z:.3f}") == 4 * 2
    # every matrix's values as a table (4 decimals; the heatmaps write 3)
    for _, rows in expected_cells():
        for row in rows:
            assert "".join(f"<td>{v:.4f}</td>" for v in row) in page


def _chromium(page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=15000",
            *args,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


def _console(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.slow
def test_opens_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    if shutil.which("chromium") is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    # the console capture sees an error and a blocked request (so it can fail)
    probe = tmp_path / "probe.html"
    probe.write_text(
        "<!DOCTYPE html><html><head><meta http-equiv='Content-Security-Policy' "
        "content=\"default-src 'none'; script-src 'unsafe-inline'\"></head><body>"
        "<script>console.error('probe error'); fetch('http://127.0.0.1:9/').catch(() => 0);"
        "</script></body></html>",
        encoding="utf-8",
    )
    seen = _console(_chromium(probe, tmp_path, "--dump-dom"))
    assert any("probe error" in line for line in seen), seen
    assert any("Content Security Policy" in line for line in seen), seen

    page = report / "report.html"
    dom = _chromium(page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console(dom) == []  # no error, warning or blocked request
    # Plotly drew every figure (a main svg each) and wrote each cell's value on its heatmap
    assert dom.stdout.count('class="main-svg"') >= 17
    texts = re.findall(r'<text[^>]*class="textpoint"[^>]*>([^<]*)</text>', dom.stdout)
    if not texts:  # Plotly's scatter text: <g class="textpoint"><text ...>value</text></g>
        texts = re.findall(r'class="textpoint"[^>]*><text[^>]*>([^<]*)</text>', dom.stdout)
    expected = [f"{v:.3f}" for _, rows in expected_cells() for row in rows for v in row]
    assert sorted(texts) == sorted(expected)
    assert "cross_entropy (lower is better)" in dom.stdout  # the colorbar says the direction

    shot = tmp_path / "report.png"
    proc = _chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1280,4000")
    assert proc.returncode == 0 and shot.stat().st_size > 50_000, proc.stderr[-2000:]
    assert _console(proc) == []
    import matplotlib
    import matplotlib.image as mpimg

    pixels = mpimg.imread(shot)[..., :3]
    assert pixels.std() > 0.1  # not blank
    # the first heatmap (accuracy, viridis) is on screen: its darkest and brightest cells' colours
    viridis = matplotlib.colormaps["viridis"]
    flat = pixels.reshape(-1, 3)
    for colour in (viridis(0.0)[:3], viridis(1.0)[:3]):
        near = np.abs(flat - np.array(colour)).max(axis=1) < 0.06
        assert near.sum() > 0, colour
    assert not math.isnan(float(pixels.mean()))

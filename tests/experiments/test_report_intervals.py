"""``continual-eval report`` shows one run's intervals from its test items (``item_records=``,
the ``intervals`` section of ``results.json``): on every heatmap cell (PNG and report.html), as
the HTML trajectories' error bars, after a single run's value in the across-methods tables
(report.md, report.html, table.tex, the per-task columns of ``--per-task``) and in the verbose
final table; each read back here and compared with the numbers of ``results.json`` (formatted
here, not by the report's code), and absent for a run without item records. The intervals
across seeds carry the small-sample caveat (fewer than 10 runs) under every table."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.loggers import format_matrix_table
from continual_eval.plotting import MAX_INTERVAL_TASKS, plot_accuracy_matrix
from continual_eval.report import main as report_main
from continual_eval.results import ContinualResults, ScoreMatrix

TASKS = 3
TEST_SIZE = 61


class Blobs(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 3)
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _tasks() -> list[tuple[TensorDataset, TensorDataset]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(TASKS):
        means = torch.randn(3, 4, generator=g) * 2.0

        def sample(n: int, means: torch.Tensor = means) -> TensorDataset:
            y = torch.randint(0, 3, (n,), generator=g)
            return TensorDataset(means[y] + torch.randn(n, 4, generator=g), y)

        out.append((sample(48), sample(TEST_SIZE)))
    return out


def _fit(path: Path, method: str, lr: float, item_records: bool) -> None:
    tasks = _tasks()
    cb = ContinualEvalCallback(
        [DataLoader(te, batch_size=16) for _, te in tasks],
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        dirpath=path,
        verbose=False,
        item_records={"resamples": 300, "seed": 1} if item_records else None,
        metadata={"method": method, "seed": 0},
    )
    trainer = pl.Trainer(
        callbacks=[cb],
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        default_root_dir=str(path),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    fit_tasks(trainer, Blobs(lr), [DataLoader(tr, batch_size=16) for tr, _ in tasks])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two methods with one seed each and item records, and one method without them."""
    root = tmp_path_factory.mktemp("intervals")
    _fit(root / "runs" / "naive", "naive", 0.3, True)
    _fit(root / "runs" / "slow", "slow", 0.05, True)
    _fit(root / "plain" / "plain", "plain", 0.3, False)
    return root


@pytest.fixture(scope="module")
def report(runs: Path) -> Path:
    out = runs / "report"
    assert report_main([str(runs / "runs"), str(runs / "plain"), "--out", str(out)]) == 0
    assert report_main([str(runs / "runs"), "--out", str(runs / "tex"), "--per-task"]) == 0
    return out


def _document(runs: Path, method: str) -> dict[str, Any]:
    folder = "plain" if method == "plain" else "runs"
    return json.loads((runs / folder / method / "results.json").read_text(encoding="utf-8"))


def _span(value: float, low: float, high: float, digits: int) -> str:
    """How a cell's interval is written: ``±h`` when both arms round alike, else ``[lo, hi]``."""
    below, above = round(value - low, digits), round(high - value, digits)
    if below == above:
        return f"±{above:.{digits}f}"
    return f"[{low:.{digits}f}, {high:.{digits}f}]"


def _grid(document: dict[str, Any], matrix: str) -> list[list[tuple[float, float, float]]]:
    """(value, low, high) of every heatmap row (the baseline first) from results.json."""
    m = document["matrices"][matrix]
    held = document["intervals"]["matrices"][matrix]
    rows = [list(zip(m["baseline"], held["baseline_low"], held["baseline_high"], strict=True))]
    rows += [
        list(zip(r, lo, hi, strict=True))
        for r, lo, hi in zip(m["scores"], held["low"], held["high"], strict=True)
    ]
    return rows


def test_the_run_records_intervals(runs: Path) -> None:
    document = _document(runs, "naive")
    assert document["intervals"]["matrices"]["acc"]["cell_method"] == "wilson"
    assert document["intervals"]["matrices"]["loss"]["cell_method"] == "t"
    assert "intervals" not in _document(runs, "plain") or not _document(runs, "plain")["intervals"]


def test_png_heatmap_cells_show_the_intervals(runs: Path) -> None:
    results = ContinualResults.load(runs / "runs" / "naive")
    document = _document(runs, "naive")
    held = results.intervals.matrices["acc"]
    _, ax = plot_accuracy_matrix(
        results.primary.scores,
        results.primary.baseline,
        intervals=(held.low, held.high),
        baseline_intervals=(held.baseline_low, held.baseline_high),
        interval_label="95% Wilson interval",
    )
    texts: dict[tuple[int, int], list[str]] = {}
    for t in ax.texts:
        x, y = t.get_position()
        texts.setdefault((round(y), round(x)), []).append(t.get_text())
    grid = _grid(document, "acc")
    for i, row in enumerate(grid):
        for j, (v, lo, hi) in enumerate(row):
            assert texts[(i, j)] == [f"{v:.2f}", _span(v, lo, hi, 2)], (i, j)
    assert "value and 95% Wilson interval" in " ".join(ax.get_title().split())
    # the same matrix without intervals: the values alone
    _, plain = plot_accuracy_matrix(results.primary.scores, results.primary.baseline)
    assert sorted(t.get_text() for t in plain.texts) == sorted(
        f"{v:.2f}" for row in grid for v, _, _ in row
    )
    assert "interval" not in plain.get_title()


def test_png_heatmap_falls_back_to_the_value_when_cells_get_small() -> None:
    T = MAX_INTERVAL_TASKS + 1
    scores = torch.full((T, T), 0.5, dtype=torch.float64)
    _, ax = plot_accuracy_matrix(
        scores, intervals=(scores - 0.1, scores + 0.1), interval_label="95% Wilson interval"
    )
    assert {t.get_text() for t in ax.texts} == {"0.50"}
    assert len(ax.texts) == T * T
    title = " ".join(ax.get_title().split())  # wrapped to the figure's width
    note = f"value only (95% Wilson interval not drawn: more than {MAX_INTERVAL_TASKS} tasks)"
    assert note in title


def _figures(page: str) -> dict[str, tuple[list[dict[str, Any]], dict[str, Any]]]:
    """Every Plotly figure of the page: id -> (traces, layout), read from its newPlot call."""
    decoder = json.JSONDecoder()
    out = {}
    for found in re.finditer(r'Plotly\.newPlot\(\s*"(figure-\d+)",\s*', page):
        data, end = decoder.raw_decode(page, found.end())
        rest = page[end:].lstrip()[1:].lstrip()
        layout, _ = decoder.raw_decode(rest)
        out[found.group(1)] = (data, layout)
    return out


def _heatmaps(page: str) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    return [f for f in _figures(page).values() if f[0] and f[0][0].get("type") == "heatmap"]


def test_html_heatmap_cells_and_trajectories_show_the_intervals(runs: Path, report: Path) -> None:
    page = (report / "report.html").read_text(encoding="utf-8")
    heatmaps = _heatmaps(page)
    assert len(heatmaps) == 3 * 2  # 3 runs, 2 matrices each
    expected = []
    for method in ("naive", "slow"):
        document = _document(runs, method)
        for matrix in ("acc", "loss"):
            expected.append(
                [_span(v, lo, hi, 3) for row in _grid(document, matrix) for v, lo, hi in row]
            )
    # runs in path order: plain/plain, then runs/naive and runs/slow
    for (traces, layout), want in zip(heatmaps[2:], expected, strict=True):
        spans = [t for t in traces if t.get("name") == "intervals"]
        assert len(spans) == 1 and spans[0]["text"] == want
        assert "cells: value and 95%" in layout["title"]["text"]
    # the run without item records: values alone, no interval anywhere
    for traces, layout in heatmaps[:2]:
        assert [t.get("name") for t in traces[1:]] == ["values"]
        assert "interval" not in layout["title"]["text"]
    # the trajectories' error bars end at the cell intervals
    figures = list(_figures(page).values())
    naive = _document(runs, "naive")
    traj = next(f for f in figures if f[1]["title"]["text"].startswith("acc: per task (error"))
    first = traj[0][0]
    held = naive["intervals"]["matrices"]["acc"]
    for i in range(TASKS):
        value = naive["scores"][i][0]
        assert first["y"][i] + first["error_y"]["array"][i] == pytest.approx(held["high"][i][0])
        assert first["y"][i] - first["error_y"]["arrayminus"][i] == pytest.approx(held["low"][i][0])
        assert first["y"][i] == pytest.approx(value)


def _row(text: str, method: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {method} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def _metric_cells(document: dict[str, Any], digits: int) -> dict[str, str]:
    metrics = document["intervals"]["matrices"]["acc"]["metrics"]
    return {
        key: f"{document['metrics'][key]:.{digits}f} "
        f"[{metrics[key]['low']:.{digits}f}, {metrics[key]['high']:.{digits}f}]"
        for key in ("acc", "bwt", "fwt", "forgetting")
    }


def test_markdown_table_shows_the_single_run_intervals(runs: Path, report: Path) -> None:
    text = (report / "report.md").read_text(encoding="utf-8")
    head = text.split("\n## ")[0]
    for method in ("naive", "slow"):
        cells = _metric_cells(_document(runs, method), 4)
        row = _row(head, method)
        assert row[3:7] == [cells[k] for k in ("acc", "bwt", "fwt", "forgetting")], row
    plain = _document(runs, "plain")
    assert _row(head, "plain")[3] == f"{plain['metrics']['acc']:.4f}"
    assert "a method with one run shows the interval of its test-set noise" in head
    assert "95% paired percentile bootstrap over test items, 300 resamples, seed 1" in head


def test_verbose_table_shows_the_metric_intervals(runs: Path) -> None:
    document = _document(runs, "naive")
    text = format_matrix_table(ContinualResults.load(runs / "runs" / "naive"))
    summary = text.split("\n\n")[0].splitlines()[-1]
    cells = _metric_cells(document, 4)
    for key in ("acc", "bwt", "fwt", "forgetting"):
        assert f"{key}={cells[key]}" in summary
    assert "[low, high]: 95% paired percentile bootstrap over test items" in summary
    plain = format_matrix_table(ContinualResults.load(runs / "plain" / "plain"))
    assert "[" not in plain.split("\n\n")[0].splitlines()[-1]


def test_html_table_shows_the_single_run_intervals(runs: Path, report: Path) -> None:
    page = (report / "report.html").read_text(encoding="utf-8")
    table = page.split("<h2>Metrics per method</h2>")[1].split("</table>")[0]
    rows = re.findall(r"<tr><td>([^<]*)</td>(.*?)</tr>", table)
    found = {m: re.findall(r"<td>(.*?)</td>", cells) for m, cells in rows}
    for method in ("naive", "slow"):
        document = _document(runs, method)
        metrics = document["intervals"]["matrices"]["acc"]["metrics"]
        for k, key in enumerate(("acc", "bwt", "fwt", "forgetting")):
            lo, hi = metrics[key]["low"], metrics[key]["high"]
            assert found[method][2 + k] == (
                f'{document["metrics"][key]:.4f} <span class="interval">[{lo:.4f}, {hi:.4f}]</span>'
            )
    assert found["plain"][2] == f"{_document(runs, 'plain')['metrics']['acc']:.4f}"
    assert "a method with one run shows the interval of its test-set noise" in page


def test_latex_table_shows_the_single_run_intervals(runs: Path, report: Path) -> None:
    tex = (runs / "tex" / "table.tex").read_text(encoding="utf-8")
    for method in ("naive", "slow"):
        document = _document(runs, method)
        metrics = document["intervals"]["matrices"]["acc"]["metrics"]
        line = next(ln for ln in tex.splitlines() if ln.startswith(f"{method} & "))
        for key in ("acc", "bwt", "fwt", "forgetting"):
            lo, hi = metrics[key]["low"], metrics[key]["high"]
            value = re.escape(f"{document['metrics'][key]:.3f}")
            span = re.escape(rf"{{\scriptsize $[{lo:.3f}, {hi:.3f}]$}}")
            assert re.search(rf"\$(\\mathbf{{)?{value}}}?\$\\,{span}", line), key
        held = document["intervals"]["matrices"]["acc"]
        for j in range(TASKS):  # --per-task: the final cells with their Wilson intervals
            low, high = held["low"][-1][j], held["high"][-1][j]
            assert rf"{{\scriptsize $[{low:.3f}, {high:.3f}]$}}" in line
    assert "[low, high] after a value of one run" in tex
    plain = (runs / "report" / "table.tex").read_text(encoding="utf-8")
    line = next(ln for ln in plain.splitlines() if ln.startswith("plain & "))
    assert "scriptsize" not in line


def test_across_seed_tables_carry_the_small_sample_caveat(tmp_path: Path) -> None:
    f64 = torch.float64
    for method, shift in (("naive", 0.0), ("replay", 0.05)):
        for seed in range(3):
            scores = (
                torch.tensor([[0.9, 0.3, 0.2], [0.6, 0.9, 0.3], [0.5, 0.6, 0.9]], dtype=f64)
                + shift
                - 0.01 * seed
            )
            results = ContinualResults.from_tensors(
                {"acc": ScoreMatrix("accuracy", scores, torch.full((3,), 0.33, dtype=f64))},
                metadata={"method": method, "seed": seed},
            )
            results.write(tmp_path / "runs" / method / f"s{seed}")
    out = tmp_path / "report"
    assert report_main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    caveat = "only 3 runs (fewer than 10)"
    section = text.split("## Uncertainty across seeds")[1].split("\n## ")[0]
    tables = re.split(r"\n(?=### |Paired differences of )", section)[1:]
    # ACC, BWT, FWT, forgetting: a summary and a paired table each (intransigence: no value)
    shown = [t for t in tables if not re.match(r"(### |Paired differences of )Intransigence", t)]
    assert len(tables) == 10 and len(shown) == 8
    for part in shown:
        assert caveat in part and "read the Student-t interval instead" in part, part[:200]
    page = (out / "report.html").read_text(encoding="utf-8")
    uncertainty = page.split("<h2>Uncertainty across seeds</h2>")[1].split('<section class="run">')[
        0
    ]
    assert uncertainty.count(f"naive, replay: {caveat}") == 4  # ACC, BWT, FWT, forgetting
    assert "value [low, high]" not in text  # no single run: no single-run note


def test_metric_panels_draw_the_single_run_intervals(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """metrics.png: with one run per method, each bar's error bar is that run's paired-bootstrap
    interval (grey, named in the legend); report.html's panels draw the same ends."""
    from matplotlib.axes import Axes

    drawn: list[tuple[float, float, float, Any]] = []
    errorbar = Axes.errorbar

    def spy(self: Axes, x: Any, y: Any, *args: Any, yerr: Any = None, **kwargs: Any) -> Any:
        if len(y) == 1:  # a metric panel's bar (the trajectories draw whole columns)
            drawn.append((y[0], y[0] - yerr[0][0], y[0] + yerr[1][0], kwargs.get("ecolor")))
        return errorbar(self, x, y, *args, yerr=yerr, **kwargs)

    monkeypatch.setattr(Axes, "errorbar", spy)
    out = tmp_path / "report"
    assert report_main([str(runs / "runs"), "--out", str(out)]) == 0
    expected = []
    for key in ("acc", "bwt", "fwt", "forgetting"):  # panel order, methods in run order
        for method in ("naive", "slow"):
            document = _document(runs, method)
            found = document["intervals"]["matrices"]["acc"]["metrics"][key]
            expected.append((document["metrics"][key], found["low"], found["high"], "tab:gray"))
    assert [d[3] for d in drawn] == [e[3] for e in expected]
    assert [v for d in drawn for v in d[:3]] == pytest.approx(
        [v for e in expected for v in e[:3]], abs=1e-12
    )
    page = (out / "report.html").read_text(encoding="utf-8")
    bars = [t for traces, _ in _figures(page).values() for t in traces if t.get("type") == "bar"]
    ends = [
        (t["y"][0] - t["error_y"]["arrayminus"][0], t["y"][0] + t["error_y"]["array"][0])
        for t in bars
    ]
    by_method = [(e[1], e[2]) for e in expected]
    # the page draws method by method, panel by panel
    order = [by_method[2 * p + m] for m in range(2) for p in range(4)]
    assert [v for e in ends for v in e] == pytest.approx([v for e in order for v in e], abs=1e-12)


@pytest.mark.slow
def test_chromium_draws_the_interval_annotations(runs: Path, report: Path, tmp_path: Path) -> None:
    """Headless Chromium renders report.html without a console message, and Plotly writes each
    cell's interval as text on the heatmaps of the runs with item records."""
    import shutil
    import subprocess

    if shutil.which("chromium") is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    proc = subprocess.run(
        [
            "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
            "--virtual-time-budget=15000", "--dump-dom", (report / "report.html").as_uri(),
        ],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln] == []
    texts = re.findall(r'class="textpoint"[^>]*><text[^>]*>([^<]*)</text>', proc.stdout)
    texts += re.findall(r'<text[^>]*class="textpoint"[^>]*>([^<]*)</text>', proc.stdout)
    expected = [
        _span(v, lo, hi, 3)
        for method in ("naive", "slow")
        for matrix in ("acc", "loss")
        for row in _grid(_document(runs, method), matrix)
        for v, lo, hi in row
    ]
    drawn = [t for t in texts if t.startswith(("[", "±"))]
    assert sorted(drawn) == sorted(expected)

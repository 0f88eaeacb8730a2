"""Every single-run number of ``continual-eval report`` has its interval or a stated reason.

Real runs (``fit_tasks`` on CPU): a class-incremental method with held-out sets, a reference of
scores only and item records (one run), a method of two seeds without item records and a method
of one run without them. Read back from ``report.md``, ``report.html`` and ``summary.csv`` and
compared with the numbers of each run's ``results.json`` (read here as JSON and formatted here):
the per-task BWT / forgetting / FWT / intransigence of ``--per-task`` with
``intervals.matrices.<m>.per_task``; the held-out scores, deltas and worst drops with
``intervals.held_out``; the class-incremental per-class, seen, old and new accuracies with
``intervals.class_incremental``; ``summary.csv``'s ``_lo`` / ``_hi`` with the single-run
intervals and, for two seeds, a Student-t interval computed here; and the reasons of the
``unavailable`` entries under the tables, once each."""

from __future__ import annotations

import csv
import html
import json
import math
import re
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.report import main as report_main

TASKS = 3
CLASSES = [[0, 1], [2, 3], [4, 5]]
REFERENCE = [0.95, 0.9, 0.85]
HELD_OUT = 53
T_975_1 = 12.706204736174707  # t quantile 0.975 with 1 degree of freedom (scipy.stats.t.ppf)


class Blobs(pl.LightningModule):
    def __init__(self, lr: float, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Linear(4, 6)
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _data() -> tuple[list[tuple[TensorDataset, TensorDataset]], TensorDataset]:
    """Three tasks of two classes each (Gaussian blobs), and a held-out set of all classes."""
    g = torch.Generator().manual_seed(0)
    means = torch.randn(6, 4, generator=g) * 2.0

    def sample(classes: list[int], n: int) -> TensorDataset:
        y = torch.tensor(classes)[torch.randint(0, len(classes), (n,), generator=g)]
        return TensorDataset(means[y] + torch.randn(n, 4, generator=g), y)

    tasks = [(sample(c, 48), sample(c, 41 + 6 * j)) for j, c in enumerate(CLASSES)]
    return tasks, sample(list(range(6)), HELD_OUT)


def _fit(path: Path, method: str, seed: int, *, items: bool, kind: str | None = None) -> None:
    """One run; ``kind``: ``"cil"`` (``task_classes`` and a reference of scores only),
    ``"held"`` (a held-out set and a loss matrix beside the accuracy) or ``None``."""
    tasks, held_out = _data()
    extra: dict[str, Any] = {}
    if kind == "cil":
        extra = {"task_classes": CLASSES, "reference": REFERENCE}
    elif kind == "held":
        extra = {
            "held_out_dataloaders": {"general": DataLoader(held_out, batch_size=16)},
            "scorers": {"acc": "accuracy", "loss": "cross_entropy"},
        }
    cb = ContinualEvalCallback(
        [DataLoader(te, batch_size=16) for _, te in tasks],
        dirpath=path,
        verbose=False,
        log_images=False,
        item_records={"resamples": 300, "seed": 2} if items else None,
        metadata={"method": method, "seed": seed},
        **extra,
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
    model = Blobs(0.3 - 0.2 * seed, seed)  # the second seed trains more slowly: other values
    fit_tasks(trainer, model, [DataLoader(tr, batch_size=16) for tr, _ in tasks])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("single_run")
    _fit(root / "runs" / "cil", "cil", 0, items=True, kind="cil")
    _fit(root / "runs" / "held", "held", 0, items=True, kind="held")
    _fit(root / "runs" / "seeds0", "seeds", 0, items=False)
    _fit(root / "runs" / "seeds1", "seeds", 1, items=False)
    _fit(root / "runs" / "bare", "bare", 0, items=False)
    out = root / "report"
    assert report_main([str(root / "runs"), "--out", str(out), "--per-task"]) == 0
    return root


def _document(runs: Path, name: str) -> dict[str, Any]:
    return json.loads((runs / "runs" / name / "results.json").read_text(encoding="utf-8"))


def _text(runs: Path) -> str:
    """report.md as plain text: Markdown's backslash escapes and HTML entities undone."""
    text = (runs / "report" / "report.md").read_text(encoding="utf-8")
    return html.unescape(re.sub(r"\\([^A-Za-z0-9\s])", r"\1", text))


def _page(runs: Path) -> str:
    """report.html with its entities undone (the cells' markup kept)."""
    page = (runs / "report" / "report.html").read_text(encoding="utf-8")
    return page.replace("&#x27;", "'").replace("&quot;", '"')


def _md(value: float, low: float | None = None, high: float | None = None) -> str:
    """A report.md cell as this test expects it: 4 decimals, then ``[low, high]``."""
    text = f"{value + 0.0:.4f}"
    return text if low is None else f"{text} [{low + 0.0:.4f}, {high + 0.0:.4f}]"


def _html(value: float, low: float | None = None, high: float | None = None) -> str:
    text = f"{value + 0.0:.4f}"
    if low is None:
        return text
    return f'{text} <span class="interval">[{low + 0.0:.4f}, {high + 0.0:.4f}]</span>'


def _md_rows(block: str) -> list[list[str]]:
    """The body rows of the markdown tables of ``block`` (header and rule lines left out)."""
    rows = []
    for line in block.splitlines():
        if line.startswith("|") and not re.match(r"\|\s*-", line):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _html_rows(block: str) -> list[list[str]]:
    """The body rows (``<td>`` cells) of the HTML tables of ``block``."""
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", block)]
    return [row for row in rows if row]


def _section(text: str, start: str, end: str = "\n## ") -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


# ------------------------------------------------------------------ per task


def _per_task_expected(document: dict[str, Any], render: Any) -> list[list[str]]:
    """The per-task rows of one run from results.json: task, BWT, forgetting, FWT,
    intransigence; each value with its interval when ``intervals.matrices.acc.per_task`` has
    it; intransigence ``ref[j] - R[j, j]`` computed here."""
    primary = next(iter(document["matrices"]))
    matrix = document["matrices"][primary]
    scores = matrix["scores"]
    held = (document.get("intervals") or {}).get("matrices", {}).get(primary)
    per_task = held["per_task"] if held else {}
    rows = []
    for j in range(TASKS):
        row = [document["task_names"][j]]
        for key, offset in (("bwt", 0), ("forgetting", 0), ("fwt", 1), ("intransigence", 0)):
            k = j - offset
            if key == "intransigence":
                reference = (document.get("reference") or {}).get("scores")
                value = None if reference is None else reference[j] - scores[j][j]
            else:
                stored = matrix["per_task"][key]
                value = stored[k] if 0 <= k < len(stored) else None
            if value is None:
                row.append("—")
                continue
            found = per_task.get(key)
            if found is not None and found["low"][k] is not None:
                assert found["estimate"][k] == pytest.approx(value, abs=1e-9)
                row.append(render(value, found["low"][k], found["high"][k]))
            else:
                row.append(render(value))
        rows.append(row)
    return rows


def test_per_task_tables_show_the_per_task_intervals(runs: Path) -> None:
    document = _document(runs, "cil")
    assert document["reference"]["scores"] == REFERENCE
    assert "intransigence" in document["intervals"]["matrices"]["acc"]["unavailable"]
    section = _section(_text(runs), "## Per-task metrics\n")
    found = re.finditer(r"\*\*(\w+)\*\* \(.*?\n(.*?)(?=\n\*\*|\Z)", section, re.S)
    tables = {m.group(1): m.group(2) for m in found}
    expected = _per_task_expected(document, _md)
    assert _md_rows(tables["cil"])[1:] == expected
    # intervals on the BWT, forgetting and FWT cells; intransigence: its reason once
    assert sum("[" in c for row in expected for c in row) == 2 + 2 + 2
    reason = document["intervals"]["matrices"]["acc"]["unavailable"]["intransigence"]
    assert tables["cil"].count(reason) == 1
    # two seeds: mean ± std of the two runs' values, no interval
    seeds = [_document(runs, f"seeds{k}")["matrices"]["acc"]["per_task"]["bwt"] for k in (0, 1)]
    row = _md_rows(tables["seeds"])[1]
    mean = (seeds[0][0] + seeds[1][0]) / 2
    std = abs(seeds[0][0] - seeds[1][0]) / math.sqrt(2)
    assert row[1] == f"{mean:.4f} ± {std:.4f}"
    assert "no per-item records" in tables["bare"]
    # report.html: the same rows
    page = _page(runs)
    block = page.split("<h2>Per-task metrics</h2>")[1].split("<h3>cil")[1].split("</table>")[0]
    assert _html_rows(block) == _per_task_expected(document, _html)


# ------------------------------------------------------------------ held out


def _held_out_expected(document: dict[str, Any], matrix: str, render: Any) -> list[list[str]]:
    """Per evaluation (baseline, after each task): the set's score and its delta with their
    intervals from ``intervals.held_out``."""
    scores = document["held_out"]["matrices"][matrix]
    held = document["intervals"]["held_out"][matrix]
    base = scores["baseline"][0]
    rows = [["baseline", render(base, held["baseline_low"][0], held["baseline_high"][0]), "—"]]
    for i, row in enumerate(scores["scores"]):
        delta = held["delta"]
        assert delta["estimate"][i][0] == pytest.approx(row[0] - base, abs=1e-12)
        rows.append(
            [
                f"after {document['task_names'][i]}",
                render(row[0], held["low"][i][0], held["high"][i][0]),
                render(row[0] - base, delta["low"][i][0], delta["high"][i][0]),
            ]
        )
    return rows


def _held_out_final(document: dict[str, Any], matrix: str, render: Any) -> list[str]:
    scores = document["held_out"]["matrices"][matrix]
    held = document["intervals"]["held_out"][matrix]
    base, final = scores["baseline"][0], scores["scores"][-1][0]
    worst = held["worst_drop"]
    return [
        "general",
        render(base, held["baseline_low"][0], held["baseline_high"][0]),
        render(final, held["low"][-1][0], held["high"][-1][0]),
        render(final - base, held["delta"]["low"][-1][0], held["delta"]["high"][-1][0]),
        render(worst["estimate"][0], worst["low"][0], worst["high"][0]),
    ]


def test_held_out_tables_show_score_delta_and_worst_drop_intervals(runs: Path) -> None:
    document = _document(runs, "held")
    matrices = list(document["held_out"]["matrices"])
    assert matrices == ["acc", "loss"]
    text = _section(_text(runs), "### Held-out sets\n", "\n### ")
    page = _page(runs).split("<h3>Held-out sets</h3>")[1].split("</section>")[0]
    for name in matrices:
        part = text.split(f"**{name}**")[1].split("\n**")[0]
        rows = _md_rows(part)
        assert rows[1] == _held_out_final(document, name, _md)
        assert rows[3:] == _held_out_expected(document, name, _md)
        html = page.split(f"<h4>{name} (")[1].split("<h4>")[0]
        tables = html.split("</table>")
        assert _html_rows(tables[0])[0] == _held_out_final(document, name, _html)
        assert _html_rows(tables[1]) == _held_out_expected(document, name, _html)
    assert "paired bootstrap over each set's items for delta and worst drop" in text


# ------------------------------------------------------------------ class-incremental


def _class_il_expected(document: dict[str, Any], render: Any) -> tuple[list[list[str]], ...]:
    """The per-stage seen / old / new rows and the per-class rows after the last stage, from
    ``intervals.class_incremental`` (Wilson) and the ``class_incremental`` section."""
    wilson = document["intervals"]["class_incremental"]
    section = document["class_incremental"]

    def shown(part: dict[str, Any], i: int, value: float | None) -> str:
        if value is None:
            return "—" if render is _html else "n/a"
        assert part["estimate"][i] == pytest.approx(value, abs=1e-12)
        return render(value, part["low"][i], part["high"][i])

    stages = [
        [
            f"after {document['task_names'][i]}",
            shown(wilson["seen_accuracy"], i, section["seen_accuracy"]["sample"][i]),
            shown(wilson["old_accuracy"], i, section["old_accuracy"]["sample"][i]),
            shown(wilson["new_accuracy"], i, section["new_accuracy"][i]),
        ]
        for i in range(TASKS)
    ]
    last = TASKS - 1
    per_class = []
    row = wilson["per_class_accuracy"]
    for task, classes in enumerate(CLASSES):
        for c in classes:
            value = section["per_class_accuracy"][last][c]
            per_class.append(
                [
                    f"{c} ({document['task_names'][task]})",
                    str(section["test_samples"][c]),
                    render(value, row["low"][last][c], row["high"][last][c]),
                ]
            )
    return stages, per_class


def test_class_incremental_tables_show_the_wilson_intervals(runs: Path) -> None:
    document = _document(runs, "cil")
    stages, per_class = _class_il_expected(document, _md)
    text = _section(_text(runs), "### Class-incremental evaluation\n", "\n![")
    parts = text.split("**")
    by_title = {parts[k]: parts[k + 1] for k in range(1, len(parts) - 1, 2)}
    assert _md_rows(by_title["Seen / old / new accuracy per stage (sample-weighted)"])[1:] == stages
    classes = by_title[f"Per-class accuracy after stage {TASKS - 1} (arrival order)"]
    assert _md_rows(classes)[1:] == per_class
    final = dict((r[0], r[1]) for r in _md_rows(by_title["Final measures"])[1:])
    wilson = document["intervals"]["class_incremental"]
    seen = wilson["seen_accuracy"]
    last = (seen["estimate"][-1], seen["low"][-1], seen["high"][-1])
    assert final["last acc (sample)"] == _md(*last)
    acc = document["intervals"]["matrices"]["acc_task_agnostic"]["metrics"]["acc"]
    assert final["task-agnostic acc"] == _md(acc["estimate"], acc["low"], acc["high"])
    # the measures read from each item's class: the paired bootstrap; the prediction share:
    # Wilson; only the sample share (the test sets' own composition) has none, said once
    paired = wilson["paired"]["metrics"]
    for title, key in (
        ("AMCA", "amca"),
        ("class forgetting", "mean_class_forgetting"),
        ("avg inc acc (sample)", "average_incremental_accuracy_sample"),
    ):
        got = paired[key]
        assert final[title] == _md(got["estimate"], got["low"], got["high"]), title
    share = wilson["recency_prediction_share"]
    assert final["newest-task prediction share"] == _md(
        share["estimate"][-1], share["low"][-1], share["high"][-1]
    )
    assert set(wilson["unavailable"]) == {"recency_sample_share"}
    assert text.count("- newest-task sample share: no interval: ") == 1
    # report.html
    stages, per_class = _class_il_expected(document, _html)
    page = _page(runs).split("<h3>Class-incremental evaluation</h3>")[1].split("<h3>")[0]
    tables = page.split("</table>")
    assert _html_rows(tables[1]) == stages
    assert _html_rows(tables[2]) == per_class
    assert "class forgetting: no interval" not in page


def test_class_incremental_summary_shows_the_single_run_intervals(runs: Path) -> None:
    document = _document(runs, "cil")
    text = _section(_text(runs), "## Class-incremental evaluation\n")
    row = next(r for r in _md_rows(text) if r[0] == "cil")
    wilson = document["intervals"]["class_incremental"]
    new = wilson["new_accuracy"]
    assert row[2 + 7] == _md(new["estimate"][-1], new["low"][-1], new["high"][-1])  # new acc
    share = wilson["recency_prediction_share"]
    assert row[2 + 10] == _md(share["estimate"][-1], share["low"][-1], share["high"][-1])
    page = _page(runs).split("<h2>Class-incremental evaluation</h2>")[1].split("<h2>")[0]
    cells = next(r for r in _html_rows(page) if r[0] == "cil")
    assert cells[2 + 7] == _html(new["estimate"][-1], new["low"][-1], new["high"][-1])
    old = wilson["old_accuracy"]
    assert cells[2 + 6] == _html(old["estimate"][-1], old["low"][-1], old["high"][-1])
    assert cells[2 + 10] == _html(share["estimate"][-1], share["low"][-1], share["high"][-1])


# ------------------------------------------------------------------ summary.csv, notes


def test_summary_csv_has_lo_hi_columns(runs: Path) -> None:
    with open(runs / "report" / "summary.csv", encoding="utf-8") as file:
        rows = {r["method"]: r for r in csv.DictReader(file)}
    document = _document(runs, "cil")
    metrics = document["intervals"]["matrices"]["acc"]["metrics"]
    for key in ("acc", "bwt", "fwt", "forgetting"):
        assert float(rows["cil"][f"{key}_lo"]) == pytest.approx(metrics[key]["low"], abs=1e-12)
        assert float(rows["cil"][f"{key}_hi"]) == pytest.approx(metrics[key]["high"], abs=1e-12)
    assert rows["cil"]["intransigence_lo"] == "" and rows["cil"]["intransigence_mean"] != ""
    assert rows["bare"]["acc_lo"] == "" and rows["bare"]["acc_hi"] == ""
    # two seeds: the Student-t interval of the mean, mean -/+ t(0.975, 1) * std / sqrt(2)
    values = [_document(runs, f"seeds{k}")["metrics"]["acc"] for k in (0, 1)]
    mean = sum(values) / 2
    half = T_975_1 * abs(values[0] - values[1]) / math.sqrt(2) / math.sqrt(2)
    assert float(rows["seeds"]["acc_lo"]) == pytest.approx(mean - half, abs=1e-9)
    assert float(rows["seeds"]["acc_hi"]) == pytest.approx(mean + half, abs=1e-9)


def test_values_without_an_interval_state_the_reason_once(runs: Path) -> None:
    document = _document(runs, "cil")
    reason = document["intervals"]["matrices"]["acc"]["unavailable"]["intransigence"]
    head = _text(runs).split("\n## ")[0]
    notes = head.split("Values of one run printed without an interval, and why:")[1]
    assert notes.count(reason) == 1
    assert "Intransigence: no interval (cil):" in notes
    assert "ACC, BWT, FWT, Forgetting: no interval (bare): the run has no per-item" in notes
    assert "seeds" not in notes  # two runs: ± and the intervals across seeds
    page = _page(runs).split("<h2>Metrics per method</h2>")[1].split("<h2>")[0]
    assert page.count(reason) == 1
    cost = _section(_text(runs), "## Cost\n")
    assert document["intervals"]["unavailable"]["cost"] in cost


def test_latex_table_states_why_a_value_has_no_interval(runs: Path) -> None:
    tex = (runs / "report" / "table.tex").read_text(encoding="utf-8")
    note = next(line for line in tex.splitlines() if "without an interval:" in line)
    assert tex.index(note) > tex.index("\\end{tabular}")
    assert (
        "ACC, BWT, FWT, Forgetting: no interval (bare): the run has no per-item records "
        "(item\\_records= not set)" in note
    )
    assert "Intransigence: no interval (cil): the reference" in note
    assert "per task (bare): the run has no per-item records" in note  # --per-task's cells
    assert "seeds)" not in note  # two runs: mean ± std
    bare = next(line for line in tex.splitlines() if line.startswith("bare & "))
    cil = next(line for line in tex.splitlines() if line.startswith("cil & "))
    assert "scriptsize" not in bare and cil.count("scriptsize") == 4 + TASKS

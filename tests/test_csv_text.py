"""The package's CSV writer reads back cell for cell with Python's csv reader (an independent
parser), also for names holding a carriage return or a newline (a bare ``\\r`` left unquoted split
the row: ``continual-eval report`` then failed reading its own seed_statistics.csv)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import torch

from continual_eval._csv import csv_text
from continual_eval.report import main as report_main
from continual_eval.results import ContinualResults, ScoreMatrix

NAMES = ["\rcmd", "a\rb", "a\nb", "a\r\nb", "\tx", "plain", 'q"uote', "c,omma", ""]


def test_cells_with_line_breaks_read_back() -> None:
    text = csv_text(["name", "value"], [[name, 0.5] for name in NAMES])
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[0] == ["name", "value"] and len(rows) == len(NAMES) + 1
    expected = [("'" + n if n[:1] in ("\r", "\t") else n) for n in NAMES]
    assert [row[0] for row in rows[1:]] == expected
    assert all(row[1] == "0.5" for row in rows[1:])
    assert text.endswith("0.5\n") and "\r\n0.5" not in text  # rows end in "\n"


def test_one_empty_cell_row_is_kept() -> None:
    assert list(csv.reader(io.StringIO(csv_text(["a"], [[""]]), newline=""))) == [["a"], [""]]


def test_report_with_a_carriage_return_in_a_method_name(tmp_path: Path) -> None:
    R = torch.tensor([[0.9, 0.4], [0.6, 0.95]], dtype=torch.float64)
    b = torch.tensor([0.5, 0.48], dtype=torch.float64)
    for k, method in enumerate(["\rx cmd", "a\rb"]):
        for seed in (0, 1):
            ContinualResults.from_tensors(
                {"acc": ScoreMatrix("accuracy", R - 0.01 * (k + seed), b)},
                metadata={"method": method, "seed": seed},
            ).write(tmp_path / "runs" / f"m{k}" / f"s{seed}")
    out = tmp_path / "report"
    assert report_main([str(tmp_path / "runs"), "--out", str(out), "--resamples", "50"]) == 0
    with open(out / "summary.csv", newline="", encoding="utf-8") as fh:
        methods = sorted(row[0] for row in list(csv.reader(fh))[1:])
    assert methods == ["'\rx cmd", "a\rb"]

"""Hostile names (methods, tasks, matrices, scores) in every output of ``continual-eval report``:
each CSV cell that a spreadsheet would run as a formula is neutralised (OWASP: a leading ``'``),
report.md renders them as text (Python-Markdown), report.html shows them as text (its tables read
back with ``html.parser``; no tag of theirs in the page), and table.tex prints them literally
(the cells read back by an independent un-escaper, and compiled where pdflatex is installed)."""

from __future__ import annotations

import csv
import html
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import markdown
import pytest
import torch

from continual_eval.report import main as report_main
from continual_eval.results import ContinualResults, ScoreMatrix

FORMULA = '=HYPERLINK("http://evil.test/x","click")'
METHODS = [
    FORMULA,
    "a | b <script>alert(1)</script>",
    "\\textbf{bold 50% & under_score",
    "-1+2",
    "@SUM(A1)",
]
TASKS = ["t_0 | <b>x</b>", "\\textbf{", "100% & $#~^"]
MATRIX = "<img src=x onerror=alert(2)>"
SCORE = "=cmd|' /C calc'!A0"
R = [[0.9, 0.4, 0.3], [0.6, 0.95, 0.45], [0.5, 0.6, 0.97]]
BASELINE = [0.5, 0.48, 0.52]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("hostile")
    for k, method in enumerate(METHODS):
        for seed in (0, 1):
            shift = 0.01 * (k + seed)
            matrices = {
                "acc": ScoreMatrix(
                    "accuracy",
                    torch.tensor(R, dtype=torch.float64) - shift,
                    torch.tensor(BASELINE, dtype=torch.float64),
                ),
                MATRIX: ScoreMatrix(
                    SCORE,
                    torch.tensor(R, dtype=torch.float64) + shift,
                    torch.tensor(BASELINE, dtype=torch.float64),
                    higher_is_better=False,
                    bounds=None,
                ),
            }
            results = ContinualResults.from_tensors(
                matrices, task_names=TASKS, metadata={"method": method, "seed": seed}
            )
            results.write(tmp_path / "runs" / f"m{k}" / f"version_{seed}")
    out = tmp_path / "report"
    assert report_main([str(tmp_path / "runs"), "--out", str(out), "--per-task"]) == 0
    return out


def neutral(cell: str) -> bool:
    """What a spreadsheet reads as data: not starting with a formula character, or a number."""
    return not cell.startswith(("=", "+", "-", "@", "\t", "\r")) or bool(
        re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", cell)
    )


@pytest.mark.parametrize("name", ["summary.csv", "seed_statistics.csv", "paired_differences.csv"])
def test_csv_cells_are_neutralised(report: Path, name: str) -> None:
    with open(report / name, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    cells = [c for row in rows for c in row]
    assert all(neutral(c) for c in cells), [c for c in cells if not neutral(c)]
    header = rows[0]
    for column in ["method"] if name != "paired_differences.csv" else ["method_a", "method_b"]:
        shown = {row[header.index(column)] for row in rows[1:]}
        expected = {("'" + m if m[0] in "=+-@" else m) for m in METHODS}
        assert shown == expected if name != "paired_differences.csv" else shown <= expected


def test_markdown_shows_the_names_as_text(report: Path) -> None:
    text = (report / "report.md").read_text(encoding="utf-8")
    page = markdown.markdown(text, extensions=["tables"])
    parser = _Cells()
    parser.feed(page)
    allowed = {"h1", "h2", "h3", "p", "code", "strong", "table", "thead", "tbody", "tr", "th"}
    allowed |= {"td", "img", "ul", "li"}  # the report's own markup; no name adds a tag
    assert set(parser.tags) <= allowed, set(parser.tags) - allowed
    sources = re.findall(r'<img[^>]*src="([^"]*)"', page)
    assert sources and all((report / src).is_file() for src in sources)  # local PNGs only
    first = re.search(r"<table>.*?</table>", page, flags=re.S).group(0)
    rows = re.findall(r"<tr>.*?</tr>", first, flags=re.S)
    shown = [
        re.sub(r"\\([:$~=])", r"\1", html.unescape(re.sub(r"<[^>]+>", "", c)).strip())
        for c in (re.findall(r"<td[^>]*>(.*?)</td>", r, flags=re.S)[0] for r in rows[1:])
    ]
    assert shown == METHODS  # Python-Markdown shows CommonMark's escapes of :$~= verbatim


class _Cells(HTMLParser):
    """Text of every ``<td>``/``<th>`` and the tags met outside scripts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.cells: list[str] = []
        self.tags: list[str] = []
        self._cell: list[str] | None = None
        self._script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag in ("td", "th"):
            self._cell = []
        self._script = tag == "script"

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.cells.append("".join(self._cell))
            self._cell = None
        if tag == "script":
            self._script = False

    def handle_data(self, data):
        if self._cell is not None and not self._script:
            self._cell.append(data)


def test_html_shows_the_names_as_text(report: Path) -> None:
    page = (report / "report.html").read_text(encoding="utf-8")
    parser = _Cells()
    parser.feed(page)
    assert set(parser.tags) <= {
        "html",
        "head",
        "meta",
        "title",
        "style",
        "script",
        "body",
        "h1",
        "h2",
        "h3",
        "h4",  # a run's held-out sets and class-incremental tables, per matrix
        "p",
        "code",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
        "div",
        "section",
        "ul",  # the small-sample caveats under a table
        "li",
        "span",  # a single run's interval
    }, set(parser.tags)
    for method in METHODS:
        assert parser.cells.count(method) == 1 + 5  # the summary and each metric's statistics
    for task in TASKS:
        # two matrix tables per run, and a row of each method's per-task table (--per-task)
        assert parser.cells.count(task) == 2 * len(METHODS) * 2 + len(METHODS)
    # in the figures' JSON every name is HTML-escaped (Plotly reads tags in labels)
    scripts = re.findall(r"<script>(.*?)</script>", page, flags=re.S)
    figures = "".join(s for s in scripts if "Plotly.newPlot" in s and len(s) < 1_000_000)
    assert "\\u003cscript\\u003e" not in figures and "\\u003cb\\u003e" not in figures
    assert "&lt;script&gt;alert(1)&lt;\\u002fscript&gt;" in figures


_LATEX_UNESCAPE = [
    (r"\textbackslash{}", "\\"),
    (r"\textasciicircum{}", "^"),
    (r"\textasciitilde{}", "~"),
    (r"\textless{}", "<"),
    (r"\textgreater{}", ">"),
    (r"\textbar{}", "|"),
    (r"\textquotesingle{}", "'"),
    (r"\textquotedbl{}", '"'),
    (r"\textasciigrave{}", "`"),
    ("{[}", "["),
    ("{]}", "]"),
    ("{*}", "*"),
    ("-{}", "-"),
]


def unlatex(text: str) -> str:
    """The text LaTeX prints for escaped ``text`` (an independent inverse of the escaping)."""
    for escaped, plain in _LATEX_UNESCAPE:
        text = text.replace(escaped, "\0" + plain + "\0")
    text = re.sub(r"\\([{}$&#%_])", r"\1", text)
    return text.replace("\0", "")


def test_latex_prints_the_names_and_compiles(report: Path, tmp_path: Path) -> None:
    tex = (report / "table.tex").read_text(encoding="utf-8")
    body = tex.split("\\midrule\n")[1].split("\\bottomrule")[0].strip().split("\n")
    rows = [re.split(r"(?<!\\)&", line.removesuffix(" \\\\")) for line in body]
    assert all(len(r) == 2 + 5 + len(TASKS) for r in rows)  # no name adds a column
    assert [unlatex(r[0].strip()) for r in rows] == METHODS
    header = next(line for line in tex.split("\n") if line.startswith("Method & "))
    cells = re.split(r"(?<!\\)&", header.removesuffix(" \\\\"))
    assert [unlatex(c.strip()).removesuffix(" $\\uparrow$") for c in cells[-3:]] == TASKS
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed")
    (tmp_path / "doc.tex").write_text(
        "\\documentclass{article}\n\\usepackage[T1]{fontenc}\n\\usepackage[landscape]{geometry}"
        f"\n\\usepackage{{booktabs}}\n\\begin{{document}}\n\\input{{{report / 'table.tex'}}}\n"
        "\\end{document}\n",
        encoding="utf-8",
    )
    proc = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    if shutil.which("mutool") is None:
        return
    text = subprocess.run(
        ["mutool", "draw", "-F", "txt", str(tmp_path / "doc.pdf")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    flat = re.sub(r"\s+", "", text)
    for name in METHODS[1:3]:
        assert re.sub(r"\s+", "", name) in flat, name

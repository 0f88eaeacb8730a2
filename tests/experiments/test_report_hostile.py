"""``continual-eval report`` on hostile results.json files: a malformed field stops it with exit
code 2 and one line naming the file and the field (no traceback: checked in a subprocess with a
10 MB task name, refused in bounded time and memory), and names that look like Markdown/HTML
stay text in report.md (rendered here with the Markdown package) and in the pictures."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import markdown
import pytest
import torch

from continual_eval.report import main as report_main
from continual_eval.results import ContinualResults, ScoreMatrix

R3 = [[0.9, 0.4, 0.3], [0.6, 0.95, 0.45], [0.5, 0.6, 0.97]]
BASELINE = [0.5, 0.48, 0.52]


def results_doc(task_names: list[str] | None = None, **metadata: Any) -> dict[str, Any]:
    matrix = ScoreMatrix(
        "accuracy",
        torch.tensor(R3, dtype=torch.float64),
        torch.tensor(BASELINE, dtype=torch.float64),
    )
    results = ContinualResults.from_tensors(
        {"acc": matrix}, task_names=task_names, metadata=metadata
    )
    return results.to_dict()


def write_run(run: Path, doc: dict[str, Any]) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "results.json").write_text(json.dumps(doc), encoding="utf-8")
    return run


BAD = [
    (lambda d: d["scores"][2].__setitem__(1, "0.6"), "scores[2][1]"),
    (lambda d: d.__setitem__("num_tasks", "3"), "num_tasks"),
    (lambda d: d.__setitem__("stages_completed", 7), "stages_completed"),
    (lambda d: d["task_names"].pop(), "task_names"),
    (lambda d: d.pop("metrics"), "metrics"),
    (lambda d: d["metrics"].__setitem__("acc", [0.5]), "metrics.acc"),
    (lambda d: d.__setitem__("metadata", ["naive"]), "metadata"),
    (lambda d: d["metadata"].__setitem__("reference", ["x", 1, 1]), "metadata.reference[0]"),
    (lambda d: d["metadata"].__setitem__("reference", 0.9), "metadata.reference"),
    (lambda d: d["metadata"].__setitem__("seed", {"s": 1}), "metadata.seed"),
    (lambda d: d.__setitem__("baseline", None), "baseline"),
]


@pytest.mark.parametrize(("mutate", "field"), BAD)
def test_malformed_field_exit_2(tmp_path: Path, capsys, mutate: Any, field: str) -> None:
    good = write_run(tmp_path / "good", results_doc(method="naive", seed=0))
    doc = results_doc(method="naive", seed=1)
    mutate(doc)
    bad = write_run(tmp_path / "bad", doc)
    out = tmp_path / "report"
    assert report_main([str(good), str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    problem = "missing" if field == "metrics" else "expected "
    assert f"continual-eval report: {bad / 'results.json'}: {field}: {problem}" in err
    assert not out.exists()  # nothing half-written


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"metadata": {"a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}}", "nested too deeply"),
        (b'{"format_version": 1, "num_tasks": NaN}', "NaN"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"format_version": 1, "num_tasks": 3', "not valid JSON"),
    ],
)
def test_unparsable_file_exit_2(tmp_path: Path, capsys, content: bytes, problem: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_bytes(content)
    assert report_main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(run / "results.json") in err and problem in err


#: runs the real CLI and reports its own peak resident memory on stderr: VmHWM of
#: /proc/self/status (the peak since the exec); ``ru_maxrss`` only where there is none, as on
#: Linux it also counts the starting process's resident set at the fork (a pytest-xdist worker
#: that had run other tests: 3.7 GB once)
RSS_WRAPPER = (
    "import re, resource, sys\n"
    "from continual_eval.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "try:\n"
    "    with open('/proc/self/status') as f:\n"
    "        peak = int(re.search(r'^VmHWM:\\s*(\\d+) kB', f.read(), re.M).group(1))\n"
    "except (OSError, AttributeError):\n"
    "    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "print(f'peak_rss_kb={peak}', file=sys.stderr)\n"
    "sys.exit(code)\n"
)


@pytest.mark.slow
def test_huge_task_name_bounded(tmp_path: Path) -> None:
    """A 10 MB task name once ran past 300 s and 5.8 GB: now refused within seconds."""
    huge = "A" * 10_000_000
    run = write_run(tmp_path / "run", results_doc(["t0", huge, "t2"], method="naive"))
    proc = subprocess.run(
        [sys.executable, "-c", RSS_WRAPPER, "report", str(run)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and len(lines) == 2  # the message and the RSS line
    assert lines[0] == (
        f"continual-eval report: {run / 'results.json'}: task_names[1]: expected a string of at "
        "most 200 characters, found string of 10000000 characters"
    )
    peak_mb = int(lines[1].removeprefix("peak_rss_kb=")) / 1024
    assert peak_mb < 1500, peak_mb  # importing torch and reading 10 MB: a few hundred MB
    assert not (run / "report").exists()


HOSTILE_METHOD = "<script>alert(1)</script>"
HOSTILE_TASKS = [
    "![pixel](http://evil.test/p.png)",
    "# Owned\n## second heading",
    "a | b | c",
    r"$\foo{$",  # invalid mathtext: matplotlib raised ValueError while saving
]


def cells(row_html: str) -> list[str]:
    """Visible text of each cell of an HTML table row. Python-Markdown shows CommonMark's escapes
    of ":", "$" and "~" verbatim; they are dropped here."""
    found = re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row_html, flags=re.S)
    text = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in found]
    return [re.sub(r"\\([:$~])", r"\1", t) for t in text]


def test_names_escaped_in_report(tmp_path: Path) -> None:
    runs = [
        write_run(
            tmp_path / f"v{seed}",
            results_doc(HOSTILE_TASKS[:3] if seed else HOSTILE_TASKS[1:], method=m, seed=seed),
        )
        for seed, m in enumerate([HOSTILE_METHOD, "<img src=http://evil.test/i.png>"])
    ]
    out = tmp_path / "report"
    assert report_main([str(r) for r in runs] + ["--out", str(out)]) == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    page = markdown.markdown(text, extensions=["tables"])
    assert "<script" not in page
    images = re.findall(r"<img[^>]*>", page)
    sources = [re.search(r'src="([^"]*)"', tag).group(1) for tag in images]
    assert sources and all((out / src).is_file() for src in sources), sources  # local PNGs only
    # the uncertainty section is one more heading; per metric a summary and a paired table
    assert page.count("<h1>") == 1 and page.count("<h2>") == len(runs) + 1
    assert page.count("<h3>") == 5
    tables = re.findall(r"<table>.*?</table>", page, flags=re.S)
    assert len(tables) == 1 + 2 * 5 + len(runs)  # overview, statistics, one matrix per run
    methods = [HOSTILE_METHOD, "<img src=http://evil.test/i.png>"]
    summary_rows = [cells(r) for r in re.findall(r"<tr>.*?</tr>", tables[0], flags=re.S)]
    assert all(len(r) == 8 for r in summary_rows)
    assert [r[0] for r in summary_rows[1:]] == methods
    for number, table in enumerate(tables[1:11]):
        rows = [cells(r) for r in re.findall(r"<tr>.*?</tr>", table, flags=re.S)]
        if number % 2 == 0:  # the metric's summary: one row per method
            assert all(len(r) == 6 for r in rows) and [r[0] for r in rows[1:]] == methods
        else:  # the paired differences: one row per pair
            assert all(len(r) == 8 for r in rows) and [r[0] for r in rows[1:]] == [
                f"{methods[0]} - {methods[1]}"
            ]
    for table, names in zip(tables[11:], [HOSTILE_TASKS[1:], HOSTILE_TASKS[:3]], strict=True):
        rows = [cells(r) for r in re.findall(r"<tr>.*?</tr>", table, flags=re.S)]
        assert all(len(r) == 4 for r in rows)  # "a | b | c" is one cell
        assert rows[0][1:] == [n.replace("\n", "\\n") for n in names]
    assert len(list(out.glob("*_matrix.png"))) == len(runs)  # mathtext names drew


def test_long_legal_names(tmp_path: Path) -> None:
    """Experiment and method of 200 characters each: the picture names stay short."""
    name = "m" * 200
    run = write_run(
        tmp_path / "run", results_doc(["x" * 200, "y", "z"], experiment=name, method=name)
    )
    assert report_main([str(run), "--out", str(tmp_path / "out")]) == 0
    pngs = sorted(p.name for p in (tmp_path / "out").glob("*.png"))
    assert len(pngs) == 3 and all(len(p) < 120 for p in pngs)


def test_many_tasks_bounded_pictures(tmp_path: Path) -> None:
    """T = 150 (figures once grew 0.6 inch per task: 11000 x 9000 pixels, tens of seconds)."""
    import matplotlib.image as mpimg

    T = 150
    g = torch.Generator().manual_seed(0)
    matrix = ScoreMatrix(
        "accuracy",
        torch.rand(T, T, generator=g, dtype=torch.float64),
        torch.rand(T, generator=g, dtype=torch.float64),
    )
    doc = ContinualResults.from_tensors({"acc": matrix}, metadata={"method": "naive"}).to_dict()
    run = write_run(tmp_path / "run", doc)
    assert report_main([str(run), "--out", str(tmp_path / "out")]) == 0
    pngs = list((tmp_path / "out").glob("*.png"))
    assert len(pngs) == 3
    for png in pngs:
        height, width, _ = mpimg.imread(png).shape
        assert max(height, width) <= 16 * 120  # MAX_FIGURE_INCHES at the report's dpi


def test_matrix_names_and_scores_escaped(tmp_path: Path) -> None:
    """A version-2 file whose matrix name and score look like HTML/Markdown: text in the table."""
    doc = results_doc(method="naive", seed=0)
    section = dict(doc["matrices"]["acc"])
    section["score"] = "<script>alert(2)</script>"
    doc["matrices"]["[x](http://evil.test)"] = section
    run = write_run(tmp_path / "run", doc)
    out = tmp_path / "report"
    assert report_main([str(run), "--out", str(out)]) == 0
    page = markdown.markdown((out / "report.md").read_text(encoding="utf-8"), extensions=["tables"])
    assert "<script" not in page
    assert 'href="http://evil.test"' not in page
    visible = re.sub(r"\\([:$~])", r"\1", html.unescape(re.sub(r"<[^>]+>", "", page)))
    assert "[x](http://evil.test) (<script>alert(2)</script>)" in visible


@pytest.mark.parametrize("methods", [("naive", "naive"), ("naive", "ewc")])
def test_mixed_seed_label_types_exit_2_naming_them(tmp_path: Path, capsys, methods) -> None:
    """``seed: 0`` beside ``seed: "zero"`` (one method or two): seeds are matched by value and
    type, so the report refuses them, naming both labels and their files."""
    a = write_run(tmp_path / "a", results_doc(method=methods[0], seed=0))
    b = write_run(tmp_path / "b", results_doc(method=methods[1], seed="zero"))
    out = tmp_path / "report"
    assert report_main([str(a), str(b), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"continual-eval report: {b / 'results.json'}: metadata.seed: " in err
    assert f"0 (int, {a / 'results.json'}), 'zero' (str, {b / 'results.json'})" in err
    assert not out.exists()

"""Issue 9 item 14: malformed input is a clear error with exit code 2, never a traceback.

Each case runs the real command (``main(argv)``, and one through a subprocess) and checks the
exit code and that the message names the file, the line where there is one, and the problem.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from continual_eval.stream import EpisodeTrace, write_jsonl
from continual_eval.stream.cli import main

ROOT = Path(__file__).resolve().parents[2]
GOOD = '{"step": 0, "reward": 0.5, "regime_id": "a"}'
DEEP = "[" * 100_000 + "]" * 100_000


def write_lines(tmp_path: Path, *lines: str, name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


BAD_LINES = [
    # (second line, words the message must contain)
    ('{"step": 1, "reward": 0.5, "regime_id": "a", "components": [1, 2]}', ["components"]),
    ('{"step": 1e23, "reward": 0.5, "regime_id": "a"}', ["step"]),
    ('{"step": 100000000000000000000000, "reward": 0.5, "regime_id": "a"}', ["step"]),
    ('{"step": -9223372036854775809, "reward": 0.5, "regime_id": "a"}', ["step"]),
    ('{"step": 1, "reward": 1e400, "regime_id": "a"}', ["reward"]),
    (DEEP, ["object", "array"]),
    ('{"step": 1, "reward": 0.5, "regime_id": "a", "components": {"x": ' + DEEP + "}}", ["x"]),
    ('{"step": 1, "reward": 0.5, "regime_id": "a", "extra": ' + DEEP + "}", ["extra"]),
    ("null", ["object", "null"]),
    ("[1, 2]", ["object", "array"]),
    ('"step"', ["object", "str"]),
    ("17", ["object", "int"]),
    (
        '{"step": 1, "reward": 0.5, "regime_id": "a"} {"step": 2, "reward": 0.5, "regime_id": "a"}',
        ["not valid JSON"],
    ),
    ('{"step": 1, "reward": NaN, "regime_id": "a"}', ["reward", "NaN", "finite"]),
    ('{"step": 1, "reward": 0.5', ["not valid JSON"]),
]


@pytest.mark.parametrize(("line", "words"), BAD_LINES, ids=lambda v: str(v)[:40])
def test_bad_line_is_rc2_naming_file_and_line(tmp_path, capsys, line, words):
    path = write_lines(tmp_path, GOOD, line)
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("continual-eval stream: error: ") and "Traceback" not in err
    assert "t.jsonl:2:" in err
    for word in words:
        assert word in err, err


def test_decreasing_step_names_the_line(tmp_path, capsys):
    path = write_lines(tmp_path, GOOD, '{"step": 5, "reward": 0.5, "regime_id": "a"}', "", GOOD)
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "t.jsonl:4:" in err and "step 0" in err and "step 5" in err


def test_empty_file_and_missing_file(tmp_path, capsys):
    empty = write_lines(tmp_path, "", "  ", name="empty.jsonl")
    assert main([str(empty)]) == 2
    assert "empty.jsonl" in capsys.readouterr().err
    assert main([str(tmp_path / "absent.jsonl")]) == 2
    assert "absent.jsonl" in capsys.readouterr().err


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    trace = EpisodeTrace.from_arrays([0.8] * 5 + [0.2] * 5, ["a"] * 5 + ["b"] * 5)
    return write_jsonl(trace, tmp_path / "trace.jsonl")


BAD_CEILINGS = [
    ({"components": 5}, ["components"]),
    ({"components": [{"name": "x", "clip": [0]}]}, ["clip"]),
    ({"components": [{"name": "x", "clip": [0, "1"]}]}, ["clip"]),
    ({"components": [{"name": "x", "weight": True}]}, ["weight"]),
    ({"components": [{"name": "x", "pays": "sometimes"}]}, ["pays"]),
    ({"components": [{"name": "x", "wieght": 2}]}, ["wieght"]),
    ({"components": [{"weight": 2}]}, ["name"]),
    ({"components": [{"name": "x", "clip": [2, 1]}]}, ["lo <= hi"]),
    ({"per_step": "1"}, ["per_step"]),
    ({"per_step": 1, "final_step": None}, ["final_step"]),
    ({"per_step": 1, "components": []}, ["either"]),
    ({"nothing": 1}, ["nothing"]),
    ([1, 2], ["object", "array"]),
    (None, ["object", "null"]),
]


@pytest.mark.parametrize(("content", "words"), BAD_CEILINGS, ids=lambda v: str(v)[:40])
def test_bad_ceiling_file_is_rc2_naming_the_field(trace_file, tmp_path, capsys, content, words):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(content), encoding="utf-8")
    assert main([str(trace_file), "--ceiling", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "spec.json" in err and "Traceback" not in err
    for word in words:
        assert word in err, err


@pytest.mark.parametrize("text", [DEEP, "{not json", '{"per_step": NaN}'], ids=str.__len__)
def test_unreadable_ceiling_file_is_rc2(trace_file, tmp_path, capsys, text):
    spec = tmp_path / "spec.json"
    spec.write_text(text, encoding="utf-8")
    assert main([str(trace_file), "--ceiling", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "spec.json" in err and "Traceback" not in err


def test_good_ceiling_files_still_work(trace_file, tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"components": [{"name": "x", "clip": [None, 2]}]}))
    assert main([str(trace_file), "--ceiling", str(spec), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bound"]["per_step"] == 2.0
    spec.write_text(json.dumps({"per_step": 1, "final_step": 3}))
    assert main([str(trace_file), "--ceiling", str(spec), "--json"]) == 0
    bound = json.loads(capsys.readouterr().out)["bound"]
    assert (bound["per_step"], bound["final_step"], bound["derivation"]) == (1.0, 3.0, "explicit")


@pytest.mark.slow
def test_deeply_nested_line_through_the_real_command(tmp_path):
    path = write_lines(tmp_path, GOOD, DEEP)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "continual_eval.cli", "stream", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "t.jsonl:2:" in proc.stderr and "Traceback" not in proc.stderr

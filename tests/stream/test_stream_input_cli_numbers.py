"""Issue 9 item 13: every number on the ``continual-eval stream`` command line is validated.

A value that is not finite or lies outside its documented range is refused by argparse with exit
code 2 and a message naming the option and the range, before any trace is read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from continual_eval.stream import EpisodeTrace, compute_all_metrics, write_jsonl
from continual_eval.stream.cli import main

ROOT = Path(__file__).resolve().parents[2]

REWARDS = [0.8] * 10 + [0.1, 0.9, 0.9] + [0.6] * 7 + [0.5] * 10
LABELS = ["a"] * 10 + ["b"] * 10 + ["a_again"] * 10


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    trace = EpisodeTrace.from_arrays(REWARDS, LABELS, origin_of={"a_again": "a"})
    return write_jsonl(trace, tmp_path / "trace.jsonl")


BAD = [
    ("--alpha", "nan"),
    ("--alpha", "-3"),
    ("--alpha", "0"),
    ("--alpha", "1.5"),
    ("--alpha", "inf"),
    ("--alpha", "x"),
    ("--eps", "nan"),
    ("--eps", "-0.1"),
    ("--eps", "inf"),
    ("--floor", "-1"),
    ("--floor", "nan"),
    ("--tail-fraction", "0"),
    ("--tail-fraction", "1.5"),
    ("--tail-fraction", "nan"),
    ("--zero-shot-window", "0"),
    ("--zero-shot-window", "2.5"),
    ("--gamma", "0"),
    ("--gamma", "1.01"),
    ("--gamma", "nan"),
    ("--ceiling", "nan"),
    ("--ceiling", "-inf"),
]


@pytest.mark.parametrize(("option", "value"), BAD)
def test_bad_number_is_rc2_naming_the_option(trace_file, capsys, option, value):
    with pytest.raises(SystemExit) as info:
        main([str(trace_file), f"{option}={value}", "--json"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and repr(value) in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("option", "value", "param", "expected"),
    [
        ("--alpha", "1", "alpha", 1.0),
        ("--eps", "0", "eps", 0.0),
        ("--floor", "0", "recovery_floor", 0.0),
        ("--tail-fraction", "1", "tail_fraction", 1.0),
        ("--zero-shot-window", "1", "zero_shot_window", 1),
        ("--gamma", "1", "gamma", 1.0),
    ],
)
def test_boundary_values_are_accepted_and_used(trace_file, capsys, option, value, param, expected):
    assert main([str(trace_file), option, value, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["params"][param] == expected
    reference = compute_all_metrics(
        EpisodeTrace.from_arrays(REWARDS, LABELS, origin_of={"a_again": "a"}),
        **{"recovery_floor" if param == "recovery_floor" else param: expected},
    )
    assert res["per_regime"] == json.loads(json.dumps(reference["per_regime"]))


@pytest.mark.slow
def test_nan_alpha_with_json_is_a_clean_rc2_in_the_real_command(trace_file):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "continual_eval.stream.cli", str(trace_file)]
    proc = subprocess.run(
        [*cmd, "--alpha", "nan", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "argument --alpha" in proc.stderr and "finite" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""

"""``continual-eval stream --help``: every option explains itself (meaning, range, default), the
epilog describes the JSON-lines trace format, and printing it imports no Lightning."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from continual_eval.stream.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]

HELP_IN_SUBPROCESS = """
import json, sys
from continual_eval.cli import main
try:
    main(["stream", "--help"])
except SystemExit as exit_:
    code = exit_.code
print(json.dumps({"code": code, "lightning": sorted(m for m in sys.modules
                  if m == "lightning" or m.startswith(("lightning.", "pytorch_lightning")))}))
"""


def _help_text() -> str:
    return build_parser().format_help()


def test_every_option_has_help() -> None:
    parser = build_parser()
    missing = [
        "/".join(action.option_strings) or action.dest
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        and (not action.help or action.help == argparse.SUPPRESS)
    ]
    assert missing == []


def test_help_states_meaning_range_and_default_of_the_metric_options() -> None:
    text = " ".join(_help_text().split())  # argparse wraps lines: compare on single spaces
    assert "--anchor" in text and "'segment' (default)" in text and "R_ub" in text
    assert "adapted fraction in (0, 1]" in text and "default 0.9 (segment), 0.5 (ceiling)" in text
    assert "fraction in (0, 1] of each interval's final steps" in text and "default 0.2" in text
    assert "first N steps after a regime shift (integer >= 1, default 10)" in text
    assert "discount in (0, 1]" in text and "default 0.99" in text
    assert "recovery tolerance >= 0" in text and "(default 0.005)" in text


def test_help_epilog_describes_the_trace_format() -> None:
    text = _help_text()
    epilog = text[text.index("trace format") :]
    assert "one object per step" in epilog and "docs/stream.md" in epilog
    for field in ("step", "reward", "regime_id", "regime_origin", "components"):
        assert field in epilog
    for field in ("invalid_action", "effective_rank", "episode_end"):
        assert field in epilog
    # the example lines in the epilog are valid trace lines
    examples = [ln.strip() for ln in epilog.splitlines() if ln.strip().startswith("{")]
    assert len(examples) == 2
    assert [json.loads(ln)["step"] for ln in examples] == [0, 1]


@pytest.mark.slow
def test_help_in_a_fresh_process_imports_no_lightning() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", HELP_IN_SUBPROCESS],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    *help_lines, last = proc.stdout.strip().splitlines()
    report = json.loads(last)
    assert report == {"code": 0, "lightning": []}
    help_text = "\n".join(help_lines)
    assert "--zero-shot-window N" in help_text and "trace format" in help_text

"""Executed documentation: every python block of docs/online.md runs (the blocks share a
namespace, like a notebook, in a fresh directory), and one followed by a text block prints that
text; the worked example script runs (on a shorter stream)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from continual_eval.online import read_online
from script_runner import run_script

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "online.md"
# a python block, and the text block directly after it if there is one; no part crosses a fence
BLOCK = re.compile(r"```python\n((?:(?!```).)*)```(?:\s*```text\n((?:(?!```).)*)```)?", re.DOTALL)


def test_doc_blocks_run_and_print_what_they_show(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = BLOCK.findall(DOC.read_text(encoding="utf-8"))
    assert len(blocks) == 3 and all(shown for _, shown in blocks)
    namespace: dict = {}
    for code, shown in blocks:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, str(DOC), "exec"), namespace)
        assert buf.getvalue() == shown, f"block:\n{code}"
    assert read_online(tmp_path / "online_run").windows  # the online section of results.json


@pytest.mark.slow
def test_worked_example_script_runs(tmp_path):
    script = ROOT / "examples" / "online_worked_example.py"
    proc = run_script(script, "--out", tmp_path, "--samples", "1500", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = proc.stdout.strip().splitlines()
    assert rows[0].split()[:3] == ["lr", "online", "blind"]
    assert [r.split()[0] for r in rows[1:4]] == ["0.5", "0.05", "0.005"]
    for lr in ("0.5", "0.05", "0.005"):
        assert (tmp_path / f"lr_{lr}" / "online.png").stat().st_size > 10_000


@pytest.mark.slow
def test_config_runs_through_the_lightning_cli(tmp_path):
    """configs/online_autocorrelated.yaml through ``python -m continual_eval.online.synthetic``
    (a shorter stream): the callback gets the datamodule's segment sets and writes its files."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "continual_eval.online.synthetic",
            "--config",
            str(ROOT / "configs" / "online_autocorrelated.yaml"),
            "--data.num_samples",
            "1500",
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = read_online(tmp_path / "mlp" / "version_0")
    assert results.protocol.near_future_delays == [1, 45]
    assert results.held_out is not None and results.held_out.segment_starts == [0, 375, 750, 1125]
    assert results.windows[-1].stream_end == 1500

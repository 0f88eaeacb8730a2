"""A run killed with SIGKILL and resumed from its checkpoint records what an uninterrupted run
records."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from continual_eval.online import read_online
from continual_eval.results import ContinualResults
from script_runner import run_script

HERE = Path(__file__).parent


def _without_clocks(document: dict) -> dict:
    out = json.loads(json.dumps(document))
    out.pop("summary")
    for w in out["windows"]:
        for key in ("train_seconds", "eval_seconds", "peak_memory_bytes"):
            w["cost"].pop(key)
    for e in out["held_out"]["evaluations"]:
        e.pop("seconds")
    return out


@pytest.mark.slow
def test_kill_and_resume_equals_uninterrupted(tmp_path):
    script = HERE / "online_kill_script.py"
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    proc = run_script(script, "full", full, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_script(script, "killed", resumed, timeout=240)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    killed = read_online(resumed / "results")  # the last complete version: epoch 1's end
    killed_id = ContinualResults.load(resumed / "results").run_id
    assert len(killed.windows) == 3 and killed.windows[-1].last_batch == 11
    proc = run_script(script, "resume", resumed, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = read_online(full / "results").to_dict()
    b = read_online(resumed / "results").to_dict()
    assert _without_clocks(a) == _without_clocks(b)
    # the resumed run continues the same record
    assert ContinualResults.load(resumed / "results").run_id == killed_id
    assert len(a["windows"]) == 6 and a["windows"][-1]["stream_end"] == 240
    wa, wb = torch.load(full / "weights.pt"), torch.load(resumed / "weights.pt")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)

"""Two DDP processes score a stream exactly as one process with their global batch size does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from continual_eval.online import read_online
from script_runner import run_script

HERE = Path(__file__).parent


def _run(base: Path, devices: int) -> Path:
    out = base / f"devices{devices}"
    proc = run_script(HERE / "online_ddp_script.py", out, devices, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _counts(document: dict) -> list:
    """What must not depend on the number of processes: every window's scores and place."""
    return [
        (w["first_batch"], w["last_batch"], w["stream_start"], w["stream_end"], w["scores"])
        for w in document["windows"]
    ]


def _without_clocks(document: dict) -> dict:
    """The document without what each rank measures itself (wall times, memory)."""
    out = json.loads(json.dumps(document))
    for w in out["windows"]:
        for key in ("train_seconds", "eval_seconds", "peak_memory_bytes"):
            w["cost"].pop(key)
    for e in out["held_out"]["evaluations"]:
        e.pop("seconds")
    return out


@pytest.mark.slow
def test_two_processes_equal_one(tmp_path):
    one, two = _run(tmp_path, 1), _run(tmp_path, 2)
    single = json.loads((one / "online_rank0.json").read_text())
    rank0 = json.loads((two / "online_rank0.json").read_text())
    rank1 = json.loads((two / "online_rank1.json").read_text())
    assert _without_clocks(rank0) == _without_clocks(rank1)  # every rank holds the whole record
    assert rank0["protocol"]["world_size"] == 2 and rank0["protocol"]["global_batch_size"] == 8
    assert _counts(rank0) == _counts(single)
    # rank 0 wrote the record into the run's results.json (the directory claimed once, on rank 0)
    on_disk = read_online(two / "results").to_dict(summary=False)
    assert _without_clocks(on_disk) == _without_clocks(rank0)
    assert rank0["windows"][-1]["stream_end"] == 97  # the padded duplicate is never scored
    samples = [sum(w["cost"]["samples"] for w in d["windows"]) for d in (single, rank0)]
    assert samples == [97, 98]  # but it is trained (and counted as compute)
    # held-out scores: equal up to the last step, which trained the duplicate on 2 ranks
    evaluations = [d["held_out"]["evaluations"] for d in (single, rank0)]
    assert [e["batches"] for e in evaluations[0]] == [e["batches"] for e in evaluations[1]]
    assert [e["scores"] for e in evaluations[0][:-1]] == [e["scores"] for e in evaluations[1][:-1]]

    # the checkpoint written in the middle of window 1 holds every rank's rows of that window
    def rows(out: Path) -> torch.Tensor:
        state = torch.load(out / "ckpt" / "mid.ckpt", weights_only=False)
        (online,) = [v for k, v in state["callbacks"].items() if k.startswith("OnlineEval")]
        r = online["buffer"]["rows"]
        return r[torch.argsort(r[:, 1] * 10**6 + r[:, 4])]  # by offset, then stream position

    assert torch.equal(rows(one), rows(two))

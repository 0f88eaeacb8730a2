"""DDP on 2 CPU processes: every rank's stream is gathered and scored as the traces of one run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from continual_eval.stream import read_jsonl
from script_runner import run_script

HERE = Path(__file__).parent

LABELS = ["a"] * 10 + ["b"] * 10 + ["a_again"] * 10
STREAMS = [
    [0.8] * 10 + [0.1, 0.9, 0.9] + [0.6] * 7 + [0.5] * 10,
    [0.2] * 10 + [0.9] * 10 + [0.4] * 10,
]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def label_mean(rewards: list[float], label: str) -> float:
    return mean([r for r, lb in zip(rewards, LABELS, strict=True) if lb == label])


@pytest.mark.slow
def test_ddp_gathers_both_ranks_streams(tmp_path):
    proc = run_script(HERE / "stream_ddp_script.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rank0 = torch.load(tmp_path / "rank0.pt", weights_only=False)
    rank1 = torch.load(tmp_path / "rank1.pt", weights_only=False)
    assert rank0["world_size"] == 2
    assert rank0["own"] == pytest.approx(STREAMS[0]) and rank1["own"] == pytest.approx(STREAMS[1])
    for held in (rank0, rank1):  # every rank holds both traces, in rank order, and one result
        assert held["traces"] == [pytest.approx(STREAMS[0]), pytest.approx(STREAMS[1])]
    assert rank0["result"] == rank1["result"]

    # each rank is a separate stream; a label's metric is the mean over the ranks' traces
    rows = rank0["result"]["per_regime"]
    for label in ("a", "b", "a_again"):
        expected = mean([label_mean(s, label) for s in STREAMS])
        assert rows[label]["per_configuration_reward"] == pytest.approx(expected)
    forgetting = mean([label_mean(s, "a") - label_mean(s, "a_again") for s in STREAMS])
    assert rows["a"]["forgetting"] == pytest.approx(forgetting)  # (0.3 + -0.2) / 2
    assert rows["b"]["undiscounted_return"] == pytest.approx(mean([6.1, 9.0]))

    log_dir = tmp_path / "logs" / "version_0"
    for r, stream in enumerate(STREAMS):
        assert read_jsonl(log_dir / f"stream_trace_rank{r}.jsonl").reward.tolist() == (
            pytest.approx(stream)
        )
    assert not (log_dir / "stream_trace.jsonl").exists()
    assert not [p for p in log_dir.iterdir() if p.name.endswith(".tmp")]

    # a checkpoint holds both ranks' records, so a DDP resume loses neither: mid-training
    # (gathered when Lightning builds it) and after fit (from the records gathered at the end)
    for name, n in (("ckpt/epoch=0-step=15.ckpt", 15), ("final.ckpt", 30)):
        ckpt = torch.load(tmp_path / name, weights_only=True)
        (state,) = [v for k, v in ckpt["callbacks"].items() if k.startswith("RewardStream")]
        assert [cols["reward"].tolist() for cols in state["ranks"]] == [
            pytest.approx(STREAMS[0][:n]),
            pytest.approx(STREAMS[1][:n]),
        ]

"""DDP on 2 CPU processes: R equals the single-process R of the same weights, exactly."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from cl_helpers import NUM_CLASSES, make_net, make_tasks

from continual_eval.results import ContinualResults
from script_runner import run_script

HERE = Path(__file__).parent


def plain_scores(state: dict, tasks) -> tuple[list[float], list[float]]:
    """Accuracy (correct / total) and macro F1 of the whole test sets, one process, plain torch."""
    net = make_net()
    net.load_state_dict({k.removeprefix("net."): v for k, v in state.items()})
    net.eval()
    accuracy, f1 = [], []
    with torch.no_grad():
        for _, (x, y) in tasks:
            pred = net(x).argmax(1)
            accuracy.append(int((pred == y).sum()) / len(y))
            per_class = []
            for c in range(NUM_CLASSES):
                tp = int(((pred == c) & (y == c)).sum())
                denom = int((pred == c).sum()) + int((y == c).sum())
                per_class.append(2 * tp / denom if denom else 0.0)
            f1.append(sum(per_class) / NUM_CLASSES)
    return accuracy, f1


@pytest.mark.slow
@pytest.mark.ci
def test_ddp_two_processes_equal_single_process(tmp_path):
    proc = run_script(HERE / "ddp_script.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]

    tasks = make_tasks()
    assert all(len(te[1]) % 2 for _, te in tasks)  # odd sizes: padding would duplicate a sample
    rank0 = torch.load(tmp_path / "rank0.pt")
    rank1 = torch.load(tmp_path / "rank1.pt")
    assert rank0["world_size"] == 2
    for key in ("scores", "baseline", "f1_scores", "f1_baseline"):
        assert torch.equal(rank0[key], rank1[key]), key  # every rank holds the same R

    b_acc, b_f1 = plain_scores(torch.load(tmp_path / "weights_baseline.pt"), tasks)
    rows = [plain_scores(torch.load(tmp_path / f"weights_{i}.pt"), tasks) for i in range(3)]
    R_acc = torch.tensor([r[0] for r in rows], dtype=torch.float64)
    R_f1 = torch.tensor([r[1] for r in rows], dtype=torch.float64)
    assert torch.equal(rank0["baseline"], torch.tensor(b_acc, dtype=torch.float64))
    assert torch.equal(rank0["scores"], R_acc)  # exact: counts summed over unpadded shards
    assert torch.allclose(rank0["f1_baseline"], torch.tensor(b_f1, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(rank0["f1_scores"], R_f1, atol=1e-6)

    # files written once, by rank 0, with the same numbers
    results = ContinualResults.load(tmp_path / "acc").to_dict()
    assert results["scores"] == R_acc.tolist() and results["baseline"] == b_acc
    assert (
        ContinualResults.load(tmp_path / "f1").to_dict()["conventions"]["score"]
        == "MulticlassF1Score"
    )
    assert not list(tmp_path.glob("acc/.*.tmp"))
    with open(tmp_path / "logs" / "version_0" / "metrics.csv") as fh:
        logged = [row for row in csv.DictReader(fh) if row.get("continual/acc")]
    assert [int(row["step"]) for row in logged] == [0, 1, 2]  # one writer: rank 0

    # per-step evaluation (every step, each rank caching its own shard): every row equals the
    # single-process accuracy of the weights at that step, on the tasks seen so far
    steps, stage, curve = rank0["curves"]
    for a, b in zip(rank0["curves"], rank1["curves"], strict=True):
        assert torch.equal(a.nan_to_num(-1), b.nan_to_num(-1))
    assert steps.tolist() == [1, 2, 3, 4, 5, 6]  # 48 samples / 2 ranks / batch 16: 2 steps a task
    assert stage.tolist() == [0, 0, 1, 1, 2, 2]
    for n, (step, s) in enumerate(zip(steps.tolist(), stage.tolist(), strict=True)):
        acc, _ = plain_scores(torch.load(tmp_path / f"weights_step_{step}.pt"), tasks)
        expected = torch.tensor(acc[: s + 1] + [math.nan] * (2 - s), dtype=torch.float64)
        assert torch.equal(curve[n].nan_to_num(-1), expected.nan_to_num(-1)), n
    assert torch.equal(curve[[1, 3, 5]].nan_to_num(0), R_acc.tril())  # stage ends: rows of R
    # each rank cached its own unpadded shard: ceil / floor of the 3 test sets, 6 float32 + int64
    sizes = [len(te[1]) for _, te in tasks]
    per_sample = 6 * 4 + 8
    assert rank0["cache_entries"] == rank1["cache_entries"] == 3
    assert rank0["cache_bytes"] == sum((n + 1) // 2 for n in sizes) * per_sample
    assert rank1["cache_bytes"] == sum(n // 2 for n in sizes) * per_sample
    steps_results = ContinualResults.load(tmp_path / "steps").to_dict()
    assert steps_results["curves"]["step"] == [1, 2, 3, 4, 5, 6]
    assert len(steps_results["stability"]["wc_acc"]) == 3

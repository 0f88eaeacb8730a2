"""ModelParallelStrategy (FSDP2) on 2 CPU processes, lockstep evaluation.

Every count-based matrix (accuracy, top-2, a torchmetrics F1 and accuracy, both class-incremental
matrices, the per-step curves on a fixed subset through the batch cache) equals the plain-torch
scores of the same weights in one process bit for bit (the loss, a float sum, to 1e-6), with
test sets of 1, 5 and 7 samples and an unshardable one; a hang fails the run through the 90 s
gloo timeout. A kill -9 inside a sharded evaluation resumes to the uninterrupted run's matrices.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from sharded_script import (
    CLASSES,
    STEPS_PER_TASK,
    SUBSET,
    TASK_CLASSES,
    TRAINED_TASKS,
    make_data,
    make_net,
)
from torchmetrics.functional.classification import multiclass_accuracy, multiclass_f1_score

from continual_eval.results import ContinualResults
from script_runner import run_script

HERE = Path(__file__).parent


def logits_of(weights_file: Path, x: torch.Tensor) -> torch.Tensor:
    """The unsharded model with the saved full weights, one forward over the whole test set."""
    net = make_net()
    net.load_state_dict(torch.load(weights_file))
    net.eval()
    with torch.no_grad():
        return net(x)


def plain_scores(logits: torch.Tensor, y: torch.Tensor, task: int, stage: int) -> dict:
    """Every scorer's score of one task from its logits, written out in plain torch (and the
    torchmetrics functional API for the metrics); ``stage`` -1 is the baseline."""
    n = len(y)

    def hits(pred: torch.Tensor) -> float:
        return int((pred == y).sum()) / n

    label_score = logits.gather(1, y[:, None])
    aware = torch.tensor(TASK_CLASSES[task])
    seen = torch.tensor([c for t in range(max(stage, task) + 1) for c in TASK_CLASSES[t]])
    per_sample = torch.logsumexp(logits, 1) - label_score[:, 0]  # LossScorer's formula
    assert torch.allclose(per_sample, F.cross_entropy(logits, y, reduction="none"), atol=1e-6)
    pred = logits.argmax(1)
    return {
        "accuracy": hits(pred),
        "top2": int(((logits > label_score).sum(1) < 2).sum()) / n,
        "cross_entropy": float(per_sample.sum(dtype=torch.float64)) / n,
        "f1": float(multiclass_f1_score(pred, y, num_classes=CLASSES, average="macro")),
        "tm_accuracy": float(multiclass_accuracy(pred, y, num_classes=CLASSES)),
        "acc_task_aware": hits(aware[logits[:, aware].argmax(1)]),
        "acc_task_agnostic": hits(seen[logits[:, seen].argmax(1)]),
    }


def subset(y: torch.Tensor, task: int) -> torch.Tensor:
    """The per-step evaluations' fixed subset of a test set (the rule results.json states)."""
    g = torch.Generator().manual_seed(0 + task)
    return torch.randperm(len(y), generator=g)[:SUBSET].sort().values


def expected_row(weights: Path, tasks, names, stage: int, num_tasks: int, subsets=False) -> dict:
    """``name -> [T]`` plain scores of the weights (NaN past ``stage + 1`` with ``subsets``,
    the per-step rows: they score the tasks seen so far)."""
    rows = {name: [] for name in names}
    for j in range(num_tasks):
        x, y = tasks[j][1]
        if subsets:
            if j > stage:
                for name in names:
                    rows[name].append(math.nan)
                continue
            index = subset(y, j)
            x, y = x[index], y[index]
        scores = plain_scores(logits_of(weights, x), y, j, stage)
        for name in names:
            rows[name].append(scores[name])
    return {name: torch.tensor(v, dtype=torch.float64) for name, v in rows.items()}


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.nan_to_num(-7.0), b.nan_to_num(-7.0))


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sharded") / "full"
    proc = run_script(HERE / "sharded_script.py", "full", out, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def load_ranks(out: Path, mode: str) -> list[dict]:
    return [torch.load(out / f"{mode}_rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.slow
@pytest.mark.ci
def test_fsdp2_lockstep_equals_single_process(full_run):
    rank0, rank1 = load_ranks(full_run, "full")
    assert rank0["lockstep"] and rank1["lockstep"]  # detected from the DTensor parameters
    for key in ("main", "steps"):
        for name, m in rank0[key].items():
            for part, value in m.items():
                if value is not None:
                    assert same(value, rank1[key][name][part]), (key, name, part)

    tasks = make_data()
    main_names = ["accuracy", "top2", "cross_entropy", "f1"]
    steps_names = ["accuracy", "tm_accuracy", "acc_task_aware", "acc_task_agnostic"]
    for key, names, T in (("main", main_names, 4), ("steps", steps_names, 3)):
        got = rank0[key]
        assert sorted(got) == sorted(names)
        baseline = expected_row(full_run / "weights_baseline.pt", tasks, names, -1, T)
        rows = [
            expected_row(full_run / f"weights_stage_{i}.pt", tasks, names, i, T)
            for i in range(TRAINED_TASKS)
        ]
        for name in names:
            R = torch.stack([row[name] for row in rows])
            if name == "cross_entropy":
                # a float sum: a sample's logits differ in the last bit with the batch it is
                # computed in (2 rows on a shard, 5 here), as in any data-parallel run
                assert torch.allclose(got[name]["baseline"], baseline[name], rtol=1e-6, atol=0)
                assert torch.allclose(got[name]["scores"], R, rtol=1e-6, atol=0)
                continue
            assert same(got[name]["baseline"], baseline[name]), (key, name)
            assert same(got[name]["scores"], R), (key, name, got[name]["scores"], R)

    # per-step evaluations (every optimizer step; a fixed subset of 3 samples, the stage ends on
    # whole test sets) through the batch cache, on the tasks seen so far
    steps, full = rank0["curve_steps"].tolist(), rank0["curve_full"]
    assert steps == list(range(1, STEPS_PER_TASK * TRAINED_TASKS + 1))
    for n, step in enumerate(steps):
        stage = (step - 1) // STEPS_PER_TASK
        weights = full_run / f"weights_step_{step}.pt"
        expected = expected_row(weights, tasks, steps_names, stage, 3, subsets=not full[n])
        if full[n]:  # a stage end: R's row, on the tasks seen so far
            expected = {
                k: torch.where(torch.arange(3) <= stage, v, math.nan) for k, v in expected.items()
            }
        for name in steps_names:
            assert same(rank0["steps"][name]["steps"][n], expected[name]), (name, step)
    assert full == tuple(step % STEPS_PER_TASK == 0 for step in steps)

    # the model-size count reads the DTensors' global sizes: the unsharded model's
    assert rank0["parameters"] == [sum(p.numel() for p in make_net().parameters())] * 3
    # a 0-sample test set in lockstep: the same error on both ranks, no hang
    for saved in (rank0, rank1):
        assert saved["empty"].startswith("task 1 ('task_1'), test dataloader 1: the loader yielded")
    results = ContinualResults.load(full_run / "main").to_dict()
    assert results["scores"] == rank0["main"]["accuracy"]["scores"].tolist()


@pytest.mark.slow
def test_kill_inside_a_sharded_evaluation_resumes_bitwise(full_run, tmp_path):
    killed = run_script(HERE / "sharded_script.py", "killed", tmp_path, timeout=300)
    assert killed.returncode != 0
    assert (tmp_path / "ckpt" / "task_1.ckpt").exists()
    assert not (tmp_path / "ckpt" / "task_2.ckpt").exists()  # died in stage 2's evaluation
    resumed = run_script(HERE / "sharded_script.py", "resume", tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    full, again = load_ranks(full_run, "full")[0], load_ranks(tmp_path, "resume")[0]
    for key in ("main", "steps"):
        for name, m in full[key].items():
            for part, value in m.items():
                if value is not None:
                    assert same(value, again[key][name][part]), (key, name, part)
    assert torch.equal(full["curve_steps"], again["curve_steps"])

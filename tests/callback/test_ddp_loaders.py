"""Test loaders with ``drop_last=True`` or a ``DistributedSampler``: under DDP (2 gloo processes)
R equals the R of one process over the samples the loader means, bitwise; what cannot be
reproduced is refused with an error naming the loader and the fix. The same loaders in a single
process run score the same samples."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import Classifier, make_net, make_tasks, train_loaders, trainer_kwargs
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from continual_eval.callback import ContinualEvalCallback
from continual_eval.results import ContinualResults
from script_runner import run_spawn_script

HERE = Path(__file__).parent
TEST_SIZES = (41, 37, 41)  # as in ddp_loader_script.py


def plain_accuracy(state: dict, samples: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    """Reference: one process, plain torch, correct / total over the given samples of each task."""
    net = make_net()
    net.load_state_dict({k.removeprefix("net."): v for k, v in state.items()})
    net.eval()
    with torch.no_grad():
        return [int((net(x).argmax(1) == y).sum()) / len(y) for x, y in samples]


def meant_samples(tasks) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What each test loader of ddp_loader_script.py means: the first 40 of 41 (drop_last=True,
    batch 8, sequential), all 37 (DistributedSampler: the whole dataset, no padding), the first
    40 of 41 (DistributedSampler(shuffle=False, drop_last=True) on 2 replicas)."""
    (x0, y0), (x1, y1), (x2, y2) = (te for _, te in tasks)
    return [(x0[:40], y0[:40]), (x1, y1), (x2[:40], y2[:40])]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_ddp_drop_last_and_distributed_sampler_loaders_equal_one_process(tmp_path, strategy):
    proc, out = run_spawn_script(HERE / "ddp_loader_script.py", tmp_path, strategy, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # under ddp_spawn only the launching process saves (what rank 0 handed back to it)
    ranks = (0, 1) if strategy == "ddp" else (0,)
    rank0 = torch.load(out / "rank0.pt")
    assert rank0["world_size"] == 2
    if strategy == "ddp":
        rank1 = torch.load(out / "rank1.pt")
        for key in ("scores", "baseline"):
            assert torch.equal(rank0[key], rank1[key]), key

    tasks = make_tasks(test_sizes=TEST_SIZES)
    samples = meant_samples(tasks)
    baseline = plain_accuracy(torch.load(out / "weights_baseline.pt"), samples)
    R = [plain_accuracy(torch.load(out / f"weights_{i}.pt"), samples) for i in range(3)]
    assert torch.equal(rank0["baseline"], torch.tensor(baseline, dtype=torch.float64))
    assert torch.equal(rank0["scores"], torch.tensor(R, dtype=torch.float64))
    assert ContinualResults.load(out / "acc").to_dict()["scores"] == R

    # a shuffled loader with drop_last=True drops a random tail: refused on every rank
    for rank in ranks:
        message = (out / f"refused_rank{rank}.txt").read_text()
        assert "task 1 ('task_1'), test dataloader 1" in message, message
        assert "drop_last=True" in message and "drop_last=False" in message, message
        assert "RandomSampler" in message, message


def test_distributed_sampler_in_one_process_scores_the_whole_dataset(tmp_path):
    """A loader built for 2 replicas (rank 0's sampler reads a padded half) used in a single
    process run: it means its whole dataset, so R is the accuracy over all samples."""
    tasks = make_tasks(test_sizes=TEST_SIZES)
    loaders = []
    for seed, (_, (x, y)) in enumerate(tasks):
        data = TensorDataset(x, y)
        sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=seed)
        loaders.append(DataLoader(data, batch_size=8, sampler=sampler))
    cb = ContinualEvalCallback(loaders, dirpath=tmp_path, verbose=False)
    model = Classifier(make_net())
    pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(
        model, train_loaders(tasks)[0]
    )
    expected = plain_accuracy(model.state_dict(), [te for _, te in tasks])
    assert torch.equal(cb.scores[0], torch.tensor(expected, dtype=torch.float64))

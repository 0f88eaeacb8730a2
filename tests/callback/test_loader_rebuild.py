"""Re-built test loaders (DDP shards, per-step subsets) read exactly the samples the user's loader
reads: a sampler that picks a subset is honoured, and one we cannot reproduce is never rebuilt."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)

from continual_eval.evaluation import (
    AccuracyScorer,
    EvaluationError,
    shard_dataloader,
    subset_dataloader,
)

DATA = TensorDataset(torch.arange(100).float().unsqueeze(1), torch.arange(100))


def read_targets(loader) -> list[int]:
    return [int(y) for _, ys in loader for y in ys]


@pytest.mark.parametrize(
    ("loader", "expected"),
    [
        (DataLoader(DATA, batch_size=7), list(range(100))),
        (DataLoader(DATA, batch_size=7, shuffle=True), list(range(100))),
        (
            DataLoader(DATA, batch_size=7, sampler=SubsetRandomSampler(range(50, 61))),
            list(range(50, 61)),
        ),
    ],
)
def test_shards_cover_the_loaders_samples_once(loader, expected):
    assert sorted(read_targets(loader)) == expected  # what the user's loader reads
    shards = [shard_dataloader(loader, rank, 2) for rank in (0, 1)]
    assert all(sharded for _, sharded in shards)
    parts = [read_targets(shard) for shard, _ in shards]
    assert sorted(parts[0] + parts[1]) == expected  # no padding, no duplicate, nothing outside
    assert abs(len(parts[0]) - len(parts[1])) <= 1


def test_subset_is_drawn_from_the_samplers_subset():
    loader = DataLoader(DATA, batch_size=4, sampler=SubsetRandomSampler(range(50, 60)))
    sub, indices = subset_dataloader(loader, 5, seed=0)
    assert len(indices) == 5 and all(50 <= int(i) < 60 for i in indices)
    assert read_targets(sub) == sorted(int(i) for i in indices)


def test_a_sampler_we_cannot_reproduce_is_left_alone():
    weighted = WeightedRandomSampler(torch.ones(100), num_samples=30, replacement=True)
    loader = DataLoader(DATA, batch_size=8, sampler=weighted)
    same, sharded = shard_dataloader(loader, 0, 2)
    assert same is loader and not sharded  # rank 0 scores it whole
    with pytest.raises(ValueError, match="WeightedRandomSampler"):
        subset_dataloader(loader, 5, seed=0)


def test_single_float_score_per_sample_is_an_error_not_zero_accuracy():
    scorer = AccuracyScorer()
    scorer.start(torch.device("cpu"))
    with pytest.raises(EvaluationError, match="no class dimension"):
        scorer.update(torch.tensor([0.3, -1.2, 2.0]), torch.tensor([1, 0, 1]))
    scorer.update(torch.tensor([1, 0, 0]), torch.tensor([1, 0, 1]))  # integer labels still work
    assert scorer.local_counts()[:2].tolist() == [2, 3]


# ---------------------------------------------------------------- drop_last (issue 9, item 2)
ODD = TensorDataset(torch.arange(41).float().unsqueeze(1), torch.arange(41))


def test_sequential_drop_last_shards_the_samples_one_process_reads():
    loader = DataLoader(ODD, batch_size=8, drop_last=True)
    one_process = read_targets(loader)
    assert one_process == list(range(40))
    parts = [read_targets(shard_dataloader(loader, rank, 2)[0]) for rank in (0, 1)]
    assert sorted(parts[0] + parts[1]) == one_process
    sub, indices = subset_dataloader(loader, 100, seed=0)  # a subset of what the loader reads
    assert indices.tolist() == one_process == read_targets(sub)


@pytest.mark.parametrize(
    "loader",
    [
        DataLoader(ODD, batch_size=8, shuffle=True, drop_last=True),
        DataLoader(ODD, batch_size=8, sampler=SubsetRandomSampler(range(3, 40)), drop_last=True),
    ],
)
def test_random_drop_last_cannot_be_sharded_and_is_refused(loader):
    with pytest.raises(
        EvaluationError,
        match=r"task 4 \('birds'\), test dataloader 4: .*drop_last=True.*random.*drop_last=False",
    ):
        shard_dataloader(loader, 1, 2, task=4, task_name="birds")
    with pytest.raises(EvaluationError, match=r"test dataloader \(DataLoader over TensorDataset"):
        shard_dataloader(loader, 0, 2)
    with pytest.raises(EvaluationError, match="every evaluation would score a different subset"):
        shard_dataloader(loader, 0, 1)  # the same rule in one process
    with pytest.raises(ValueError, match="drop_last=True"):
        subset_dataloader(loader, 5, seed=0)


def test_random_drop_last_without_a_partial_batch_is_sharded():
    loader = DataLoader(ODD, batch_size=41, shuffle=True, drop_last=True)  # nothing to drop
    parts = [read_targets(shard_dataloader(loader, rank, 2)[0]) for rank in (0, 1)]
    assert sorted(parts[0] + parts[1]) == list(range(41))


# ---------------------------------------------------------------- DistributedSampler (item 3)
@pytest.mark.parametrize(
    ("make_sampler", "expected"),
    [
        (lambda r: DistributedSampler(ODD, 2, r, shuffle=True, seed=5), list(range(41))),
        (lambda r: DistributedSampler(ODD, 3, r, shuffle=False), list(range(41))),
        (lambda r: DistributedSampler(ODD, 2, r, shuffle=False, drop_last=True), list(range(40))),
        (lambda r: DistributedSampler(ODD, 1, r, shuffle=True, drop_last=True), list(range(41))),
        (lambda r: UnrepeatedDistributedSampler(ODD, 2, r, shuffle=True), list(range(41))),
    ],
)
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_distributed_sampler_means_its_whole_dataset(make_sampler, expected, world_size):
    loader = DataLoader(ODD, batch_size=8, sampler=make_sampler(0))
    shards = [shard_dataloader(loader, rank, world_size) for rank in range(world_size)]
    assert all(sharded for _, sharded in shards)
    parts = [read_targets(shard) for shard, _ in shards]
    assert sorted(i for part in parts for i in part) == expected  # no padding, no duplicate
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize(
    ("make_loader", "message"),
    [
        (
            lambda: DataLoader(
                ODD, batch_size=8, sampler=DistributedSampler(ODD, 2, 0, drop_last=True)
            ),
            r"DistributedSampler\(shuffle=True, drop_last=True\) drops a random 1 of the 41",
        ),
        (
            lambda: DataLoader(
                ODD, batch_size=8, drop_last=True, sampler=DistributedSampler(ODD, 2, 0)
            ),
            r"drop_last=True on the DataLoader drops each replica's last partial batch",
        ),
        (
            lambda: DataLoader(ODD, batch_size=8, sampler=Every2ndReplica(ODD, 2, 0)),
            r"its sampler, Every2ndReplica, is a DistributedSampler subclass",
        ),
    ],
)
@pytest.mark.parametrize("world_size", [1, 2])
def test_distributed_sampler_that_cannot_be_reproduced_is_refused(make_loader, message, world_size):
    with pytest.raises(EvaluationError, match=r"task 0 \('a'\), test dataloader 0: " + message):
        shard_dataloader(make_loader(), 0, world_size, task=0, task_name="a")


class Every2ndReplica(DistributedSampler):
    def __iter__(self):
        return iter(list(super().__iter__())[::2])

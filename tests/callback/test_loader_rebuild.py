"""Re-built test loaders (DDP shards, per-step subsets) read exactly the samples the user's loader
reads: a sampler that picks a subset is honoured, and one we cannot reproduce is never rebuilt."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset, WeightedRandomSampler

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

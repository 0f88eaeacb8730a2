"""The fast path for tensor-backed test sets yields the DataLoader's batches exactly, is never taken
for datasets that may transform samples, and leaves R unchanged (on/off, cache on/off)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders, trainer_kwargs
from lightning.pytorch import Trainer
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, TensorDataset

from continual_eval import ContinualEvalCallback, evaluation, fit_tasks
from continual_eval.evaluation import evaluate_tasks, fast_loader, shard_dataloader
from script_runner import run_script

HERE = Path(__file__).parent
X = torch.arange(41 * 3, dtype=torch.float32).reshape(41, 3)
Y = torch.arange(41) % 5
DATA = TensorDataset(X, Y)


class Batched(Dataset):
    """A dataset with a batched fetch, which the DataLoader calls instead of ``__getitem__``."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int):
        raise AssertionError("the DataLoader reads this dataset with __getitems__")

    def __getitems__(self, indices: list[int]):
        self.calls.append(list(indices))
        return [(X[i] * 2, {"y": Y[i], "i": i}) for i in indices]


class Transformed(TensorDataset):
    """A TensorDataset subclass whose ``__getitem__`` transforms and counts its reads."""

    reads = 0

    def __getitem__(self, i: int):
        Transformed.reads += 1
        x, y = super().__getitem__(i)
        return x + 1, y


class Counting(Dataset):
    def __init__(self) -> None:
        self.reads = 0

    def __len__(self) -> int:
        return len(Y)

    def __getitem__(self, i: int):
        self.reads += 1
        return X[i], Y[i]


def assert_same_batches(fast, loader) -> None:
    expected = list(loader)
    got = list(fast)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert type(a) is type(b)
        flat_a, flat_b = _flatten(a), _flatten(b)
        assert len(flat_a) == len(flat_b)
        for u, v in zip(flat_a, flat_b, strict=True):
            if isinstance(v, torch.Tensor):
                assert u.dtype == v.dtype and u.shape == v.shape and u.stride() == v.stride()
                assert u.is_contiguous() and torch.equal(u, v)
            else:
                assert u == v


def _flatten(batch) -> list:
    if isinstance(batch, (list, tuple)):
        return [x for b in batch for x in _flatten(b)]
    if isinstance(batch, dict):
        return [x for k in sorted(batch) for x in _flatten(batch[k])]
    return [batch]


@pytest.mark.parametrize("batch_size", [1, 5, 8, 41, 64])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(
    "dataset",
    [
        DATA,
        TensorDataset(Y.clone()),  # one tensor: default_collate still returns a list
        Subset(DATA, [40, 3, 3, 17, 0, -1, 22, 9, 8, 7, 6]),  # scattered, repeated, negative
        Subset(DATA, range(10, 35)),  # consecutive: sliced
        Subset(Subset(DATA, torch.arange(40, 0, -2)), [4, 1, 0, 9, 12]),
        TensorDataset(X.double(), Y.to(torch.uint8), Y.bool()),
    ],
    ids=["tensors", "one-tensor", "subset", "subset-range", "nested-subset", "dtypes"],
)
def test_fast_batches_equal_dataloader(dataset, batch_size, drop_last):
    loader = DataLoader(dataset, batch_size=batch_size, drop_last=drop_last)
    fast = fast_loader(loader)
    assert fast is not loader
    assert len(fast) == len(loader)
    assert_same_batches(fast, loader)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_fast_batches_equal_dataloader_on_shards(world_size, drop_last):
    for dataset in (DATA, Subset(DATA, list(range(40, -1, -3)))):
        loader = DataLoader(dataset, batch_size=4, drop_last=drop_last)
        for rank in range(world_size):
            shard, sharded = shard_dataloader(loader, rank, world_size)
            assert sharded and fast_loader(shard) is not shard
            assert_same_batches(fast_loader(shard), shard)
    # a DistributedSampler loader, re-built over its whole dataset in one process
    sampler = DistributedSampler(DATA, num_replicas=4, rank=1, shuffle=False)
    rebuilt, _ = shard_dataloader(DataLoader(DATA, batch_size=6, sampler=sampler), 0, 1)
    assert_same_batches(fast_loader(rebuilt), rebuilt)


def test_batched_fetch_dataset_equals_dataloader():
    dataset = Batched()
    loader = DataLoader(dataset, batch_size=4)
    assert_same_batches(fast_loader(loader), loader)
    n = len(dataset.calls) // 2
    assert dataset.calls[:n] == dataset.calls[n:]  # the same batched reads, in the same order
    worker_loader = DataLoader(Batched(), batch_size=4, num_workers=1)
    assert fast_loader(worker_loader) is worker_loader  # its reads run in the workers


def test_fast_batches_are_fresh_tensors():
    loader = DataLoader(TensorDataset(X.clone(), Y.clone()), batch_size=8)
    for x, y in fast_loader(loader):
        x.zero_()
        y.fill_(-1)
    assert torch.equal(loader.dataset.tensors[0], X) and torch.equal(loader.dataset.tensors[1], Y)


@pytest.mark.parametrize(
    "loader",
    [
        DataLoader(DATA, batch_size=4, shuffle=True),
        DataLoader(DATA, batch_size=4, collate_fn=lambda b: b),
        DataLoader(DATA, batch_size=None),
        DataLoader(Transformed(X, Y), batch_size=4),
        DataLoader(Subset(Transformed(X, Y), [1, 2]), batch_size=4),
        DataLoader(Counting(), batch_size=4),
        DataLoader(TensorDataset(X.t().contiguous().t(), Y), batch_size=4),  # not contiguous
        DataLoader(Subset(DATA, [0, 41]), batch_size=4),  # out of range: the DataLoader raises
        type("MyLoader", (DataLoader,), {})(DATA, batch_size=4),
    ],
    ids=[
        "shuffle",
        "collate",
        "no-batch-size",
        "transform",
        "subset-of-transform",
        "getitem",
        "strided",
        "out-of-range",
        "subclass",
    ],
)
def test_other_loaders_keep_the_dataloader(loader):
    assert fast_loader(loader) is loader


def test_dataset_with_side_effects_is_read_through_its_getitem():
    counting, transformed = Counting(), Transformed(X, Y)
    Transformed.reads = 0
    loaders = [DataLoader(counting, batch_size=8), DataLoader(transformed, batch_size=8)]
    torch.manual_seed(0)
    evaluate_tasks(torch.nn.Linear(3, 5), loaders, [0, 1])
    assert counting.reads == len(Y) and Transformed.reads == len(Y)


def test_flag_off_and_rng_stream_unchanged(monkeypatch):
    loader = DataLoader(DATA, batch_size=8)
    monkeypatch.setattr(evaluation.switches, "FAST_PATH", False)
    assert fast_loader(loader) is loader
    monkeypatch.setattr(evaluation.switches, "FAST_PATH", True)
    # the fast path draws what iter(DataLoader) draws from the global generator
    torch.manual_seed(3)
    list(loader)
    after_loader = torch.get_rng_state()
    torch.manual_seed(3)
    list(fast_loader(loader))
    assert torch.equal(torch.get_rng_state(), after_loader)


class NoisyModel(torch.nn.Module):
    """Draws from the global RNG in its forward: its scores depend on the RNG stream."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.linear = torch.nn.Linear(3, 5)

    def forward(self, x):
        return self.linear(x) + 30 * torch.randn(x.shape[0], 5)


def test_scores_equal_with_fast_path_off(monkeypatch):
    loaders = [
        DataLoader(DATA, batch_size=8),
        DataLoader(Subset(DATA, list(range(0, 41, 2))), batch_size=3, drop_last=True),
    ]
    results = []
    for flag in (True, False):
        monkeypatch.setattr(evaluation.switches, "FAST_PATH", flag)
        torch.manual_seed(5)
        results.append(evaluate_tasks(NoisyModel(), loaders, [0, 1]))
    fast, plain = results
    assert torch.equal(fast.scores, plain.scores)
    assert torch.equal(fast.correct, plain.correct) and torch.equal(fast.total, plain.total)


def run_callback(tmp_path, cache: bool, tasks) -> tuple[list, dict]:
    cb = ContinualEvalCallback(
        eval_loaders(tasks, batch_size=7),
        dirpath=tmp_path,
        verbose=False,
        log_images=False,
        cache_test_batches=cache,
        eval_every_n_steps=2,
    )
    fit_tasks(
        Trainer(**trainer_kwargs(tmp_path, max_epochs=1, callbacks=[cb])),
        Classifier(make_net()),
        train_loaders(tasks),
    )
    results = cb.results()
    return results["scores"], results["curves"]


def test_callback_R_identical_fast_path_and_cache_on_off(tmp_path, monkeypatch):
    tasks = make_tasks()
    results = {}
    for flag in (True, False):
        for cache in (True, False):
            monkeypatch.setattr(evaluation.switches, "FAST_PATH", flag)
            results[flag, cache] = run_callback(tmp_path / f"{flag}-{cache}", cache, tasks)
    R, curves = results[True, True]
    assert len(R) == 3 and len(curves["step"]) >= 3
    for other_R, other_curves in results.values():
        assert repr(other_R) == repr(R)  # bitwise: the repr of a float is exact
        assert repr(other_curves) == repr(curves)


@pytest.mark.slow
def test_ddp_R_identical_fast_path_pool_and_cache_on_off(tmp_path):
    proc = run_script(HERE / "fast_path_ddp_script.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    reference = ranks[0]["fast-cached"]
    assert reference["scores"].shape == (3, 3) and not reference["scores"].isnan().any()
    for saved in ranks:
        assert set(saved) == {"fast-cached", "fast-uncached", "plain-cached", "plain-uncached"}
        for variant in saved.values():
            assert torch.equal(variant["scores"], reference["scores"])
            assert torch.equal(variant["baseline"], reference["baseline"])
            for a, b in zip(variant["curves"], reference["curves"], strict=True):
                assert torch.equal(a.nan_to_num(-1), b.nan_to_num(-1))

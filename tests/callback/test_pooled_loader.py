"""Test loaders with worker processes share one persistent worker pool: each task's batches are
its own loader's, never mixed, the pool is kept between evaluations while the datasets are the
same, and the scores equal those of per-task loaders."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from continual_eval import evaluation
from continual_eval.evaluation import _batch_sources, _PoolView, evaluate_tasks


class Scaled(Dataset):
    """A per-sample (deterministic) transform: not tensor-backed, so it keeps its DataLoader."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i] * 2 - 1, self.y[i]


def worker_loaders(**overrides) -> list[DataLoader]:
    settings = dict(batch_size=4, num_workers=1)
    sizes, drop = (9, 13, 6), (False, True, False)
    return [
        DataLoader(Scaled(n, seed), **{**settings, "drop_last": d, **overrides})
        for seed, (n, d) in enumerate(zip(sizes, drop, strict=True))
    ]


@pytest.fixture(autouse=True)
def _close_pools():
    yield
    while evaluation._POOLS:
        evaluation._POOLS.pop().close()


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


def test_pooled_batches_are_each_tasks_own():
    loaders = worker_loaders()
    sources = _batch_sources(loaders, [2, 0, 1], torch.device("cpu"))
    assert all(isinstance(sources[j][0], _PoolView) for j in range(3))
    for j in (2, 0, 1):  # the order the pass was started in
        got, expected = list(sources[j][0]), list(loaders[j])
        assert len(got) == len(expected)
        for (x, y), (ex, ey) in zip(got, expected, strict=True):
            assert torch.equal(x, ex) and torch.equal(y, ey)


def test_pool_kept_while_datasets_unchanged():
    loaders = worker_loaders()
    first = evaluate_tasks(model(), loaders, range(3))
    pool = evaluation._POOLS[-1]
    workers = pool.loader._iterator
    assert workers is not None
    second = evaluate_tasks(model(), loaders, [0, 1])  # another task set: the same pool
    assert [pool] == evaluation._POOLS and pool.loader._iterator is workers
    assert torch.equal(second.scores, first.scores[:2])
    other = worker_loaders()  # new loaders (datasets): a new pool
    evaluate_tasks(model(), other, range(3))
    assert evaluation._POOLS[-1] is not pool and len(evaluation._POOLS) == 2


def test_scores_equal_per_task_loaders(monkeypatch):
    loaders = worker_loaders()
    pooled = evaluate_tasks(model(), loaders, range(3))
    monkeypatch.setattr(evaluation.switches, "POOLED_LOADERS", False)
    assert not isinstance(_batch_sources(loaders, [0], torch.device("cpu"))[0][0], _PoolView)
    plain = evaluate_tasks(model(), loaders, range(3))
    assert torch.equal(pooled.scores, plain.scores) and torch.equal(pooled.total, plain.total)
    assert pooled.total.tolist() == [9, 12, 6]  # drop_last of task 1 honoured


def test_only_equal_settings_share_a_pool():
    loaders = worker_loaders()
    loaders[1] = DataLoader(loaders[1].dataset, batch_size=4, num_workers=1, prefetch_factor=3)
    sources = _batch_sources(loaders, range(3), torch.device("cpu"))
    assert sources[0][0].pool is sources[2][0].pool is not sources[1][0].pool
    for j in range(3):
        assert [y.tolist() for _, y in sources[j][0]] == [y.tolist() for _, y in loaders[j]]


def test_worker_init_fn_and_single_process_loaders_are_not_pooled():
    loaders = worker_loaders(worker_init_fn=lambda worker_id: None)
    loaders.append(DataLoader(Scaled(5, 9), batch_size=4))
    sources = _batch_sources(loaders, range(4), torch.device("cpu"))
    assert all(sources[j][0] is loaders[j] for j in range(4))

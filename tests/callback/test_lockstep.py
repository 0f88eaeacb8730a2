"""Lockstep evaluation in a simulated 2-rank world (two threads, each rank's collectives a
rendezvous with a 20 s timeout, the model's forward one of them, as under FSDP): every rank runs
the same number of forward passes, the scores equal one process over the whole test sets, and
without lockstep the same run deadlocks. Also: which strategies need it, and the forward
redirection through a strategy's wrapper."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.strategies.strategy import _ForwardRedirection
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from continual_eval.evaluation import (
    LOCKSTEP_ATTR,
    EvaluationError,
    Lockstep,
    collective_forward,
    evaluate_tasks,
    shard_dataloader,
    spare_dataloader,
)
from continual_eval.evaluation.strategy import strategy_step

WORLD = 2


class MismatchError(RuntimeError):
    """Two ranks met in different collectives (gloo: a size mismatch, or a hang)."""


class Rendezvous:
    """What a collective does, for threads: each rank hands in a tensor, every rank gets the
    combination of all of them; ranks meeting in different collectives raise :class:`MismatchError`,
    and a rank that never arrives breaks it after ``timeout``."""

    def __init__(self, timeout: float = 20.0) -> None:
        self.barrier = threading.Barrier(WORLD, timeout=timeout)
        self.slots: list[Any] = [None] * WORLD

    def exchange(
        self, rank: int, kind: str, value: Any, combine: Callable[[list[Any]], Any]
    ) -> Any:
        self.slots[rank] = (kind, value)
        self.barrier.wait()
        slots = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before everyone read
        kinds = {k for k, _ in slots}
        if len(kinds) > 1:
            raise MismatchError(f"ranks in different collectives: {sorted(kinds)}")
        return combine([v for _, v in slots])


def seeded_linear() -> nn.Linear:
    """``nn.Linear(4, 3)`` with weights from its own generator: the simulated ranks are threads,
    and seeding torch's global generator in two threads at once races (different weights)."""
    g = torch.Generator().manual_seed(0)
    linear = nn.Linear(4, 3)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(3, 4, generator=g))
        linear.bias.copy_(torch.randn(3, generator=g))
    return linear


class CollectiveNet(nn.Module):
    """A linear model whose forward is a collective (as under FSDP: every rank must call it
    equally often); counts its calls."""

    def __init__(self, rank: int, world: Rendezvous) -> None:
        super().__init__()
        self.linear = seeded_linear()
        self.rank, self.world, self.calls, self.sizes = rank, world, 0, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.sizes.append(len(x))
        self.world.exchange(self.rank, "forward", None, lambda _: None)  # an all-gather
        return self.linear(x)


class Stream(IterableDataset):
    """An iterable test set (cannot be sharded); ``per_rank`` yields a different part per rank."""

    def __init__(self, x, y, rank: int | None = None) -> None:
        self.x, self.y, self.rank = x, y, rank

    def __iter__(self):
        rows = range(len(self.y)) if self.rank is None else range(self.rank, len(self.y), WORLD)
        return iter((self.x[i], self.y[i]) for i in rows)


def make_sets(sizes=(1, 5, 7)) -> list[TensorDataset]:
    g = torch.Generator().manual_seed(1)
    return [
        TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))
        for n in sizes
    ]


def run_ranks(make_loaders, *, lockstep: bool, spares=None, scorers=("accuracy", "loss")):
    """Run ``evaluate_tasks`` on both simulated ranks; per rank ``(evaluation or error, forward
    calls, the batch size of each forward pass)``. ``make_loaders(rank)`` gives the rank's
    loaders and the unsharded tasks."""
    world = Rendezvous()
    results: list[Any] = [None] * WORLD

    def rank_main(rank: int) -> None:
        net = CollectiveNet(rank, world)
        loaders, unsharded = make_loaders(rank)
        step = Lockstep(
            lambda t: world.exchange(rank, "max", t, lambda ts: torch.stack(ts).amax(0)),
            spares if spares is not None else [],
        )
        try:
            out: Any = evaluate_tasks(
                net,
                loaders,
                range(len(loaders)),
                scorers=list(scorers),
                all_reduce=lambda t: world.exchange(
                    rank, "sum", t, lambda ts: torch.stack(ts).sum(0)
                ),
                rank=rank,
                world_size=WORLD,
                unsharded=unsharded,
                lockstep=step if lockstep else None,
            )
        except (EvaluationError, MismatchError, threading.BrokenBarrierError) as err:
            out = err  # raised on every rank together (or the rendezvous broke): no abort
        except Exception as err:
            out = err
            world.barrier.abort()  # the other rank must not wait for this one
        results[rank] = (out, net.calls, net.sizes)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return results


def plain(loaders) -> Any:
    """One process over the whole test sets, the same weights, no collective."""
    net = nn.Sequential(seeded_linear())
    return evaluate_tasks(net, loaders, range(len(loaders)), scorers=["accuracy", "loss"])


def test_lockstep_keeps_the_ranks_in_step_and_scores_exact():
    sets = make_sets()
    full = [DataLoader(d, batch_size=2) for d in sets]
    stream = DataLoader(Stream(*sets[1].tensors), batch_size=2)

    def loaders(rank):
        shards = [shard_dataloader(dl, rank, WORLD)[0] for dl in full]
        return [*shards, stream], {3}

    spares = [spare_dataloader(dl) for dl in full] + [None]
    (ev0, calls0, sizes0), (ev1, calls1, sizes1) = run_ranks(loaders, lockstep=True, spares=spares)
    assert not isinstance(ev0, Exception) and not isinstance(ev1, Exception), (ev0, ev1)
    # shards of 1/0, 3/2, 4/3 samples: 1/0, 2/1, 2/2 batches, the iterable's 3 on both ranks;
    # rank 1 runs task 0 on the spare sample and pads task 1 with one sample of its batch
    assert calls0 == calls1 == 1 + 2 + 2 + 3
    assert sizes0 == [1, 2, 1, 2, 2, 2, 2, 1] and sizes1 == [1, 2, 1, 2, 1, 2, 2, 1]
    expected = plain([*full, DataLoader(TensorDataset(*sets[1].tensors), batch_size=2)])
    for ev in (ev0, ev1):
        assert torch.equal(ev.scores, expected.scores)
        assert ev.total.tolist() == [1, 5, 7, 5]  # the iterable counted once (rank 0)
        assert torch.allclose(ev.scores_by_scorer[1], expected.scores_by_scorer[1], rtol=1e-6)


def test_without_lockstep_the_ranks_fall_out_of_step():
    full = [DataLoader(d, batch_size=2) for d in make_sets()]
    results = run_ranks(
        lambda r: ([shard_dataloader(dl, r, WORLD)[0] for dl in full], ()), lockstep=False
    )
    # rank 1 (no sample of task 0) reduces while rank 0 runs its forward: a hang under FSDP
    for out, _, _ in results:
        assert isinstance(out, (MismatchError, threading.BrokenBarrierError)), out


def test_a_loader_of_unknown_length_agrees_batch_by_batch():
    x, y = make_sets((7,))[0].tensors
    # an iterable that splits itself by rank (4 and 3 samples): only iterating tells its length
    (ev0, calls0, _), (ev1, calls1, _) = run_ranks(
        lambda r: ([DataLoader(Stream(x, y, rank=r), batch_size=2)], ()), lockstep=True
    )
    assert not isinstance(ev0, Exception) and not isinstance(ev1, Exception), (ev0, ev1)
    assert calls0 == calls1 == 2  # rank 1's 3 samples: 2 batches; rank 0's too


def test_a_rank_without_a_sample_and_no_spare_raises_on_every_rank():
    full = [DataLoader(d, batch_size=2) for d in make_sets((1,))]
    results = run_ranks(
        lambda r: ([shard_dataloader(dl, r, WORLD)[0] for dl in full], ()),
        lockstep=True,
        spares=[None],
    )
    for out, calls, _ in results:
        assert isinstance(out, EvaluationError) and "holds no sample" in str(out)
        assert "task 0 ('task_0'), test dataloader 0" in str(out)
        assert calls == 0  # refused before any forward pass


def test_an_empty_test_set_raises_no_sample_on_every_rank():
    sets = make_sets((1, 0))
    full = [DataLoader(d, batch_size=2) for d in sets]
    results = run_ranks(
        lambda r: ([shard_dataloader(dl, r, WORLD)[0] for dl in full], ()),
        lockstep=True,
        spares=[spare_dataloader(dl) for dl in full],
    )
    for out, calls, _ in results:
        assert isinstance(out, EvaluationError) and "task 1" in str(out)
        assert "yielded no sample" in str(out) and calls == 1


def test_spare_dataloader_reads_the_first_sample_in_the_main_process():
    x = torch.arange(12.0).reshape(6, 2)
    loader = DataLoader(TensorDataset(x), batch_size=4, num_workers=2, shuffle=True)
    spare = spare_dataloader(loader)
    assert spare is not None and spare.num_workers == 0
    (batch,) = list(spare)
    assert torch.equal(batch[0], x[:1])
    assert spare_dataloader(DataLoader(TensorDataset(x[:0]), batch_size=2)) is None
    assert spare_dataloader(DataLoader(Stream(x, x), batch_size=2)) is None


# ------------------------------------------------------------------ which strategies need it
def test_collective_forward_reads_the_module_and_strategy():
    net = nn.Linear(2, 2)
    assert not collective_forward(SimpleNamespace(model=net), net)  # e.g. single device, DDP
    assert collective_forward(SimpleNamespace(zero_stage_3=True), net)  # DeepSpeed ZeRO-3
    assert collective_forward(SimpleNamespace(**{LOCKSTEP_ATTR: True}), net)  # declared
    partitioned = nn.Linear(2, 2)
    partitioned.weight.ds_id = 0  # what DeepSpeed ZeRO-3 marks its partitioned parameters with
    assert collective_forward(SimpleNamespace(), partitioned)
    setattr(partitioned, LOCKSTEP_ATTR, False)  # the module's word comes first
    assert not collective_forward(SimpleNamespace(), partitioned)


def test_collective_forward_detects_fully_shard(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        net = nn.Sequential(nn.Linear(2, 2))
        fully_shard(net, mesh=init_device_mesh("cpu", (1,)))
        assert collective_forward(SimpleNamespace(model=net), net)
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------ forward redirection
class Wrapper(nn.Module):
    """What FSDP1 / DeepSpeed put around the LightningModule: their forward gathers the
    parameters, then calls the inner module's forward."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module, self.calls = module, 0

    def forward(self, *args: Any) -> Any:
        self.calls += 1
        return self.module(*args)


class Classifier(LightningModule):
    def __init__(self, with_step: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 3)
        if with_step:
            self.continual_eval_step = lambda batch, task_id: (self(batch[0]), batch[1])

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("with_step", [False, True], ids=["batch-format", "continual_eval_step"])
def test_strategy_step_calls_the_model_through_the_wrapper(with_step):
    from continual_eval.evaluation import default_batch_step

    module = Classifier(with_step)
    wrapper = Wrapper(module)
    loaders = [DataLoader(d, batch_size=2) for d in make_sets()]
    direct = evaluate_tasks(module, loaders, range(3))
    strategy = SimpleNamespace(model=wrapper, _forward_redirection=_ForwardRedirection())
    with strategy_step(strategy, module, default_batch_step) as step:
        redirected = evaluate_tasks(module, loaders, range(3), step=step)
    assert wrapper.calls == 1 + 3 + 4  # every batch through the wrapper's forward
    assert torch.equal(redirected.scores, direct.scores)
    assert not hasattr(module, "_continual_eval_redirected_step")  # removed afterwards
    # no wrapper (FSDP2 acts in place), or the strategy's model is the module: called directly
    with strategy_step(SimpleNamespace(model=module), module, default_batch_step) as step:
        assert step is default_batch_step


# ------------------------------------------------------------------ parameter counts
def test_parameter_counts_of_sharded_parameters():
    from continual_eval.evaluation.strategy import parameter_counts
    from continual_eval.stage_cost import StageCostRecorder

    net = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    net[1].requires_grad_(False)
    assert parameter_counts(net) == (15 + 8, 15)
    # DeepSpeed ZeRO-3 leaves an empty partition in .data and the full size in ds_numel
    partitioned = nn.Linear(4, 3)
    for p in partitioned.parameters():
        p.ds_numel = p.numel()
        p.data = torch.empty(0)
    assert parameter_counts(partitioned) == (15, 15)
    # FSDP1 marks the parameters it flattened: their local shards do not tell the sizes
    flat = nn.Linear(4, 3)
    flat.weight._fsdp_flattened = True
    assert parameter_counts(flat) is None
    recorder = StageCostRecorder()
    recorder.start_stage(torch.device("cpu"))
    with pytest.warns(UserWarning, match="FSDP1"):
        cost = recorder.finish_stage(
            0, flat, train_seconds=0, eval_seconds=0, samples=0, optimizer_steps=0
        )
    assert cost.parameters == cost.trainable_parameters == 0


def test_effective_rank_capture_refuses_fsdp1():
    """The stream callback's capture runs ``pl_module(probe)`` past the strategy's wrapper: under
    FSDPStrategy it would see flattened shards, so it refuses at fit start."""
    from lightning.pytorch.strategies import FSDPStrategy

    from continual_eval.stream import RewardStreamCallback

    callback = RewardStreamCallback(
        effective_rank_module="net", effective_rank_probe=torch.zeros(2, 4)
    )
    trainer = SimpleNamespace(strategy=FSDPStrategy())
    with pytest.raises(ValueError, match=r"effective-rank capture.*FSDPStrategy"):
        callback.on_fit_start(trainer, Classifier(with_step=False))

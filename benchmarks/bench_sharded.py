"""What lockstep and sharding cost a stage's evaluation, on 2 CPU processes (gloo).

One stage's evaluation (``evaluate_tasks`` over every task's unpadded shard, counts reduced
across the ranks, as ``ContinualEvalCallback`` runs it) side by side, interleaved, next to the
forward passes alone (``floor``: the same model over the rank's pre-collated batches, argmax and
count, as many passes as the other rank):

* ``ddp``: each rank holds the whole model (what the evaluation runs under DDP: the module, not
  the DDP wrapper), no lockstep;
* ``ddp + lockstep``: the same with lockstep forced on (one max-reduction per evaluation, and the
  rank with fewer batches of a task runs one discarded forward pass);
* ``fsdp2``: the model ``fully_shard``-ed (one FSDP unit per layer and the root, as
  ``ModelParallelStrategy``'s ``configure_model`` does), in lockstep (required: every forward is
  a collective).

The test sets have ``2 * k * batch + 1`` samples, so one rank holds one batch more of every task
than the other: lockstep pads every task. Models: the MLP 32-64-64-2 (batch 128, 9985 samples
per task) and a wider MLP (256-1024-1024-16, batch 512, 7169 samples per task). Prints medians
of per-repeat paired ratios (rank 0's clock; targets: ddp + lockstep / ddp <= 1.02, fsdp2 / ddp
<= 1.2).

    python benchmarks/bench_sharded.py                 # both models, 4 tasks, 15 repeats
    python benchmarks/bench_sharded.py --model mlp --tasks 10 --repeats 9   # the small one
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from functools import partial

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: model -> (layer widths, batch size, batches per task on the rank with fewer)
MODELS = {"mlp": ((32, 64, 64, 2), 128, 39), "wide": ((256, 1024, 1024, 16), 512, 7)}


def make_model(widths: tuple[int, ...]) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def make_loaders(widths: tuple[int, ...], tasks: int, batch: int, k: int) -> list[DataLoader]:
    g = torch.Generator().manual_seed(0)
    n = 2 * k * batch + 1  # rank 0: k + 1 batches, rank 1: k (a discarded pass per task)
    return [
        DataLoader(
            TensorDataset(
                torch.randn(n, widths[0], generator=g),
                torch.randint(0, widths[-1], (n,), generator=g),
            ),
            batch_size=batch,
        )
        for _ in range(tasks)
    ]


def reduce(op: dist.ReduceOp, t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t, op=op)
    return t


def floor_pass(
    model: nn.Module, batches: list[list[tuple[torch.Tensor, torch.Tensor]]], most: int
) -> None:
    """The bare loop on this rank's pre-collated batches: forward, argmax, count, and as many
    forward passes per task as the rank with the most batches runs (``most``, known here), one
    all-reduce of the counts."""
    with torch.no_grad():
        hits = []
        for task in batches:
            h = torch.zeros((), dtype=torch.int64)
            for x, y in task:
                h += (model(x).argmax(1) == y).sum()
            for _ in range(most - len(task)):
                model(task[-1][0][:1])  # a lockstep pass: one sample
            hits.append(h)
        dist.all_reduce(torch.stack(hits))


def measure(rank: int, mesh, name: str, args: argparse.Namespace) -> None:
    """Every variant of one model, interleaved; rank 0 reports."""
    from torch.distributed.fsdp import fully_shard

    from continual_eval.evaluation import (
        Lockstep,
        evaluate_tasks,
        shard_dataloader,
        spare_dataloader,
    )

    widths, batch, fewer = MODELS[name]
    full = make_loaders(widths, args.tasks, batch, fewer)
    shards = [shard_dataloader(dl, rank, 2)[0] for dl in full]
    batches = [list(dl) for dl in shards]
    spares = [spare_dataloader(dl) for dl in full]
    lockstep = Lockstep(partial(reduce, dist.ReduceOp.MAX), spares)
    replica, sharded = make_model(widths).eval(), make_model(widths).eval()
    for layer in sharded:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    common = dict(all_reduce=partial(reduce, dist.ReduceOp.SUM), rank=rank, world_size=2)
    tasks = range(args.tasks)
    variants = {
        "ddp floor": lambda: floor_pass(replica, batches, fewer + 1),
        "ddp": lambda: evaluate_tasks(replica, shards, tasks, **common),
        "ddp + lockstep": lambda: evaluate_tasks(
            replica, shards, tasks, lockstep=lockstep, **common
        ),
        "fsdp2 floor": lambda: floor_pass(sharded, batches, fewer + 1),
        "fsdp2": lambda: evaluate_tasks(sharded, shards, tasks, lockstep=lockstep, **common),
    }
    results = {k: f() for k, f in variants.items()}  # warm-up; the same scores everywhere
    assert torch.equal(results["ddp"].scores, results["ddp + lockstep"].scores)
    assert torch.equal(results["ddp"].total, results["fsdp2"].total)
    times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for rep in range(args.repeats):
        for k in names if rep % 2 == 0 else names[::-1]:
            dist.barrier()
            start = time.perf_counter()
            variants[k]()
            times[k].append(time.perf_counter() - start)
    if rank == 0:
        report(name, widths, batch, 2 * fewer * batch + 1, args.tasks, times)


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    for name in args.model:
        measure(rank, mesh, name, args)
    dist.destroy_process_group()


def report(
    name: str, widths, batch: int, n: int, tasks: int, times: dict[str, list[float]]
) -> None:
    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    print(f"\n{name} {'-'.join(map(str, widths))}, batch {batch}, {tasks} tasks x {n} samples")
    for k, t in times.items():
        print(f"  {k:16s} median {statistics.median(t) * 1e3:8.1f} ms")
    print(
        f"  ddp + lockstep / ddp: {paired('ddp + lockstep', 'ddp'):.3f} (target <= 1.02); "
        f"fsdp2 / ddp: {paired('fsdp2', 'ddp'):.3f} (target <= 1.2); the forward passes "
        f"alone, fsdp2 floor / ddp floor: {paired('fsdp2 floor', 'ddp floor'):.3f}; "
        f"evaluation / floor: ddp {paired('ddp', 'ddp floor'):.3f}, fsdp2 "
        f"{paired('fsdp2', 'fsdp2 floor'):.3f}  (medians of paired ratios)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), action="append")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--port", type=int, default=29561)
    args = parser.parse_args()
    args.model = args.model or ["mlp", "wide"]
    mp.spawn(worker, args=(args, args.port), nprocs=2)


if __name__ == "__main__":
    main()

"""One rank of the 2-process gloo check of ContinualMetrics' DDP sync (run by tests/test_metric.py).

usage: python metric_ddp_worker.py RANK WORLD PORT DISAGREE OUT_JSON [update|forward]
Each rank records the same three rows (rank 1 alters one cell when DISAGREE=1), then calls
compute(), which syncs the states across ranks, and writes what it got to OUT_JSON. With
``forward`` the rows are recorded by calling the metric, ``metric(row)``, whose last result is
written too (``forward_metrics``).
"""

import json
import os
import sys

import torch
import torch.distributed as dist

from continual_eval import ContinualMetrics


def random_stream(T: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    R = torch.rand(T, T, generator=gen)
    b = torch.rand(T, generator=gen)
    b[0] = float("nan")
    idx = torch.arange(T)
    R[idx.unsqueeze(0) > idx.unsqueeze(1) + 1] = float("nan")
    return R, b


def main() -> None:
    rank, world, port, disagree, out = sys.argv[1:6]
    mode = sys.argv[6] if len(sys.argv) > 6 else "update"
    rank, world = int(rank), int(world)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        R, b = random_stream(4, seed=7)
        metric = ContinualMetrics(4)
        metric.update_baseline(b)
        for s in range(3):
            row = R[s].clone()
            if disagree == "1" and rank == 1 and s == 2:
                row[0] = 0.0
            if mode == "forward" and s < 2:
                metric(row)
            elif mode != "forward":
                metric.update(row)
        try:
            forwarded = metric(row) if mode == "forward" else {}
            result = metric.compute()
            payload = {
                "metrics": {k: v.item() for k, v in result.items()},
                "forward_metrics": {k: v.item() for k, v in forwarded.items()},
                "scores": metric.scores.tolist(),
            }
        except RuntimeError as err:
            payload = {"error": str(err)}
        with open(out, "w") as fh:
            json.dump(payload, fh)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

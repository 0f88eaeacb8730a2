"""Benchmark: the paired bootstrap of the class-incremental numbers (per-class accuracy, mean
class accuracy, AMCA, per-class forgetting, task-weighted seen/old accuracy; the items of
``acc_task_agnostic`` and their labels) beside the matrix's own paired bootstrap, on one thread.

A 20-task run, 2000 test items per task, ``K`` classes per task (2 and 10), 10,000 resamples,
the same items for both; medians over ``--repeats`` interleaved runs. The class-IL bootstrap
costs one batched matrix product per block of resamples (items grouped by class, ``s + 1``
columns: each stage's right items and the count), so its time grows with stages x items, not
with the classes.

Run: ``python benchmarks/bench_class_il_intervals.py [--tasks 20 --items 2000 --resamples 10000]``
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread, before numpy and torch load
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import json
import statistics
import time

import torch

from continual_eval import functional as F
from continual_eval.functional._class_il_intervals import class_il_bootstrap


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    T, n = args.tasks, args.items
    rows = []
    for K in (2, 10):
        task_classes = [[K * j + k for k in range(K)] for j in range(T)]
        class_task = F.check_task_classes(task_classes).class_task
        items = [torch.rand(T, n, generator=g) < 0.7 for _ in range(T)]
        labels = [torch.tensor(c)[torch.randint(0, K, (n,), generator=g)] for c in task_classes]
        times: dict[str, list[float]] = {"class_il": [], "matrix": []}
        for _ in range(args.repeats):
            start = time.perf_counter()
            class_il_bootstrap(items, labels, class_task, resamples=args.resamples)
            times["class_il"].append(time.perf_counter() - start)
            start = time.perf_counter()
            F.paired_bootstrap(items, resamples=args.resamples)
            times["matrix"].append(time.perf_counter() - start)
        median = {key: statistics.median(v) for key, v in times.items()}
        rows.append(
            {
                "classes_per_task": K,
                "class_il_s": round(median["class_il"], 3),
                "matrix_s": round(median["matrix"], 3),
                "ratio": round(median["class_il"] / median["matrix"], 2),
            }
        )
    print(json.dumps({"tasks": T, "items": n, "resamples": args.resamples, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

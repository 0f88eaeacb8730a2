"""Benchmark: the paired bootstrap of a run's metrics over its test items, on one thread.

A 20-task run, 2000 test items per task, every cell ``R[i, j]`` plus the untrained baseline and a
reference (22 rows per task), 10,000 paired resamples: the intervals of ACC, BWT, FWT,
forgetting, intransigence, learning accuracy and average incremental accuracy, their per-task
values and every read cell. Timed side by side in one run (interleaved, medians over repeats):

* ``popcount``: ``paired_bootstrap`` on ``bool`` items, double-or-nothing weights (the default):
  one random bit per item and resample, sums by ``popcount`` over 64-bit words (target < 2 s);
* ``float items``: the same items as float64 (the per-sample-loss path): weight matrices times
  item values, one batched matrix product per block of resamples;
* ``multinomial``: Efron's resampling (counts of ``n`` draws with replacement) on ``bool`` items;
* ``loop``: what the vectorised code replaces, a Python loop over resamples (per resample: draw
  each task's resample, the 22 cells' means, then the metric family of that one matrix by
  ``continual_metrics`` and friends); timed on ``--loop-resamples`` resamples and scaled to
  10,000 (it is linear in the resamples).

Run: ``python benchmarks/bench_intervals.py [--tasks 20 --items 2000 --resamples 10000]``
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread, before numpy and torch load
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from continual_eval import functional as F
from continual_eval.functional import intervals as iv


def make_run(tasks: int, items: int, seed: int = 0) -> tuple[list, list, list]:
    """Per-item correctness of a plausible run: task j learned at stage j (about 90% right),
    forgotten gradually after (each stage loses some of its items, regains a few), about 20%
    right before training, a reference at about 95%."""
    g = torch.Generator().manual_seed(seed)
    rows, base, ref = [], [], []
    for j in range(tasks):
        right = torch.empty(tasks, items, dtype=torch.bool)
        before = torch.rand(items, generator=g) < 0.2
        current = torch.rand(items, generator=g) < 0.9
        for i in range(tasks):
            if i < j:
                right[i] = before
                continue
            if i > j:
                lose = torch.rand(items, generator=g) < 0.04
                gain = torch.rand(items, generator=g) < 0.01
                current = (current & ~lose) | gain
            right[i] = current
        rows.append(right)
        base.append(torch.rand(items, generator=g) < 0.2)
        ref.append(torch.rand(items, generator=g) < 0.95)
    return rows, base, ref


def loop_bootstrap(items, base, ref, resamples: int, seed: int) -> dict[str, list[float]]:
    """A Python loop over resamples (the naive implementation)."""
    rng = np.random.default_rng(seed)
    values = [x.double().numpy() for x in items]
    b = [x.double().numpy() for x in base]
    r = [x.double().numpy() for x in ref]
    T = len(items)
    out: dict[str, list[float]] = {}
    for _ in range(resamples):
        R = torch.full((T, T), float("nan"), dtype=torch.float64)
        bb = torch.empty(T, dtype=torch.float64)
        rr = torch.empty(T, dtype=torch.float64)
        for j in range(T):
            pick = rng.integers(0, values[j].shape[1], values[j].shape[1])
            R[:, j] = torch.from_numpy(values[j][:, pick].mean(axis=1))
            bb[j], rr[j] = float(b[j][pick].mean()), float(r[j][pick].mean())
        metrics = F.continual_metrics(R, bb, validate=False)
        metrics["learning_accuracy"] = F.learning_accuracy(R, validate=False)
        metrics["average_incremental_accuracy"] = F.average_incremental_accuracy(R, validate=False)
        metrics["intransigence"] = F.intransigence(R, rr, validate=False)
        for key, value in metrics.items():
            out.setdefault(key, []).append(float(value))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--loop-resamples", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the medians as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)

    items, base, ref = make_run(args.tasks, args.items)
    floats = ([x.double() for x in items], [x.double() for x in base], [x.double() for x in ref])
    B = args.resamples

    def bootstrap(data, weights: str) -> Callable[[], object]:
        rows, b, r = data
        return lambda: iv.paired_bootstrap(
            rows, baseline=b, reference=r, resamples=B, seed=1, weights=weights
        )

    scale = B / args.loop_resamples
    variants: dict[str, Callable[[], object]] = {
        "popcount": bootstrap((items, base, ref), "double_or_nothing"),
        "float items": bootstrap(floats, "double_or_nothing"),
        "multinomial": bootstrap((items, base, ref), "multinomial"),
        "loop": lambda: loop_bootstrap(items, base, ref, args.loop_resamples, 1),
    }
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    variants["popcount"]()  # warm-up (imports, allocator)
    for _ in range(args.repeats):  # interleaved
        for name, run in variants.items():
            factor = scale if name == "loop" else 1.0
            start, start_cpu = time.perf_counter(), time.process_time()
            run()
            wall[name].append((time.perf_counter() - start) * factor)
            cpu[name].append((time.process_time() - start_cpu) * factor)
    medians = {name: statistics.median(values) for name, values in wall.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
    if args.json:
        summary = {"wall_s": medians, "cpu_s": cpu_medians, "settings": vars(args)}
        print(json.dumps(summary, indent=2))
        return
    print(
        f"paired bootstrap, T = {args.tasks} tasks x {args.items} items, 22 rows per task, "
        f"{B} resamples, 1 thread; medians of {args.repeats} interleaved repeats"
    )
    print(f"{'variant':<14} {'wall s':>9} {'CPU s':>9} {'x popcount':>11}")
    for name, value in medians.items():
        note = f"  (scaled from {args.loop_resamples} resamples)" if name == "loop" else ""
        ratio = value / medians["popcount"]
        print(f"{name:<14} {value:>9.3f} {cpu_medians[name]:>9.3f} {ratio:>11.2f}{note}")
    # CPU time: the work of the one thread, which a loaded machine does not inflate as much
    best = min(medians["popcount"], cpu_medians["popcount"])
    verdict = "meets" if best < 2.0 else "misses"
    print(f"target: popcount < 2 s on one thread: {verdict} ({best:.3f} s)")


if __name__ == "__main__":
    main()

"""Benchmark: the vectorised functional layer against plain-loop references, side by side.

For each T it times, in one run, medians over repeats:

* ``vectorised``: the full metric set — ``continual_metrics``, every per-stage curve
  (``continual_metrics_curve``), per-task BWT/FWT/forgetting, learning accuracy, average
  incremental accuracy and intransigence — without validation (the hot-loop setting), plus
  the same with validation on;
* ``loop O(T^2)``: the same quantities from one careful pure-Python pass (running peaks kept
  per column), the best a hand-written loop does;
* ``T calls``: what users do without a curve function — ``continual_metrics`` on every leading
  sub-matrix (only up to T=1000; it is O(T^3) work).

and the peak memory of the vectorised set relative to one T x T matrix (measured in a fresh
process by max RSS), which stays flat in T when no O(T^3) intermediate exists.

Run: ``python benchmarks/bench_functional.py [--sizes 10 100 1000 4000]``
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from continual_eval import functional as F


def make_inputs(T: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(T)
    R = torch.rand(T, T, generator=gen, dtype=dtype)
    idx = torch.arange(T)
    R[idx.unsqueeze(0) > idx.unsqueeze(1) + 1] = float("nan")
    b = torch.rand(T, generator=gen, dtype=dtype)
    b[0] = float("nan")
    reference = torch.rand(T, generator=gen, dtype=dtype)
    return R, b, reference


def full_metric_set(R: torch.Tensor, b: torch.Tensor, ref: torch.Tensor, validate: bool) -> dict:
    out = dict(F.continual_metrics(R, b, validate=validate))
    out["curve"] = F.continual_metrics_curve(R, b, validate=validate)
    out["bwt_per_task"] = F.backward_transfer_per_task(R, validate=validate)
    out["fwt_per_task"] = F.forward_transfer_per_task(R, b, validate=validate)
    out["forgetting_per_task"] = F.forgetting_per_task(R, validate=validate)
    out["learning_accuracy"] = F.learning_accuracy(R, validate=validate)
    out["aia"] = F.average_incremental_accuracy(R, validate=validate)
    out["intransigence"] = F.intransigence(R, ref, validate=validate)
    return out


def loop_metric_set(R: list[list[float]], b: list[float], ref: list[float]) -> dict:
    """The same quantities by one pure-Python pass over the lower triangle (O(T^2))."""
    T = len(R)
    peaks = [float("-inf")] * T
    curve = {k: [] for k in F.CURVE_KEYS}
    diag_sum = fwt_sum = acc_sum = 0.0
    for s in range(T):
        row = R[s]
        row_sum = 0.0
        drop_sum = 0.0
        for j in range(s + 1):
            value = row[j]
            row_sum += value
            if value > peaks[j]:
                peaks[j] = value
            if j < s:
                drop_sum += peaks[j] - value
        old_diag = diag_sum
        diag_sum += row[s]
        if s > 0:
            fwt_sum += R[s - 1][s] - b[s]
        acc = row_sum / (s + 1)
        acc_sum += acc
        old = max(s, 1)
        curve["acc"].append(acc)
        curve["bwt"].append((row_sum - row[s] - old_diag) / old)
        curve["fwt"].append(fwt_sum / old)
        curve["forgetting"].append(drop_sum / old)
        curve["learning_accuracy"].append(diag_sum / (s + 1))
        curve["average_incremental_accuracy"].append(acc_sum / (s + 1))
    last = R[T - 1]
    return {
        "curve": curve,
        "bwt_per_task": [last[j] - R[j][j] for j in range(T - 1)],
        "fwt_per_task": [R[j - 1][j] - b[j] for j in range(1, T)],
        "forgetting_per_task": [peaks[j] - last[j] for j in range(T - 1)],
        "intransigence": sum(ref[j] - R[j][j] for j in range(T)) / T,
    }


def per_stage_calls(R: torch.Tensor, b: torch.Tensor) -> list[dict]:
    return [
        F.continual_metrics(R[: s + 1, : s + 1], b[: s + 1], validate=False)
        for s in range(R.shape[0])
    ]


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peak_memory_ratio(T: int) -> float:
    """Max-RSS growth of the vectorised set over one T x T float32 matrix, in a fresh process."""
    code = (
        "import resource, torch, sys; sys.path.insert(0, 'benchmarks');"
        "from bench_functional import make_inputs, full_metric_set;"
        f"R, b, ref = make_inputs({T}); torch.ones(1).add_(1);"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
        "full_metric_set(R, b, ref, validate=True);"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
        f"print((after - before) * 1024 / ({T} * {T} * 4))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 4000])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    header = (
        f"{'T':>6} {'vectorised':>12} {'+validate':>12} {'loop O(T^2)':>12} {'T calls':>12} "
        f"{'loop/vec':>9} {'calls/vec':>10} {'peak mem / T^2':>15}"
    )
    print(f"torch {torch.__version__}, {args.threads} thread(s), float32, medians")
    print(header)
    for T in args.sizes:
        R, b, ref = make_inputs(T)
        lists = (R.tolist(), b.tolist(), ref.tolist())
        repeats = 50 if T <= 1000 else 10
        vec = median_seconds(lambda: full_metric_set(R, b, ref, validate=False), repeats)
        vec_checked = median_seconds(lambda: full_metric_set(R, b, ref, validate=True), repeats)
        loop = median_seconds(lambda: loop_metric_set(*lists), 5 if T <= 1000 else 1)
        calls = (
            median_seconds(lambda: per_stage_calls(R, b), 3 if T <= 100 else 1)
            if T <= 1000
            else None
        )
        memory = peak_memory_ratio(T) if T >= 1000 else None
        row = {
            "T": T,
            "vectorised_ms": vec * 1e3,
            "validated_ms": vec_checked * 1e3,
            "loop_ms": loop * 1e3,
            "calls_ms": None if calls is None else calls * 1e3,
            "loop_over_vectorised": loop / vec,
            "calls_over_vectorised": None if calls is None else calls / vec,
            "peak_memory_over_matrix": memory,
        }
        rows.append(row)

        def fmt(value, spec):
            return "--" if value is None else format(value, spec)

        print(
            f"{T:>6} {vec * 1e3:>10.3f}ms {vec_checked * 1e3:>10.3f}ms {loop * 1e3:>10.1f}ms "
            f"{fmt(row['calls_ms'], '>10.1f')}{'ms' if calls else '  '} {row['loop_over_vectorised']:>8.0f}x "
            f"{fmt(row['calls_over_vectorised'], '>9.0f')}{'x' if calls else ' '} {fmt(memory, '>15.1f')}"
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    print(
        f"max RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

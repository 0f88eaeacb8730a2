"""Benchmark: the vectorised functional layer against plain-loop references, side by side.

For each T it times, in one run, medians over repeats:

* ``vectorised``: the full metric set — ACC, BWT, FWT, forgetting, learning accuracy, average
  incremental accuracy and intransigence, each after every stage (the curves) and per task — by
  ``all_continual_metrics`` without validation (the hot-loop setting), plus the same with
  validation on;
* ``lower``: the same set for a lower-is-better score (``-R``, ``higher_is_better=False``,
  ``bounds=None``, without validation): the running-minimum scan served by negation;
* ``plain loop``: the plain-loop reference the tests use as their oracle (tests/reference.py:
  every metric of every leading sub-matrix by explicit loops, as one writes it by hand from the
  formulas; O(T^3), so measured once at T=1000 and skipped above);
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
from pathlib import Path

import torch

from continual_eval import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from reference import reference_curve  # the tests' plain-loop oracle


def make_inputs(T: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(T)
    R = torch.rand(T, T, generator=gen, dtype=dtype)
    idx = torch.arange(T)
    R[idx.unsqueeze(0) > idx.unsqueeze(1) + 1] = float("nan")
    b = torch.rand(T, generator=gen, dtype=dtype)
    b[0] = float("nan")
    reference = torch.rand(T, generator=gen, dtype=dtype)
    return R, b, reference


def full_metric_set(
    R: torch.Tensor, b: torch.Tensor, ref: torch.Tensor, validate: bool, **direction: object
) -> dict:
    """Every metric, after every stage and per task, with intransigence: one call."""
    return F.all_continual_metrics(R, b, ref, validate=validate, **direction)


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
    """Peak resident-memory growth of the vectorised set, in units of one T x T float32 matrix,
    measured in a fresh process (the kernel's peak-RSS mark is reset just before the call)."""
    code = (
        "import sys, torch; sys.path.insert(0, 'benchmarks');"
        "from bench_functional import make_inputs, full_metric_set, rss_kib;"
        f"R, b, ref = make_inputs({T});"
        "open('/proc/self/clear_refs', 'w').write('5'); before = rss_kib('VmRSS');"
        "full_metric_set(R, b, ref, validate=True);"
        f"print((rss_kib('VmHWM') - before) * 1024 / ({T} * {T} * 4))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def rss_kib(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process from /proc/self/status, in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def measure(T: int) -> dict:
    """Medians for one size; the loop and T-calls references run fewer repeats (they are slow)."""
    R, b, ref = make_inputs(T)
    lists = (R.tolist(), b.tolist(), ref.tolist())
    repeats = 50 if T <= 1000 else 10
    vec = median_seconds(lambda: full_metric_set(R, b, ref, validate=False), repeats)
    checked = median_seconds(lambda: full_metric_set(R, b, ref, validate=True), repeats)
    loss = (-R, -b, -ref)  # a lower-is-better score
    lower = median_seconds(
        lambda: full_metric_set(*loss, validate=False, higher_is_better=False, bounds=None),
        repeats,
    )
    loop = median_seconds(lambda: loop_metric_set(*lists), 5 if T <= 1000 else 1)
    plain = None
    if T <= 1000:
        plain = median_seconds(lambda: reference_curve(lists[0], lists[1]), 5 if T <= 100 else 1)
    calls = None
    if T <= 1000:
        calls = median_seconds(lambda: per_stage_calls(R, b), 3 if T <= 100 else 1)
    return {
        "T": T,
        "vectorised_ms": vec * 1e3,
        "validated_ms": checked * 1e3,
        "lower_ms": lower * 1e3,
        "lower_over_vectorised": lower / vec,
        "plain_loop_ms": None if plain is None else plain * 1e3,
        "plain_loop_over_vectorised": None if plain is None else plain / vec,
        "loop_ms": loop * 1e3,
        "calls_ms": None if calls is None else calls * 1e3,
        "loop_over_vectorised": loop / vec,
        "calls_over_vectorised": None if calls is None else calls / vec,
        "peak_memory_over_matrix": peak_memory_ratio(T) if T >= 100 else None,
    }


def format_row(row: dict) -> str:
    def cell(value: float | None, spec: str, unit: str = "") -> str:
        return ("--" if value is None else format(value, spec) + unit).rjust(12)

    return " ".join(
        [
            f"{row['T']:>6}",
            cell(row["vectorised_ms"], ".3f", "ms"),
            cell(row["validated_ms"], ".3f", "ms"),
            cell(row["lower_ms"], ".3f", "ms"),
            cell(row["plain_loop_ms"], ".1f", "ms"),
            cell(row["loop_ms"], ".1f", "ms"),
            cell(row["calls_ms"], ".1f", "ms"),
            cell(row["lower_over_vectorised"], ".2f", "x"),
            cell(row["plain_loop_over_vectorised"], ".0f", "x"),
            cell(row["loop_over_vectorised"], ".1f", "x"),
            cell(row["calls_over_vectorised"], ".0f", "x"),
            cell(row["peak_memory_over_matrix"], ".1f"),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 4000])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    names = ["vectorised", "+validate", "lower", "plain loop", "loop O(T^2)", "T calls"]
    names += ["lower/vec", "plain/vec", "O(T^2)/vec", "calls/vec"]
    header = f"{'T':>6} " + " ".join(f"{n:>12}" for n in [*names, "mem / T^2"])
    print(f"torch {torch.__version__}, {args.threads} thread(s), float32, medians")
    print(header)
    for T in args.sizes:
        row = measure(T)
        rows.append(row)
        print(format_row(row))
    if args.json:
        print(json.dumps(rows, indent=2))
    max_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max RSS of this process: {max_rss_mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

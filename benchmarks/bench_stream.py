"""Benchmark: read and score a one-million-step reward stream.

    PYTHONPATH=src python benchmarks/bench_stream.py [--part score|read|all] [--steps 1000000]

``score``: the median wall time of ``compute_all_metrics`` (vectorised) and of a plain-loop
reference computing the same core metrics, side by side with their ratio, checking both agree.
Target: scoring 1M steps under 2 s.

``read``: writes the trace as a JSON-lines file (about 60 bytes a line) and reads it back with
``read_jsonl`` (msgspec, typed schema, columnar) and with the previous stdlib reader
(``json.loads`` per line into ``EpisodeStep`` objects), each repeat in a fresh process so its
peak RSS is its own; prints median read time, median read+score time, peak RSS and the growth of
RSS over the imports, with ratios, and checks both readers give the same columns. Target: read
and score 1M lines under 2 s, memory O(columns).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from continual_eval.stream import EpisodeStep, EpisodeTrace, compute_all_metrics, read_jsonl


def make_trace(n_steps: int, n_intervals: int, seed: int = 0) -> EpisodeTrace:
    """Regimes a, b, c cycle; every third visit to a is scheduled as the alias a_again."""
    rng = np.random.default_rng(seed)
    names = ["a", "b", "c", "a_again"]
    cuts = np.sort(rng.choice(np.arange(1, n_steps), size=n_intervals - 1, replace=False))
    lengths = np.diff(np.concatenate(([0], cuts, [n_steps])))
    codes_iv = np.arange(n_intervals) % 3
    codes_iv[(np.arange(n_intervals) % 9) == 6] = 3
    code = np.repeat(codes_iv, lengths)
    level = np.array([0.8, 0.3, 0.5, 0.6])[code]
    reward = level + rng.normal(0.0, 0.2, size=n_steps)
    invalid = (rng.uniform(size=n_steps) < 0.05).astype(np.float64)
    solved = (reward > 0.6).astype(np.float64)
    return EpisodeTrace.from_arrays(
        reward,
        code,
        regime_names=names,
        origin_of={"a_again": "a"},
        components={"solved": solved},
        invalid_action=invalid,
    )


def loop_reference(trace: EpisodeTrace, gamma: float = 0.99) -> dict[str, dict[str, float]]:
    """The core metrics one step at a time: J, adaptation, recovery, variance, settled, returns."""
    rewards = trace.reward.tolist()
    labels = trace.regime_id
    roots = trace.roots
    intervals: list[tuple[str, int, int]] = []
    start = 0
    for t in range(1, len(rewards) + 1):
        if t == len(rewards) or labels[t] != labels[start]:
            intervals.append((labels[start], start, t))
            start = t
    stats: dict[str, dict[str, list[float]]] = {}
    encounters: dict[str, list[float]] = {}
    for j, (z, a, b) in enumerate(intervals):
        s = stats.setdefault(z, {"adapt": [], "rec": [], "tail": []})
        L = b - a
        running, acc, peak = [], 0.0, -math.inf
        for tau in range(1, L + 1):
            acc += rewards[a + tau - 1]
            m = acc / tau
            running.append(m)
            peak = max(peak, m)
        n_tail = max(-(-L // 5), 1)
        tail = sum(rewards[b - n_tail : b]) / n_tail
        s["tail"].append(tail)
        encounters.setdefault(roots[z], []).append(acc / L)
        if j == 0:
            continue
        thr = 0.9 * peak
        s["adapt"].append(next((tau for tau, m in enumerate(running, 1) if m >= thr), L))
        band = max(0.3 * abs(tail), 0.005)
        rec = next((tau for tau, m in enumerate(running, 1) if abs(m - tail) <= band), None)
        if rec is not None:
            s["rec"].append(rec)
    out: dict[str, dict[str, float]] = {}
    sums: dict[str, list[float]] = {}
    disc: dict[str, float] = {}
    g = 1.0
    for r, z in zip(rewards, labels, strict=True):
        sums.setdefault(z, []).append(r)
        disc[z] = disc.get(z, 0.0) + g * r
        g *= gamma
    for z, rs in sums.items():
        mean = sum(rs) / len(rs)
        enc = encounters[roots[z]]
        s = stats[z]
        out[z] = {
            "per_configuration_reward": mean,
            "stability_variance": sum((r - mean) ** 2 for r in rs) / (len(rs) - 1),
            "adaptation_speed": sum(s["adapt"]) / len(s["adapt"]) if s["adapt"] else None,
            "recovery_time": sum(s["rec"]) / len(s["rec"]) if s["rec"] else None,
            "settled_reward": sum(s["tail"]) / len(s["tail"]),
            "forgetting": enc[0] - enc[1] if len(enc) > 1 else None,
            "discounted_return": disc[z],
            "undiscounted_return": sum(rs),
        }
    return out


def median_time(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def write_trace_file(trace: EpisodeTrace, path: Path) -> int:
    """Write the trace as JSON lines (step, reward, label, alias origin); returns the bytes."""
    names = trace.regime_names
    origin = trace.origin_of
    tails = [
        f', "regime_id": "{z}"' + (f', "regime_origin": "{origin[z]}"}}' if z in origin else "}")
        for z in names
    ]
    rows = zip(trace.step.tolist(), trace.reward.tolist(), trace.regime_code.tolist(), strict=True)
    with open(path, "w", encoding="utf-8") as fh:
        for step, reward, code in rows:
            fh.write(f'{{"step": {step}, "reward": {reward!r}{tails[code]}\n')
    return path.stat().st_size


def stdlib_read_jsonl(path: Path) -> EpisodeTrace:
    """The previous reader: ``json.loads`` per line, one ``EpisodeStep`` object per line."""
    steps = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                r = json.loads(line)
                steps.append(
                    EpisodeStep(
                        step=int(r["step"]),
                        reward=float(r["reward"]),
                        regime_id=str(r["regime_id"]),
                        regime_origin=r.get("regime_origin"),
                        components=r.get("components"),
                        invalid_action=r.get("invalid_action"),
                        effective_rank=r.get("effective_rank"),
                        episode_end=bool(r.get("episode_end", False)),
                    )
                )
    return EpisodeTrace(steps=steps)


READERS = {"msgspec": read_jsonl, "stdlib": stdlib_read_jsonl}


def current_rss() -> int:
    """Resident memory now, in bytes (Linux ``/proc``; elsewhere the peak so far)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * resource.getpagesize()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def read_child(reader: str, path: Path) -> None:
    """Run in a fresh process: read (and score) once, print timings and RSS as one JSON line."""
    base = current_rss()
    t0 = time.perf_counter()
    trace = READERS[reader](path)
    t1 = time.perf_counter()
    peak_read = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    compute_all_metrics(trace)
    t2 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    digest = [
        float(trace.reward.sum()),
        int(trace.step.sum()),
        list(trace.regime_names),
        trace.regime_code.tolist()[:: max(1, len(trace) // 1000)],
        trace.origin_of,
    ]
    out = {"read": t1 - t0, "score": t2 - t1, "peak": peak, "base": base, "peak_read": peak_read}
    out["digest"] = digest
    print(json.dumps(out))


def bench_read(trace: EpisodeTrace, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        size = write_trace_file(trace, path)
        print(f"\nfile: {len(trace):,} lines, {size / 1e6:.1f} MB")
        results: dict[str, list[dict]] = {name: [] for name in READERS}
        for _ in range(repeats):  # interleaved, so both readers see the same machine load
            for name in READERS:
                cmd = [sys.executable, __file__, "--read-child", name, str(path)]
                proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
                results[name].append(json.loads(proc.stdout.splitlines()[-1]))
        digests = {json.dumps(r["digest"]) for rs in results.values() for r in rs}
        assert len(digests) == 1, "the readers disagree"

        def med(name: str, key: str) -> float:
            return statistics.median(
                r["read"] + r["score"] if key == "total" else r[key] for r in results[name]
            )

        print(
            f"{'reader':<10}{'read [s]':>10}{'read+score [s]':>16}{'peak RSS [MB]':>15}"
            f"{'read RSS growth [MB]':>22}{'repeats':>9}"
        )
        grown = {
            name: statistics.median(r["peak_read"] - r["base"] for r in results[name])
            for name in READERS
        }
        for name in READERS:
            growth = grown[name]
            print(
                f"{name:<10}{med(name, 'read'):>10.3f}{med(name, 'total'):>16.3f}"
                f"{med(name, 'peak') / 1e6:>15.0f}{growth / 1e6:>22.0f}{repeats:>9}"
            )
        new, old = "msgspec", "stdlib"
        print(
            f"ratios stdlib/msgspec: read {med(old, 'read') / med(new, 'read'):.1f}x, "
            f"read+score {med(old, 'total') / med(new, 'total'):.1f}x, "
            f"peak RSS {med(old, 'peak') / med(new, 'peak'):.1f}x, "
            f"read RSS growth {grown[old] / grown[new]:.1f}x; readers agree"
        )
        status = "OK" if med(new, "total") < 2.0 else "MISSED"
        print(f"target (< 2 s to read and score {len(trace):,} lines): {status}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("score", "read", "all"), default="all")
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--intervals", type=int, default=2_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--loop-repeats", type=int, default=3)
    ap.add_argument("--read-repeats", type=int, default=3)
    ap.add_argument("--read-child", nargs=2, metavar=("READER", "FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.read_child:
        read_child(args.read_child[0], Path(args.read_child[1]))
        return

    t0 = time.perf_counter()
    trace = make_trace(args.steps, args.intervals)
    build = time.perf_counter() - t0
    if args.part in ("read", "all"):
        bench_read(trace, args.read_repeats)
    if args.part == "read":
        return
    kwargs = {"solve_component": "solved"}
    vec_t, vec = median_time(lambda: compute_all_metrics(trace, **kwargs), args.repeats)
    loop_t, ref = median_time(lambda: loop_reference(trace), args.loop_repeats)

    worst = 0.0
    for z, row in ref.items():
        for key, want in row.items():
            got = vec["per_regime"][z][key]
            if want is None or got is None:
                assert want is got, (z, key, want, got)
                continue
            worst = max(worst, abs(got - want) / max(1.0, abs(want)))
    print(f"trace: {args.steps:,} steps, {args.intervals:,} intervals, built in {build:.3f} s")
    print(f"{'implementation':<28}{'median [s]':>12}{'repeats':>9}")
    print(f"{'vectorised (compute_all)':<28}{vec_t:>12.3f}{args.repeats:>9}")
    print(f"{'plain loop (core metrics)':<28}{loop_t:>12.3f}{args.loop_repeats:>9}")
    print(f"speed-up: {loop_t / vec_t:.1f}x   max relative difference: {worst:.2e}")
    status = "OK" if vec_t < 2.0 else "MISSED"
    print(f"target (< 2 s for the vectorised scoring): {status}")


if __name__ == "__main__":
    main()

"""Cost of per-item records (``item_records=``) against a stage's evaluation without them.

One stage-end evaluation of T tasks x n test items (a small MLP, accuracy + cross-entropy, one
thread), side by side in one run, interleaved: ``evaluate_tasks`` without item records, and with
both scorers' items kept and gathered (``item_scorers``) plus what the record does with them
(bit-packing the 0/1 items, storing the losses: ``ItemRecord.record_stage``). Separately: the
intervals and transitions built from the record of a whole run (T stages), what every
``results.json`` write computes once (the paired bootstrap, 10,000 resamples by default).
The same for an in-stage (per-step) evaluation, which scores the tasks seen so far (stage
``T // 2``: ``T // 2 + 1`` tasks), with and without its items kept (``ItemRecord.record_step``),
and the step-curve metrics' paired bootstrap (``step_bootstrap``) of a run with
``--step-evals`` per-step evaluations per stage.

    python benchmarks/bench_items.py                       # T=20 tasks x 2000 items
    python benchmarks/bench_items.py --tasks 5 --repeats 5 # quick

Prints medians and ratios (target: records <= 1.10x the evaluation without them, at the stage
end and in-stage).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval._item_record import ItemRecord, ItemSettings
from continual_eval.evaluation import evaluate_tasks
from continual_eval.functional._step_intervals import step_bootstrap
from continual_eval.record import MatrixSpec, Scored

FEATURES, CLASSES = 64, 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--test-size", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--step-evals", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    T, n = args.tasks, args.test_size
    model = nn.Sequential(
        nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, CLASSES)
    ).eval()
    loaders = [
        DataLoader(
            TensorDataset(torch.randn(n, FEATURES), torch.randint(0, CLASSES, (n,))),
            batch_size=args.batch_size,
        )
        for _ in range(T)
    ]
    scorers = ["accuracy", "cross_entropy"]
    specs = {"acc": MatrixSpec("accuracy"), "loss": MatrixSpec("cross_entropy", False, None)}
    record = ItemRecord(
        specs, {"acc": True, "loss": False}, {}, T, ItemSettings(resamples=args.resamples)
    )

    def plain() -> None:
        evaluate_tasks(model, loaders, range(T), scorers=scorers)

    def with_items() -> Scored:
        ev = evaluate_tasks(model, loaders, range(T), scorers=scorers, item_scorers=(0, 1))
        return Scored.from_evaluation(["acc", "loss"], ev, T)

    record.record_baseline(with_items())
    stage = [0]

    def recorded() -> None:
        scored = with_items()
        record.record_stage(min(stage[0], T - 1), scored)
        stage[0] = min(stage[0] + 1, T - 1)
        record.stages = record.stages[: T - 1]

    seen = range(T // 2 + 1)  # an in-stage evaluation of stage T // 2: the tasks seen so far

    def step_plain() -> None:
        evaluate_tasks(model, loaders, seen, scorers=scorers)

    def step_recorded() -> None:
        ev = evaluate_tasks(model, loaders, seen, scorers=scorers, item_scorers=(0, 1))
        record.record_step(1, T // 2, Scored.from_evaluation(["acc", "loss"], ev, T))
        record.steps = []

    cases = (
        ("plain", plain),
        ("records", recorded),
        ("step plain", step_plain),
        ("step records", step_recorded),
    )
    for _, fn in cases:  # warm-up
        fn()
    record.stages = []
    stage[0] = 0
    times: dict[str, list[float]] = {key: [] for key, _ in cases}
    for _ in range(args.repeats):
        for key, fn in cases:
            start = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - start)
    med = {key: statistics.median(v) for key, v in times.items()}
    base, kept = med["plain"], med["records"]
    print(f"T={T} tasks x {n} items, batch {args.batch_size}, 1 thread, {args.repeats} repeats")
    print(f"{'':40s} {'median (ms)':>12s} {'ratio':>7s}")
    print(f"{'stage evaluation, no item records':40s} {base * 1e3:12.1f} {1.0:7.3f}")
    print(f"{'stage evaluation + item records':40s} {kept * 1e3:12.1f} {kept / base:7.3f}")
    step_base, step_kept = med["step plain"], med["step records"]
    print(f"{'in-stage evaluation, no item records':40s} {step_base * 1e3:12.1f} {1.0:7.3f}")
    print(
        f"{'in-stage evaluation + item records':40s} {step_kept * 1e3:12.1f} "
        f"{step_kept / step_base:7.3f}"
    )
    # a full record: T stages; the results a results.json write builds from it
    full = ItemRecord(
        specs, {"acc": True, "loss": False}, {}, T, ItemSettings(resamples=args.resamples)
    )
    full.record_baseline(with_items())
    scored = with_items()
    for i in range(T):
        full.record_stage(i, scored)
    builds = []
    for _ in range(3):
        full._cache = None
        start = time.perf_counter()
        full.results(T)
        builds.append(time.perf_counter() - start)
    print(
        f"{'intervals + transitions of T stages':40s} {statistics.median(builds) * 1e3:12.1f} "
        f"(2 matrices, {args.resamples} resamples; {full.memory_bytes / 2**20:.2f} MiB held)"
    )
    # the step-curve metrics of a run with m per-step evaluations per stage (0/1 items)
    m = args.step_evals
    stage_of = torch.arange(T).repeat_interleave(m + 1)  # m per-step evaluations + the end
    steps = torch.arange(1, len(stage_of) + 1)
    E = 1 + T + len(stage_of)
    g = torch.Generator().manual_seed(1)
    values = [torch.rand(E, n, generator=g) < 0.7 for _ in range(T)]
    evaluated = torch.ones(E, T, dtype=torch.bool)
    evaluated[1 + T :] = torch.arange(T).unsqueeze(0) <= stage_of.unsqueeze(1)
    start = time.perf_counter()
    step_bootstrap(values, evaluated, stage_of, steps, T, resamples=args.resamples, seed=0)
    took = time.perf_counter() - start
    print(
        f"{'step-curve intervals of T stages':40s} {took * 1e3:12.1f} "
        f"(1 matrix, {len(stage_of)} curve evaluations, {args.resamples} resamples)"
    )


if __name__ == "__main__":
    main()

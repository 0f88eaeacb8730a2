"""Cost of ContinualEvalCallback against the floor: a bare ``torch.inference_mode()`` loop.

Per stage: the time the callback adds (evaluation of every task, the reduction, results.json and
scores.csv) against a bare loop over the same loaders with the same model (argmax, count hits).
Whole run: wall time of ``fit_tasks`` with the callback against the same task sequence without it.

Per-step evaluation (``eval_every_n_steps``), side by side in one run, one evaluation of all T
tasks each: the compute floor (the same model over the same batches already collated on the
device), the plain DataLoader loop, and the callback's evaluation (``evaluate`` below, what every
per-step evaluation runs) with ``cache_test_batches=True`` and ``False``.

    python benchmarks/bench_callback.py                  # T=20 tasks x 10k test samples
    python benchmarks/bench_callback.py --tasks 5 --test-size 2000 --repeats 3   # quick
    python benchmarks/bench_callback.py --section step --step-test-size 10000    # bigger
    python benchmarks/bench_callback.py --section eval       # stage eval, cached run vs floor
    python benchmarks/bench_callback.py --section workers    # num_workers=2: one pool vs per task
    python benchmarks/bench_callback.py --section scorers    # 4 scorers in one pass vs accuracy
    python benchmarks/bench_callback.py --section floor      # stage eval / floor, MLP 32-64-64-2
    python benchmarks/bench_callback.py --section hook       # whole stage hook / floor, the same
    python benchmarks/bench_callback.py --quick              # every section, short

Prints medians and ratios (targets: per-stage ratio <= 1.15; per-step evaluation with caching
<= 1.5x the compute floor, without caching <= 1.15x the plain DataLoader loop; accuracy + loss +
top-5 + a torchmetrics F1 in one evaluation <= 1.25x accuracy alone).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import warnings

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, evaluation, fit_tasks
from continual_eval.evaluation import (
    AccuracyScorer,
    LossScorer,
    MetricScorer,
    TopKAccuracyScorer,
    evaluate_tasks,
)

FEATURES, CLASSES = 64, 10


class MLP(pl.LightningModule):
    def __init__(self, classes: int = CLASSES, features: int = FEATURES, hidden: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def make_data(
    tasks: int,
    test_size: int,
    train_size: int,
    batch_size: int,
    classes: int = CLASSES,
    features: int = FEATURES,
):
    g = torch.Generator().manual_seed(0)
    train, test = [], []
    for _ in range(tasks):
        means = torch.randn(classes, features, generator=g)

        def sample(n, means=means):
            y = torch.randint(0, classes, (n,), generator=g)
            return TensorDataset(means[y] + torch.randn(n, features, generator=g), y)

        train.append(DataLoader(sample(train_size), batch_size=batch_size, shuffle=True))
        test.append(DataLoader(sample(test_size), batch_size=batch_size))
    return train, test


def evaluate(cb: ContinualEvalCallback, tr: pl.Trainer, model, tasks) -> dict[str, torch.Tensor]:
    """What a per-step or stage-end evaluation of ``tasks`` runs inside the callback: its
    scoring adapter over its own loaders (private names, read here only: the one place a
    benchmark times the evaluation alone, without the hooks and files around it)."""
    record = cb.record
    assert record is not None
    return dict(cb._scoring.score(tr, model, record, list(tasks), stage=record.num_stages).rows)


def floor_pass(model: nn.Module, loaders) -> float:
    """The bare loop: inference mode, argmax, count; one host sync at the end. ``loaders``: one
    iterable of ``(x, y)`` batches per task (DataLoaders, or batches already collated on the
    device: the compute floor)."""
    start = time.perf_counter()
    model.eval()
    with torch.inference_mode():
        correct = []
        for loader in loaders:
            hits = torch.zeros((), dtype=torch.int64)
            for x, y in loader:
                hits += (model(x).argmax(1) == y).sum()
            correct.append(hits)
        torch.stack(correct).tolist()
    model.train()
    return time.perf_counter() - start


class TimedCallback(ContinualEvalCallback):
    """Times each stage's evaluation + recording (files, metrics) and, next to it on the same model,
    the bare loop; the order alternates between stages so neither side always gets a warm cache."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stage_seconds: list[float] = []
        self.floor_seconds: list[float] = []

    def _record_stage(self, trainer, pl_module, stage):
        loaders = self._loaders
        if stage % 2:
            self.floor_seconds.append(floor_pass(pl_module, loaders))
        start = time.perf_counter()
        super()._record_stage(trainer, pl_module, stage)
        self.stage_seconds.append(time.perf_counter() - start)
        if not stage % 2:
            self.floor_seconds.append(floor_pass(pl_module, loaders))


def trainer(root: str, callbacks) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )


def run_step_section(args: argparse.Namespace) -> None:
    """Per-step evaluation: floor, plain loop, callback cached / uncached, interleaved."""
    warnings.filterwarnings("ignore")
    T = args.tasks
    train, test = make_data(T, args.step_test_size, args.batch_size, args.batch_size)
    print(
        f"\nper-step evaluation: T={T} tasks x {args.step_test_size} test samples, batch "
        f"{args.batch_size}, {args.step_repeats} repeats"
    )
    with tempfile.TemporaryDirectory() as root:
        pl.seed_everything(0, verbose=False)
        model = MLP()
        common = dict(eval_every_n_steps=10**9, verbose=False, log_images=False)
        cached = ContinualEvalCallback(
            test, cache_test_batches=True, prefix="c/", dirpath=f"{root}/c", **common
        )
        uncached = ContinualEvalCallback(
            test, cache_test_batches=False, prefix="u/", dirpath=f"{root}/u", **common
        )
        tr = trainer(root, [cached, uncached])
        tr.fit(model, train[0])  # one training step: sets the callbacks up on this Trainer
        device = tr.strategy.root_device
        batches = [[(x.to(device), y.to(device)) for x, y in dl] for dl in test]
        tasks = range(T)

        def callback_pass(cb: ContinualEvalCallback) -> float:
            start = time.perf_counter()
            evaluate(cb, tr, model, tasks)
            return time.perf_counter() - start

        variants = {
            "floor (pre-collated device batches)": lambda: floor_pass(model, batches),
            "plain DataLoader loop": lambda: floor_pass(model, test),
            "callback, cached": lambda: callback_pass(cached),
            "callback, not cached": lambda: callback_pass(uncached),
        }
        for fn in variants.values():  # warm-up; fills the cache
            fn()
        times: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for rep in range(args.step_repeats):
            order = names if rep % 2 == 0 else names[::-1]  # alternate: no side always first
            for name in order:
                times[name].append(variants[name]())
        cache = cached._task_loaders.cache
        print(f"cache holds {cache.nbytes / 2**20:.1f} MB ({cache.num_cached} test sets)")
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, m in med.items():
        print(f"  {name:38s} median {m * 1e3:8.1f} ms")

    def paired(a: str, b: str) -> float:
        """Median over repeats of the ratio of two measurements taken next to each other."""
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    floor, plain, cached_name, uncached_name = names
    print(
        f"cached / floor: {paired(cached_name, floor):.3f} (target <= 1.5); "
        f"not cached / plain loop: {paired(uncached_name, plain):.3f} (target <= 1.15); "
        f"plain loop / floor: {paired(plain, floor):.2f}; not cached / cached: "
        f"{paired(uncached_name, cached_name):.2f}  (medians of per-repeat ratios)"
    )


class Shifted(torch.utils.data.Dataset):
    """A test set with a per-sample (deterministic) transform: read through its DataLoader."""

    def __init__(self, dataset: TensorDataset) -> None:
        self.x, self.y = dataset.tensors

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i] * 1.0 + 0.0, self.y[i]


def set_up(root: str, callbacks: list[ContinualEvalCallback], train) -> pl.Trainer:
    """A Trainer that ran one training step with ``callbacks`` (which sets them up on it)."""
    tr = trainer(root, callbacks)
    tr.fit(MLP(), train[0])
    return tr


def paired_ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """Median over repeats of the ratio of two measurements taken next to each other."""
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def measure(variants: dict, repeats: int) -> dict[str, list[float]]:
    """Each variant once per repeat, the order alternating so that no side is always first."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for rep in range(repeats):
        for name in names if rep % 2 == 0 else names[::-1]:
            times[name].append(variants[name]())
    for name, t in times.items():
        print(f"  {name:44s} median {statistics.median(t) * 1e3:9.1f} ms")
    return times


def run_eval_section(args: argparse.Namespace) -> None:
    """A stage's evaluation with default settings (TensorDataset test sets, no cache) against the
    compute floor, with the fast path on and off; and a whole run's evaluations with the cache
    (T + 1 evaluations from an empty cache, first pass included) against T + 1 floor passes."""
    warnings.filterwarnings("ignore")
    T = args.tasks
    train, test = make_data(T, args.step_test_size, args.batch_size, args.batch_size)
    print(
        f"\nstage evaluation and cached run: T={T} tasks x {args.step_test_size} test samples, "
        f"batch {args.batch_size}, {args.step_repeats} repeats"
    )
    with tempfile.TemporaryDirectory() as root:
        pl.seed_everything(0, verbose=False)
        common = dict(verbose=False, log_images=False, cache_test_batches=False)
        default = ContinualEvalCallback(test, dirpath=f"{root}/d", **common)
        tr = set_up(root, [default], train)
        model = tr.lightning_module
        device = tr.strategy.root_device
        batches = [[(x.to(device), y.to(device)) for x, y in dl] for dl in test]
        tasks = range(T)

        def stage(fast: bool) -> float:
            evaluation.switches.FAST_PATH = fast
            start = time.perf_counter()
            evaluate(default, tr, model, tasks)
            elapsed = time.perf_counter() - start
            evaluation.switches.FAST_PATH = True
            return elapsed

        def cached_run() -> float:
            default._task_loaders.cache.clear()  # a new run: the first pass fills the cache
            default._task_loaders.cache_mode = True
            start = time.perf_counter()
            for _ in range(T + 1):
                evaluate(default, tr, model, tasks)
            elapsed = time.perf_counter() - start
            default._task_loaders.cache_mode = False
            return elapsed

        def floor_run() -> float:
            return sum(floor_pass(model, batches) for _ in range(T + 1))

        stage_fast, stage_plain = stage(True), stage(False)
        evaluation.switches.FAST_PATH = False
        plain_row = evaluate(default, tr, model, tasks)[default.primary]
        evaluation.switches.FAST_PATH = True
        assert torch.equal(evaluate(default, tr, model, tasks)[default.primary], plain_row)
        del stage_fast, stage_plain  # warm-up
        times = measure(
            {
                "floor (pre-collated batches)": lambda: floor_pass(model, batches),
                "plain DataLoader loop": lambda: floor_pass(model, test),
                "stage evaluation, fast path": lambda: stage(True),
                "stage evaluation, FAST_PATH=False": lambda: stage(False),
            },
            args.step_repeats,
        )
        run_times = measure(
            {"floor, T + 1 passes": floor_run, "cached, T + 1 evaluations": cached_run},
            max(3, args.step_repeats // 3),
        )
    floor = "floor (pre-collated batches)"
    print(
        f"stage evaluation / floor: {paired_ratio(times, 'stage evaluation, fast path', floor):.2f}"
        f" (target <= 1.5; FAST_PATH=False: "
        f"{paired_ratio(times, 'stage evaluation, FAST_PATH=False', floor):.2f}; plain loop: "
        f"{paired_ratio(times, 'plain DataLoader loop', floor):.2f})"
    )
    print(
        "cached whole run / floor: "
        f"{paired_ratio(run_times, 'cached, T + 1 evaluations', 'floor, T + 1 passes'):.2f} "
        "(target <= 1.5)"
    )


def run_workers_section(args: argparse.Namespace) -> None:
    """A run's T + 1 evaluations of test sets with a per-sample transform read by loaders with
    ``num_workers=2``: one persistent worker pool against a pool per loader per evaluation."""
    warnings.filterwarnings("ignore")
    T, size = args.worker_tasks, args.worker_test_size
    train, tensor_test = make_data(T, size, args.batch_size, args.batch_size)
    test = [
        DataLoader(Shifted(dl.dataset), batch_size=args.batch_size, num_workers=2)
        for dl in tensor_test
    ]
    print(f"\nworker loaders: T={T} tasks x {size} samples, num_workers=2, T + 1 evaluations")
    with tempfile.TemporaryDirectory() as root:
        pl.seed_everything(0, verbose=False)
        cb = ContinualEvalCallback(test, dirpath=f"{root}/w", verbose=False, log_images=False)
        tr = set_up(root, [cb], train)
        model = tr.lightning_module
        rows: dict[bool, list[torch.Tensor]] = {True: [], False: []}

        def whole_run(pooled: bool) -> float:
            evaluation.switches.POOLED_LOADERS = pooled
            start = time.perf_counter()
            rows[pooled] = [evaluate(cb, tr, model, range(T))[cb.primary] for _ in range(T + 1)]
            elapsed = time.perf_counter() - start
            evaluation.switches.POOLED_LOADERS = True
            while evaluation._POOLS:  # a new run starts its own pool
                evaluation._POOLS.pop().close()
            return elapsed

        times = measure(
            {
                "per-task loaders (POOLED_LOADERS=False)": lambda: whole_run(False),
                "one worker pool": lambda: whole_run(True),
            },
            args.worker_repeats,
        )
        assert all(torch.equal(a, b) for a, b in zip(rows[True], rows[False], strict=True))
    ratio = paired_ratio(times, "per-task loaders (POOLED_LOADERS=False)", "one worker pool")
    print(f"per-task loaders / one pool: {ratio:.2f} (target >= 3), equal R")


def run_scorers_section(args: argparse.Namespace) -> None:
    """One evaluation of T tasks with accuracy, cross-entropy, top-5 accuracy and a torchmetrics
    macro F1 (one forward per batch feeds all four) against the same evaluation with accuracy
    alone: same model, same loaders, interleaved. The breakdown: accuracy + F1 (what the
    torchmetrics metric costs) and accuracy + loss + top-5 (the count/sum scorers); and accuracy
    alone against the plain DataLoader loop and the compute floor (pre-collated batches). Ratios
    are medians of paired ratios, of wall time and (less noisy on a shared machine) of this
    process's CPU time."""
    from torchmetrics.classification import MulticlassF1Score

    warnings.filterwarnings("ignore")
    T = args.tasks
    _, test = make_data(T, args.step_test_size, args.batch_size, args.batch_size)
    print(
        f"\nscorers: T={T} tasks x {args.step_test_size} test samples, batch {args.batch_size}, "
        f"{args.step_repeats} repeats"
    )
    pl.seed_everything(0, verbose=False)
    model = MLP()
    batches = [list(dl) for dl in test]
    alone = [AccuracyScorer()]
    f1 = MetricScorer(MulticlassF1Score(num_classes=CLASSES, average="macro"))
    four = [AccuracyScorer(), LossScorer(), TopKAccuracyScorer(5), f1]
    results = {}
    cpu: dict[str, list[float]] = {}

    def timed(name: str, run) -> float:
        start, cpu_start = time.perf_counter(), time.process_time()
        run()
        cpu.setdefault(name, []).append(time.process_time() - cpu_start)
        return time.perf_counter() - start

    def evaluate(name: str, scorers: list) -> float:
        def run() -> None:
            results[name] = evaluate_tasks(model, test, range(T), scorers=scorers)

        return timed(name, run)

    FOUR, F1, COUNTS = "accuracy + loss + top-5 + F1", "accuracy + F1", "accuracy + loss + top-5"
    FLOOR, PLAIN, ALONE = "floor (pre-collated batches)", "plain DataLoader loop", "accuracy alone"
    variants = {
        FLOOR: lambda: timed(FLOOR, lambda: floor_pass(model, batches)),
        PLAIN: lambda: timed(PLAIN, lambda: floor_pass(model, test)),
        ALONE: lambda: evaluate(ALONE, alone),
        FOUR: lambda: evaluate(FOUR, four),
        F1: lambda: evaluate(F1, [four[0], f1]),
        COUNTS: lambda: evaluate(COUNTS, four[:3]),
    }
    for fn in variants.values():  # warm-up
        fn()
    cpu.clear()
    times = measure(variants, args.step_repeats)
    assert torch.equal(results[ALONE].scores, results[FOUR].scores)
    assert torch.equal(results[F1].scores_by_scorer[1], results[FOUR].scores_by_scorer[3])

    def ratios(a: str, b: str) -> str:
        return f"{paired_ratio(times, a, b):.3f} (CPU time {paired_ratio(cpu, a, b):.3f})"

    print(f"four scorers / accuracy alone: {ratios(FOUR, ALONE)} (target <= 1.25)")
    print(
        f"  of which: accuracy + F1 / accuracy alone {ratios(F1, ALONE)}; accuracy + loss + "
        f"top-5 / accuracy alone {ratios(COUNTS, ALONE)}"
    )
    print(
        f"accuracy alone / plain DataLoader loop: {ratios(ALONE, PLAIN)} (target <= 1.15); "
        f"/ compute floor: {ratios(ALONE, FLOOR)}  (medians of paired ratios)"
    )


#: the settings of the compute-floor comparison: (tasks, test samples per task)
FLOOR_SETTINGS = ((10, 2000), (20, 2000), (10, 10000))


def floor_setting(tasks: int, size: int, repeats: int) -> tuple[dict, dict]:
    """Wall and CPU times of the floor and of a stage's evaluation, interleaved, for one
    setting."""
    train, test = make_data(tasks, size, 128, 128, classes=2, features=32)
    times: dict[str, list[float]] = {"floor": [], "eval": []}
    cpu: dict[str, list[float]] = {"floor": [], "eval": []}
    with tempfile.TemporaryDirectory() as root:
        pl.seed_everything(0, verbose=False)
        common = dict(verbose=False, log_images=False, cache_test_batches=False)
        cb = ContinualEvalCallback(test, dirpath=f"{root}/f", **common)
        tr = trainer(root, [cb])
        model = MLP(classes=2, features=32, hidden=64)
        tr.fit(model, train[0])
        device = tr.strategy.root_device
        batches = [[(x.to(device), y.to(device)) for x, y in dl] for dl in test]
        runs = {
            "floor": lambda: floor_pass(model, batches),
            "eval": lambda: evaluate(cb, tr, model, range(tasks)),
        }
        for rep in range(repeats + 1):  # the first: warm-up
            for name in ("floor", "eval") if rep % 2 == 0 else ("eval", "floor"):
                start, cpu_start = time.perf_counter(), time.process_time()
                runs[name]()
                if rep:
                    cpu[name].append(time.process_time() - cpu_start)
                    times[name].append(time.perf_counter() - start)
    return times, cpu


def run_floor_section(args: argparse.Namespace) -> None:
    """A stage's evaluation (``evaluate`` of every task, the callback's own hook work without the
    files) against the compute floor (the same model over pre-collated batches: forward, argmax,
    count), for the MLP 32-64-64-2 at batch 128: T = 10 and 20 tasks x 2000 test samples and
    10 x 10000, interleaved; medians of paired ratios, of wall and (less noisy on a shared
    machine) CPU time. The floor is the fixed cost no evaluation avoids; the ratio's excess is
    the evaluation's own work per batch and per task."""
    warnings.filterwarnings("ignore")
    print("\ncompute floor: MLP 32-64-64-2, batch 128, torch threads", torch.get_num_threads())
    header = ("T x samples", "floor ms", "eval ms", "eval / floor", "(CPU)")
    print(f"  {header[0]:>14s} {header[1]:>9s} {header[2]:>9s} {header[3]:>13s} {header[4]:>7s}")
    for tasks, size in FLOOR_SETTINGS:
        times, cpu = floor_setting(tasks, size, args.step_repeats)
        floor, evaluation = statistics.median(times["floor"]), statistics.median(times["eval"])
        wall, cpu_ratio = paired_ratio(times, "eval", "floor"), paired_ratio(cpu, "eval", "floor")
        print(
            f"  {f'{tasks} x {size}':>14s} {floor * 1e3:9.2f} {evaluation * 1e3:9.2f} "
            f"{wall:13.3f} {cpu_ratio:7.3f}"
        )
    print("  (target: eval / floor approaching 1.3; medians of paired ratios)")


class HookTimedCallback(ContinualEvalCallback):
    """Times each stage's whole hook (``_record_stage``: evaluation, recording, the stage journal,
    ``results.json`` and the CSV files), wall and CPU time, and next to it the compute floor (the
    same model over ``batches``, pre-collated); the order alternates between stages."""

    def __init__(self, batches, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches = batches
        self.times: dict[str, list[float]] = {"floor": [], "hook": []}
        self.cpu: dict[str, list[float]] = {"floor": [], "hook": []}

    def _timed(self, name: str, run) -> None:
        start, cpu_start = time.perf_counter(), time.process_time()
        run()
        self.cpu[name].append(time.process_time() - cpu_start)
        self.times[name].append(time.perf_counter() - start)

    def _record_stage(self, trainer, pl_module, stage):
        runs = {
            "floor": lambda: floor_pass(pl_module, self.batches),
            "hook": lambda: super(HookTimedCallback, self)._record_stage(trainer, pl_module, stage),
        }
        for name in ("floor", "hook") if stage % 2 else ("hook", "floor"):
            self._timed(name, runs[name])


def hook_setting(tasks: int, size: int, runs: int) -> tuple[dict, dict]:
    """Wall and CPU times of the whole stage hook and of the floor, one pair per stage of
    ``runs`` runs of ``fit_tasks`` over ``tasks`` tasks (one training step each, logger=False)."""
    train, test = make_data(tasks, size, 128, 128, classes=2, features=32)
    times: dict[str, list[float]] = {"floor": [], "hook": []}
    cpu: dict[str, list[float]] = {"floor": [], "hook": []}
    for rep in range(runs + 1):  # the first: warm-up
        with tempfile.TemporaryDirectory() as root:
            pl.seed_everything(rep, verbose=False)
            batches = [list(dl) for dl in test]
            common = dict(verbose=False, log_images=False, cache_test_batches=False)
            cb = HookTimedCallback(batches, test, dirpath=f"{root}/h", **common)
            fit_tasks(trainer(root, [cb]), MLP(classes=2, features=32, hidden=64), train)
        if rep:
            for name in times:
                times[name] += cb.times[name]
                cpu[name] += cb.cpu[name]
    return times, cpu


def run_hook_section(args: argparse.Namespace) -> None:
    """The whole stage hook (``_record_stage``: a stage's evaluation of every task, recording the
    rows, the stage journal line, ``results.json`` and the CSV files; logger=False) against the
    compute floor (the same model over pre-collated batches), for the MLP 32-64-64-2 at batch
    128: T = 10 and 20 tasks x 2000 test samples and 10 x 10000, one pair per stage of real
    ``fit_tasks`` runs; medians of paired ratios, of wall and CPU time (the CPU time counts
    every thread of the process, a background writer's included)."""
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # no per-fit banners
    print("\nwhole stage hook: MLP 32-64-64-2, batch 128, torch threads", torch.get_num_threads())
    header = ("T x samples", "floor ms", "hook ms", "hook / floor", "(CPU)", "pairs")
    print(
        f"  {header[0]:>14s} {header[1]:>9s} {header[2]:>9s} {header[3]:>13s} {header[4]:>7s} "
        f"{header[5]:>6s}"
    )
    for tasks, size in FLOOR_SETTINGS:
        times, cpu = hook_setting(tasks, size, args.hook_runs)
        floor, hook = statistics.median(times["floor"]), statistics.median(times["hook"])
        wall, cpu_ratio = paired_ratio(times, "hook", "floor"), paired_ratio(cpu, "hook", "floor")
        print(
            f"  {f'{tasks} x {size}':>14s} {floor * 1e3:9.2f} {hook * 1e3:9.2f} "
            f"{wall:13.3f} {cpu_ratio:7.3f} {len(times['hook']):6d}"
        )
    print("  (target: hook / floor <= 1.3; medians of paired ratios, one pair per stage)")


def run(args: argparse.Namespace) -> None:
    warnings.filterwarnings("ignore")
    train, test = make_data(args.tasks, args.test_size, args.train_size, args.batch_size)
    print(
        f"T={args.tasks} tasks x {args.test_size} test samples, batch {args.batch_size}, "
        f"torch threads {torch.get_num_threads()}"
    )

    stage_ratios, run_ratios = [], []
    for rep in range(args.repeats):
        with tempfile.TemporaryDirectory() as root:
            pl.seed_everything(rep, verbose=False)
            model = MLP()
            cb = TimedCallback(test, dirpath=root, verbose=False, log_images=False)
            start = time.perf_counter()
            fit_tasks(trainer(root, [cb]), model, train)
            with_cb = time.perf_counter() - start - sum(cb.floor_seconds)

            pl.seed_everything(rep, verbose=False)
            model = MLP()
            bare = trainer(root, [])
            start = time.perf_counter()
            for task, loader in enumerate(train):
                bare.fit_loop.max_epochs = task + 1
                bare.fit(model, loader)
            without_cb = time.perf_counter() - start

        stage = statistics.median(cb.stage_seconds)
        floor = statistics.median(cb.floor_seconds)
        stage_ratios.append(
            statistics.median(
                s / f for s, f in zip(cb.stage_seconds, cb.floor_seconds, strict=True)
            )
        )
        run_ratios.append(with_cb / without_cb)
        print(
            f"repeat {rep}: stage eval median {stage * 1e3:.1f} ms, floor {floor * 1e3:.1f} ms, "
            f"ratio {stage_ratios[-1]:.3f}; whole run {with_cb:.2f} s with, "
            f"{without_cb:.2f} s without (x{with_cb / without_cb:.2f}; "
            f"{args.tasks + 1} evaluations incl. baseline)"
        )
    ratio = statistics.median(stage_ratios)
    print(f"median per-stage ratio (callback / bare inference loop): {ratio:.3f} (target <= 1.15)")
    print(f"median whole-run ratio (with / without callback): {statistics.median(run_ratios):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--test-size", type=int, default=10_000)
    parser.add_argument("--train-size", type=int, default=2_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--section",
        choices=("stage", "step", "eval", "workers", "scorers", "floor", "hook", "all"),
        default="all",
    )
    parser.add_argument("--step-test-size", type=int, default=2_000, help="step/eval sections")
    parser.add_argument("--step-repeats", type=int, default=15, help="step/eval sections")
    parser.add_argument("--hook-runs", type=int, default=3, help="hook section: fit_tasks runs")
    parser.add_argument("--worker-tasks", type=int, default=20, help="workers section")
    parser.add_argument("--worker-test-size", type=int, default=500, help="workers section")
    parser.add_argument("--worker-repeats", type=int, default=3, help="workers section")
    parser.add_argument(
        "--quick", action="store_true", help="a short run: T=5 tasks, fewer samples and repeats"
    )
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.test_size, args.repeats = 5, 2_000, 1
        args.step_repeats, args.worker_tasks, args.worker_repeats = 5, 5, 2
        args.hook_runs = 1
    torch.set_num_threads(args.threads)
    if args.section in ("stage", "all"):
        run(args)
    if args.section in ("step", "all"):
        run_step_section(args)
    if args.section in ("eval", "all"):
        run_eval_section(args)
    if args.section in ("workers", "all"):
        run_workers_section(args)
    if args.section in ("scorers", "all"):
        run_scorers_section(args)
    if args.section in ("floor", "all"):
        run_floor_section(args)
    if args.section in ("hook", "all"):
        run_hook_section(args)


if __name__ == "__main__":
    main()

"""Per-stage recording cost against the stage index: does a stage cost the same at T = 1000 as at 1?

One fit over a schedule of ``T`` tasks (``epochs_per_task=1``, one training batch per task, a
small MLP), each stage evaluated on every task's test set (``--test-size`` samples, one batch,
cached). Per stage the callback's stage hook is timed, and within it the evaluation (the forward
passes of every task and the reduction: ``_scoring.stage_end``); the *recording cost* is the
rest: recording the rows, the metric family for the logs, the stage journal line (appended and
fsync'd), ``results.json`` and the CSV files when they are rebuilt, the logging. Printed: median
and mean of the recording cost over the first and the last 10 % of stages, their ratios (target:
last / first <= 1.5), the rebuilds, peak RSS.

    python benchmarks/bench_scale.py                      # T = 1000 x 64, one scorer
    python benchmarks/bench_scale.py --task-classes       # the same with 2 classes per task
    python benchmarks/bench_scale.py --tasks 200          # quick
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback
from continual_eval._trainer_scoring import TrainerScoring  # instrumented: timed, not changed

FEATURES = 16


class ScheduleMLP(pl.LightningModule):
    """A small MLP trained on task ``current_epoch`` in epoch ``current_epoch``."""

    def __init__(self, train: list[DataLoader], classes: int) -> None:
        super().__init__()
        self.train_loaders = train
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        return self.train_loaders[min(self.current_epoch, len(self.train_loaders) - 1)]


def _loaders(T: int, n: int, classes_per_task: int | None, seed: int) -> tuple[list, list]:
    g = torch.Generator().manual_seed(seed)
    train, test = [], []
    for j in range(T):
        offset = 0 if classes_per_task is None else j * classes_per_task
        k = 2 if classes_per_task is None else classes_per_task
        for size, out in ((16, train), (n, test)):
            x = torch.randn(size, FEATURES, generator=g)
            y = torch.randint(0, k, (size,), generator=g) + offset
            out.append(DataLoader(TensorDataset(x, y), batch_size=max(size, 1)))
    return train, test


def run(T: int, n: int, task_classes: bool) -> dict[str, Any]:
    cpt = 2 if task_classes else None
    train, test = _loaders(T, n, cpt, seed=0)
    classes = T * 2 if task_classes else 2
    model = ScheduleMLP(train, classes)
    extra: dict[str, Any] = {}
    if task_classes:
        extra["task_classes"] = [[2 * j, 2 * j + 1] for j in range(T)]
    out = tempfile.mkdtemp()
    cb = ContinualEvalCallback(
        test, epochs_per_task=1, dirpath=out, verbose=False, cache_test_batches=True, **extra
    )
    hook: list[float] = []
    evaluation: list[float] = []
    rebuilt: list[int] = []
    scoring_stage_end = TrainerScoring.stage_end  # the evaluation of a stage: forward passes
    record_stage = cb._record_stage

    def timed_stage_end(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return scoring_stage_end(*a, **k)
        finally:
            evaluation.append(time.perf_counter() - t0)

    def timed_record_stage(trainer: Any, pl_module: Any, stage: int) -> None:
        t0 = time.perf_counter()
        record_stage(trainer, pl_module, stage)
        hook.append(time.perf_counter() - t0)
        if cb._directory.rebuilt:
            rebuilt.append(stage)

    TrainerScoring.stage_end = timed_stage_end  # type: ignore[method-assign]
    cb._record_stage = timed_record_stage  # type: ignore[method-assign]
    trainer = pl.Trainer(
        max_epochs=T,
        callbacks=[cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        reload_dataloaders_every_n_epochs=1,
        accelerator="cpu",
        devices=1,
    )
    t0 = time.perf_counter()
    try:
        trainer.fit(model)
    finally:
        TrainerScoring.stage_end = scoring_stage_end  # type: ignore[method-assign]
    wall = time.perf_counter() - t0
    recording = [1e3 * (h - e) for h, e in zip(hook, evaluation, strict=True)]
    tenth = max(1, T // 10)
    first, last = recording[:tenth], recording[-tenth:]
    return {
        "T": T,
        "task_classes": task_classes,
        "wall_s": wall,
        "eval_ms_median": 1e3 * statistics.median(evaluation),
        "first_median": statistics.median(first),
        "last_median": statistics.median(last),
        "first_mean": statistics.fmean(first),
        "last_mean": statistics.fmean(last),
        "rebuilds": len(rebuilt),
        # the slowest stages (ms, stage index) and the last 10 % without its slowest stage: a
        # stage that waits for the rebuild in flight (the last one always rebuilds) shows here
        "slowest": sorted(((c, i) for i, c in enumerate(recording)), reverse=True)[:5],
        "last_mean_but_slowest": statistics.fmean(sorted(last)[:-1]) if len(last) > 1 else 0.0,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--test-size", type=int, default=64)
    parser.add_argument("--task-classes", action="store_true")
    a = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    r = run(a.tasks, a.test_size, a.task_classes)
    print(
        f"T={r['T']} x {a.test_size} test samples, task_classes={r['task_classes']}: "
        f"fit {r['wall_s']:.1f} s, stage evaluation median {r['eval_ms_median']:.2f} ms, "
        f"results.json rebuilt {r['rebuilds']} times, peak RSS {r['peak_rss_mib']:.0f} MiB"
    )
    print("| recording cost per stage (ms) | first 10 % | last 10 % | last / first |")
    print("|---|---|---|---|")
    for kind in ("median", "mean"):
        f, la = r[f"first_{kind}"], r[f"last_{kind}"]
        print(f"| {kind} | {f:.2f} | {la:.2f} | {la / f:.2f} |")
    f, la = r["first_mean"], r["last_mean_but_slowest"]
    print(f"| mean, last 10 % without its slowest stage | {f:.2f} | {la:.2f} | {la / f:.2f} |")
    print("slowest stages (ms @ stage):", ", ".join(f"{c:.0f} @ {i}" for c, i in r["slowest"]))


if __name__ == "__main__":
    main()

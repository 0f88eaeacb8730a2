"""Budgeted stage-end evaluation: the evaluation time of a run (the ``cost`` section's
``eval_seconds`` summed over the stages, baseline excluded) with whole test sets, a stratified
``stage_eval_subset`` and ``eval_old_tasks_every``; T tasks x N test samples, MLP 32-64-64-10,
batch 128, one thread. Prints medians over repeats and the ratio to the whole-set run, measured
side by side in one process.

    python benchmarks/bench_budget.py [--tasks 20] [--samples 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import warnings

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks


class MLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run(T: int, N: int, options: dict) -> float:
    g = torch.Generator().manual_seed(0)
    test = [
        DataLoader(
            TensorDataset(torch.randn(N, 32, generator=g), torch.randint(0, 10, (N,), generator=g)),
            batch_size=128,
        )
        for _ in range(T)
    ]
    train = [
        DataLoader(
            TensorDataset(
                torch.randn(128, 32, generator=g), torch.randint(0, 10, (128,), generator=g)
            ),
            batch_size=128,
        )
        for _ in range(T)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        callback = ContinualEvalCallback(
            test, dirpath=tmp, verbose=False, log_images=False, **options
        )
        trainer = pl.Trainer(
            max_epochs=1,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[callback],
        )
        torch.manual_seed(0)
        fit_tasks(trainer, MLP(), train)
        cost = callback.results()["cost"]["per_stage"]
        return sum(stage["eval_seconds"] for stage in cost)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    variants = {
        "whole test sets": {},
        "stage_eval_subset=500": {"stage_eval_subset": 500},
        "eval_old_tasks_every=5": {"eval_old_tasks_every": 5},
        "both": {"stage_eval_subset": 500, "eval_old_tasks_every": 5},
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):  # interleaved: drifts of the machine hit every variant alike
        for name, options in variants.items():
            times[name].append(run(args.tasks, args.samples, options))
    base = statistics.median(times["whole test sets"])
    print(f"T = {args.tasks} tasks x {args.samples} samples, {args.repeats} repeats, 1 thread")
    print(f"{'variant':<26} {'eval s (median)':>16} {'ratio':>7}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<26} {median:>16.3f} {median / base:>7.3f}")


if __name__ == "__main__":
    main()

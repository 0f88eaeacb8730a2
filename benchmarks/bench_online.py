"""Benchmark: what online evaluation adds to training time.

    PYTHONPATH=src python benchmarks/bench_online.py [--repeats 7] [--batches 200]

One ``Trainer.fit`` over a stream per variant, the variants interleaved ``--repeats`` times (one
torch thread); the time measured is the training loop (first batch start to last batch end, the
window closes included; the end-of-training files and picture are timed apart). Printed: medians
and the medians of per-repeat ratios against the bare loop.

* ``outputs``: prequential scores from the training step's own predictions (no extra forward);
  target: at most 1.05 x bare.
* ``forward``: one eval-mode forward per batch, against ``one forward``, a plain callback that runs
  one eval-mode forward of the batch under ``no_grad`` and nothing else; target: the overhead of
  ``forward`` at most that of one extra forward pass (the ratio of the two overheads is printed).
* ``near-future d``: one lookahead read and forward per batch per delay; the cost per delay and
  batch size (the reads are of a tensor-backed dataset, sliced as the evaluation engine does).

The model: an MLP ``256 -> 512 -> 512 -> 100`` trained by SGD on a stream of Gaussian blobs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval.online import OnlineEvalCallback

DIM, HIDDEN, CLASSES = 256, 512, 100


class MLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(
            nn.Linear(DIM, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y = batch
        logits = self(x)
        return {"loss": nn.functional.cross_entropy(logits, y), "preds": logits.detach()}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Clock(pl.Callback):
    """Training-loop time, wall and this process's CPU: from the first batch's start to the last
    batch's end."""

    def __init__(self) -> None:
        self.start = self.end = self.cpu_start = self.cpu_end = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == 0:
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.end, self.cpu_end = time.perf_counter(), time.process_time()


class OneForward(pl.Callback):
    """The reference cost of one extra forward pass per batch: eval mode, no_grad, the batch."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        pl_module.eval()
        with torch.no_grad():
            pl_module(batch[0])
        pl_module.train()


def stream(batches: int, batch_size: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    n = batches * batch_size
    y = torch.arange(n) // 500 % CLASSES
    means = torch.randn(CLASSES, DIM, generator=g)
    return TensorDataset(means[y] + torch.randn(n, DIM, generator=g), y)


def run(data: TensorDataset, batch_size: int, extra: list[pl.Callback]) -> dict[str, float]:
    """One fit: ``loop`` and ``cpu`` (training loop, wall and CPU seconds) and ``end`` (the rest
    of the fit: the end-of-training files and picture, set-up, teardown)."""
    clock = Clock()
    with tempfile.TemporaryDirectory() as root:
        for cb in extra:
            if isinstance(cb, OnlineEvalCallback):
                cb.dirpath = root
        trainer = pl.Trainer(
            max_epochs=1,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
            callbacks=[*extra, clock],
        )
        start = time.perf_counter()
        trainer.fit(MLP(), DataLoader(data, batch_size=batch_size))
        total = time.perf_counter() - start
    loop = clock.end - clock.start
    hooks = sum(cb.seconds for cb in extra if isinstance(cb, TimedOnline))
    return {
        "loop": loop,
        "cpu": clock.cpu_end - clock.cpu_start,
        "end": total - loop,
        "hooks": hooks,
    }


def paired(samples: dict[str, list[dict[str, float]]], a: str, key: str) -> float:
    """The median over repeats of ``a``'s ``key`` divided by the bare run's in the same repeat."""
    pairs = zip(samples[a], samples["bare"], strict=True)
    return statistics.median(x[key] / y[key] for x, y in pairs)


class TimedOnline(OnlineEvalCallback):
    """The callback with a CPU-time stopwatch around its per-batch hooks (window closes
    included)."""

    seconds = 0.0

    def on_train_batch_start(self, *args: Any) -> None:
        start = time.process_time()
        super().on_train_batch_start(*args)
        self.seconds += time.process_time() - start

    def on_train_batch_end(self, *args: Any) -> None:
        start = time.process_time()
        super().on_train_batch_end(*args)
        self.seconds += time.process_time() - start


def online(**kwargs: Any) -> OnlineEvalCallback:
    kwargs.setdefault("near_future_delays", [])
    return TimedOnline(window_batches=50, verbose=False, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128])
    args = parser.parse_args()
    torch.set_num_threads(1)
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    print(f"{args.batches} batches per fit, {args.repeats} interleaved repeats, 1 thread")
    for batch_size in args.batch_sizes:
        data = stream(args.batches, batch_size)
        variants = {
            "bare": lambda: [],
            "outputs (reused)": lambda: [online(prequential="outputs")],
            "forward": lambda: [online(prequential="forward")],
            "one forward (reference)": lambda: [OneForward()],
            "near-future 1": lambda: [online(prequential="outputs", near_future_delays=[1])],
            "near-future 10": lambda: [online(prequential="outputs", near_future_delays=[10])],
            "near-future 1, 10": lambda: [
                online(prequential="outputs", near_future_delays=[1, 10])
            ],
        }
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        run(data, batch_size, [])  # warm-up
        for _ in range(args.repeats):
            for name, make in variants.items():
                samples[name].append(run(data, batch_size, make()))
        print(f"\nbatch size {batch_size}")
        print(
            f"  {'variant':26s} {'loop median':>12s} {'x bare':>7s} {'x bare (CPU)':>13s} "
            f"{'hooks / bare (CPU)':>18s} {'rest of fit':>12s}"
        )
        for name in variants:
            loop = statistics.median(s["loop"] for s in samples[name]) * 1e3
            end = statistics.median(s["end"] for s in samples[name]) * 1e3
            pairs = zip(samples[name], samples["bare"], strict=True)
            hooks = statistics.median(x["hooks"] / y["cpu"] for x, y in pairs)
            print(
                f"  {name:26s} {loop:9.1f} ms {paired(samples, name, 'loop'):7.3f} "
                f"{paired(samples, name, 'cpu'):13.3f} {hooks:18.3f} {end:9.1f} ms"
            )
        for key, what in (("loop", "wall"), ("cpu", "CPU")):
            one = paired(samples, "one forward (reference)", key) - 1
            forward = paired(samples, "forward", key) - 1
            if one > 0:
                print(
                    f"  {what}: forward-mode overhead = {forward / one:.2f} x one extra "
                    "forward's overhead"
                )
            extra = [
                f"+{(paired(samples, f'near-future {d}', key) - 1) * 100:.1f}% (delay {d})"
                for d in ("1", "10", "1, 10")
            ]
            print(f"  {what}: near-future " + ", ".join(extra))


if __name__ == "__main__":
    main()

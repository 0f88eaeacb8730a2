"""A synthetic stream with strong label autocorrelation, a small learner, and the worked example.

The stream (`autocorrelated_stream`) comes in runs: ``run_length`` consecutive samples of
one class, the next run's class drawn uniformly among the other classes. Inputs are Gaussian
blobs, ``x = mu_y + noise * N(0, I)`` with class means ``mu_c`` drawn once from
``N(0, separation^2 I / dim)``. A classifier that never looks at ``x`` and predicts the last
label it saw is right on all but the first sample of every run: online accuracy about
``1 - 1 / run_length``. ``delay`` batches ahead, once ``delay * batch_size`` exceeds the run
length, it is right about as often as label frequencies allow (chance, ``1 / classes``).

Held-out sets (`segment_held_out`): the stream is cut into ``segments`` equal segments; the
held-out set of a segment holds fresh samples of the classes that occur in it, in the proportions
they occur, so that the held-out curves show what the learner keeps of each stretch of the stream.

Run the worked example (LightningCLI, ``configs/online_autocorrelated.yaml``)::

    python -m continual_eval.online.synthetic --config configs/online_autocorrelated.yaml

It prints the summary table; ``results.json`` (its ``online`` section) and ``online.png`` go to
the logger's directory.

The same stream as a task stream for ``continual-eval fit``
([`AutocorrelatedSegments`][continual_eval.online.synthetic.AutocorrelatedSegments]: one task per
segment, its held-out set as the task's test set; ``configs/online_segments.yaml``)::

    continual-eval fit --config configs/online_segments.yaml

``ContinualEvalCallback`` records ``R`` over the segments, ``OnlineEvalCallback`` the online
section of the same ``results.json``, and the report draws both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from continual_eval.experiments.stream import TaskStreamDataModule

__all__ = [
    "AutocorrelatedSegments",
    "AutocorrelatedStream",
    "StreamClassifier",
    "autocorrelated_labels",
    "autocorrelated_stream",
    "main",
    "segment_held_out",
]


def autocorrelated_labels(
    num_samples: int, num_classes: int, run_length: int, *, generator: torch.Generator
) -> Tensor:
    """Labels in runs of ``run_length`` (the last run may be shorter); each run's class differs
    from the previous run's, uniformly among the other ``num_classes - 1``."""
    if num_classes < 2 or run_length < 1 or num_samples < 1:
        raise ValueError("need num_classes >= 2, run_length >= 1 and num_samples >= 1")
    runs = -(-num_samples // run_length)
    steps = torch.randint(1, num_classes, (runs,), generator=generator)
    steps[0] = torch.randint(0, num_classes, (1,), generator=generator)
    classes = steps.cumsum(0) % num_classes  # each step moves to another class
    return classes.repeat_interleave(run_length)[:num_samples]


def _class_means(
    num_classes: int, dim: int, separation: float, generator: torch.Generator
) -> Tensor:
    means: Tensor = torch.randn(num_classes, dim, generator=generator) * separation / dim**0.5
    return means


def autocorrelated_stream(
    num_samples: int = 6000,
    num_classes: int = 10,
    run_length: int = 150,
    dim: int = 20,
    separation: float = 4.0,
    noise: float = 1.0,
    seed: int = 0,
) -> tuple[TensorDataset, Tensor]:
    """``(stream, class_means)``: the stream as a ``TensorDataset`` of ``(x, y)`` in stream order
    (float32 inputs ``[N, dim]``, int64 labels) and the class means that generated it."""
    g = torch.Generator().manual_seed(seed)
    means = _class_means(num_classes, dim, separation, g)
    y = autocorrelated_labels(num_samples, num_classes, run_length, generator=g)
    x = means[y] + noise * torch.randn(num_samples, dim, generator=g)
    return TensorDataset(x.float(), y), means


def segment_held_out(
    labels: Tensor,
    means: Tensor,
    segments: int,
    per_segment: int,
    *,
    noise: float = 1.0,
    seed: int = 1,
) -> tuple[list[TensorDataset], list[int]]:
    """``(held-out sets, segment starts)``: ``segments`` equal stream segments; each set holds
    ``per_segment`` fresh samples whose labels are drawn from the segment's label frequencies."""
    g = torch.Generator().manual_seed(seed)
    n = labels.numel()
    starts = [n * s // segments for s in range(segments)]
    sets = []
    for s, start in enumerate(starts):
        end = starts[s + 1] if s + 1 < segments else n
        freq = torch.bincount(labels[start:end], minlength=means.shape[0]).double()
        y = torch.multinomial(freq, per_segment, replacement=True, generator=g)
        x = means[y] + noise * torch.randn(per_segment, means.shape[1], generator=g)
        sets.append(TensorDataset(x.float(), y))
    return sets, starts


def segmented_stream(
    num_samples: int,
    num_classes: int,
    run_length: int,
    dim: int,
    separation: float,
    noise: float,
    segments: int,
    held_out_per_segment: int,
    seed: int,
) -> tuple[TensorDataset, list[TensorDataset], list[int]]:
    """``(stream, held-out sets, segment starts)``: `autocorrelated_stream` from ``seed`` and its
    `segment_held_out` sets from ``seed + 1``, the one derivation both datamodules use (so the
    stream's held-out sets and a task stream's test sets are the same samples)."""
    stream, means = autocorrelated_stream(
        num_samples, num_classes, run_length, dim, separation, noise, seed
    )
    labels = stream.tensors[1]
    sets, starts = segment_held_out(
        labels, means, segments, held_out_per_segment, noise=noise, seed=seed + 1
    )
    return stream, sets, starts


class AutocorrelatedStream(pl.LightningDataModule):
    """The stream as one training loader in stream order (``shuffle=False``) and the segment
    held-out sets (`held_out_loaders`, with `segment_starts`)."""

    def __init__(
        self,
        num_samples: int = 6000,
        num_classes: int = 10,
        run_length: int = 150,
        dim: int = 20,
        separation: float = 4.0,
        noise: float = 1.0,
        batch_size: int = 10,
        segments: int = 4,
        held_out_per_segment: int = 500,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.stream, self.held_out_sets, self.segment_starts = segmented_stream(
            num_samples,
            num_classes,
            run_length,
            dim,
            separation,
            noise,
            segments,
            held_out_per_segment,
            seed,
        )

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.stream, batch_size=self.batch_size, shuffle=False)

    def held_out_loaders(self, batch_size: int = 250) -> list[DataLoader[Any]]:
        return [DataLoader(s, batch_size=batch_size) for s in self.held_out_sets]


class AutocorrelatedSegments(TaskStreamDataModule):
    """The stream of ``AutocorrelatedStream`` as a task stream for ``continual-eval fit``:
    task ``i`` trains on segment ``i`` of the stream, in stream order (``shuffle`` is off), and
    is tested on that segment's held-out set. An ``OnlineEvalCallback`` in the Trainer's
    callbacks gets the whole stream (the segments in order) to read ahead across the task
    boundaries, and the held-out sets with the segment starts
    ([`connect_online`][continual_eval.experiments.stream.connect_online])."""

    def __init__(
        self,
        num_samples: int = 6000,
        num_classes: int = 10,
        run_length: int = 150,
        dim: int = 20,
        separation: float = 4.0,
        noise: float = 1.0,
        batch_size: int = 10,
        test_batch_size: int = 250,
        segments: int = 4,
        held_out_per_segment: int = 500,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, test_batch_size=test_batch_size, shuffle=False)
        stream, self.test_sets, self.segment_starts = segmented_stream(  # type: ignore[assignment]
            num_samples,
            num_classes,
            run_length,
            dim,
            separation,
            noise,
            segments,
            held_out_per_segment,
            seed,
        )
        ends = [*self.segment_starts[1:], num_samples]
        self.train_sets = [
            Subset(stream, range(start, end))
            for start, end in zip(self.segment_starts, ends, strict=True)
        ]
        self.task_names = [f"segment_{s}" for s in range(segments)]


class StreamClassifier(pl.LightningModule):
    """An MLP (``dim -> hidden -> classes``, ReLU; ``hidden=0``: linear) trained by SGD, one step
    per batch; ``training_step`` returns the batch's class scores as ``preds`` so that online
    accuracy needs no extra forward pass."""

    def __init__(
        self,
        dim: int = 20,
        num_classes: int = 10,
        hidden: int = 64,
        lr: float = 0.05,
        momentum: float = 0.0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        layers: list[nn.Module] = []
        width = dim
        if hidden:
            layers += [nn.Linear(dim, hidden), nn.ReLU()]
            width = hidden
        if dropout:
            layers.append(nn.Dropout(dropout))
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)
        self.lr, self.momentum = lr, momentum

    def forward(self, x: Tensor) -> Tensor:
        logits: Tensor = self.net(x)
        return logits

    def training_step(self, batch: Sequence[Tensor], batch_idx: int) -> dict[str, Tensor]:
        x, y = batch[0], batch[1]
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y)
        self.log("train_loss", loss)
        return {"loss": loss, "preds": logits.detach()}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)


def main(args: Sequence[str] | None = None) -> Any:
    """``python -m continual_eval.online.synthetic --config configs/online_autocorrelated.yaml``.

    The config's ``OnlineEvalCallback`` (under ``trainer.callbacks``) gets the datamodule's
    segment held-out sets and segment starts when it has none; the run prints the summary table.
    """
    from lightning.pytorch.cli import LightningCLI

    from continual_eval.online.callback import OnlineEvalCallback
    from continual_eval.online.held_out import HeldOutSets
    from continual_eval.online.publish import format_summary

    cli = LightningCLI(
        StreamClassifier,
        AutocorrelatedStream,
        run=False,
        args=None if args is None else list(args),
        save_config_callback=None,
    )
    data = cli.datamodule
    assert isinstance(data, AutocorrelatedStream)
    trainer = cli.trainer
    callbacks = [cb for cb in trainer.callbacks if isinstance(cb, OnlineEvalCallback)]  # type: ignore[attr-defined]
    for cb in callbacks:
        if cb.held_out is None:
            cb.held_out = HeldOutSets(
                data.held_out_loaders(),
                [f"segment_{s}" for s in range(len(data.segment_starts))],
                data.segment_starts,
            )
    trainer.fit(cli.model, datamodule=data)
    for cb in callbacks:
        if cb.results is not None:
            if not cb.verbose:
                print(format_summary(cb.results))
            print(f"files: {cb.results_dir}")
    return cli


if __name__ == "__main__":  # pragma: no cover
    # Import through the package so the config's class_path names the same class object.
    from continual_eval.online.synthetic import main as _main

    _main()

"""Standalone DDP run for test_scorers.py: every built-in scorer kind in one evaluation on 2 CPU
processes (gloo), on test sets of odd sizes sharded without padding.

Usage: python scorers_ddp_script.py OUT_DIR [tiny]. Lightning re-launches this script for rank
1. At ``on_fit_start`` a callback evaluates the (seeded, untrained) model with
:func:`make_scorers` on its rank's shards and the loop's sum reduction; every rank saves what it
got. With ``tiny`` the test sets hold 1 and 3 samples (:data:`TINY_SIZES`: rank 1 holds no sample
of the first task) and the scorers include the list-state torchmetrics metrics (AUROC, average
precision), which torchmetrics' own sync cannot gather from a rank that holds none. The test
module imports :func:`make_problem` and :func:`make_scorers` to compute the single-process
reference.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from continual_eval.evaluation import evaluate_tasks, shard_dataloader
from ddp_teardown import destroy_process_group

NUM_FEATURES = 6
NUM_CLASSES = 7
TEST_SIZES = (37, 29, 41)  # odd: a padded shard would count a sample twice
#: world_size - 1 = 1 sample (rank 1 holds none of it) and 3 (shards of 2 and 1)
TINY_SIZES = (1, 3)
BATCH = 8


def make_problem(
    seed: int = 0, sizes: tuple[int, ...] = TEST_SIZES
) -> tuple[nn.Module, list[tuple[Tensor, Tensor]]]:
    """A seeded linear classifier over ``NUM_CLASSES`` classes and one test set per size."""
    g = torch.Generator().manual_seed(seed)
    net = nn.Linear(NUM_FEATURES, NUM_CLASSES)
    with torch.no_grad():
        net.weight.copy_(torch.randn(NUM_CLASSES, NUM_FEATURES, generator=g))
        net.bias.copy_(torch.randn(NUM_CLASSES, generator=g))
    tests = [
        (
            torch.randn(n, NUM_FEATURES, generator=g),
            torch.randint(0, NUM_CLASSES, (n,), generator=g),
        )
        for n in sizes
    ]
    return net, tests


def loaders(tests: list[tuple[Tensor, Tensor]]) -> list[DataLoader]:
    return [DataLoader(TensorDataset(x, y), batch_size=BATCH) for x, y in tests]


def brier(preds: Tensor, target: Tensor) -> Tensor:
    """Per-sample Brier score: squared distance of the softmax to the one-hot target."""
    one_hot = nn.functional.one_hot(target, preds.shape[1]).to(preds.dtype)
    return (preds.softmax(dim=1) - one_hot).pow(2).sum(dim=1)


class Confidence:
    """A user's scorer (the protocol, no base class): the mean top softmax probability, summed
    in float64 on each rank and reduced by the loop."""

    name = "confidence"
    higher_is_better = True
    bounds = (0.0, 1.0)
    count_based = True

    def start(self, device: torch.device) -> None:
        self._sums: list[Tensor] = []
        self._total = 0
        self._device = device

    def update(self, preds: Tensor, target: Tensor) -> None:
        self._sums.append(preds.softmax(dim=1).amax(dim=1).sum(dtype=torch.float64))
        self._total += preds.shape[0]

    def local_counts(self) -> Tensor:
        total = torch.tensor(float(self._total), dtype=torch.float64, device=self._device)
        if not self._sums:
            return torch.stack([torch.zeros_like(total), total])
        return torch.stack([torch.stack(self._sums).sum(), total])

    def result(self, reduced_counts: Tensor) -> Tensor:
        return reduced_counts[:, 0] / reduced_counts[:, 1]


class MedianConfidence(Metric):
    """A metric with a list state (``dist_reduce_fx="cat"``), so not count-based: reduced by
    torchmetrics' own sync after each task. The median over the task's samples of the top softmax
    probability (the same for any order or sharding of the samples)."""

    full_state_update = False
    higher_is_better = True

    def __init__(self) -> None:
        super().__init__()
        self.add_state("top", [], dist_reduce_fx="cat")

    def update(self, preds: Tensor, target: Tensor) -> None:
        self.top.append(preds.softmax(dim=1).amax(dim=1))

    def compute(self) -> Tensor:
        return dim_zero_cat(self.top).median()


def make_scorers(tiny: bool = False) -> list:
    """Accuracy, cross-entropy, top-5, a torchmetrics F1 (sum-reduced integer states: count-based,
    fed concatenated batches), a per-sample loss callable, a batch-mean loss callable, a user's
    protocol object and a list-state metric (gathered across ranks by the scorer). ``tiny`` adds
    torchmetrics' list-state AUROC and average precision (``thresholds=None``: every sample's
    scores kept) and the binned AUROC (``thresholds=5``: a sum-reduced state, count-based)."""
    from torchmetrics.classification import (
        MulticlassAUROC,
        MulticlassAveragePrecision,
        MulticlassF1Score,
    )

    extra = []
    if tiny:
        extra = [
            MulticlassAUROC(num_classes=NUM_CLASSES),
            MulticlassAveragePrecision(num_classes=NUM_CLASSES),
            MulticlassAUROC(num_classes=NUM_CLASSES, thresholds=5),
        ]
    return [
        "accuracy",
        "cross_entropy",
        "top5",
        MulticlassF1Score(num_classes=NUM_CLASSES, average="macro"),
        brier,
        nn.functional.nll_loss,  # a scalar batch mean (of -preds[n, y_n])
        Confidence(),
        MedianConfidence(),
        *extra,
    ]


class Probe(pl.Callback):
    def __init__(self, out: Path, tests: list[tuple[Tensor, Tensor]], tiny: bool) -> None:
        self.out, self.tests, self.tiny = out, tests, tiny

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        rank, world = trainer.global_rank, trainer.world_size
        sharded = [shard_dataloader(dl, rank, world)[0] for dl in loaders(self.tests)]
        result = evaluate_tasks(
            pl_module,
            sharded,
            range(len(sharded)),
            scorers=make_scorers(self.tiny),
            all_reduce=partial(trainer.strategy.reduce, reduce_op="sum"),
            rank=rank,
            world_size=world,
        )
        torch.save(
            {
                "world_size": world,
                "shard_sizes": [len(dl.sampler) for dl in sharded],
                "names": result.scorer_names,
                "scores": result.scores_by_scorer,
                "total": result.total,
            },
            self.out / f"rank{rank}.pt",
        )


class Wrapped(pl.LightningModule):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def main(out: Path, tiny: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    net, tests = make_problem(sizes=TINY_SIZES if tiny else TEST_SIZES)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        limit_train_batches=1,
        callbacks=[Probe(out, tests, tiny)],
        default_root_dir=str(out),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(Wrapped(net), loaders(tests)[0])


if __name__ == "__main__":
    main(Path(sys.argv[1]), tiny=sys.argv[2:] == ["tiny"])
    destroy_process_group()

"""Split digits: scikit-learn's 8x8 handwritten digits as five two-class tasks, and a small MLP.

The data ship inside scikit-learn (``sklearn.datasets.load_digits``), so nothing is downloaded.
Task ``k`` holds digits ``2k`` and ``2k + 1``. In the default ``"domain"`` scenario every task is a
binary problem on a shared two-way head (label = which digit of the pair, chance = 0.5), as in the
Split-MNIST comparison of seed 001; ``"class"`` keeps the ten digit labels on a ten-way head.
"""

from __future__ import annotations

import copy
from typing import Literal

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from continual_eval.experiments.replay import ReservoirBuffer
from continual_eval.experiments.stream import TaskStreamDataModule

Scenario = Literal["domain", "class"]


def load_digit_arrays() -> tuple[Tensor, Tensor]:
    """All 1797 digits as ``(inputs [N, 64] float32 in [0, 1], labels [N] long)``."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    inputs = torch.as_tensor(digits.data, dtype=torch.float32) / 16.0
    return inputs, torch.as_tensor(digits.target, dtype=torch.long)


class SplitDigits(TaskStreamDataModule):
    """Five tasks of two digits each, with a fixed stratified train/test split.

    The split is drawn from ``split_seed`` (not the run's seed), so every seed and method is
    evaluated on the same test inputs; ``test_fraction`` of each digit goes to its test set.
    """

    def __init__(
        self,
        scenario: Scenario = "domain",
        test_fraction: float = 0.3,
        split_seed: int = 0,
        batch_size: int = 32,
        joint: bool = False,
    ):
        super().__init__(batch_size=batch_size, test_batch_size=1024, joint=joint)
        self.scenario = scenario
        inputs, labels = load_digit_arrays()
        generator = torch.Generator().manual_seed(split_seed)
        # a random key per example; within each digit the lowest keys form the test split
        keys = torch.rand(len(labels), generator=generator)
        order = torch.argsort(labels.double() + keys.double())  # by digit, then by key
        count_per_digit = torch.bincount(labels, minlength=10)
        first_of_digit = torch.cumsum(count_per_digit, 0) - count_per_digit
        rank_in_digit = torch.empty_like(labels)
        rank_in_digit[order] = torch.arange(len(labels)) - first_of_digit[labels[order]]
        is_test = rank_in_digit < (test_fraction * count_per_digit[labels]).round().long()
        task_of = labels // 2
        targets = labels % 2 if scenario == "domain" else labels
        self.train_sets = [
            TensorDataset(inputs[(task_of == k) & ~is_test], targets[(task_of == k) & ~is_test])
            for k in range(5)
        ]
        self.test_sets = [
            TensorDataset(inputs[(task_of == k) & is_test], targets[(task_of == k) & is_test])
            for k in range(5)
        ]
        self.task_names = [f"{2 * k}-{2 * k + 1}" for k in range(5)]

    @property
    def num_classes(self) -> int:
        return 2 if self.scenario == "domain" else 10

    @property
    def task_classes(self) -> list[list[int]]:
        """The class ids of each task in the ``"class"`` scenario, ``[[0, 1], [2, 3], ...,
        [8, 9]]``: ``ContinualEvalCallback(task_classes=...)`` (``continual.task_classes`` of
        ``configs/digits_class_incremental.yaml``). The ``"domain"`` scenario has none: every
        task uses the same two labels of a shared head (``ValueError``)."""
        if self.scenario != "class":
            raise ValueError(
                "SplitDigits(scenario='domain') shares the labels 0 and 1 between all tasks; "
                "task_classes needs scenario='class'"
            )
        return [[2 * k, 2 * k + 1] for k in range(5)]


class DigitsMLP(pl.LightningModule):
    """64 -> hidden -> hidden -> classes MLP trained with Adam; optional experience replay.

    ``replay_capacity = 0`` is naive fine-tuning. With a positive capacity, every training batch is
    concatenated with ``replay_batch_size`` examples drawn from a reservoir memory of everything
    seen before (experience replay, Chaudhry et al. 2019), and then offered to the memory.
    """

    def __init__(
        self,
        num_classes: int = 2,
        hidden: int = 64,
        lr: float = 1e-3,
        replay_capacity: int = 0,
        replay_batch_size: int = 32,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(64, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )
        self.memory = ReservoirBuffer(replay_capacity) if replay_capacity > 0 else None

    @property
    def method(self) -> str:
        """``"replay"`` or ``"naive"``."""
        return "replay" if self.memory is not None else "naive"

    def reference_model(self) -> DigitsMLP:
        """A copy with the same weights and no replay memory: plain (isolated or joint) training,
        the same reference for every method (used by
        [`train_reference`][continual_eval.train_reference])."""
        plain = copy.deepcopy(self)
        plain.memory = None
        return plain

    def continual_eval_memory_size(self) -> int:
        """Samples held by the replay memory (0 for naive fine-tuning): the ``replay_memory`` of
        each stage's cost (`continual_eval.stage_cost`)."""
        return 0 if self.memory is None else len(self.memory)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        inputs, targets = x, y
        if self.memory is not None and len(self.memory) > 0:
            replay_x, replay_y = self.memory.sample(self.hparams.replay_batch_size)
            inputs, targets = torch.cat([x, replay_x]), torch.cat([y, replay_y])
        loss = F.cross_entropy(self(inputs), targets)
        if self.memory is not None:
            self.memory.add(x, y)
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=len(targets))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

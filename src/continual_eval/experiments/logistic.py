"""Seed 000, section 5: a two-weight logistic classifier on three conflicting circle-grid tasks.

Every input lies on a deterministic polar grid (no RNG). Task ``k`` labels a point 1 when it lies on
the positive side of the unit direction at ``directions_deg[k]``; the classifier has two weights and
no bias, ``p = sigmoid(w . x)``, starts at ``w = 0`` and takes full-batch SGD steps at lr 0.8 (36
per task, one per epoch). A label direction rotated away from the previous one overwrites what the
single weight vector learned, so earlier tasks are forgotten.

Default directions are 0, 110 and 220 degrees. Equal 120-degree spacing leaves two diagonal cells at
exactly 72/80 = 0.9 after 36 steps, on the seed's ">= 0.9" threshold with no margin; 110 degrees
learns every task to 1.0 and still forgets 0.7 on average.
"""

from __future__ import annotations

from collections.abc import Sequence

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import TensorDataset

from continual_eval.experiments.stream import TaskStreamDataModule


def circle_grid(num_angles: int, radii: Sequence[float], offset_deg: float) -> Tensor:
    """Points at ``num_angles`` equally spaced angles (starting at ``offset_deg``) on each radius.

    Returns a float32 tensor of shape ``[len(radii) * num_angles, 2]``, radius-major.
    """
    angles = torch.deg2rad(
        offset_deg + 360.0 / num_angles * torch.arange(num_angles, dtype=torch.float64)
    )
    radius = torch.tensor(list(radii), dtype=torch.float64)[:, None]
    points = torch.stack([radius * torch.cos(angles), radius * torch.sin(angles)], dim=-1)
    return points.reshape(-1, 2).float()


def unit_directions(directions_deg: Sequence[float]) -> Tensor:
    """Unit vectors ``[T, 2]`` at the given angles in degrees."""
    theta = torch.deg2rad(torch.tensor(list(directions_deg), dtype=torch.float64))
    return torch.stack([torch.cos(theta), torch.sin(theta)], dim=-1).float()


class CircleGridTasks(TaskStreamDataModule):
    """Three (by default) binary tasks on deterministic circle grids whose label directions differ.

    Training grid: ``train_angles`` angles x ``train_radii`` (default 16 x 4 = 64 points);
    test grid: ``test_angles`` x ``test_radii`` (default 20 x 4 = 80 points) at other angles and
    radii, so no test input is a training input. The whole training set is one batch (full-batch
    SGD).
    """

    def __init__(
        self,
        directions_deg: Sequence[float] = (0.0, 110.0, 220.0),
        train_angles: int = 16,
        train_radii: Sequence[float] = (0.5, 1.0, 1.5, 2.0),
        train_offset_deg: float = 11.25,
        test_angles: int = 20,
        test_radii: Sequence[float] = (0.6, 1.2, 1.8, 2.4),
        test_offset_deg: float = 9.0,
    ):
        super().__init__(
            batch_size=train_angles * len(train_radii),
            test_batch_size=test_angles * len(test_radii),
            shuffle=False,
        )
        self.directions_deg = tuple(float(d) for d in directions_deg)
        self.train_inputs = circle_grid(train_angles, train_radii, train_offset_deg)
        self.test_inputs = circle_grid(test_angles, test_radii, test_offset_deg)
        self.directions = unit_directions(self.directions_deg)
        # labels[k, n] = 1 where input n lies on the positive side of direction k
        train_labels = (self.directions @ self.train_inputs.T > 0).long()
        test_labels = (self.directions @ self.test_inputs.T > 0).long()
        self.train_sets = [TensorDataset(self.train_inputs, y) for y in train_labels]
        self.test_sets = [TensorDataset(self.test_inputs, y) for y in test_labels]
        self.task_names = [f"dir{d:g}" for d in self.directions_deg]


class LogisticClassifier(pl.LightningModule):
    """``p = sigmoid(w . x)`` with ``w`` in R^2, no bias, zero initialisation, plain SGD.

    ``forward`` returns the two class logits ``[-z/2, z/2]`` (their softmax is ``[1-p, p]``), so
    an argmax scorer predicts class 1 exactly when ``p > 0.5``; training minimises binary
    cross-entropy on ``z``.
    """

    #: label stored in results.json: plain sequential training
    method = "naive"

    def __init__(self, lr: float = 0.8):
        super().__init__()
        self.save_hyperparameters()
        self.weight = torch.nn.Parameter(torch.zeros(2))

    def logit(self, x: Tensor) -> Tensor:
        """``z = w . x`` for a batch ``[N, 2]``."""
        return x @ self.weight

    def forward(self, x: Tensor) -> Tensor:
        z = self.logit(x)
        return torch.stack([-z / 2, z / 2], dim=-1)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.binary_cross_entropy_with_logits(self.logit(x), y.float())
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=len(y))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


__all__ = ["CircleGridTasks", "LogisticClassifier", "circle_grid", "unit_directions"]

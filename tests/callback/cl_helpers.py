"""Shared pieces of the callback tests: a small task sequence, a LightningModule, and a plain-torch
reference that trains and evaluates the same model without Lightning or the callback."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NUM_FEATURES = 6
NUM_CLASSES = 3
TRAIN_SIZE = 48
BATCH = 16
TEST_SIZES = (37, 29, 41)  # odd: none divides by 2 ranks or by the batch size


def make_tasks(num_tasks: int = 3, seed: int = 0, test_sizes=TEST_SIZES):
    """Each task: Gaussian blobs of NUM_CLASSES classes with task-specific means (domain shift)."""
    g = torch.Generator().manual_seed(seed)
    tasks = []
    for t in range(num_tasks):
        means = torch.randn(NUM_CLASSES, NUM_FEATURES, generator=g) * 2.0

        def sample(n, means=means):
            y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
            x = means[y] + torch.randn(n, NUM_FEATURES, generator=g)
            return x, y

        tasks.append((sample(TRAIN_SIZE), sample(test_sizes[t % len(test_sizes)])))
    return tasks


def train_loaders(tasks, shuffle: bool = False):
    return [DataLoader(TensorDataset(*tr), batch_size=BATCH, shuffle=shuffle) for tr, _ in tasks]


def eval_loaders(tasks, batch_size: int = 8):
    return [DataLoader(TensorDataset(*te), batch_size=batch_size) for _, te in tasks]


def make_net(dropout: float = 0.0, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(NUM_FEATURES, 16),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(16, NUM_CLASSES),
    )


class Classifier(pl.LightningModule):
    def __init__(self, net: nn.Module, lr: float = 0.2) -> None:
        super().__init__()
        self.net = net
        self.lr = lr

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class Snapshots(pl.Callback):
    """The weights at the baseline and after every stage (for the reference)."""

    def __init__(self) -> None:
        self.weights: list[dict] = []

    def on_fit_start(self, trainer, pl_module):
        if not self.weights:
            self.weights.append({k: v.clone() for k, v in pl_module.state_dict().items()})

    def on_train_end(self, trainer, pl_module):
        self.weights.append({k: v.clone() for k, v in pl_module.state_dict().items()})


def reference_run(net: nn.Module, tasks, epochs: int, lr: float = 0.2):
    """Plain torch: baseline, then per task train ``epochs`` epochs (SGD, fixed order) and score
    every task by counting argmax hits. Returns ``(R [T, T], b [T])`` float64."""
    T = len(tasks)

    def score(x, y):
        net.eval()
        with torch.no_grad():
            correct = 0
            for i in range(0, len(y), 8):
                correct += int((net(x[i : i + 8]).argmax(1) == y[i : i + 8]).sum())
        net.train()
        return correct / len(y)

    baseline = torch.tensor([score(*te) for _, te in tasks], dtype=torch.float64)
    R = torch.full((T, T), math.nan, dtype=torch.float64)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    for i, ((x, y), _) in enumerate(tasks):
        for _ in range(epochs):
            for s in range(0, len(y), BATCH):
                opt.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(net(x[s : s + BATCH]), y[s : s + BATCH])
                loss.backward()
                opt.step()
        R[i] = torch.tensor([score(*te) for _, te in tasks], dtype=torch.float64)
    return R, baseline


def trainer_kwargs(tmp_path, **overrides):
    kwargs = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        default_root_dir=str(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        log_every_n_steps=1,
    )
    kwargs.update(overrides)
    return kwargs


def by_step(events):
    """Events in step order: each fit opens a new event file, and TensorBoard reads a
    directory's files in name order, whose last part (a per-process counter) compares as text
    (``...12.10`` before ``...12.9`` within one second)."""
    return sorted(events, key=lambda e: e.step)

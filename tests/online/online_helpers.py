"""Shared pieces of the online tests: a stream, a learner, and plain references that score the
same stream without Lightning or the callback (a test-then-train loop in plain torch, blind
predictors in plain Python)."""

from __future__ import annotations

import collections
import copy

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DIM = 6
CLASSES = 4


def run_stream(n: int, run: int, seed: int = 0, classes: int = CLASSES, noise: float = 1.0):
    """``(x, y)``: labels in runs of ``run`` cycling through the classes in a seeded order,
    inputs Gaussian blobs around per-class means."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(classes, DIM, generator=g) * 2.0
    order = torch.randint(0, classes, (n // run + 1,), generator=g)
    y = order.repeat_interleave(run)[:n]
    x = means[y] + noise * torch.randn(n, DIM, generator=g)
    return x, y


def make_net(dropout: float = 0.0, seed: int = 0, batch_norm: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(DIM, 16)]
    if batch_norm:
        layers.append(nn.BatchNorm1d(16))
    layers += [nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, CLASSES)]
    return nn.Sequential(*layers)


class Learner(pl.LightningModule):
    """SGD on cross-entropy; returns its predictions as ``preds`` unless ``return_preds=False``.
    ``seed``: reseeds torch when training starts, so that a plain loop seeded the same way draws
    the same dropout masks."""

    def __init__(self, net: nn.Module, lr: float = 0.1, return_preds: bool = True, seed: int = 7):
        super().__init__()
        self.net, self.lr, self.return_preds, self.seed = net, lr, return_preds, seed

    def forward(self, x):
        return self.net(x)

    def on_train_start(self):
        torch.manual_seed(self.seed)

    def training_step(self, batch, batch_idx):
        x, y = batch[0], batch[1]
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y)
        if self.return_preds:
            return {"loss": loss, "preds": logits.detach()}
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def trainer(tmp_path, callbacks, **kwargs) -> pl.Trainer:
    base = dict(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    base.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **base)


def loader(x, y, batch_size: int, **kwargs) -> DataLoader:
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False, **kwargs)


def plain_table(
    net: nn.Module, x, y, batch_size: int, offsets: int, lr: float = 0.1, seed: int = 7
):
    """A plain test-then-train loop: before training on batch ``k``, score the model (eval mode,
    no grad) on batches ``k + m`` for ``m < offsets``; then one SGD step on batch ``k`` (train
    mode). Returns ``(correct [T, offsets], total [T, offsets], net after training)``."""
    net = copy.deepcopy(net)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    batches = [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(y), batch_size)]
    T = len(batches)
    correct = torch.zeros(T, offsets, dtype=torch.int64)
    total = torch.zeros(T, offsets, dtype=torch.int64)
    torch.manual_seed(seed)
    for k in range(T):
        net.eval()
        with torch.no_grad():
            for m in range(offsets):
                if k + m < T:
                    bx, by = batches[k + m]
                    correct[k, m] = int((net(bx).argmax(1) == by).sum())
                    total[k, m] = len(by)
        net.train()
        bx, by = batches[k]
        loss = nn.functional.cross_entropy(net(bx), by)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return correct, total, net


def window_sums(table: torch.Tensor, window: int, delay: int, head: bool = False) -> list[int]:
    """Per window of ``window`` training batches: the sum of column ``delay`` (and, ``head``, of
    row 0's columns before ``delay``: the label-delay head) -- a plain loop, no tensor tricks."""
    T = table.shape[0]
    out = []
    for start in range(0, T, window):
        s = 0
        for k in range(start, min(start + window, T)):
            s += int(table[k, delay])
            if head and k == 0:
                for m in range(delay):
                    s += int(table[0, m])
        out.append(s)
    return out


def blind_mode(history: list[int], window: int | None) -> int:
    """Most frequent label of ``history[-window:]`` (all of it for ``None``), ties to the most
    recent; -1 for an empty history. Plain Python."""
    recent = history if window is None else history[-window:]
    if not recent:
        return -1
    counts = collections.Counter(recent)
    best = max(counts.values())
    for label in reversed(recent if window is not None else history):
        if counts[label] == best:
            return label
    raise AssertionError


def blind_counts(y: list[int], batch_size: int, delay: int, window: int, head: bool = False):
    """Per training batch ``k``, the blind predictors' correct predictions on batch ``k + delay``
    from the labels of batches before ``k`` (``head``: also batches ``0..delay-1`` from no
    label), as ``{"mode", "last", "prior"} -> [T]`` lists. Plain Python."""
    T = -(-len(y) // batch_size)
    out = {name: [0] * T for name in ("mode", "last", "prior")}
    for k in range(T):
        revealed = y[: k * batch_size]
        targets = list(range(k + delay, k + delay + 1))
        if head and k == 0:
            targets = list(range(0, delay + 1))
        for t in targets:
            if t >= T:
                continue
            for label in y[t * batch_size : (t + 1) * batch_size]:
                out["mode"][k] += blind_mode(revealed, window) == label
                out["last"][k] += (revealed[-1] if revealed else -1) == label
                out["prior"][k] += blind_mode(revealed, None) == label
    return out

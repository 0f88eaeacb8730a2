"""Scoring one batch: class predictions from a model output, an eval-mode forward that leaves the
training as it found it, and which submodules make train-mode outputs differ from eval-mode ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.utilities import move_data_to_device
from torch import Tensor, nn

from continual_eval.evaluation.guards import (
    grad_free_context,
    preserve_rng_state,
    preserve_training_flags,
)
from continual_eval.evaluation.step import default_batch_step

if TYPE_CHECKING:
    from lightning.pytorch import LightningModule, Trainer

__all__ = [
    "NONFINITE",
    "NOT_A_LABEL",
    "batch_target",
    "forward_labels",
    "predicted_labels",
    "scoring_context",
    "train_mode_modules",
]

#: the predicted label of a sample whose class scores are not finite (never a label)
NONFINITE = -2
#: the label of a target that is not a class index (a float that is not a whole number)
NOT_A_LABEL = -3

#: submodules whose output in training mode differs from eval mode: dropout draws a mask,
#: normalisation layers with running statistics use the batch's statistics instead
_TRAIN_MODE_TYPES: tuple[type[nn.Module], ...] = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.LazyBatchNorm1d,
    nn.LazyBatchNorm2d,
    nn.LazyBatchNorm3d,
    nn.RReLU,
)


def train_mode_modules(module: nn.Module) -> list[str]:
    """The names of ``module``'s submodules in training mode whose output depends on it:
    dropout with ``p > 0``, batch norm (its batch statistics), instance norm with running
    statistics, ``RReLU``, and attention/transformer layers with dropout. Outputs taken from a
    training step are eval-mode predictions only when this is empty (a module branching on
    ``self.training`` in its own code is not detected: see the first-batch check)."""
    found = []
    for name, m in module.named_modules():
        if not m.training:
            continue
        if isinstance(m, (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)):
            if m.track_running_stats:
                found.append(name or type(m).__name__)
        elif isinstance(m, _TRAIN_MODE_TYPES):
            if getattr(m, "p", 1.0) > 0:
                found.append(name or type(m).__name__)
        elif isinstance(m, nn.MultiheadAttention) and m.dropout > 0:
            found.append(name or type(m).__name__)
    return found


def predicted_labels(
    preds: Any, target: Any, where: str
) -> tuple[Tensor, Tensor | None, Tensor, int]:
    """``(predicted labels [N], top scores [N] or None, target labels [N], number of classes)``
    of one batch, on its device, in one kernel for the usual case (the argmax) and without a host
    sync.

    ``preds``: class scores ``[N, C]`` (the argmax; its top score is returned so that rows with a
    NaN or infinite top score can be told apart later, once per window: see
    `rows`) or integer labels ``[N]``.
    ``target``: integer labels ``[N]``, float labels holding whole numbers (others become
    `NOT_A_LABEL`), or one-hot / probability rows ``[N, C]`` (their argmax). Labels are
    checked against ``C`` once per window, not here.
    ``where`` names the batch in errors.
    """
    if not isinstance(preds, Tensor) or not isinstance(target, Tensor):
        raise TypeError(
            f"{where}: expected tensors (preds, target), got {type(preds).__name__} and "
            f"{type(target).__name__}"
        )
    if preds.ndim == 2 and preds.is_floating_point():
        top, pred = preds.detach().max(dim=1)
        num_classes = int(preds.shape[1])
    elif preds.ndim == 1 and not preds.is_floating_point() and preds.dtype != torch.bool:
        top, pred = None, preds.detach().to(torch.int64)
        num_classes = 0  # unknown: labels are checked against the targets' range only
    else:
        raise ValueError(
            f"{where}: the model output has shape {tuple(preds.shape)} ({preds.dtype}); online "
            "scoring needs class scores [N, C] or integer labels [N]"
        )
    if target.ndim == 2 and target.is_floating_point() and target.shape == preds.shape:
        labels_t = target.detach().argmax(dim=1)
    elif target.ndim == 1:
        labels_t = target.detach()
        if labels_t.is_floating_point():
            whole = labels_t == labels_t.round()
            labels_t = torch.where(whole, labels_t, torch.full_like(labels_t, NOT_A_LABEL))
        labels_t = labels_t.to(torch.int64)
    else:
        raise ValueError(
            f"{where}: the targets have shape {tuple(target.shape)}; online scoring needs class "
            "indices [N] or one-hot/probability rows shaped like the class scores"
        )
    if pred.shape[0] != labels_t.shape[0]:
        raise ValueError(
            f"{where}: {pred.shape[0]} predictions for {labels_t.shape[0]} targets; the outputs "
            "must hold one prediction per sample of the batch"
        )
    return pred, top, labels_t, num_classes


def batch_target(batch: Any, where: str) -> Tensor:
    """The targets of a training batch: ``y`` of ``(x, y)`` / ``(x, y, t)``, ``batch["target"]``
    (or ``"label"``, ``"labels"``, ``"y"``) of a mapping."""
    if isinstance(batch, (tuple, list)) and len(batch) in (2, 3) and isinstance(batch[1], Tensor):
        target: Tensor = batch[1]
        return target
    if isinstance(batch, Mapping):
        for key in ("target", "label", "labels", "y"):
            value = batch.get(key)
            if isinstance(value, Tensor):
                return value
    raise ValueError(
        f"{where}: cannot find the targets of a batch of type {type(batch).__name__}; return them "
        "from training_step as outputs['target'], or yield (x, y) / (x, y, task_id) batches"
    )


@contextmanager
def scoring_context(
    trainer: Trainer, pl_module: LightningModule, *, inference_mode: bool
) -> Iterator[None]:
    """Eval mode for ``pl_module`` (every submodule's ``training`` flag restored afterwards), no
    gradient recorded, and the Python, NumPy, torch CPU and CUDA RNG states restored on exit: the
    training that follows is as if nothing had run. One per training batch, around all of its
    scoring forwards (saving the NumPy state alone costs a few hundred microseconds)."""
    with (
        preserve_rng_state(trainer.strategy.root_device),
        preserve_training_flags(pl_module),
        grad_free_context(inference_mode),
    ):
        yield


def forward_labels(
    trainer: Trainer,
    pl_module: LightningModule,
    batch: Any,
    *,
    where: str,
    on_device: bool,
) -> tuple[Tensor, Tensor | None, Tensor, int]:
    """One forward of ``batch`` through the evaluation engine's batch step
    (``continual_eval_step``, else ``module(x)`` / ``module(x, t)``) under the Trainer's precision
    plugin; run it inside `scoring_context`. Returns `predicted_labels`.

    ``on_device``: the batch already went through the Trainer's transfer (a training batch);
    otherwise it is moved with a plain device move and the precision plugin's ``convert_input``
    (no user transfer hooks, as held-out batches are).
    """
    if not on_device:
        device = trainer.strategy.root_device
        batch = trainer.precision_plugin.convert_input(move_data_to_device(batch, device))
    with trainer.precision_plugin.forward_context():
        preds, target = default_batch_step(pl_module, batch, 0)
        return predicted_labels(preds, target, where)

"""What an evaluation must leave as it found it: train/eval flags, RNG states, autograd."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch import nn


@contextmanager
def preserve_training_flags(module: nn.Module) -> Iterator[None]:
    """Put ``module`` in eval mode; restore every submodule's own ``training`` flag afterwards."""
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


@contextmanager
def preserve_rng_state(device: torch.device | None = None) -> Iterator[None]:
    """Restore Python, NumPy, torch CPU and (if used) CUDA RNG states on exit.

    Iterating a DataLoader draws a seed from the global torch generator; without this, attaching an
    evaluator would change the training that follows it.
    """
    py_state = random.getstate()
    np_state = None
    try:
        import numpy as np

        np_state = np.random.get_state()
    except ImportError:  # pragma: no cover
        np = None  # type: ignore[assignment]
    cuda = device is not None and device.type == "cuda" and torch.cuda.is_available()
    with torch.random.fork_rng(devices=[device] if cuda else [], enabled=True):
        try:
            yield
        finally:
            random.setstate(py_state)
            if np_state is not None:
                np.random.set_state(np_state)


def grad_free_context(inference_mode: bool = True) -> AbstractContextManager[Any]:
    """``torch.inference_mode`` unless a gloo process group is up (as Lightning's loops decide)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        return torch.no_grad()
    return torch.inference_mode() if inference_mode else torch.no_grad()

"""The random states a checkpoint must hold for a resumed run to draw what an uninterrupted one
draws: Python, NumPy, torch CPU and CUDA. Lightning's checkpoints do not store them."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["collect_rng_states", "set_rng_states"]


def collect_rng_states() -> dict[str, Any]:
    """Python, NumPy, torch CPU and (initialised) CUDA random states, as plain Python values and
    tensors (loadable by ``torch.load(weights_only=True)``, as Lightning loads checkpoints)."""
    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        states["numpy"] = (
            str(kind),
            torch.from_numpy(keys.astype(np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        )
    except ImportError:  # pragma: no cover
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["torch.cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: Mapping[str, Any]) -> None:
    """Restore states from :func:`collect_rng_states` (CUDA only with the same device count)."""
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "numpy" in states:
        import numpy as np

        kind, keys, pos, has_gauss, cached = states["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    cuda = states.get("torch.cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)

"""The random states a checkpoint must hold for a resumed run to draw what an uninterrupted one
draws: Python, NumPy, torch CPU and CUDA, and the train loaders' own ``torch.Generator`` objects.
Lightning's checkpoints store none of them."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "MAX_REPLAYED_DRAWS",
    "collect_rng_states",
    "loader_generators",
    "restore_generator",
    "set_rng_states",
]


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
    """Restore states from `collect_rng_states` (CUDA only with the same device count)."""
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "numpy" in states:
        import numpy as np

        kind, keys, pos, has_gauss, cached = states["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    cuda = states.get("torch.cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def loader_generators(loaders: Iterable[Any]) -> list[torch.Generator]:
    """The ``torch.Generator`` objects ``loaders`` draw from (a loader's ``generator``, its
    sampler's and its batch sampler's sampler's), each once, in that order: the global random
    states do not cover them."""
    found: dict[int, torch.Generator] = {}
    for loader in loaders:
        batch_sampler = getattr(loader, "batch_sampler", None)
        for owner in (
            loader,
            getattr(loader, "sampler", None),
            getattr(batch_sampler, "sampler", None),
        ):
            generator = getattr(owner, "generator", None)
            if isinstance(generator, torch.Generator):
                found[id(generator)] = generator
    return list(found.values())


def _draw(generator: torch.Generator) -> None:
    """One draw as a DataLoader iterator makes it at its start (its base seed)."""
    torch.empty((), dtype=torch.int64).random_(generator=generator)


#: the most base-seed draws `restore_generator` replays
MAX_REPLAYED_DRAWS = 64


def restore_generator(generator: torch.Generator, state: Tensor) -> bool:
    """Set ``generator`` to ``state`` as if that had been done before the draws it has made since
    it was seeded: count the one-value draws (the base seed a DataLoader iterator draws) from
    ``manual_seed(generator.initial_seed())`` to its current state, set ``state``, draw as many.
    ``False`` (nothing changed) when its state is not reached that way (it was drawn from
    otherwise, or more than `MAX_REPLAYED_DRAWS` times)."""
    probe = torch.Generator().manual_seed(generator.initial_seed())
    current = generator.get_state()
    for draws in range(MAX_REPLAYED_DRAWS + 1):
        if torch.equal(probe.get_state(), current):
            generator.set_state(state)
            for _ in range(draws):
                _draw(generator)
            return True
        _draw(probe)
    return False

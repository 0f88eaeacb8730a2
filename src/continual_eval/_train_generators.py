"""The train loaders' own ``torch.Generator`` objects across a resumed fit.

Lightning's checkpoints hold neither the global random states (the callback stores and restores
those: `continual_eval.rng`) nor the states of the generators a train loader shuffles with
(``DataLoader(generator=g)``, a sampler's ``generator``). A fit resumed with ``ckpt_path`` then
starts those generators from their seeds, so its epochs see other batches than an uninterrupted
run's. What can be restored from a hook:

* `TrainGenerators.state_dict` holds the states of the generators of the train loader of
  the epoch in progress (watched at its ``on_train_epoch_start``) and whether the checkpoint is
  written at the epoch's end;
* in the resumed fit's ``on_train_start`` the loader of the next epoch is known. When it is the
  same loader (no stage boundary in between), each of its generators is set to the saved state
  as if before the draws Lightning made from it before that hook (it iterates the loader once
  while setting up the fit): `restore_generator`. At a stage boundary
  the next stage's loader is another one: a generator first used now starts from its seed in
  both runs (nothing to restore); one with the seed of a saved generator may be the same
  object, shared across stages, which a new process cannot tell: a warning says so.

Every case that cannot be made exact gets a warning naming it (`on_train_start`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.utilities import CombinedLoader

from continual_eval.rng import loader_generators, restore_generator

if TYPE_CHECKING:  # pragma: no cover
    from lightning.pytorch import Trainer

__all__ = ["TrainGenerators"]

_NOT_BITWISE = (
    "the resumed epochs may see other batches than an uninterrupted run (other weights, "
    "other R). Resumes that are bitwise: see 'Resuming' in docs/callback.md"
)


def _train_loader_generators(trainer: Trainer) -> list[torch.Generator]:
    loaders = trainer.train_dataloader
    if loaders is None:
        return []
    return loader_generators(CombinedLoader(loaders, "max_size_cycle").flattened)


class TrainGenerators:
    """The generators of the train loader in use, saved in checkpoints and restored at a resume
    where that is exact (see the module docstring)."""

    def __init__(self) -> None:
        self._watched: list[torch.Generator] = []
        self._progress: Any = None  # the fit loop's epoch progress (read when saving)
        self._loaded: dict[str, Any] | None = None

    def watch(self, trainer: Trainer) -> None:
        """At an epoch's start: the generators of its train loader."""
        self._watched = _train_loader_generators(trainer)
        self._progress = trainer.fit_loop.epoch_progress

    def state_dict(self) -> dict[str, Any] | None:
        """The watched generators' seeds and states, the epoch and whether it has ended."""
        if self._progress is None:
            return None
        current = self._progress.current
        return {
            "epoch": int(current.started) - 1,
            "epoch_end": int(current.processed) == int(current.started),
            "generators": [
                {"initial_seed": g.initial_seed(), "state": g.get_state()} for g in self._watched
            ],
        }

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        self._loaded = None if state is None else dict(state)

    def on_train_start(self, trainer: Trainer, epochs_per_task: int | None) -> str | None:
        """Restore the loaded states into the resumed fit's train loader where exact; a warning
        (to show on rank 0) where not; ``None`` when the fit resumes nothing."""
        loaded, self._loaded = self._loaded, None
        self.watch(trainer)
        if trainer.ckpt_path is None or loaded is None or not self._watched:
            return None
        where = f"ContinualEvalCallback: this fit resumed from {trainer.ckpt_path}"
        if not loaded["epoch_end"]:
            return (
                f"{where}, written inside epoch {loaded['epoch']}: Lightning restarts that "
                f"epoch's train loader, whose own torch.Generator state it does not store; "
                + _NOT_BITWISE
            )
        saved = loaded["generators"]
        next_epoch = loaded["epoch"] + 1
        boundary = epochs_per_task is not None and next_epoch % epochs_per_task == 0
        seeds = {int(s["initial_seed"]) for s in saved}
        if boundary:
            if any(g.initial_seed() in seeds for g in self._watched):
                return (
                    f"{where}, at the start of stage {next_epoch // epochs_per_task}: its train "
                    "loader draws from a torch.Generator with the seed of the previous stage's; "
                    "whether it is the same generator (shared across stages) cannot be told "
                    "after a restart, so its state is not restored; " + _NOT_BITWISE
                )
            return None
        restored = len(saved) == len(self._watched) and all(
            g.initial_seed() == int(s["initial_seed"])
            and restore_generator(g, torch.as_tensor(s["state"], dtype=torch.uint8))
            for g, s in zip(self._watched, saved, strict=True)
        )
        if restored:
            return None
        return (
            f"{where}: its train loader's torch.Generator objects are not the ones of the "
            "checkpoint (other seeds), or were drawn from before the fit, so their states are "
            "not restored; " + _NOT_BITWISE
        )

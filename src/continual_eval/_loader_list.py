"""One test loader per task: the check every list of test loaders passes (the callback's
``test_dataloaders`` argument and what a datamodule's ``test_dataloader()`` returns).

A leaf module (no imports from the package) so that the callback's argument checks and
`continual_eval.evaluation.trainer_evaluation` share it without importing each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

__all__ = ["as_loader_list"]


def as_loader_list(loaders: Any, source: str) -> list[Any]:
    """``loaders`` as a list, one re-iterable test loader per task (index = task id); a
    ``TypeError`` naming ``source`` and the loader otherwise (a mapping, a string, an iterator
    that can be read only once)."""
    if isinstance(loaders, Mapping) or not isinstance(loaders, Sequence):
        raise TypeError(
            f"{source} must be a list with one test loader per task (index = task id), got "
            f"{type(loaders).__name__}"
        )
    loader_list: list[Any] = list(loaders)
    for j, loader in enumerate(loader_list):
        if not isinstance(loader, Iterable) or isinstance(loader, (str, bytes)):
            raise TypeError(
                f"{source}: test dataloader {j} is a {type(loader).__name__}, not an iterable of "
                "batches; give a DataLoader (or another re-iterable) per task"
            )
        if isinstance(loader, Iterator):
            raise TypeError(
                f"{source}: test dataloader {j} is a {type(loader).__name__}, an iterator that can "
                "be read only once (the baseline would use it up); every test set is read after "
                "every stage: give a DataLoader, a list of batches, or another re-iterable object"
            )
    return loader_list

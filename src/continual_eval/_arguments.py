"""Checks of ``ContinualEvalCallback``'s arguments, done at construction: the test loaders,
the scorers and the metadata (what a run writes to ``results.json`` must be JSON)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from continual_eval.evaluation import AccuracyScorer, MetricScorer, Scorer, make_scorer

__all__ = ["as_loader_list", "check_metadata", "resolve_scorers"]


def as_loader_list(loaders: Any, source: str) -> list[Any]:
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


_SCORER_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def resolve_scorers(
    scorers: Mapping[str, Any] | Sequence[Any] | None, metric: Any
) -> dict[str, Scorer]:
    """``name -> Scorer`` from the ``scorers`` argument (or the ``metric`` shorthand); the first
    is the primary scorer. Names become log keys and file names (``scores_<name>.csv``)."""
    if scorers is not None and metric is not None:
        raise ValueError("give either metric= (one scorer) or scorers=, not both")
    if scorers is None:
        if metric is None:
            return {"acc": AccuracyScorer()}
        only = MetricScorer(metric)
        return {only.name: only}
    if isinstance(scorers, Mapping):
        pairs = [(name, make_scorer(spec)) for name, spec in scorers.items()]
    elif isinstance(scorers, Sequence) and not isinstance(scorers, str):
        built = [make_scorer(spec) for spec in scorers]
        pairs = [(scorer.name, scorer) for scorer in built]
    else:
        raise TypeError(
            f"scorers must be a mapping name -> scorer or a list of scorers, got "
            f"{type(scorers).__name__}"
        )
    if not pairs:
        raise ValueError("scorers is empty: give at least one scorer (default: accuracy)")
    resolved: dict[str, Scorer] = {}
    for name, scorer in pairs:
        if not isinstance(name, str) or not _SCORER_KEY.match(name):
            raise ValueError(
                f"scorer name {name!r}: use 1 to 64 letters, digits, '_', '.' or '-' (it names "
                "log keys and files)"
            )
        if name in resolved:
            raise ValueError(f"two scorers are named {name!r}: give them distinct names")
        resolved[name] = scorer
    return resolved


def check_metadata(metadata: Mapping[str, Any] | None) -> None:
    """``metadata`` must be a mapping that ``json.dumps`` writes as is (no NaN/inf)."""
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")

    def walk(value: Any, path: str) -> None:
        if value is None or isinstance(value, (bool, int, str)):
            return
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(
                    f"metadata{path} = {value!r} cannot be written to results.json (JSON has no "
                    "NaN/inf); use None or a string"
                )
            return
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise TypeError(
                        f"metadata{path} has the key {key!r} ({type(key).__name__}); JSON object "
                        "keys must be strings"
                    )
                walk(item, f"{path}[{key!r}]")
            return
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]")
            return
        raise TypeError(
            f"metadata{path} is a {type(value).__name__} ({value!r:.80}), which results.json "
            "(JSON) cannot hold; give str, int, float, bool, None, lists or dicts of them"
        )

    walk(metadata, "")
    json.dumps(metadata, allow_nan=False)

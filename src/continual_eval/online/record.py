"""The record of an online evaluation: the ``online`` section of the run's ``results.json``.

Defined once in the results package: the section's fields are
[`OnlineSection`][continual_eval.results.schema.OnlineSection] (with
[`OnlineProtocol`][continual_eval.online.OnlineProtocol],
[`OnlineWindow`][continual_eval.online.OnlineWindow],
[`ScoreCounts`][continual_eval.online.ScoreCounts],
[`WindowCost`][continual_eval.online.WindowCost], [`HeldOut`][continual_eval.online.HeldOut] and
[`HeldOutEvaluation`][continual_eval.online.HeldOutEvaluation]), the typed record is
[`OnlineResults`][continual_eval.results.OnlineResults] (`continual_eval.results.online`); they are
importable from here too. [`read_online`][continual_eval.online.read_online] reads the section of a
``results.json``.
"""

from __future__ import annotations

import os
from pathlib import Path

from continual_eval.results.files import RESULTS_FILE, read_document
from continual_eval.results.online import BLIND_PREDICTORS, OnlineResults, score_key
from continual_eval.results.schema import (
    HeldOut,
    HeldOutEvaluation,
    OnlineProtocol,
    OnlineSection,
    OnlineWindow,
    ScoreCounts,
    WindowCost,
)

__all__ = [
    "BLIND_PREDICTORS",
    "HeldOut",
    "HeldOutEvaluation",
    "OnlineProtocol",
    "OnlineResults",
    "OnlineSection",
    "OnlineWindow",
    "ScoreCounts",
    "WindowCost",
    "read_online",
    "score_key",
]


def read_online(path: str | os.PathLike[str]) -> OnlineResults:
    """The ``online`` section of a ``results.json`` (or of the one in a directory), validated
    with the whole file (``read_document``); ``ValueError``
    when the file holds none."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    document = read_document(path)
    if document.online is None:
        raise ValueError(f"{path}: no online section (the run had no OnlineEvalCallback)")
    return OnlineResults.from_section(document.online)

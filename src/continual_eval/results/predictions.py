"""The ``predictions`` section: the files holding the generation scorers' per-cell predictions.

With ``ContinualEvalCallback(predictions=N)`` the run directory holds
``predictions/baseline.jsonl`` (the untrained model) and ``predictions/stage_{i}.jsonl`` (after
stage ``i``), one file per evaluation, written atomically by rank 0 before the
``results.json`` that names them. Each line is one item of one cell, as a JSON object::

    {"task": 0, "scorer": "em", "item": 3, "prediction": "cba", "reference": "cba", "score": 1.0}

(``"held_out": "<name>"`` instead of ``"task"`` for a held-out set). ``item`` is the item's
position in its test set, the same with any number of processes: the ``item``-th sample the
loader's sampler reads in index order (``loader.dataset[item]`` for a loader over its whole
dataset; a batch's ``"index"`` entry when it has one); the same positions as the per-item
records' (``item_records=``); an evaluation whose file could not be written (a full
disk: the run stops there) has a ``null`` entry; lines are ordered by cell (the tasks, then the
held-out sets), scorer and item, at most ``max_items`` per cell and scorer (those of the lowest
indices); ``score`` is ``null`` where it was not finite. The section records each file's line
count and SHA-256, so a reader can tell a file that changed since.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from continual_eval.results import schema

__all__ = ["PredictionFile", "PredictionFiles"]


@dataclass(frozen=True)
class PredictionFile:
    """One prediction file: ``path`` (relative to the run directory), ``lines``, ``sha256``."""

    path: str
    lines: int
    sha256: str

    @classmethod
    def of(cls, path: str, data: bytes) -> PredictionFile:
        return cls(path, data.count(b"\n"), hashlib.sha256(data).hexdigest())

    def read(self, directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
        """The file's lines as dicts; ``ValueError`` naming the file when it is missing or its
        SHA-256 is not the recorded one (it changed since it was written)."""
        path = Path(directory) / self.path
        try:
            data = path.read_bytes()
        except OSError as err:
            raise ValueError(f"prediction file {path}: cannot be read ({err})") from None
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise ValueError(
                f"prediction file {path}: its SHA-256 is not the one results.json records "
                f"({self.sha256[:12]}...); it changed after it was written"
            )
        return [json.loads(line) for line in data.splitlines()]

    def to_section(self) -> schema.PredictionFileSection:
        return schema.PredictionFileSection(path=self.path, lines=self.lines, sha256=self.sha256)

    @classmethod
    def from_section(cls, section: schema.PredictionFileSection) -> PredictionFile:
        return cls(section.path, section.lines, section.sha256)


@dataclass(frozen=True)
class PredictionFiles:
    """The prediction files of one run (see the module docstring).

    Attributes:
        max_items: most items per cell and scorer.
        scorers: the generation scorers whose predictions the files hold.
        baseline: the untrained model's file (``None`` before it was written).
        stages: one file per recorded stage (``None``: its write failed, the run stopped).
    """

    max_items: int
    scorers: tuple[str, ...]
    baseline: PredictionFile | None
    stages: tuple[PredictionFile | None, ...]

    def file(self, stage: int | None) -> PredictionFile | None:
        """Stage ``stage``'s file (``None``: the baseline's); ``None`` when not recorded."""
        if stage is None:
            return self.baseline
        return self.stages[stage] if 0 <= stage < len(self.stages) else None

    def to_section(self) -> schema.PredictionsSection:
        return schema.PredictionsSection(
            max_items=self.max_items,
            scorers=list(self.scorers),
            baseline=None if self.baseline is None else self.baseline.to_section(),
            stages=[None if f is None else f.to_section() for f in self.stages],
        )

    @classmethod
    def from_section(cls, section: schema.PredictionsSection) -> PredictionFiles:
        return cls(
            max_items=section.max_items,
            scorers=tuple(section.scorers),
            baseline=None
            if section.baseline is None
            else PredictionFile.from_section(section.baseline),
            stages=tuple(
                None if f is None else PredictionFile.from_section(f) for f in section.stages
            ),
        )

    @staticmethod
    def lines_text(lines: Sequence[dict[str, Any]]) -> bytes:
        """A file's bytes: one compact JSON object per line (ASCII, ``NaN`` refused)."""
        return b"".join(
            json.dumps(line, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"
            for line in lines
        )

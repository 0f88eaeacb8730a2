"""The stage journal of a [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] run:
``stages.jsonl`` in its results directory, the run's durable record.

Why: rewriting the whole ``results.json`` (and ``scores.csv``) after every stage costs time in
proportion to the stages already recorded (O(T^2) bytes per stage, O(T^3) over a run of ``T``
tasks). The journal instead takes one line per stage, of a size that does not grow with the stage
index, appended and fsync'd before the stage's hook returns: a process killed at any point (kill
-9, a power cut) loses no recorded stage. ``results.json`` and the CSV files are rebuilt from the
run's record, in full and atomically as before, when `rebuild_due` says so: at the baseline, at
every stage of the first ``2 * REBUILD_SPACING - 1`` (31), then whenever the stages
recorded since the last rebuild reach ``1/REBUILD_SPACING`` of those recorded (so the amortised
cost per stage stays flat: ``c * T * REBUILD_SPACING`` for a rebuild of cost ``c * s * T``), at
the last task, at the end of a run that trains fewer tasks, at a resume and when the fit raises.
Between rebuilds ``results.json`` is behind the journal, by at most ``1/16`` of the stages (6 %),
never inconsistent; [`ContinualResults.load`][continual_eval.results.ContinualResults.load]
replays the journal's newer stages (a reader of ``results.json`` alone sees the last rebuild).

The lines, each one JSON object (floats in their shortest round-trip form, NaN as ``null``):

1. the header: ``{"journal": FORMAT, "version": 1, "record": ...}``, the run record's
   settings (`RunRecord.journal_header`: run id, task names, matrices, reference, sections);
2. the baseline (`RunRecord.journal_baseline`), once it is recorded;
3. one line per stage, in order (`RunRecord.journal_stage`): its rows of every matrix, its cost,
   the step curves' evaluations inside it, the sections' parts (the class-incremental
   confusion counts of the stage: its nonzero ``(true, predicted, count)`` cells as the base64
   of their little-endian int32 bytes, ``{"dtype": "<i4", "cells": ...}`` (``"<i8"`` where a
   value needs it): a copy, where the ``"true:predicted:count ..."`` string of ``results.json``
   costs ~0.4 us a cell and is made on the rebuild thread; the held-out rows, the prediction
   file's path, lines and SHA-256).

A resumed run (and any process that did not write the journal's last line) rewrites the whole
journal from its record (atomically), then appends again. A last line without its newline (a
write cut short) is ignored with a warning; any other unreadable line is an error naming the
file and the line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import msgspec

from continual_eval._class_incremental_recorder import ClassIncrementalRecord
from continual_eval._held_out_record import HeldOutRecord
from continual_eval._item_record import ItemRecord
from continual_eval._predictions import PredictionsRecord
from continual_eval._stage_budget import StageBudgetRecord
from continual_eval.record import RecordSection, RunRecord
from continual_eval.results import ContinualResults, InvalidResultsError
from continual_eval.results.files import (
    JOURNAL_FILE,
    ResultsWriteError,
    replace_atomically,
    set_journal_replay,
    write_failed,
)
from continual_eval.results.schema import MAX_FILE_BYTES

if TYPE_CHECKING:  # pragma: no cover
    from continual_eval.results.schema import Document

__all__ = [
    "FORMAT",
    "REBUILD_SPACING",
    "StageJournal",
    "read_journal",
    "rebuild_due",
    "replay_if_newer",
]

#: the header's ``journal`` value
FORMAT = "continual-eval stage journal"
VERSION = 1
#: results.json is rebuilt when the stages since the last rebuild reach 1/REBUILD_SPACING of those
#: recorded (every stage of the first 2 * REBUILD_SPACING - 1)
REBUILD_SPACING = 16

_ENCODER = msgspec.json.Encoder()

#: section key -> how the section is made from its journal settings (for a replay without the
#: callback: `ContinualResults.load`)
_SECTIONS: dict[str, Callable[[Mapping[str, Any], RunRecord], RecordSection]] = {
    ClassIncrementalRecord.key: lambda settings, empty: ClassIncrementalRecord.from_journal(
        settings, empty.task_names
    ),
    HeldOutRecord.key: lambda settings, empty: HeldOutRecord.from_journal(settings, empty.specs),
    StageBudgetRecord.key: lambda settings, empty: StageBudgetRecord.from_journal(
        settings, empty.num_tasks
    ),
    PredictionsRecord.key: lambda settings, empty: PredictionsRecord.from_journal(
        settings, empty.task_names
    ),
    ItemRecord.key: lambda settings, empty: ItemRecord.from_journal(settings, empty.specs),
}


def rebuild_due(completed: int, built: int | None, num_tasks: int) -> bool:
    """Whether ``results.json`` is rebuilt now, with ``completed`` stages recorded and ``built``
    in the last rebuild (``None``: none in this process): always at the last task, else when
    ``completed - built >= max(1, completed // REBUILD_SPACING)``."""
    if built is None or completed >= num_tasks:
        return True
    return completed - built >= max(1, completed // REBUILD_SPACING)


def _line(value: Mapping[str, Any]) -> bytes:
    return _ENCODER.encode(value) + b"\n"


class StageJournal:
    """The journal in ``dirpath`` as one writer (rank 0 of the run) keeps it."""

    def __init__(self, dirpath: str | os.PathLike[str]) -> None:
        self.path = Path(dirpath) / JOURNAL_FILE
        #: stages in the journal as this writer last wrote it (``None``: not written by it)
        self.stages: int | None = None
        self._file: BinaryIO | None = None  # kept open for appends (opening costs per stage)

    def close(self) -> None:
        """Close the file kept open for appends (the next append opens it again)."""
        file, self._file = self._file, None
        if file is not None:
            file.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def rewrite(self, record: RunRecord) -> None:
        """Replace the journal by the whole of ``record`` (header, baseline, every stage)."""
        self.close()  # replaced: appends go to the new file
        lines = [_line({"journal": FORMAT, "version": VERSION, "record": record.journal_header()})]
        if record.baseline_done:
            lines.append(_line(record.journal_baseline()))
        lines += [_line(record.journal_stage(stage)) for stage in range(record.num_stages)]
        data = b"".join(lines)
        try:
            replace_atomically(self.path, lambda tmp: tmp.write_bytes(data), durable=True)
        except OSError as err:
            raise self._failed(err, record.num_stages) from None
        self.stages = record.num_stages if record.baseline_done else None

    def append(
        self, record: RunRecord, stage: int, *, durable: bool = True, deferred: bool = False
    ) -> Callable[[], None] | None:
        """Append recorded stage ``stage`` (the journal's next) and, when ``durable``, fsync it
        (not needed when a durable ``results.json`` of the stage follows); a journal this writer
        did not bring to ``stage`` stages is rewritten instead (durably, here). ``deferred``:
        the line is written and flushed to the OS here (a killed process loses nothing) and the
        returned function does the fsync (on a background thread: `RunDirectory`); if that
        fails it removes the line again and raises."""
        if self.stages != stage or not self.path.exists():
            self.rewrite(record)
            return None
        data = _line(record.journal_stage(stage))
        if self._file is None:
            self._file = open(self.path, "ab")  # noqa: SIM115 (kept open: `close`)
        fh = self._file
        size = fh.tell()
        try:
            fh.write(data)
            fh.flush()
            if durable and not deferred:
                os.fsync(fh.fileno())
        except OSError as err:
            fh.truncate(size)  # no torn line left behind
            raise self._failed(err, stage + 1) from None
        self.stages = stage + 1
        if durable and deferred:
            return lambda: self._sync(fh, size, stage)
        return None

    def _sync(self, fh: BinaryIO, size: int, stage: int) -> None:
        """fsync the journal ``fh``, whose last line (stage ``stage``) starts at byte ``size``; on
        a failure the line is removed (the journal as before it) and the error raised."""
        try:
            os.fsync(fh.fileno())
        except OSError as err:
            self.stages = None  # the next append rewrites the journal from the record
            with contextlib.suppress(OSError):
                fh.truncate(size)
            raise self._failed(err, stage + 1) from None

    def _failed(self, err: OSError, stages: int) -> ResultsWriteError:
        """The one-line error of a journal write that failed (the journal as before it)."""
        return write_failed(self.path, err, stages)


def read_journal(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(header, lines)`` of the journal at ``path``: the header's record settings and the
    baseline and stage lines after it. A last line cut short is left out with a warning; an
    unreadable or out-of-order line is an
    [`InvalidResultsError`][continual_eval.results.InvalidResultsError] naming the line."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise InvalidResultsError(path, "", f"{size} bytes exceed the limit of {MAX_FILE_BYTES}")
    raw = path.read_bytes().split(b"\n")
    torn = raw.pop()  # after the last newline: empty unless a write was cut short
    if torn:
        warnings.warn(
            f"{path}: the last line is incomplete (a write was cut short) and is ignored",
            stacklevel=3,
        )
    values: list[dict[str, Any]] = []
    for number, data in enumerate(raw, 1):
        try:
            value = msgspec.json.decode(data)
        except msgspec.DecodeError as err:
            raise InvalidResultsError(path, f"line {number}", f"not JSON ({err})") from None
        if not isinstance(value, dict):
            raise InvalidResultsError(path, f"line {number}", "not a JSON object")
        values.append(value)
    if not values or values[0].get("journal") != FORMAT:
        raise InvalidResultsError(path, "line 1", f"not a {FORMAT!r} header")
    if values[0].get("version") != VERSION:
        raise InvalidResultsError(
            path, "line 1", f"journal version {values[0].get('version')!r}, expected {VERSION}"
        )
    return values[0]["record"], values[1:]


def replay(path: str | os.PathLike[str]) -> RunRecord:
    """The run record the journal at ``path`` holds (every stage in it, recorded again)."""
    header, lines = read_journal(path)
    number = 1
    try:
        empty = RunRecord.from_journal(header, [])
        sections = [_SECTIONS[key](settings, empty) for key, settings in header["sections"].items()]
        record = RunRecord.from_journal(header, sections)
        for number, line in enumerate(lines, 2):  # noqa: B007 (the error names it)
            if "stage" in line:
                record.replay_stage(line)
            else:
                record.replay_baseline(line)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise InvalidResultsError(path, f"line {number}", f"cannot be replayed ({err!r})") from None
    return record


def replay_if_newer(path: Path, document: Document | None) -> ContinualResults | None:
    """The journal's results when it holds more stages than ``document`` of the same run."""
    header, lines = read_journal(path)
    if document is not None and header.get("run_id") != document.run_id:
        return None  # another run's journal (results.json is that run's own record)
    stages = sum(1 for line in lines if "stage" in line)
    if document is not None and stages <= document.stages_completed:
        return None
    results = replay(path).continual_results()
    if document is not None and document.online is not None:
        results = dataclasses.replace(
            results, online=ContinualResults.from_document(document).online
        )
    return results


set_journal_replay(replay_if_newer)

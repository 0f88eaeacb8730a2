"""Per-cell predictions (``ContinualEvalCallback(predictions=N)``): the items each generation
scorer kept at the baseline and at every stage end, gathered from every rank by test-set position,
bounded, written by rank 0 as JSON lines and named in the ``predictions`` section of
``results.json`` (the file format: `continual_eval.results.predictions`).

Gathering (every rank, two sum-reductions per evaluation, whatever its items, also none): each
rank's items are encoded as JSON bytes; one reduction spreads every rank's byte count, a second
the bytes, each rank's at its own offset of a zero buffer. An item's index is its position in
the test set (the ``k``-th sample the loader's sampler reads, in index order: rank ``r`` of ``W``
reads positions ``r, r + W, ...`` of its unpadded shard; an unshardable loader is read whole by
rank 0), or the batch's ``"index"`` entry; each rank keeps its first ``N`` items of a cell, and
of their union the ``N`` lowest indices are kept, which are the first ``N`` of one process (the
strided shards hold every position below ``N * W`` among their first ``N``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from continual_eval.evaluation.generation import GenerationScorer
from continual_eval.results.files import ResultsWriteError, replace_atomically
from continual_eval.results.predictions import PredictionFile, PredictionFiles
from continual_eval.results.schema import (
    MAX_PREDICTION_ITEMS,
    PREDICTIONS_DIR,
    prediction_file_path,
)

if TYPE_CHECKING:
    from continual_eval.evaluation.task_loaders import TaskLoaders
    from continual_eval.record import RunRecord, Scored
    from continual_eval.results import ContinualResults

__all__ = [
    "PredictionItem",
    "PredictionsRecord",
    "check_predictions",
    "gather_predictions",
    "generation_scorers",
]


class PredictionItem(NamedTuple):
    """One kept item: its loader (task ``j`` or held-out set ``T + h``), the scorer's position
    among the generation scorers, the item's position in the test set, the texts and the
    score."""

    loader: int
    scorer: int
    item: int
    prediction: str
    reference: str
    score: float | None


def check_predictions(predictions: object, scorers: Mapping[str, Any]) -> int | None:
    """``predictions=``: ``None`` (off) or a positive item count, with at least one
    `GenerationScorer` among ``scorers``."""
    if predictions is None:
        return None
    if (
        isinstance(predictions, bool)
        or not isinstance(predictions, int)
        or not 1 <= predictions <= MAX_PREDICTION_ITEMS
    ):
        raise ValueError(
            f"predictions must be None (off) or the most items kept per cell and scorer, an int "
            f"in [1, {MAX_PREDICTION_ITEMS}], got {predictions!r}"
        )
    if not generation_scorers(scorers):
        raise ValueError(
            f"predictions={predictions} writes the predictions of generation scorers "
            f"(GenerationScorer), and none of the scorers {sorted(scorers)} is one"
        )
    return predictions


def generation_scorers(scorers: Mapping[str, Any]) -> dict[str, GenerationScorer]:
    """The scorers whose predictions are written, in scorer order."""
    return {name: s for name, s in scorers.items() if isinstance(s, GenerationScorer)}


def keep_items(scorers: Mapping[str, GenerationScorer], bound: int) -> None:
    """Make every scorer keep at least ``bound`` items per task (its ``record_items``)."""
    for scorer in scorers.values():
        if scorer.record_items != -1:
            scorer.record_items = max(scorer.record_items, bound)


def _local_items(
    scorers: Sequence[GenerationScorer],
    loader_ids: Sequence[int],
    unsharded: frozenset[int],
    rank: int,
    world_size: int,
    bound: int,
) -> list[list[Any]]:
    """This rank's first ``bound`` items of each cell and scorer, with their test-set positions
    (local item ``k`` of a sharded loader is position ``rank + k * world_size``)."""
    items: list[list[Any]] = []
    for k, scorer in enumerate(scorers):
        for j in loader_ids:
            strided = world_size > 1 and j not in unsharded
            for record in scorer.records_by_task.get(j, [])[:bound]:
                index = record.index
                if not record.batch_index and strided:
                    index = rank + index * world_size
                score = record.score if math.isfinite(record.score) else None
                items.append([j, k, index, record.prediction, record.reference, score])
    return items


def _all_bytes(
    data: bytes,
    all_reduce: Callable[[Tensor], Tensor] | None,
    rank: int,
    world_size: int,
    device: torch.device,
) -> list[bytes]:
    """Every rank's ``data``, in rank order (two sum-reductions, on every rank)."""
    if all_reduce is None or world_size <= 1:
        return [data]
    sizes = torch.zeros(world_size, dtype=torch.int64, device=device)
    sizes[rank] = len(data)
    sizes = all_reduce(sizes).cpu()
    ends = sizes.cumsum(0)
    total = int(ends[-1])
    if total == 0:  # every rank knows: none reduces an empty buffer
        return [b"" for _ in range(world_size)]
    buffer = torch.zeros(total, dtype=torch.uint8, device=device)
    start = int(ends[rank]) - len(data)
    if data:
        own = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        buffer[start : start + len(data)] = own.to(device)
    raw = all_reduce(buffer).cpu().numpy().tobytes()
    starts = (ends - sizes).tolist()
    return [raw[a : a + n] for a, n in zip(starts, sizes.tolist(), strict=True)]


def gather_predictions(
    scorers: Sequence[GenerationScorer],
    loader_ids: Sequence[int],
    task_loaders: TaskLoaders,
    bound: int,
    *,
    all_reduce: Callable[[Tensor], Tensor] | None,
    rank: int,
    world_size: int,
    device: torch.device,
) -> tuple[PredictionItem, ...]:
    """The items the scorers kept of ``loader_ids`` at the evaluation just run, from every rank:
    ordered by loader, scorer and test-set position, at most ``bound`` per loader and scorer (the
    lowest positions). The same on every rank."""
    local = _local_items(scorers, loader_ids, task_loaders.unsharded, rank, world_size, bound)
    chunks = _all_bytes(json.dumps(local).encode("utf-8"), all_reduce, rank, world_size, device)
    gathered = [PredictionItem(*row) for chunk in chunks if chunk for row in json.loads(chunk)]
    gathered.sort(key=lambda p: (p.loader, p.scorer, p.item))
    kept: list[PredictionItem] = []
    count, cell = 0, None
    for p in gathered:
        count = count + 1 if (p.loader, p.scorer) == cell else 1
        cell = (p.loader, p.scorer)
        if count <= bound:
            kept.append(p)
    return tuple(kept)


class PredictionsRecord:
    """The ``predictions`` section of a `RunRecord`: per evaluation (the baseline, every stage)
    the file written and its line count and SHA-256; the bytes of a file not yet written wait in
    `pending` (not in the state: a resumed run keeps the files on disk)."""

    key = "predictions"

    def __init__(
        self,
        max_items: int,
        scorers: Sequence[str],
        task_names: Sequence[str],
        held_out: Sequence[str],
    ) -> None:
        self.max_items = max_items
        self.scorers = list(scorers)
        self.num_tasks = len(task_names)
        self.held_out = list(held_out)
        self.baseline: PredictionFile | None = None
        #: per stage its file (``None``: the write failed)
        self.stages: list[PredictionFile | None] = []
        #: path -> the bytes of a file recorded but not yet written (rank 0 writes them)
        self.pending: dict[str, bytes] = {}

    def _file(self, stage: int | None, scored: Scored) -> PredictionFile:
        what = "the baseline" if stage is None else f"stage {stage}"
        if scored.predictions is None:
            raise ValueError(f"{what}'s evaluation kept no predictions (predictions= is set)")
        T = self.num_tasks
        lines = []
        for p in scored.predictions:
            cell: dict[str, Any] = (
                {"task": p.loader} if p.loader < T else {"held_out": self.held_out[p.loader - T]}
            )
            cell.update(
                scorer=self.scorers[p.scorer],
                item=p.item,
                prediction=p.prediction,
                reference=p.reference,
                score=p.score,
            )
            lines.append(cell)
        path = prediction_file_path(stage)
        data = PredictionFiles.lines_text(lines)
        self.pending[path] = data
        return PredictionFile.of(path, data)

    def record_baseline(self, scored: Scored) -> None:
        self.pending.clear()
        self.baseline = self._file(None, scored)

    def check_stage(self, stage: int, scored: Scored) -> None:
        if scored.predictions is None:
            raise ValueError(
                f"stage {stage}'s evaluation kept no predictions (predictions= is set)"
            )

    def record_stage(self, stage: int, scored: Scored) -> list[str]:
        self.stages = [*self.stages[:stage], self._file(stage, scored)]
        return []

    def state_dict(self) -> dict[str, Any]:
        def entry(f: PredictionFile | None) -> dict[str, Any] | None:
            return None if f is None else dataclasses.asdict(f)

        return {
            "max_items": self.max_items,
            "scorers": list(self.scorers),
            "baseline": entry(self.baseline),
            "stages": [entry(f) for f in self.stages],
        }

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        settings = (self.max_items, self.scorers)
        recorded = None if state is None else (state["max_items"], list(state["scorers"]))
        if recorded != settings:
            raise ValueError(
                f"predictions: recorded (max_items, scorers) {recorded}, now {settings}"
            )
        assert state is not None
        baseline = state["baseline"]
        self.baseline = None if baseline is None else PredictionFile(**baseline)
        self.stages = [None if f is None else PredictionFile(**f) for f in state["stages"]]
        self.pending = {}

    # ------------------------------------------------------------------ journal
    def journal_settings(self) -> dict[str, Any]:
        return {
            "max_items": self.max_items,
            "scorers": list(self.scorers),
            "held_out": self.held_out,
        }

    @classmethod
    def from_journal(
        cls, settings: Mapping[str, Any], task_names: Sequence[str]
    ) -> PredictionsRecord:
        return cls(
            int(settings["max_items"]),
            [str(name) for name in settings["scorers"]],
            task_names,
            [str(name) for name in settings["held_out"]],
        )

    def journal_part(self, stage: int | None) -> dict[str, Any] | None:
        """The file of the baseline or of ``stage`` (path, lines, SHA-256)."""
        entry = self.baseline if stage is None else self.stages[stage]
        return None if entry is None else dataclasses.asdict(entry)

    def replay_part(self, stage: int | None, part: Mapping[str, Any] | None) -> None:
        entry = None if part is None else PredictionFile(**part)
        if stage is None:
            self.baseline = entry
        else:
            self.stages = [*self.stages[:stage], entry]

    def add_to(self, results: ContinualResults) -> ContinualResults:
        """``results`` with the ``predictions`` section of its stages."""
        s = results.primary.num_stages
        files = PredictionFiles(
            max_items=self.max_items,
            scorers=tuple(self.scorers),
            baseline=self.baseline,
            stages=tuple(self.stages[:s]),
        )
        return dataclasses.replace(results, predictions=files)

    # ------------------------------------------------------------------ the files
    def write_pending(self, directory: Path | None) -> None:
        """Write the pending files into ``directory`` (rank 0; ``None``: another rank, nothing
        written), each atomically, and remove stage files beyond the recorded stages (of a run
        this one overwrites, or written after the checkpoint a resumed run started from). A file
        that cannot be written keeps the previous one there and its entry becomes ``None``, so
        nothing names it; then ``ResultsWriteError``."""
        pending, self.pending = self.pending, {}
        if directory is None:
            return
        for path, data in pending.items():
            target = directory / path
            try:
                replace_atomically(target, partial(_write_to, data=data), durable=False)
            except OSError as err:
                self._forget(path)
                raise ResultsWriteError(
                    err.errno,
                    f"could not write {target} ({err.strerror or err}); the previous file there "
                    "(if any) is unchanged and results.json still names the files before it. "
                    "Free the disk (or fix the directory), then resume the run from its last "
                    "checkpoint",
                ) from None
        self.remove_stale(directory)

    def _forget(self, path: str) -> None:
        """The entry of the file at ``path`` becomes ``None`` (its write failed)."""
        if self.baseline is not None and self.baseline.path == path:
            self.baseline = None
        self.stages = [None if f is not None and f.path == path else f for f in self.stages]

    def remove_stale(self, directory: Path) -> list[Path]:
        """Delete ``predictions/stage_{i}.jsonl`` for every ``i`` not recorded."""
        removed = []
        folder = directory / PREDICTIONS_DIR
        if not folder.is_dir():
            return removed
        for path in folder.glob("stage_*.jsonl"):
            number = path.stem.removeprefix("stage_")
            if number.isdigit() and int(number) >= len(self.stages):
                path.unlink(missing_ok=True)
                removed.append(path)
        return removed

    def check_on_disk(self, directory: Path) -> str | None:
        """At a resume: a warning naming the recorded files that are missing or changed (they
        cannot be rebuilt: their items are not in the checkpoint), else ``None``."""
        bad = []
        for f in [self.baseline, *self.stages]:
            if f is None:
                continue
            try:
                f.read(directory)
            except ValueError as err:
                bad.append(str(err))
        if not bad:
            return None
        return (
            "[continual-eval] resumed run: " + "; ".join(bad) + ". results.json names them with "
            "the SHA-256 they were written with"
        )


def _write_to(tmp: Path, *, data: bytes) -> None:
    tmp.write_bytes(data)


def write_pending(record: RunRecord | None, directory: Path | None) -> None:
    """The pending prediction files of ``record`` (when it has the section) into ``directory``."""
    section = None if record is None else record.sections.get(PredictionsRecord.key)
    if isinstance(section, PredictionsRecord):
        section.write_pending(directory)

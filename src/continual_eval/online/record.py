r"""The record of an online evaluation: per-window counts, held-out evaluations over the stream,
their cost, and the ``online`` document (``online.json``) they are written to.

Schema (``format: "continual-eval-online"``, ``version: 1``), validated with msgspec when read
(a value of the wrong type, a missing or unknown field is an error naming the field; nothing is
coerced):

* ``run_id``, ``protocol``: how the stream was scored (`Protocol`);
* ``windows``: one `OnlineWindow` per ``window_batches`` training batches, in stream
  order: which batches and stream positions it covers, and for each score (``online``,
  ``near_future/<delay>``, ``label_delay/<delay>``) the learner's correct predictions, the number
  of samples scored, and each blind predictor's correct predictions on the same samples
  (`ScoreCounts`), with the window's compute (`WindowCost`);
* ``held_out``: the evaluations on held-out sets over the stream (`HeldOut`), or ``null``;
* ``summary``: derived on writing (`OnlineResults.summary`) and ignored on reading (the
  counts are the record; the summary is recomputed from them).

Every count is summed over all ranks of the run (exact under DDP). A window's learner scores are
attributed to the window of the *model's* training position: ``near_future/4`` in window ``w``
holds the scores of the models of window ``w`` on the batches 4 ahead of them.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import torch

from continual_eval.functional import continual_metrics
from continual_eval.functional.online import (
    area_under_curve,
    cumulative_accuracy,
    held_out_curves,
    segment_index,
)
from continual_eval.results.files import replace_atomically

__all__ = [
    "BLIND_PREDICTORS",
    "FORMAT",
    "ONLINE_FILE",
    "VERSION",
    "HeldOut",
    "HeldOutEvaluation",
    "OnlineResults",
    "OnlineWindow",
    "Protocol",
    "ScoreCounts",
    "WindowCost",
    "read_online",
    "score_key",
]

FORMAT = "continual-eval-online"
VERSION = 1
#: the file the record goes to, in the run's results directory (next to ``results.json``)
ONLINE_FILE = "online.json"
#: the blind predictors scored beside the learner: the most frequent label among the
#: ``blind_window`` labels revealed last (``mode``), the last revealed label (``last``), the most
#: frequent label of all revealed so far (``prior``)
BLIND_PREDICTORS = ("mode", "last", "prior")

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(ge=0)]


def score_key(kind: str, delay: int = 0) -> str:
    """The name of a score in a window's ``scores``: ``"online"``, ``"near_future/<delay>"``,
    ``"label_delay/<delay>"``."""
    if kind == "online":
        return "online"
    if kind not in ("near_future", "label_delay"):
        raise ValueError(f"unknown score kind {kind!r}")
    return f"{kind}/{int(delay)}"


class ScoreCounts(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One score in one window: the learner's ``correct`` predictions among ``total`` samples,
    and ``blind[name]``, each blind predictor's correct predictions on the same samples."""

    correct: NonNegative
    total: NonNegative
    blind: dict[str, NonNegative]


class WindowCost(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What one window cost (see `continual_eval.stage_cost`, which measures it).

    ``samples``: training samples consumed, summed over ranks (a ``DistributedSampler``'s padding
    included); ``optimizer_steps``: increments of ``trainer.global_step``; ``train_seconds``: wall
    time of the window's training batches, the callback's per-batch scoring included (clock read
    at window boundaries only, after one CUDA synchronize); ``eval_seconds``: the held-out
    evaluation at the window's end (0 without one); ``scoring_forwards``: the forward passes the
    callback ran for prequential and lookahead scoring, summed over ranks (0 when prequential
    scores reuse the training step's outputs and nothing is read ahead); the rest as in
    `StageCost`.
    """

    samples: NonNegative
    optimizer_steps: NonNegative
    train_seconds: Seconds
    eval_seconds: Seconds
    scoring_forwards: NonNegative
    peak_memory_bytes: NonNegative
    memory_kind: str
    parameters: NonNegative
    trainable_parameters: NonNegative


class OnlineWindow(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``window_batches`` consecutive training batches (the last window may be shorter).

    ``first_batch``/``last_batch``: training batches counted from the run's start (inclusive);
    ``stream_start``/``stream_end``: the stream positions ``[start, end)`` trained in the window
    (samples of all ranks; padding excluded); ``global_step``: optimizer steps of the run at the
    window's end; ``classes_seen``: the distinct labels the stream has shown by the window's
    end (``1 / classes_seen`` is chance for balanced labels).
    """

    index: NonNegative
    first_batch: NonNegative
    last_batch: NonNegative
    stream_start: NonNegative
    stream_end: NonNegative
    global_step: NonNegative
    classes_seen: NonNegative
    scores: dict[str, ScoreCounts]
    cost: WindowCost


class HeldOutEvaluation(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One evaluation on every held-out set, after ``stream_position`` stream samples (the
    number trained; 0: before training), ``batches`` training batches and ``optimizer_steps``
    steps; ``window``: the last window closed before it (``-1``: none); ``segments_ended``: the
    stream segments that ended at this evaluation (their row of ``R``); ``scores``: one per set;
    ``seconds``: its wall time."""

    stream_position: NonNegative
    batches: NonNegative
    optimizer_steps: NonNegative
    window: int
    segments_ended: list[NonNegative]
    scores: list[float]
    seconds: Seconds


class HeldOut(msgspec.Struct, forbid_unknown_fields=True):
    """Held-out sets scored over the stream: ``names``, ``segment_starts`` (the stream position
    where each set's segment starts, or ``None`` when the sets are not tied to stream positions),
    the scorer's name and the evaluations in stream order."""

    names: list[str]
    segment_starts: list[NonNegative] | None
    scorer: str
    evaluations: list[HeldOutEvaluation]


class Protocol(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """How the stream was scored.

    ``batch_size``: samples per training batch on one rank; ``global_batch_size``: the stream
    samples of one training step over all ranks (``world_size * batch_size``: a
    ``DistributedSampler`` gives rank ``r`` the positions ``r, r + W, r + 2W, ...``, so step ``k``
    trains the positions ``[k G, (k + 1) G)``); ``near_future_delays``/``label_delays``: in
    batches; ``blind_window``: the labels the ``mode`` predictor counts; ``prequential``:
    ``"outputs"`` (the training step's own predictions) or ``"forward"`` (an eval-mode forward
    before the optimizer step); ``stream_source``: where lookahead batches were read
    (``"train_loader"``, ``"stream"``, ``"none"``).
    """

    world_size: Annotated[int, msgspec.Meta(ge=1)]
    batch_size: NonNegative
    global_batch_size: NonNegative
    window_batches: Annotated[int, msgspec.Meta(ge=1)]
    near_future_delays: list[Annotated[int, msgspec.Meta(ge=1)]]
    label_delays: list[Annotated[int, msgspec.Meta(ge=1)]]
    blind_window: Annotated[int, msgspec.Meta(ge=1)]
    prequential: Literal["outputs", "forward"]
    stream_source: Literal["train_loader", "stream", "none"]


class _Document(msgspec.Struct, forbid_unknown_fields=True):
    format: Literal["continual-eval-online"]
    version: Literal[1]
    run_id: str
    protocol: Protocol
    windows: list[OnlineWindow]
    held_out: HeldOut | None = None


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _schema_message(err: msgspec.ValidationError) -> str:
    text = str(err)
    if " - at `$" in text:
        message, path = text.rsplit(" - at `$", 1)
        return f"field `{path.rstrip('`').lstrip('.')}`: {message[:1].lower()}{message[1:]}"
    return text


class OnlineResults:
    """The record of an online evaluation (see the module docstring for the fields).

    `to_dict`/`from_dict` give and read the ``online`` document; `write` and
    `read_online` the ``online.json`` file (replaced atomically: a reader sees the previous
    complete version or the new one).
    """

    def __init__(
        self,
        run_id: str,
        protocol: Protocol,
        windows: Sequence[OnlineWindow] = (),
        held_out: HeldOut | None = None,
    ) -> None:
        self.run_id = run_id
        self.protocol = protocol
        self.windows: list[OnlineWindow] = list(windows)
        self.held_out = held_out

    # ------------------------------------------------------------------ reading
    def score_names(self) -> list[str]:
        """The scores of the record, in protocol order."""
        p = self.protocol
        return (
            ["online"]
            + [score_key("near_future", d) for d in p.near_future_delays]
            + [score_key("label_delay", d) for d in p.label_delays]
        )

    def counts(self, score: str, blind: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(correct, total)`` per window (``[windows]`` int64) of one score, the learner's or
        (``blind=``) a blind predictor's."""
        if score not in self.score_names():
            raise KeyError(f"no score {score!r}; the record holds {self.score_names()}")
        correct = [
            (w.scores[score].correct if blind is None else w.scores[score].blind[blind])
            for w in self.windows
        ]
        total = [w.scores[score].total for w in self.windows]
        return torch.tensor(correct, dtype=torch.int64), torch.tensor(total, dtype=torch.int64)

    def accuracy(self, score: str = "online", blind: str | None = None) -> float | None:
        """The score over the whole stream (``None`` when nothing was scored)."""
        correct, total = self.counts(score, blind)
        n = int(total.sum())
        return int(correct.sum()) / n if n else None

    def stream_positions(self) -> torch.Tensor:
        """Each window's end position (samples trained), ``[windows]`` int64."""
        return torch.tensor([w.stream_end for w in self.windows], dtype=torch.int64)

    def held_out_matrix(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A, positions)``: ``A[e, j]`` the score of evaluation ``e`` on held-out set ``j``
        (float64, NaN for a set not evaluated) and each evaluation's stream position."""
        if self.held_out is None or not self.held_out.evaluations:
            return torch.zeros(0, 0, dtype=torch.float64), torch.zeros(0, dtype=torch.int64)
        evaluations = self.held_out.evaluations
        A = torch.tensor([e.scores for e in evaluations], dtype=torch.float64)
        positions = torch.tensor([e.stream_position for e in evaluations], dtype=torch.int64)
        return A, positions

    def held_out_segments(self) -> torch.Tensor:
        """Per held-out evaluation, the stream segment it was made in
        (`segment_index`); without segment starts every
        set counts as seen and left (``J``), except before training (``-1``)."""
        A, positions = self.held_out_matrix()
        assert self.held_out is not None or not positions.numel()
        if not positions.numel():
            return torch.zeros(0, dtype=torch.int64)
        assert self.held_out is not None
        starts = self.held_out.segment_starts
        if starts is None:
            return torch.where(positions > 0, A.shape[1], -1)
        return segment_index(positions, torch.tensor(starts, dtype=torch.int64))

    def held_out_rows(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(R, b)`` when segment starts are given and every segment ended: ``R[i, j]`` the score
        on set ``j`` when segment ``i`` ended, ``b`` the scores before training; else ``None``."""
        held = self.held_out
        if held is None or held.segment_starts is None or not held.evaluations:
            return None
        J = len(held.names)
        rows: dict[int, list[float]] = {}
        for evaluation in held.evaluations:
            for i in evaluation.segments_ended:
                rows[i] = evaluation.scores
        first = held.evaluations[0]
        if first.stream_position != 0 or sorted(rows) != list(range(J)):
            return None
        R = torch.tensor([rows[i] for i in range(J)], dtype=torch.float64)
        return R, torch.tensor(first.scores, dtype=torch.float64)

    # ------------------------------------------------------------------ summary
    def summary(self) -> dict[str, Any]:
        """Derived numbers: per score, the learner's and every blind predictor's accuracy over the
        stream and the gap to the best blind predictor; the total cost; the held-out curves at the
        last evaluation, the anytime accuracy ``A_AUC`` over the stream and, with segments, the
        matrix ``R`` and its metrics. Non-finite values are ``None``."""
        scores: dict[str, Any] = {}
        for name in self.score_names():
            learner = self.accuracy(name)
            blind = {b: self.accuracy(name, b) for b in BLIND_PREDICTORS}
            present = [v for v in blind.values() if v is not None]
            best = max(present) if present else None
            scores[name] = {
                "accuracy": learner,
                "samples": int(self.counts(name)[1].sum()),
                "blind": blind,
                "gap_to_best_blind": None if learner is None or best is None else learner - best,
            }
        costs = [w.cost for w in self.windows]
        cost = {
            "windows": len(self.windows),
            "batches": self.windows[-1].last_batch + 1 if self.windows else 0,
            "samples": sum(c.samples for c in costs),
            "stream_samples": self.windows[-1].stream_end if self.windows else 0,
            "optimizer_steps": sum(c.optimizer_steps for c in costs),
            "train_seconds": sum(c.train_seconds for c in costs),
            "eval_seconds": sum(c.eval_seconds for c in costs),
            "scoring_forwards": sum(c.scoring_forwards for c in costs),
            "peak_memory_bytes": max((c.peak_memory_bytes for c in costs), default=0),
        }
        return {"scores": scores, "cost": cost, "held_out": self._held_out_summary()}

    def _held_out_summary(self) -> dict[str, Any] | None:
        A, positions = self.held_out_matrix()
        if not A.numel():
            return None
        segment = self.held_out_segments()
        curves = held_out_curves(A, segment)
        final = {name: _finite(float(v[-1])) for name, v in curves.items()}
        trained = segment >= 0
        auc = area_under_curve(curves["seen"][trained], positions[trained])
        out: dict[str, Any] = {
            "final": final,
            "anytime_accuracy": _finite(float(auc)),
            "evaluations": int(A.shape[0]),
        }
        rows = self.held_out_rows()
        if rows is not None:
            R, b = rows
            metrics = continual_metrics(R, b, validate=False)
            out["matrix"] = [[_finite(float(v)) for v in row] for row in R]
            out["metrics"] = {k: _finite(float(v)) for k, v in metrics.items()}
        return out

    def curves(self) -> dict[str, torch.Tensor]:
        """Per-window curves for plots and tables: ``position`` (window ends), and for every score
        ``<score>`` its window accuracy, ``<score>/cumulative`` and ``<score>/blind_<name>``."""
        out: dict[str, torch.Tensor] = {"position": self.stream_positions()}
        for name in self.score_names():
            correct, total = self.counts(name)
            out[name] = correct.double() / total.double()
            out[f"{name}/cumulative"] = cumulative_accuracy(correct, total)
            for b in BLIND_PREDICTORS:
                blind, _ = self.counts(name, b)
                out[f"{name}/blind_{b}"] = blind.double() / total.double()
        return out

    # ------------------------------------------------------------------ documents
    def to_dict(self, *, summary: bool = True) -> dict[str, Any]:
        """The ``online`` document (JSON-ready builtins; ``summary``: add the derived summary)."""
        document = _Document(
            format="continual-eval-online",
            version=1,
            run_id=self.run_id,
            protocol=self.protocol,
            windows=self.windows,
            held_out=self.held_out,
        )
        out: dict[str, Any] = msgspec.to_builtins(document)
        for evaluation in out["held_out"]["evaluations"] if out["held_out"] else []:
            evaluation["scores"] = [_finite(v) for v in evaluation["scores"]]
        if summary:
            out["summary"] = self.summary()
        return out

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> OnlineResults:
        """Read an ``online`` document, validated against the schema (no coercion: ``"3"`` is
        not a count, ``1.5`` is not a position); ``summary`` is ignored. ``ValueError`` names the
        field or the window that is wrong."""
        if not isinstance(document, Mapping):
            raise ValueError(f"an online document must be a JSON object, got {type(document)}")
        data = {k: v for k, v in document.items() if k != "summary"}
        held = data.get("held_out")
        if isinstance(held, Mapping) and isinstance(held.get("evaluations"), list):
            # JSON has no NaN: a set not evaluated is written as null
            evaluations = []
            for e in held["evaluations"]:
                if isinstance(e, Mapping) and isinstance(e.get("scores"), list):
                    e = {**e, "scores": [math.nan if v is None else v for v in e["scores"]]}
                evaluations.append(e)
            data["held_out"] = {**held, "evaluations": evaluations}
        try:
            doc = msgspec.convert(data, _Document, strict=True)
        except msgspec.ValidationError as err:
            raise ValueError(f"online document: {_schema_message(err)}") from None
        results = cls(doc.run_id, doc.protocol, doc.windows, doc.held_out)
        results.check()
        return results

    def check(self) -> None:
        """Consistency the schema cannot state; ``ValueError`` naming the window or evaluation."""
        names = self.score_names()
        previous: OnlineWindow | None = None
        for k, w in enumerate(self.windows):
            where = f"window {k}"
            if w.index != k:
                raise ValueError(f"{where}: index is {w.index}; windows must be numbered 0, 1, ...")
            if w.last_batch < w.first_batch or w.stream_end < w.stream_start:
                raise ValueError(f"{where}: ends before it starts")
            if previous is not None and (
                w.first_batch != previous.last_batch + 1 or w.stream_start != previous.stream_end
            ):
                raise ValueError(f"{where}: does not continue window {k - 1}")
            if sorted(w.scores) != sorted(names):
                raise ValueError(f"{where}: scores {sorted(w.scores)}, the protocol has {names}")
            for name, s in w.scores.items():
                if s.correct > s.total or sorted(s.blind) != sorted(BLIND_PREDICTORS):
                    raise ValueError(f"{where}, score {name}: counts are inconsistent")
                if any(v > s.total for v in s.blind.values()):
                    raise ValueError(f"{where}, score {name}: a blind count exceeds the total")
            previous = w
        held = self.held_out
        if held is None:
            return
        J = len(held.names)
        if held.segment_starts is not None and (
            len(held.segment_starts) != J
            or held.segment_starts[:1] != [0]
            or any(b <= a for a, b in itertools.pairwise(held.segment_starts))
        ):
            raise ValueError(
                "held_out.segment_starts: one increasing stream position per set, starting at 0"
            )
        last = -1
        for e, evaluation in enumerate(held.evaluations):
            if len(evaluation.scores) != J:
                raise ValueError(
                    f"held-out evaluation {e}: {len(evaluation.scores)} scores, {J} sets"
                )
            if evaluation.stream_position < last:
                raise ValueError(f"held-out evaluation {e}: stream position goes back")
            if any(i >= J for i in evaluation.segments_ended):
                raise ValueError(f"held-out evaluation {e}: segments_ended names a missing set")
            last = evaluation.stream_position

    # ------------------------------------------------------------------ files
    def write(self, path: str | os.PathLike[str], *, durable: bool = True) -> Path:
        """Write the document (with its summary) to ``path``, replacing it atomically."""
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"
        replace_atomically(path, lambda p: p.write_text(text, encoding="utf-8"), durable=durable)
        return Path(path)


def read_online(path: str | os.PathLike[str]) -> OnlineResults:
    """Read an ``online.json`` (a directory means the file in it); errors name the file."""
    path = Path(path)
    if path.is_dir():
        path = path / ONLINE_FILE
    try:
        with open(path, encoding="utf-8") as fh:
            document = json.load(fh)
        return OnlineResults.from_dict(document)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None

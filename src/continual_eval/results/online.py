r"""The ``online`` section of ``results.json``: ``OnlineResults``.

What [`OnlineEvalCallback`][continual_eval.online.OnlineEvalCallback] records over a stream
(the section's fields are [`OnlineSection`][continual_eval.results.schema.OnlineSection],
defined once in the schema):

* ``protocol``: how the stream was scored
  ([`OnlineProtocol`][continual_eval.results.schema.OnlineProtocol]);
* ``windows``: one [`OnlineWindow`][continual_eval.results.schema.OnlineWindow] per
  ``window_batches`` training batches, in stream order: which batches and stream positions it
  covers, and for each score (``online``, ``near_future/<delay>``, ``label_delay/<delay>``)
  the learner's correct predictions, the number of samples scored, and each blind predictor's
  correct predictions on the same samples
  ([`ScoreCounts`][continual_eval.results.schema.ScoreCounts]), with the window's compute
  ([`WindowCost`][continual_eval.results.schema.WindowCost]: samples seen, optimizer steps,
  wall time);
* ``held_out``: the evaluations on held-out sets over the stream
  ([`HeldOut`][continual_eval.results.schema.HeldOut]), or ``null``: from them the anytime accuracy
  and the forgetting over time;
* ``summary``: derived on writing (``OnlineResults.summary``) and recomputed on reading (the
  counts are the record).

Every count is summed over all ranks of the run (exact under DDP). A window's learner scores are
attributed to the window of the *model's* training position: ``near_future/4`` in window ``w``
holds the scores of the models of window ``w`` on the batches 4 ahead of them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import torch

from continual_eval.functional import continual_metrics
from continual_eval.functional.intervals import (
    DEFAULT_CONFIDENCE,
    wilson_interval,
    window_means_interval,
)
from continual_eval.functional.online import (
    area_under_curve,
    cumulative_accuracy,
    held_out_curves,
    segment_index,
)
from continual_eval.results._errors import schema_error
from continual_eval.results.schema import (
    BLIND_PREDICTORS,
    HeldOut,
    InvalidResultsError,
    OnlineProtocol,
    OnlineSection,
    OnlineWindow,
    check_online_section,
    online_score_names,
)

__all__ = ["BLIND_PREDICTORS", "OnlineResults", "score_key"]


def score_key(kind: str, delay: int = 0) -> str:
    """The name of a score in a window's ``scores``: ``"online"``, ``"near_future/<delay>"``,
    ``"label_delay/<delay>"``."""
    if kind == "online":
        return "online"
    if kind not in ("near_future", "label_delay"):
        raise ValueError(f"unknown score kind {kind!r}")
    return f"{kind}/{int(delay)}"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


class OnlineResults:
    """The record of an online evaluation, the ``online`` section of ``results.json`` (see the
    module docstring for the fields).

    ``to_section``/``from_section`` convert to and from the schema's
    [`OnlineSection`][continual_eval.results.schema.OnlineSection], ``to_dict``/``from_dict`` to
    and from the section as plain JSON values (validated like a file: an
    [`InvalidResultsError`][continual_eval.results.InvalidResultsError] names the field, e.g.
    ``online.windows[1].scores.online.correct``). In a run it is
    the ``online`` of its
    [`ContinualResults`][continual_eval.results.ContinualResults].
    """

    def __init__(
        self,
        protocol: OnlineProtocol,
        windows: Sequence[OnlineWindow] = (),
        held_out: HeldOut | None = None,
    ) -> None:
        self.protocol = protocol
        self.windows: list[OnlineWindow] = list(windows)
        self.held_out = held_out

    # ------------------------------------------------------------------ reading
    def score_names(self) -> list[str]:
        """The scores of the record, in protocol order."""
        return online_score_names(self.protocol)

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

    def window_interval(
        self,
        score: str = "online",
        blind: str | None = None,
        *,
        confidence: float = DEFAULT_CONFIDENCE,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(low, high)`` per window (``[windows]`` float64, NaN for an empty window): the Wilson
        interval of the window accuracy ``correct / total`` of one score, the learner's or
        (``blind=``) a blind predictor's, from the stored counts.

        Wilson treats the window's predictions as independent trials; on an autocorrelated stream
        they are not, and the interval undercovers (measured in ``docs/online.md``)."""
        correct, total = self.counts(score, blind)
        return wilson_interval(correct, total, confidence=confidence)

    def accuracy_interval(
        self,
        score: str = "online",
        blind: str | None = None,
        *,
        confidence: float = DEFAULT_CONFIDENCE,
        method: str = "windows",
    ) -> tuple[float, float] | None:
        """An interval of [`accuracy`][continual_eval.results.OnlineResults.accuracy] (the
        counts pooled over the stream); ``None`` when nothing was scored.

        ``method="windows"`` (default): batch means over the windows
        ([`window_means_interval`][continual_eval.functional.intervals.window_means_interval]),
        whose spread carries the stream's autocorrelation, joined with the Wilson interval of
        the pooled counts (never narrower than the counts' binomial noise; that alone where
        fewer than two windows were scored or all windows agree): measured coverage in
        ``docs/online.md``, 94 % with labels in runs of 150 where Wilson alone gives 42 %;
        ``"wilson"``: the Wilson interval of the pooled counts, which treats every prediction as
        an independent trial (the caveat of ``window_interval``)."""
        if method not in ("windows", "wilson"):
            raise ValueError(
                f"accuracy_interval: method must be 'windows' or 'wilson', got {method!r}"
            )
        correct, total = self.counts(score, blind)
        if not int(total.sum()):
            return None
        low, high = (
            float(end) for end in wilson_interval(correct.sum(), total.sum(), confidence=confidence)
        )
        if method == "windows":
            spread = window_means_interval(correct, total, confidence=confidence)
            if spread is not None:
                low, high = min(low, spread[0]), max(high, spread[1])
        return low, high

    def stream_positions(self) -> torch.Tensor:
        """Each window's end position (samples trained), ``[windows]`` int64."""
        return torch.tensor([w.stream_end for w in self.windows], dtype=torch.int64)

    def held_out_matrix(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A, positions)``: ``A[e, j]`` the score of evaluation ``e`` on held-out set ``j``
        (float64, NaN for a set not evaluated) and each evaluation's stream position."""
        if self.held_out is None or not self.held_out.evaluations:
            return torch.zeros(0, 0, dtype=torch.float64), torch.zeros(0, dtype=torch.int64)
        evaluations = self.held_out.evaluations
        A = torch.tensor(
            [[math.nan if v is None else v for v in e.scores] for e in evaluations],
            dtype=torch.float64,
        )
        positions = torch.tensor([e.stream_position for e in evaluations], dtype=torch.int64)
        return A, positions

    def held_out_segments(self) -> torch.Tensor:
        """Per held-out evaluation, the stream segment it was made in
        (``segment_index``); without segment starts every
        set counts as seen and left (``J``), except before training (``-1``)."""
        A, positions = self.held_out_matrix()
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
                rows[i] = [math.nan if v is None else v for v in evaluation.scores]
        first = held.evaluations[0]
        if first.stream_position != 0 or sorted(rows) != list(range(J)):
            return None
        R = torch.tensor([rows[i] for i in range(J)], dtype=torch.float64)
        b = [math.nan if v is None else v for v in first.scores]
        return R, torch.tensor(b, dtype=torch.float64)

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

    # ------------------------------------------------------------------ the section
    def to_section(self, *, summary: bool = True) -> OnlineSection:
        """The ``online`` section (``summary``: with the derived summary)."""
        held = self.held_out
        if held is not None:  # JSON has no NaN: a set not evaluated is null
            evaluations = [
                msgspec.structs.replace(
                    e, scores=[None if v is None or not math.isfinite(v) else v for v in e.scores]
                )
                for e in held.evaluations
            ]
            held = HeldOut(
                names=list(held.names),
                segment_starts=None if held.segment_starts is None else list(held.segment_starts),
                scorer=held.scorer,
                evaluations=evaluations,
            )
        return OnlineSection(
            protocol=self.protocol,
            windows=list(self.windows),
            held_out=held,
            summary=self.summary() if summary else None,
        )

    @classmethod
    def from_section(cls, section: OnlineSection) -> OnlineResults:
        """From a checked section (its ``summary`` is not read: it is recomputed)."""
        held = section.held_out
        if held is not None:
            held = HeldOut(
                names=list(held.names),
                segment_starts=held.segment_starts,
                scorer=held.scorer,
                evaluations=list(held.evaluations),
            )
        return cls(section.protocol, section.windows, held)

    def to_dict(self, *, summary: bool = True) -> dict[str, Any]:
        """The ``online`` section as plain JSON values (``summary``: with the derived summary)."""
        out: dict[str, Any] = msgspec.to_builtins(self.to_section(summary=summary))
        return out

    @classmethod
    def from_dict(
        cls, section: Mapping[str, Any], *, source: str | os.PathLike[str] = "online section"
    ) -> OnlineResults:
        """Read an ``online`` section (a ``dict``), validated as in a file from elsewhere (no
        coercion: ``"3"`` is not a count, ``1.5`` is not a position; ``summary`` is not read).
        [`InvalidResultsError`][continual_eval.results.InvalidResultsError] (a ``ValueError``)
        names ``source`` and the field (``online.windows[1].scores.online.correct``)."""
        if not isinstance(section, Mapping):
            raise InvalidResultsError(
                source, "online", f"expected an object, found {type(section).__name__}"
            )
        data = dict(section)
        try:
            checked = msgspec.convert(data, OnlineSection, strict=True)
        except msgspec.ValidationError as err:
            raise schema_error(err, data, source, root=OnlineSection, prefix="online") from None
        return cls.from_section(check_online_section(checked, source))

    def check(self) -> None:
        """The section's rules
        ([`check_online_section`][continual_eval.results.schema.check_online_section]);
        [`InvalidResultsError`][continual_eval.results.InvalidResultsError] naming the field."""
        check_online_section(self.to_section(summary=False), "online record")

"""One window's per-sample rows, and the counts they give once every rank's rows are together.

While a window is open each rank keeps, per scored batch, its predicted labels and targets (on
the device, no host sync) with their stream positions, the training step they belong to, the
lookahead offset ``m`` (0: the training batch itself) and the cutoff (the stream position where
that training step starts: the labels revealed to the learner). At the window's end the rows of
all ranks are gathered and `score_rows` turns them into the window's counts: the lookahead
table of `continual_eval.functional.online` per training step and offset, for the learner and
for every blind predictor, which sees exactly the labels before each row's cutoff.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from continual_eval.functional.online import last_label, lookahead_counts, recent_mode
from continual_eval.online.record import BLIND_PREDICTORS, ScoreCounts, score_key
from continual_eval.online.scoring import NONFINITE

__all__ = ["COLUMNS", "BlindState", "WindowBuffer", "score_rows"]

#: the columns of a window's rows (int64)
COLUMNS = ("step", "offset", "pred", "target", "position", "cutoff", "classes")
STEP, OFFSET, PRED, TARGET, POSITION, CUTOFF, CLASSES = range(len(COLUMNS))
_NEVER = -(2**62)


@dataclass
class _Piece:
    step: int
    offset: int
    pred: Tensor
    top: Tensor | None
    target: Tensor
    first: int
    stride: int
    cutoff: int
    classes: int


@dataclass
class WindowBuffer:
    """The open window of one rank: its scored batches and its compute counters."""

    pieces: list[_Piece] = field(default_factory=list)
    merged: Tensor | None = None  # rows restored from a checkpoint
    samples: int = 0  # training samples consumed on this rank (padding included)
    forwards: int = 0  # scoring forward passes on this rank
    steps: int = 0  # training batches in the window

    def add(
        self,
        step: int,
        offset: int,
        pred: Tensor,
        top: Tensor | None,
        target: Tensor,
        *,
        first: int,
        stride: int,
        cutoff: int,
        classes: int,
    ) -> None:
        """Rows of one scored batch: sample ``j`` sits at stream position ``first + stride j``;
        ``top``: the top class score of each prediction (``None`` for label predictions)."""
        self.pieces.append(_Piece(step, offset, pred, top, target, first, stride, cutoff, classes))

    def rows(self, device: torch.device) -> Tensor:
        """``[n, 7]`` int64 on ``device``, the columns of `COLUMNS`; a prediction whose top
        class score is NaN or infinite has the label `NONFINITE` (checked here, once per window, on
        the device)."""
        parts = [] if self.merged is None else [self.merged.to(device)]
        pieces = self.pieces
        if pieces:
            preds = torch.cat([p.pred.reshape(-1) for p in pieces]).to(device, torch.int64)
            scored = [p.top.reshape(-1) for p in pieces if p.top is not None]
            if scored:
                with_top = torch.tensor([p.top is not None for p in pieces])
                finite = torch.ones(preds.shape[0], dtype=torch.bool, device=device)
                top = torch.cat(scored).to(device, torch.float32)
                sizes = torch.tensor([p.pred.numel() for p in pieces])
                finite[with_top.repeat_interleave(sizes).to(device)] = (top - top) == 0
                preds = torch.where(finite, preds, torch.full_like(preds, NONFINITE))
            targets = torch.cat([p.target.reshape(-1) for p in pieces]).to(device, torch.int64)
            # per piece: step, offset, first position, stride, cutoff, classes, size
            meta = torch.tensor(
                [
                    [p.step, p.offset, p.first, p.stride, p.cutoff, p.classes, p.pred.numel()]
                    for p in pieces
                ],
                dtype=torch.int64,
            )
            per_row = meta.repeat_interleave(meta[:, 6], dim=0)
            starts = meta[:, 6].cumsum(0) - meta[:, 6]
            slot = torch.arange(per_row.shape[0]) - starts.repeat_interleave(meta[:, 6])
            position = per_row[:, 2] + per_row[:, 3] * slot
            host = torch.stack(
                [per_row[:, 0], per_row[:, 1], position, per_row[:, 4], per_row[:, 5]], dim=1
            ).to(device)
            parts.append(
                torch.stack(
                    [host[:, 0], host[:, 1], preds, targets, host[:, 2], host[:, 3], host[:, 4]],
                    dim=1,
                )
            )
        if not parts:
            return torch.zeros(0, len(COLUMNS), dtype=torch.int64, device=device)
        return torch.cat(parts)


@dataclass
class BlindState:
    """What the blind predictors know at a window's start: the last ``blind_window`` labels of
    the stream (``tail``), how often each class occurred so far and where it last did."""

    tail: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    counts: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    last: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))

    def grown(self, classes: int) -> BlindState:
        extra = classes - self.counts.numel()
        if extra <= 0:
            return self
        return BlindState(
            self.tail,
            torch.cat([self.counts, torch.zeros(extra, dtype=torch.int64)]),
            torch.cat([self.last, torch.full((extra,), _NEVER, dtype=torch.int64)]),
        )

    def state_dict(self) -> dict[str, Any]:
        return {"tail": self.tail.clone(), "counts": self.counts.clone(), "last": self.last.clone()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> BlindState:
        return cls(state["tail"].long(), state["counts"].long(), state["last"].long())


def _problem(rows: Tensor, bad: Tensor, what: str, describe: Any) -> str:
    row = rows[bad.nonzero()[0, 0]]
    return (
        f"{int(bad.sum())} {what}; the first in {describe(int(row[OFFSET]))} of training batch "
        f"{int(row[STEP])} of the window (stream position {int(row[POSITION])})"
    )


def _check_rows(rows: Tensor, where: str) -> None:
    """Raise ``ValueError`` naming the window for non-finite predictions and for targets that
    are not labels of the model's classes."""

    def describe(offset: int) -> str:
        return "the training batch" if offset == 0 else f"the batch read {offset} ahead"

    problems = []
    nonfinite = rows[:, PRED] == NONFINITE
    if bool(nonfinite.any()):
        problems.append(
            _problem(rows, nonfinite, "predictions with non-finite class scores", describe)
        )
    classes = rows[:, CLASSES]
    bad = (rows[:, TARGET] < 0) | ((classes > 0) & (rows[:, TARGET] >= classes))
    if bool(bad.any()):
        problems.append(
            _problem(rows, bad, "targets that are not labels of the model's classes", describe)
        )
    if problems:
        raise ValueError(f"{where}: " + "; ".join(problems))


def _trained_positions(rows: Tensor, window_start: int, where: str) -> tuple[Tensor, Tensor]:
    """The trained rows' stream positions and labels in stream order; ``ValueError`` unless the
    positions are one contiguous run from ``window_start``."""
    train = rows[rows[:, OFFSET] == 0]
    train = train[train[:, POSITION].argsort()]
    positions = train[:, POSITION]
    expected = torch.arange(window_start, window_start + train.shape[0])
    if not torch.equal(positions, expected):
        mismatch = int((positions != expected).nonzero()[0, 0])
        raise ValueError(
            f"{where}: the trained stream positions are not one run from {window_start}: "
            f"position {int(positions[mismatch])} where {int(expected[mismatch])} was due. "
            "Every rank must train equally many samples per step in the interleaved order a "
            "DistributedSampler gives (rank r: r, r + W, r + 2W, ...)"
        )
    return positions, train[:, TARGET]


def _blind_predictions(
    history: Tensor,
    labels: Tensor,
    cutoff: Tensor,
    window_start: int,
    blind: BlindState,
    blind_window: int,
    num_classes: int,
) -> dict[str, Tensor]:
    """Each blind predictor's guess for every row: the mode of the last ``blind_window`` labels
    before its cutoff, the last label, and the mode of every label so far (the prior)."""
    history_start = window_start - blind.tail.numel()
    return {
        "mode": recent_mode(history, cutoff - history_start, blind_window, num_classes=num_classes),
        "last": last_label(history, cutoff - history_start),
        "prior": recent_mode(
            labels,
            cutoff - window_start,
            None,
            num_classes=num_classes,
            counts_before=blind.counts,
            last_seen_before=torch.where(
                blind.last == _NEVER, blind.last, blind.last - window_start
            ),
        ),
    }


def score_rows(
    rows: Tensor,
    *,
    window_start: int,
    steps: int,
    head: bool,
    near_future_delays: Sequence[int],
    label_delays: Sequence[int],
    blind_window: int,
    blind: BlindState,
    where: str,
) -> tuple[dict[str, ScoreCounts], BlindState, int]:
    """The window's counts from the rows of every rank: ``(scores, blind state after the window,
    stream position at the window's end)``.

    ``window_start``: the stream position where the window starts; ``steps``: its training
    batches; ``head``: the window holds the run's first batch (label-delay scores add the
    untrained model's scores of the first ``d`` batches). Raises ``ValueError`` naming the window
    (``where``) for non-finite predictions, targets that are not labels of the model's classes, and
    training positions that are not one contiguous run of the stream (the ranks did not train the
    interleaved order of the module docstring of `continual_eval.online.stream`).
    """
    rows = rows.to("cpu", torch.int64)
    _check_rows(rows, where)
    positions, labels = _trained_positions(rows, window_start, where)
    window_end = window_start + labels.numel()
    classes = rows[:, CLASSES]
    num_classes = max(
        int(blind.counts.numel()),
        int(classes.max()) if classes.numel() else 0,
        int(rows[:, TARGET].max()) + 1 if rows.numel() else 0,
        1,
    )
    blind = blind.grown(num_classes)
    history = torch.cat([blind.tail, labels])
    cutoff = rows[:, CUTOFF]
    if rows.numel() and (int(cutoff.min()) < window_start or int(cutoff.max()) > window_end):
        raise ValueError(f"{where}: a row's cutoff lies outside the window")
    predictions = _blind_predictions(
        history, labels, cutoff, window_start, blind, blind_window, num_classes
    )
    target = rows[:, TARGET]
    columns = max([0, *near_future_delays, *label_delays]) + 1
    index = (rows[:, STEP], rows[:, OFFSET])
    if rows.numel() and int(rows[:, OFFSET].max()) >= columns:
        raise ValueError(f"{where}: a row was read further ahead than any delay")

    def table(values: Tensor) -> Tensor:
        out = torch.zeros(steps, columns, dtype=torch.int64)
        return out.index_put_(index, values.to(torch.int64), accumulate=True)

    total = table(torch.ones_like(target))
    correct = {"learner": table(rows[:, PRED] == target)}
    correct.update({name: table(predictions[name] == target) for name in BLIND_PREDICTORS})

    def counts(delay: int, label_delay: bool) -> ScoreCounts:
        def summed(table_: Tensor) -> int:
            return int(lookahead_counts(table_, total, delay, label_delay=label_delay)[0].sum())

        return ScoreCounts(
            correct=summed(correct["learner"]),
            total=int(lookahead_counts(total, total, delay, label_delay=label_delay)[1].sum()),
            blind={name: summed(correct[name]) for name in BLIND_PREDICTORS},
        )

    scores = {"online": counts(0, False)}
    for d in near_future_delays:
        scores[score_key("near_future", d)] = counts(d, False)
    for d in label_delays:
        scores[score_key("label_delay", d)] = counts(d, head)

    seen = torch.zeros(num_classes, dtype=torch.int64).index_add_(
        0, labels, torch.ones_like(labels)
    )
    last = blind.last.clone()
    last.scatter_reduce_(0, labels, positions, reduce="amax")
    after = BlindState(history[-blind_window:].clone(), blind.counts + seen, last)
    return scores, after, window_end

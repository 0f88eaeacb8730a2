r"""Online continual learning on a stream: prequential, near-future and label-delay accuracy,
blind baselines, aggregation over stream position, and held-out curves over time.

Pure tensor functions: nothing here keeps state or modifies its inputs.

The stream is a sequence of batches `B_0, B_1, \dots, B_{T-1}`; `f_{<k}` is the model
after training on `B_0, \dots, B_{k-1}` (before its optimizer step on `B_k`).

**The lookahead table.** ``correct[k, m]`` and ``total[k, m]`` hold the correct predictions and the
number of samples of `f_{<k}` on batch `B_{k+m}` (``total`` 0 where `k + m \ge
T` or the cell was not scored). Every accuracy below is a sum over cells of this table, so a plain
test-then-train loop that fills it gives all of them::

    for k in range(T):
        for m in range(M):  # offsets 0..M-1
            if k + m < T:
                x, y = batches[k + m]
                correct[k, m] = (model(x).argmax(1) == y).sum()
                total[k, m] = len(y)
        train_step(model, batches[k])

* prequential (test-then-train) online accuracy, column 0 (`prequential_accuracy`):
  `a_{\mathrm{online}} = \sum_k c_{k,0} / \sum_k n_{k,0}`, each batch scored by the model
  before its optimizer step on it (Cai, Sener & Koltun, "Online Continual Learning with Natural
  Distribution Shifts: An Empirical Study with Visual Data", ICCV 2021: "each incoming small batch
  of data is first used for testing and then added to the training set");
* near-future accuracy at delay `\delta` batches, column `\delta`
  (`near_future_accuracy`): `a_{\mathrm{NF}}(\delta) = \sum_{k < T-\delta}
  c_{k,\delta} / \sum_{k<T-\delta} n_{k,\delta}`, the model scored on the samples
  `\delta` batches ahead of its training position, past the spurious label correlation of
  the immediate next samples (Hammoud, Prabhu, Lim, Torr, Bibi & Ghanem, "Rapid Adaptation in
  Online Continual Learning: Are We Evaluating It Right?", ICCV 2023, arXiv 2305.09275; their code
  reads the test stream ``delay * test_batch_size`` samples ahead of the training stream);
  `\delta = 0` is the online accuracy;
* label-delay accuracy at delay `d` (`label_delay_accuracy`): at stream step
  `t` the unlabeled batch `x_t` is predicted by the model trained on the labels of
  `B_0, \dots, B_{t-d-1}` (Csaba, Zhang, Müller, Lim, Elhoseiny, Torr & Bibi, "Label Delay in
  Online Continual Learning", NeurIPS 2024: each step reveals `x_t` and the labels of step
  `t-d`; the model is evaluated on `x_t` before its update). In training positions
  `k = t - d`: the cells `(k, d)` for every `k`, plus `(0, m)` for
  `m < d` (the first `d` steps have no label yet and are scored by the untrained
  model). `d = 0` is the online accuracy. Its only difference from near-future accuracy at
  the same delay is that head.

**Blind baselines** (Hammoud et al.): classifiers that never look at the input and predict from
past labels only, to measure how much of an online accuracy label correlation alone explains.
`recent_mode` predicts the most frequent label among the ``window`` labels revealed last
(``window=None``: among all labels revealed so far); `last_label` predicts the last revealed
label (``recent_mode`` with ``window=1``). A query scores the samples of a batch with the labels
revealed before a cutoff (the start of the training batch whose model the learner uses), so the
blind predictor knows exactly what the learner knows. Ties go to the label seen most recently
(Hammoud et al.'s code also breaks ties towards the newest label); with no label revealed the
prediction is ``-1``, which never matches a label.

**Aggregation over the stream**: `cumulative_accuracy` (the running average online accuracy
`a_t = \sum_{s \le t} c_s / \sum_{s \le t} n_s` that Cai et al. plot),
`windowed_accuracy` (the same over the last ``w`` bins), `binned_counts` (counts summed
into bins of stream position).

**Held-out sets over time** (`segment_index`, `held_out_curves`,
`area_under_curve`): ``accuracy[e, j]`` is the score at evaluation ``e`` (made after
``positions[e]`` training samples) on held-out set ``j``, drawn from the stream segment that starts
at position ``starts[j]``. These need no task ids: the segments are stream positions.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "area_under_curve",
    "binned_counts",
    "cumulative_accuracy",
    "held_out_curves",
    "label_delay_accuracy",
    "last_label",
    "lookahead_counts",
    "near_future_accuracy",
    "prequential_accuracy",
    "recent_mode",
    "segment_index",
    "windowed_accuracy",
]


# --------------------------------------------------------------------------- validation helpers
def _integer_tensor(name: str, value: object, ndim: int) -> Tensor:
    if (
        not isinstance(value, Tensor)
        or value.ndim != ndim
        or value.is_floating_point()
        or value.is_complex()
        or value.dtype == torch.bool
    ):
        shape = tuple(getattr(value, "shape", ()))
        raise ValueError(
            f"{name} must be an integer tensor with {ndim} dimension(s), got "
            f"{getattr(value, 'dtype', type(value).__name__)} {shape}"
        )
    return value


def _check_table(correct: Tensor, total: Tensor, columns: int) -> None:
    """``correct`` and ``total``: integer ``[T, M]`` tensors of one shape, ``M >= columns``,
    ``0 <= correct <= total``."""
    _integer_tensor("correct", correct, 2)
    _integer_tensor("total", total, 2)
    if correct.shape != total.shape:
        raise ValueError(
            f"correct and total differ in shape: {tuple(correct.shape)} vs {tuple(total.shape)}"
        )
    if correct.shape[1] < columns:
        raise ValueError(
            f"the lookahead table has {correct.shape[1]} offset column(s) "
            f"(0..{correct.shape[1] - 1}); this score reads column {columns - 1}"
        )
    bad = (correct < 0) | (correct > total)
    if bool(bad.any()):
        k, m = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"cell [{k}, {m}]: correct = {int(correct[k, m])} with total = {int(total[k, m])}; "
            "need 0 <= correct <= total"
        )


def _check_delay(delay: int) -> None:
    if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
        raise ValueError(f"delay must be an integer >= 0 (batches), got {delay!r}")


def _ratio(correct: Tensor, total: Tensor) -> Tensor:
    """``correct / total`` as float64, NaN where ``total`` is 0."""
    c, n = correct.to(torch.float64), total.to(torch.float64)
    return torch.where(n > 0, c / n.clamp(min=1), torch.full_like(n, float("nan")))


# --------------------------------------------------------------------------- the lookahead table
def lookahead_counts(
    correct: Tensor, total: Tensor, delay: int, *, label_delay: bool = False
) -> tuple[Tensor, Tensor]:
    r"""``(correct, total)`` per training position ``k`` (``[T]`` each, int64): what the score at
    ``delay`` attributes to the model `f_{<k}`.

    Near-future (``label_delay=False``): column ``delay`` of the lookahead table (see the module
    docstring). Label delay (``label_delay=True``): the same, and row 0 also holds the first
    ``delay`` batches `B_0 .. B_{d-1}`, scored by the untrained model (cells ``(0, m)``,
    ``m < d``). ``delay = 0`` gives the prequential counts either way.

    >>> correct = torch.tensor([[1, 2, 0], [3, 1, 0], [2, 0, 0]])
    >>> total = torch.tensor([[4, 4, 4], [4, 4, 0], [4, 0, 0]])
    >>> lookahead_counts(correct, total, 1)
    (tensor([2, 1, 0]), tensor([4, 4, 0]))
    >>> lookahead_counts(correct, total, 2, label_delay=True)
    (tensor([3, 0, 0]), tensor([12,  0,  0]))
    """
    _check_delay(delay)
    _check_table(correct, total, delay + 1)
    c = correct[:, delay].to(torch.int64).clone()
    n = total[:, delay].to(torch.int64).clone()
    if label_delay and delay > 0 and c.numel():
        c[0] += correct[0, :delay].to(torch.int64).sum()
        n[0] += total[0, :delay].to(torch.int64).sum()
    return c, n


def prequential_accuracy(correct: Tensor, total: Tensor) -> Tensor:
    r"""Prequential (test-then-train) online accuracy `\sum_k c_{k,0} / \sum_k n_{k,0}`,
    0-dim float64 (NaN when nothing was scored): each batch scored by the model before its
    optimizer step on it (Cai et al., ICCV 2021). ``correct``/``total``: the lookahead table
    (module docstring), ``[T, M]`` with ``M >= 1``.

    >>> prequential_accuracy(torch.tensor([[3], [4]]), torch.tensor([[4], [4]]))
    tensor(0.8750, dtype=torch.float64)
    """
    c, n = lookahead_counts(correct, total, 0)
    return _ratio(c.sum(), n.sum())


def near_future_accuracy(correct: Tensor, total: Tensor, delay: int) -> Tensor:
    r"""Near-future accuracy `\sum_k c_{k,\delta} / \sum_k n_{k,\delta}`, 0-dim float64:
    the model `f_{<k}` scored on batch `B_{k+\delta}`, ``delay`` batches ahead of its
    training position (Hammoud et al., ICCV 2023). NaN when no cell of column ``delay`` was scored
    (a stream of at most ``delay`` batches).

    >>> c = torch.tensor([[4, 1], [4, 0], [4, 0]])
    >>> n = torch.tensor([[4, 4], [4, 4], [4, 0]])
    >>> near_future_accuracy(c, n, 1)
    tensor(0.1250, dtype=torch.float64)
    """
    c, n = lookahead_counts(correct, total, delay)
    return _ratio(c.sum(), n.sum())


def label_delay_accuracy(correct: Tensor, total: Tensor, delay: int) -> Tensor:
    r"""Online accuracy under a label delay of ``delay`` steps, 0-dim float64: at step `t`
    the batch `x_t` is predicted by the model trained on the labels of steps before
    `t - d` (Csaba et al., NeurIPS 2024), i.e. cells `(t-d, d)` of the lookahead table
    and, for `t < d`, the untrained model's cells `(0, t)`.

    >>> c = torch.tensor([[1, 2], [3, 0]])
    >>> n = torch.tensor([[4, 4], [4, 0]])
    >>> label_delay_accuracy(c, n, 1)  # (1 + 2) / (4 + 4): B_0 and B_1 by the untrained model
    tensor(0.3750, dtype=torch.float64)
    """
    c, n = lookahead_counts(correct, total, delay, label_delay=True)
    return _ratio(c.sum(), n.sum())


# --------------------------------------------------------------------------- blind baselines
def _check_queries(labels: Tensor, ends: Tensor) -> None:
    _integer_tensor("labels", labels, 1)
    _integer_tensor("ends", ends, 1)
    if labels.numel() and int(labels.min()) < 0:
        raise ValueError(f"labels must be class indices >= 0, got {int(labels.min())}")
    if ends.numel() and (int(ends.min()) < 0 or int(ends.max()) > labels.numel()):
        raise ValueError(
            f"ends must lie in [0, {labels.numel()}] (how many of the labels each query may "
            f"read), got values in [{int(ends.min())}, {int(ends.max())}]"
        )


def recent_mode(
    labels: Tensor,
    ends: Tensor,
    window: int | None,
    *,
    num_classes: int,
    counts_before: Tensor | None = None,
    last_seen_before: Tensor | None = None,
) -> Tensor:
    r"""The blind "most frequent recent label" predictor: for each query ``q``, the most frequent
    label among ``labels[max(0, ends[q] - window) : ends[q]]`` (``window=None``: among
    ``labels[:ends[q]]`` and the labels before them that ``counts_before`` counts), ``[Q]`` int64.

    Hammoud et al. (ICCV 2023) show that this classifier, which never sees the input, reaches a
    high online accuracy on streams whose labels come in runs. Ties: the tied label seen most
    recently. No label in the window: ``-1``.

    Args:
        labels: the revealed labels in stream order, ``[L]`` integers ``>= 0``.
        ends: per query, how many of ``labels`` are revealed (``0..L``), ``[Q]``.
        window: how many of the most recent labels to count (``>= 1``), or ``None`` for all.
        num_classes: ``C``; every label must be below it.
        counts_before: ``[C]`` label counts before ``labels[0]`` (``window=None`` only).
        last_seen_before: ``[C]`` the position of each class's last occurrence before
            ``labels[0]``, counted from ``labels[0]`` (negative; any negative value when unknown,
            ``-(2**62)`` when never seen), used to break ties (``window=None`` only).

    Cost: ``O(L + Q + P C)`` time and ``O(P C)`` memory for the ``P <= 2Q`` distinct window
    ends (a batch's samples share one).

    >>> labels = torch.tensor([0, 0, 1, 1, 1, 2])
    >>> recent_mode(labels, torch.tensor([0, 2, 4, 6]), 3, num_classes=3)
    tensor([-1,  0,  1,  1])
    >>> recent_mode(labels, torch.tensor([3]), 2, num_classes=3)  # tie 0-1: 1 is more recent
    tensor([1])
    """
    _check_queries(labels, ends)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
    if labels.numel() and int(labels.max()) >= num_classes:
        raise ValueError(f"label {int(labels.max())} is not below num_classes = {num_classes}")
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int) or window < 1
    ):
        raise ValueError(f"window must be an integer >= 1 or None, got {window!r}")
    if window is not None and (counts_before is not None or last_seen_before is not None):
        raise ValueError("counts_before / last_seen_before only go with window=None")
    device = labels.device
    labels = labels.to(torch.int64)
    ends = ends.to(device=device, dtype=torch.int64)
    starts = (ends - window).clamp(min=0) if window is not None else None
    points = torch.unique(ends if starts is None else torch.cat([ends, starts]))  # sorted
    positions = torch.arange(labels.numel(), device=device)
    # element i is before point P[m] iff (number of points <= i) <= m
    bucket = torch.searchsorted(points, positions, right=True)
    rows = points.numel() + 1
    counts = torch.zeros(rows, num_classes, dtype=torch.int64, device=device)
    counts.index_put_((bucket, labels), torch.ones_like(labels), accumulate=True)
    counts = counts.cumsum(0)[:-1]  # counts[m, c]: label c among labels[:P[m]]
    never = -(2**62)
    last = torch.full((rows * num_classes,), never, dtype=torch.int64, device=device)
    last.scatter_reduce_(0, bucket * num_classes + labels, positions, reduce="amax")
    # last[m, c]: the last position < P[m] holding label c
    last = last.view(rows, num_classes).cummax(0).values[:-1]
    # one prediction per distinct window (queries share them: a batch's samples share a cutoff)
    distinct, inverse = torch.unique(ends, return_inverse=True)
    at_end = torch.searchsorted(points, distinct)
    window_counts = counts[at_end]
    if window is not None:
        start_of = torch.searchsorted(points, (distinct - window).clamp(min=0))
        window_counts = window_counts - counts[start_of]
    elif counts_before is not None:
        window_counts = window_counts + counts_before.to(device, torch.int64).unsqueeze(0)
    recency = last[at_end]
    if last_seen_before is not None:
        before = last_seen_before.to(device, torch.int64).unsqueeze(0)
        recency = torch.where(recency == never, before, recency)
    best = window_counts.max(dim=1, keepdim=True).values
    tied = (window_counts == best) & (best > 0)
    choice = torch.where(tied, recency, torch.full_like(recency, never - 1)).argmax(dim=1)
    prediction = torch.where(best.squeeze(1) > 0, choice, torch.full_like(choice, -1))
    return prediction[inverse]


def last_label(labels: Tensor, ends: Tensor, *, before: int = -1) -> Tensor:
    """The blind "last label" predictor: ``labels[ends[q] - 1]`` for each query, ``before`` (the
    label revealed before ``labels[0]``; ``-1``: none) where ``ends[q] == 0``, ``[Q]`` int64.

    >>> last_label(torch.tensor([3, 3, 5]), torch.tensor([0, 1, 3]))
    tensor([-1,  3,  5])
    """
    _check_queries(labels, ends)
    ends = ends.to(device=labels.device, dtype=torch.int64)
    if not labels.numel():
        return torch.full_like(ends, int(before))
    picked = labels.to(torch.int64)[(ends - 1).clamp(min=0)]
    return torch.where(ends > 0, picked, torch.full_like(ends, int(before)))


# --------------------------------------------------------------------------- aggregation
def _check_counts(correct: Tensor, total: Tensor) -> None:
    _integer_tensor("correct", correct, 1)
    _integer_tensor("total", total, 1)
    if correct.shape != total.shape:
        raise ValueError(
            f"correct and total differ in shape: {tuple(correct.shape)} vs {tuple(total.shape)}"
        )


def cumulative_accuracy(correct: Tensor, total: Tensor) -> Tensor:
    r"""The running average accuracy `a_t = \sum_{s \le t} c_s / \sum_{s \le t} n_s` over
    consecutive bins (windows) of the stream, ``[n]`` float64 (NaN before the first scored
    sample): the average online accuracy "up to time t" of Cai et al. (ICCV 2021).

    >>> cumulative_accuracy(torch.tensor([1, 3, 0]), torch.tensor([2, 4, 0]))
    tensor([0.5000, 0.6667, 0.6667], dtype=torch.float64)
    """
    _check_counts(correct, total)
    return _ratio(correct.to(torch.int64).cumsum(0), total.to(torch.int64).cumsum(0))


def windowed_accuracy(correct: Tensor, total: Tensor, window: int) -> Tensor:
    r"""Accuracy over the last ``window`` bins, `\sum_{s=t-w+1}^{t} c_s /
    \sum_{s=t-w+1}^{t} n_s`, ``[n]`` float64 (fewer bins at the start; NaN where they hold no
    sample): a moving average weighted by sample counts.

    >>> windowed_accuracy(torch.tensor([1, 3, 0, 4]), torch.tensor([2, 4, 4, 4]), 2)
    tensor([0.5000, 0.6667, 0.3750, 0.5000], dtype=torch.float64)
    """
    _check_counts(correct, total)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    zero = correct.new_zeros(1, dtype=torch.int64)
    c = torch.cat([zero, correct.to(torch.int64).cumsum(0)])
    n = torch.cat([zero, total.to(torch.int64).cumsum(0)])
    end = torch.arange(1, correct.numel() + 1, device=correct.device)
    start = (end - window).clamp(min=0)
    return _ratio(c[end] - c[start], n[end] - n[start])


def binned_counts(
    positions: Tensor, correct: Tensor, total: Tensor, edges: Tensor
) -> tuple[Tensor, Tensor]:
    """``(correct, total)`` summed into the bins ``[edges[b], edges[b+1])`` of stream position,
    ``[B]`` int64 each; entries outside ``[edges[0], edges[-1])`` are left out. Works for
    per-sample records (``total`` all 1) and for per-window counts (``positions`` a window's
    position, e.g. its end).

    >>> binned_counts(torch.tensor([0, 5, 10, 15]), torch.tensor([1, 1, 0, 1]),
    ...               torch.tensor([1, 1, 1, 1]), torch.tensor([0, 10, 20]))
    (tensor([2, 1]), tensor([2, 2]))
    """
    _integer_tensor("positions", positions, 1)
    _check_counts(correct, total)
    _integer_tensor("edges", edges, 1)
    if positions.shape != correct.shape:
        raise ValueError(
            f"positions and correct differ in shape: {tuple(positions.shape)} vs "
            f"{tuple(correct.shape)}"
        )
    if edges.numel() < 2 or bool((edges[1:] <= edges[:-1]).any()):
        raise ValueError("edges must be strictly increasing, at least two of them")
    bins = edges.numel() - 1
    index = torch.bucketize(positions, edges, right=True) - 1
    inside = (index >= 0) & (index < bins)
    out_c = torch.zeros(bins, dtype=torch.int64, device=positions.device)
    out_n = torch.zeros(bins, dtype=torch.int64, device=positions.device)
    out_c.index_add_(0, index[inside], correct.to(torch.int64)[inside])
    out_n.index_add_(0, index[inside], total.to(torch.int64)[inside])
    return out_c, out_n


# --------------------------------------------------------------------------- held-out sets
def segment_index(positions: Tensor, starts: Tensor) -> Tensor:
    """Per evaluation, the last stream segment the stream has entered: the number of segment
    ``starts`` strictly below ``positions[e]`` minus one (``-1``: no sample trained yet), ``[E]``
    int64. Segment ``j`` covers positions ``[starts[j], starts[j+1])``.

    >>> segment_index(torch.tensor([0, 1, 100, 101]), torch.tensor([0, 100]))
    tensor([-1,  0,  0,  1])
    """
    _integer_tensor("positions", positions, 1)
    _integer_tensor("starts", starts, 1)
    if starts.numel() == 0 or bool((starts[1:] <= starts[:-1]).any()) or int(starts[0]) != 0:
        raise ValueError(
            f"starts must be strictly increasing stream positions beginning at 0, got "
            f"{starts.tolist()}"
        )
    return torch.searchsorted(starts.to(positions.device), positions, right=False) - 1


def held_out_curves(accuracy: Tensor, segment: Tensor) -> dict[str, Tensor]:
    r"""Held-out scores over the stream, one value per evaluation (``[E]`` float64, NaN where the
    mean is over no set, or over a set not evaluated).

    ``accuracy[e, j]``: the score on held-out set ``j`` at evaluation ``e``; ``segment[e]``: the
    stream segment the stream is in at evaluation ``e`` (`segment_index`; ``-1`` before
    training, ``J`` or more for "every set is in the past", e.g. held-out sets not tied to stream
    positions). With `s = ` ``segment[e]``:

    * ``seen``: `\frac{1}{|S|}\sum_{j \in S} A_{e,j}`, `S = \{j \le s\}`: the
      anytime accuracy on what the stream has shown so far (Koh et al., "Online Continual
      Learning on Class Incremental Blurry Task Configuration with Anytime Inference", ICLR 2022,
      evaluate on the seen classes at any time);
    * ``past``: `j < s`, the segments the stream has left (information retention, Cai et
      al., ICCV 2021, who evaluate the model on data of past time steps: their backward transfer);
    * ``current``: `j = s`;
    * ``future``: `j > s` (Cai et al.'s forward transfer: data of future time steps);
    * ``forgetting``: `\frac{1}{|P|}\sum_{j \in P} \left(\max_{e' \le e,\ s_{e'} \ge j}
      A_{e',j} - A_{e,j}\right)`, `P = \{j < s\}`: how far each left segment's score has
      fallen from its best since the stream entered it (peak forgetting over time; never
      negative).

    >>> A = torch.tensor([[0.1, 0.1], [0.8, 0.2], [0.6, 0.9]], dtype=torch.float64)
    >>> curves = held_out_curves(A, torch.tensor([-1, 0, 1]))
    >>> curves["seen"], curves["forgetting"]
    (tensor([   nan, 0.8000, 0.7500], dtype=torch.float64), tensor([   nan,    nan, 0.2000], dtype=torch.float64))
    """  # noqa: E501
    if not isinstance(accuracy, Tensor) or not accuracy.is_floating_point() or accuracy.ndim != 2:
        raise ValueError(
            "accuracy must be a floating [E, J] tensor, got "
            f"{getattr(accuracy, 'dtype', type(accuracy).__name__)} "
            f"{tuple(getattr(accuracy, 'shape', ()))}"
        )
    _integer_tensor("segment", segment, 1)
    if segment.shape[0] != accuracy.shape[0]:
        raise ValueError(
            f"segment has {segment.shape[0]} entries for {accuracy.shape[0]} evaluations"
        )
    if segment.numel() and bool((segment[1:] < segment[:-1]).any()):
        raise ValueError("segment must be non-decreasing (evaluations in stream order)")
    A = accuracy.to(torch.float64)
    s = segment.to(A.device, torch.int64).unsqueeze(1)
    j = torch.arange(A.shape[1], device=A.device).unsqueeze(0)

    def mean(mask: Tensor, values: Tensor) -> Tensor:
        total = torch.where(mask, values, torch.zeros_like(values)).sum(dim=1)
        return _ratio_float(total, mask.sum(dim=1))

    entered = j <= s  # [E, J]: the stream has entered segment j by evaluation e
    peak = torch.where(entered, A, torch.full_like(A, -torch.inf)).cummax(dim=0).values
    return {
        "seen": mean(entered, A),
        "past": mean(j < s, A),
        "current": mean(j == s, A),
        "future": mean(j > s, A),
        "forgetting": mean(j < s, peak - A),
    }


def _ratio_float(total: Tensor, count: Tensor) -> Tensor:
    n = count.to(torch.float64)
    return torch.where(n > 0, total / n.clamp(min=1), torch.full_like(n, float("nan")))


def area_under_curve(values: Tensor, positions: Tensor) -> Tensor:
    r"""The mean of a curve over the stream by the trapezoid rule, 0-dim float64:
    `\frac{1}{x_{N-1} - x_0} \sum_{n=1}^{N-1} (x_n - x_{n-1}) \frac{v_n + v_{n-1}}{2}` over
    the points with a finite value. Applied to ``held_out_curves(...)["seen"]`` over stream
    positions this is Koh et al.'s anytime accuracy `A_{AUC}` (ICLR 2022; see
    [`continual_eval.functional.anytime_accuracy`][continual_eval.functional.anytime_accuracy] for
    the task-indexed version). NaN with fewer than two finite points or a zero span.

    >>> area_under_curve(torch.tensor([0.5, 0.7, 0.4]), torch.tensor([10, 20, 30]))
    tensor(0.5750, dtype=torch.float64)
    """
    if not isinstance(values, Tensor) or values.ndim != 1:
        raise ValueError("values must be a 1-D tensor")
    _integer_tensor("positions", positions, 1)
    if positions.shape != values.shape:
        raise ValueError(
            f"positions and values differ in shape: {tuple(positions.shape)} vs "
            f"{tuple(values.shape)}"
        )
    v = values.to(torch.float64)
    keep = torch.isfinite(v)
    v, x = v[keep], positions.to(v.device, torch.float64)[keep]
    if v.numel() < 2 or bool((x[1:] < x[:-1]).any()):
        if v.numel() >= 2:
            raise ValueError("positions must be non-decreasing")
        return torch.tensor(float("nan"), dtype=torch.float64)
    span = x[-1] - x[0]
    area = ((x[1:] - x[:-1]) * (v[1:] + v[:-1]) / 2).sum()
    return torch.where(span > 0, area / span.clamp(min=1e-300), torch.tensor(float("nan")))

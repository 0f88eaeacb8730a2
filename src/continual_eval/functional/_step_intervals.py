r"""Paired bootstrap intervals of the metrics of the per-step (in-stage) evaluation curves:
min-ACC, WC-ACC and the stability gap (De Lange, van de Ven & Tuytelaars, ICLR 2023), the stage
areas ``AUC_k``, anytime accuracy, ``LCA_beta`` (Chaudhry et al., ICLR 2019) and the normalised
AUC forward transfer (Wolczyk et al., NeurIPS 2021), from the per-item values of every
evaluation of one run.

Inputs: per task ``j`` its items at every evaluation, ``values[j]`` ``[E, n_j]`` with the rows
``0`` the baseline ``b``, ``1..s`` the stage ends (``R[i, j]``), ``s + 1 ..`` the ``N``
evaluations of the step curves in order (those at a stage end included); ``evaluated`` ``[E,
T]`` says which (evaluation, task) cells were scored (other rows are never read). The pairing:
each resample draws one double-or-nothing weight per item of each task (Owen & Eckles 2012, as
[`paired_bootstrap`][continual_eval.functional.paired_bootstrap], from the same
``SeedSequence(seed)`` stream: for the same test-set sizes and seed the resample ``r`` of task
``j`` is the very one the matrix metrics use) and uses it in every row of that task, so a
curve's minimum, its stage-end value and ``R[k-1, k]`` keep their pairing. Every metric is then
computed on each resample's curves by batched forms of `continual_eval.functional.stability` and
`continual_eval.functional.plasticity` (tested equal to them, resample by resample); the
interval is the percentile interval (``numpy.quantile``, linear), except for the metrics that
take a minimum over evaluations (`WORST_KEYS`: min-ACC, WC-ACC, the gap's ``minimum`` and
``depth``), which get the hull of the percentile interval and the basic bootstrap interval
``[2 est - q_hi, 2 est - q_lo]`` (Davison & Hinkley 1997, sec. 5.2; clipped to the scores'
bounds when given), and for the gap's recovery steps (below).

Why the hull there: the minimum is a non-smooth statistic; where several evaluations come close
to the minimum the plug-in minimum is biased downward (the minimum of noisy curves lies below
the curves' truth), the resampled minima lie lower still, and the percentile interval, which
follows them, lies too low (the bootstrap of a minimum is inconsistent at ties; Andrews,
Econometrica 2000). The basic interval reflects the resamples about the estimate and so moves
up by about the bias the resamples show, but is then short too; their hull keeps the upper end
of the one and the lower end of the other. With one clear minimum the two nearly coincide (the
resampled minima are symmetric about the estimate) and the hull is barely wider. Measured
(``tests/test_step_intervals.py``, nominal 95 %, 1000-2000 runs of 256 items): one clear
minimum, percentile 94-95 %, basic 94-95 %, hull 95-96 % (the gap's depth 96.6 %); four to eight
evaluations within 0.02 of the minimum, percentile 82-85 %, basic 93 %, hull 94-96 %; eight
evaluations exactly tied, basic 91-92 %, hull 92 % (stated in the ``intervals`` section's
``unavailable``). The reference areas of the AUC forward transfer are
held fixed: the interval states the run's test-set error, not the reference run's.

The gap's ``recovery_steps`` (steps from task ``j``'s boundary to the first evaluation of stage
``j + 1``, at or after its minimum, with a score ``>= boundary - tolerance``; 0 without a gap;
NaN: not recovered within the stage) is a first-passage time on the evaluation grid: it jumps
where one evaluation's margin ``d_n = a_n - (a_b - tolerance)`` changes sign, and the
resampled recovery steps follow the run's own crossing, so their percentile interval
undercovers where the margins sit within the noise (measured: 80% for a curve levelling off
0.01 below the boundary, 39-45% for 30 evaluations of such a plateau). Its interval is the hull
of (i) the recovery steps of the two edges ``d_n -+ c se_n`` of a studentised max-t bootstrap
band of the margins: ``se_n`` their standard error from the items' differences, ``c`` the
``1 - alpha/2`` quantile of the resampled ``max z_n`` (lower edge, which recovers last: the
``high`` end) or ``max -z_n`` (upper edge, first: ``low``), ``z_n = (d*_n - d_n) / se_n``,
over the evaluations whose sign is in doubt (within ``sqrt(ln n_j) se_n`` of 0, up to the
first one above that after the minimum: Andrews & Soares 2010's moment selection); (ii) the
``alpha/2`` and ``1 - alpha/2`` order statistics of the resampled recovery steps (which of two
near-equal dips is the deepest, which the edges do not see: they alone covered 67-77% there);
(iii) the estimate. A NaN end, where the depth is defined, is "not recovered within the
stage": ``high`` NaN says recovery within the stage is not established, ``low`` NaN too that
it is excluded. Measured (``tests/test_step_intervals.py``, 1000 runs of 256 items, nominal
95%): 97-100% on a clear, a slow, a flat and a double-dip recovery, no gap and plateaus that
never come back: conservative (a simultaneous band, each edge at ``1 - alpha/2``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from continual_eval.functional.intervals import (
    _BLOCK_CELLS,
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    IntervalTensors,
    _check_bootstrap_options,
    _Draws,
    _Layout,
    _Samples,
)

__all__ = ["STEP_KEYS", "WORST_KEYS", "step_bootstrap", "step_family"]

#: the per-stage keys (``[S]``; the gap's ``[S - 1]``) and the scalar ones
STEP_KEYS = (
    "min_acc",
    "wc_acc",
    "gap_boundary",
    "gap_minimum",
    "gap_depth",
    "gap_recovery_steps",
    "stage_auc",
    "auc_forward_transfer_per_task",
    "anytime_accuracy",
    "lca",
    "auc_forward_transfer",
)

#: the keys that take a minimum (the worst score) over evaluations: the hull of the percentile
#: and the basic bootstrap intervals
WORST_KEYS = ("min_acc", "wc_acc", "gap_minimum", "gap_depth")
#: the stability gap's keys (``[S - 1]``)
_GAP_KEYS = ("gap_boundary", "gap_minimum", "gap_depth", "gap_recovery_steps")


class _Structure:
    """What the stage and step sequences fix for every resample: each stage's first and last
    evaluation, the stage starts, the learning-curve cells."""

    def __init__(self, stage: Tensor, steps: Tensor, S: int, lca_beta: int | None) -> None:
        N = int(stage.shape[0])
        self.S, self.N = S, N
        self.stage = stage.to(torch.long)
        index = torch.arange(N)
        last = torch.full((S,), -1, dtype=torch.long).scatter_reduce_(
            0, self.stage, index, reduce="amax"
        )
        first = torch.full((S,), N, dtype=torch.long).scatter_reduce_(
            0, self.stage, index, reduce="amin"
        )
        self.present = last >= 0
        self.last = last.clamp(min=0)
        self.first = first.clamp(max=max(N - 1, 0))
        self.x = steps.to(torch.float64)
        self.start = torch.cat([self.x.new_zeros(1), self.x[self.last[:-1]]])
        self.known = torch.cat([self.present.new_ones(1), self.present[:-1]])
        self.lca_cells: Tensor | None = None
        if lca_beta is not None:
            width = int(lca_beta) + 1
            rel = steps - torch.cat([steps.new_zeros(1), steps[self.last[:-1]]])[self.stage]
            use = self.known[self.stage] & (rel >= 0) & (rel <= lca_beta)
            if steps.is_floating_point():
                use &= rel == rel.floor()
            cell = self.stage * width + rel.clamp(0, lca_beta).to(torch.long)
            cells = torch.full((S * width,), -1, dtype=torch.long)
            cells.scatter_reduce_(0, cell[use], index[use], reduce="amax")
            self.lca_cells = cells.view(S, width)


def _minimum_family(A: Tensor, st: _Structure, tolerance: float = 0.0) -> dict[str, Tensor]:
    """min-ACC, WC-ACC and the gap's boundary/minimum/depth/recovery steps of ``A`` ``[B, N,
    T]`` (higher is better), as `min_accuracy`, `worst_case_accuracy` and `stability_gap`
    compute them (``tolerance``: the recovery's)."""
    B, N, T = A.shape
    S, nan = st.S, math.nan
    inf = torch.full((), math.inf, dtype=A.dtype)
    values = torch.where(torch.isnan(A), inf, A)
    minima = torch.full((B, S, T), math.inf, dtype=A.dtype)
    minima.scatter_reduce_(1, st.stage.view(1, N, 1).expand(B, N, T), values, reduce="amin")
    minima = minima.masked_fill(torch.isinf(minima), nan)
    s = torch.arange(S).unsqueeze(1)
    i = torch.arange(T).unsqueeze(0)
    after = torch.where((s > i) & ~torch.isnan(minima), minima, inf)
    worst = after.cummin(dim=1).values
    worst = worst.masked_fill(torch.isinf(worst), nan)
    k = torch.arange(S)
    total = torch.where(i < s, worst, torch.zeros_like(worst)).sum(dim=2)
    min_acc = (total / k.clamp(min=1).to(A.dtype)).masked_fill((k == 0) | ~st.present, nan)
    current = A[:, st.last, k].masked_fill(~st.present, nan)  # [B, S]
    seen = (k + 1).to(A.dtype)
    wc_acc = torch.where(k == 0, current, current / seen + (1 - 1 / seen) * min_acc)
    out = {"min_acc": min_acc, "wc_acc": wc_acc}
    if S < 2:
        empty = A.new_empty(B, 0)
        return out | {key: empty.clone() for key in _GAP_KEYS}
    tasks = torch.arange(S - 1)
    boundary = A[:, st.last[:-1], tasks].masked_fill(~st.present[:-1], nan)
    history = A[:, :, : S - 1]
    in_next = st.stage.unsqueeze(1) == (tasks + 1).unsqueeze(0)  # [N, S - 1]
    during = torch.where(in_next & ~torch.isnan(history), history, inf)
    minimum, argmin = during.min(dim=1)  # the first minimum, as `stability_gap`'s
    minimum = minimum.masked_fill(torch.isinf(minimum), nan)
    depth = boundary - minimum
    # recovery: the first evaluation n >= argmin of stage j + 1 with A >= boundary - tolerance
    after = torch.arange(N).view(1, N, 1) >= argmin.unsqueeze(1)
    back = in_next & after & (history >= (boundary - tolerance).unsqueeze(1))  # [B, N, S - 1]
    first = back.to(torch.uint8).argmax(dim=1)  # the first True (0 where none: masked below)
    elapsed = (st.x[first] - st.x[st.last[:-1]]).to(A.dtype)
    recovery = torch.where(back.any(dim=1), elapsed, torch.full_like(elapsed, nan))
    recovery = torch.where(depth <= tolerance, torch.zeros_like(recovery), recovery)
    recovery = recovery.masked_fill(torch.isnan(depth), nan)
    return out | {
        "gap_boundary": boundary,
        "gap_minimum": minimum,
        "gap_depth": depth,
        "gap_recovery_steps": recovery,
    }


def step_family(
    A: Tensor,
    R: Tensor,
    b: Tensor,
    stage: Tensor,
    steps: Tensor,
    *,
    higher_is_better: bool = True,
    lca_beta: int | None = None,
    reference_auc: Tensor | None = None,
    best: float | None = None,
    tolerance: float = 0.0,
    structure: _Structure | None = None,
) -> dict[str, Tensor]:
    """The curve metrics of ``B`` runs at once: curves ``A`` ``[B, N, T]`` of the evaluations of
    the ``S = R.shape[1]`` completed stages (``stage``, ``steps`` ``[N]``), ``R`` ``[B, S, T]``,
    ``b`` ``[B, T]``; the keys of `STEP_KEYS` (``[B, S]``, ``[B, S - 1]`` or ``[B]``) as
    `continual_eval.results.Stability` and `continual_eval.results.Plasticity` compute them
    (``initial`` = `stage_start_accuracy`; the trapezoid anytime rule; ``lca`` with
    ``lca_beta``, the forward transfer with ``reference_auc`` ``[T]`` and ``best``; the gap's
    ``recovery_steps`` with ``tolerance``, NaN where not recovered within stage ``j + 1``)."""
    B, N, T = A.shape
    S = int(R.shape[1])
    st = structure or _Structure(stage, steps, S, lca_beta)
    nan = math.nan
    if higher_is_better:
        out = _minimum_family(A, st, tolerance)
    else:
        flipped = _minimum_family(torch.neg(A), st, tolerance)
        out = {key: torch.neg(v) for key, v in flipped.items()}
        for key in ("gap_depth", "gap_recovery_steps"):  # a depth and a step count: not negated
            out[key] = flipped[key]
    initial = torch.full((B, T), nan, dtype=A.dtype)
    initial[:, 0] = b[:, 0]
    rows = min(S, T - 1)
    index = torch.arange(rows)
    initial[:, 1 : rows + 1] = R[:, index, index + 1]
    own = A[:, torch.arange(N), st.stage]  # [B, N]
    x = st.x
    same = st.stage[1:] == st.stage[:-1]
    segment = (x[1:] - x[:-1]) * (own[:, 1:] + own[:, :-1]) / 2
    area = torch.zeros(B, S, dtype=A.dtype)
    area.index_add_(1, st.stage[1:], torch.where(same, segment, torch.zeros_like(segment)))
    begin = x[st.first]
    area = area + (begin - st.start) * (initial[:, :S] + own[:, st.first]) / 2
    span = x[st.last] - st.start.masked_fill(~st.known, nan)
    ok = st.present & (span > 0)
    auc = torch.where(ok, area / span.masked_fill(~ok, 1), torch.full_like(area, nan))
    out["stage_auc"] = auc
    seen = torch.arange(T).unsqueeze(0) <= st.stage.unsqueeze(1)  # [N, T]
    f = torch.where(seen, A, torch.zeros_like(A)).sum(dim=2) / (st.stage + 1).to(A.dtype)
    f = torch.cat([initial[:, :1], f], dim=1)
    xs = torch.cat([x.new_zeros(1), x])
    whole = xs[-1] - xs[0]
    anytime = ((xs[1:] - xs[:-1]) * (f[:, 1:] + f[:, :-1]) / 2).sum(dim=1)
    out["anytime_accuracy"] = anytime / whole if whole > 0 else torch.full((B,), nan)
    if st.lca_cells is not None:
        cells = st.lca_cells
        table = torch.where(cells >= 0, own[:, cells.clamp(min=0)], torch.full((), nan))
        table[:, :, 0] = initial[:, :S]
        out["lca"] = table.mean(dim=(1, 2)) if table.numel() else torch.full((B,), nan)
    if reference_auc is not None and best is not None:
        reference = torch.full((T,), nan, dtype=A.dtype)
        given = reference_auc.to(A.dtype).reshape(-1)[:T]
        reference[: len(given)] = given
        room = best - reference[:S]
        fine = room != 0
        ratio = (auc - reference[:S]) / room.masked_fill(~fine, 1)
        per_task = torch.where(fine, ratio, torch.full_like(ratio, nan))
        out["auc_forward_transfer_per_task"] = per_task
        out["auc_forward_transfer"] = per_task.mean(dim=1) if S else torch.full((B,), nan)
    return out


def step_bootstrap(
    values: Sequence[Tensor],
    evaluated: Tensor,
    stage: Tensor,
    steps: Tensor,
    num_stages: int,
    *,
    higher_is_better: bool = True,
    lca_beta: int | None = None,
    reference_auc: Tensor | None = None,
    best: float | None = None,
    bounds: tuple[float, float] | None = None,
    tolerance: float = 0.0,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, IntervalTensors]:
    """The curve metrics' paired bootstrap intervals (module notes: percentile; for
    `WORST_KEYS` its hull with the basic one; the recovery band for ``gap_recovery_steps``):
    ``values[j]`` ``[..., E, n_j]`` (bool or floating; ``E = 1 + num_stages + N``; leading
    dimensions: several runs, each resampled independently, as `paired_bootstrap`'s), ``evaluated``
    ``[E, T]``; the estimates from all items; ``bounds`` the scores' range (the basic intervals of
    min-ACC, WC-ACC and the gap's minimum are clipped to it, the depth's to ``+-(high - low)``);
    ``tolerance`` the recovery's (`stability_gap`'s). Keys as `step_family` returns them, each with
    the runs' leading dimensions.
    """
    _check_bootstrap_options(confidence, resamples, seed, "double_or_nothing")
    if (
        not isinstance(tolerance, numbers.Real)
        or isinstance(tolerance, bool)
        or not math.isfinite(tolerance)
    ):
        raise ValueError(f"step_bootstrap: tolerance must be a finite number, got {tolerance!r}")
    T, s = len(values), int(num_stages)
    E = int(evaluated.shape[0])
    if E - 1 - s != int(stage.shape[0]) or tuple(evaluated.shape) != (E, T):
        raise ValueError(
            f"step_bootstrap: evaluated must be [1 + num_stages + N, T] = [{1 + s + len(stage)}, "
            f"{T}], got {tuple(evaluated.shape)}"
        )
    batch = tuple(values[0].shape[:-2])
    runs = math.prod(batch)
    sizes = [int(v.shape[-1]) for v in values]
    n_max = max(sizes)
    table = torch.zeros(runs, T, n_max, E, dtype=torch.float64)  # stratum r * T + j
    for j, v in enumerate(values):  # one copy per task
        if tuple(v.shape) != (*batch, E, sizes[j]):
            raise ValueError(
                f"step_bootstrap: values[{j}] must be [..., {E}, n_j] with the leading "
                f"dimensions {batch} of values[0], got {tuple(v.shape)}"
            )
        by_item = v.reshape(runs, E, sizes[j]).double().transpose(1, 2)
        table[:, j, : sizes[j]] = torch.nan_to_num(by_item, nan=0.0, posinf=0.0, neginf=0.0)
    table = table.reshape(runs * T, n_max, E)
    binary = all(v.dtype == torch.bool for v in values)
    dtype = torch.float32 if binary and 2 * n_max < 2**24 else torch.float64
    table_d = table.to(dtype)
    unread = ~evaluated.T.unsqueeze(1).repeat(runs, 1, 1)  # [R * T, 1, E]
    options: dict[str, Any] = {"higher_is_better": higher_is_better, "lca_beta": lca_beta}
    options |= {"reference_auc": reference_auc, "best": best, "tolerance": float(tolerance)}
    structure = _Structure(stage, steps, s, lca_beta)
    sign = 1.0 if higher_is_better else -1.0

    def curves(means: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``[R * T, rows, E]`` -> ``b``, ``R``, ``A`` of the ``rows * R`` resampled runs."""
        rows = means.shape[1]
        means = means.masked_fill(unread, math.nan).reshape(runs, T, rows, E)
        means = means.permute(2, 0, 3, 1).reshape(rows * runs, E, T)
        return means[:, 0], means[:, 1 : 1 + s], means[:, 1 + s :]

    def family(b: Tensor, R: Tensor, A: Tensor, rows: int) -> dict[str, Tensor]:
        """The metrics ``[rows, R, ...]`` of ``rows * R`` runs' curves."""
        out = step_family(A, R, b, stage, steps, structure=structure, **options)
        return {key: v.reshape(rows, runs, *v.shape[1:]) for key, v in out.items()}

    n = torch.tensor(sizes * runs, dtype=torch.float64).view(runs * T, 1, 1)
    b0, R0, A0 = curves(table.sum(dim=1, keepdim=True) / n)
    estimate = family(b0, R0, A0, 1)
    band = _RecoveryBand(
        structure, sign * A0, table.view(runs, T, n_max, E), sizes, s, float(tolerance)
    )
    layout = _Layout(T, (runs,), tuple(sizes * runs), None, None, binary=False)
    draws = _Draws(layout, seed, "double_or_nothing")
    step = max(1, _BLOCK_CELLS // (runs * T * max(n_max, E)))
    samples = _Samples(int(resamples))
    recovery = np.empty((int(resamples), runs, max(s - 1, 0)))  # per resample (NaN: never)
    for begin in range(0, int(resamples), step):
        rows = min(step, int(resamples) - begin)
        w = draws.weights(rows, dtype)  # [R * T, rows, n_max]
        means = torch.bmm(w, table_d).double() / w.sum(dim=2, keepdim=True).double()
        b, R, A = curves(means)
        block = family(b, R, A, rows)
        recovery[begin : begin + rows] = block.pop("gap_recovery_steps").numpy()
        samples.write(begin, block | band.maxima(sign * A, rows))
    ends = samples.percentiles(float(confidence))
    for key in WORST_KEYS:  # the hull of the percentile and the basic [2 est - q_hi, 2 est - q_lo]
        if key in ends:
            (low, high), twice = ends[key], 2 * estimate[key][0]
            basic_low, basic_high = _clipped(key, twice - high, twice - low, bounds)
            ends[key] = (torch.minimum(low, basic_low), torch.maximum(high, basic_high))
    ends["gap_recovery_steps"] = band.interval(
        estimate["gap_recovery_steps"][0],
        estimate["gap_depth"][0],
        recovery,
        ends,
        float(confidence),
    )
    return {
        key: IntervalTensors(
            *(t.reshape((*batch, *t.shape[1:])) for t in (estimate[key][0], *ends[key]))
        )
        for key in estimate
    }


class _RecoveryBand:
    r"""The interval of ``gap_recovery_steps`` (module notes), for ``R`` runs of ``S`` stages.

    The margin of curve evaluation ``n`` in stage ``k >= 1`` is ``d_n = a_n - (a_b -
    tolerance)``, ``a`` task ``k - 1``'s score (higher is better: ``-score`` for a loss) and
    ``b`` its boundary evaluation; recovery is the first ``d_n >= 0`` at or after the minimum.
    ``se_n = sqrt(var_i(a_ni - a_bi) / n_j)`` (the population variance of the items'
    differences): the standard error of a mean under double-or-nothing weights. ``W``: the
    evaluations of
    the stage up to the first one with ``d_n > kappa se_n`` at or after the minimum (that one
    included) whose margin is within ``kappa se_n`` of 0, ``kappa = sqrt(ln n_j)`` (Andrews &
    Soares 2010): those whose sign is in doubt."""

    def __init__(
        self, st: _Structure, A: Tensor, table: Tensor, sizes: list[int], s: int, tolerance: float
    ) -> None:
        self.st, self.tolerance, self.gaps, self.curves = st, tolerance, s - 1, A
        runs, N = A.shape[0], st.N
        self.inner = st.stage >= 1  # [N]: in a stage with a task before it
        self.task = (st.stage - 1).clamp(min=0)  # its task j = k - 1
        self.at_boundary = st.last[self.task]  # the curve index of j's boundary evaluation
        if self.gaps < 1:
            return
        self.margin = self.margins(A)  # [R, N]
        # the items' differences d_ni, by sums over the table (padding items are 0 in both)
        n = torch.tensor(sizes, dtype=torch.float64)[self.task]  # [N]
        total = torch.zeros(runs, N, dtype=torch.float64)
        squares = torch.zeros(runs, N, dtype=torch.float64)
        for k in range(1, s):  # one slice per stage (its evaluations are contiguous)
            j, first, last = k - 1, int(st.first[k]), int(st.last[k])
            if not bool(st.present[k]) or not bool(st.present[j]):
                continue
            rows = table[:, j, :, 1 + s + first : 2 + s + last]  # [R, n_max, N_k]
            base = table[:, j, :, 1 + s + int(st.last[j])].unsqueeze(2)
            diff = rows - base
            total[:, first : last + 1] = diff.sum(dim=1)
            squares[:, first : last + 1] = diff.square().sum(dim=1)
        mean = total / n
        self.se = ((squares / n - mean.square()).clamp(min=0) / n).sqrt()
        self.se = self.se.masked_fill(torch.isnan(self.margin), math.nan)
        kappa = torch.tensor([math.sqrt(math.log(max(m, 1))) for m in sizes], dtype=torch.float64)
        spread = kappa[self.task] * self.se  # [R, N]
        index = torch.arange(N).expand(runs, N)
        deepest = self._first(self.margin == self._stage_min(self.margin), index)
        after = index >= deepest[:, self.task]
        cap = self._first(after & (self.margin > spread), index)[:, self.task]
        doubt = (self.margin.abs() <= spread) | (index == cap)
        self.window = self.inner & (index <= cap) & doubt  # [R, N]

    def margins(self, A: Tensor) -> Tensor:
        """``d_n`` of curves ``A`` ``[B, N, T]`` (higher is better), ``[B, N]``; NaN in stage 0."""
        n = torch.arange(self.st.N)
        d = A[:, n, self.task] - (A[:, self.at_boundary, self.task] - self.tolerance)
        return d.masked_fill(~self.inner, math.nan)

    def _stage_min(self, d: Tensor) -> Tensor:
        """Each evaluation's stage minimum of ``d`` ``[B, N]`` (NaN ignored)."""
        values = torch.where(torch.isnan(d) | ~self.inner, math.inf, d)
        low = torch.full((d.shape[0], max(self.gaps, 1)), math.inf, dtype=d.dtype)
        low.scatter_reduce_(1, self.task.expand_as(values), values, reduce="amin")
        return low[:, self.task]

    def _first(self, mask: Tensor, index: Tensor) -> Tensor:
        """Per gap ``j``, the first evaluation of stage ``j + 1`` where ``mask``, ``[B, S - 1]``
        (``N`` where none)."""
        where = torch.where(mask & self.inner, index, self.st.N)
        first = torch.full((mask.shape[0], self.gaps), self.st.N, dtype=torch.long)
        return first.scatter_reduce_(1, self.task.expand_as(where), where, reduce="amin")

    def maxima(self, A: Tensor, rows: int) -> dict[str, Tensor]:
        """Of resampled curves ``A`` ``[rows * R, N, T]`` (higher is better), the band's two
        statistics ``max(0, max_W z)`` and ``max(0, max_W -z)``, ``z_n = (d*_n - d_n) / se_n``
        (0 where ``se_n = 0``), ``[rows, R, S - 1]`` each."""
        if self.gaps < 1:
            return {}
        z = (self.margins(A).view(rows, *self.margin.shape) - self.margin) / self.se
        z = torch.where(self.window & (self.se > 0), z, torch.zeros_like(z)).flatten(0, 1)
        index = self.task.expand_as(z)
        out = {}
        for key, v in (("_recovery_low", z), ("_recovery_high", torch.neg(z))):
            top = torch.zeros(z.shape[0], self.gaps, dtype=z.dtype)
            out[key] = top.scatter_reduce_(1, index, v, reduce="amax").view(rows, -1, self.gaps)
        return out

    def interval(
        self,
        estimate: Tensor,
        depth: Tensor,
        recovery: np.ndarray,
        ends: dict[str, tuple[Tensor, Tensor]],
        confidence: float,
    ) -> tuple[Tensor, Tensor]:
        """``(low, high)`` ``[R, S - 1]``: the hull of the band edges' recovery steps, the
        resampled recovery steps' order statistics and ``estimate`` (NaN: not recovered within
        the stage, where the gap's ``depth`` is defined)."""
        if self.gaps < 1:
            return estimate.clone(), estimate.clone()
        c_low, c_high = ends.pop("_recovery_low")[1], ends.pop("_recovery_high")[1]
        scale = torch.where(self.inner, self.se, torch.zeros_like(self.se)).nan_to_num(0.0)
        curves = self.curves.unsqueeze(0).repeat(2, 1, 1, 1)  # [2, R, N, T]
        cells = (torch.arange(self.st.N), self.task)
        # the lower edge d - c_low se (its recovery: the latest), the upper d + c_high se
        curves[0][:, cells[0], cells[1]] -= c_low[:, self.task] * scale
        curves[1][:, cells[0], cells[1]] += c_high[:, self.task] * scale
        edges = _minimum_family(curves.flatten(0, 1), self.st, self.tolerance)
        latest, earliest = edges["gap_recovery_steps"].view(2, *estimate.shape)
        # order statistics floor((B - 1) alpha / 2) and ceil((B - 1) (1 - alpha / 2)), never last
        ordered = torch.from_numpy(recovery).nan_to_num(math.inf).sort(dim=0).values
        last, alpha = ordered.shape[0] - 1, 1 - confidence
        q_low = ordered[math.floor(last * alpha / 2)]
        q_high = ordered[math.ceil(last * (1 - alpha / 2))]
        point = estimate.nan_to_num(math.inf)
        low = torch.minimum(torch.minimum(earliest.nan_to_num(math.inf), q_low), point)
        high = torch.maximum(torch.maximum(latest.nan_to_num(math.inf), q_high), point)
        undefined = torch.isnan(depth)
        return tuple(  # type: ignore[return-value]
            t.masked_fill(torch.isinf(t) | undefined, math.nan).to(estimate.dtype)
            for t in (low, high)
        )


def _clipped(
    key: str, low: Tensor, high: Tensor, bounds: tuple[float, float] | None
) -> tuple[Tensor, Tensor]:
    """A basic interval kept within what ``key`` can be: the scores' bounds (the gap's depth, a
    difference of two scores: ``+-(high - low)``)."""
    if bounds is None:
        return low, high
    lo, hi = float(bounds[0]), float(bounds[1])
    if key == "gap_depth":
        lo, hi = -(hi - lo), hi - lo
    return low.clamp(lo, hi), high.clamp(lo, hi)

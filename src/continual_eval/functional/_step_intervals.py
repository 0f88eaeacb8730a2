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
``depth``), which get the basic bootstrap interval ``[2 est - q_hi, 2 est - q_lo]`` (Davison &
Hinkley 1997, sec. 5.2; clipped to the scores' bounds when given).

Why the basic interval there: the minimum is a non-smooth statistic; where several evaluations
come close to the minimum the plug-in minimum is biased downward (the minimum of noisy curves
lies below the curves' truth), the resampled minima lie lower still, and the percentile interval,
which follows them, undercovers (the bootstrap of a minimum is inconsistent at ties; Andrews,
Econometrica 2000). The basic interval reflects the resamples about the estimate and so moves
up by about the bias the resamples show. Measured (``tests/test_step_intervals.py``, nominal
95 %): with one clear minimum both cover 94-95 %; with four to eight evaluations within 0.02
of the minimum the percentile interval of min-ACC covers 82-85 % and the basic one 93 % (WC-ACC
87-90 % and 93-94 %, the gap's depth 89 % and 95 %), still below nominal (stated in the
``intervals`` section's ``unavailable``). The reference areas of the AUC forward transfer are
held fixed: the interval states the run's test-set error, not the reference run's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

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
    "stage_auc",
    "auc_forward_transfer_per_task",
    "anytime_accuracy",
    "lca",
    "auc_forward_transfer",
)

#: the keys that take a minimum (the worst score) over evaluations: basic bootstrap intervals
WORST_KEYS = ("min_acc", "wc_acc", "gap_minimum", "gap_depth")


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


def _minimum_family(A: Tensor, st: _Structure) -> dict[str, Tensor]:
    """min-ACC, WC-ACC and the gap's boundary/minimum/depth of ``A`` ``[B, N, T]`` (higher is
    better), as `min_accuracy`, `worst_case_accuracy` and `stability_gap` compute them."""
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
        return out | {"gap_boundary": empty, "gap_minimum": empty, "gap_depth": empty.clone()}
    tasks = torch.arange(S - 1)
    boundary = A[:, st.last[:-1], tasks].masked_fill(~st.present[:-1], nan)
    history = A[:, :, : S - 1]
    in_next = st.stage.unsqueeze(1) == (tasks + 1).unsqueeze(0)  # [N, S - 1]
    during = torch.where(in_next & ~torch.isnan(history), history, inf)
    minimum = during.amin(dim=1)
    minimum = minimum.masked_fill(torch.isinf(minimum), nan)
    return out | {"gap_boundary": boundary, "gap_minimum": minimum, "gap_depth": boundary - minimum}


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
    structure: _Structure | None = None,
) -> dict[str, Tensor]:
    """The curve metrics of ``B`` runs at once: curves ``A`` ``[B, N, T]`` of the evaluations of
    the ``S = R.shape[1]`` completed stages (``stage``, ``steps`` ``[N]``), ``R`` ``[B, S, T]``,
    ``b`` ``[B, T]``; the keys of `STEP_KEYS` (``[B, S]``, ``[B, S - 1]`` or ``[B]``) as
    `continual_eval.results.Stability` and `continual_eval.results.Plasticity` compute them
    (``initial`` = `stage_start_accuracy`; the trapezoid anytime rule; ``lca`` with
    ``lca_beta``, the forward transfer with ``reference_auc`` ``[T]`` and ``best``)."""
    B, N, T = A.shape
    S = int(R.shape[1])
    st = structure or _Structure(stage, steps, S, lca_beta)
    nan = math.nan
    if higher_is_better:
        out = _minimum_family(A, st)
    else:
        flipped = _minimum_family(torch.neg(A), st)
        out = {key: torch.neg(v) for key, v in flipped.items()}
        out["gap_depth"] = flipped["gap_depth"]
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
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, IntervalTensors]:
    """The curve metrics' paired bootstrap intervals (module notes: percentile, basic for
    `WORST_KEYS`): ``values[j]`` ``[..., E, n_j]`` (bool or floating; ``E = 1 + num_stages + N``;
    leading dimensions: several runs, each resampled independently, as `paired_bootstrap`'s),
    ``evaluated`` ``[E, T]``; the estimates from all items; ``bounds`` the scores' range (the
    basic intervals of min-ACC, WC-ACC and the gap's minimum are clipped to it, the depth's to
    ``+-(high - low)``). Keys as `step_family` returns them, each with the runs' leading
    dimensions."""
    _check_bootstrap_options(confidence, resamples, seed, "double_or_nothing")
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
    options |= {"reference_auc": reference_auc, "best": best}
    structure = _Structure(stage, steps, s, lca_beta)

    def family(means: Tensor) -> dict[str, Tensor]:
        """``[R * T, rows, E]`` -> the metrics ``[rows, R, ...]``."""
        rows = means.shape[1]
        means = means.masked_fill(unread, math.nan).reshape(runs, T, rows, E)
        means = means.permute(2, 0, 3, 1).reshape(rows * runs, E, T)
        b, R, A = means[:, 0], means[:, 1 : 1 + s], means[:, 1 + s :]
        out = step_family(A, R, b, stage, steps, structure=structure, **options)
        return {key: v.reshape(rows, runs, *v.shape[1:]) for key, v in out.items()}

    n = torch.tensor(sizes * runs, dtype=torch.float64).view(runs * T, 1, 1)
    estimate = family(table.sum(dim=1, keepdim=True) / n)
    layout = _Layout(T, (runs,), tuple(sizes * runs), None, None, binary=False)
    draws = _Draws(layout, seed, "double_or_nothing")
    step = max(1, _BLOCK_CELLS // (runs * T * max(n_max, E)))
    samples = _Samples(int(resamples))
    for begin in range(0, int(resamples), step):
        rows = min(step, int(resamples) - begin)
        w = draws.weights(rows, dtype)  # [R * T, rows, n_max]
        means = torch.bmm(w, table_d).double() / w.sum(dim=2, keepdim=True).double()
        samples.write(begin, family(means))
    ends = samples.percentiles(float(confidence))
    for key in WORST_KEYS:  # the basic interval, [2 est - q_hi, 2 est - q_lo]
        if key in ends:
            (low, high), twice = ends[key], 2 * estimate[key][0]
            ends[key] = _clipped(key, twice - high, twice - low, bounds)
    return {
        key: IntervalTensors(
            *(t.reshape((*batch, *t.shape[1:])) for t in (estimate[key][0], *ends[key]))
        )
        for key in estimate
    }


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

"""Reward-stream metrics: per-interval pure functions and
[`compute_all_metrics`][continual_eval.stream.compute_all_metrics].

Conventions (see docs/stream.md for the full definitions):

* Runs are segmented into configuration intervals by the regime label only
  (`configuration_intervals`).
* The absence rule: an unavailable metric is ``None`` in every returned dict, never ``0`` and
  never a sentinel. Inside this module, per-interval arrays use ``NaN`` for absence and are
  converted to ``None`` at the boundary (rewards themselves are validated finite).
* ``bar r_tau`` is the running mean over an interval's first ``tau`` steps; ``tau`` is 1-based.
* Only intervals that begin at a shift (every interval but the trace's first) have an adaptation
  speed, a recovery time and a zero-shot reward. A label with several such intervals reports the
  mean over those that have a value.
* ``tail(T) = the final ceil(tail_fraction * |T|) rewards of T`` (default fraction 0.2).
* The ceiling of the mean of ``L`` steps holding ``e`` episode ends is
  ``R_ub(L, e) = ((L - e) * p + e * f) / L`` (``p``/``f``: the bound of an ordinary/final step).
  The ceiling anchor measures an interval against ``R_ub(|T|, e_T)``; the performance gap is
  ``R_ub(n_tail, e_tail) - mean(tail(T^(1)))``, the ceiling of the very mean it is compared with,
  so a policy earning the most the reward allows has a gap of exactly 0, never a negative one.
* [`effective_rank`][continual_eval.stream.effective_rank] is the plasticity reading the callback
  can capture (``exp`` of the entropy of the normalised singular values, Roy & Vetterli 2007).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from continual_eval.stream._floats import mean, power_of_two_scale, unscale
from continual_eval.stream.intervals import (
    Intervals,
    configuration_intervals,
    running_means,
    tail_lengths,
)
from continual_eval.stream.rewards import (
    RewardSpec,
    UpperBound,
    analytic_upper_bound,
    window_ceilings,
)
from continual_eval.stream.trace import EpisodeTrace

__all__ = [
    "METRIC_NAMES",
    "adaptation_speed",
    "compute_all_metrics",
    "effective_rank",
    "forgetting",
    "interval_ceilings",
    "interval_values",
    "interval_variance",
    "label_values",
    "pooled_variance",
    "recovery_time",
    "tail_means",
    "trace_metrics",
]

Anchor = Literal["segment", "ceiling"]
Ceiling = float | UpperBound | RewardSpec | Mapping[str, float | UpperBound]

#: The fifteen rows of the table, in print order.
METRIC_NAMES: tuple[str, ...] = (
    "per_configuration_reward",
    "adaptation_speed",
    "recovery_time",
    "forgetting",
    "stability_variance",
    "performance_gap",
    "zero_shot_reward",
    "regret",
    "effective_rank",
    "settled_reward",
    "settled_reward_policy",
    "discounted_return",
    "undiscounted_return",
    "invalid_action_rate",
    "solve_rate",
)

DEFAULT_ALPHA = {"segment": 0.9, "ceiling": 0.5}
DEFAULT_EPS_SEGMENT = 0.30
DEFAULT_EPS_CEILING_FRACTION = 0.5
DEFAULT_FLOOR = 0.005


# --------------------------------------------------------------------------- effective rank
def effective_rank(features: np.ndarray | Sequence[Sequence[float]]) -> float:
    """Effective rank of an ``[N, D]`` matrix (Roy & Vetterli, 2007).

    ``erank = exp(H(p))``, ``H(p) = -sum_k p_k log p_k`` over the normalised singular values
    ``p_k = s_k / sum_j s_j`` (with ``0 log 0 = 0``). It lies in ``[1, min(N, D)]``: ``n`` for an
    ``n x n`` identity (equal singular values), 1 for a rank-1 matrix. An all-zero matrix has no
    spectrum to normalise; its rank is 0.
    """
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"effective_rank needs an [N, D] matrix, got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"effective_rank needs a non-empty matrix, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("effective_rank: the matrix holds NaN or infinite values")
    s = np.linalg.svd(x, compute_uv=False)
    total = float(s.sum())
    if total == 0.0:
        return 0.0
    p = s[s > 0] / total
    return float(np.exp(-np.sum(p * np.log(p))))


# --------------------------------------------------------------------------- per-interval pieces
def _first_crossing(mask: np.ndarray, iv: Intervals) -> np.ndarray:
    """Per interval, the smallest 1-based ``tau`` where ``mask`` holds; NaN when it never does."""
    tau = iv.position_in_interval()
    big = np.iinfo(np.int64).max
    first = np.minimum.reduceat(np.where(mask, tau, big), iv.start)
    return np.where(first == big, np.nan, first.astype(np.float64))


def adaptation_speed(
    reward: np.ndarray,
    iv: Intervals,
    *,
    anchor: Anchor = "segment",
    alpha: float | None = None,
    ceilings: np.ndarray | None = None,
) -> np.ndarray:
    """``tau_adapt = min{tau : bar r_tau >= alpha * A}`` for every interval (NaN = absent).

    ``A`` is the interval's peak running mean (segment anchor; never crossing reports ``|T|``) or
    ``ceilings[j]`` (ceiling anchor; never crossing is absent). Interval 0 has no shift: absent.
    """
    alpha = DEFAULT_ALPHA[anchor] if alpha is None else float(alpha)
    rm = running_means(reward, iv)
    if anchor == "segment":
        ref = np.maximum.reduceat(rm, iv.start)
    elif anchor == "ceiling":
        if ceilings is None:
            raise ValueError(
                "the ceiling anchor needs a ceiling (a reward spec or an explicit bound)"
            )
        ref = np.asarray(ceilings, dtype=np.float64)
    else:
        raise ValueError(f"anchor must be 'segment' or 'ceiling', got {anchor!r}")
    threshold = alpha * ref
    out = _first_crossing(rm >= np.repeat(threshold, iv.length), iv)
    if anchor == "segment":
        out = np.where(np.isnan(out), iv.length.astype(np.float64), out)
    out[0] = np.nan
    return out


def tail_means(reward: np.ndarray, iv: Intervals, tail_fraction: float = 0.2) -> np.ndarray:
    """Mean of each interval's final ``ceil(tail_fraction * |T|)`` rewards."""
    n_tail = tail_lengths(iv.length, tail_fraction)
    csum = np.concatenate(([0.0], np.cumsum(reward, dtype=np.float64)))
    return (csum[iv.stop] - csum[iv.stop - n_tail]) / n_tail


def recovery_time(
    reward: np.ndarray,
    iv: Intervals,
    *,
    anchor: Anchor = "segment",
    eps: float | None = None,
    floor: float = DEFAULT_FLOOR,
    tail_fraction: float = 0.2,
    ceilings: np.ndarray | None = None,
) -> np.ndarray:
    """``tau_rec = min{tau : |bar r_tau - A| <= band}`` per interval (NaN = absent or never).

    Segment anchor: ``A`` = tail mean, ``band = max(eps * |A|, floor)`` (``eps`` a fraction,
    default 0.30). Ceiling anchor: ``A = R_ub``, ``band = max(eps, floor)`` (``eps`` absolute,
    default ``0.5 * |R_ub|``). Interval 0 has no shift: absent.
    """
    rm = running_means(reward, iv)
    if anchor == "segment":
        asym = tail_means(reward, iv, tail_fraction)
        e = DEFAULT_EPS_SEGMENT if eps is None else float(eps)
        band = np.maximum(e * np.abs(asym), floor)
    elif anchor == "ceiling":
        if ceilings is None:
            raise ValueError(
                "the ceiling anchor needs a ceiling (a reward spec or an explicit bound)"
            )
        asym = np.asarray(ceilings, dtype=np.float64)
        e = DEFAULT_EPS_CEILING_FRACTION * np.abs(asym) if eps is None else float(eps)
        band = np.maximum(e, floor)
    else:
        raise ValueError(f"anchor must be 'segment' or 'ceiling', got {anchor!r}")
    dist = np.abs(rm - np.repeat(asym, iv.length))
    out = _first_crossing(dist <= np.repeat(band, iv.length), iv)
    out[0] = np.nan
    return out


def interval_variance(reward: np.ndarray, iv: Intervals) -> np.ndarray:
    """Sample variance (``ddof=1``) of each interval's rewards; NaN for a single-step interval."""
    length = iv.length
    mean = np.add.reduceat(reward, iv.start) / length
    dev = reward - np.repeat(mean, length)
    ss = np.add.reduceat(dev * dev, iv.start)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(length > 1, ss / (length - 1), np.nan)


def pooled_variance(reward: np.ndarray, code: np.ndarray, n_labels: int) -> np.ndarray:
    """``Var{r_t : z_t = k}`` (``ddof=1``) per label code; NaN for a label with one step."""
    count = np.bincount(code, minlength=n_labels).astype(np.float64)
    mean = np.bincount(code, weights=reward, minlength=n_labels) / np.maximum(count, 1)
    dev = reward - mean[code]
    ss = np.bincount(code, weights=dev * dev, minlength=n_labels)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(count > 1, ss / (count - 1), np.nan)


def forgetting(interval_mean: np.ndarray, interval_root: np.ndarray) -> np.ndarray:
    """Per interval, ``F = mean(T^(1)) - mean(T^(2))`` of its regime identity (root origin).

    Encounters are the intervals sharing a root, in order; fewer than two encounters (or an
    encounter whose mean is absent) gives NaN. Positive means the policy got worse.
    """
    out = np.full(len(interval_mean), np.nan)
    for root in np.unique(interval_root):
        members = np.flatnonzero(interval_root == root)
        if len(members) >= 2:
            out[members] = interval_mean[members[0]] - interval_mean[members[1]]
    return out


def _masked_interval_mean(values: np.ndarray, keep: np.ndarray, iv: Intervals) -> np.ndarray:
    """Per interval, the mean of ``values`` where ``keep``; NaN where nothing is kept."""
    sums = np.add.reduceat(np.where(keep, values, 0.0), iv.start)
    counts = np.add.reduceat(keep.astype(np.int64), iv.start)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


def _label_mean(per_interval: np.ndarray, iv: Intervals, n_labels: int) -> np.ndarray:
    """Per label, the mean of its intervals' values that are present (NaN when none are)."""
    ok = ~np.isnan(per_interval)
    sums = np.bincount(iv.code[ok], weights=per_interval[ok], minlength=n_labels)
    counts = np.bincount(iv.code[ok], minlength=n_labels)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


def _label_nanmean(values: np.ndarray, code: np.ndarray, n_labels: int) -> np.ndarray:
    """Per label, the mean of a per-step column over the steps where it is recorded (not NaN)."""
    ok = ~np.isnan(values)
    sums = np.bincount(code[ok], weights=values[ok], minlength=n_labels)
    counts = np.bincount(code[ok], minlength=n_labels)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


def _none(x: Any) -> float | None:
    """NaN -> None (the absence rule at the API boundary); numbers -> float."""
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


# --------------------------------------------------------------------------- parameters, bounds
def _resolve_params(
    anchor: str,
    alpha: float | None,
    eps: float | None,
    floor: float,
    tail_fraction: float,
    zero_shot_window: int,
    gamma: float,
) -> dict[str, Any]:
    if anchor not in DEFAULT_ALPHA:
        raise ValueError(f"anchor must be 'segment' or 'ceiling', got {anchor!r}")
    if zero_shot_window < 1:
        raise ValueError(f"zero_shot_window must be >= 1, got {zero_shot_window}")
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must lie in (0, 1], got {gamma}")
    tail_lengths(np.array([1]), tail_fraction)  # validates the fraction
    params: dict[str, Any] = {
        "anchor": anchor,
        "alpha": DEFAULT_ALPHA[anchor] if alpha is None else float(alpha),
        "eps": None if eps is None else float(eps),
        "recovery_floor": float(floor),
        "tail_fraction": float(tail_fraction),
        "zero_shot_window": int(zero_shot_window),
        "gamma": float(gamma),
    }
    if anchor == "segment":
        params["eps"] = DEFAULT_EPS_SEGMENT if eps is None else float(eps)
        params["eps_meaning"] = "fraction of |A|, A = tail mean"
    else:
        params["eps_meaning"] = (
            "absolute distance from R_ub"
            if eps is not None
            else f"absolute distance from R_ub, default {DEFAULT_EPS_CEILING_FRACTION} * |R_ub|"
        )
    return params


def _as_bound(value: float | UpperBound | RewardSpec) -> UpperBound:
    if isinstance(value, UpperBound):
        return value
    if isinstance(value, RewardSpec):
        return analytic_upper_bound(value)
    return UpperBound.explicit(float(value))


def _resolve_ceiling(
    ceiling: Ceiling | None,
) -> tuple[UpperBound | None, dict[str, UpperBound] | None]:
    """A single bound, or a per-label mapping of bounds."""
    if ceiling is None:
        return None, None
    if isinstance(ceiling, Mapping):
        return None, {str(k): _as_bound(v) for k, v in ceiling.items()}
    return _as_bound(ceiling), None


def _bound_record(single: UpperBound | None, per_label: dict[str, UpperBound] | None) -> Any:
    if single is not None:
        return single.to_dict()
    if per_label is not None:
        return {"per_regime": {k: b.to_dict() for k, b in per_label.items()}}
    return None


# --------------------------------------------------------------------------- one trace
#: how many reward units each metric carries (a variance two, a step count none): the power of
#: the reward scale it is multiplied back by (see `continual_eval.stream._floats`)
REWARD_DEGREE: dict[str, int] = {
    "per_configuration_reward": 1,
    "adaptation_speed": 0,
    "recovery_time": 0,
    "forgetting": 1,
    "stability_variance": 2,
    "performance_gap": 1,
    "zero_shot_reward": 1,
    "regret": 1,
    "effective_rank": 0,
    "settled_reward": 1,
    "settled_reward_policy": 1,
    "discounted_return": 1,
    "undiscounted_return": 1,
    "invalid_action_rate": 0,
    "solve_rate": 0,
    # per-interval values that are not rows
    "mean_reward": 1,
    "ceiling": 1,
    "settled_ceiling": 1,
}


def interval_ceilings(
    trace: EpisodeTrace,
    iv: Intervals,
    tail_fraction: float,
    bound: UpperBound | None = None,
    bounds_per_label: Mapping[str, UpperBound] | None = None,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Per interval, ``R_ub(|T|, e_T)`` (the ceiling anchor's ``A``) and ``R_ub(n_tail,
    e_tail)`` (the performance gap's), ``R_ub(L, e) = ((L - e) p + e f) / L`` for ``L`` steps
    holding ``e`` episode ends; NaN for a label without a bound; ``(None, None)`` without any."""
    if bound is None and bounds_per_label is None:
        return None, None
    per_label = [
        bound if bounds_per_label is None else bounds_per_label.get(name)
        for name in trace.regime_names
    ]
    nan = math.nan
    p = np.array([nan if b is None else b.per_step for b in per_label], dtype=np.float64)
    f = np.array([nan if b is None else b.final_step for b in per_label], dtype=np.float64)
    n = len(trace)
    ends = trace.episode_end if trace.episode_end is not None else np.zeros(n, dtype=bool)
    ends_csum = np.concatenate(([0], np.cumsum(ends, dtype=np.int64)))
    n_tail = tail_lengths(iv.length, tail_fraction)
    ends_whole = ends_csum[iv.stop] - ends_csum[iv.start]
    ends_tail = ends_csum[iv.stop] - ends_csum[iv.stop - n_tail]
    p, f = p[iv.code], f[iv.code]
    return window_ceilings(p, f, iv.length, ends_whole), window_ceilings(p, f, n_tail, ends_tail)


def _check_ceiling_anchor(
    anchor: str, ceilings: np.ndarray | None, iv: Intervals, names: Any
) -> None:
    """The ceiling anchor needs a ceiling for every interval."""
    if anchor != "ceiling":
        return
    if ceilings is None or np.isnan(ceilings).all():
        raise ValueError(
            "anchor='ceiling' needs a ceiling: pass a RewardSpec, an UpperBound or a number"
        )
    if np.isnan(ceilings).any():
        missing = sorted({names[c] for c in iv.code[np.isnan(ceilings)]})
        raise ValueError(f"anchor='ceiling' but no ceiling given for regime label(s) {missing}")


def _excluded_steps(trace: EpisodeTrace, components: Sequence[str] | None) -> np.ndarray | None:
    """Steps on which a named episode-end component paid (``!= 0``); ``None`` when none named."""
    if not components:
        return None
    trace.check_components(components)
    excluded = np.zeros(len(trace), dtype=bool)
    for name in components:
        col = trace.components[name]
        excluded |= ~np.isnan(col) & (col != 0.0)
    return excluded


def _root_codes(trace: EpisodeTrace) -> np.ndarray:
    """Per label code, the index of its regime identity (root origin), in order of appearance."""
    roots = trace.roots
    names = trace.regime_names
    index = {root: i for i, root in enumerate(dict.fromkeys(roots[nm] for nm in names))}
    return np.array([index[roots[nm]] for nm in names], dtype=np.int64)


def interval_values(
    r: np.ndarray,
    iv: Intervals,
    params: Mapping[str, Any],
    *,
    root_code: np.ndarray,
    ceilings: np.ndarray | None = None,
    excluded: np.ndarray | None = None,
    floor_scale: float = 1.0,
) -> dict[str, np.ndarray]:
    """Every per-interval value of rewards ``r`` (NaN = absent), keyed as in ``per_interval``.

    ``root_code[k]``: the regime identity of label code ``k`` (forgetting pairs encounters of
    one identity). ``floor_scale``: the factor rewards were divided by; the recovery floor and
    an absolute (ceiling-anchor) ``eps`` are reward amounts and are divided by it too.
    """
    length = iv.length
    csum = np.concatenate(([0.0], np.cumsum(r, dtype=np.float64)))
    iv_mean = (csum[iv.stop] - csum[iv.start]) / length
    eps = params["eps"]
    if params["anchor"] == "ceiling" and eps is not None:
        eps = eps / floor_scale
    tail_fraction = params["tail_fraction"]
    window = np.minimum(length, params["zero_shot_window"])
    shifted = np.arange(len(iv)) > 0
    if excluded is not None:
        keep = ~excluded
        mean_for_forgetting = _masked_interval_mean(r, keep, iv)
        n_tail = tail_lengths(length, tail_fraction)
        in_tail = np.arange(len(r)) >= np.repeat(iv.stop - n_tail, length)
        settled_policy = _masked_interval_mean(r, in_tail & keep, iv)
    else:
        mean_for_forgetting = iv_mean
        settled_policy = np.full(len(iv), np.nan)
    nan = np.full(len(iv), np.nan)
    return {
        "mean_reward": iv_mean,
        "adaptation_speed": adaptation_speed(
            r, iv, anchor=params["anchor"], alpha=params["alpha"], ceilings=ceilings
        ),
        "recovery_time": recovery_time(
            r,
            iv,
            anchor=params["anchor"],
            eps=eps,
            floor=params["recovery_floor"] / floor_scale,
            tail_fraction=tail_fraction,
            ceilings=ceilings,
        ),
        "stability_variance": interval_variance(r, iv),
        "zero_shot_reward": np.where(
            shifted, (csum[iv.start + window] - csum[iv.start]) / window, np.nan
        ),
        "settled_reward": tail_means(r, iv, tail_fraction),
        "settled_reward_policy": settled_policy,
        "forgetting": forgetting(mean_for_forgetting, root_code[iv.code]),
        "ceiling": nan if ceilings is None else ceilings,
    }


def label_values(
    trace: EpisodeTrace,
    r: np.ndarray,
    iv: Intervals,
    per_interval: Mapping[str, np.ndarray],
    *,
    discounted: np.ndarray,
    reference: np.ndarray | None = None,
    tail_ceilings: np.ndarray | None = None,
    solve_component: str | None = None,
) -> dict[str, np.ndarray]:
    """The fifteen rows per label code (NaN = absent) from rewards ``r``, their discounted
    values ``gamma**t * r_t`` and the per-interval values; each label's interval values enter
    as the mean over its intervals that have one."""
    code = trace.regime_code
    K = len(trace.regime_names)
    absent = np.full(K, np.nan)
    count = np.bincount(code, minlength=K).astype(np.float64)
    first_iv = np.full(K, -1, dtype=np.int64)
    first_iv[iv.code[::-1]] = np.arange(len(iv))[::-1]
    solve = absent
    if solve_component is not None:
        col = trace.components[solve_component]
        solve = _label_nanmean(
            np.where(np.isnan(col), np.nan, (col > 0).astype(np.float64)), code, K
        )
    return {
        "per_configuration_reward": np.bincount(code, weights=r, minlength=K) / count,
        "adaptation_speed": _label_mean(per_interval["adaptation_speed"], iv, K),
        "recovery_time": _label_mean(per_interval["recovery_time"], iv, K),
        "forgetting": per_interval["forgetting"][first_iv],
        "stability_variance": pooled_variance(r, code, K),
        "performance_gap": absent
        if tail_ceilings is None
        else tail_ceilings[first_iv] - per_interval["settled_reward"][first_iv],
        "zero_shot_reward": _label_mean(per_interval["zero_shot_reward"], iv, K),
        "regret": absent
        if reference is None
        else np.bincount(code, weights=reference - r, minlength=K),
        "effective_rank": absent
        if trace.effective_rank is None
        else _label_nanmean(trace.effective_rank, code, K),
        "settled_reward": _label_mean(per_interval["settled_reward"], iv, K),
        "settled_reward_policy": _label_mean(per_interval["settled_reward_policy"], iv, K),
        "discounted_return": np.bincount(code, weights=discounted, minlength=K),
        "undiscounted_return": np.bincount(code, weights=r, minlength=K),
        "invalid_action_rate": absent
        if trace.invalid_action is None
        else _label_nanmean(trace.invalid_action, code, K),
        "solve_rate": solve,
    }


def _discounted(r: np.ndarray, gamma: float) -> np.ndarray:
    """``gamma**t * r_t``, ``t`` the position in the trace."""
    return np.power(gamma, np.arange(len(r), dtype=np.float64)) * r


def _present(values: np.ndarray) -> list[float | None]:
    """A float column as Python floats, NaN as ``None`` (the absence rule)."""
    return [None if x != x else x for x in values.tolist()]


#: the fields of a ``per_interval`` record after the interval's place, in order; NaN is absent
#: except in the two that always have a value
_INTERVAL_FIELDS = (
    "mean_reward",
    "adaptation_speed",
    "recovery_time",
    "stability_variance",
    "zero_shot_reward",
    "settled_reward",
    "settled_reward_policy",
    "forgetting",
    "ceiling",
    "settled_ceiling",
)


def _interval_records(
    trace: EpisodeTrace, iv: Intervals, values: Mapping[str, np.ndarray]
) -> list[dict[str, Any]]:
    """``per_interval``: one JSON-ready record per configuration interval."""
    names, roots = trace.regime_names, trace.roots
    labels = [names[c] for c in iv.code.tolist()]
    place = zip(
        labels,
        trace.step[iv.start].tolist(),
        trace.step[iv.stop - 1].tolist(),
        iv.length.tolist(),
        strict=True,
    )
    columns = [
        values[k].tolist() if k in ("mean_reward", "settled_reward") else _present(values[k])
        for k in _INTERVAL_FIELDS
    ]
    return [
        {
            "regime_id": label,
            "regime_origin": roots[label],
            "first_step": first,
            "last_step": last,
            "length": length,
            "follows_shift": j > 0,
            **dict(zip(_INTERVAL_FIELDS, row, strict=True)),
        }
        for j, ((label, first, last, length), row) in enumerate(
            zip(place, zip(*columns, strict=True), strict=True)
        )
    ]


def _trace_totals(
    trace: EpisodeTrace,
    intervals: int,
    r: np.ndarray,
    scale: float,
    discounted: np.ndarray,
    reference: np.ndarray | None,
    solve_component: str | None,
) -> dict[str, Any]:
    """``totals``: the whole trace's returns, regret and rates (rewards ``r`` divided by
    ``scale``, multiplied back here)."""
    inv_all = None
    if trace.invalid_action is not None and not np.isnan(trace.invalid_action).all():
        inv_all = float(np.nanmean(trace.invalid_action))
    solve_all = None
    if solve_component is not None:
        col = trace.components[solve_component]
        if not np.isnan(col).all():
            solve_all = float(np.nanmean(np.where(np.isnan(col), np.nan, col > 0)))

    def amount(x: Any) -> float:
        return float(unscale(np.float64(x), scale, 1))

    return {
        "steps": len(r),
        "intervals": intervals,
        "discounted_return": amount(discounted.sum()),
        "undiscounted_return": amount(r.sum()),
        "regret": None if reference is None else amount((reference - r).sum()),
        "invalid_action_rate": inv_all,
        "solve_rate": solve_all,
    }


def trace_metrics(
    trace: EpisodeTrace,
    *,
    params: Mapping[str, Any],
    bound: UpperBound | None = None,
    bounds_per_label: Mapping[str, UpperBound] | None = None,
    reference: np.ndarray | None = None,
    episode_end_components: Sequence[str] | None = None,
    solve_component: str | None = None,
) -> dict[str, Any]:
    """All metrics of one trace: ``per_regime`` (label -> row), ``per_interval`` and ``totals``.

    ``params`` is the dict [`compute_all_metrics`][continual_eval.stream.compute_all_metrics]
    records (anchor, alpha, eps, ...). With a ceiling, each interval records
    ``ceiling = R_ub(|T|, e_T)`` (the ceiling anchor's ``A``) and
    ``settled_ceiling = R_ub(n_tail, e_tail)`` (the performance gap's), see `interval_ceilings`.
    Rewards of huge magnitude are scored divided by a power of two and each value multiplied back
    (`continual_eval.stream._floats`): a value is ``±inf`` only when its true value is beyond
    float64, never NaN (which would read as absent).
    """
    iv = configuration_intervals(trace.regime_code)
    ceilings, tail_ceilings = interval_ceilings(
        trace, iv, params["tail_fraction"], bound, bounds_per_label
    )
    _check_ceiling_anchor(params["anchor"], ceilings, iv, trace.regime_names)
    excluded = _excluded_steps(trace, episode_end_components)
    if solve_component is not None:
        trace.check_components([solve_component])
    scale = power_of_two_scale(trace.reward, reference, ceilings, tail_ceilings)

    def down(x: np.ndarray | None) -> np.ndarray | None:
        return x if x is None or scale == 1.0 else x / scale

    r = down(trace.reward)
    assert r is not None
    per_iv = interval_values(
        r,
        iv,
        params,
        root_code=_root_codes(trace),
        ceilings=down(ceilings),
        excluded=excluded,
        floor_scale=scale,
    )
    per_iv["settled_ceiling"] = (
        np.full(len(iv), np.nan) if tail_ceilings is None else down(tail_ceilings)
    )
    discounted = _discounted(r, params["gamma"])
    columns = label_values(
        trace,
        r,
        iv,
        per_iv,
        discounted=discounted,
        reference=down(reference),
        tail_ceilings=down(tail_ceilings),
        solve_component=solve_component,
    )
    columns = {m: unscale(v, scale, REWARD_DEGREE[m]) for m, v in columns.items()}
    per_iv = {k: unscale(v, scale, REWARD_DEGREE.get(k, 0)) for k, v in per_iv.items()}
    names = trace.regime_names
    per_regime = {
        names[k]: {m: _none(columns[m][k]) for m in METRIC_NAMES} for k in range(len(names))
    }
    return {
        "per_regime": per_regime,
        "per_interval": _interval_records(trace, iv, per_iv),
        "totals": _trace_totals(
            trace, len(iv), r, scale, discounted, down(reference), solve_component
        ),
    }


# --------------------------------------------------------------------------- all traces
def _mean_present(values: Sequence[float | None]) -> tuple[float | None, int]:
    """Mean of the values that are not ``None``, and how many there were (a sum that overflows
    does not make a representable mean ``inf``)."""
    present = [v for v in values if v is not None]
    if not present:
        return None, 0
    return float(mean(present)), len(present)


def _reference_array(ref: Any, trace: EpisodeTrace, index: int) -> np.ndarray:
    arr = ref.reward if isinstance(ref, EpisodeTrace) else np.asarray(ref, dtype=np.float64)
    arr = np.asarray(arr, dtype=np.float64).reshape(-1)
    if len(arr) != len(trace):
        raise ValueError(
            f"reference for trace {index} has {len(arr)} rewards, the trace has {len(trace)} steps"
        )
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(
            f"reference reward for trace {index} at step {int(trace.step[bad[0]])} is "
            f"{arr[bad[0]]!r}; rewards must be finite"
        )
    return arr


def compute_all_metrics(
    traces: Sequence[EpisodeTrace] | EpisodeTrace,
    *,
    anchor: Anchor = "segment",
    alpha: float | None = None,
    eps: float | None = None,
    recovery_floor: float = DEFAULT_FLOOR,
    tail_fraction: float = 0.2,
    zero_shot_window: int = 10,
    gamma: float = 0.99,
    ceiling: Ceiling | None = None,
    reference: Sequence[Any] | None = None,
    episode_end_components: Sequence[str] | None = None,
    solve_component: str | None = None,
) -> dict[str, Any]:
    """Score the traces of one run (one configuration schedule, one seed) and aggregate them.

    Stage 1 averages each label's metrics across traces; stage 2 averages stage-1 values across
    labels (``overall``). Absences are dropped at both stages and ``n`` / ``overall_n`` count the
    values each aggregate rests on.

    ``ceiling``: a number (explicit), an [`UpperBound`][continual_eval.stream.rewards.UpperBound], a
    [`RewardSpec`][continual_eval.stream.RewardSpec] (analytic bound) or a mapping label ->
    number/bound. ``reference``: one reference reward sequence (or trace) per trace, for regret.
    ``episode_end_components``: components whose payout steps are excluded from forgetting and from
    the policy-only settled reward. ``solve_component``: the component whose positive values count
    as solved.

    Returns a JSON-serialisable dict with keys ``per_regime``, ``n``, ``overall``, ``overall_n``,
    ``totals``, ``per_trace``, ``params``, ``bound``, ``origins``.
    """
    if isinstance(traces, EpisodeTrace):
        traces = [traces]
    traces = list(traces)
    if not traces:
        raise ValueError("compute_all_metrics needs at least one trace")
    params = _resolve_params(
        anchor, alpha, eps, recovery_floor, tail_fraction, zero_shot_window, gamma
    )
    params["episode_end_components"] = list(episode_end_components or []) or None
    params["solve_component"] = solve_component
    params["regret_reference"] = reference is not None
    single, per_label = _resolve_ceiling(ceiling)
    references = _references(reference, traces)
    per_trace = [
        trace_metrics(
            tr,
            params=params,
            bound=single,
            bounds_per_label=per_label,
            reference=references[i],
            episode_end_components=episode_end_components,
            solve_component=solve_component,
        )
        for i, tr in enumerate(traces)
    ]
    origins: dict[str, str] = {}
    for tr in traces:
        origins.update(tr.roots)
    return {
        **_across_traces(per_trace),
        "per_trace": per_trace,
        "params": params,
        "bound": _bound_record(single, per_label),
        "origins": origins,
        "n_traces": len(traces),
    }


def _references(reference: Sequence[Any] | None, traces: list[Any]) -> list[np.ndarray | None]:
    """One validated reference reward array per trace (``None`` each without a reference);
    checks that every trace is an [`EpisodeTrace`][continual_eval.stream.EpisodeTrace]."""
    for i, tr in enumerate(traces):
        if not isinstance(tr, EpisodeTrace):
            raise TypeError(f"trace {i} is a {type(tr).__name__}, not an EpisodeTrace")
    if reference is None:
        return [None] * len(traces)
    single_ref = isinstance(reference, EpisodeTrace) or (
        len(reference) > 0
        and not isinstance(reference[0], EpisodeTrace)
        and np.ndim(reference[0]) == 0
    )
    if single_ref:
        reference = [reference]
    if len(reference) != len(traces):
        raise ValueError(f"{len(reference)} reference trajectories for {len(traces)} traces")
    return [
        _reference_array(ref, tr, i)
        for i, (ref, tr) in enumerate(zip(reference, traces, strict=True))
    ]


#: the whole-trace values averaged across traces
_TOTAL_KEYS = (
    "discounted_return",
    "undiscounted_return",
    "regret",
    "invalid_action_rate",
    "solve_rate",
)


def _across_traces(per_trace: list[dict[str, Any]]) -> dict[str, Any]:
    """Stage 1 (each label's values across traces: ``per_regime``, counts ``n``), stage 2
    (across labels: ``overall``, ``overall_n``) and the totals' means (``totals``,
    ``totals_n``); absences dropped."""
    labels = list(dict.fromkeys(lb for pt in per_trace for lb in pt["per_regime"]))
    per_regime: dict[str, dict[str, float | None]] = {}
    counts: dict[str, dict[str, int]] = {}
    for lb in labels:
        rows = [pt["per_regime"][lb] for pt in per_trace if lb in pt["per_regime"]]
        per_regime[lb], counts[lb] = {}, {}
        for m in METRIC_NAMES:
            per_regime[lb][m], counts[lb][m] = _mean_present([row[m] for row in rows])
    overall, overall_n = {}, {}
    for m in METRIC_NAMES:
        overall[m], overall_n[m] = _mean_present([per_regime[lb][m] for lb in labels])
    totals, totals_n = {}, {}
    for key in _TOTAL_KEYS:
        totals[key], totals_n[key] = _mean_present([pt["totals"][key] for pt in per_trace])
    return {
        "per_regime": per_regime,
        "n": counts,
        "overall": overall,
        "overall_n": overall_n,
        "totals": totals,
        "totals_n": totals_n,
    }

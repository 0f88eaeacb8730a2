"""Aggregation across seeds (the third stage) and the relative adaptation advantage.

Stage 1 (traces within a configuration) and stage 2 (across configurations) happen in
[`compute_all_metrics`][continual_eval.stream.compute_all_metrics]. Here each seed's result
contributes one value per metric; the aggregate is the mean and the spread (sample standard
deviation, ``ddof=1``) of the values present. Absences are dropped, never counted as zero; ``n``
says how many seeds a value rests on, and one value has no spread (``None``), not a zero one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from continual_eval.stream._floats import mean, sample_std
from continual_eval.stream.metrics import METRIC_NAMES

__all__ = ["aggregate_seeds", "mean_and_spread", "relative_adaptation_advantage"]

#: Parameters that must agree before results may be pooled (anchors do not mix).
_MUST_AGREE = (
    "anchor",
    "alpha",
    "eps",
    "recovery_floor",
    "tail_fraction",
    "zero_shot_window",
    "gamma",
)


def mean_and_spread(values: Sequence[float | None]) -> dict[str, Any]:
    """``{"mean", "spread", "n"}`` over the values that are not ``None``.

    ``spread`` is the sample standard deviation; ``None`` when fewer than two values are present.
    Neither overflows where its true value is representable (seeds near ``±1.7e308``); a value
    that is not finite makes the mean ``±inf``/NaN and the spread NaN.
    """
    present = [float(v) for v in values if v is not None]
    n = len(present)
    if n == 0:
        return {"mean": None, "spread": None, "n": 0}
    center = mean(present)
    spread = sample_std(present, center) if n >= 2 else None
    return {"mean": center, "spread": spread, "n": n}


def _check_comparable(results: Sequence[Mapping[str, Any]]) -> None:
    first = results[0]["params"]
    for i, res in enumerate(results[1:], start=1):
        for key in _MUST_AGREE:
            if res["params"].get(key) != first.get(key):
                raise ValueError(
                    f"result {i} was scored with {key}={res['params'].get(key)!r}, result 0 with "
                    f"{key}={first.get(key)!r}; numbers under different parameters do not mix"
                )


def aggregate_seeds(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and spread across seeds of every per-regime, overall and whole-trace metric.

    ``results`` are [`compute_all_metrics`][continual_eval.stream.compute_all_metrics] outputs, one
    per seed, scored with the same parameters (else ``ValueError``).
    """
    results = list(results)
    if not results:
        raise ValueError("aggregate_seeds needs at least one result")
    _check_comparable(results)
    labels = list(dict.fromkeys(lb for res in results for lb in res["per_regime"]))
    per_regime = {
        lb: {
            m: mean_and_spread(
                [res["per_regime"][lb][m] for res in results if lb in res["per_regime"]]
            )
            for m in METRIC_NAMES
        }
        for lb in labels
    }
    overall = {m: mean_and_spread([res["overall"][m] for res in results]) for m in METRIC_NAMES}
    total_keys = list(dict.fromkeys(k for res in results for k in res.get("totals", {})))
    totals = {
        k: mean_and_spread([res.get("totals", {}).get(k) for res in results]) for k in total_keys
    }
    return {
        "per_regime": per_regime,
        "overall": overall,
        "totals": totals,
        "n_seeds": len(results),
        "params": dict(results[0]["params"]),
        "bounds": [res.get("bound") for res in results],
    }


def _adaptation_means(result: Mapping[str, Any]) -> tuple[dict[str, float | None], float | None]:
    """Per-regime and overall adaptation speed of a seed aggregate or of a single result."""

    def mean(cell: Any) -> float | None:
        return cell["mean"] if isinstance(cell, Mapping) else cell

    per = {lb: mean(row["adaptation_speed"]) for lb, row in result["per_regime"].items()}
    return per, mean(result["overall"]["adaptation_speed"])


def relative_adaptation_advantage(
    baseline: Mapping[str, Any], candidate: Mapping[str, Any]
) -> dict[str, Any]:
    """``tau_adapt(baseline) - tau_adapt(candidate)``: positive = candidate adapts faster.

    Each side is a family's [`aggregate_seeds`][continual_eval.stream.aggregate_seeds] output (its
    mean across seeds is used) or a single
    [`compute_all_metrics`][continual_eval.stream.compute_all_metrics] result. Absent on either side
    gives ``None``. Both sides must share the anchor and alpha.
    """
    for key in ("anchor", "alpha"):
        if baseline["params"].get(key) != candidate["params"].get(key):
            raise ValueError(
                f"baseline used {key}={baseline['params'].get(key)!r}, candidate "
                f"{key}={candidate['params'].get(key)!r}; adaptation speeds do not compare"
            )
    base_per, base_all = _adaptation_means(baseline)
    cand_per, cand_all = _adaptation_means(candidate)
    per = {}
    for lb in dict.fromkeys([*base_per, *cand_per]):
        b, c = base_per.get(lb), cand_per.get(lb)
        per[lb] = None if b is None or c is None else b - c
    overall = None if base_all is None or cand_all is None else base_all - cand_all
    return {"per_regime": per, "overall": overall, "anchor": baseline["params"]["anchor"]}

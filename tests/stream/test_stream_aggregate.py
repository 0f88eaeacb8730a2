"""Aggregation across seeds, relative adaptation advantage, tables printing `--`."""

from __future__ import annotations

import math

import pytest

from continual_eval.stream import (
    EpisodeTrace,
    aggregate_seeds,
    compute_all_metrics,
    format_markdown,
    format_seed_table,
    format_table,
    relative_adaptation_advantage,
)
from continual_eval.stream.table import ROW_TITLES


def seed_result(level: float, with_return: bool = True) -> dict:
    rewards = [level] * 6 + [0.0, level, level, level] + ([level / 2] * 5 if with_return else [])
    labels = ["a"] * 6 + ["b"] * 4 + (["a_again"] * 5 if with_return else [])
    origins = {"a_again": "a"} if with_return else {}
    return compute_all_metrics(EpisodeTrace.from_arrays(rewards, labels, origin_of=origins))


def loop_mean_std(values):
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None, 0
    m = sum(vals) / len(vals)
    if len(vals) < 2:
        return m, None, len(vals)
    return m, math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1)), len(vals)


def test_one_seed_has_no_spread():
    res = seed_result(1.0)
    agg = aggregate_seeds([res])
    cell = agg["per_regime"]["a"]["per_configuration_reward"]
    assert cell == {"mean": pytest.approx(1.0), "spread": None, "n": 1}
    assert agg["per_regime"]["a"]["adaptation_speed"] == {"mean": None, "spread": None, "n": 0}
    assert agg["n_seeds"] == 1


def test_three_seeds_mean_and_spread_drop_absences():
    results = [seed_result(1.0), seed_result(0.5), seed_result(2.0, with_return=False)]
    agg = aggregate_seeds(results)
    for lb in ("a", "b", "a_again"):
        for m in (
            "per_configuration_reward",
            "forgetting",
            "adaptation_speed",
            "stability_variance",
            "zero_shot_reward",
        ):
            vals = [r["per_regime"][lb][m] for r in results if lb in r["per_regime"]]
            mean, spread, n = loop_mean_std(vals)
            cell = agg["per_regime"][lb][m]
            assert cell["n"] == n
            if mean is None:
                assert cell["mean"] is None
            else:
                assert cell["mean"] == pytest.approx(mean)
            if spread is None:
                assert cell["spread"] is None
            else:
                assert cell["spread"] == pytest.approx(spread)
    # forgetting: the third seed never returns, so it rests on two seeds, not three
    assert agg["per_regime"]["a"]["forgetting"]["n"] == 2
    assert agg["per_regime"]["a_again"]["per_configuration_reward"]["n"] == 2
    mean, spread, n = loop_mean_std([r["overall"]["forgetting"] for r in results])
    assert agg["overall"]["forgetting"]["mean"] == pytest.approx(mean)
    assert agg["overall"]["forgetting"]["n"] == n


def test_identical_seeds_report_zero_spread_as_a_value():
    agg = aggregate_seeds([seed_result(1.0), seed_result(1.0)])
    assert agg["per_regime"]["a"]["per_configuration_reward"]["spread"] == 0.0


def test_mixed_anchors_refuse_to_aggregate():
    tr = EpisodeTrace.from_arrays([1.0, 0.5, 1.0], ["a", "b", "b"])
    seg = compute_all_metrics(tr)
    ceil = compute_all_metrics(tr, anchor="ceiling", ceiling=1.0)
    with pytest.raises(ValueError, match="anchor"):
        aggregate_seeds([seg, ceil])
    with pytest.raises(ValueError, match="anchor"):
        relative_adaptation_advantage(seg, ceil)


def test_relative_adaptation_advantage_between_families():
    def fam(adapt_len):
        # b's rewards: zeros then ones -> segment adaptation = first tau where mean >= 0.9 * peak
        out = []
        for extra in (0, 1):
            k = adapt_len + extra
            rewards = [1.0] * 3 + [0.0] * k + [1.0] * 40
            labels = ["a"] * 3 + ["b"] * (k + 40)
            out.append(compute_all_metrics(EpisodeTrace.from_arrays(rewards, labels)))
        return aggregate_seeds(out)

    slow, fast = fam(4), fam(1)
    adv = relative_adaptation_advantage(slow, fast)
    expected = (
        slow["per_regime"]["b"]["adaptation_speed"]["mean"]
        - fast["per_regime"]["b"]["adaptation_speed"]["mean"]
    )
    assert adv["per_regime"]["b"] == pytest.approx(expected)
    assert adv["per_regime"]["b"] > 0
    assert adv["per_regime"]["a"] is None
    assert adv["anchor"] == "segment"


def test_tables_print_dashes_for_absence_and_record_anchor():
    res = seed_result(1.0)
    text = format_table(res)
    assert "anchor=segment" in text and "alpha=0.9" in text and "ceiling=none" in text
    lines = text.splitlines()
    assert len(lines) == 2 + 15
    gap = next(line for line in lines if line.startswith(ROW_TITLES["performance_gap"]))
    assert gap.split()[-3:] == ["--", "--", "--"]
    adapt = next(line for line in lines if line.startswith(ROW_TITLES["adaptation_speed"]))
    assert adapt.split()[2] == "--"  # regime a: first interval
    md = format_markdown(res)
    assert "| Performance gap | -- | -- | -- |" in md
    agg = aggregate_seeds([seed_result(1.0), seed_result(0.5)])
    st = format_seed_table(agg)
    assert "seeds=2" in st and "±" in st and "(n=2)" in st
    one = format_seed_table(aggregate_seeds([seed_result(1.0)]))
    assert "±" not in one and "(n=1)" in one

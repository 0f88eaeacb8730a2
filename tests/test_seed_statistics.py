"""Statistics over seeds: t quantiles against a table, t interval by hand, the bootstrap against a
plain loop, paired differences on a hand example, rendering."""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest

from continual_eval import seed_statistics as ss

# Student-t quantiles t_{0.975, df}, from printed tables (three decimals)
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 10: 2.228, 30: 2.042}


@pytest.mark.parametrize(("df", "expected"), sorted(T_TABLE.items()))
def test_t_quantile_matches_the_table(df: int, expected: float):
    assert ss.t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)


def test_t_quantile_other_levels():
    assert ss.t_quantile(0.95, 4) == pytest.approx(2.132, abs=5e-4)  # 90% two-sided
    assert ss.t_quantile(0.995, 10) == pytest.approx(3.169, abs=5e-4)  # 99% two-sided


def test_t_interval_by_hand():
    # mean 3, s = sqrt(2.5), half width = 2.776445 * sqrt(2.5) / sqrt(5) = 1.963243
    ci = ss.t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert ci is not None
    assert ci.low == pytest.approx(3 - 1.963243, abs=1e-6)
    assert ci.high == pytest.approx(3 + 1.963243, abs=1e-6)
    # 90%: t_{0.95, 4} = 2.131847
    ci90 = ss.t_interval([1.0, 2.0, 3.0, 4.0, 5.0], confidence=0.90)
    assert ci90 is not None
    assert ci90.high - 3 == pytest.approx(2.131847 * math.sqrt(2.5) / math.sqrt(5), abs=1e-6)
    # no spread: the interval is the mean
    flat = ss.t_interval([0.5, 0.5, 0.5])
    assert flat == ss.Interval(0.5, 0.5)


def loop_bootstrap(
    values: list[float], confidence: float, resamples: int, seed: int
) -> tuple[float, float]:
    """One index at a time from the same generator, plain means, a hand-written linear quantile."""
    x = sorted(values)
    n = len(x)
    rng = np.random.default_rng(seed)
    means = []
    for _ in range(resamples):
        total = 0.0
        for _ in range(n):
            total += x[int(rng.integers(0, n))]
        means.append(total / n)
    means.sort()

    def quantile(q: float) -> float:
        position = q * (len(means) - 1)
        below = math.floor(position)
        above = min(below + 1, len(means) - 1)
        return means[below] + (position - below) * (means[above] - means[below])

    alpha = 1 - confidence
    return quantile(alpha / 2), quantile(1 - alpha / 2)


VALUES = [0.61, 0.55, 0.72, 0.58, 0.66, 0.49, 0.70]


@pytest.mark.parametrize(("seed", "resamples"), [(0, 2000), (1, 999), (123, 10)])
def test_bootstrap_matches_a_plain_loop(seed: int, resamples: int):
    ci = ss.bootstrap_interval(VALUES, resamples=resamples, seed=seed)
    assert ci is not None
    low, high = loop_bootstrap(VALUES, 0.95, resamples, seed)
    assert ci.low == pytest.approx(low, rel=1e-12)
    assert ci.high == pytest.approx(high, rel=1e-12)


def test_bootstrap_is_reproducible_and_order_free(monkeypatch: pytest.MonkeyPatch):
    first = ss.bootstrap_interval(VALUES, seed=5)
    assert first == ss.bootstrap_interval(VALUES, seed=5)
    assert first == ss.bootstrap_interval(list(reversed(VALUES)), seed=5)
    assert first != ss.bootstrap_interval(VALUES, seed=6)
    assert first is not None and first.low < float(np.mean(VALUES)) < first.high
    # the draws do not depend on how many rows are drawn at once
    monkeypatch.setattr(ss, "_CHUNK_CELLS", 10)
    assert first == ss.bootstrap_interval(VALUES, seed=5)


def test_summarize_and_the_small_n_cases():
    s = ss.summarize([0.5, 0.7, None, math.nan, 0.6], resamples=500, seed=3)
    assert (s.n, s.n_absent) == (3, 2)
    assert s.mean == pytest.approx(0.6)
    assert s.std == pytest.approx(0.1)  # ddof = 1
    assert s.t_interval == ss.t_interval([0.5, 0.7, 0.6])
    assert s.bootstrap_interval == ss.bootstrap_interval([0.5, 0.6, 0.7], resamples=500, seed=3)
    assert (s.confidence, s.resamples, s.bootstrap_seed) == (0.95, 500, 3)

    one = ss.summarize([0.42])
    assert (one.n, one.mean, one.std, one.t_interval, one.bootstrap_interval) == (
        1,
        0.42,
        None,
        None,
        None,
    )
    assert ss.t_interval([0.42]) is None and ss.bootstrap_interval([0.42]) is None
    none = ss.summarize([None, None])
    assert (none.n, none.n_absent, none.mean, none.std) == (0, 2, None, None)


def test_summarize_runs_orders_by_seed():
    runs = {"ewc": {2: 0.7, 0: 0.5, 1: 0.6}, "naive": {0: 0.3}}
    out = ss.summarize_runs(runs, resamples=200)
    assert list(out) == ["ewc", "naive"]
    assert out["ewc"] == ss.summarize([0.5, 0.6, 0.7], resamples=200)
    assert out["naive"].n == 1 and out["naive"].t_interval is None


def test_paired_difference_by_hand():
    a = {0: 0.80, 1: 0.70, 2: 0.90, 3: 0.60, 5: None, 6: 0.75}
    b = {0: 0.60, 1: 0.70, 2: 0.95, 3: 0.40, 4: 0.10, 5: 0.50}
    d = ss.paired_difference(a, b, resamples=300, seed=1)
    # shared seeds with both values: 0, 1, 2, 3; differences 0.2, 0, -0.05, 0.2
    assert d.seeds == (0, 1, 2, 3) and d.n_shared == 4
    assert d.only_a == (6,) and d.only_b == (4, 5)  # seed 5: A's value is absent
    assert (d.a_better, d.b_better, d.ties) == (2, 1, 1)
    assert d.mean_difference == pytest.approx(0.0875)
    differences = [0.8 - 0.6, 0.7 - 0.7, 0.9 - 0.95, 0.6 - 0.4]
    assert d.summary.std == pytest.approx(float(np.std(differences, ddof=1)))
    assert d.summary.t_interval == ss.t_interval(differences)
    assert d.summary.bootstrap_interval == ss.bootstrap_interval(differences, resamples=300, seed=1)
    # lower is better (a loss): the same differences, the wins swap
    loss = ss.paired_difference(a, b, higher_is_better=False, resamples=300, seed=1)
    assert (loss.a_better, loss.b_better, loss.ties) == (1, 2, 1)
    assert loss.mean_difference == d.mean_difference

    single = ss.paired_difference({0: 0.5, 1: 0.4}, {1: 0.3})
    assert single.n_shared == 1 and single.summary.t_interval is None
    assert single.mean_difference == pytest.approx(0.1)
    nothing = ss.paired_difference({0: 0.5}, {1: 0.3})
    assert nothing.n_shared == 0 and nothing.mean_difference is None
    with pytest.raises(TypeError, match="higher_is_better"):
        ss.paired_difference(a, b, higher_is_better="max")  # type: ignore[arg-type]


def test_pairwise_differences_cover_each_pair_once():
    runs = {"a": {0: 0.5, 1: 0.6}, "b": {0: 0.4, 1: 0.5}, "c": {0: 0.7}}
    out = ss.pairwise_differences(runs, resamples=100)
    assert list(out) == [("a", "b"), ("a", "c"), ("b", "c")]
    assert out[("a", "c")].n_shared == 1
    assert out[("a", "b")].mean_difference == pytest.approx(0.1)


def test_rendering_markdown_and_csv():
    summaries = {
        "ewc": ss.summarize([0.5, 0.7], resamples=100),
        "naive": ss.summarize([0.3, None]),
    }
    md = ss.summary_markdown(summaries, digits=2).splitlines()
    assert md[0] == "| method | n | mean | std | 95% CI (t) | 95% CI (bootstrap) |"
    assert md[3] == "| naive | 1 (+1 absent) | 0.30 | — | — | — |"
    rows = list(csv.DictReader(io.StringIO(ss.summary_csv(summaries))))
    assert [r["method"] for r in rows] == ["ewc", "naive"]
    assert float(rows[0]["std"]) == summaries["ewc"].std
    assert rows[1]["std"] == "" and rows[1]["t_low"] == "" and rows[1]["n_absent"] == "1"

    diffs = ss.pairwise_differences({"ewc": {0: 0.5, 1: 0.7}, "naive": {0: 0.3, 1: 0.2}})
    pmd = ss.paired_markdown(diffs, digits=3).splitlines()
    assert pmd[2].startswith("| ewc - naive | 2 | 0.350 | [")
    assert pmd[2].endswith("| 2 | 0 | 0 |")
    prow = next(csv.DictReader(io.StringIO(ss.paired_csv(diffs))))
    assert (prow["method_a"], prow["method_b"], prow["n_shared"]) == ("ewc", "naive", "2")
    assert float(prow["mean_difference"]) == pytest.approx(0.35)
    assert prow["higher_is_better"] == "True"
    assert ss.summary_markdown({}).count("\n") == 1  # header only


def test_options_are_checked():
    with pytest.raises(ValueError, match="confidence"):
        ss.summarize([0.1, 0.2], confidence=1.0)
    with pytest.raises(ValueError, match="resamples"):
        ss.bootstrap_interval([0.1, 0.2], resamples=0)
    with pytest.raises(ValueError, match="seed"):
        ss.bootstrap_interval([0.1, 0.2], seed=-1)
    with pytest.raises(ValueError, match="finite"):
        ss.summarize([0.1, math.inf])

"""Statistics over seeds: t quantiles against a table, t interval by hand, the bootstrap against a
plain loop, paired differences on a hand example, rendering."""

from __future__ import annotations

import csv
import io
import math
import re
from statistics import NormalDist

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
    s = ss.summarize([0.5, 0.7, None, None, 0.6], resamples=500, seed=3)
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


# ---------------------------------------------------------------------------- hostile input
HOSTILE = '=HYPERLINK("x")|*bold*_[a](b)<i>'


def test_markdown_escapes_method_names():
    from continual_eval._markdown import escape_markdown

    summaries = {HOSTILE: ss.summarize([0.5, 0.7], resamples=100)}
    row = ss.summary_markdown(summaries, digits=2).splitlines()[2]
    assert row.startswith(f"| {escape_markdown(HOSTILE)} | 2 |")
    assert HOSTILE not in row
    diffs = ss.pairwise_differences({HOSTILE: {0: 0.5, 1: 0.7}, "b|c": {0: 0.3, 1: 0.2}})
    line = ss.paired_markdown(diffs, digits=3).splitlines()[2]
    assert line.startswith(f"| {escape_markdown(HOSTILE)} - {escape_markdown('b|c')} | 2 |")
    # every row keeps its column count: no unescaped | in a name
    for text in (row, line):
        assert len(re.findall(r"(?<!\\)\|", text)) == text.count("|") - text.count("\\|")


def test_csv_neutralises_formula_names():
    summaries = {HOSTILE: ss.summarize([0.5, 0.7], resamples=100), "-x": ss.summarize([0.1])}
    rows = list(csv.DictReader(io.StringIO(ss.summary_csv(summaries))))
    assert [r["method"] for r in rows] == ["'" + HOSTILE, "'-x"]
    assert float(rows[0]["mean"]) == pytest.approx(0.6)  # numbers unchanged
    diffs = ss.pairwise_differences({"@a": {0: 0.5, 1: 0.7}, "+b": {0: 0.3, 1: 0.2}})
    prow = next(csv.DictReader(io.StringIO(ss.paired_csv(diffs))))
    assert (prow["method_a"], prow["method_b"]) == ("'@a", "'+b")


def test_mixed_seed_label_types_are_refused_by_name():
    with pytest.raises(
        ValueError, match=r"method 'ewc': seed labels of mixed types: 0 \(int\), '1' \(str\)"
    ):
        ss.summarize_runs({"ewc": {0: 0.5, "1": 0.6}})
    with pytest.raises(ValueError, match=r"seed labels of mixed types: 0 \(int\), '0' \(str\)"):
        ss.paired_difference({0: 0.5, 1: 0.4}, {"0": 0.3})
    with pytest.raises(ValueError, match=r"^the methods' runs: seed labels of mixed types"):
        ss.pairwise_differences({"a": {0: 0.5}, "b": {"0": 0.3}})


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_non_finite_values_are_refused_by_name(bad: float):
    with pytest.raises(ValueError, match=rf"values\[1\] is {bad!r}"):
        ss.summarize([0.5, bad, 0.7])
    with pytest.raises(ValueError, match=rf"method 'ewc', seed 3: the value is {bad!r}"):
        ss.summarize_runs({"ewc": {1: 0.5, 3: bad}})
    with pytest.raises(ValueError, match=rf"method B, seed 2: the value is {bad!r}"):
        ss.paired_difference({2: 0.5, 4: 0.1}, {2: bad, 4: 0.2})
    with pytest.raises(ValueError, match=r"values\[0\] is"):
        ss.t_interval([bad, 1.0])
    with pytest.raises(ValueError, match=r"values\[0\] is"):
        ss.bootstrap_interval([bad, 1.0])


@pytest.mark.parametrize(
    ("values", "what"),
    [
        ([1e308, 1e308], "mean"),  # the sum overflows
        ([1.5e308, 1.5e308, -1.5e308], "mean"),
        ([-1e308, 1e308], "standard deviation"),  # the squared deviations overflow
    ],
)
def test_overflow_is_refused_by_name(values: list[float], what: str):
    with np.errstate(all="ignore"):
        with pytest.raises(ValueError, match=rf"the {what} of values overflows"):
            ss.summarize(values, resamples=50)
        with pytest.raises(ValueError, match=rf"method 'm': the {what} of its values overflows"):
            ss.summarize_runs({"m": dict(enumerate(values))}, resamples=50)


@pytest.mark.parametrize(
    "values",
    [
        [1e308] * 4 + [-1e308] * 4,  # the middle half's sum overflows (its mean is 0)
        [1.7e308] * 5,
    ],
)
def test_iqm_overflow_is_refused_by_name(values: list[float]):
    with pytest.raises(ValueError, match=r"scores: the IQM of values overflows float64"):
        ss.interquartile_mean(values)
    with pytest.raises(ValueError, match=r"scores: the IQM of values overflows float64"):
        ss.summarize_iqm(values, resamples=50)


def test_iqm_bootstrap_overflow_is_refused_by_name():
    values = [1e308, 1e308, -1e308, 0.0]  # IQM 5e307; some resamples' middles overflow
    assert ss.interquartile_mean(values) == 5e307
    with pytest.raises(ValueError, match=r"scores: the bootstrap IQM of values overflows"):
        ss.summarize_iqm(values, resamples=200)


# ---------------------------------------------------------------------------- small samples
def test_caveat_below_ten_runs_names_the_fallback():
    three = ss.summarize([0.70, 0.75, 0.81], resamples=200)
    assert three.caveat is not None and "only 3 runs" in three.caveat
    assert "Student-t interval" in three.caveat
    assert ss.summarize(list(np.linspace(0, 1, 10)), resamples=200).caveat is None
    assert ss.summarize([0.5]).caveat == "1 run: no spread, so no interval of the mean"
    table = ss.summary_markdown({"a|b": three}, caveats=True).splitlines()
    assert table[-1].startswith("- a\\|b: only 3 runs") and table[-2] == ""
    assert ss.summary_markdown({"a": three}).count("\n") == 2  # no notes unless asked


def test_small_sample_coverage_by_simulation():
    """2000 simulated 3-run samples of N(0, 1) (seeded): the percentile bootstrap covers the
    mean far less often than 95% (its interval cannot leave [min, max]); the Student-t
    fall-back covers it at its nominal level (exact for normal data; Monte Carlo SE 0.5)."""
    rng = np.random.default_rng(0)
    t_cover = boot_cover = 0
    for k in range(2000):
        s = ss.summarize(rng.standard_normal(3).tolist(), resamples=200, seed=k)
        assert s.t_interval is not None and s.bootstrap_interval is not None
        t_cover += s.t_interval.low <= 0 <= s.t_interval.high
        boot_cover += s.bootstrap_interval.low <= 0 <= s.bootstrap_interval.high
    assert 0.935 <= t_cover / 2000 <= 0.965
    assert boot_cover / 2000 < 0.85


# ---------------------------------------------------------------------------- rliable aggregates
def test_interquartile_mean_by_hand_and_against_scipy():
    assert ss.interquartile_mean([8.0, 1.0, 2.0, 7.0, 3.0, 6.0, 4.0, 5.0]) == 4.5
    assert ss.interquartile_mean([1.0, 2.0, 3.0, 4.0, 100.0]) == 3.0  # floor(5/4) = 1 cut
    assert ss.interquartile_mean([0.1, 0.3, None]) == pytest.approx(0.2)  # < 4: the mean
    # [runs, tasks] pooled: 1 2 3 4 10 20 30 40, two cut at each end
    assert ss.interquartile_mean([[1, 10], [2, 20], [3, 30], [4, 40]]) == pytest.approx(9.25)
    from scipy.stats import trim_mean

    x = np.random.default_rng(1).normal(size=(7, 3))
    assert ss.interquartile_mean(x) == pytest.approx(trim_mean(x, 0.25, axis=None), rel=1e-15)
    with pytest.raises(ValueError, match=r"scores\[1, 0\] is None"):
        ss.interquartile_mean([[1.0], [None]])
    with pytest.raises(ValueError, match=r"scores\[1\] is inf"):
        ss.summarize_iqm([1.0, math.inf])


def _loop_quantiles(samples: list[float], confidence: float = 0.95) -> tuple[float, float]:
    x = sorted(samples)

    def quantile(q: float) -> float:
        position = q * (len(x) - 1)
        below = math.floor(position)
        above = min(below + 1, len(x) - 1)
        return x[below] + (position - below) * (x[above] - x[below])

    return quantile((1 - confidence) / 2), quantile((1 + confidence) / 2)


def _loop_iqm(values: list[float]) -> float:
    x = sorted(values)
    cut = len(x) // 4
    kept = x[cut : len(x) - cut]
    return sum(kept) / len(kept)


def test_stratified_bootstrap_against_a_plain_loop():
    scores = np.random.default_rng(2).normal(size=(6, 3))
    s = ss.summarize_iqm(scores, resamples=300, seed=4)
    rng = np.random.default_rng(4)
    index = rng.integers(0, 6, size=(300, 6, 3))  # the draws, in the documented order
    columns = [sorted(scores[:, m]) for m in range(3)]
    samples = [
        _loop_iqm([columns[m][index[b, k, m]] for k in range(6) for m in range(3)])
        for b in range(300)
    ]
    low, high = _loop_quantiles(samples)
    assert s.bootstrap_interval is not None
    assert (s.bootstrap_interval.low, s.bootstrap_interval.high) == pytest.approx((low, high))
    assert (s.n_runs, s.n_tasks, s.fallback_interval) == (6, 3, None)  # several tasks: none
    assert s.caveat is not None and "no interval here is reliable" in s.caveat
    # strata: each task is resampled within itself, so constant tasks give no spread at all
    constant = ss.summarize_iqm([[0.0, 1.0]] * 12, resamples=200)
    assert constant.bootstrap_interval == ss.Interval(0.5, 0.5) and constant.caveat is None


def test_yuen_interval_by_hand():
    ci = ss.yuen_interval([1.0, 2.0, 3.0, 4.0, 10.0])  # g = 1, h = 3, winsorized 2 2 3 4 4
    half = ss.t_quantile(0.975, 2) * math.sqrt(4 * 1.0 / (3 * 2))
    assert ci == ss.Interval(pytest.approx(3 - half), pytest.approx(3 + half))
    student = ss.t_interval([0.2, 0.5, 0.4])
    assert student is not None  # g = 0: Student t
    assert ss.yuen_interval([0.2, 0.5, 0.4]) == ss.Interval(
        pytest.approx(student.low, rel=1e-12), pytest.approx(student.high, rel=1e-12)
    )
    assert ss.yuen_interval([0.2]) is None
    one_task = ss.summarize_iqm([0.1, 0.4, 0.35, 0.2, 0.3], resamples=100)
    assert one_task.fallback_interval == ss.yuen_interval([0.1, 0.4, 0.35, 0.2, 0.3])
    assert "Yuen trimmed-mean t interval" in (one_task.caveat or "")


def test_probability_of_improvement_by_hand_and_against_mann_whitney():
    # x = 1: beats 0 (1); x = 2: ties 2, 2 (1), beats 0 (1); x = 3: beats all (3): 6 / 9
    assert ss.probability_of_improvement([1, 2, 3], [2, 2, 0]) == pytest.approx(6 / 9)
    assert ss.probability_of_improvement([[1, 0], [2, 0]], [[0, 1], [0, 1]]) == 0.5  # 1 and 0
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 5, size=(7, 2)), rng.integers(0, 5, size=(9, 2))  # many ties
    u = [mannwhitneyu(x[:, m], y[:, m], alternative="greater").statistic for m in range(2)]
    assert ss.probability_of_improvement(x, y) == pytest.approx(np.mean(u) / 63, rel=1e-12)
    lower = ss.probability_of_improvement(x, y, higher_is_better=False)
    assert lower == pytest.approx(1 - ss.probability_of_improvement(x, y), rel=1e-12)
    with pytest.raises(ValueError, match="x has 2 tasks and y has 1"):
        ss.probability_of_improvement(x, [1.0, 2.0])


def test_improvement_bootstrap_against_a_plain_loop():
    x = np.random.default_rng(5).normal(0.3, 1, size=(5, 2))
    y = np.random.default_rng(6).normal(0.0, 1, size=(4, 2))
    s = ss.summarize_improvement(x, y, resamples=200, seed=9)
    first, second = (np.random.default_rng(q) for q in np.random.SeedSequence(9).spawn(2))
    ix, iy = first.integers(0, 5, (200, 5, 2)), second.integers(0, 4, (200, 4, 2))
    xs, ys = np.sort(x, axis=0), np.sort(y, axis=0)
    samples = []
    for b in range(200):
        per_task = []
        for m in range(2):
            a = [xs[ix[b, i, m], m] for i in range(5)]
            c = [ys[iy[b, k, m], m] for k in range(4)]
            wins = sum((u > v) + 0.5 * (u == v) for u in a for v in c)
            per_task.append(wins / 20)
        samples.append(sum(per_task) / 2)
    assert s.bootstrap_interval is not None
    assert (s.bootstrap_interval.low, s.bootstrap_interval.high) == pytest.approx(
        _loop_quantiles(samples)
    )
    assert s.fallback_interval == ss.brunner_munzel_interval(x, y)
    assert s.caveat is not None and "Brunner-Munzel interval" in s.caveat


def test_brunner_munzel_against_scipy_and_the_formula():
    from scipy.stats import brunnermunzel, rankdata, t

    x = [0.61, 0.70, 0.66, 0.72, 0.58, 0.70]
    y = [0.55, 0.62, 0.58, 0.60, 0.64]
    ci = ss.brunner_munzel_interval(x, y)
    p = ss.probability_of_improvement(x, y)
    # by the paper's formulas, with plain lists
    n_x, n_y = len(x), len(y)
    overall = rankdata(x + y)
    s2 = []
    for values, mine in ((x, overall[:n_x]), (y, overall[n_x:])):
        placement = [r - q for r, q in zip(mine, rankdata(values), strict=True)]
        mean = sum(placement) / len(placement)
        s2.append(sum((v - mean) ** 2 for v in placement) / (len(placement) - 1))
    se = math.sqrt(n_x * s2[0] + n_y * s2[1]) / (n_x * n_y)
    df = (n_x * s2[0] + n_y * s2[1]) ** 2 / (
        (n_x * s2[0]) ** 2 / (n_x - 1) + (n_y * s2[1]) ** 2 / (n_y - 1)
    )
    half = t.ppf(0.975, df) * se
    assert ci == ss.Interval(pytest.approx(p - half), pytest.approx(min(1.0, p + half)))
    # scipy's Brunner-Munzel statistic of (y, x) is (p - 1/2) / se, its p-value uses df
    result = brunnermunzel(y, x)
    assert result.statistic == pytest.approx((p - 0.5) / se, rel=1e-12)
    assert result.pvalue == pytest.approx(2 * t.sf(abs((p - 0.5) / se), df), rel=1e-9)
    assert ss.brunner_munzel_interval([1.0, 2.0], [3.0, 4.0]) is None  # no overlap: undefined


def test_fallback_coverage_by_simulation():
    """Seeded: Yuen's interval of the IQM of 8 runs of N(0, 1) (true IQM 0) covers at about
    its nominal level; Brunner-Munzel's interval of P(X > Y) for 6 runs each (X ~ N(0.5, 1),
    Y ~ N(0, 1), true Phi(0.5 / sqrt 2)) is approximate at this size: slightly below."""
    rng = np.random.default_rng(7)
    yuen = bm = 0
    truth = NormalDist().cdf(0.5 / math.sqrt(2))
    for k in range(2000):
        iqm = ss.summarize_iqm(rng.standard_normal(8).tolist(), resamples=20, seed=k)
        assert iqm.fallback_interval is not None
        yuen += iqm.fallback_interval.low <= 0 <= iqm.fallback_interval.high
        x, y = rng.standard_normal(6) + 0.5, rng.standard_normal(6)
        ci = ss.brunner_munzel_interval(x, y)
        bm += ci is not None and ci.low <= truth <= ci.high
    assert 0.93 <= yuen / 2000 <= 0.97
    assert 0.92 <= bm / 2000 <= 0.97


def test_rliable_tables_escape_and_neutralise_names():
    from continual_eval._markdown import escape_markdown

    iqm = {HOSTILE: ss.summarize_iqm([0.1, 0.4, 0.35, 0.2, 0.3], resamples=50)}
    text = ss.iqm_markdown(iqm)
    assert f"| {escape_markdown(HOSTILE)} | 5 | 1 |" in text and HOSTILE not in text
    assert text.splitlines()[-1].startswith(f"- {escape_markdown(HOSTILE)}: only 5 runs")
    row = next(csv.DictReader(io.StringIO(ss.iqm_csv(iqm))))
    assert row["method"] == "'" + HOSTILE and float(row["iqm"]) == pytest.approx(0.85 / 3)
    pair = {(HOSTILE, "b"): ss.summarize_improvement([1, 2, 3], [0, 1, 2], resamples=50)}
    assert f"| {escape_markdown(HOSTILE)} over b | 3 | 3 |" in ss.improvement_markdown(pair)
    prow = next(csv.DictReader(io.StringIO(ss.improvement_csv(pair))))
    assert prow["method_x"] == "'" + HOSTILE and prow["method_y"] == "b"

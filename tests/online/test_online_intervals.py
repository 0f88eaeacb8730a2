"""Wilson intervals of the online window accuracies: from the stored counts (results.json), in
the logs (``.../lo`` ``.../hi``) and the report's tables, against scipy's Wilson interval; and
their coverage on an autocorrelated stream, measured by a seeded simulation with the package's
own label generator (the numbers the report's note and docs/online.md state)."""

from __future__ import annotations

import csv
import io
import math

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from online_helpers import Learner, loader, make_net, run_stream, trainer
from scipy.stats import binomtest
from scipy.stats import t as student_t

from continual_eval._online_report import (
    INTERVAL_NOTE,
    WILSON_COVERAGE,
    WINDOWS_COVERAGE,
    online_score_rows,
    online_windows_csv,
)
from continual_eval.functional.intervals import wilson_interval, window_means_interval
from continual_eval.online import OnlineEvalCallback, read_online
from continual_eval.online.synthetic import autocorrelated_labels
from continual_eval.results.schema import BLIND_PREDICTORS


def _scipy(correct: int, total: int) -> tuple[float, float]:
    ci = binomtest(int(correct), int(total)).proportion_ci(0.95, method="wilson")
    return ci.low, ci.high


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real online run (CSVLogger), windows of 4 batches of 8, a near-future score."""
    tmp_path = tmp_path_factory.mktemp("online_intervals")
    x, y = run_stream(200, 20, seed=3)
    logger = CSVLogger(tmp_path, name="csv")
    cb = OnlineEvalCallback(near_future_delays=[2], window_batches=4, verbose=False)
    trainer(tmp_path, [cb], logger=logger).fit(Learner(make_net()), loader(x, y, 8))
    return read_online(cb.results_dir), cb.results_dir


def test_window_and_stream_intervals_match_scipy_wilson(run):
    online, _ = run
    assert len(online.windows) > 3
    for score in online.score_names():
        for blind in (None, *BLIND_PREDICTORS):
            low, high = online.window_interval(score, blind)
            for k, w in enumerate(online.windows):
                counts = w.scores[score]
                correct = counts.correct if blind is None else counts.blind[blind]
                if counts.total == 0:
                    assert low[k].isnan() and high[k].isnan()
                    continue
                assert (float(low[k]), float(high[k])) == pytest.approx(
                    _scipy(correct, counts.total), abs=1e-12
                )
            correct = sum(
                w.scores[score].correct if blind is None else w.scores[score].blind[blind]
                for w in online.windows
            )
            total = sum(w.scores[score].total for w in online.windows)
            assert online.accuracy_interval(score, blind, method="wilson") == pytest.approx(
                _scipy(correct, total), abs=1e-12
            )


def _windows_by_hand(correct: list[int], total: list[int]) -> tuple[float, float] | None:
    """Batch means over the windows, written out with a plain loop (the pooled proportion, the
    windows' linearised deviations, their mean squared successive difference, a t quantile),
    joined with scipy's Wilson interval of the pooled counts (that alone without a spread)."""
    pairs = [(c, n) for c, n in zip(correct, total, strict=True) if n > 0]
    if not pairs:
        return None
    low, high = _scipy(sum(c for c, _ in pairs), sum(n for _, n in pairs))
    k = len(pairs)
    if k < 2:
        return low, high
    p = sum(c for c, _ in pairs) / sum(n for _, n in pairs)
    nbar = sum(n for _, n in pairs) / k
    z = [(c - p * n) / nbar for c, n in pairs]
    v = sum((z[w + 1] - z[w]) ** 2 for w in range(k - 1)) / (2 * (k - 1))
    if v == 0:
        return low, high
    half = student_t.ppf(0.975, k - 1) * math.sqrt(v / k)
    return min(low, max(p - half, 0.0)), max(high, min(p + half, 1.0))


def test_stream_intervals_are_batch_means_over_the_windows(run):
    """The default interval of the stream accuracy (``method="windows"``), learner's and blind
    predictors', equals a plain loop's batch means over the windows (empty windows skipped)
    joined with the pooled counts' Wilson interval; windows that all agree: Wilson alone."""
    online, _ = run
    checked = 0
    for score in online.score_names():
        for blind in (None, *BLIND_PREDICTORS):
            correct = [
                w.scores[score].correct if blind is None else w.scores[score].blind[blind]
                for w in online.windows
            ]
            total = [w.scores[score].total for w in online.windows]
            want = _windows_by_hand(correct, total)
            got = online.accuracy_interval(score, blind)
            if want is None:
                assert got is None
                continue
            assert got == pytest.approx(want, abs=1e-12)
            checked += 1
    assert checked > 3
    with pytest.raises(ValueError, match="method must be 'windows' or 'wilson'"):
        online.accuracy_interval("online", method="bootstrap")


def test_logged_lo_hi_are_the_window_intervals(run):
    online, results_dir = run
    rows = list(csv.DictReader(io.StringIO((results_dir / "metrics.csv").read_text())))
    for key, score, blind in [
        ("online/acc", "online", None),
        ("online/blind_last/acc", "online", "last"),
        ("online/near_future/2/acc", "near_future/2", None),
        ("online/blind_mode/near_future/2/acc", "near_future/2", "mode"),
    ]:
        logged = [(float(r[f"{key}/lo"]), float(r[f"{key}/hi"])) for r in rows if r[key]]
        expected = []
        for w in online.windows:
            counts = w.scores[score]
            if counts.total:
                correct = counts.correct if blind is None else counts.blind[blind]
                expected.append(_scipy(correct, counts.total))
        assert len(logged) == len(expected) > 0
        for got, want in zip(logged, expected, strict=True):
            assert got == pytest.approx(want, abs=1e-6)


def test_report_tables_show_value_and_interval(run):
    online, _ = run
    rows = online_score_rows(online)
    entry = online.summary()["scores"]["online"]
    low, high = _scipy(
        sum(w.scores["online"].correct for w in online.windows),
        sum(w.scores["online"].total for w in online.windows),
    )
    low, high = _windows_by_hand(
        [w.scores["online"].correct for w in online.windows],
        [w.scores["online"].total for w in online.windows],
    )
    assert rows[0][1] == f"{entry['accuracy']:.4f} [{low:.4f}, {high:.4f}]"
    last = BLIND_PREDICTORS.index("last")
    blow, bhigh = _windows_by_hand(
        [w.scores["online"].blind["last"] for w in online.windows],
        [w.scores["online"].total for w in online.windows],
    )
    assert rows[0][2 + last].endswith(f" [{blow:.4f}, {bhigh:.4f}]")
    table = list(csv.DictReader(io.StringIO(online_windows_csv(online))))
    for row, w in zip(table, online.windows, strict=True):
        counts = w.scores["near_future/2"]
        if not counts.total:
            assert row["near_future/2/acc_lo"] == ""
            continue
        assert (
            float(row["near_future/2/acc_lo"]),
            float(row["near_future/2/acc_hi"]),
        ) == pytest.approx(_scipy(counts.correct, counts.total), abs=1e-9)
        want = _scipy(counts.blind["prior"], counts.total)
        got = (
            float(row["near_future/2/blind_prior/acc_lo"]),
            float(row["near_future/2/blind_prior/acc_hi"]),
        )
        assert got == pytest.approx(want, abs=1e-9)
    assert "independent" in INTERVAL_NOTE
    assert f"{WILSON_COVERAGE['runs of 150']:.2%}" in INTERVAL_NOTE


def _coverage(run_length: int | None, *, window: int = 500, windows: int = 4000, seed: int = 0):
    """The share of windows whose nominal 95 % Wilson interval covers the true accuracy of a
    fixed predictor (right with probability ``p[y]``, ``p`` from 0.50 to 0.95 over 10 classes;
    true accuracy ``mean(p)``, the labels' stationary distribution being uniform), with labels
    iid (``None``) or from ``autocorrelated_labels`` in runs of ``run_length``."""
    g = torch.Generator().manual_seed(seed)
    classes = 10
    p = torch.linspace(0.5, 0.95, classes, dtype=torch.float64)
    n = window * windows
    if run_length is None:
        y = torch.randint(0, classes, (n,), generator=g)
    else:
        y = autocorrelated_labels(n, classes, run_length, generator=g)
    right = torch.rand(n, generator=g, dtype=torch.float64) < p[y]
    correct = right.view(windows, window).sum(1)
    low, high = wilson_interval(correct, torch.full_like(correct, window))
    truth = p.mean()
    return float(((low <= truth) & (truth <= high)).double().mean())


def test_wilson_coverage_iid_and_autocorrelated_as_stated():
    iid = _coverage(None)
    assert 0.94 <= iid <= 0.96
    assert iid == pytest.approx(WILSON_COVERAGE["iid"], abs=1e-9)
    runs10 = _coverage(10)
    assert runs10 == pytest.approx(WILSON_COVERAGE["runs of 10"], abs=1e-9)
    runs150 = _coverage(150)
    assert runs150 == pytest.approx(WILSON_COVERAGE["runs of 150"], abs=1e-9)
    assert runs150 < runs10 < 0.94  # it undercovers, the more the longer the runs
    stream = _coverage(150, window=12000, windows=2000)  # the counts pooled over a whole stream
    assert stream == pytest.approx(WILSON_COVERAGE["stream of 12000, runs of 150"], abs=1e-9)


def _stream_coverage(run_length: int | None, *, drift: float = 0.0, streams: int = 2000):
    """The share of streams (24 windows of 500 predictions) whose nominal 95 % interval of
    ``accuracy_interval`` (batch means joined with the pooled Wilson interval) covers the
    expected stream accuracy: the fixed predictor of `_coverage`, optionally learning (its
    accuracy ``drift`` lower at the stream's start, rising linearly to ``p[y]``), labels iid or
    in runs; one generator call for all streams (seed 1)."""
    g = torch.Generator().manual_seed(1)
    classes, windows, window = 10, 24, 500
    p = torch.linspace(0.5, 0.95, classes, dtype=torch.float64)
    n = windows * window
    if run_length is None:
        y = torch.randint(0, classes, (streams * n,), generator=g)
    else:
        y = autocorrelated_labels(streams * n, classes, run_length, generator=g)
    ramp = torch.linspace(-drift, 0.0, n, dtype=torch.float64)
    prob = p[y].view(streams, n) + ramp
    right = torch.rand(streams, n, generator=g, dtype=torch.float64) < prob
    correct = right.view(streams, windows, window).sum(2)
    truth = float(p.mean() + ramp.mean())
    total = torch.full((windows,), window)
    pooled = wilson_interval(correct.sum(1), torch.full((streams,), n))
    covered = 0
    for c, wilson_low, wilson_high in zip(correct, *pooled, strict=True):
        low, high = window_means_interval(c, total)  # joined with the pooled Wilson interval
        low, high = min(low, float(wilson_low)), max(high, float(wilson_high))
        covered += low <= truth <= high
    return covered / streams


def test_stream_interval_coverage_by_simulation_as_stated():
    """Batch means over the windows cover at the nominal rate where Wilson does not: iid labels,
    runs of 150 (Wilson: 41.55 %), and runs of 150 with a learner whose accuracy rises by 0.2
    over the stream (the windows' spread includes that drift; the successive differences mostly
    do not)."""
    for key, (run_length, drift) in {
        "iid": (None, 0.0),
        "runs of 150": (150, 0.0),
        "runs of 150, learning": (150, 0.2),
    }.items():
        coverage = _stream_coverage(run_length, drift=drift)
        assert 0.93 <= coverage <= 0.97, (key, coverage)
        assert coverage == pytest.approx(WINDOWS_COVERAGE[key], abs=1e-9), key
    assert f"{WINDOWS_COVERAGE['runs of 150']:.2%}" in INTERVAL_NOTE


@pytest.mark.parametrize(
    ("successes", "trials", "window"),
    [
        ([3.0, float("nan")], [5, 5], 1),
        ([3, 6], [5, 5], 1),
        ([-1, 2], [5, 5], 0),
        ([3, 2], [5, float("inf")], 1),
    ],
)
def test_window_means_refuses_impossible_counts_naming_the_window(successes, trials, window):
    with pytest.raises(ValueError, match=rf"window {window} has .* 0 <= successes <= trials"):
        window_means_interval(torch.tensor(successes), torch.tensor(trials))


def test_window_means_needs_one_count_per_window():
    with pytest.raises(ValueError, match="one count per window"):
        window_means_interval(torch.tensor([1, 2, 3]), torch.tensor([5, 5]))
    assert window_means_interval(torch.tensor([2]), torch.tensor([5])) is None  # one window
    assert window_means_interval(torch.tensor([2, 2]), torch.tensor([5, 5])) is None  # no spread

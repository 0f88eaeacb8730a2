"""``continual-eval report``: uncertainty across seeds. The Student-t and bootstrap intervals in
report.md and the CSV files equal an independent computation here (``scipy.stats.t.interval``
and a one-index-at-a-time bootstrap loop), paired differences and win counts equal a hand count
(direction per metric), one run shows no interval, the chart draws exactly the t intervals,
reference models' runs are not listed, and the reference kind is named."""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import scipy.stats
import torch

from continual_eval.report import (
    REFERENCE_DIR_NAMES,
    Run,
    find_runs,
    markdown_table,
    run_cost,
    summarise,
)
from continual_eval.report import main as report_main
from continual_eval.results import ContinualResults, RunCost, ScoreMatrix, StepEvaluations

NAN = math.nan
BASELINE = [0.5, 0.48, 0.52]
REFERENCE = [0.98, 0.97, 0.96]
KEYS = ("acc", "bwt", "fwt", "forgetting", "intransigence")
#: method -> {seed: (R[1, 0], R[2, 0], R[2, 1], R[2, 2])}: every metric differs per run
RUNS: dict[str, dict[int, tuple[float, float, float, float]]] = {
    "ewc": {0: (0.80, 0.70, 0.75, 0.93)},
    "naive": {
        0: (0.60, 0.52, 0.58, 0.96),
        1: (0.62, 0.50, 0.61, 0.95),
        2: (0.70, 0.58, 0.66, 0.94),
        3: (0.55, 0.45, 0.57, 0.97),
    },
    "replay": {
        1: (0.93, 0.90, 0.91, 0.93),
        2: (0.66, 0.60, 0.59, 0.92),
        3: (0.91, 0.88, 0.90, 0.95),
        4: (0.90, 0.86, 0.92, 0.90),
    },
}


def matrix(cells: tuple[float, float, float, float], seed: int) -> list[list[float]]:
    r10, r20, r21, r22 = cells  # FWT from R[0, 1] and R[1, 2]: varies with them
    return [
        [0.97 - seed / 100, 0.30 + r10 / 5, NAN],
        [r10, 0.95 + seed / 200, 0.60 - r22 / 4],
        [r20, r21, r22],
    ]


def write_run(root: Path, method: str, seed: int, **meta: Any) -> Path:
    run = root / method / f"version_{seed}"
    scores = ScoreMatrix(
        "accuracy",
        torch.tensor(matrix(RUNS[method][seed], seed), dtype=torch.float64),
        torch.tensor(BASELINE, dtype=torch.float64),
    )
    metadata = {"method": method, "seed": seed, "reference": REFERENCE, **meta}
    ContinualResults.from_tensors({"acc": scores}, metadata=metadata).write(run)
    return run


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    for method, seeds in RUNS.items():
        for seed in seeds:
            write_run(root, method, seed, reference_kind="isolated")
    return root


def values_of(root: Path) -> dict[str, dict[str, dict[int, float]]]:
    """metric -> method -> {seed: value}, read back from results.json (intransigence by hand)."""
    out: dict[str, dict[str, dict[int, float]]] = {k: {} for k in KEYS}
    for method, seeds in RUNS.items():
        for seed in seeds:
            doc = json.loads((root / method / f"version_{seed}" / "results.json").read_text())
            R = doc["scores"]
            for key in KEYS[:4]:
                out[key].setdefault(method, {})[seed] = doc["metrics"][key]
            intr = sum(REFERENCE[j] - R[j][j] for j in range(3)) / 3
            out["intransigence"].setdefault(method, {})[seed] = intr
    return out


def t_ci(values: list[float]) -> tuple[float, float]:
    mean = statistics.mean(values)
    return scipy.stats.t.interval(0.95, len(values) - 1, loc=mean, scale=scipy.stats.sem(values))


def loop_bootstrap(values: list[float], resamples: int, seed: int) -> tuple[float, float]:
    """One index at a time from numpy's generator over the sorted values, a hand quantile."""
    x = sorted(values)
    rng = np.random.default_rng(seed)
    means = sorted(
        sum(x[int(rng.integers(0, len(x)))] for _ in x) / len(x) for _ in range(resamples)
    )

    def quantile(q: float) -> float:
        position = q * (len(means) - 1)
        below = math.floor(position)
        above = min(below + 1, len(means) - 1)
        return means[below] + (position - below) * (means[above] - means[below])

    return quantile(0.025), quantile(0.975)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def section(text: str, title: str) -> list[list[str]]:
    """The cells of the rows of the tables under ``### title``, up to the next heading."""
    start = text.index(f"\n### {title} (")
    end = min(i for i in (text.find("\n#", start + 1), len(text)) if i > 0)
    return [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text[start:end].splitlines()
        if line.startswith("| ") and not line.startswith("| method") and "A - B |" not in line
    ]


def interval(low: float, high: float) -> str:
    return f"[{low:.4f}, {high:.4f}]"


RESAMPLES, BOOT_SEED = 2000, 7
HIGHER = {"acc": True, "bwt": True, "fwt": True, "forgetting": False, "intransigence": False}


def test_intervals_against_an_independent_computation(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    argv = [str(runs), "--out", str(out), "--resamples", str(RESAMPLES)]
    assert report_main([*argv, "--bootstrap-seed", str(BOOT_SEED)]) == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    assert f"**{RESAMPLES} resamples**" in text and f"default_rng({BOOT_SEED})" in text
    assert f"**bootstrap seed {BOOT_SEED}**" in text
    rows = {(r["metric"], r["method"]): r for r in read_csv(out / "seed_statistics.csv")}
    assert len(rows) == len(KEYS) * len(RUNS)
    values = values_of(runs)
    for key in KEYS:
        table = {cells[0]: cells for cells in section(text, _title(key))[: len(RUNS)]}
        direction = "higher" if HIGHER[key] else "lower"
        assert f"### {_title(key)} ({direction} is better)" in text
        for method, by_seed in values[key].items():
            row, cells = rows[(key, method)], table[method]
            assert row["higher_is_better"] == str(HIGHER[key])
            assert int(row["n"]) == len(by_seed) and cells[1] == str(len(by_seed))  # n shown
            assert (row["resamples"], row["bootstrap_seed"]) == (str(RESAMPLES), str(BOOT_SEED))
            x = [by_seed[s] for s in sorted(by_seed)]
            assert float(row["mean"]) == pytest.approx(statistics.mean(x), abs=1e-12)
            assert cells[2] == f"{statistics.mean(x):.4f}"
            if len(x) == 1:  # one run: no spread, no interval, in both tables
                assert row["std"] == row["t_low"] == row["bootstrap_high"] == ""
                assert cells[3:] == ["—", "—", "—"]
                continue
            low, high = t_ci(x)
            assert float(row["t_low"]) == pytest.approx(low, abs=1e-12)
            assert float(row["t_high"]) == pytest.approx(high, abs=1e-12)
            b_low, b_high = loop_bootstrap(x, RESAMPLES, BOOT_SEED)
            assert float(row["bootstrap_low"]) == pytest.approx(b_low, abs=1e-12)
            assert float(row["bootstrap_high"]) == pytest.approx(b_high, abs=1e-12)
            assert cells[3] == f"{statistics.stdev(x):.4f}"
            assert cells[4:] == [interval(low, high), interval(b_low, b_high)]
    # the t quantile of n = 4 against the printed table: 3.182
    x = list(values["acc"]["naive"].values())
    half = (float(rows[("acc", "naive")]["t_high"]) - float(rows[("acc", "naive")]["t_low"])) / 2
    assert half == pytest.approx(3.182 * statistics.stdev(x) / 2, rel=2e-4)


def _title(key: str) -> str:
    from continual_eval.report import REPORT_METRICS

    return REPORT_METRICS[key]


def test_paired_differences_and_win_counts_by_hand(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    argv = [str(runs), "--out", str(out), "--resamples", str(RESAMPLES)]
    assert report_main([*argv, "--bootstrap-seed", str(BOOT_SEED)]) == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    rows = {
        (r["metric"], r["method_a"], r["method_b"]): r
        for r in read_csv(out / "paired_differences.csv")
    }
    pairs = [("ewc", "naive"), ("ewc", "replay"), ("naive", "replay")]  # first-seen order
    assert len(rows) == len(KEYS) * len(pairs)
    values = values_of(runs)
    flipped = False
    for key in KEYS:
        table = {cells[0]: cells for cells in section(text, _title(key))[len(RUNS) :]}
        assert list(table) == [f"{a} - {b}" for a, b in pairs]
        for a, b in pairs:
            row, cells = rows[(key, a, b)], table[f"{a} - {b}"]
            shared = sorted(set(values[key][a]) & set(values[key][b]))
            d = [values[key][a][s] - values[key][b][s] for s in shared]
            xa = [values[key][a][s] for s in shared]
            xb = [values[key][b][s] for s in shared]
            higher = sum(p > q for p, q in zip(xa, xb, strict=True))
            lower = sum(p < q for p, q in zip(xa, xb, strict=True))
            ties = sum(p == q for p, q in zip(xa, xb, strict=True))
            a_better, b_better = (higher, lower) if HIGHER[key] else (lower, higher)
            flipped |= higher != lower
            assert json.loads(row["shared_seeds"]) == shared
            assert int(row["n_shared"]) == len(shared) and cells[1] == str(len(shared))
            assert (int(row["a_better"]), int(row["b_better"]), int(row["ties"])) == (
                a_better,
                b_better,
                ties,
            )
            assert cells[5:] == [str(a_better), str(b_better), str(ties)]
            assert row["higher_is_better"] == str(HIGHER[key])
            if not shared:  # ewc (seed 0) and replay (seeds 1-4) share none
                assert row["mean_difference"] == "" and cells[2:5] == ["—", "—", "—"]
                continue
            assert float(row["mean_difference"]) == pytest.approx(statistics.mean(d), abs=1e-12)
            if len(d) == 1:  # one shared seed: a difference, no interval
                assert row["t_low"] == row["bootstrap_low"] == "" and cells[3:5] == ["—", "—"]
                continue
            low, high = t_ci(d)
            b_low, b_high = loop_bootstrap(d, RESAMPLES, BOOT_SEED)
            assert float(row["t_low"]) == pytest.approx(low, abs=1e-12)
            assert float(row["t_high"]) == pytest.approx(high, abs=1e-12)
            assert float(row["bootstrap_low"]) == pytest.approx(b_low, abs=1e-12)
            assert float(row["bootstrap_high"]) == pytest.approx(b_high, abs=1e-12)
            assert cells[3:5] == [interval(low, high), interval(b_low, b_high)]
    assert flipped  # the data tell the directions apart
    # naive vs replay over seeds 1-3: replay wins ACC on seeds 1 and 3, naive on seed 2
    assert rows[("acc", "naive", "replay")]["a_better"] == "1"
    # naive forgets more on seeds 1 and 3 (0.4025 vs 0.0525, 0.4425 vs 0.0625), less on seed 2:
    # lower is better, so replay is better on two seeds
    assert rows[("forgetting", "naive", "replay")]["a_better"] == "1"
    assert rows[("forgetting", "naive", "replay")]["b_better"] == "2"


def test_metric_panels_draw_the_t_intervals(runs: Path, tmp_path: Path, monkeypatch) -> None:
    """metrics.png: one panel per metric with its own y scale (3-decimal ticks, the direction as
    an arrow in its title), error bars exactly at each method's t interval where n >= 2, none for
    one run, each value written with 3 decimals; one legend names the methods and the bars."""
    import matplotlib.image as mpimg
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    drawn: list[tuple[float, float, float]] = []
    legends: list[list[str]] = []
    saved: list[Figure] = []
    errorbar, legend, savefig = Axes.errorbar, Figure.legend, Figure.savefig

    def spy_errorbar(self, x, y, *args, yerr=None, **kwargs):
        drawn.append((float(y[0]), float(y[0] - yerr[0][0]), float(y[0] + yerr[1][0])))
        return errorbar(self, x, y, *args, yerr=yerr, **kwargs)

    def spy_legend(self, *args, **kwargs):
        result = legend(self, *args, **kwargs)
        legends.append([t.get_text() for t in result.get_texts()])
        return result

    def spy_savefig(self, path, *args, **kwargs):
        if Path(path).name == "metrics.png":
            saved.append(self)
        return savefig(self, path, *args, **kwargs)

    monkeypatch.setattr(Axes, "errorbar", spy_errorbar)
    monkeypatch.setattr(Figure, "legend", spy_legend)
    monkeypatch.setattr(Figure, "savefig", spy_savefig)
    out = tmp_path / "report"
    assert report_main([str(runs), "--out", str(out)]) == 0
    stats = read_csv(out / "seed_statistics.csv")
    expected = [(r["mean"], r["t_low"], r["t_high"]) for r in stats if r["t_low"]]
    assert len(expected) == len(KEYS) * 2  # naive and replay; ewc (one run) has none
    flat = [v for bar in sorted(tuple(map(float, e)) for e in expected) for v in bar]
    assert [v for bar in sorted(drawn) for v in bar] == pytest.approx(flat, abs=1e-12)
    assert legends == [
        ["ewc (n=1)", "naive (n=4)", "replay (n=4)", "95% Student-t interval of the mean (n ≥ 2)"]
    ]
    (fig,) = saved
    panels = [ax for ax in fig.axes if ax.get_visible()]
    arrows = {True: "↑", False: "↓"}
    assert [ax.get_title() for ax in panels] == [f"{_title(k)} {arrows[HIGHER[k]]}" for k in KEYS]
    for ax, key in zip(panels, KEYS, strict=True):
        rows = [r for r in stats if r["metric"] == key]
        values = [float(r["mean"]) for r in rows]
        ends = [float(r[c]) for r in rows for c in ("t_low", "t_high") if r[c]] + values
        low, high = ax.get_ylim()
        assert low <= min(0.0, *ends) and max(0.0, *ends) <= high  # its own scale holds them
        assert high - low < 3 * (max(0.0, *ends) - min(0.0, *ends))  # and is not much wider
        fig.canvas.draw()
        ticks = [t.get_text().replace("−", "-") for t in ax.get_yticklabels() if t.get_text()]
        assert ticks and all(re.fullmatch(r"-?\d+\.\d{3}", t) for t in ticks), ticks
        written = [t.get_text() for t in ax.texts]
        assert written == [f"{v:.3f}" for v in values], (key, written)
    height, width, _ = mpimg.imread(out / "metrics.png").shape
    assert height > 400 and width > 800
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "Error bars: the 95% Student-t interval of the mean" in text
    assert "One panel per metric, each with its own scale" in text


def test_default_resamples_stated_and_one_run_no_interval(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    one = write_run(root, "naive", 0)
    out = tmp_path / "one"
    assert report_main([str(one), "--out", str(out)]) == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "One run: no interval across seeds." in text and "Uncertainty" not in text
    assert "±" not in text.split("![metrics")[0].split("\n| naive")[1]
    write_run(root, "naive", 1)
    out = tmp_path / "two"
    assert report_main([str(root), "--out", str(out)]) == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "**10000 resamples**" in text and "default_rng(0)" in text
    assert not (out / "paired_differences.csv").exists()  # one method: no pairs


def test_lower_is_better_primary_flips_acc_only(tmp_path: Path) -> None:
    """A loss as the primary score: ACC is lower-is-better, BWT/FWT stay higher-is-better,
    forgetting stays lower-is-better."""
    for method, shift in (("a", 0.0), ("b", 0.1)):
        for seed in (0, 1):
            loss = [[0.4, 1.9, 2.1], [0.95, 0.35, 1.8], [1.2 + shift + seed / 10, 0.7, 0.3]]
            results = ContinualResults.from_tensors(
                {
                    "loss": ScoreMatrix(
                        "cross_entropy",
                        torch.tensor(loss, dtype=torch.float64),
                        torch.tensor([2.2, 2.0, 2.3], dtype=torch.float64),
                        higher_is_better=False,
                        bounds=None,
                    )
                },
                metadata={"method": method, "seed": seed},
            )
            results.write(tmp_path / method / f"version_{seed}")
    out = tmp_path / "report"
    assert report_main([str(tmp_path), "--out", str(out)]) == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    for title, direction in (("ACC", "lower"), ("BWT", "higher"), ("Forgetting", "lower")):
        assert f"### {title} ({direction} is better)" in text
    rows = {r["metric"]: r for r in read_csv(out / "paired_differences.csv")}
    assert rows["acc"]["higher_is_better"] == "False" and rows["bwt"]["higher_is_better"] == "True"
    assert rows["acc"]["a_better"] == "2"  # a's loss is lower on both seeds


def test_reference_runs_not_listed_and_kind_named(tmp_path: Path) -> None:
    from continual_eval.references import REFERENCE_DIRS

    assert set(REFERENCE_DIR_NAMES) == set(REFERENCE_DIRS.values())
    root = tmp_path / "runs"
    isolated = write_run(root, "naive", 0, reference_kind="isolated")
    joint = write_run(root, "replay", 1, reference_kind="joint")
    for j in range(3):  # what ``continual-eval fit`` writes for the references
        write_run(isolated / "isolated_reference" / f"task_{j}", "naive", 0)
    write_run(joint / "joint_reference", "replay", 1)
    found = find_runs([root])
    assert [r.path for r in found] == [isolated, joint]
    out = tmp_path / "report"
    assert report_main([str(root), "--out", str(out)]) == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    assert text.startswith("# Continual-evaluation report\n\n2 run(s).")
    assert "isolated\\_reference" not in text and "joint\\_reference" not in text
    assert "(isolated-training reference (each task trained alone); joint-training" in text
    assert "intransigence=" in text and "(against the isolated-training reference" in text
    # one kind: named alone; an unknown kind is escaped
    only = write_run(tmp_path / "other", "naive", 0, reference_kind="<b>mine</b>")
    assert report_main([str(only), "--out", str(tmp_path / "r2")]) == 0
    text = (tmp_path / "r2" / "report.md").read_text(encoding="utf-8")
    assert "intransigence = the score of the &lt;b&gt;mine&lt;/b&gt; reference minus" in text
    assert "<b>" not in text
    legacy = write_run(tmp_path / "legacy", "naive", 0)  # a reference without a kind: joint
    assert report_main([str(legacy), "--out", str(tmp_path / "r3")]) == 0
    text = (tmp_path / "r3" / "report.md").read_text(encoding="utf-8")
    assert "the score of the joint-training reference minus" in text


def test_unpaired_runs_noted(tmp_path: Path) -> None:
    """A run without a seed, or two runs of one method with one seed, are not paired."""
    root = tmp_path / "runs"
    for method in ("naive", "replay"):
        for seed in (1, 2):
            write_run(root, method, seed)
    twin = root / "naive" / "version_9"
    ContinualResults.load(root / "naive" / "version_1").write(twin)
    out = tmp_path / "report"
    assert report_main([str(root), "--out", str(out)]) == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "2 run(s) without a seed, or sharing their seed" in text  # both naive seed-1 runs
    rows = read_csv(out / "paired_differences.csv")
    assert {r["shared_seeds"] for r in rows} == {"[2]"}


def cost_run(root: Path, method: str, seed: int, train_seconds: float, with_steps: bool) -> Path:
    """A run with a ``cost`` section (3 stages) and, ``with_steps``, per-step curves (so its
    primary matrix has ``plasticity``: anytime accuracy and LCA_1)."""
    from continual_eval.stage_cost import StageCost

    R = torch.tensor(matrix(RUNS["naive"][seed], seed), dtype=torch.float64)
    step_scores = torch.tensor(
        [
            [0.7, NAN, NAN],
            [R[0, 0], R[0, 1], NAN],
            [0.8 - seed / 50, 0.8, NAN],
            [R[1, 0], R[1, 1], R[1, 2]],
            [0.55, 0.7, 0.9],
            R[2].tolist(),
        ],
        dtype=torch.float64,
    )
    costs = RunCost(
        tuple(
            StageCost(
                i,
                train_seconds / 3,
                1.0,
                2**21 * (1 + seed),
                "process_peak_rss",
                100,
                100,
                64,
                2,
                None,
            )
            for i in range(3)
        )
    )
    results = ContinualResults.from_tensors(
        {"acc": ScoreMatrix("accuracy", R, torch.tensor(BASELINE), step_scores=step_scores)},
        steps=StepEvaluations(step=torch.arange(1, 7), stage=torch.tensor([0, 0, 1, 1, 2, 2]))
        if with_steps
        else None,
        cost=costs,
        lca_beta=1 if with_steps else None,
        metadata={"method": method, "seed": seed},
    )
    results.write(root / method / f"version_{seed}")
    return root / method / f"version_{seed}"


def test_cost_and_plasticity_when_present(tmp_path: Path) -> None:
    """Runs with a ``cost`` section get a cost table (mean totals per method) and ``cost.csv``;
    a primary matrix's ``plasticity`` adds anytime accuracy and LCA columns (read back from
    results.json)."""
    root = tmp_path / "runs"
    paths = [cost_run(root, "naive", seed, 30.0 * (seed + 1), seed < 2) for seed in range(3)]
    write_run(root, "ewc", 0)  # no cost, no curves
    out = tmp_path / "report"
    assert report_main([str(root), "--out", str(out)]) == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    loaded = [ContinualResults.load(p) for p in paths]
    anytime = [r.primary.plasticity.anytime_accuracy for r in loaded[:2]]
    lca = [r.primary.plasticity.lca for r in loaded[:2]]
    assert None not in anytime and None not in lca
    header = next(line for line in text.splitlines() if line.startswith("| method | runs"))
    assert header.endswith("| Anytime ACC | LCA |")
    row = next(line for line in text.splitlines() if line.startswith("| naive | 3 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    for cell, values in zip(cells[-2:], (anytime, lca), strict=True):  # two of three runs
        assert cell == f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f} (n=2)"
    assert "### Anytime ACC (higher is better)" in text and "### LCA (higher is better)" in text
    # cost: mean of the totals over the three runs; the run without a cost is n/a
    assert "## Cost" in text
    naive = next(line for line in text.splitlines() if line.startswith("| naive | 3 | 60.00"))
    mib = statistics.mean([2 * (1 + s) for s in range(3)])
    assert (
        naive
        == f"| naive | 3 | 60.00 | 3.00 | 192.0 | 6.0 | {mib:.1f} | 1.0000 | process\\_peak\\_rss |"
    )
    assert "| ewc | 0 | n/a | n/a | n/a | n/a | n/a | n/a | n/a |" in text
    rows = {r["method"]: r for r in read_csv(out / "cost.csv")}
    assert float(rows["naive"]["train_seconds_mean"]) == pytest.approx(60.0)
    assert rows["ewc"]["runs_with_cost"] == "0" and rows["ewc"]["train_seconds_mean"] == ""


def test_cost_of_a_run_missing_stages_is_not_averaged(tmp_path: Path) -> None:
    """A run resumed from a checkpoint written before costs were recorded holds the cost of its
    later stages only: its totals are no run totals, so the cost table leaves it out (and says
    how many runs it averages) instead of mixing partial totals with whole ones."""
    from dataclasses import replace

    root = tmp_path / "runs"
    paths = [cost_run(root, "naive", seed, 30.0, False) for seed in range(3)]
    partial = ContinualResults.load(paths[2])
    assert run_cost(partial) is not None
    partial = replace(partial, cost=RunCost(partial.cost.per_stage[1:]))
    partial.write(paths[2])
    assert run_cost(ContinualResults.load(paths[2])) is None
    out = tmp_path / "report"
    assert report_main([str(root), "--out", str(out)]) == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "| naive | 2 | 30.00 | 3.00 | 192.0 | 6.0 | 3.0 | 1.0000 |" in text
    rows = {r["method"]: r for r in read_csv(out / "cost.csv")}
    assert rows["naive"]["runs_with_cost"] == "2"
    assert float(rows["naive"]["samples_mean"]) == 192.0


def test_cost_and_plasticity_read_defensively(tmp_path: Path) -> None:
    """A mapping-shaped ``cost``/``plasticity`` (``lca`` as ``{"value": ...}``) reads too;
    without them nothing is added."""
    from continual_eval.report import _cost_section

    path = write_run(tmp_path / "runs", "naive", 0)
    results = ContinualResults.load(path)
    assert run_cost(results) is None
    assert "Anytime ACC" not in markdown_table(summarise([Run(path, results)], resamples=10))
    assert _cost_section(summarise([Run(path, results)], resamples=10), tmp_path) == []
    object.__setattr__(results, "cost", {"summary": {"train_seconds": 5, "samples": True}})
    plasticity = SimpleNamespace(anytime_accuracy=torch.tensor(0.8), lca={"value": 0.6})
    object.__setattr__(results.primary, "plasticity", plasticity)
    cost = run_cost(results)
    assert cost is not None and cost["train_seconds"] == 5.0 and cost["samples"] is None
    table = markdown_table(summarise([Run(path, results)], resamples=10))
    assert table.splitlines()[2].endswith("| 0.8000 | 0.6000 |")

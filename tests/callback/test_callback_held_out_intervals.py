"""Held-out sets with per-item records (``held_out_dataloaders`` + ``item_records``): each set's
items at the baseline and after every stage equal a plain-torch loop's; the ``intervals``
section's ``held_out`` part equals the Wilson / t intervals and the paired bootstrap of the plain
loop's items; the per-task intervals equal `paired_bootstrap`'s; round trip, logs and the load
check naming the field."""

from __future__ import annotations

import copy
import csv
import json

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import (
    Classifier,
    Snapshots,
    eval_loaders,
    make_net,
    make_tasks,
    train_loaders,
    trainer_kwargs,
)
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.functional import paired_bootstrap, student_t_interval, wilson_interval
from continual_eval.functional.intervals import held_out_bootstrap
from continual_eval.results import ContinualResults, InvalidResultsError

RESAMPLES = 400
SETS = ("general", "small")


def plain(weights: dict, data: list[tuple[torch.Tensor, torch.Tensor]]):
    """Per set: each item's correctness and cross-entropy, whole sets at once (the reference)."""
    net = make_net()
    net.load_state_dict({k.removeprefix("net."): v for k, v in weights.items()})
    net.eval()
    with torch.no_grad():
        out = []
        for x, y in data:
            logits = net(x)
            loss = nn.functional.cross_entropy(logits, y, reduction="none").double()
            out.append((logits.argmax(1) == y, loss))
    return out


def close(got, want: torch.Tensor, tol: float) -> None:
    """``got`` (JSON lists, ``null`` for NaN) equals ``want`` within ``tol``."""

    def nan(value):
        return (
            [nan(v) for v in value]
            if isinstance(value, list)
            else (float("nan") if value is None else value)
        )

    torch.testing.assert_close(
        torch.tensor(nan(got), dtype=torch.float64),
        want.double(),
        rtol=0,
        atol=tol,
        equal_nan=True,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("held_out_items")
    tasks = make_tasks()
    (_, general), (_, small) = make_tasks(2, seed=7, test_sizes=(37, 9))
    data = [general, small]
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        held_out_dataloaders={
            name: DataLoader(TensorDataset(*d), batch_size=5)
            for name, d in zip(SETS, data, strict=True)
        },
        dirpath=root / "out",
        verbose=False,
        item_records={"resamples": RESAMPLES, "seed": 5},
    )
    snapshots = Snapshots()
    logger = CSVLogger(root, name="csv")
    trainer = pl.Trainer(
        callbacks=[snapshots, cb], **trainer_kwargs(root, max_epochs=1, logger=logger)
    )
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    return cb, snapshots, tasks, data, root, logger


def test_held_out_items_equal_a_plain_loop(run):
    cb, snapshots, _, data, _, _ = run
    record = cb.record.sections["items"]
    assert record.held_out_sizes == [37, 9]
    for row, weights in enumerate(snapshots.weights):
        stage = None if row == 0 else row - 1
        expected = plain(weights, data)
        for h in range(2):
            got = record.values("acc", stage)[3 + h]
            assert torch.equal(got, expected[h][0]), (stage, h)
            loss = record.values("loss", stage)[3 + h]
            torch.testing.assert_close(loss, expected[h][1], rtol=0, atol=1e-5)


def test_held_out_intervals_equal_the_functional_layer(run):
    _, snapshots, _, data, root, _ = run
    document = json.loads((root / "out" / "results.json").read_text())
    section = document["intervals"]
    assert section["held_out_names"] == list(SETS)
    rows = [plain(w, data) for w in snapshots.weights]  # [row][set] (right, loss)
    for name, kind in (("acc", 0), ("loss", 1)):
        got = section["held_out"][name]
        per_set = [torch.stack([r[h][kind] for r in rows]) for h in range(2)]  # [4, n_h]
        n = torch.tensor([37.0, 9.0], dtype=torch.float64)
        if kind == 0:
            assert got["cell_method"] == "wilson"
            hits = torch.stack([v.double().sum(1) for v in per_set], dim=1)
            low, high = wilson_interval(hits, n.expand_as(hits))
        else:
            assert got["cell_method"] == "t"
            mean = torch.stack([v.mean(1) for v in per_set], dim=1)
            std = torch.stack([v.std(1) for v in per_set], dim=1)
            low, high = student_t_interval(mean, std, n.expand_as(mean))
        tol = 1e-12 if kind == 0 else 1e-5
        close(got["low"], low[1:], tol)
        close(got["high"], high[1:], tol)
        close(got["baseline_low"], low[0], tol)
        delta, worst = held_out_bootstrap(
            per_set, higher_is_better=kind == 0, resamples=RESAMPLES, seed=5
        )
        close(got["delta"]["low"], delta.low, tol)
        close(got["delta"]["high"], delta.high, tol)
        close(got["worst_drop"]["low"], worst.low, tol)
        # the estimates are what the held_out section reports
        reported = document["held_out"]["matrices"][name]
        # (per-sample losses: float32 rounding of the scorer's own sum)
        close(
            got["delta"]["estimate"],
            torch.tensor(reported["delta"], dtype=torch.float64),
            max(tol, 1e-9),
        )
        close(
            got["worst_drop"]["estimate"],
            torch.tensor(reported["worst_drop"], dtype=torch.float64),
            max(tol, 1e-9),
        )
        low, est, high = (torch.tensor(got["delta"][k]) for k in ("low", "estimate", "high"))
        assert bool(((low <= est + 1e-12) & (est <= high + 1e-12)).all())
    # no per-step evaluations: no stability or plasticity number to give an interval; cost is
    # measured
    assert "cost" in section["unavailable"]
    assert not {"stability", "plasticity"} & set(section["unavailable"])


def test_per_task_intervals_equal_paired_bootstrap(run):
    cb, _, _, _, root, _ = run
    document = json.loads((root / "out" / "results.json").read_text())
    record = cb.record.sections["items"]
    items = [torch.stack([record.values("acc", i)[j] for i in range(3)]) for j in range(3)]
    base = [record.values("acc", None)[j] for j in range(3)]
    expected = paired_bootstrap(items, baseline=base, resamples=RESAMPLES, seed=5)
    got = document["intervals"]["matrices"]["acc"]["per_task"]
    assert set(got) == {"bwt", "forgetting", "fwt"}
    for key, values in got.items():
        want = expected.per_task[key]
        close(values["low"], want.low, 1e-12)
        close(values["high"], want.high, 1e-12)
        # the estimates are results.json's per-task values
        close(
            values["estimate"], torch.tensor(document["per_task"][key], dtype=torch.float64), 1e-9
        )


def test_round_trip_logs_and_load_check(run, tmp_path):
    cb, _, _, _, root, logger = run
    loaded = ContinualResults.load(root / "out")
    assert loaded.intervals is not None and loaded.intervals.held_out
    assert loaded.to_dict()["intervals"] == cb.results()["intervals"]
    document = cb.results()
    with open(f"{logger.log_dir}/metrics.csv") as file:
        rows = list(csv.DictReader(file))
    last = [r for r in rows if r.get("continual/held_out/general/acc/delta/lo")][-1]
    # every stage's scalars carry the held-out cells' intervals (the delta's at the end only)
    first = next(r for r in rows if r.get("continual/stage") == "0.0")
    held0 = document["intervals"]["held_out"]["loss"]
    assert float(first["continual/held_out/small/loss/hi"]) == pytest.approx(held0["high"][0][1])
    held = document["intervals"]["held_out"]["acc"]
    assert float(last["continual/held_out/general/acc/lo"]) == pytest.approx(held["low"][2][0])
    assert float(last["continual/held_out/small/acc/delta/hi"]) == pytest.approx(
        held["delta"]["high"][2][1]
    )
    bad = copy.deepcopy(json.loads((root / "out" / "results.json").read_text()))
    bad["intervals"]["held_out"]["acc"]["delta"]["low"][1][0] = 2.0
    path = tmp_path / "results.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(
        InvalidResultsError, match=r"intervals\.held_out\.acc\.delta\.low\[1\]\[0\]"
    ):
        ContinualResults.load(path)
    bad = copy.deepcopy(json.loads((root / "out" / "results.json").read_text()))
    bad["intervals"]["matrices"]["acc"]["per_task"]["bwt"]["high"] = [0.1]
    path.write_text(json.dumps(bad))
    with pytest.raises(InvalidResultsError, match=r"intervals\.matrices\.acc\.per_task\.bwt\.high"):
        ContinualResults.load(path)


def test_journal_replay_and_state_round_trip_keep_the_held_out_items(run):
    """The stage journal's lines and the checkpoint state carry the held-out items: a replay and
    a restored record give the same intervals as the live run."""
    from continual_eval._stage_journal import replay
    from continual_eval.results.files import JOURNAL_FILE

    cb, _, _, _, root, _ = run
    live = cb.record.sections["items"]
    replayed = replay(root / "out" / JOURNAL_FILE)
    section = replayed.sections["items"]
    assert section.held_out == list(SETS) and section.held_out_sizes == [37, 9]
    for stage in (None, 0, 1, 2):
        for name in ("acc", "loss"):
            for j in (3, 4):
                want = live.values(name, stage)[j]
                assert torch.equal(section.values(name, stage)[j], want), (name, stage, j)
    assert replayed.continual_results().to_dict()["intervals"] == cb.results()["intervals"]
    restored = copy.deepcopy(live)
    restored.load_state_dict(copy.deepcopy(live.state_dict()))
    assert restored.held_out_sizes == [37, 9]
    for j in (3, 4):
        assert torch.equal(restored.values("acc", 2)[j], live.values("acc", 2)[j])


def test_report_table_writes_the_held_out_intervals(run, tmp_path):
    """``report.md``'s held-out table: each value with its interval from results.json."""
    from continual_eval._held_out_report import held_out_run_lines

    _, _, _, _, root, _ = run
    results = ContinualResults.load(root / "out")
    lines = held_out_run_lines(results, "run", "run", tmp_path, str)
    document = json.loads((root / "out" / "results.json").read_text())
    held = document["intervals"]["held_out"]["acc"]
    summary = results.held_out.summary("acc")["general"]
    row = next(line for line in lines if line.startswith("| general |") and "[" in line)
    baseline = (
        f"{summary['baseline']:.4f} [{held['baseline_low'][0]:.4f}, {held['baseline_high'][0]:.4f}]"
    )
    delta = (
        f"{summary['delta']:.4f} [{held['delta']['low'][-1][0]:.4f}, "
        f"{held['delta']['high'][-1][0]:.4f}]"
    )
    assert baseline in row and delta in row, row
    assert any("95% intervals from the sets' test items" in line for line in lines)

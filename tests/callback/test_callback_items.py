"""Per-item records (``item_records=``): each test item's value at the baseline and after every
stage equals a plain-torch loop's over the same weights (one process here; 2-process DDP with odd
shards in ``items_ddp_script.py``); the ``intervals`` section equals the functional layer's
intervals of the plain loop's items; item transitions on a hand-made toy through a real Trainer;
the size refusal; the state round trip and a resume equal to the uninterrupted run; the
``intervals``/``items`` sections checked on load naming the field."""

from __future__ import annotations

import copy
import json
import math

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
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.functional import (
    cell_intervals,
    paired_bootstrap,
)
from continual_eval.results import ContinualResults, InvalidResultsError
from script_runner import run_script

RESAMPLES = 500


def plain_items(weights: dict, tasks) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per task, every test item's correctness and cross-entropy, whole sets at once, in dataset
    order (the reference)."""
    net = make_net()
    net.load_state_dict({k.removeprefix("net."): v for k, v in weights.items()})
    net.eval()
    right, losses = [], []
    with torch.no_grad():
        for _, (x, y) in tasks:
            logits = net(x)
            right.append(logits.argmax(1) == y)
            losses.append(nn.functional.cross_entropy(logits, y, reduction="none").double())
    return right, losses


def _fit(root, *, loaders=None, item_records=None, tasks=None):
    tasks = tasks or make_tasks()
    cb = ContinualEvalCallback(
        loaders if loaders is not None else eval_loaders(tasks),
        scorers={"acc": "accuracy", "loss": "cross_entropy", "top2": "top2"},
        dirpath=root / "out",
        verbose=False,
        item_records=item_records or {"resamples": RESAMPLES, "seed": 3},
    )
    snapshots = Snapshots()
    trainer = pl.Trainer(callbacks=[snapshots, cb], **trainer_kwargs(root, max_epochs=1))
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    return cb, snapshots, tasks


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("items")
    tasks = make_tasks()
    loaders = eval_loaders(tasks)
    # a shuffling test loader: its items are still read (and recorded) in dataset order
    loaders[1] = DataLoader(TensorDataset(*tasks[1][1]), batch_size=8, shuffle=True)
    cb, snapshots, _ = _fit(root, loaders=loaders, tasks=tasks)
    return cb, snapshots, tasks, root


def test_items_equal_a_plain_loop(run):
    cb, snapshots, tasks, _ = run
    record = cb.record.sections["items"]
    assert record.binary == {"acc": True, "loss": False, "top2": True}
    for row, weights in enumerate(snapshots.weights):
        stage = None if row == 0 else row - 1
        right, losses = plain_items(weights, tasks)
        acc, loss = record.values("acc", stage), record.values("loss", stage)
        assert sorted(acc) == [0, 1, 2]
        for j in range(3):
            assert acc[j].dtype == torch.bool
            assert torch.equal(acc[j], right[j]), (stage, j)
            torch.testing.assert_close(loss[j], losses[j], rtol=0, atol=1e-5)
            # the cell is the mean of its items (the scorer's own count)
            matrix = cb.matrices["acc"]
            cell = cb.baseline[j] if stage is None else matrix[stage, j]
            assert acc[j].double().mean().item() == pytest.approx(cell.item(), abs=1e-12)


def test_intervals_equal_the_functional_layer_on_plain_items(run):
    _, snapshots, tasks, root = run
    document = json.loads((root / "out" / "results.json").read_text())
    items = [plain_items(w, tasks) for w in snapshots.weights]  # [row][kind][task]
    section = document["intervals"]
    assert section["confidence"] == 0.95 and section["resamples"] == RESAMPLES
    assert section["seed"] == 3 and section["weights"] == "double_or_nothing"
    for name, kind in (("acc", 0), ("loss", 1)):
        per_task = [torch.stack([items[i + 1][kind][j] for i in range(3)]) for j in range(3)]
        base = [items[0][kind][j] for j in range(3)]
        higher = name != "loss"
        expected = paired_bootstrap(
            per_task,
            baseline=base,
            higher_is_better=higher,
            resamples=RESAMPLES,
            seed=3,
        )
        got = section["matrices"][name]
        # 0/1 items are equal; per-sample losses agree to float32 rounding (the scorer's
        # logsumexp - s_y against F.cross_entropy)
        tol = 1e-12 if name == "acc" else 1e-6
        for key, value in got["metrics"].items():
            want = expected.metrics[key]
            assert value["low"] == pytest.approx(float(want.low), abs=tol), (name, key)
            assert value["high"] == pytest.approx(float(want.high), abs=tol), (name, key)
            # the estimate is the metric results.json reports
            reported = document["matrices"][name]["metrics"].get(key)
            if reported is not None:
                assert value["estimate"] == pytest.approx(reported, abs=1e-9), (name, key)
        cells = cell_intervals(per_task, baseline=base)
        assert got["cell_method"] == cells.method
        low = torch.tensor(got["low"], dtype=torch.float64)
        read = ~torch.isnan(cells.scores.low)
        torch.testing.assert_close(low[read], cells.scores.low[read], rtol=0, atol=tol)
        high = torch.tensor(got["high"], dtype=torch.float64)
        torch.testing.assert_close(high[read], cells.scores.high[read], rtol=0, atol=tol)
        assert got["baseline_low"] == pytest.approx(cells.baseline.low.tolist(), abs=tol)
        # every cell evaluated (evaluate="all"): the unread ones too, by the same formula
        assert not torch.isnan(low).any()
    assert document["items"]["bits_per_item"] == {"acc": 1, "loss": 64, "top2": 1}
    assert document["items"]["skipped"] == {}
    n = sum(len(te[1]) for _, te in tasks)
    assert document["items"]["memory_bytes"] == 4 * (
        2 * sum(-(-len(te[1]) // 8) for _, te in tasks) + 8 * n
    )


def test_results_round_trip_and_logs(run):
    cb, _, _, root = run
    loaded = ContinualResults.load(root / "out")
    assert loaded.intervals is not None and loaded.items is not None
    assert loaded.to_dict()["intervals"] == cb.results()["intervals"]
    assert loaded.to_dict()["items"] == cb.results()["items"]


def test_sections_checked_on_load_naming_the_field(run, tmp_path):
    _, _, _, root = run
    document = json.loads((root / "out" / "results.json").read_text())
    bad = copy.deepcopy(document)
    bad["intervals"]["matrices"]["acc"]["low"][1][0] = 0.999
    path = tmp_path / "results.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(InvalidResultsError, match=r"intervals\.matrices\.acc\.low\[1\]\[0\]"):
        ContinualResults.load(path)
    bad = copy.deepcopy(document)
    bad["items"]["transitions"]["acc"]["forgotten"][2][0] = 1000
    path.write_text(json.dumps(bad))
    with pytest.raises(InvalidResultsError, match=r"items\.transitions\.acc\.forgotten\[2\]\[0\]"):
        ContinualResults.load(path)
    bad = copy.deepcopy(document)
    bad["intervals"]["matrices"]["nope"] = bad["intervals"]["matrices"]["acc"]
    path.write_text(json.dumps(bad))
    with pytest.raises(InvalidResultsError, match=r"intervals\.matrices\.nope"):
        ContinualResults.load(path)


# ---------------------------------------------------------------------------- transitions toy
#: per task, each item's correctness at the baseline and after stages 0 and 1 (by hand)
TOY = {
    0: [[0, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1]],
    1: [[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0]],
}


class Toy(pl.LightningModule):
    """Predicts class 0 for item ``k`` of task ``j`` exactly when ``TOY[j][row][k]`` (``row``: the
    stages trained so far), whatever it learns; one dummy parameter to train."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.register_buffer("row", torch.zeros((), dtype=torch.long))
        self.register_buffer("table", torch.tensor([TOY[0], TOY[1]], dtype=torch.bool))

    def forward(self, x):
        task, item = x[:, 0].long(), x[:, 1].long()
        right = self.table[task, self.row, item]
        logits = torch.stack([right.float(), (~right).float()], dim=1)
        return logits + 0 * self.weight

    def training_step(self, batch, batch_idx):
        return (self.weight - 1).square().sum()

    def on_train_start(self):  # stage i is trained (and then scored) with row i + 1
        self.row += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_transitions_of_a_hand_made_toy(tmp_path):
    def test_set(j):
        x = torch.tensor([[j, k] for k in range(4)], dtype=torch.float32)
        return DataLoader(TensorDataset(x, torch.zeros(4, dtype=torch.long)), batch_size=3)

    cb = ContinualEvalCallback(
        [test_set(0), test_set(1)],
        dirpath=tmp_path / "out",
        verbose=False,
        item_records={"resamples": 100},
    )
    train = [DataLoader(TensorDataset(torch.zeros(2, 2), torch.zeros(2)), batch_size=2)] * 2
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))
    fit_tasks(trainer, Toy(), train)
    moves = cb.results()["items"]["transitions"]["acc"]
    nan = None
    # by hand (TOY): stage 0 against the baseline, stage 1 against stage 0
    assert moves["right_to_wrong"] == [[0.0, nan], [1.0, 0.0]]
    assert moves["wrong_to_right"] == [[2.0, nan], [1.0, 1.0]]
    assert moves["forgotten"] == [[0.0, nan], [1.0, 0.0]]
    assert moves["recovered"] == [[0.0, nan], [1.0, 0.0]]
    assert moves["forgotten_once"] == [[0.0, nan], [1.0, 0.0]]
    assert moves["num_items"] == [4, 4]


# ---------------------------------------------------------------------------- bounds, state
def test_size_refusal_names_the_size(tmp_path):
    with pytest.raises(Exception, match=r"per-item records would hold .* MiB \(\d+ bytes") as info:
        _fit(tmp_path, item_records={"max_bytes": 100})
    assert "max_bytes=100" in str(info.value)


def test_arguments_are_checked():
    from torchmetrics.classification import MulticlassF1Score

    loaders = eval_loaders(make_tasks())
    f1 = MulticlassF1Score(num_classes=3)
    with pytest.raises(ValueError, match="no matrix of this run is a mean over items"):
        ContinualEvalCallback(loaders, metric=f1, item_records=True)
    with pytest.raises(ValueError, match="'f1', whose score is not a mean over items"):
        ContinualEvalCallback(loaders, scorers={"acc": "accuracy", "f1": f1}, item_records=["f1"])
    with pytest.raises(ValueError, match="unknown key 'bytes'"):
        ContinualEvalCallback(loaders, item_records={"bytes": 3})
    cb = ContinualEvalCallback(loaders, scorers={"acc": "accuracy", "f1": f1}, item_records=True)
    section = cb._new_record(["a", "b", "c"]).sections["items"]
    assert list(section.binary) == ["acc"] and "torchmetrics" in section.skipped["f1"]


def test_state_round_trip_and_resume_equals_uninterrupted(tmp_path):
    tasks = make_tasks()

    def run(root, loaders, ckpt_path=None):
        cb = ContinualEvalCallback(
            eval_loaders(tasks),
            scorers={"acc": "accuracy", "loss": "cross_entropy"},
            dirpath=root,
            verbose=False,
            item_records={"resamples": RESAMPLES},
        )

        def factory(task):
            return pl.Trainer(callbacks=[cb], **trainer_kwargs(root, max_epochs=1))

        fit_tasks(
            factory,
            Classifier(make_net()),
            loaders,
            checkpoint_dir=root / "ckpt",
            ckpt_path=ckpt_path,
            seed=7,
        )
        return cb

    loaders = train_loaders(tasks)
    full = run(tmp_path / "full", loaders)
    first = run(tmp_path / "cut", loaders[:2])
    state = torch.load(tmp_path / "cut" / "ckpt" / "task_1.ckpt", weights_only=True)
    held = state["callbacks"][first.state_key]["record"]["sections"]["items"]
    assert len(held["stages"]) == 2 and held["baseline"]["acc"][0].dtype == torch.uint8
    resumed = run(tmp_path / "cut", loaders, ckpt_path=tmp_path / "cut" / "ckpt" / "task_1.ckpt")
    assert first.stages_completed == 2 and resumed.stages_completed == 3
    a, b = resumed.results(), full.results()
    assert a["intervals"] == b["intervals"]
    assert a["items"] == b["items"]
    record_a, record_b = resumed.record.sections["items"], full.record.sections["items"]
    for stage in (None, 0, 1, 2):
        for j, values in record_b.values("acc", stage).items():
            assert torch.equal(record_a.values("acc", stage)[j], values)
    # a state round trip through torch.save / load(weights_only=True)
    other = ContinualEvalCallback(
        eval_loaders(tasks),
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        verbose=False,
        item_records={"resamples": RESAMPLES},
    )
    path = tmp_path / "state.pt"
    torch.save(full.state_dict(), path)
    other.load_state_dict(torch.load(path, weights_only=True))
    assert other.results()["intervals"] == b["intervals"]


@pytest.mark.slow
def test_ddp_items_equal_a_plain_loop(tmp_path):
    """2 gloo processes, odd test sets (37, 29, 41), a 1-item task (rank 1 holds no sample of
    it), an iterable test set (rank 0 alone) and a shuffling DistributedSampler that pads: every
    rank's records equal the plain loop's, in dataset order."""
    proc = run_script(
        __import__("pathlib").Path(__file__).parent / "items_ddp_script.py", tmp_path, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    tasks = torch.load(tmp_path / "tasks.pt", weights_only=True)
    weights = [torch.load(tmp_path / f"weights_{k}.pt", weights_only=True) for k in range(4)]
    for rank in (0, 1):
        saved = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for row, w in enumerate(weights):
            right, losses = plain_items(w, tasks)
            for j in range(len(tasks)):
                assert torch.equal(saved["acc"][row][j], right[j]), (rank, row, j)
                torch.testing.assert_close(saved["loss"][row][j], losses[j], rtol=0, atol=1e-5)
        assert (
            saved["intervals"] == torch.load(tmp_path / "rank0.pt", weights_only=True)["intervals"]
        )
        # the held-out set's items (ids T + h, odd shards) equal a plain loop's on every rank
        general = torch.load(tmp_path / "held_out.pt", weights_only=True)
        for row, w in enumerate(weights):
            right, losses = plain_items(w, [(None, general)])
            assert torch.equal(saved["held_out"]["acc"][row], right[0]), (rank, row)
            torch.testing.assert_close(saved["held_out"]["loss"][row], losses[0], rtol=0, atol=1e-5)
        rank0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
        assert saved["held_out_intervals"] == rank0["held_out_intervals"]
    assert math.isfinite(saved["intervals"]["acc"]["bwt"][1])


def test_logs_carry_lo_and_hi_beside_the_scalars(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    tasks = make_tasks()
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        dirpath=tmp_path / "out",
        verbose=False,
        item_records={"resamples": RESAMPLES},
    )
    logger = CSVLogger(tmp_path, name="csv")
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1, logger=logger))
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    import csv

    with open(f"{logger.log_dir}/metrics.csv") as file:
        rows = list(csv.DictReader(file))
    last = [r for r in rows if r.get("continual/acc/lo")][-1]
    document = cb.results()
    acc = document["intervals"]["matrices"]["acc"]
    assert float(last["continual/acc/lo"]) == pytest.approx(acc["metrics"]["acc"]["low"])
    assert float(last["continual/bwt/hi"]) == pytest.approx(acc["metrics"]["bwt"]["high"])
    assert float(last["continual/loss/bwt/lo"]) == pytest.approx(
        document["intervals"]["matrices"]["loss"]["metrics"]["bwt"]["low"]
    )
    assert float(last["continual/accuracy/task_0/lo"]) == pytest.approx(acc["low"][2][0])
    assert float(last["continual/acc"]) == pytest.approx(document["metrics"]["acc"])
    lo, hi = float(last["continual/acc/lo"]), float(last["continual/acc/hi"])
    assert lo <= float(last["continual/acc"]) <= hi
    moves = document["items"]["transitions"]["acc"]
    assert float(last["continual/items/right_to_wrong"]) == sum(
        v for v in moves["right_to_wrong"][2] if v is not None
    )
    assert float(last["continual/items/forgotten_once/task_0"]) == pytest.approx(
        moves["forgotten_once"][2][0] / moves["num_items"][0]
    )
    stage_0 = next(r for r in rows if r.get("continual/items/wrong_to_right"))
    assert float(stage_0["continual/items/wrong_to_right"]) == moves["wrong_to_right"][0][0]
    # the fraction forgotten at least once: Wilson interval of forgotten_once of n_j items, in
    # results.json and the logs, equal to scipy's
    from scipy.stats import binomtest

    assert moves["confidence"] == 0.95
    for i, row in enumerate(moves["forgotten_once"]):
        for j, count in enumerate(row):
            if count is None:
                assert moves["forgotten_once_low"][i][j] is None
                continue
            want = binomtest(int(count), moves["num_items"][j]).proportion_ci(method="wilson")
            assert moves["forgotten_once_low"][i][j] == pytest.approx(want.low, abs=1e-12)
            assert moves["forgotten_once_high"][i][j] == pytest.approx(want.high, abs=1e-12)
    assert float(last["continual/items/forgotten_once/task_0/lo"]) == pytest.approx(
        moves["forgotten_once_low"][2][0]
    )
    assert float(last["continual/items/forgotten_once/task_0/hi"]) == pytest.approx(
        moves["forgotten_once_high"][2][0]
    )
    loaded = ContinualResults.from_dict(document).items
    assert loaded is not None
    low, _ = loaded.transitions["acc"].forgotten_once_interval
    assert low[2, 0].item() == pytest.approx(moves["forgotten_once_low"][2][0], abs=1e-15)


def test_report_shows_intervals_and_transitions(run, tmp_path):
    from continual_eval.report import main

    _, _, _, root = run
    assert main([str(root / "out"), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "### Intervals from the test items" in text
    assert f"({RESAMPLES} resamples, double_or_nothing weights, seed 3;" in text
    assert "| bwt |" in text
    pictures = sorted(p.name for p in (tmp_path / "report").glob("*_transitions*.png"))
    assert len(pictures) == 2  # acc and top2 (0/1 items); the loss has none
    assert "fraction of each task's items forgotten at least once" in text
    moves = ContinualResults.load(root / "out").items.transitions["acc"]  # type: ignore[union-attr]
    fraction, low, high = (
        t[-1, 0].item() for t in (moves.forgotten_once_fraction, *moves.forgotten_once_interval)
    )
    assert f"task\\_0 {fraction:.3f} [{low:.3f}, {high:.3f}]" in text  # name escaped
    assert "95% Wilson interval of the fraction forgotten at least once" in text


def test_evaluate_needed_leaves_unevaluated_cells_without_intervals(tmp_path):
    tasks = make_tasks()
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        evaluate="needed",
        dirpath=tmp_path / "out",
        verbose=False,
        item_records={"resamples": 200},
    )
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    document = cb.results()
    low = document["intervals"]["matrices"]["acc"]["low"]
    assert low[0][2] is None and low[0][1] is not None and low[1][2] is not None
    assert document["scores"][0][2] is None
    metrics = document["intervals"]["matrices"]["acc"]["metrics"]
    for key in ("acc", "bwt", "fwt", "forgetting"):
        assert metrics[key]["estimate"] == pytest.approx(document["metrics"][key], abs=1e-12)
        assert metrics[key]["low"] <= metrics[key]["estimate"] <= metrics[key]["high"]


def test_evaluate_tasks_refuses_what_it_cannot_record():
    from torchmetrics.classification import MulticlassF1Score

    from continual_eval.evaluation import EvaluationError, evaluate_tasks

    net = nn.Linear(4, 3)
    loader = DataLoader(TensorDataset(torch.randn(10, 4), torch.randint(0, 3, (10,))), batch_size=4)
    with pytest.raises(TypeError, match="'MulticlassF1Score' keeps no per-item values"):
        evaluate_tasks(
            net, [loader], [0], scorers=[MulticlassF1Score(num_classes=3)], item_scorers=[0]
        )
    # several labels per sample: no per-item value
    seq = DataLoader(TensorDataset(torch.randn(6, 3, 2), torch.randint(0, 3, (6, 2))), batch_size=3)
    with pytest.raises(EvaluationError, match="need one label per sample"):
        evaluate_tasks(nn.Identity(), [seq], [0], scorers=["accuracy"], item_scorers=[0])
    # a batch-mean loss: no per-sample values
    mean_loss = nn.CrossEntropyLoss()
    with pytest.raises(EvaluationError, match=r"need one loss per sample \[N\] = \[4\]"):
        evaluate_tasks(net, [loader], [0], scorers=[mean_loss], item_scorers=[0])
    # without item_scorers nothing is kept (and a scorer used with items before keeps none)
    plain = evaluate_tasks(net, [loader], [0], scorers=["accuracy"])
    assert plain.items_by_scorer == ()


@pytest.mark.slow
def test_lockstep_fsdp2_items_equal_a_plain_loop(tmp_path):
    """FSDP2 on 2 gloo processes (lockstep forwards), test sets of 1, 5 and 7 samples in batches
    of 2 and an iterable one: every rank's records equal a plain loop's over the full weights."""
    from sharded_script import TRAINED_TASKS, make_data
    from sharded_script import make_net as sharded_net

    here = __import__("pathlib").Path(__file__).parent
    proc = run_script(here / "items_sharded_script.py", tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tasks = make_data()
    for row in range(TRAINED_TASKS + 1):
        net = sharded_net()
        net.load_state_dict(torch.load(tmp_path / f"weights_{row}.pt", weights_only=True))
        net.eval()
        with torch.no_grad():
            outputs = [(net(x), y) for _, (x, y) in tasks]
        for rank in (0, 1):
            saved = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
            for j, (logits, y) in enumerate(outputs):
                assert torch.equal(saved["acc"][row][j], logits.argmax(1) == y), (rank, row, j)
                losses = nn.functional.cross_entropy(logits, y, reduction="none").double()
                torch.testing.assert_close(saved["loss"][row][j], losses, rtol=1e-5, atol=1e-6)


def test_the_stage_journal_replays_the_items(run):
    """The journal's lines hold each evaluation's items (bits as hex, losses as floats); its
    replay gives the same records, intervals and transitions as the live record."""
    from continual_eval._stage_journal import replay
    from continual_eval.results.files import JOURNAL_FILE

    cb, _, _, root = run
    replayed = replay(root / "out" / JOURNAL_FILE)
    section, live = replayed.sections["items"], cb.record.sections["items"]
    for name in ("acc", "loss", "top2"):
        for stage in (None, 0, 1, 2):
            for j, values in live.values(name, stage).items():
                assert torch.equal(section.values(name, stage)[j], values), (name, stage, j)
    a, b = replayed.continual_results().to_dict(), cb.results()
    assert a["intervals"] == b["intervals"] and a["items"] == b["items"]
    assert ContinualResults.load(root / "out").to_dict()["intervals"] == b["intervals"]


def test_per_step_evaluations_keep_no_items(tmp_path):
    """Evaluations inside a stage (on a fixed subset) record nothing; the stage ends do."""
    from continual_eval import StepEvaluation

    tasks = make_tasks()
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        eval_every_n_steps=StepEvaluation(1, subset=5),
        dirpath=tmp_path / "out",
        verbose=False,
        item_records={"resamples": 100},
    )
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    record = cb.record.sections["items"]
    assert len(record.stages) == 3
    sizes = [len(te[1]) for _, te in tasks]
    for stage in (None, 0, 1, 2):
        assert [v.numel() for v in record.values("acc", stage).values()] == sizes
    assert len(cb.results()["curves"]["step"]) > 3


def test_item_records_with_a_stage_subset_and_old_tasks_every_two_stages(tmp_path) -> None:
    """Budgeted evaluation and item records together: the items are the subset's (their count
    is the subset size), the cells of skipped old tasks and their intervals are absent, the
    evaluated cells' intervals are the functional layer's of the recorded items."""
    tasks = make_tasks(4, test_sizes=(40, 30, 50, 20))
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        dirpath=tmp_path / "out",
        verbose=False,
        item_records={"resamples": RESAMPLES},
        stage_eval_subset=16,
        eval_old_tasks_every=2,
    )
    model = Classifier(make_net())
    fit_tasks(
        lambda task: pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)),
        model,
        train_loaders(tasks),
    )
    results = ContinualResults.load(tmp_path / "out")
    intervals = results.intervals.matrices["acc"]
    assert intervals.num_items == (16, 16, 16, 16)
    scores = results.primary.scores
    # stage 2 skips its old tasks 0 and 1 (3 % 2 != 0): absent cells, absent intervals
    assert math.isnan(scores[2, 0]) and math.isnan(scores[2, 1])
    assert torch.isnan(intervals.low[2, :2]).all() and torch.isnan(intervals.high[2, :2]).all()
    evaluated = ~torch.isnan(scores)
    assert (intervals.low[evaluated] <= scores[evaluated]).all()
    assert (scores[evaluated] <= intervals.high[evaluated]).all()
    assert results.primary.metrics["acc"] == results.primary.metrics["acc"]  # final row present
    # the metrics' paired bootstrap is in the results of the finished run (the per-stage results
    # of a run in progress leave it out: cb.record.continual_results(light=True))
    assert intervals.metrics
    light = cb.record.continual_results(light=True).intervals
    assert light is not None and not light.matrices["acc"].metrics

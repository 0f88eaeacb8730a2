"""Class-incremental intervals (``task_classes`` + ``item_records``): the Wilson intervals of
the per-class, seen, old and new accuracies in results.json equal those of a plain loop's
correct/total counts over the hand-made logit tables of ``test_class_incremental``; the
estimates are the class_incremental section's values; the numbers without an interval are
named with a reason; round trip, logs and the load check naming the field."""

from __future__ import annotations

import copy
import csv
import json
import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from test_class_incremental import (
    LABELS,
    TABLES,
    TASK_CLASSES,
    TASK_OF_SAMPLE,
    TableModel,
    first_max,
    task_loaders,
    trainer_kwargs,
)

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.functional import wilson_interval
from continual_eval.results import ContinualResults, InvalidResultsError


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("class_il_intervals")
    cb = ContinualEvalCallback(
        task_loaders(),
        task_classes=TASK_CLASSES,
        dirpath=root / "out",
        verbose=False,
        log_images=False,
        item_records={"resamples": 200},
    )
    logger = CSVLogger(root, name="csv")
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(root, logger=logger))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_tasks(trainer, TableModel(), task_loaders())
    return cb, root, logger


def plain_counts():
    """Per stage: (correct, total) per class, over the seen tasks' samples, predictions among
    the seen classes (a loop over samples)."""
    out = []
    for stage in range(2):
        allowed = [c for k in range(stage + 1) for c in TASK_CLASSES[k]]
        correct, total = [0] * 4, [0] * 4
        for index, (label, task) in enumerate(zip(LABELS, TASK_OF_SAMPLE, strict=True)):
            if task > stage:
                continue
            total[label] += 1
            correct[label] += first_max(TABLES[stage + 1][index].tolist(), allowed) == label
        out.append((correct, total))
    return out


def test_class_il_intervals_equal_wilson_of_plain_counts(run):
    _, root, _ = run
    document = json.loads((root / "out" / "results.json").read_text())
    got = document["intervals"]["class_incremental"]
    assert got["method"] == "wilson"
    counts = plain_counts()
    for stage, (correct, total) in enumerate(counts):
        seen = [c for k in range(stage + 1) for c in TASK_CLASSES[k]]
        for c in range(4):
            row = got["per_class_accuracy"]
            if c not in seen:
                assert row["low"][stage][c] is None
                continue
            low, high = wilson_interval(torch.tensor(correct[c]), torch.tensor(total[c]))
            assert row["low"][stage][c] == pytest.approx(low.item(), abs=1e-12)
            assert row["high"][stage][c] == pytest.approx(high.item(), abs=1e-12)
        pools = {
            "seen_accuracy": seen,
            "old_accuracy": [c for k in range(stage) for c in TASK_CLASSES[k]],
            "new_accuracy": TASK_CLASSES[stage],
        }
        for key, classes in pools.items():
            hits, n = sum(correct[c] for c in classes), sum(total[c] for c in classes)
            if n == 0:
                assert got[key]["low"][stage] is None, key
                continue
            low, high = wilson_interval(torch.tensor(hits), torch.tensor(n))
            assert got[key]["estimate"][stage] == pytest.approx(hits / n, abs=1e-12), key
            assert got[key]["low"][stage] == pytest.approx(low.item(), abs=1e-12), key
            assert got[key]["high"][stage] == pytest.approx(high.item(), abs=1e-12), key
    # the estimates are the class_incremental section's (sample-weighted) values
    section = document["class_incremental"]
    assert got["seen_accuracy"]["estimate"] == pytest.approx(section["seen_accuracy"]["sample"])
    assert got["new_accuracy"]["estimate"] == pytest.approx(section["new_accuracy"])
    # every class-IL number has an interval; the test sets' own composition is named
    assert set(got["unavailable"]) == {"recency_sample_share"}
    # recency: Wilson of the seen samples predicted as a class of task i (a plain loop)
    for stage in range(2):
        allowed = [c for k in range(stage + 1) for c in TASK_CLASSES[k]]
        new = seen = 0
        for index, (_label, task) in enumerate(zip(LABELS, TASK_OF_SAMPLE, strict=True)):
            if task > stage:
                continue
            seen += 1
            new += first_max(TABLES[stage + 1][index].tolist(), allowed) in TASK_CLASSES[stage]
        low, high = wilson_interval(torch.tensor(new), torch.tensor(seen))
        share = got["recency_prediction_share"]
        assert share["estimate"][stage] == pytest.approx(new / seen, abs=1e-12)
        assert share["low"][stage] == pytest.approx(low.item(), abs=1e-12)
        assert share["high"][stage] == pytest.approx(high.item(), abs=1e-12)


def test_round_trip_logs_and_load_check(run, tmp_path):
    cb, root, logger = run
    loaded = ContinualResults.load(root / "out")
    assert loaded.intervals is not None and loaded.intervals.class_incremental is not None
    assert loaded.to_dict()["intervals"] == cb.results()["intervals"]
    got = cb.results()["intervals"]["class_incremental"]
    with open(f"{logger.log_dir}/metrics.csv") as file:
        rows = list(csv.DictReader(file))
    last = [r for r in rows if r.get("continual/class_il/seen_acc_sample/lo")][-1]
    assert float(last["continual/class_il/seen_acc_sample/lo"]) == pytest.approx(
        got["seen_accuracy"]["low"][1]
    )
    assert float(last["continual/class_il/old_acc/hi"]) == pytest.approx(
        got["old_accuracy"]["high"][1]
    )
    bad = copy.deepcopy(json.loads((root / "out" / "results.json").read_text()))
    bad["intervals"]["class_incremental"]["seen_accuracy"]["low"][1] = 1.5
    path = tmp_path / "results.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(
        InvalidResultsError, match=r"intervals\.class_incremental\.seen_accuracy\.low"
    ):
        ContinualResults.load(path)


@pytest.mark.parametrize("name", ["acc_task_aware", "acc_task_agnostic"])
def test_class_il_matrices_get_item_intervals_of_plain_loop_bits(run, name):
    """The class-incremental scorers keep each sample's correctness: their matrices get the
    Wilson cell intervals of a plain loop's per-item correctness (argmax over the task's classes,
    or over the classes of the tasks ``<= max(i, j)``; ``i = -1`` the baseline) and the paired
    bootstrap metrics of any accuracy matrix."""
    cb, _, _ = run
    got = cb.results()["intervals"]["matrices"][name]
    assert got["cell_method"] == "wilson"
    for stage in range(-1, 2):
        for task in range(2):
            if name == "acc_task_aware":
                allowed = TASK_CLASSES[task]
            else:
                allowed = [c for k in range(max(stage, task) + 1) for c in TASK_CLASSES[k]]
            bits = [
                first_max(TABLES[stage + 1][index].tolist(), allowed) == label
                for index, (label, t) in enumerate(zip(LABELS, TASK_OF_SAMPLE, strict=True))
                if t == task
            ]
            low, high = wilson_interval(torch.tensor(sum(bits)), torch.tensor(len(bits)))
            lows = got["baseline_low"] if stage < 0 else got["low"][stage]
            highs = got["baseline_high"] if stage < 0 else got["high"][stage]
            assert lows[task] == pytest.approx(low.item(), abs=1e-12), (stage, task)
            assert highs[task] == pytest.approx(high.item(), abs=1e-12), (stage, task)
    metrics = got["metrics"]
    assert {"acc", "bwt", "forgetting", "average_incremental_accuracy"} <= set(metrics)
    for value in metrics.values():
        assert value["low"] <= value["estimate"] <= value["high"]
    assert got["num_items"] == [TASK_OF_SAMPLE.count(0), TASK_OF_SAMPLE.count(1)]


def test_paired_class_il_intervals(run):
    """The numbers that read each item's class: the paired bootstrap over acc_task_agnostic's
    items and the labels recorded at the baseline (a plain loop's labels, in test-set order);
    its estimates are the class_incremental section's values, the task-weighted seen accuracy
    of the last stage and the average incremental accuracy the matrix's own intervals."""
    cb, root, logger = run
    items = cb._record.sections["items"]
    for task in range(2):
        want = [label for label, t in zip(LABELS, TASK_OF_SAMPLE, strict=True) if t == task]
        assert items.labels[task].tolist() == want
    assert items.memory_bytes >= 2 * len(LABELS)  # int16 labels counted
    document = json.loads((root / "out" / "results.json").read_text())
    paired = document["intervals"]["class_incremental"]["paired"]
    section = document["class_incremental"]
    assert paired["matrix"] == "acc_task_agnostic"
    per_stage = paired["per_stage"]
    pairs = {
        "seen_accuracy_task": section["seen_accuracy"]["task"],
        "old_accuracy_task": section["old_accuracy"]["task"],
        "mean_class_accuracy": section["mean_class_accuracy"],
        "amca_per_stage": section["amca_per_stage"],
        "mean_class_forgetting_per_stage": section["mean_class_forgetting_per_stage"],
    }
    for key, want in pairs.items():
        assert per_stage[key]["estimate"] == pytest.approx(want, abs=1e-12, nan_ok=True), key
        for low, est, high in zip(
            *(per_stage[key][e] for e in ("low", "estimate", "high")), strict=False
        ):
            assert (low is None and est is None) or low <= est <= high, key
    assert paired["class_forgetting"]["estimate"] == pytest.approx(
        section["class_forgetting"], abs=1e-12, nan_ok=True
    )
    metrics = paired["metrics"]
    assert metrics["amca"]["estimate"] == pytest.approx(section["amca"])
    assert metrics["average_incremental_accuracy_sample"]["estimate"] == pytest.approx(
        section["average_incremental_accuracy"]["sample"]
    )
    matrix = document["intervals"]["matrices"]["acc_task_agnostic"]["metrics"]
    for mine, theirs in (
        (metrics["average_incremental_accuracy_task"], matrix["average_incremental_accuracy"]),
        ({e: per_stage["seen_accuracy_task"][e][-1] for e in mine_keys()}, matrix["acc"]),
    ):
        for e in mine_keys():
            assert mine[e] == pytest.approx(theirs[e], abs=1e-12), e
    # logged beside the values, at the last stage
    with open(f"{logger.log_dir}/metrics.csv") as file:
        rows = list(csv.DictReader(file))
    last = [r for r in rows if r.get("continual/class_il/amca/lo")][-1]
    assert float(last["continual/class_il/amca/lo"]) == pytest.approx(
        per_stage["amca_per_stage"]["low"][1]
    )
    assert float(last["continual/class_il/seen_acc_task/hi"]) == pytest.approx(
        per_stage["seen_accuracy_task"]["high"][1]
    )
    assert "continual/class_il/recency_prediction_share/lo" in last
    # the round trip keeps it; a bad value is refused naming the field
    loaded = ContinualResults.load(root / "out")
    assert loaded.intervals.class_incremental.paired is not None
    assert loaded.to_dict()["intervals"] == cb.results()["intervals"]


def mine_keys():
    return ("estimate", "low", "high")


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("per_stage", "amca_per_stage", "low", 0), 1.5, r"paired\.per_stage\.amca_per_stage\.low"),
        (("class_forgetting", "high", 0), -2.0, r"paired\.class_forgetting\.high"),
        (("metrics", "amca", "low"), 7.0, r"paired\.metrics\.amca\.low"),
    ],
)
def test_paired_section_is_checked_on_load(run, tmp_path, path, value, field):
    _, root, _ = run
    bad = json.loads((root / "out" / "results.json").read_text())
    target = bad["intervals"]["class_incremental"]["paired"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    (tmp_path / "results.json").write_text(json.dumps(bad))
    with pytest.raises(InvalidResultsError, match=field):
        ContinualResults.load(tmp_path / "results.json")


def test_labels_survive_the_checkpoint_state_and_are_counted_in_max_bytes(run, tmp_path):
    cb, _, _ = run
    items = cb._record.sections["items"]
    state = copy.deepcopy(items.state_dict())
    before = cb.results()["intervals"]["class_incremental"]
    items.labels = None
    items.load_state_dict(state)
    assert [items.labels[j].tolist() for j in range(2)] == [
        [label for label, t in zip(LABELS, TASK_OF_SAMPLE, strict=True) if t == task]
        for task in range(2)
    ]
    items._class_il_cache = None
    assert cb.results()["intervals"]["class_incremental"] == before
    state["labels"][1] = state["labels"][1][:-1]
    with pytest.raises(ValueError, match="item labels do not match the test sets: task 1 has 3"):
        items.load_state_dict(state)
    items.load_state_dict(copy.deepcopy(cb._record.sections["items"].state_dict()))


def test_without_the_agnostic_items_the_paired_numbers_say_why(tmp_path):
    cb = ContinualEvalCallback(
        task_loaders(),
        task_classes=TASK_CLASSES,
        dirpath=tmp_path / "out",
        verbose=False,
        log_images=False,
        item_records={"scorers": ["acc_task_aware"], "resamples": 50},
    )
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_tasks(trainer, TableModel(), task_loaders())
    got = cb.results()["intervals"]["class_incremental"]
    assert got["paired"] is None
    for key in ("amca", "class_forgetting", "mean_class_accuracy", "seen_accuracy_task"):
        assert "does not record 'acc_task_agnostic'" in got["unavailable"][key]
    assert cb._record.sections["items"].labels is None


# ---------------------------------------------------------------------------- DDP, kill -9
@pytest.mark.slow
def test_ddp_item_labels_and_bits_equal_one_process_and_give_the_same_intervals(tmp_path):
    """2 gloo processes, odd test sets sharded without padding (one an iterable set rank 0
    scores alone): the labels and task-agnostic bits recorded equal a plain loop's over the
    saved weights (one process), on both ranks, and the class-IL intervals are those of the
    one-process items."""
    from class_incremental_ddp_script import TASK_CLASSES as GAUSS_CLASSES
    from class_incremental_ddp_script import TEST_SIZES, make_net, make_problem
    from test_class_incremental import allowed_agnostic, reference_cell

    from continual_eval.functional import check_task_classes
    from continual_eval.functional._class_il_intervals import class_il_bootstrap
    from script_runner import run_script

    here = __import__("pathlib").Path(__file__).parent
    proc = run_script(here / "class_incremental_ddp_script.py", tmp_path, "items", timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert ranks[0]["world_size"] == 2 and all(n % 2 for n in TEST_SIZES)
    _, test = make_problem()
    net = make_net()
    bits = []
    for name in ["weights_baseline.pt", *(f"weights_{i}.pt" for i in range(3))]:
        state = torch.load(tmp_path / name)
        net.load_state_dict({k.removeprefix("net."): v for k, v in state.items()})
        stage = len(bits) - 1
        row = {}
        with torch.no_grad():
            for j, (x, y) in enumerate(test):
                _, _, preds = reference_cell(
                    net(x), y.tolist(), allowed_agnostic(stage, j, GAUSS_CLASSES)
                )
                row[j] = [p == t for p, t in zip(preds, y.tolist(), strict=True)]
        bits.append(row)
    for rank in ranks:
        assert {j: v.tolist() for j, v in rank["labels"].items()} == {
            j: y.tolist() for j, (_, y) in enumerate(test)
        }
        for phase, row in enumerate(bits):
            got = rank["bits"][phase]
            for j in range(3) if phase == 0 else range(phase):
                assert got[j].tolist() == row[j], (phase, j)
    assert ranks[0]["class_il"] == ranks[1]["class_il"]
    items = [torch.tensor([bits[i + 1][j] for i in range(3)]) for j in range(3)]
    want = class_il_bootstrap(
        items,
        [y for _, y in test],
        check_task_classes(GAUSS_CLASSES).class_task,
        resamples=200,
    )
    paired = ranks[0]["class_il"]["paired"]
    for key in ("mean_class_accuracy", "amca_per_stage", "mean_class_forgetting_per_stage"):
        for end, values in zip(("estimate", "low", "high"), want[key], strict=True):
            assert paired["per_stage"][key][end] == pytest.approx(
                [None if v != v else v for v in values.tolist()], abs=1e-12
            ), (key, end)


@pytest.mark.slow
def test_kill_during_an_evaluation_then_resume_gives_the_same_intervals(tmp_path):
    """SIGKILL inside stage 2's evaluation, resume from the checkpoint after task 1: the labels
    come back from the checkpoint, and results.json's class-IL intervals (Wilson and paired)
    equal those of the uninterrupted run; the killed run's directory (results.json and the
    stage journal) still replays the labels."""
    import signal

    from script_runner import run_script

    here = __import__("pathlib").Path(__file__).parent
    script = here / "class_il_items_kill_script.py"
    full = run_script(script, "full", tmp_path / "full", timeout=300)
    assert full.returncode == 0, full.stderr[-3000:]
    killed = run_script(script, "killed", tmp_path / "cut", timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    cut = ContinualResults.load(tmp_path / "cut" / "results")
    assert cut.stages_completed == 2
    reasons = cut.intervals.class_incremental.unavailable
    assert not any("labels were not recorded" in reason for reason in reasons.values())
    resumed = run_script(script, "resume", tmp_path / "cut", timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want = ContinualResults.load(tmp_path / "full" / "results").to_dict()["intervals"]
    got = ContinualResults.load(tmp_path / "cut" / "results").to_dict()["intervals"]
    assert want["class_incremental"]["paired"] is not None
    assert got["class_incremental"] == want["class_incremental"]
    assert got["matrices"] == want["matrices"]

"""Class-incremental evaluation: ``ContinualEvalCallback(task_classes=...)``'s two matrices
(``acc_task_aware``, ``acc_task_agnostic``), its confusion counts and every measure of the
``class_incremental`` section, each against a plain-torch loop on a hand-checkable problem; DDP
on 2 processes (exact, odd sizes); resume; wrong ``task_classes`` refused before training; the
logs, the report and the ``fit`` command with ``configs/digits_class_incremental.yaml``."""

from __future__ import annotations

import copy
import csv
import json
import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.evaluation import (
    EvaluationError,
    TaskAgnosticAccuracyScorer,
    TaskAwareAccuracyScorer,
    evaluate_tasks,
    task_classes_from_loaders,
)
from continual_eval.results import ContinualResults, InvalidResultsError
from script_runner import run_script

HERE = Path(__file__).parent
ROOT = HERE.parents[1]

# ---------------------------------------------------------------------------------------------
# the hand-checkable problem: two tasks, classes [[0, 1], [2, 3]]; the "model" returns a fixed
# table of logits per sample (its input is the sample's index), one table for the baseline and
# one per stage. Task 0: samples 0-2 (labels 0, 1, 0); task 1: samples 3-6 (labels 2, 3, 3, 2).
TASK_CLASSES = [[0, 1], [2, 3]]
LABELS = [0, 1, 0, 2, 3, 3, 2]
TASK_OF_SAMPLE = [0, 0, 0, 1, 1, 1, 1]
# per phase, per sample: its four logits
BASELINE = [[0, 1, 2, 3], [0, 1, 2, 3], [3, 0, 0, 0], [9, 0, 1, 0], [0, 9, 1, 2], [0, 0, 2, 1]]
AFTER_0 = [[1, 1, 0, 9], [0, 2, 0, 0], [0, 5, 0, 0], [5, 0, 1, 0], [0, 0, 1, 2], [0, 4, 1, 2]]
AFTER_1 = [[2, 1, 5, 0], [0, 3, 1, 4], [1, 2, 0, 0], [0, 0, 3, 1], [4, 0, 1, 2], [0, 0, 2, 1]]
# (after stage 0, sample 0 ties classes 0 and 1: the first maximum, class 0); sample 6 always
# scores its class 2 highest
TABLES = torch.tensor(
    [[*phase, [0, 0, 5, 0]] for phase in (BASELINE, AFTER_0, AFTER_1)], dtype=torch.float32
)


class TableModel(pl.LightningModule):
    """Logits looked up per sample: ``TABLES[phase][index]``; the phase advances as each stage's
    fit starts (baseline: phase 0; the evaluation after stage i: phase i + 1). Nothing trains."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.register_buffer("tables", TABLES[..., :width].clone() if width <= 4 else _wide(width))
        self.dummy = nn.Parameter(torch.zeros(1))
        self.phase = 0
        self.trained_steps = 0

    def on_train_start(self) -> None:
        self.phase += 1

    def forward(self, x):
        return self.tables[self.phase][x.long().reshape(-1)] + 0 * self.dummy

    def training_step(self, batch, batch_idx):
        self.trained_steps += 1
        return (self.dummy * 0).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _wide(width: int) -> torch.Tensor:
    out = torch.full((3, 7, width), -100.0)
    out[..., :4] = TABLES
    return out


def task_loaders(batch_size: int = 2) -> list[DataLoader]:
    idx = torch.arange(len(LABELS), dtype=torch.float32)[:, None]
    y = torch.tensor(LABELS)
    return [
        DataLoader(TensorDataset(idx[torch.tensor(m)], y[torch.tensor(m)]), batch_size=batch_size)
        for m in ([t == j for t in TASK_OF_SAMPLE] for j in range(2))
    ]


def trainer_kwargs(root: Path, **extra) -> dict:
    kwargs = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        default_root_dir=str(root),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        log_every_n_steps=1,
    )
    return kwargs | extra


# ---------------------------------------------------------------------------------------------
# the plain-torch reference: loops over samples and classes


def first_max(row: list[float], allowed: list[int]) -> int:
    best = None
    for c in sorted(allowed):
        if best is None or row[c] > row[best]:
            best = c
    assert best is not None
    return best


def allowed_agnostic(stage: int, task: int, task_classes=TASK_CLASSES) -> list[int]:
    """The classes of the tasks <= max(stage, task)."""
    return [c for k in range(max(stage, task) + 1) for c in task_classes[k]]


def reference_cell(logits, labels, allowed) -> tuple[int, int, list[int]]:
    """(correct, total, predictions) of one task's samples."""
    preds = [first_max(row, allowed) for row in logits.tolist()]
    return sum(int(p == y) for p, y in zip(preds, labels, strict=True)), len(labels), preds


def reference_run(tables, labels, task_of, task_classes):
    """Rows (baseline first) of both matrices and the per-stage confusion of the seen tasks."""
    T, C = len(task_classes), tables.shape[-1]
    aware, agnostic, confusion = [], [], []
    for phase in range(tables.shape[0]):
        stage = phase - 1
        rows = ([], [])
        conf = [[0] * C for _ in range(C)]
        for j in range(T):
            members = [n for n, t in enumerate(task_of) if t == j]
            logits, ys = tables[phase][members], [labels[n] for n in members]
            c, n, _ = reference_cell(logits, ys, task_classes[j])
            rows[0].append(c / n)
            c, n, preds = reference_cell(logits, ys, allowed_agnostic(stage, j, task_classes))
            rows[1].append(c / n)
            if 0 <= j <= stage:
                for y, p in zip(ys, preds, strict=True):
                    conf[y][p] += 1
        aware.append(rows[0])
        agnostic.append(rows[1])
        if stage >= 0:
            confusion.append(conf)
    return aware, agnostic, confusion


def nan_equal(a, b) -> bool:
    a, b = list(a), list(b)
    return len(a) == len(b) and all(
        (x is None or (isinstance(x, float) and math.isnan(x)))
        == (y is None or (isinstance(y, float) and math.isnan(y)))
        and (
            x is None
            or (isinstance(x, float) and math.isnan(x))
            or math.isclose(x, y, rel_tol=0, abs_tol=1e-12)
        )
        for x, y in zip(a, b, strict=True)
    )


def reference_measures(confusion, task_classes, forgetting="peak") -> dict:
    """Every measure of the class_incremental section by loops over the confusion counts."""
    C = len(confusion[0])
    task_of = {c: k for k, cs in enumerate(task_classes) for c in cs}
    S = len(confusion)
    nan = math.nan

    def n_of(conf, c):
        return sum(conf[c])

    per_class, seen_s, seen_t, old_s, old_t, new, mca, pred_share, sample_share = (
        [],
        [],
        [],
        [],
        [],
        [],
        [],
        [],
        [],
    )
    for i, conf in enumerate(confusion):
        acc = [
            conf[c][c] / n_of(conf, c)
            if c in task_of and task_of[c] <= i and n_of(conf, c)
            else nan
            for c in range(C)
        ]
        per_class.append(acc)
        seen = [c for c in range(C) if c in task_of and task_of[c] <= i]

        def pooled(classes, conf=conf):
            n = sum(n_of(conf, c) for c in classes)
            return sum(conf[c][c] for c in classes) / n if n else nan

        def task_mean(tasks, conf=conf):
            values = [pooled(task_classes[k]) for k in tasks]
            values = [v for v in values if not math.isnan(v)]
            return sum(values) / len(values) if values else nan

        seen_s.append(pooled(seen))
        seen_t.append(task_mean(range(i + 1)))
        old = [c for c in seen if task_of[c] < i]
        old_s.append(pooled(old) if old else nan)
        old_t.append(task_mean(range(i)) if i else nan)
        new.append(pooled(task_classes[i]))
        defined = [a for a in acc if not math.isnan(a)]
        mca.append(sum(defined) / len(defined))
        total = sum(n_of(conf, c) for c in seen)
        pred_share.append(sum(conf[c][p] for c in seen for p in task_classes[i]) / total)
        sample_share.append(sum(n_of(conf, c) for c in task_classes[i]) / total)
    forgetting_per_class = []
    for c in range(C):
        history = [per_class[k][c] for k in range(S)]
        earlier = [v for v in history[:-1] if not math.isnan(v)]
        final = history[-1]
        if not earlier or math.isnan(final):
            forgetting_per_class.append(nan)
            continue
        best = max([*earlier, final]) if forgetting == "peak" else max(earlier)
        forgetting_per_class.append(best - final)
    defined = [v for v in forgetting_per_class if not math.isnan(v)]
    return {
        "per_class": per_class,
        "seen_sample": seen_s,
        "seen_task": seen_t,
        "old_sample": old_s,
        "old_task": old_t,
        "new": new,
        "mca": mca,
        "amca": sum(mca) / S,
        "class_forgetting": forgetting_per_class,
        "mean_class_forgetting": sum(defined) / len(defined) if defined else nan,
        "pred_share": pred_share,
        "sample_share": sample_share,
    }


# ---------------------------------------------------------------------------------------------
# one run of the callback on the hand-checkable problem


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("class_il")
    cb = ContinualEvalCallback(
        task_loaders(),
        task_classes=TASK_CLASSES,
        dirpath=root / "out",
        verbose=False,
        log_images=False,
    )
    model = TableModel()
    logger = CSVLogger(root, name="csv")
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(root, logger=logger))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_tasks(trainer, model, task_loaders())
    return cb, root


def test_matrices_equal_the_hand_computed_and_plain_torch_values(run):
    cb, _ = run
    results = cb.continual_results()
    assert list(results.matrices) == ["acc", "acc_task_aware", "acc_task_agnostic"]
    aware, agnostic = results["acc_task_aware"], results["acc_task_agnostic"]
    # by hand, from TABLES (see the comments there)
    assert aware.baseline.tolist() == [2 / 3, 3 / 4]
    assert agnostic.baseline.tolist() == [2 / 3, 1 / 4]
    assert aware.scores.tolist() == [[2 / 3, 1.0], [2 / 3, 3 / 4]]
    assert agnostic.scores.tolist() == [[2 / 3, 2 / 4], [0.0, 2 / 4]]
    # and by the plain-torch loops
    ref_aware, ref_agnostic, _ = reference_run(TABLES, LABELS, TASK_OF_SAMPLE, TASK_CLASSES)
    assert aware.baseline.tolist() == ref_aware[0] and aware.scores.tolist() == ref_aware[1:]
    assert agnostic.baseline.tolist() == ref_agnostic[0]
    assert agnostic.scores.tolist() == ref_agnostic[1:]
    # they differ on every cell where the task-agnostic argmax has more than the task's classes
    # (max(i, j) >= 1); on task 0 at the baseline and after stage 0 both see task 0's classes only
    full = torch.cat([aware.baseline[None], aware.scores])
    other = torch.cat([agnostic.baseline[None], agnostic.scores])
    for phase in range(3):
        for j in range(2):
            same = max(phase - 1, j) == 0
            assert (full[phase, j] == other[phase, j]) == same, (phase, j)
    # the plain accuracy matrix is the argmax over every output
    plain = torch.cat([results["acc"].baseline[None], results["acc"].scores])
    for phase in range(3):
        for j in range(2):
            members = [n for n, t in enumerate(TASK_OF_SAMPLE) if t == j]
            hits = [int(TABLES[phase][n].argmax()) == LABELS[n] for n in members]
            assert plain[phase, j] == sum(hits) / len(hits)


def test_confusion_and_every_measure_equal_the_plain_loops(run):
    cb, _ = run
    section = cb.continual_results().class_incremental
    _, ref_agnostic, ref_confusion = reference_run(TABLES, LABELS, TASK_OF_SAMPLE, TASK_CLASSES)
    assert section.confusion.layout == torch.sparse_coo  # the nonzero cells only
    assert section.confusion.to_dense().tolist() == ref_confusion
    # by hand: after stage 1, task 0's samples (labels 0, 1, 0) are predicted 2, 3, 1 and task
    # 1's (labels 2, 3, 3, 2) 2, 0, 2, 2
    assert section.stage_confusion(1).tolist() == [
        [0, 1, 1, 0],
        [0, 0, 0, 1],
        [0, 0, 2, 0],
        [1, 0, 1, 0],
    ]
    ref = reference_measures(ref_confusion, TASK_CLASSES)
    assert all(
        nan_equal(a, b)
        for a, b in zip(section.per_class_accuracy.tolist(), ref["per_class"], strict=True)
    )
    assert nan_equal(section.seen_accuracy["sample"].tolist(), ref["seen_sample"])
    assert nan_equal(section.seen_accuracy["task"].tolist(), ref["seen_task"])
    # the two weightings differ at stage 1 (task sizes 3 and 4): 2/7 pooled, (0 + 2/4) / 2
    assert section.seen_accuracy["sample"].tolist() == [2 / 3, 2 / 7]
    assert section.seen_accuracy["task"].tolist() == [2 / 3, 0.25]
    # task-weighted seen accuracy is the mean of acc_task_agnostic's row over j <= i
    agnostic = torch.tensor(ref_agnostic[1:], dtype=torch.float64)
    assert section.seen_accuracy["task"].tolist() == [
        agnostic[i, : i + 1].mean().item() for i in range(2)
    ]
    assert section.last_accuracy == {"sample": 2 / 7, "task": 0.25}
    assert section.average_incremental_accuracy["sample"] == pytest.approx(
        (2 / 3 + 2 / 7) / 2, abs=1e-15
    )
    assert section.average_incremental_accuracy["task"] == pytest.approx(
        (2 / 3 + 0.25) / 2, abs=1e-15
    )
    assert nan_equal(section.old_accuracy["sample"].tolist(), ref["old_sample"])
    assert nan_equal(section.old_accuracy["task"].tolist(), ref["old_task"])
    assert nan_equal(section.new_accuracy.tolist(), ref["new"])
    assert nan_equal(section.mean_class_accuracy.tolist(), ref["mca"])
    assert section.amca == pytest.approx(ref["amca"], abs=1e-15)
    assert nan_equal(section.class_forgetting.tolist(), ref["class_forgetting"])
    assert section.mean_class_forgetting == pytest.approx(ref["mean_class_forgetting"], abs=1e-15)
    assert nan_equal(section.recency_prediction_share.tolist(), ref["pred_share"])
    assert nan_equal(section.recency_sample_share.tolist(), ref["sample_share"])
    # by hand: after stage 1, 5 of the 7 seen samples are predicted as task 1's classes (2, 3);
    # task 1 holds 4 of the 7 samples
    assert section.recency_prediction_share[1].item() == 5 / 7
    assert section.recency_sample_share[1].item() == 4 / 7
    assert section.class_order == [0, 1, 2, 3]


def test_results_json_section_validates_and_round_trips(run):
    cb, root = run
    document = ContinualResults.load(root / "out").to_dict()
    section = document["class_incremental"]
    assert section["task_classes"] == TASK_CLASSES and section["num_classes"] == 4
    assert section["class_order"] == [0, 1, 2, 3]
    assert section["confusion"]["stages"][0] == "0:0:1 0:1:1 1:1:1"  # true:predicted:count
    assert section["per_class_accuracy"][0][2:] == [None, None]  # task 1 not seen after stage 0
    assert section["old_accuracy"]["sample"][0] is None  # no old class at stage 0
    again = ContinualResults.from_dict(document)
    assert (
        again.class_incremental.to_section()
        == cb.continual_results().class_incremental.to_section()
    )
    assert torch.equal(
        again.class_incremental.confusion.to_dense(),
        cb.continual_results().class_incremental.confusion.to_dense(),
    )
    # a document without the section (an older file) reads as before
    del document["class_incremental"]
    assert ContinualResults.from_dict(document).class_incremental is None


def _add_cell(section: dict, stage: int, text: str) -> None:
    section["confusion"]["stages"][stage] += text


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda s: _add_cell(s, 1, " 5:0:1"), "class ids below 4"),
        (lambda s: _add_cell(s, 0, " 2:0:1"), "a class of a task <= 0"),
        (lambda s: _add_cell(s, 0, " 0:0:3"), "each confusion cell at most once"),
        (lambda s: _add_cell(s, 0, " 0:1:0"), "a count >= 1"),
        (lambda s: _add_cell(s, 0, " 0:1:-1"), "decimal integers"),
        (lambda s: _add_cell(s, 0, "  0:2:1"), "decimal integers"),
        (lambda s: s["confusion"]["stages"].__setitem__(0, [[0, 0, 1]]), "confusion.stages[0]"),
        (lambda s: s["confusion"]["stages"].pop(), "confusion.stages"),
        (lambda s: s["task_classes"][1].append(0), "task_classes[1][2]"),
        (lambda s: s.__setitem__("num_classes", 10**6), "num_classes"),
        (lambda s: s["task_classes"].pop(), "task_classes"),
        (lambda s: s["per_class_accuracy"][0].pop(), "per_class_accuracy[0]"),
        (lambda s: s["seen_accuracy"].__setitem__("sample", [0.5]), "seen_accuracy.sample"),
        (lambda s: s.__setitem__("amca", "high"), "amca"),
    ],
)
def test_schema_refuses_a_bad_section(run, edit, field):
    _, root = run
    document = ContinualResults.load(root / "out").to_dict()
    edit(document["class_incremental"])
    with pytest.raises(InvalidResultsError) as err:
        ContinualResults.from_dict(document)
    text = str(err.value)
    assert "class_incremental" in text
    assert field.split(" ")[0] in text or field in text, text


def test_logged_scalars_per_stage(run):
    cb, root = run
    with open(root / "csv" / "version_0" / "metrics.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("continual/class_il/seen_acc_sample")]
    assert [int(r["step"]) for r in rows] == [0, 1]
    section = cb.continual_results().class_incremental
    last = rows[-1]
    assert float(last["continual/class_il/seen_acc_sample"]) == pytest.approx(2 / 7)
    assert float(last["continual/class_il/seen_acc_task"]) == pytest.approx(0.25)
    assert float(last["continual/class_il/old_acc"]) == pytest.approx(0.0)
    assert float(last["continual/class_il/new_acc"]) == pytest.approx(0.5)
    assert float(last["continual/class_il/amca"]) == pytest.approx(section.amca)
    assert float(last["continual/class_il/recency_prediction_share"]) == pytest.approx(5 / 7)
    assert float(last["continual/class_il/recency_sample_share"]) == pytest.approx(4 / 7)
    assert float(last["continual/class_il/class_forgetting"]) == pytest.approx(
        section.mean_class_forgetting
    )
    assert rows[0]["continual/class_il/old_acc"] == ""  # undefined at stage 0: not logged
    assert float(last["continual/acc_task_agnostic/acc"]) == pytest.approx(0.25)


def test_confusion_figure_and_report(run, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from continual_eval.report import write_report

    cb, root = run
    fig = cb.continual_results().class_incremental.confusion_figure(-1)
    ax = fig.axes[0]
    image = ax.images[0].get_array()
    # rows in arrival order, normalised: class 3's two samples went to 2 and 0
    assert image[3].tolist() == [0.5, 0.0, 0.5, 0.0]
    report = write_report([root / "out"], tmp_path / "report")
    text = report.read_text()
    assert "## Class-incremental evaluation" in text
    assert list((tmp_path / "report").glob("*_aware_vs_agnostic.png"))
    assert list((tmp_path / "report").glob("*_confusion.png"))


def test_tensorboard_gets_the_confusion_image_and_per_step_curves_use_the_stage(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = TensorBoardLogger(tmp_path, name="tb")
    cb = ContinualEvalCallback(
        task_loaders(),
        task_classes=TASK_CLASSES,
        dirpath=tmp_path / "out",
        verbose=False,
        eval_every_n_steps=1,
    )
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, logger=tb))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_tasks(trainer, TableModel(), task_loaders())
    events = EventAccumulator(str(tb.log_dir), size_guidance={"images": 0})
    events.Reload()
    images = events.Images("continual/class_il/confusion")
    assert [im.step for im in images] == [0, 1]
    assert images[-1].encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"
    for tag in ("acc_task_aware_matrix", "acc_task_agnostic_matrix"):
        assert [im.step for im in events.Images(f"continual/{tag}")] == [0, 1]
    # per-step evaluations inside stage i restrict the task-agnostic argmax to the tasks <= i
    # (the tables do not change inside a stage): each stage's points equal its row of R
    steps, stage, curve = cb.curves("acc_task_agnostic")
    rows = cb.matrices["acc_task_agnostic"]
    for n in range(len(steps)):
        i = int(stage[n])
        assert curve[n, : i + 1].tolist() == rows[i, : i + 1].tolist(), n


# ---------------------------------------------------------------------------------------------
# the scorers alone: evaluate_tasks, all_outputs, a batch at a time or concatenated


@pytest.mark.parametrize("batch_size", [1, 2, 7])
def test_scorers_in_evaluate_tasks_match_the_loops(batch_size):
    model = TableModel()
    model.phase = 2
    aware = TaskAwareAccuracyScorer(TASK_CLASSES)
    agnostic = TaskAgnosticAccuracyScorer(TASK_CLASSES)
    every = TaskAgnosticAccuracyScorer(TASK_CLASSES, all_outputs=True)
    for stage in (-1, 0, 1):
        result = evaluate_tasks(
            model, task_loaders(batch_size), [0, 1], scorers=[aware, agnostic, every], stage=stage
        )
        assert result.details_by_scorer[0] is None  # the task-aware scorer counts no confusion
        for j in range(2):
            members = [n for n, t in enumerate(TASK_OF_SAMPLE) if t == j]
            logits, ys = TABLES[2][members], [LABELS[n] for n in members]
            expected = [
                reference_cell(logits, ys, TASK_CLASSES[j])[0] / len(ys),
                reference_cell(logits, ys, allowed_agnostic(stage, j))[0] / len(ys),
                reference_cell(logits, ys, [0, 1, 2, 3])[0] / len(ys),
            ]
            got = [float(s[j]) for s in result.scores_by_scorer]
            assert got == expected, (stage, j)
            for i, allowed in ((1, allowed_agnostic(stage, j)), (2, [0, 1, 2, 3])):
                _, _, preds = reference_cell(logits, ys, allowed)
                block = torch.zeros(2, 4, dtype=torch.int64)
                for y, p in zip(ys, preds, strict=True):
                    block[TASK_CLASSES[j].index(y), p] += 1
                assert torch.equal(result.details_by_scorer[i][j], block), (stage, j, i)
        # with every output allowed, the task-agnostic accuracy differs from the task-aware one
        # on every cell of this table (0 vs 2/3 on task 0, 2/4 vs 3/4 on task 1)
        assert all(a != b for a, b in zip(*result.scores_by_scorer[::2], strict=True))


def test_all_outputs_with_wider_logits_needs_confusion_off():
    model = TableModel(width=6)
    loaders = task_loaders()
    every = TaskAgnosticAccuracyScorer(TASK_CLASSES, all_outputs=True)
    with pytest.raises(EvaluationError, match="all_outputs=True counts every prediction"):
        evaluate_tasks(model, loaders, [0, 1], scorers=[every])
    quiet = TaskAgnosticAccuracyScorer(TASK_CLASSES, all_outputs=True, confusion=False)
    result = evaluate_tasks(model, loaders, [0, 1], scorers=[quiet, "accuracy"])
    assert torch.equal(result.scores_by_scorer[0], result.scores_by_scorer[1])
    # seen-class restriction with wider logits: the extra outputs are never predicted
    seen = TaskAgnosticAccuracyScorer(TASK_CLASSES)
    model.tables[..., 4:] = 100.0
    result = evaluate_tasks(model, loaders, [0, 1], scorers=[seen, "accuracy"], stage=1)
    assert result.scores_by_scorer[1].tolist() == [0.0, 0.0]
    assert result.scores_by_scorer[0].tolist() == [1 / 3, 1 / 4]  # TABLES[0], 4 classes seen


def test_task_classes_from_loaders():
    assert task_classes_from_loaders(task_loaders()) == TASK_CLASSES
    idx = torch.arange(4, dtype=torch.float32)[:, None]
    overlapping = [
        DataLoader(TensorDataset(idx, torch.tensor([0, 1, 1, 0]))),
        DataLoader(TensorDataset(idx, torch.tensor([1, 2, 2, 2]))),
    ]
    with pytest.raises(ValueError, match="class 1 is in task 0 and in task 1"):
        task_classes_from_loaders(overlapping)
    empty = [DataLoader(TensorDataset(idx[:0], torch.zeros(0, dtype=torch.long)))]
    with pytest.raises(ValueError, match="yielded no sample"):
        task_classes_from_loaders(empty)


# ---------------------------------------------------------------------------------------------
# wrong task_classes: refused before any training step


@pytest.mark.parametrize(
    ("task_classes", "message"),
    [
        ([[0, 1], [1, 2]], "class 1 is in task 0 and in task 1"),
        ([[0, 1], []], "task 1 has no classes"),
        ([[0, -1], [2, 3]], "class id -1 is negative"),
        ([[0, 1]], "task_classes has 1 class-id lists for 2 test dataloaders"),
        ([[0, 1], [2, 3], [4]], "task_classes has 3 class-id lists for 2 test dataloaders"),
    ],
)
def test_wrong_task_classes_refused_at_construction(task_classes, message):
    with pytest.raises(ValueError, match=message):
        ContinualEvalCallback(task_loaders(), task_classes=task_classes, verbose=False)


def test_scorers_must_not_name_the_added_matrices():
    with pytest.raises(ValueError, match="scorers already name a matrix 'acc_task_aware'"):
        ContinualEvalCallback(
            task_loaders(),
            scorers={"acc": "accuracy", "acc_task_aware": "accuracy"},
            task_classes=TASK_CLASSES,
        )


@pytest.mark.parametrize(
    ("task_classes", "message"),
    [
        # a class id beyond the 4 outputs: named with its task at the baseline
        ([[0, 1], [2, 7]], r"4 class scores per sample, but task_classes names class 7 \(task 1\)"),
        # task 0's test set holds labels 0 and 1: a mapping that swaps the tasks
        ([[2, 3], [0, 1]], "targets are not classes of this task"),
    ],
)
def test_wrong_task_classes_stop_the_fit_before_training(tmp_path, task_classes, message):
    cb = ContinualEvalCallback(
        task_loaders(), task_classes=task_classes, dirpath=tmp_path / "out", verbose=False
    )
    model = TableModel()
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path))
    with pytest.raises(EvaluationError, match=message) as err:
        trainer.fit(model, task_loaders()[0])
    assert "task_0" in str(err.value) or "task_1" in str(err.value)  # the task is named
    assert model.trained_steps == 0


def test_inverted_cells_warn(tmp_path):
    """The record's section reports the cells where the task-aware accuracy is below the
    task-agnostic one; the callback warns with it (rank 0), once per run."""
    from continual_eval._class_incremental_recorder import ClassIncrementalRecord
    from continual_eval.record import Scored

    section = ClassIncrementalRecord(TaskAgnosticAccuracyScorer(TASK_CLASSES), ["a", "b"])
    rows = {
        "acc_task_aware": torch.tensor([0.5, 0.9], dtype=torch.float64),
        "acc_task_agnostic": torch.tensor([0.75, 0.1], dtype=torch.float64),
    }
    blocks = torch.zeros(2, 2, 4, dtype=torch.int64)
    (note,) = section.record_stage(0, Scored(rows, {"acc_task_agnostic": blocks}, (0, 1)))
    assert re.search(r"task-aware accuracy is below .* a \(0.5000 < 0.7500\)", note)
    rows["acc_task_aware"] = torch.tensor([0.75, 0.9], dtype=torch.float64)
    assert section.record_stage(1, Scored(rows, {"acc_task_agnostic": blocks}, (0, 1))) == []


# ---------------------------------------------------------------------------------------------
# resume, old checkpoints, DDP


def _gaussian_problem():
    from class_incremental_ddp_script import TASK_CLASSES as GAUSS_CLASSES
    from class_incremental_ddp_script import Net, make_problem

    train, test = make_problem()
    train_loaders = [DataLoader(TensorDataset(x, y), batch_size=8) for x, y in train]
    test_loaders = [DataLoader(TensorDataset(x, y), batch_size=8) for x, y in test]
    return GAUSS_CLASSES, Net, train_loaders, test_loaders


def test_resume_equals_uninterrupted(tmp_path):
    classes, Net, train, test = _gaussian_problem()

    def run(loaders, root, ckpt_path=None):
        cb = ContinualEvalCallback(test, task_classes=classes, dirpath=root, verbose=False)

        def factory(task):
            return pl.Trainer(callbacks=[cb], **trainer_kwargs(root, max_epochs=2))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit_tasks(factory, Net(), loaders, checkpoint_dir=root / "ckpt", ckpt_path=ckpt_path)
        return cb

    full = run(train, tmp_path / "full")
    first = run(train[:2], tmp_path / "cut")
    assert first.stages_completed == 2
    saved = torch.load(tmp_path / "cut" / "ckpt" / "task_1.ckpt", weights_only=False)
    state = saved["callbacks"][first.state_key]
    assert sorted(state["record"]["sections"]["class_incremental"]["cells"]) == [0, 1]
    resumed = run(train, tmp_path / "cut", ckpt_path=tmp_path / "cut" / "ckpt" / "task_1.ckpt")
    a, b = full.continual_results(), resumed.continual_results()
    assert torch.equal(
        a.class_incremental.confusion.to_dense(), b.class_incremental.confusion.to_dense()
    )
    assert a.class_incremental.to_section() == b.class_incremental.to_section()
    for name in a.matrices:
        assert torch.equal(a[name].scores, b[name].scores), name
    assert (
        ContinualResults.load(tmp_path / "cut").to_dict()["class_incremental"]
        == ContinualResults.load(tmp_path / "full").to_dict()["class_incremental"]
    )
    # the confusion counts change over the stages (the check above is not vacuous)
    assert not torch.equal(
        a.class_incremental.stage_confusion(0), a.class_incremental.stage_confusion(2)
    )

    # other task_classes: refused
    swapped = ContinualEvalCallback(test, task_classes=[classes[1], classes[0], classes[2]])
    with pytest.raises(ValueError, match="other task_classes"):
        swapped.load_state_dict(copy.deepcopy(state))


@pytest.mark.slow
def test_a_thousand_tasks_of_two_classes_run_with_bounded_memory(tmp_path):
    """T = 1000 tasks x 2 classes (C = 2000) is accepted (the old stages x C**2 cap refused
    anything above about 203 such tasks) and a real Trainer run records its stages with the
    counts stored sparsely: peak RSS of the whole process (torch, Lightning, the 1000 test
    loaders) under 1.5 GiB (dense per-stage [C, C] int64 matrices alone would take 32 MB per
    stage, 32 GB for the 1000 stages); every stage's cells equal a plain count of the
    task-agnostic matrix's correct samples and of the test labels; results.json and the
    checkpoint state (weights_only) give the same section."""
    proc = run_script(HERE / "class_incremental_scale_script.py", tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["num_stages"] == 3 and out["num_classes"] == 2000
    assert out["peak_rss_mib"] < 1536, out["peak_rss_mib"]
    labels = out["labels"]
    samples = [0] * 2000  # the classes seen (tasks 0 .. 2); the others were never counted
    for ys in labels[:3]:
        for y in ys:
            samples[y] += 1
    assert out["test_samples"] == samples
    for stage, cells in enumerate(out["cells"]):
        # row sums: the seen tasks' test labels; diagonal: the task-agnostic correct counts
        rows, correct = {}, {}
        for t, p, n in cells:
            assert n >= 1 and t // 2 <= stage
            rows[t] = rows.get(t, 0) + n
            correct[t // 2] = correct.get(t // 2, 0) + (n if t == p else 0)
        expected = {}
        for j in range(stage + 1):
            for y in labels[j]:
                expected[y] = expected.get(y, 0) + 1
        assert rows == expected, stage
        for j in range(stage + 1):
            assert correct.get(j, 0) / len(labels[j]) == out["agnostic"][stage][j], (stage, j)
        assert cells == sorted(cells)  # row-major
    assert out["stored_cells"] == sum(len(c) for c in out["cells"]) <= 2 * (1 + 2 + 3)
    assert out["file_equal"] and out["checkpoint_equal"]


@pytest.mark.slow
def test_ddp_two_processes_exact(tmp_path):
    from class_incremental_ddp_script import TASK_CLASSES as GAUSS_CLASSES
    from class_incremental_ddp_script import TEST_SIZES, make_net, make_problem

    proc = run_script(HERE / "class_incremental_ddp_script.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert rank0["world_size"] == 2
    assert all(n % 2 for n in TEST_SIZES)
    assert torch.equal(rank0["confusion"], rank1["confusion"])
    assert rank0["section"] == rank1["section"]
    _, test = make_problem()
    labels = [y for _, ys in test for y in ys.tolist()]
    task_of = [j for j, (_, ys) in enumerate(test) for _ in range(len(ys))]
    x_all = torch.cat([x for x, _ in test])
    phases = ["weights_baseline.pt", *(f"weights_{i}.pt" for i in range(3))]
    tables = []
    net = make_net()
    for name in phases:
        state = torch.load(tmp_path / name)
        net.load_state_dict({k.removeprefix("net."): v for k, v in state.items()})
        with torch.no_grad():
            tables.append(net(x_all))
    aware, agnostic, confusion = reference_run(torch.stack(tables), labels, task_of, GAUSS_CLASSES)
    for rank in (rank0, rank1):
        assert rank["baselines"]["acc_task_aware"].tolist() == aware[0]
        assert rank["matrices"]["acc_task_aware"].tolist() == aware[1:]
        assert rank["baselines"]["acc_task_agnostic"].tolist() == agnostic[0]
        assert rank["matrices"]["acc_task_agnostic"].tolist() == agnostic[1:]
        assert rank["confusion"].tolist() == confusion  # exact integer counts
    assert aware[1:] != agnostic[1:]
    assert ContinualResults.load(tmp_path / "run").to_dict()["class_incremental"] == json.loads(
        json.dumps(rank0["section"])
    )


# ---------------------------------------------------------------------------------------------
# the fit command with configs/digits_class_incremental.yaml


def test_split_digits_task_classes_match_the_config():
    pytest.importorskip("sklearn")
    import yaml

    from continual_eval.experiments.digits import SplitDigits

    config = yaml.safe_load((ROOT / "configs" / "digits_class_incremental.yaml").read_text())
    data = SplitDigits(scenario="class")
    assert data.task_classes == config["continual"]["task_classes"]
    assert task_classes_from_loaders(data.test_dataloader()) == data.task_classes
    with pytest.raises(ValueError, match="needs scenario='class'"):
        _ = SplitDigits(scenario="domain").task_classes


@pytest.mark.slow
def test_fit_command_with_the_class_incremental_config(tmp_path, monkeypatch):
    pytest.importorskip("sklearn")
    from continual_eval.cli import main as continual_eval

    monkeypatch.chdir(tmp_path)
    config = ROOT / "configs" / "digits_class_incremental.yaml"
    args = ["fit", "--config", str(config), "--trainer.max_epochs=1", "--stream.seeds=[0]"]
    assert continual_eval(args) == 0
    run_dir = tmp_path / "runs" / "digits_class_incremental" / "naive" / "version_0"
    document = ContinualResults.load(run_dir).to_dict()
    assert document["class_incremental"]["task_classes"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert set(document["matrices"]) == {"acc", "acc_task_aware", "acc_task_agnostic"}
    assert len(document["class_incremental"]["confusion"]["stages"]) == 5
    report = run_dir / "report"
    assert list(report.glob("*_aware_vs_agnostic.png")) and list(report.glob("*_confusion.png"))
    assert "## Class-incremental evaluation" in (report / "report.md").read_text()
    # the two configs differ only in the method
    replay = (ROOT / "configs" / "digits_class_incremental_replay.yaml").read_text()
    assert "replay_capacity: 100" in replay and "method: replay" in replay


# ---------------------------------------------------------------------------------------------
# bounds before allocation
_BOUNDED_MEMORY = """
import json, resource, sys, time
limit = 3 * 2**30  # address space: torch and Lightning fit, an [10**9] int64 table does not
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import torch
from torch.utils.data import DataLoader, TensorDataset
from continual_eval import ContinualEvalCallback
loader = DataLoader(TensorDataset(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long)))
start = time.perf_counter()
try:
    ContinualEvalCallback([loader, loader], task_classes=[[0, 1], [2, 10**9]])
    outcome = ("accepted", "")
except Exception as err:
    outcome = (type(err).__name__, str(err))
print(json.dumps([*outcome, time.perf_counter() - start]))
"""


@pytest.mark.slow
def test_a_huge_class_id_is_refused_fast_with_bounded_memory():
    """``task_classes`` holding the id 10**9 is refused by the cap before anything is sized by
    the ids (a per-id table would take 8 GB): under a 3 GiB address-space limit the callback
    raises the cap's ValueError, not an allocation failure, within a fraction of a second."""
    proc = subprocess.run(
        [sys.executable, "-c", _BOUNDED_MEMORY],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    kind, message, seconds = json.loads(proc.stdout.strip().splitlines()[-1])
    assert kind == "ValueError", message
    assert "task 1 lists class id 1000000000" in message and "at most 5000 classes" in message
    assert seconds < 5


def test_class_id_and_confusion_cell_caps_are_checked_before_the_scorers_are_built():
    from continual_eval._class_incremental_recorder import check_class_id_bounds

    with pytest.raises(ValueError, match="task 0 lists class id 5000"):
        check_class_id_bounds(torch.tensor([[5000, 1]]))
    # the per-class tables (stages x classes) are capped at 2**22 cells: 2000 tasks over 2098
    # class ids are too many, over 2097 they are not
    tasks = [[k] for k in range(1999)]
    with pytest.raises(ValueError, match=r"2000 tasks over class ids 0 \.\. 2097"):
        check_class_id_bounds([*tasks, [2097]])
    check_class_id_bounds([*tasks, [2096]])
    # the confusion counts are no longer capped by stages x classes**2 (2**25 refused anything
    # above about 203 tasks of 2 classes): T = 1000 tasks of 2 classes is accepted
    check_class_id_bounds([[2 * t, 2 * t + 1] for t in range(1000)])
    check_class_id_bounds([[0, "x"], 7])  # left to check_task_classes, which names them
    with pytest.raises(ValueError, match="task 1 lists class id 5000"):
        ContinualEvalCallback(task_loaders(), task_classes=[[0], [5000]])

"""Several score matrices from one evaluation: accuracy, cross-entropy (lower is better), top-k
and a torchmetrics F1, each against a plain-torch reference computed from the same weights; the
results document (format 2), its CSV files, the log keys and resume."""

from __future__ import annotations

import csv
import math

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import (
    NUM_CLASSES,
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

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.evaluation import TopKAccuracyScorer
from continual_eval.results import ContinualResults, check_results_files


def reference_scores(weights: dict, tasks) -> dict[str, list[float]]:
    """Plain torch over the whole test sets: accuracy, mean cross-entropy, top-2, macro F1."""
    net = make_net()
    net.load_state_dict({k.removeprefix("net."): v for k, v in weights.items()})
    net.eval()
    out: dict[str, list[float]] = {"acc": [], "loss": [], "top2": [], "f1": []}
    with torch.no_grad():
        for _, (x, y) in tasks:
            logits = net(x)
            pred = logits.argmax(1)
            out["acc"].append(int((pred == y).sum()) / len(y))
            losses = nn.functional.cross_entropy(logits, y, reduction="none").double()
            out["loss"].append(float(losses.sum()) / len(y))
            top2 = logits.topk(2, dim=1).indices
            out["top2"].append(int((top2 == y[:, None]).any(1).sum()) / len(y))
            f1 = []
            for c in range(NUM_CLASSES):
                tp = int(((pred == c) & (y == c)).sum())
                denom = int((pred == c).sum()) + int((y == c).sum())
                f1.append(2 * tp / denom if denom else 0.0)
            out["f1"].append(sum(f1) / NUM_CLASSES)
    return out


class CountingClassifier(Classifier):
    def __init__(self, net):
        super().__init__(net)
        self.eval_forwards = 0

    def forward(self, x):
        if not self.training:
            self.eval_forwards += 1
        return super().forward(x)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from torchmetrics.classification import MulticlassF1Score

    root = tmp_path_factory.mktemp("scorers")
    tasks = make_tasks()
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        scorers={
            "acc": "accuracy",
            "loss": "cross_entropy",
            "top2": TopKAccuracyScorer(2),
            "f1": MulticlassF1Score(num_classes=NUM_CLASSES, average="macro"),
        },
        dirpath=root / "out",
        verbose=False,
    )
    snapshots = Snapshots()
    model = CountingClassifier(make_net())
    logger = CSVLogger(root, name="csv")
    trainer = pl.Trainer(
        callbacks=[snapshots, cb], **trainer_kwargs(root, max_epochs=1, logger=logger)
    )
    fit_tasks(trainer, model, train_loaders(tasks))
    return tasks, cb, snapshots, model, root


def test_every_matrix_equals_the_plain_torch_reference(run):
    tasks, cb, snapshots, _, _ = run
    baseline = reference_scores(snapshots.weights[0], tasks)
    rows = [reference_scores(w, tasks) for w in snapshots.weights[1:]]
    matrices = cb.matrices
    assert list(matrices) == ["acc", "loss", "top2", "f1"]
    for name in ("acc", "top2"):  # counts: exact
        assert torch.equal(
            matrices[name], torch.tensor([r[name] for r in rows], dtype=torch.float64)
        ), name
    assert torch.allclose(
        matrices["loss"],
        torch.tensor([r["loss"] for r in rows], dtype=torch.float64),
        rtol=1e-6,  # float32 per-sample losses: logsumexp - s_y vs F.cross_entropy's rounding
        atol=0,
    )
    assert torch.allclose(
        matrices["f1"], torch.tensor([r["f1"] for r in rows], dtype=torch.float64), atol=1e-6
    )
    assert torch.equal(cb.scores, matrices["acc"])  # the primary matrix
    assert torch.allclose(
        cb.record.matrices["loss"].baseline,
        torch.tensor(baseline["loss"], dtype=torch.float64),
        rtol=1e-6,
    )


def test_one_forward_pass_feeds_every_scorer(run):
    tasks, _, _, model, _ = run
    batches = sum(math.ceil(len(te[1]) / 8) for _, te in tasks)
    assert model.eval_forwards == 4 * batches  # baseline + 3 stages, not x4 scorers


def test_results_document_csv_files_and_lower_is_better_metrics(run):
    _, cb, _, _, root = run
    loaded = ContinualResults.load(root / "out")
    results = loaded.to_dict()
    assert results["format_version"] == 2
    assert list(results["matrices"]) == ["acc", "loss", "top2", "f1"]
    loss = results["matrices"]["loss"]
    assert loss["score"] == "cross_entropy" and loss["higher_is_better"] is False
    assert loss["bounds"] is None
    assert results["matrices"]["acc"]["bounds"] == [0.0, 1.0]
    assert results["scores"] == results["matrices"]["acc"]["scores"]
    for section in results["matrices"].values():  # one pass: the final metrics end the curve
        for key, value in section["metrics"].items():
            assert value == section["metrics_per_stage"][key][-1]
    R = loaded["loss"].scores
    T = R.shape[0]
    bwt = sum(R[j, j] - R[T - 1, j] for j in range(T - 1)) / (T - 1)  # positive = improved
    assert loss["metrics"]["bwt"] == pytest.approx(float(bwt), abs=1e-12)
    forgetting = sum(R[T - 1, j] - R[j:, j].min() for j in range(T - 1)) / (T - 1)
    assert loss["metrics"]["forgetting"] == pytest.approx(float(forgetting), abs=1e-12)
    assert check_results_files(root / "out") is None
    with open(root / "out" / "scores_loss.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["stage", *results["task_names"]]
    assert [float(v) for v in rows[-1][1:]] == cb.matrices["loss"][-1].tolist()


def test_each_matrix_has_its_own_log_keys(run):
    _, cb, _, _, root = run
    with open(root / "csv" / "version_0" / "metrics.csv") as fh:
        logged = list(csv.DictReader(fh))
    keys = set().union(*({k for k, v in r.items() if v} for r in logged))
    assert {"continual/acc", "continual/bwt", "continual/accuracy/task_0"} <= keys
    for name in ("loss", "top2", "f1"):
        assert {
            f"continual/{name}/acc",
            f"continual/{name}/bwt",
            f"continual/{name}/task_0",
        } <= keys
    last = [r for r in logged if r.get("continual/loss/acc")][-1]
    assert float(last["continual/loss/acc"]) == pytest.approx(
        cb.results()["matrices"]["loss"]["metrics"]["acc"]
    )


def test_resume_keeps_every_matrix_and_refuses_another_scorer_set(run):
    tasks, cb, _, _, _ = run
    state = cb.state_dict()
    same = ContinualEvalCallback(
        eval_loaders(tasks),
        scorers={
            "acc": "accuracy",
            "loss": "cross_entropy",
            "top2": TopKAccuracyScorer(2),
            "f1": cb.scorers["f1"]._metric.clone(),
        },
        verbose=False,
    )
    same.load_state_dict(state)
    for name, rows in cb.matrices.items():
        assert torch.equal(same.matrices[name], rows), name
    other = ContinualEvalCallback(
        eval_loaders(tasks), scorers={"acc": "accuracy", "loss": "cross_entropy"}, verbose=False
    )
    with pytest.raises(ValueError, match="scorers: recorded"):
        other.load_state_dict(state)


def test_scorer_arguments_are_checked():
    tasks = make_tasks()
    with pytest.raises(ValueError, match=r"either metric= .* or scorers="):
        ContinualEvalCallback(eval_loaders(tasks), metric=lambda: None, scorers=["accuracy"])
    with pytest.raises(ValueError, match="scorer name 'a/b'"):
        ContinualEvalCallback(eval_loaders(tasks), scorers={"a/b": "accuracy"})
    with pytest.raises(ValueError, match="scorers is empty"):
        ContinualEvalCallback(eval_loaders(tasks), scorers={})


@pytest.mark.parametrize("bad_from", [0, 3], ids=["baseline", "stage-0-row"])
def test_a_bad_row_of_one_scorer_records_no_matrix(tmp_path, bad_from):
    from torchmetrics import Metric

    class OutOfRange(Metric):
        """Declares the range [0, 1]; returns 1.5 from its ``bad_from``-th compute on (one compute
        per task: 3 for the baseline)."""

        plot_lower_bound, plot_upper_bound, higher_is_better = 0.0, 1.0, True

        def __init__(self):
            super().__init__()
            self.add_state("n", torch.zeros(()), dist_reduce_fx="sum")
            self.computes = 0

        def update(self, preds, target):
            self.n += 1

        def compute(self):
            self.computes += 1
            return torch.tensor(1.5 if self.computes > bad_from else 0.5)

    tasks = make_tasks()
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        scorers={"acc": "accuracy", "odd": OutOfRange()},
        dirpath=tmp_path,
        verbose=False,
    )
    model = Classifier(make_net())
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))
    with pytest.raises(ValueError, match=r"'odd' scores .* 1\.5 is outside \[0, 1\]"):
        trainer.fit(model, train_loaders(tasks)[0])
    assert cb.stages_completed == 0
    assert all(len(rows) == 0 for rows in cb.matrices.values())
    baselines = [m.baseline for m in cb.record.matrices.values()]
    assert all(torch.isnan(b).all() for b in baselines) is (bad_from == 0)

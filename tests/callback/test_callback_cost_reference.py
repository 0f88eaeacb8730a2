"""The callback's cost per stage, its metrics against a reference model and the plasticity of its
step curves, from real CPU Trainer runs, against counts and plain loops written here."""

from __future__ import annotations

import itertools
import json
import math
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import BATCH, Classifier, eval_loaders, make_net, make_tasks, trainer_kwargs
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks, scheduled_task
from continual_eval.references import Reference, train_reference
from continual_eval.results import ContinualResults, ScoreMatrix

EPOCHS = 2
TRAIN_SIZES = (50, 37, 64)  # none divides by the batch size
CAPACITY = 150


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


def sized_loaders(tasks, sizes=TRAIN_SIZES, shuffle=False):
    """Task ``i``'s training blobs, repeated to ``sizes[i]`` samples."""
    loaders = []
    for (x, y), _ in tasks:
        n = sizes[len(loaders)]
        index = torch.arange(n) % len(y)
        loaders.append(DataLoader(TensorDataset(x[index], y[index]), batch_size=BATCH))
    return loaders


class Recorder(Logger):
    """Keeps every ``log_metrics`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append((step, dict(metrics)))

    def at(self, step: int) -> dict[str, float]:
        """Everything logged at ``step`` that names a stage (the stage scalars)."""
        found: dict[str, float] = {}
        for logged_step, metrics in self.logged:
            if logged_step == step and "continual/stage" in metrics:
                found |= metrics
        return found


class Replaying(Classifier):
    """Counts the training samples it saw; its 'memory' holds at most CAPACITY of them."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__(net)
        self.seen = 0

    def training_step(self, batch, batch_idx):
        self.seen += len(batch[1])
        return super().training_step(batch, batch_idx)

    def continual_eval_memory_size(self) -> int:
        return min(self.seen, CAPACITY)


class Growing(Classifier):
    """Adds a 2x2 linear layer (6 parameters) whenever a fit starts: a model that grows per
    stage."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__(net)
        self.extra = nn.ModuleList()

    def on_fit_start(self) -> None:
        self.extra.append(nn.Linear(2, 2))


def run_tasks(tasks, root: Path, model: pl.LightningModule, loaders, **callback_kwargs):
    logger = Recorder()
    callback = ContinualEvalCallback(
        eval_loaders(tasks), dirpath=root / "out", verbose=False, **callback_kwargs
    )
    trainer = pl.Trainer(
        callbacks=[callback], **trainer_kwargs(root, max_epochs=EPOCHS, logger=logger)
    )
    fit_tasks(trainer, model, loaders)
    return callback, logger


# ---------------------------------------------------------------------- cost
def test_every_stage_cost_is_recorded_written_and_logged(tasks, tmp_path):
    model = Replaying(make_net())
    callback, logger = run_tasks(tasks, tmp_path, model, sized_loaders(tasks))
    results = callback.continual_results()
    assert results.cost is not None
    costs = results.cost.per_stage
    assert [c.stage for c in costs] == [0, 1, 2]
    parameters = sum(p.numel() for p in model.parameters())
    seen = 0
    for i, cost in enumerate(costs):
        seen += TRAIN_SIZES[i] * EPOCHS
        assert cost.samples == TRAIN_SIZES[i] * EPOCHS
        assert cost.optimizer_steps == math.ceil(TRAIN_SIZES[i] / BATCH) * EPOCHS
        assert cost.parameters == cost.trainable_parameters == parameters
        assert cost.replay_memory == min(seen, CAPACITY)
        assert cost.train_seconds > 0 and cost.eval_seconds > 0
        assert cost.peak_memory_bytes > 0 and cost.memory_kind == "process_peak_rss"
    summary = results.cost.summary
    assert summary["samples"] == sum(TRAIN_SIZES) * EPOCHS
    assert summary["optimizer_steps"] == sum(math.ceil(n / BATCH) for n in TRAIN_SIZES) * EPOCHS
    assert summary["model_size_efficiency"] == 1.0

    document = ContinualResults.load(tmp_path / "out").to_dict()
    ContinualResults.from_dict(document)
    section = document["cost"]
    assert section["per_stage"] == [c.to_dict() for c in costs]
    assert section["summary"] == summary and section["memory_kind"] == "process_peak_rss"
    assert ContinualResults.load(tmp_path / "out").cost.per_stage == costs

    for i, cost in enumerate(costs):
        logged = logger.at(i)
        for key in ("train_seconds", "eval_seconds", "samples", "optimizer_steps"):
            assert logged[f"continual/cost/{key}"] == float(getattr(cost, key))
        assert logged["continual/cost/parameters"] == parameters
        assert logged["continual/cost/replay_memory"] == cost.replay_memory
        assert logged["continual/cost/model_size_efficiency"] == 1.0


def test_a_growing_model_and_a_module_without_the_hook(tasks, tmp_path):
    model = Growing(make_net())
    base = sum(p.numel() for p in model.parameters())
    callback, logger = run_tasks(tasks, tmp_path, model, sized_loaders(tasks))
    costs = callback.continual_results().cost.per_stage
    counts = [base + 6 * (i + 1) for i in range(3)]
    assert [c.parameters for c in costs] == counts
    assert all(c.replay_memory is None for c in costs)
    for i in range(3):
        expected = min(1.0, sum(counts[0] / c for c in counts[: i + 1]) / (i + 1))
        logged = logger.at(i)
        assert logged["continual/cost/model_size_efficiency"] == pytest.approx(expected, abs=1e-15)
        assert "continual/cost/replay_memory" not in logged
    document = ContinualResults.load(tmp_path / "out").to_dict()
    assert all(entry["replay_memory"] is None for entry in document["cost"]["per_stage"])
    assert document["cost"]["summary"]["model_size_efficiency"] == pytest.approx(expected)


def test_a_model_without_parameters_records_its_stages(tasks, tmp_path):
    """A non-parametric learner (nearest class mean, its prototypes in buffers) has 0 parameters:
    its model-size efficiency is undefined (absent, never 0); the run records every stage."""

    class NearestMean(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("sums", torch.zeros(3, 6))
            self.register_buffer("counts", torch.zeros(3))

        def forward(self, x):
            return -torch.cdist(x, self.sums / self.counts.clamp(min=1)[:, None])

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.sums.index_add_(0, y, x)
            self.counts.index_add_(0, y, torch.ones_like(y, dtype=torch.float))

        def configure_optimizers(self):
            return None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning: no optimizer
        callback, logger = run_tasks(tasks, tmp_path, NearestMean(), sized_loaders(tasks))
    assert callback.stages_completed == 3
    results = callback.continual_results()
    assert [c.parameters for c in results.cost.per_stage] == [0, 0, 0]
    assert [c.samples for c in results.cost.per_stage] == [n * EPOCHS for n in TRAIN_SIZES]
    assert results.cost.summary["model_size_efficiency"] is None
    assert all("continual/cost/model_size_efficiency" not in logger.at(i) for i in range(3))
    document = ContinualResults.load(tmp_path / "out").to_dict()
    ContinualResults.from_dict(document)
    assert document["cost"]["summary"]["model_size_efficiency"] is None
    assert ContinualResults.from_dict(document).to_dict()["cost"] == document["cost"]


def test_schedule_mode_costs_count_each_stage(tasks, tmp_path):
    loaders = sized_loaders(tasks)

    class Scheduled(Classifier):
        def train_dataloader(self):
            return loaders[scheduled_task(self.trainer, EPOCHS)]

    callback = ContinualEvalCallback(
        eval_loaders(tasks), epochs_per_task=EPOCHS, dirpath=tmp_path, verbose=False
    )
    trainer = pl.Trainer(
        callbacks=[callback],
        reload_dataloaders_every_n_epochs=1,
        **trainer_kwargs(tmp_path, max_epochs=3 * EPOCHS),
    )
    trainer.fit(Scheduled(make_net()))
    costs = callback.continual_results().cost.per_stage
    assert [c.samples for c in costs] == [n * EPOCHS for n in TRAIN_SIZES]
    assert [c.optimizer_steps for c in costs] == [
        math.ceil(n / BATCH) * EPOCHS for n in TRAIN_SIZES
    ]


def test_resume_keeps_the_costs_of_earlier_stages(tasks, tmp_path):
    loaders = sized_loaders(tasks)

    def run(root, loaders, ckpt_path=None):
        callback = ContinualEvalCallback(eval_loaders(tasks), dirpath=root, verbose=False)

        def factory(task):
            return pl.Trainer(callbacks=[callback], **trainer_kwargs(root, max_epochs=EPOCHS))

        fit_tasks(
            factory,
            Replaying(make_net()),
            loaders,
            checkpoint_dir=root / "ckpt",
            ckpt_path=ckpt_path,
            seed=3,
        )
        return callback

    first = run(tmp_path / "cut", loaders[:2])
    before = first.continual_results().cost.per_stage
    assert [c.stage for c in before] == [0, 1]
    checkpoint = tmp_path / "cut" / "ckpt" / "task_1.ckpt"
    resumed = run(tmp_path / "cut", loaders, ckpt_path=checkpoint)
    after = resumed.continual_results().cost.per_stage
    assert after[:2] == before  # recorded before the interruption, kept exactly
    assert after[2].stage == 2 and after[2].samples == TRAIN_SIZES[2] * EPOCHS
    assert ContinualResults.load(tmp_path / "cut").to_dict()["cost"]["per_stage"] == [
        c.to_dict() for c in after
    ]


def test_a_stage_resumed_from_a_checkpoint_inside_it_costs_what_an_uninterrupted_one_does(
    tasks, tmp_path
):
    """A checkpoint written inside a stage keeps that stage's samples, start step and training
    time so far; a fit resumed from it (``ckpt_path``) records the stage's samples and optimizer
    steps of an uninterrupted run, not only those trained after the resume."""
    loaders = sized_loaders(tasks)
    samples = [n * EPOCHS for n in TRAIN_SIZES]
    steps = [math.ceil(n / BATCH) * EPOCHS for n in TRAIN_SIZES]

    def every_epoch(folder: Path) -> ModelCheckpoint:
        return ModelCheckpoint(dirpath=folder, filename="{epoch}", save_top_k=-1, every_n_epochs=1)

    # one fit over a schedule, cut after the first epoch of stage 1 and resumed with ckpt_path
    class Scheduled(Classifier):
        def train_dataloader(self):
            return loaders[scheduled_task(self.trainer, EPOCHS)]

    def scheduled(root: Path, max_epochs: int, ckpt_path: Path | None = None):
        callback = ContinualEvalCallback(
            eval_loaders(tasks), epochs_per_task=EPOCHS, dirpath=root / "out", verbose=False
        )
        trainer = pl.Trainer(
            callbacks=[callback, every_epoch(root / "ckpt")],
            reload_dataloaders_every_n_epochs=1,
            **trainer_kwargs(root, max_epochs=max_epochs, enable_checkpointing=True),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Scheduled(make_net()), ckpt_path=ckpt_path)
        return callback

    scheduled(tmp_path / "schedule", EPOCHS + 1)
    inside = tmp_path / "schedule" / "ckpt" / f"epoch={EPOCHS}.ckpt"
    saved = torch.load(inside, weights_only=False)["callbacks"]
    (state,) = (v for k, v in saved.items() if k.startswith("ContinualEvalCallback"))
    progress = state["stage_progress"]
    assert progress["stage"] == 1 and progress["samples"] == TRAIN_SIZES[1]
    resumed = scheduled(tmp_path / "schedule", 3 * EPOCHS, ckpt_path=inside)
    costs = resumed.continual_results().cost.per_stage
    assert [c.samples for c in costs] == samples
    assert [c.optimizer_steps for c in costs] == steps
    assert costs[1].train_seconds >= progress["train_seconds"] > 0

    # one fit per task: a checkpoint after the first of stage 1's epochs
    def per_task(root: Path):
        callback = ContinualEvalCallback(eval_loaders(tasks), dirpath=root / "out", verbose=False)

        def factory(task):
            return pl.Trainer(
                callbacks=[callback, every_epoch(root / f"ckpt_{task}")],
                **trainer_kwargs(root, max_epochs=EPOCHS, enable_checkpointing=True),
            )

        return callback, factory

    callback, factory = per_task(tmp_path / "per_task")
    fit_tasks(factory, Classifier(make_net()), loaders[:2])
    inside = tmp_path / "per_task" / "ckpt_1" / "epoch=0.ckpt"
    # trainer.fit(ckpt_path=...) continues the stage: its cost is the uninterrupted one
    callback, factory = per_task(tmp_path / "continued")
    factory(1).fit(Classifier(make_net()), loaders[1], ckpt_path=inside)
    costs = callback.continual_results().cost.per_stage
    assert [(c.stage, c.samples, c.optimizer_steps) for c in costs] == [
        (0, samples[0], steps[0]),
        (1, samples[1], steps[1]),
    ]
    # fit_tasks(ckpt_path=...) restores the recorded stages and trains stage 1 again from its
    # start: the checkpoint's samples of stage 1 are not counted twice
    callback, factory = per_task(tmp_path / "again")
    fit_tasks(factory, Classifier(make_net()), loaders, ckpt_path=inside)
    costs = callback.continual_results().cost.per_stage
    assert [(c.stage, c.samples, c.optimizer_steps) for c in costs] == [
        (k, samples[k], steps[k]) for k in range(3)
    ]


def test_results_files_load_without_the_optional_sections():
    R, b = torch.eye(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    bare = ContinualResults.from_tensors({"acc": ScoreMatrix("accuracy", R, b)})
    results = ContinualResults.from_dict(json.loads(json.dumps(bare.to_dict())))
    assert results.cost is None and results.reference_metrics is None
    assert results.primary.plasticity is None
    document = results.to_dict()
    assert "cost" not in document and "reference" not in document
    ContinualResults.from_dict(json.loads(json.dumps(document)))


# ---------------------------------------------------------------------- reference
def loop_reference_metrics(R: torch.Tensor, ref: list[float], higher_is_better: bool):
    """Plain loops: per-task intransigence (every j) and isolated FWT (j >= 1), their means after
    every stage."""
    sign = 1.0 if higher_is_better else -1.0
    T = R.shape[0]
    intransigence = [sign * (ref[j] - float(R[j, j])) for j in range(T)]
    fwt = [sign * (float(R[j, j]) - ref[j]) for j in range(1, T)]
    per_stage_i = [sum(intransigence[: k + 1]) / (k + 1) for k in range(T)]
    per_stage_f = [None] + [sum(fwt[:k]) / k for k in range(1, T)]
    return intransigence, fwt, per_stage_i, per_stage_f


@pytest.mark.parametrize("primary", ["acc", "loss"])
def test_reference_metrics_equal_the_plain_loops(tasks, tmp_path, primary):
    scorers = {"acc": "accuracy", "loss": "cross_entropy"}
    if primary == "loss":
        scorers = {"loss": "cross_entropy", "acc": "accuracy"}
    ref = [0.9, 0.8, 0.95] if primary == "acc" else [0.3, 0.5, 0.2]
    callback, logger = run_tasks(
        tasks,
        tmp_path,
        Classifier(make_net()),
        sized_loaders(tasks),
        scorers=scorers,
        reference=torch.tensor(ref),
    )
    R = callback.scores
    higher = primary == "acc"
    intransigence, fwt, per_stage_i, per_stage_f = loop_reference_metrics(R, ref, higher)
    section = ContinualResults.load(tmp_path / "out").to_dict()["reference"]
    assert section["kind"] == "given" and section["higher_is_better"] is higher
    assert section["score"] == ("accuracy" if higher else "cross_entropy")
    assert section["scores"] == pytest.approx(ref, abs=1e-7)  # float32 input
    assert section["intransigence_per_task"] == pytest.approx(intransigence, abs=1e-7)
    assert section["intransigence"] == pytest.approx(per_stage_i[-1], abs=1e-7)
    assert section["fwt_isolated_per_task"] == pytest.approx(fwt, abs=1e-7)
    assert section["fwt_isolated"] == pytest.approx(per_stage_f[-1], abs=1e-7)
    assert section["per_stage"]["fwt_isolated"][0] is None
    typed = callback.continual_results().reference_metrics
    assert typed is not None and typed.intransigence == section["intransigence"]
    assert torch.equal(callback.continual_results().reference, typed.scores)
    for k in range(3):
        logged = logger.at(k)
        assert logged["continual/intransigence"] == pytest.approx(per_stage_i[k], abs=1e-7)
        if k == 0:
            assert "continual/fwt_isolated" not in logged
        else:
            assert logged["continual/fwt_isolated"] == pytest.approx(per_stage_f[k], abs=1e-7)


def test_reference_arguments_are_checked(tasks, tmp_path):
    wrong = Reference(
        kind="isolated",
        scores=torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64),
        baseline=torch.zeros(3, dtype=torch.float64),
        epochs=1,
        steps_trained=(1, 1, 1),
        score_name="cross_entropy",
        higher_is_better=False,
        task_names=("a", "b", "c"),
    )
    with pytest.raises(ValueError, match="primary scorer is 'accuracy'"):
        ContinualEvalCallback(eval_loaders(tasks), reference=wrong)
    with pytest.raises(ValueError, match=r"has 2 scores but the run has 3 tasks"):
        ContinualEvalCallback(eval_loaders(tasks), reference=[0.5, 0.5])
    with pytest.raises(ValueError, match=r"outside the primary scorer 'accuracy'"):
        ContinualEvalCallback(eval_loaders(tasks), reference=[0.5, 1.5, 0.5])
    with pytest.raises(ValueError, match="must be finite"):
        ContinualEvalCallback(eval_loaders(tasks), reference=[0.5, math.inf, 0.5])
    with pytest.raises(FileNotFoundError, match=r"neither a results\.json"):
        ContinualEvalCallback(eval_loaders(tasks), reference=tmp_path / "nothing")
    with pytest.raises(ValueError, match="eval_every_n_steps=1"):
        ContinualEvalCallback(eval_loaders(tasks), eval_every_n_steps=2, lca_beta=3)
    with pytest.raises(ValueError, match="lca_beta must be"):
        ContinualEvalCallback(eval_loaders(tasks), eval_every_n_steps=1, lca_beta=-1)

    # test loaders from the module: the length is checked when the fit starts, before training
    test = eval_loaders(tasks)

    class WithTests(Classifier):
        def test_dataloader(self):
            return test

    model = WithTests(make_net())
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    callback = ContinualEvalCallback(reference=[0.5, 0.5], dirpath=tmp_path, verbose=False)
    trainer = pl.Trainer(callbacks=[callback], **trainer_kwargs(tmp_path, max_epochs=1))
    with pytest.raises(ValueError, match=r"has 2 scores but the run has 3 tasks"):
        trainer.fit(model, sized_loaders(tasks)[0])
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in initial.items())


def test_a_reference_run_directory_and_the_metadata_reference(tasks, tmp_path):
    # a joint reference run's results.json: the final row of its primary matrix
    R = torch.tensor([[0.9, 0.7, 0.6]], dtype=torch.float64)
    run = ContinualResults.from_tensors(
        {"acc": ScoreMatrix("accuracy", R, R[0] * 0)},
        metadata={"reference_run": "joint"},
    )
    run.write(tmp_path / "joint")
    run_tasks(
        tasks,
        tmp_path / "run",
        Classifier(make_net()),
        sized_loaders(tasks),
        reference=tmp_path / "joint",
    )
    section = ContinualResults.load(tmp_path / "run" / "out").to_dict()["reference"]
    assert section["kind"] == "joint" and section["scores"] == [0.9, 0.7, 0.6]
    assert section["fwt_isolated"] is None  # no isolated training
    assert all(v is None for v in section["fwt_isolated_per_task"])
    assert section["intransigence"] is not None

    # no reference=: a metadata reference (continual-eval fit) is kept as it is today
    run_tasks(
        tasks,
        tmp_path / "meta",
        Classifier(make_net()),
        sized_loaders(tasks),
        metadata={"reference": [0.9, None, 0.6]},
    )
    document = ContinualResults.load(tmp_path / "meta" / "out").to_dict()
    assert "reference" not in document
    results = ContinualResults.load(tmp_path / "meta" / "out")
    assert results.reference_metrics is None
    assert results.reference.tolist()[0] == 0.9 and math.isnan(results.reference.tolist()[1])


# ---------------------------------------------------------------------- plasticity
def trapezoid(points: list[tuple[float, float]]) -> float:
    area = 0.0
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        area += (x1 - x0) * (y0 + y1) / 2
    return area / (points[-1][0] - points[0][0])


def loop_plasticity(steps, stage, scores, R, b, beta, reference_auc=None):
    """Plain loops of A_AUC, LCA_beta, AUC_k and FT_k over the completed stages."""
    S = R.shape[0]
    rows = [
        (int(steps[n]), int(stage[n]), [float(v) for v in scores[n]])
        for n in range(len(steps))
        if int(stage[n]) < S
    ]
    initial = [float(b[0])] + [float(R[k - 1, k]) for k in range(1, S)]
    points = [(0.0, initial[0])]
    for step, k, row in rows:
        points.append((float(step), sum(row[: k + 1]) / (k + 1)))
    anytime = trapezoid(points)
    starts = [0]
    for k in range(1, S):
        starts.append(max(step for step, kk, _ in rows if kk == k - 1))
    curve = []
    for k in range(S):
        a = [initial[k]]
        for offset in range(1, beta + 1):
            at = [row[k] for step, kk, row in rows if kk == k and step == starts[k] + offset]
            a.append(at[-1] if at else math.nan)
        curve.append(a)
    lca = sum(sum(curve[k][i] for k in range(S)) / S for i in range(beta + 1)) / (beta + 1)
    aucs = []
    for k in range(S):
        own = [(float(starts[k]), initial[k])]
        own += [(float(step), row[k]) for step, kk, row in rows if kk == k]
        aucs.append(trapezoid(own))
    ft = None
    if reference_auc is not None:
        ft = [(aucs[k] - reference_auc[k]) / (1.0 - reference_auc[k]) for k in range(S)]
    return anytime, lca, aucs, ft


def loop_reference_auc(reference: Reference) -> list[float]:
    found = []
    for j, curve in enumerate(reference.curves):
        points = [(0.0, float(reference.baseline[j]))]
        points += [(float(s), float(v)) for s, v in zip(curve.step, curve.scores, strict=True)]
        found.append(trapezoid(points))
    return found


def test_plasticity_of_a_real_run_equals_the_plain_loops(tasks, tmp_path):
    loaders = sized_loaders(tasks)
    model = Classifier(make_net())

    def factory():
        return pl.Trainer(**trainer_kwargs(tmp_path / "ref", max_epochs=EPOCHS))

    reference = train_reference(
        model,
        loaders,
        eval_loaders(tasks),
        kind="isolated",
        trainer_factory=factory,
        eval_every_n_steps=1,
        seed=5,
        dirpath=tmp_path / "iso",
    )
    beta = 3
    callback, logger = run_tasks(
        tasks,
        tmp_path,
        model,
        loaders,
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        eval_every_n_steps=1,
        lca_beta=beta,
        reference=reference,
    )
    steps, stage, scores = callback.curves()
    reference_auc = loop_reference_auc(reference)
    anytime, lca, aucs, ft = loop_plasticity(
        steps, stage, scores, callback.scores, callback.baseline, beta, reference_auc
    )
    assert not any(math.isnan(v) for v in [anytime, lca, *aucs, *ft])
    results = callback.continual_results()
    plasticity = results.primary.plasticity
    assert plasticity is not None and plasticity.lca_beta == beta
    assert plasticity.anytime_accuracy == pytest.approx(anytime, abs=1e-12)
    assert plasticity.lca == pytest.approx(lca, abs=1e-12)
    assert plasticity.stage_auc.tolist() == pytest.approx(aucs, abs=1e-12)
    assert results.reference_metrics.auc.tolist() == pytest.approx(reference_auc, abs=1e-12)
    assert plasticity.auc_forward_transfer_per_task.tolist() == pytest.approx(ft, abs=1e-12)
    assert plasticity.auc_forward_transfer == pytest.approx(sum(ft) / len(ft), abs=1e-12)

    # the loss matrix: its own curves; no forward transfer (the reference holds accuracies)
    loss = results["loss"].plasticity
    loss_steps, loss_stage, loss_scores = callback.curves("loss")
    loss_anytime, loss_lca, _, _ = loop_plasticity(
        loss_steps,
        loss_stage,
        loss_scores,
        callback.matrices["loss"],
        results["loss"].baseline,
        beta,
    )
    assert loss.anytime_accuracy == pytest.approx(loss_anytime, abs=1e-12)
    assert loss.lca == pytest.approx(loss_lca, abs=1e-12)
    assert loss.auc_forward_transfer is None and loss.auc_forward_transfer_per_task is None

    document = ContinualResults.load(tmp_path / "out").to_dict()
    section = document["matrices"]["acc"]["plasticity"]
    assert section["anytime_accuracy"] == pytest.approx(anytime, abs=1e-12)
    assert section["lca"] == {"beta": beta, "value": pytest.approx(lca, abs=1e-12)}
    assert section["auc_forward_transfer"] == pytest.approx(sum(ft) / len(ft), abs=1e-12)
    assert document["matrices"]["loss"]["plasticity"]["auc_forward_transfer"] is None
    last = logger.at(2)
    assert last["continual/anytime_acc"] == pytest.approx(anytime, abs=1e-12)
    assert last["continual/lca"] == pytest.approx(lca, abs=1e-12)
    assert last["continual/auc_fwt"] == pytest.approx(sum(ft) / len(ft), abs=1e-12)
    assert last["continual/loss/anytime_acc"] == pytest.approx(loss_anytime, abs=1e-12)
    assert "continual/loss/auc_fwt" not in last

    # the same reference read back from its directory: the same scores and areas
    again = ContinualEvalCallback(
        eval_loaders(tasks), reference=tmp_path / "iso", eval_every_n_steps=1
    )
    assert again.reference.kind == "isolated"
    assert torch.equal(again.reference.scores, reference.scores)
    assert again.reference.auc.tolist() == pytest.approx(reference_auc, abs=1e-12)


def test_plasticity_absent_values_are_null_never_zero(tasks, tmp_path):
    callback, logger = run_tasks(
        tasks, tmp_path, Classifier(make_net()), sized_loaders(tasks), eval_every_n_steps=2
    )
    plasticity = callback.continual_results().primary.plasticity
    assert plasticity is not None and plasticity.anytime_accuracy is not None
    assert plasticity.lca_beta is None and plasticity.lca is None
    assert plasticity.auc_forward_transfer is None
    assert plasticity.auc_forward_transfer_per_task is None
    section = ContinualResults.load(tmp_path / "out").to_dict()["matrices"]["acc"]["plasticity"]
    assert section["lca"] is None and section["auc_forward_transfer"] is None
    assert section["auc_forward_transfer_per_task"] is None
    assert "continual/lca" not in logger.at(2) and "continual/auc_fwt" not in logger.at(2)

    # LCA_beta without the steps it needs (stage shorter than beta): null, not 0
    callback, _ = run_tasks(
        tasks,
        tmp_path / "long",
        Classifier(make_net()),
        sized_loaders(tasks),
        eval_every_n_steps=1,
        lca_beta=1000,
    )
    results = callback.continual_results()
    assert results.primary.plasticity.lca is None
    section = ContinualResults.load(tmp_path / "long" / "out").to_dict()["matrices"]["acc"][
        "plasticity"
    ]
    assert section["lca"] == {"beta": 1000, "value": None}

    # without per-step evaluation there are no curves and no plasticity section
    callback, _ = run_tasks(tasks, tmp_path / "plain", Classifier(make_net()), sized_loaders(tasks))
    assert callback.continual_results().primary.plasticity is None
    assert (
        "plasticity"
        not in ContinualResults.load(tmp_path / "plain" / "out").to_dict()["matrices"]["acc"]
    )


def test_digits_mlp_reports_its_replay_memory():
    from continual_eval.experiments.digits import DigitsMLP

    assert DigitsMLP().continual_eval_memory_size() == 0  # naive: no memory
    model = DigitsMLP(replay_capacity=5)
    assert model.continual_eval_memory_size() == 0
    model.memory.add(torch.zeros(3, 64), torch.zeros(3, dtype=torch.long))
    assert model.continual_eval_memory_size() == 3
    model.memory.add(torch.zeros(4, 64), torch.zeros(4, dtype=torch.long))
    assert model.continual_eval_memory_size() == 5  # at capacity


class BrokenMemory(Replaying):
    """A replay hook that fails from the second stage on."""

    def continual_eval_memory_size(self) -> int:
        if self.seen > TRAIN_SIZES[0] * EPOCHS:
            raise RuntimeError("memory hook broke")
        return 0


def test_a_failing_memory_hook_records_nothing_of_its_stage(tasks, tmp_path):
    """The hook is read before the stage's rows are recorded: the error leaves R and
    results.json at the last complete stage."""
    callback = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path / "out", verbose=False)
    trainer = pl.Trainer(callbacks=[callback], **trainer_kwargs(tmp_path, max_epochs=EPOCHS))
    with pytest.raises(RuntimeError, match="memory hook broke"):
        fit_tasks(trainer, BrokenMemory(make_net()), sized_loaders(tasks))
    assert callback.stages_completed == 1
    assert (
        ContinualResults.load(tmp_path / "out" / "results.json").to_dict()["stages_completed"] == 1
    )
    assert [c.stage for c in callback.continual_results().cost.per_stage] == [0]

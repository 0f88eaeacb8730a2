"""ContinualEvalCallback on real CPU Trainer runs, checked against a plain-torch reference loop."""

from __future__ import annotations

import copy
import json
import math

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import (
    NUM_CLASSES,
    Classifier,
    eval_loaders,
    make_net,
    make_tasks,
    reference_run,
    train_loaders,
    trainer_kwargs,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks, scheduled_task
from continual_eval.results import ContinualResults

EPOCHS = 2


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


@pytest.fixture(scope="module")
def reference(tasks):
    return reference_run(make_net(), tasks, epochs=EPOCHS)


def hand_metrics(R: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """GEM metrics and peak forgetting written out with plain loops (independent of the library)."""
    T = R.shape[0]
    R, b = R.tolist(), b.tolist()
    acc = sum(R[T - 1]) / T
    bwt = sum(R[T - 1][j] - R[j][j] for j in range(T - 1)) / (T - 1)
    fwt = sum(R[j - 1][j] - b[j] for j in range(1, T)) / (T - 1)
    forg = sum(max(R[i][j] for i in range(j, T)) - R[T - 1][j] for j in range(T - 1)) / (T - 1)
    return {"acc": acc, "bwt": bwt, "fwt": fwt, "forgetting": forg}


def run_new_trainer_per_task(tasks, tmp_path, **cb_kwargs):
    model = Classifier(make_net())
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path / "out", **cb_kwargs)
    for dl in train_loaders(tasks):
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=EPOCHS)).fit(model, dl)
    return cb, model


def test_new_trainer_per_task_equals_plain_torch_reference(tasks, reference, tmp_path):
    R_ref, b_ref = reference
    cb, _ = run_new_trainer_per_task(tasks, tmp_path, metadata={"method": "finetune", "seed": 0})
    assert torch.equal(cb.scores, R_ref)
    assert torch.equal(cb.baseline, b_ref)

    loaded = ContinualResults.load(tmp_path / "out")
    results = loaded.to_dict()
    scores, baseline = loaded.primary.scores, loaded.primary.baseline
    assert torch.equal(scores, R_ref) and torch.equal(baseline, b_ref)
    assert results["stages_completed"] == 3 and results["num_tasks"] == 3
    assert results["task_names"] == ["task_0", "task_1", "task_2"]
    assert results["metadata"] == {"method": "finetune", "seed": 0}
    assert results["conventions"]["score"] == "accuracy"
    assert results["conventions"]["forgetting"] == "peak"
    for key, value in hand_metrics(R_ref, b_ref).items():
        assert results["metrics"][key] == pytest.approx(value, abs=1e-12), key
        assert results["metrics_per_stage"][key][-1] == pytest.approx(value, abs=1e-12), key
    # the curve after stage 0 is the one-stage run: ACC = R[0, 0]
    assert results["metrics_per_stage"]["acc"][0] == pytest.approx(R_ref[0, 0].item())
    assert len(results["per_task"]["bwt"]) == 2
    expected_bwt = [(R_ref[2, j] - R_ref[j, j]).item() for j in range(2)]
    assert results["per_task"]["bwt"] == pytest.approx(expected_bwt)

    lines = (tmp_path / "out" / "scores.csv").read_text().splitlines()
    assert lines[0] == "stage,task_0,task_1,task_2"
    assert lines[1].split(",")[0] == "baseline"
    assert [float(v) for v in lines[1].split(",")[1:]] == b_ref.tolist()
    assert [float(v) for v in lines[4].split(",")[1:]] == R_ref[2].tolist()


def test_stage_patterns_agree(tasks, reference, tmp_path):
    """One Trainer driven by fit_tasks, and one fit with epochs_per_task, give the reference R."""
    R_ref, b_ref = reference

    model = Classifier(make_net())
    cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path / "a", max_epochs=EPOCHS))
    assert fit_tasks(trainer, model, train_loaders(tasks)) is cb
    assert torch.equal(cb.scores, R_ref) and torch.equal(cb.baseline, b_ref)
    assert trainer.current_epoch == EPOCHS * len(tasks)

    loaders = train_loaders(tasks)

    class Scheduled(Classifier):
        def train_dataloader(self):
            return loaders[scheduled_task(self.trainer, EPOCHS)]

    model = Scheduled(make_net())
    cb = ContinualEvalCallback(eval_loaders(tasks), epochs_per_task=EPOCHS, verbose=False)
    trainer = pl.Trainer(
        callbacks=[cb],
        reload_dataloaders_every_n_epochs=1,
        **trainer_kwargs(tmp_path / "b", max_epochs=EPOCHS * len(tasks)),
    )
    trainer.fit(model)
    assert torch.equal(cb.scores, R_ref) and torch.equal(cb.baseline, b_ref)


def test_repeated_fit_without_helper_is_an_error(tasks, tmp_path):
    model = Classifier(make_net())
    cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))
    loaders = train_loaders(tasks)
    trainer.fit(model, loaders[0])
    with pytest.raises(ValueError, match=r"stage 1\) would train nothing.*max_epochs=1.*fit_tasks"):
        trainer.fit(model, loaders[1])
    assert cb.stages_completed == 1


class DropoutClassifier(Classifier):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def test_training_identical_with_and_without_callback(tasks, tmp_path):
    """Dropout and shuffled loaders draw from the global RNG: the callback must not move it."""
    weights = []
    for with_cb in (False, True):
        pl.seed_everything(123)
        model = DropoutClassifier(make_net(dropout=0.5))
        callbacks = [ContinualEvalCallback(eval_loaders(tasks), verbose=False)] if with_cb else []
        for dl in train_loaders(tasks, shuffle=True):
            pl.Trainer(callbacks=callbacks, **trainer_kwargs(tmp_path, max_epochs=1)).fit(model, dl)
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
        if with_cb:
            assert callbacks[0].stages_completed == len(tasks)
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key


class HookedClassifier(Classifier):
    """Frozen BatchNorm (eval) + a training-time transfer hook that must not see test batches."""

    def __init__(self, net):
        super().__init__(net)
        self.norm = nn.BatchNorm1d(net[0].in_features)
        self.transfers = 0
        self.train_batches = 0
        self.modes_seen: list[tuple[bool, bool]] = []

    def forward(self, x):
        self.modes_seen.append((self.training, self.norm.training))
        assert not torch.is_grad_enabled() or self.training
        return self.net(self.norm(x))

    def on_train_start(self):
        self.norm.eval()  # frozen statistics; the callback must not un-freeze them

    def on_after_batch_transfer(self, batch, dataloader_idx):
        self.transfers += 1
        return batch

    def training_step(self, batch, batch_idx):
        self.train_batches += 1
        return super().training_step(batch, batch_idx)


def test_eval_mode_flags_restored_and_no_transfer_hooks(tasks, tmp_path):
    model = HookedClassifier(make_net())
    cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
    for dl in train_loaders(tasks):
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(model, dl)
        assert model.training and not model.norm.training and model.net.training
    assert model.transfers == model.train_batches
    eval_calls = [m for m in model.modes_seen if m == (False, False)]
    batches_per_eval = sum(math.ceil(len(te[1]) / 8) for _, te in tasks)
    assert len(eval_calls) == batches_per_eval * (1 + len(tasks))
    assert all(m == (True, False) for m in model.modes_seen if m[0])


def test_evaluate_needed_skips_cells_no_metric_reads(tmp_path):
    tasks4 = make_tasks(4)
    cb, _ = run_new_trainer_per_task(tasks4, tmp_path, evaluate="needed", verbose=False)
    R = cb.scores
    rows, cols = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    assert torch.isnan(R[cols > rows + 1]).all() and torch.isfinite(R[cols <= rows + 1]).all()
    full, _ = run_new_trainer_per_task(tasks4, tmp_path / "full", verbose=False)
    used = cols <= rows + 1
    assert torch.equal(R[used], full.scores[used])
    a, b = cb.results()["metrics"], full.results()["metrics"]
    assert a == pytest.approx(b, abs=1e-12)
    written = json.loads((tmp_path / "out" / "results.json").read_text())
    assert written["scores"][0][2] is None and written["scores"][0][1] is not None


def test_more_stages_than_tasks_is_an_error(tasks, tmp_path):
    model = Classifier(make_net())
    cb = ContinualEvalCallback(eval_loaders(tasks[:2]), dirpath=tmp_path, verbose=False)
    loaders = train_loaders(tasks)
    for dl in loaders[:2]:
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(model, dl)
    with pytest.raises(ValueError, match=r"stage 2.*only 2 tasks \(2 test dataloaders\)"):
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(model, loaders[2])
    assert ContinualResults.load(tmp_path).to_dict()["stages_completed"] == 2

    cb = ContinualEvalCallback(eval_loaders(tasks[:2]), epochs_per_task=1, verbose=False)
    with pytest.raises(ValueError, match=r"max_epochs=3.*epochs_per_task=1.*only 2 tasks"):
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=3)).fit(model, loaders[0])


class MultiHead(pl.LightningModule):
    """Task-incremental: one head per task, selected by the task id."""

    def __init__(self, num_tasks):
        super().__init__()
        self.body = make_net()
        self.heads = nn.ModuleList(nn.Linear(NUM_CLASSES, NUM_CLASSES) for _ in range(num_tasks))

    def forward(self, x, t):
        # per-sample head selection
        out = torch.stack([head(self.body(x)) for head in self.heads], dim=1)
        return out[torch.arange(len(x)), t]

    def training_step(self, batch, batch_idx):
        x, y, t = batch
        return nn.functional.cross_entropy(self(x, t), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)


def _with_task_ids(tasks, which):
    loaders = []
    for t, task in enumerate(tasks):
        x, y = task[which]
        loaders.append(DataLoader(TensorDataset(x, y, torch.full_like(y, t)), batch_size=8))
    return loaders


def _reference_multihead_scores(model, tasks):
    with torch.no_grad():
        return [
            (model(te[0], torch.full_like(te[1], t)).argmax(1) == te[1]).double().mean().item()
            for t, (_, te) in enumerate(tasks)
        ]


def test_task_incremental_batches_and_eval_step_hook(tasks, tmp_path):
    model = MultiHead(len(tasks))
    cb = ContinualEvalCallback(_with_task_ids(tasks, 1), verbose=False)
    rows = []
    for dl in _with_task_ids(tasks, 0):
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(model, dl)
        rows.append(_reference_multihead_scores(model, tasks))
    assert torch.equal(cb.scores, torch.tensor(rows, dtype=torch.float64))

    class HookModel(MultiHead):
        def continual_eval_step(self, batch, task_id):
            x, y = batch  # plain (x, y) loaders: the hook supplies the task id
            return self(x, torch.full_like(y, task_id)), y

    model = HookModel(len(tasks))
    model.load_state_dict(MultiHead(len(tasks)).state_dict())
    cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
    pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path / "hook", max_epochs=1)).fit(
        model, _with_task_ids(tasks, 0)[0]
    )
    assert cb.scores[0].tolist() == _reference_multihead_scores(model, tasks)


def test_torchmetrics_metric_replaces_accuracy(tasks, tmp_path):
    from torchmetrics.classification import MulticlassF1Score

    model = Classifier(make_net())
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        metric=lambda: MulticlassF1Score(num_classes=NUM_CLASSES, average="macro"),
        dirpath=tmp_path,
        verbose=False,
    )
    expected = []
    for dl in train_loaders(tasks)[:2]:
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(model, dl)
        with torch.no_grad():
            row = []
            for _, (x, y) in tasks:
                pred = model(x).argmax(1)
                f1 = []
                for c in range(NUM_CLASSES):
                    tp = ((pred == c) & (y == c)).sum().item()
                    denom = (pred == c).sum().item() + (y == c).sum().item()
                    f1.append(2 * tp / denom if denom else 0.0)
                row.append(sum(f1) / NUM_CLASSES)
            expected.append(row)
    assert torch.allclose(cb.scores, torch.tensor(expected, dtype=torch.float64), atol=1e-6)
    assert ContinualResults.load(tmp_path).to_dict()["conventions"]["score"] == "MulticlassF1Score"


def test_test_loaders_from_datamodule(tasks, reference, tmp_path):
    R_ref, _ = reference

    class Tasks(pl.LightningDataModule):
        """Builds its test sets in setup("test") only, as many datamodules do."""

        def __init__(self):
            super().__init__()
            self.task = 0

        def setup(self, stage):
            if stage == "test":
                self.test_sets = eval_loaders(tasks)

        def train_dataloader(self):
            return train_loaders(tasks)[self.task]

        def test_dataloader(self):
            return self.test_sets

    dm = Tasks()
    model = Classifier(make_net())
    cb = ContinualEvalCallback(task_names=["a", "b", "c"], verbose=False)
    for t in range(3):
        dm.task = t
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=EPOCHS)).fit(model, dm)
    assert torch.equal(cb.scores, R_ref)
    assert cb.results()["task_names"] == ["a", "b", "c"]


def test_results_written_after_baseline_and_model_untouched(tasks, tmp_path):
    """Before stage 0 completes, results.json holds the baseline and null metrics."""
    model = Classifier(make_net())
    snapshot = copy.deepcopy(model.state_dict())

    class Stop(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            raise RuntimeError("stopped before the first step")

    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path, verbose=False)
    trainer = pl.Trainer(callbacks=[cb, Stop()], **trainer_kwargs(tmp_path))
    with pytest.raises(RuntimeError, match="stopped before"):
        trainer.fit(model, train_loaders(tasks)[0])
    results = ContinualResults.load(tmp_path).to_dict()
    assert results["stages_completed"] == 0 and results["scores"] == []
    assert results["metrics"] == {"acc": None, "bwt": None, "fwt": None, "forgetting": None}
    assert all(v is not None for v in results["baseline"])
    for key, value in model.state_dict().items():
        assert torch.equal(value, snapshot[key])


class DtypeSpy(Classifier):
    def __init__(self, net):
        super().__init__(net)
        self.eval_dtypes: set[torch.dtype] = set()

    def forward(self, x):
        out = self.net(x)
        if not self.training:
            self.eval_dtypes.add(out.dtype)
        return out


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_evaluation_runs_in_the_trainer_precision_context(tasks, tmp_path, precision):
    # bf16-true casts the weights: float32 test inputs must go through the precision plugin's
    # convert_input, as Lightning's own loops do, or the first matmul fails
    model = DtypeSpy(make_net())
    cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, precision=precision))
    trainer.fit(model, train_loaders(tasks)[0])
    assert model.eval_dtypes == {torch.bfloat16}
    assert cb.stages_completed == 1 and torch.isfinite(cb.scores).all()

"""A run stopped after stage 1 and resumed from its checkpoint ends with the uninterrupted R."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders, trainer_kwargs
from lightning.pytorch.callbacks import ModelCheckpoint

from continual_eval import ContinualEvalCallback, fit_tasks, scheduled_task
from continual_eval.results import load_results

K = 2  # epochs per task


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


def scheduled_run(tasks, root, max_epochs, *, ckpt_path=None, with_val=False):
    loaders = train_loaders(tasks)
    val = eval_loaders(tasks)

    class Scheduled(Classifier):
        def train_dataloader(self):
            return loaders[scheduled_task(self.trainer, K)]

        def val_dataloader(self):
            return val[0]

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y))

    if not with_val:
        Scheduled.val_dataloader = pl.LightningModule.val_dataloader
        Scheduled.validation_step = pl.LightningModule.validation_step
    model = Scheduled(make_net())
    cb = ContinualEvalCallback(eval_loaders(tasks), epochs_per_task=K, dirpath=root, verbose=False)
    checkpoint = ModelCheckpoint(
        dirpath=root / "ckpt", save_last=True, save_top_k=-1, save_on_train_epoch_end=not with_val
    )
    trainer = pl.Trainer(
        callbacks=[checkpoint, cb],
        reload_dataloaders_every_n_epochs=1,
        **trainer_kwargs(root, max_epochs=max_epochs, enable_checkpointing=True),
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    return cb, model


@pytest.mark.parametrize("with_val", [False, True], ids=["ckpt-after-eval", "ckpt-before-eval"])
def test_epochs_per_task_resume_equals_uninterrupted(tasks, tmp_path, with_val):
    """With a validation loop ModelCheckpoint saves before the stage's evaluation; the resumed
    run must then score that stage from the restored weights."""
    full, full_model = scheduled_run(tasks, tmp_path / "full", 3 * K, with_val=with_val)

    first, _ = scheduled_run(tasks, tmp_path / "cut", 2 * K, with_val=with_val)
    assert first.stages_completed == 2
    last = tmp_path / "cut" / "ckpt" / "last.ckpt"
    saved = torch.load(last, weights_only=False)["callbacks"][first.state_key]
    assert len(saved["record"]["matrices"]["acc"]["scores"]) == (1 if with_val else 2)

    resumed, resumed_model = scheduled_run(
        tasks, tmp_path / "cut", 3 * K, ckpt_path=last, with_val=with_val
    )
    assert torch.equal(resumed.scores, full.scores)
    assert torch.equal(resumed.baseline, full.baseline)
    for key, value in full_model.state_dict().items():
        assert torch.equal(value, resumed_model.state_dict()[key])
    a, b = load_results(tmp_path / "full"), load_results(tmp_path / "cut")
    assert a["scores"] == b["scores"] and a["metrics"] == b["metrics"]
    assert a["metrics_per_stage"] == b["metrics_per_stage"]


@pytest.mark.parametrize("one_trainer", [False, True], ids=["trainer-per-task", "one-trainer"])
def test_fit_tasks_resume_equals_uninterrupted(tasks, tmp_path, one_trainer):
    """A new Trainer per task with shuffled loaders and dropout: fit_tasks(seed=...) makes the
    resumed tasks draw the same random numbers. One Trainer: Lightning iterates the train loaders of
    a second fit differently from a first fit, so exactness there needs a deterministic order."""
    randomness = not one_trainer

    def run(loaders, root, ckpt_path=None):
        model = Classifier(make_net(dropout=0.3 if randomness else 0.0))
        cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=root, verbose=False)

        def factory(task):
            return pl.Trainer(callbacks=[cb], **trainer_kwargs(root, max_epochs=K))

        fit_tasks(
            factory(0) if one_trainer else factory,
            model,
            loaders,
            checkpoint_dir=root / "ckpt",
            ckpt_path=ckpt_path,
            seed=7,
        )
        return cb

    loaders = train_loaders(tasks, shuffle=randomness)
    full = run(loaders, tmp_path / "full")
    first = run(loaders[:2], tmp_path / "cut")
    assert first.stages_completed == 2
    resumed = run(loaders, tmp_path / "cut", ckpt_path=tmp_path / "cut" / "ckpt" / "task_1.ckpt")
    assert resumed.stages_completed == 3
    assert torch.equal(resumed.scores, full.scores)
    assert torch.equal(resumed.baseline, full.baseline)
    assert load_results(tmp_path / "cut")["metrics"] == load_results(tmp_path / "full")["metrics"]


def test_state_dict_round_trip_and_mismatch(tasks, tmp_path):
    model = Classifier(make_net())
    cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
    pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(
        model, train_loaders(tasks)[0]
    )
    state = cb.state_dict()
    other = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
    other.load_state_dict(state)
    assert torch.equal(other.scores, cb.scores) and torch.equal(other.baseline, cb.baseline)
    too_few = ContinualEvalCallback(eval_loaders(tasks[:2]), verbose=False)
    with pytest.raises(ValueError, match="3 tasks but 2 test dataloaders"):
        too_few.load_state_dict(state)

"""Traps a new user met (issue 14): a schedule that never switches data, more training tasks than
test loaders, re-running a notebook cell with the same callback."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders, trainer_kwargs

from continual_eval.callback import ContinualEvalCallback, fit_tasks, scheduled_task
from continual_eval.results import load_results


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


def test_schedule_without_dataloader_reload_is_refused_before_training(tasks, tmp_path):
    loaders = train_loaders(tasks)

    class Scheduled(Classifier):
        def train_dataloader(self):
            return loaders[scheduled_task(self.trainer, 2)]

    model = Scheduled(make_net())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cb = ContinualEvalCallback(eval_loaders(tasks), epochs_per_task=2, verbose=False)
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=6))
    with pytest.raises(ValueError, match=r"reload_dataloaders_every_n_epochs=0\) never reloads"):
        trainer.fit(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert cb.stages_completed == 0

    cb = ContinualEvalCallback(eval_loaders(tasks), epochs_per_task=2, verbose=False)
    trainer = pl.Trainer(
        callbacks=[cb],
        reload_dataloaders_every_n_epochs=3,
        **trainer_kwargs(tmp_path / "b", max_epochs=6),
    )
    with pytest.raises(ValueError, match="does not reload it at every stage boundary"):
        trainer.fit(model)

    cb = ContinualEvalCallback(eval_loaders(tasks), epochs_per_task=2, verbose=False)
    trainer = pl.Trainer(
        callbacks=[cb],
        reload_dataloaders_every_n_epochs=2,  # every stage boundary: fine
        **trainer_kwargs(tmp_path / "c", max_epochs=6),
    )
    trainer.fit(model)
    assert cb.stages_completed == 3


@pytest.mark.parametrize("factory", [False, True], ids=["one-trainer", "factory"])
def test_more_training_tasks_than_test_loaders_fails_before_training(tasks, tmp_path, factory):
    cb = ContinualEvalCallback(eval_loaders(tasks[:2]), dirpath=tmp_path, verbose=False)
    model = Classifier(make_net())
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def new_trainer(task):
        return pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))

    with pytest.raises(ValueError, match=r"3 train dataloaders .* 2 test dataloaders"):
        fit_tasks(new_trainer if factory else new_trainer(0), model, train_loaders(tasks))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert cb.stages_completed == 0


def test_reset_starts_a_new_run(tasks, tmp_path):
    cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
    model = Classifier(make_net())
    pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path / "a", max_epochs=1)).fit(
        model, train_loaders(tasks)[0]
    )
    first_id, first_scores = cb.run_id, cb.scores
    cb.reset()
    assert cb.stages_completed == 0 and cb.run_id != first_id
    model = Classifier(make_net())
    pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path / "b", max_epochs=1)).fit(
        model, train_loaders(tasks)[0]
    )
    assert torch.equal(cb.scores, first_scores)  # same model, same data: the same first row
    assert load_results(tmp_path / "a")["run_id"] == first_id
    assert load_results(tmp_path / "b")["run_id"] == cb.run_id

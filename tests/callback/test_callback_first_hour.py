"""Traps a new user met (issue 14): a schedule that never switches data, more training tasks than
test loaders, re-running a notebook cell with the same callback."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders, trainer_kwargs

from continual_eval import ContinualEvalCallback, fit_tasks, scheduled_task
from continual_eval.results import ContinualResults


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
    first_id, first_scores, first_dir = cb.run_id, cb.scores, cb.results_dir
    cb.reset()
    assert cb.stages_completed == 0 and cb.run_id != first_id
    model = Classifier(make_net())
    pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path / "b", max_epochs=1)).fit(
        model, train_loaders(tasks)[0]
    )
    assert torch.equal(cb.scores, first_scores)  # same model, same data: the same first row
    assert cb.results_dir != first_dir
    assert ContinualResults.load(first_dir).to_dict()["run_id"] == first_id
    assert ContinualResults.load(cb.results_dir).to_dict()["run_id"] == cb.run_id


def test_every_run_gets_its_own_directory_without_logger_or_dirpath(tasks, tmp_path, caplog):
    import logging

    runs = []
    for _ in range(2):
        cb = ContinualEvalCallback(eval_loaders(tasks), verbose=True)
        with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
            pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(
                Classifier(make_net()), train_loaders(tasks)[0]
            )
        runs.append(cb)
    dirs = [cb.results_dir for cb in runs]
    assert dirs == [tmp_path / "continual_eval" / f"version_{n}" for n in (0, 1)]
    for cb in runs:
        assert ContinualResults.load(cb.results_dir).to_dict()["run_id"] == cb.run_id
        assert f"results.json and scores.csv go to {cb.results_dir}" in caplog.text
    assert not (tmp_path / "results.json").exists()

    # a resumed run (a new callback from the checkpointed state, no dirpath) keeps its directory
    resumed = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
    resumed.load_state_dict(runs[0].state_dict())
    pl.Trainer(callbacks=[resumed], **trainer_kwargs(tmp_path, max_epochs=1)).fit(
        Classifier(make_net()), train_loaders(tasks)[1]
    )
    assert resumed.results_dir == dirs[0]
    assert ContinualResults.load(dirs[0]).to_dict()["stages_completed"] == 2


def test_two_wandb_runs_under_one_save_dir_keep_two_results(tasks, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    runs = []
    for _ in range(2):
        logger = WandbLogger(project="continual-eval-test", save_dir=str(tmp_path), offline=True)
        cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
        try:
            pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1, logger=logger)).fit(
                Classifier(make_net()), train_loaders(tasks)[0]
            )
            files_dir = logger.experiment.dir  # the W&B run's own files (uploaded with it)
        finally:
            wandb.finish()
        runs.append((cb, files_dir))
    assert runs[0][1] != runs[1][1]
    for cb, files_dir in runs:
        assert str(cb.results_dir) == files_dir
        assert ContinualResults.load(files_dir).to_dict()["run_id"] == cb.run_id


def test_metrics_of_another_score_are_logged_under_its_name(tasks, tmp_path):
    import csv

    from lightning.pytorch.loggers import CSVLogger
    from torchmetrics.classification import MulticlassF1Score

    cb = ContinualEvalCallback(
        eval_loaders(tasks), metric=MulticlassF1Score(num_classes=3), verbose=False
    )
    logger = CSVLogger(tmp_path, name="csv")
    model = Classifier(make_net())
    for dl in train_loaders(tasks)[:2]:
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1, logger=logger)).fit(
            model, dl
        )
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    keys = set().union(*(r for r in rows if any(r.values())))
    assert "continual/acc" not in keys and "continual/bwt" not in keys
    logged = [
        float(r["continual/MulticlassF1Score/acc"])
        for r in rows
        if r.get("continual/MulticlassF1Score/acc")
    ]
    assert logged == pytest.approx(cb.results()["metrics_per_stage"]["acc"], abs=1e-12)
    assert "continual/MulticlassF1Score/task_0" in keys


def test_scores_csv_header_holds_the_task_names(tasks, tmp_path):
    import csv

    names = ["rotate 0", "rotate, 90", 'say "hi"']
    cb = ContinualEvalCallback(
        eval_loaders(tasks), task_names=names, dirpath=tmp_path, verbose=False
    )
    pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(
        Classifier(make_net()), train_loaders(tasks)[0]
    )
    with open(tmp_path / "scores.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["stage", *names]
    assert [float(v) for v in rows[2][1:]] == cb.scores[0].tolist()

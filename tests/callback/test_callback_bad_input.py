"""Bad input: clear errors naming the task and loader; what was recorded stays on disk."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders, trainer_kwargs
from torch.utils.data import DataLoader, Dataset, TensorDataset

from continual_eval import ContinualEvalCallback, scheduled_task
from continual_eval.evaluation import EvaluationError
from continual_eval.results import ContinualResults


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


class Shrinkable(Dataset):
    def __init__(self, x, y):
        self.x, self.y, self.size = x, y, len(y)

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def test_loader_that_yields_no_batch(tasks, tmp_path):
    x, y = tasks[1][1]
    shrinkable = Shrinkable(x, y)
    loaders = eval_loaders(tasks)
    loaders[1] = DataLoader(shrinkable, batch_size=8)
    cb = ContinualEvalCallback(loaders, dirpath=tmp_path, verbose=False)
    model = Classifier(make_net())
    train = train_loaders(tasks)
    pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(model, train[0])
    shrinkable.size = 0
    with pytest.raises(
        EvaluationError, match=r"task 1 \('task_1'\), test dataloader 1: .*no sample"
    ):
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(model, train[1])
    saved = ContinualResults.load(tmp_path).to_dict()
    assert saved["stages_completed"] == 1
    assert saved["scores"] == [cb.scores[0].tolist()]

    empty = eval_loaders(tasks)
    empty[2] = DataLoader(TensorDataset(torch.zeros(0, 6), torch.zeros(0, dtype=torch.long)))
    cb = ContinualEvalCallback(
        empty, task_names=["a", "b", "c"], dirpath=tmp_path / "empty", verbose=False
    )
    with pytest.raises(EvaluationError, match=r"task 2 \('c'\), test dataloader 2"):
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(model, train[0])


def test_output_class_dimension_does_not_fit_targets(tasks, tmp_path):
    loaders = eval_loaders(tasks)
    x, y = tasks[2][1]
    loaders[2] = DataLoader(TensorDataset(x, y + 2), batch_size=8)  # labels up to 4, 3 outputs
    cb = ContinualEvalCallback(loaders, verbose=False)
    model = Classifier(make_net())
    with pytest.raises(EvaluationError, match=r"task 2 \('task_2'\).*outside the class dimension"):
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(
            model, train_loaders(tasks)[0]
        )

    class Flat(Classifier):
        def forward(self, x):
            return self.net(x).flatten()  # [N * C]: no class dimension

    cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
    with pytest.raises(EvaluationError, match=r"task 0 .*test dataloader 0: .*predictions for 8"):
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(
            Flat(make_net()), train_loaders(tasks)[0]
        )


def test_scheduled_stage_without_training_step_warns(tasks, tmp_path):
    loaders = train_loaders(tasks)
    loaders[1] = DataLoader(TensorDataset(torch.zeros(0, 6), torch.zeros(0, dtype=torch.long)))

    class Scheduled(Classifier):
        def train_dataloader(self):
            return loaders[scheduled_task(self.trainer, 1)]

    cb = ContinualEvalCallback(
        eval_loaders(tasks), epochs_per_task=1, dirpath=tmp_path, verbose=False
    )
    trainer = pl.Trainer(
        callbacks=[cb],
        reload_dataloaders_every_n_epochs=1,
        **trainer_kwargs(tmp_path, max_epochs=3),
    )
    with pytest.warns(
        UserWarning, match=r"stage 1 \(task 1, 'task_1'\) ended without a training step"
    ):
        trainer.fit(Scheduled(make_net()))
    assert torch.equal(cb.scores[1], cb.scores[0])  # unchanged model
    assert ContinualResults.load(tmp_path).to_dict()["scores"] == cb.scores.tolist()


def test_empty_train_loader_is_an_error_naming_the_stage(tasks, tmp_path):
    model = Classifier(make_net())
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path, verbose=False)
    empty = DataLoader(TensorDataset(torch.zeros(0, 6), torch.zeros(0, dtype=torch.long)))
    with pytest.raises(RuntimeError, match=r"stage 0 \(task 0, 'task_0'\) trained nothing"):
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(model, empty)
    assert (
        ContinualResults.load(tmp_path).to_dict()["stages_completed"] == 0
    )  # the baseline is kept


def test_constructor_and_source_errors(tasks, tmp_path):
    with pytest.raises(ValueError, match="forgetting must be one of"):
        ContinualEvalCallback(eval_loaders(tasks), forgetting="max")
    with pytest.raises(ValueError, match="evaluate must be"):
        ContinualEvalCallback(eval_loaders(tasks), evaluate="some")
    with pytest.raises(TypeError, match="one test loader per task"):
        ContinualEvalCallback(eval_loaders(tasks)[0])
    with pytest.raises(ValueError, match="2 names for 3 test dataloaders"):
        ContinualEvalCallback(eval_loaders(tasks), task_names=["a", "b"])
    cb = ContinualEvalCallback(verbose=False)
    with pytest.raises(ValueError, match="no test data"):
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(
            Classifier(make_net()), train_loaders(tasks)[0]
        )


def test_shuffled_drop_last_loader_refused_in_one_process_before_training(tasks, tmp_path):
    """The DDP rule in one process too: a shuffled ``drop_last=True`` test loader with a partial
    last batch would score a different random subset at every evaluation; refused at fit start,
    naming the loader, before the first training step."""
    x, y = tasks[1][1]
    loaders = eval_loaders(tasks)
    assert len(y) % 7
    loaders[1] = DataLoader(TensorDataset(x, y), batch_size=7, shuffle=True, drop_last=True)
    cb = ContinualEvalCallback(loaders, dirpath=tmp_path, verbose=False)
    model = Classifier(make_net())
    before = [p.detach().clone() for p in model.parameters()]
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))
    with pytest.raises(
        EvaluationError,
        match=r"task 1 \('task_1'\), test dataloader 1: drop_last=True with a shuffling "
        r"RandomSampler.*different subset.*drop_last=False",
    ):
        trainer.fit(model, train_loaders(tasks)[0])
    assert trainer.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

"""A run that ends with fewer tasks trained than test loaders (issue 23.2): ``fit_tasks`` over
fewer training loaders, one fit over a schedule of fewer stages. One printed line says what the
metrics cover (the first k x k block of R) and ``results.json`` records it (``coverage``)."""

from __future__ import annotations

import json
import logging

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders, trainer_kwargs

from continual_eval import ContinualEvalCallback, fit_tasks, scheduled_task
from continual_eval.functional import all_continual_metrics
from continual_eval.results import ContinualResults, Coverage, InvalidResultsError

LINE = "the run ended after 2 of 3 tasks"


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


def _check_coverage(cb, results_dir):
    document = json.loads((results_dir / "results.json").read_text())
    assert document["stages_completed"] == 2 and document["num_tasks"] == 3
    assert document["coverage"] == {
        "tasks_trained": 2,
        "tasks_evaluated": 3,
        "metrics_cover": "R[:2, :2]",
    }
    # what the code computes: the metrics of the first 2 x 2 block (R's third column is scored)
    R, b = cb.scores, cb.baseline
    assert R.shape == (2, 3) and bool(R[:, 2].isfinite().all())
    block = all_continual_metrics(R[:, :2], b[:2])
    for key in ("acc", "bwt", "fwt", "forgetting"):
        assert document["metrics"][key] == pytest.approx(float(block[key]), abs=1e-12)
    # the schema reads it back, and to_dict/from_dict round-trip it
    loaded = ContinualResults.load(results_dir)
    assert loaded.coverage == Coverage(2, 3)
    assert ContinualResults.from_dict(loaded.to_dict()).to_dict() == loaded.to_dict()
    assert document == loaded.to_dict() == cb.continual_results().to_dict()


def test_fit_tasks_over_fewer_training_loaders_says_what_the_metrics_cover(tasks, tmp_path, caplog):
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path / "run")
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks)[:2])
    lines = [r.getMessage() for r in caplog.records if LINE in r.getMessage()]
    assert len(lines) == 1
    assert "first 2 x 2 block of R (R[:2, :2])" in lines[0] and "untrained task 2" in lines[0]
    _check_coverage(cb, tmp_path / "run")
    assert cb.continual_results().coverage == Coverage(2, 3)

    # a later stage continues the run: the coverage goes again
    pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(
        Classifier(make_net()), train_loaders(tasks)[2]
    )
    document = json.loads((tmp_path / "run" / "results.json").read_text())
    assert document["stages_completed"] == 3 and "coverage" not in document


def test_fit_tasks_with_a_factory_and_verbose_false(tasks, tmp_path, caplog):
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path / "run", verbose=False)

    def factory(task):
        return pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))

    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        fit_tasks(factory, Classifier(make_net()), train_loaders(tasks)[:2])
    assert LINE not in caplog.text  # verbose=False: no line, but the file records it
    _check_coverage(cb, tmp_path / "run")


def test_every_task_trained_has_no_coverage(tasks, tmp_path, caplog):
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path / "run")
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    assert "the run ended after" not in caplog.text
    assert "coverage" not in json.loads((tmp_path / "run" / "results.json").read_text())
    assert cb.continual_results().coverage is None


def test_schedule_of_fewer_stages_than_tasks_says_what_the_metrics_cover(tasks, tmp_path, caplog):
    loaders = train_loaders(tasks)

    class Scheduled(Classifier):
        def train_dataloader(self):
            return loaders[scheduled_task(self.trainer, 1)]

    cb = ContinualEvalCallback(eval_loaders(tasks), epochs_per_task=1, dirpath=tmp_path / "run")
    trainer = pl.Trainer(
        callbacks=[cb],
        reload_dataloaders_every_n_epochs=1,
        **trainer_kwargs(tmp_path, max_epochs=2),
    )
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        trainer.fit(Scheduled(make_net()))
    assert sum(LINE in r.getMessage() for r in caplog.records) == 1
    _check_coverage(cb, tmp_path / "run")


def test_schema_refuses_a_coverage_that_disagrees_with_the_document(tasks, tmp_path):
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path / "run", verbose=False)
    fit_tasks(
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)),
        Classifier(make_net()),
        train_loaders(tasks)[:2],
    )
    document = cb.continual_results().to_dict()
    assert ContinualResults.from_dict(document).coverage == Coverage(2, 3)
    for field, value in (("tasks_trained", 1), ("tasks_evaluated", 2)):
        bad = json.loads(json.dumps(document))
        bad["coverage"][field] = value
        with pytest.raises(InvalidResultsError, match=f"coverage.{field}"):
            ContinualResults.from_dict(bad)
    assert torch.equal(ContinualResults.from_dict(document).primary.scores, cb.scores)

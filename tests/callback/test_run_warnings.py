"""Our warnings print once per run, not once per task (issue 23.8): a 3-task ``fit_tasks`` run
meeting every per-stage condition we warn about shows each warning at most once; a new run
(``reset()``) shows them again."""

from __future__ import annotations

import re
import warnings

import lightning.pytorch as pl
import pytest
from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders, trainer_kwargs

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.record import RunRecord

#: each warning of ours by what identifies its kind
KINDS = {
    "no-figure": r"no figure logged",
    "fsdp1-counts": r"parameter counts of a model under FSDP1",
    "stage-note": r"a section's note after stage \d",
}


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


@pytest.fixture
def every_stage_warns(monkeypatch):
    """Per-stage conditions: no figure library, an FSDP1 model (its parameter counts unread),
    a record section with a note at every stage."""

    def no_matplotlib(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'matplotlib'")

    monkeypatch.setattr("continual_eval.loggers._stage_figures", no_matplotlib)
    monkeypatch.setattr("continual_eval.evaluation.strategy.parameter_counts", lambda m: None)
    record_stage = RunRecord.record_stage

    def with_note(self, stage, scored, cost=None):
        notes = record_stage(self, stage, scored, cost)
        return [*notes, f"ContinualEvalCallback: a section's note after stage {stage}"]

    monkeypatch.setattr(RunRecord, "record_stage", with_note)


def ours(caught) -> list[str]:
    return [
        str(w.message)
        for w in caught
        if re.search(r"ContinualEvalCallback|continual-eval", str(w.message))
    ]


def fit(tasks, tmp_path, cb):
    from lightning.pytorch.loggers import TensorBoardLogger

    logger = TensorBoardLogger(tmp_path, name="tb")
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1, logger=logger))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # no help from Python's own once-per-location registry
        fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    return ours(caught)


def test_a_three_task_run_shows_each_warning_once(tasks, tmp_path, every_stage_warns):
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path / "run", verbose=False)
    shown = fit(tasks, tmp_path / "a", cb)
    assert cb.stages_completed == 3
    for kind, pattern in KINDS.items():
        assert sum(bool(re.search(pattern, m)) for m in shown) == 1, (kind, shown)
    assert len(shown) == len(KINDS), shown
    assert all(m.endswith("(warned once per run)") for m in shown)
    assert "after stage 0" in next(m for m in shown if "section's note" in m)  # the first

    cb.reset()  # a new run (in a directory of its own) warns again, once
    cb.dirpath = tmp_path / "run2"
    shown = fit(tasks, tmp_path / "b", cb)
    assert len(shown) == len(KINDS) and cb.stages_completed == 3

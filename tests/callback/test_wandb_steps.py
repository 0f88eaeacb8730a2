"""W&B (issue 23.5): the stage rows are plotted against ``continual/stage`` (``define_metric``)
instead of writing the stage into ``trainer/global_step``, so W&B's step columns never go back;
a second WandbLogger that reuses the still-open W&B run is refused naming that run and
``wandb.finish()``. Read back from the offline run's .wandb file."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
from cl_helpers import (
    Classifier,
    by_step,
    eval_loaders,
    make_net,
    make_tasks,
    train_loaders,
    trainer_kwargs,
)
from test_callback_logging import _wandb_history, _wandb_step_metrics

from continual_eval import ContinualEvalCallback, fit_tasks


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


@pytest.fixture
def offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_stage_rows_use_the_stage_axis_and_steps_stay_monotone(tasks, tmp_path, offline):
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(project="continual-eval-test", save_dir=str(tmp_path), offline=True)
    cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1, logger=logger))
    try:
        fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))  # 3 steps per task
        run_dir = logger.experiment.dir.rsplit("/files", 1)[0]
    finally:
        wandb.finish()
    history = _wandb_history(run_dir, records=13)
    steps = [int(h["_step"]) for h in history]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    global_steps = [int(h["trainer/global_step"]) for h in history if "trainer/global_step" in h]
    assert global_steps == sorted(global_steps) and global_steps[-1] == 8  # never backwards
    trained = [h for h in history if "train_loss" in h]
    assert [int(h["trainer/global_step"]) for h in trained] == list(range(9))
    staged = [h for h in history if "continual/acc" in h]
    assert [int(h["continual/stage"]) for h in staged] == [0, 1, 2]
    # where W&B fills in trainer/global_step (its step_sync of Lightning's "*" axis, for the
    # table's nested keys), it is the global step reached, never the stage
    assert [h.get("trainer/global_step", "2") for h in staged[:1]] == ["2"]
    assert all(h.get("trainer/global_step", "5") == "5" for h in staged[1:2])
    assert [float(h["continual/acc"]) for h in staged] == pytest.approx(
        cb.results()["metrics_per_stage"]["acc"], abs=1e-12
    )
    axes = _wandb_step_metrics(run_dir)
    assert axes["continual/acc"] == axes["continual/accuracy/task_2"] == "continual/stage"
    assert axes["continual/cost/eval_seconds"] == "continual/stage"
    assert axes["continual/stage"] == ""  # its own axis
    assert axes["*"] == "trainer/global_step"  # Lightning's default for everything else


def test_mlflow_and_tensorboard_keep_stage_steps(tasks, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    uri = f"file:{tmp_path / 'mlruns'}"
    tb = TensorBoardLogger(tmp_path, name="tb")
    ml = MLFlowLogger(experiment_name="continual", tracking_uri=uri)
    cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False, log_images=False)
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1, logger=[tb, ml]))
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    acc = EventAccumulator(str(tb.log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in by_step(acc.Scalars("continual/acc"))] == [0, 1, 2]
    history = MlflowClient(tracking_uri=uri).get_metric_history(ml.run_id, "continual/acc")
    assert sorted(m.step for m in history) == [0, 1, 2]


def test_a_second_logger_on_the_open_wandb_run_is_refused_naming_it(tasks, tmp_path, offline):
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    try:
        first = WandbLogger(project="continual-eval-test", save_dir=str(tmp_path), offline=True)
        cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
        kwargs = trainer_kwargs(tmp_path, max_epochs=1, logger=first)
        pl.Trainer(callbacks=[cb], **kwargs).fit(Classifier(make_net()), train_loaders(tasks)[0])
        run = first.experiment
        # no wandb.finish(): the next WandbLogger reuses the open run (Lightning warns)
        with pytest.warns(UserWarning, match="reuse this run"):
            second = WandbLogger(project="continual-eval-test", save_dir=str(tmp_path))
            assert second.experiment is run
        cb2 = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
        kwargs = trainer_kwargs(tmp_path, max_epochs=1, logger=second)
        with pytest.raises(FileExistsError) as refused:
            pl.Trainer(callbacks=[cb2], **kwargs).fit(
                Classifier(make_net()), train_loaders(tasks)[0]
            )
    finally:
        wandb.finish()
    message = str(refused.value)
    assert "holds the results of another run" in message
    named = f" (name {run.name!r})" if run.name else ""  # an offline run may have no name
    assert f"W&B run {run.id!r}{named}, still open in this process" in message
    assert "wandb.finish()" in message and "starts a new W&B run" in message
    assert cb2.stages_completed == 0

"""A run stopped after stage 1 and resumed from its checkpoint ends with the uninterrupted R."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders, trainer_kwargs
from lightning.pytorch.callbacks import ModelCheckpoint

from continual_eval import ContinualEvalCallback, fit_tasks, scheduled_task
from continual_eval.results import ContinualResults
from script_runner import run_script

HERE = Path(__file__).parent

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
    a, b = (
        ContinualResults.load(tmp_path / "full").to_dict(),
        ContinualResults.load(tmp_path / "cut").to_dict(),
    )
    assert a["scores"] == b["scores"] and a["metrics"] == b["metrics"]
    assert a["metrics_per_stage"] == b["metrics_per_stage"]


@pytest.mark.parametrize("one_trainer", [False, True], ids=["trainer-per-task", "one-trainer"])
def test_fit_tasks_resume_equals_uninterrupted(tasks, tmp_path, one_trainer):
    """Shuffled loaders and dropout, resumed from task_1.ckpt in a new Trainer: the weights, R, the
    metrics and the epoch and step counters equal the uninterrupted run's. One Trainer: Lightning
    makes a second train-loader iterator (one more global draw) in every fit after epoch 0, so
    fit_tasks continues the resumed Trainer's loop counters from the checkpoint (without that the
    weights differed by up to 0.026)."""

    def run(loaders, root, ckpt_path=None):
        model = Classifier(make_net(dropout=0.3))
        cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=root, verbose=False)

        def factory(task):
            return pl.Trainer(callbacks=[cb], **trainer_kwargs(root, max_epochs=K))

        trainer = factory(0)
        fit_tasks(
            trainer if one_trainer else factory,
            model,
            loaders,
            checkpoint_dir=root / "ckpt",
            ckpt_path=ckpt_path,
            seed=7,
        )
        return cb, model, trainer

    loaders = train_loaders(tasks, shuffle=True)
    full, full_model, full_trainer = run(loaders, tmp_path / "full")
    first, _, _ = run(loaders[:2], tmp_path / "cut")
    assert first.stages_completed == 2
    ckpt = tmp_path / "cut" / "ckpt" / "task_1.ckpt"
    resumed, resumed_model, resumed_trainer = run(loaders, tmp_path / "cut", ckpt_path=ckpt)
    assert resumed.stages_completed == 3
    assert torch.equal(resumed.scores, full.scores)
    assert torch.equal(resumed.baseline, full.baseline)
    for key, value in full_model.state_dict().items():
        assert torch.equal(value, resumed_model.state_dict()[key]), key
    if one_trainer:  # the resumed Trainer counts on from the checkpoint, as the uninterrupted one
        assert resumed_trainer.current_epoch == full_trainer.current_epoch == 3 * K
        assert resumed_trainer.global_step == full_trainer.global_step > 0
    assert (
        ContinualResults.load(tmp_path / "cut").to_dict()["metrics"]
        == ContinualResults.load(tmp_path / "full").to_dict()["metrics"]
    )


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


# ------------------------------------------------------- kill -9 inside a single fit's schedule
def _schedule_run(mode: str, out: Path, generators: str) -> None:
    proc = run_script(HERE / "schedule_kill_script.py", mode, out, generators, timeout=300)
    expected = -signal.SIGKILL if mode.startswith("killed") else 0
    assert proc.returncode == expected, proc.stderr[-3000:]


@pytest.mark.slow
def test_schedule_killed_at_any_epoch_resumes_bitwise(tmp_path):
    """A single fit over a schedule (2 epochs per task, 3 tasks, shuffled train loaders, dropout)
    killed with SIGKILL at the start of epoch 2 (a stage boundary), 3 or 5 (inside a stage) and
    resumed from last.ckpt in a fresh process ends with the weights and R of the uninterrupted
    run. Lightning alone stores neither the global random states nor the loaders' generator
    states; the callback restores both (the generators' at on_train_start, replaying the draws
    Lightning made from them while setting up the fit)."""
    generators = "own"  # each task's loader shuffles with its own seeded torch.Generator
    epochs = (2, 3, 5)

    def kill_and_resume(epoch: int) -> None:
        _schedule_run(f"killed:{epoch}", tmp_path / f"kill{epoch}", generators)
        _schedule_run("resume", tmp_path / f"kill{epoch}", generators)

    # the four runs are independent processes: side by side, the test waits for the slowest
    with ThreadPoolExecutor(max_workers=len(epochs) + 1) as pool:
        runs = [pool.submit(_schedule_run, "full", tmp_path / "full", generators)]
        runs += [pool.submit(kill_and_resume, epoch) for epoch in epochs]
        for run in runs:
            run.result()
    full = torch.load(tmp_path / "full" / "full.pt")
    for epoch in epochs:
        cut = tmp_path / f"kill{epoch}"
        resumed = torch.load(cut / "resume.pt")
        assert torch.equal(resumed["scores"], full["scores"]), epoch
        for key, value in full["weights"].items():
            assert torch.equal(value, resumed["weights"][key]), (epoch, key)
        assert (cut / "resume-warnings.txt").read_text() == "", epoch


@pytest.mark.slow
def test_schedule_with_a_generator_shared_across_stages_warns_at_a_boundary_resume(tmp_path):
    """One generator for every task's loader, killed at a stage boundary: a new process cannot
    tell the next stage's generator from a new one of the same seed, so it is not restored, and
    the resume says so (killed inside a stage, it is the same loader's: restored as above)."""
    _schedule_run("killed:2", tmp_path / "boundary", "shared")
    _schedule_run("resume", tmp_path / "boundary", "shared")
    note = (tmp_path / "boundary" / "resume-warnings.txt").read_text()
    assert "at the start of stage 1" in note and "cannot be told" in note

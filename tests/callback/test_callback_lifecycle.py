"""Nothing silent, nothing lost: a run's results directory, resume consistency, kill -9, RNG states,
and the callback's argument checks (issue 9, items 6, 7, 9, 10, 11)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders, trainer_kwargs
from lightning.pytorch.callbacks import ModelCheckpoint

from continual_eval import ContinualEvalCallback, fit_tasks, scheduled_task
from continual_eval._stage_journal import read_journal
from continual_eval.results import ContinualResults, ScoreMatrix, check_results_files, files
from continual_eval.results.files import (
    JOURNAL_FILE,
    RESULTS_FILE,
    SCORES_FILE,
    remove_stale_temporaries,
)
from script_runner import run_script

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


def run_tasks(tasks, root: Path, callback: ContinualEvalCallback, **fit_kwargs):
    model = Classifier(make_net())
    fit_tasks(
        lambda task: pl.Trainer(callbacks=[callback], **trainer_kwargs(root, max_epochs=1)),
        model,
        train_loaders(tasks),
        **fit_kwargs,
    )
    return model


# ---------------------------------------------------------------- item 9: never overwrite a run
def test_second_run_never_overwrites_a_finished_run(tasks, tmp_path):
    first = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path, verbose=False)
    run_tasks(tasks, tmp_path / "logs", first)
    finished = (tmp_path / RESULTS_FILE).read_bytes(), (tmp_path / SCORES_FILE).read_bytes()
    assert ContinualResults.load(tmp_path).to_dict()["stages_completed"] == 3
    assert ContinualResults.load(tmp_path).to_dict()["run_id"] == first.run_id

    class Crash(Classifier):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("the second run crashes")

    second = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path, verbose=False)
    trainer = pl.Trainer(callbacks=[second], **trainer_kwargs(tmp_path / "logs2", max_epochs=1))
    with pytest.raises(FileExistsError, match=r"holds the results of another run.*overwrite=True"):
        trainer.fit(Crash(make_net()), train_loaders(tasks)[0])
    assert (tmp_path / RESULTS_FILE).read_bytes() == finished[0]
    assert (tmp_path / SCORES_FILE).read_bytes() == finished[1]

    third = ContinualEvalCallback(
        eval_loaders(tasks), dirpath=tmp_path, verbose=False, overwrite=True
    )
    pl.Trainer(callbacks=[third], **trainer_kwargs(tmp_path / "logs3", max_epochs=1)).fit(
        Classifier(make_net()), train_loaders(tasks)[0]
    )
    replaced = ContinualResults.load(tmp_path).to_dict()
    assert replaced["run_id"] == third.run_id and replaced["stages_completed"] == 1


def test_unreadable_results_file_is_not_overwritten(tasks, tmp_path):
    (tmp_path / RESULTS_FILE).write_text("{not json")
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path, verbose=False)
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path / "logs", max_epochs=1))
    with pytest.raises(FileExistsError, match="run_id None"):
        trainer.fit(Classifier(make_net()), train_loaders(tasks)[0])
    assert (tmp_path / RESULTS_FILE).read_text() == "{not json"


# ---------------------------------------------------------------- item 10: the pair of files
def test_results_json_is_written_last_and_names_the_csv(tasks, tmp_path, monkeypatch):
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path, verbose=False)
    run_tasks(tasks, tmp_path / "logs", cb)
    assert check_results_files(tmp_path) is None
    raw = json.loads((tmp_path / RESULTS_FILE).read_text())
    assert raw["files"][SCORES_FILE]["stages"] == 3
    assert ContinualResults.load(tmp_path).to_dict() == raw  # to_dict() holds files too

    # a write interrupted after scores.csv: results.json stays the complete previous version and
    # the disagreement is reported, not hidden
    earlier = ContinualResults.from_tensors(
        {"acc": ScoreMatrix("accuracy", cb.scores[:2], cb.baseline)}, run_id=cb.run_id
    )
    real = files._write_bytes

    def crash_on_json(path, data, **options):
        if path.name == RESULTS_FILE:
            raise KeyboardInterrupt("killed between the two files")
        real(path, data, **options)

    monkeypatch.setattr(files, "_write_bytes", crash_on_json)
    with pytest.raises(KeyboardInterrupt):
        earlier.write(tmp_path)
    monkeypatch.undo()
    assert ContinualResults.load(tmp_path).stages_completed == 3
    assert "written with" in check_results_files(tmp_path)


@pytest.mark.slow
def test_failed_write_leaves_no_temporary_and_stale_ones_are_removed(tmp_path, monkeypatch):
    def baseline_only(value: float) -> ContinualResults:
        matrix = ScoreMatrix("accuracy", torch.zeros(0, 1), torch.tensor([value]))
        return ContinualResults.from_tensors({"acc": matrix})

    baseline_only(0.5).write(tmp_path)
    before = (tmp_path / RESULTS_FILE).read_bytes()

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        baseline_only(0.25).write(tmp_path)
    monkeypatch.undo()
    assert (tmp_path / RESULTS_FILE).read_bytes() == before
    assert not list(tmp_path.glob(".*.tmp"))

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    stale = tmp_path / f".{RESULTS_FILE}.{int(dead.stdout)}.tmp"
    live = tmp_path / f".{SCORES_FILE}.{os.getpid()}.tmp"
    other = tmp_path / ".notes.txt.1.tmp"
    for path in (stale, live, other):
        path.write_text("partial")
    assert remove_stale_temporaries(tmp_path) == [stale]
    assert live.exists() and other.exists() and not stale.exists()


# ---------------------------------------------------------------- kill -9 inside an evaluation
@pytest.mark.slow
@pytest.mark.ci
def test_kill_inside_stage_evaluation_then_resume_equals_uninterrupted(tmp_path):
    def run(mode: str, out: Path) -> subprocess.CompletedProcess:
        return run_script(HERE / "kill_script.py", mode, out, timeout=300)

    full = run("full", tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]
    killed = run("killed", tmp_path / "cut")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert ContinualResults.load(tmp_path / "cut" / "results").to_dict()["stages_completed"] == 2
    resumed = run("resume", tmp_path / "cut")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    a = torch.load(tmp_path / "full" / "full.pt")
    b = torch.load(tmp_path / "cut" / "resume.pt")
    assert torch.equal(a["scores"], b["scores"])
    for key, value in a["weights"].items():
        assert torch.equal(value, b["weights"][key]), key
    full_dir, cut_dir = tmp_path / "full" / "results", tmp_path / "cut" / "results"
    assert (full_dir / SCORES_FILE).read_bytes() == (cut_dir / SCORES_FILE).read_bytes()
    x, y = ContinualResults.load(full_dir).to_dict(), ContinualResults.load(cut_dir).to_dict()
    assert x.pop("run_id") != y.pop("run_id")  # two runs; everything else bitwise equal
    counted = ("stage", "samples", "optimizer_steps", "parameters", "replay_memory")
    costs = [[{k: c[k] for k in counted} for c in d.pop("cost")["per_stage"]] for d in (x, y)]
    assert costs[0] == costs[1]  # the clocks differ; what was trained does not
    assert x == y
    # the stage journal the resume rewrote holds the uninterrupted run's lines (but the clocks)
    journals = [read_journal(d / JOURNAL_FILE) for d in (full_dir, cut_dir)]
    for header, lines in journals:
        header.pop("run_id")
        for line in lines:
            if line.get("cost"):
                line["cost"] = {k: line["cost"][k] for k in counted}
    assert journals[0] == journals[1]
    assert len(journals[1][1]) == 1 + 3  # the baseline and three stages
    assert check_results_files(cut_dir) is None
    assert not list(cut_dir.glob(".*.tmp"))


# ---------------------------------------------------------------- item 11: RNG states
K = 2


def scheduled_run(tasks, root: Path, max_epochs: int, *, ckpt_path=None, restore=True):
    loaders = train_loaders(tasks, shuffle=True)

    class Scheduled(Classifier):
        def train_dataloader(self):
            return loaders[scheduled_task(self.trainer, K)]

    model = Scheduled(make_net(dropout=0.3))
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        epochs_per_task=K,
        dirpath=root,
        verbose=False,
        restore_rng_states=restore,
    )
    checkpoint = ModelCheckpoint(dirpath=root / "ckpt", save_last=True, save_top_k=-1)
    trainer = pl.Trainer(
        callbacks=[checkpoint, cb],
        reload_dataloaders_every_n_epochs=1,
        **trainer_kwargs(root, max_epochs=max_epochs, enable_checkpointing=True),
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    return cb, model


@pytest.mark.parametrize("restore", [True, False], ids=["rng-restored", "rng-not-restored"])
def test_resume_with_dropout_and_shuffling_equals_uninterrupted(tasks, tmp_path, restore):
    """Lightning's checkpoints hold no RNG states; the callback's state does (on by default), so a
    resumed run draws the same dropout masks and shuffles as an uninterrupted one."""
    pl.seed_everything(11, verbose=False)
    full, full_model = scheduled_run(tasks, tmp_path / "full", 3 * K, restore=restore)
    pl.seed_everything(11, verbose=False)
    scheduled_run(tasks, tmp_path / "cut", 2 * K, restore=restore)
    torch.manual_seed(12345)  # the resuming process starts from another random state
    resumed, resumed_model = scheduled_run(
        tasks,
        tmp_path / "cut",
        3 * K,
        ckpt_path=tmp_path / "cut" / "ckpt" / "last.ckpt",
        restore=restore,
    )
    same_weights = all(
        torch.equal(v, resumed_model.state_dict()[k]) for k, v in full_model.state_dict().items()
    )
    assert same_weights is restore
    assert torch.equal(resumed.scores, full.scores) is restore
    assert resumed.scores.shape == full.scores.shape == (3, 3)


# ---------------------------------------------------------------- item 7: resume relabelling
def finished_state(tasks, tmp_path, **cb_kwargs):
    cb = ContinualEvalCallback(
        eval_loaders(tasks), dirpath=tmp_path / "a", verbose=False, **cb_kwargs
    )
    pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(
        Classifier(make_net()), train_loaders(tasks)[0]
    )
    return cb, cb.state_dict()


def test_resume_with_other_task_names_or_convention_is_refused(tasks, tmp_path):
    cb, state = finished_state(tasks, tmp_path, task_names=["a", "b", "c"], forgetting="chaudhry")
    renamed = ContinualEvalCallback(
        eval_loaders(tasks), task_names=["x", "y", "z"], verbose=False, forgetting="chaudhry"
    )
    with pytest.raises(ValueError, match=r"task_names: recorded \['a', 'b', 'c'\]"):
        renamed.load_state_dict(state)
    assert renamed.stages_completed == 0
    other = ContinualEvalCallback(eval_loaders(tasks), task_names=["a", "b", "c"], verbose=False)
    with pytest.raises(ValueError, match="forgetting: recorded 'chaudhry', now 'peak'"):
        other.load_state_dict(state)
    # no names given: the recorded ones are kept, not replaced by task_0..
    unnamed = ContinualEvalCallback(eval_loaders(tasks), forgetting="chaudhry", verbose=False)
    unnamed.load_state_dict(state)
    assert unnamed.task_names == ["a", "b", "c"]
    assert torch.equal(unnamed.scores, cb.scores)
    assert unnamed.run_id == cb.run_id


def test_resume_with_another_scorer_is_refused(tasks, tmp_path):
    from torchmetrics.classification import MulticlassF1Score

    _, state = finished_state(tasks, tmp_path)
    f1 = ContinualEvalCallback(
        eval_loaders(tasks), metric=MulticlassF1Score(num_classes=3), verbose=False
    )
    with pytest.raises(
        ValueError, match=r"scorers: recorded \{'acc': 'accuracy'\}, now \{'MulticlassF1Score'"
    ):
        f1.load_state_dict(state)


# ---------------------------------------------------------------- item 6: arguments
def test_one_shot_iterators_are_refused_as_test_loaders(tasks):
    loaders = eval_loaders(tasks)
    generator = (batch for batch in loaders[1])
    with pytest.raises(TypeError, match=r"test dataloader 1 is a generator.*read only once"):
        ContinualEvalCallback([loaders[0], generator, loaders[2]])
    with pytest.raises(TypeError, match=r"test dataloader 0 is a int"):
        ContinualEvalCallback([3])
    ContinualEvalCallback([list(loaders[0])], verbose=False)  # a list of batches re-iterates


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"lr": torch.tensor(0.1)}, r"metadata\['lr'\] is a Tensor"),
        ({"run": {"loss": float("nan")}}, r"metadata\['run'\]\['loss'\] = nan"),
        ({"tags": [1, object()]}, r"metadata\['tags'\]\[1\] is a object"),
        ({1: "x"}, r"has the key 1 \(int\)"),
        (["a"], "metadata must be a dict"),
    ],
)
def test_metadata_that_json_cannot_hold_is_refused_at_construction(tasks, metadata, message):
    with pytest.raises((TypeError, ValueError), match=message):
        ContinualEvalCallback(eval_loaders(tasks), metadata=metadata)

"""``ddp`` and ``ddp_spawn`` on 2 CPU processes: every stage recorded once, R exact, and the process
that started a ``ddp_spawn`` run sees the rows its children recorded (through the hand-over file of
:mod:`continual_eval._spawn_handover`, also checked here in one process)."""

from __future__ import annotations

import copy
import os
import pickle
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders, trainer_kwargs

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval._spawn_handover import SpawnHandover
from continual_eval.results import ContinualResults, check_results_files
from script_runner import run_spawn_script

HERE = Path(__file__).parent
NUM_TASKS = {"schedule": 4, "fit_tasks": 2}  # as spawn_script.py


def plain_accuracy(state: dict, tasks) -> torch.Tensor:
    """Accuracy of the saved weights on every whole test set: one process, plain torch."""
    net = make_net()
    net.load_state_dict({k.removeprefix("net."): v for k, v in state.items()})
    net.eval()
    with torch.no_grad():
        return torch.tensor(
            [int((net(x).argmax(1) == y).sum()) / len(y) for _, (x, y) in tasks],
            dtype=torch.float64,
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "pattern"),
    [("ddp_spawn", "schedule"), ("ddp_spawn", "fit_tasks"), ("ddp", "schedule")],
)
def test_two_processes_record_every_stage_once(tmp_path, strategy, pattern):
    proc, out = run_spawn_script(HERE / "spawn_script.py", tmp_path, strategy, pattern)
    assert proc.returncode == 0, proc.stderr[-4000:]

    num_tasks = NUM_TASKS[pattern]
    tasks = make_tasks(num_tasks)
    reference = torch.stack(
        [plain_accuracy(torch.load(out / f"weights_{i}.pt"), tasks) for i in range(num_tasks)]
    )
    assert not torch.equal(reference[0], reference[1])  # the stages differ: a repeat would show

    main = torch.load(out / "main_process.pt", weights_only=False)
    assert main["stages"] == num_tasks
    assert torch.equal(main["scores"], reference)
    assert Path(main["results_dir"]) == out / "results"
    assert main["results"]["stages_completed"] == num_tasks

    on_disk = ContinualResults.load(out / "results")
    scores, baseline = on_disk.primary.scores, on_disk.primary.baseline
    assert torch.equal(scores, reference)
    assert torch.equal(baseline, main["baseline"])
    assert check_results_files(out / "results") is None
    assert not list((out / "results").glob(".*.tmp"))


@pytest.fixture
def handover_dir(tmp_path, monkeypatch):
    """Hand-over files go to a directory of the test's own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "handover"))
    (tmp_path / "handover").mkdir()
    return tmp_path / "handover"


def test_handover_file_is_read_once_per_version_and_only_by_the_owner(handover_dir):
    handover = SpawnHandover("run")
    assert handover.in_owner()
    assert Path(handover.path) == handover_dir / f"continual-eval-{os.getpid()}-run.pt"
    assert handover.receive() is None  # nothing published yet

    child = pickle.loads(pickle.dumps(handover))  # what a spawned process holds
    child.owner_pid = os.getpid() + 1  # as seen from another process
    assert not child.in_owner()
    child.publish({"rows": torch.ones(2)}, results_dir=None, dir_checked=False)
    assert child.receive() is None  # only the owner reads the file

    published = handover.receive()
    assert published is not None
    assert torch.equal(published.state["rows"], torch.ones(2))
    assert published.results_dir is None and published.dir_checked is False
    assert handover.receive() is None  # unchanged since

    child.publish({"rows": torch.zeros(3)}, results_dir=handover_dir, dir_checked=True)
    published = handover.receive()
    assert published is not None and torch.equal(published.state["rows"], torch.zeros(3))
    assert published.results_dir == handover_dir and published.dir_checked is True
    assert not list(handover_dir.glob(".*.tmp"))


def test_owner_callback_takes_the_published_state(handover_dir, tmp_path):
    """The state a spawned rank 0 publishes becomes the launching process's callback state, also
    when that callback never saw its loaders (they came from a datamodule in the children)."""
    tasks = make_tasks()
    results = tmp_path / "results"
    trained = ContinualEvalCallback(eval_loaders(tasks), dirpath=results, verbose=False)
    fit_tasks(
        lambda task: pl.Trainer(callbacks=[trained], **trainer_kwargs(tmp_path, max_epochs=1)),
        Classifier(make_net()),
        train_loaders(tasks),
    )
    owner = ContinualEvalCallback(verbose=False)
    child = copy.copy(owner)  # even a shallow copy tracks the hand-over file on its own
    assert owner.stages_completed == 0
    state = trained.state_dict()
    state.pop("rng_states")
    child._handover.publish(state, results_dir=results, dir_checked=True)

    assert owner.stages_completed == 3
    assert torch.equal(owner.scores, trained.scores)
    assert torch.equal(owner.baseline, trained.baseline)
    assert owner.task_names == trained.task_names
    assert owner.results_dir == results and owner._directory.claimed
    assert owner.results()["scores"] == trained.results()["scores"]
    assert child.stages_completed == 3  # the copy reads the same file once too


def test_reset_does_not_read_back_the_old_runs_hand_over(handover_dir, tmp_path):
    """reset() starts a new run: a state a spawned child published for the old run (and not
    read yet) must not come back into the reset callback."""
    tasks = make_tasks()
    trained = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path / "r", verbose=False)
    fit_tasks(
        lambda task: pl.Trainer(callbacks=[trained], **trainer_kwargs(tmp_path, max_epochs=1)),
        Classifier(make_net()),
        train_loaders(tasks),
    )
    owner = ContinualEvalCallback(verbose=False)
    state = trained.state_dict()
    state.pop("rng_states")
    copy.copy(owner)._handover.publish(state, results_dir=tmp_path / "r", dir_checked=True)
    owner.reset()
    assert owner.stages_completed == 0
    assert owner.metrics is None

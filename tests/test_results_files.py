"""The run directory on disk: the claim a run holds on it from fit start (an exclusive file naming
run, pid, host and start; a live run's claim refuses a second run before it trains, whatever the
timing, a dead process's claim on this host is taken over with a warning, a resume keeps
working), and writes that fail (a full disk): one line naming the file, what is on disk and how
to resume, nothing truncated."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.results import ContinualResults, ScoreMatrix, check_results_files
from continual_eval.results.files import (
    CLAIM_FILE,
    JOURNAL_FILE,
    RESULTS_FILE,
    SCORES_FILE,
    ResultsWriteError,
    claim_results_dir,
    read_run_id,
    release_claim,
)
from script_runner import SRC, run_script

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "callback"))
from cl_helpers import (  # noqa: E402
    Classifier,
    eval_loaders,
    make_net,
    make_tasks,
    train_loaders,
    trainer_kwargs,
)


def claim_of(directory: Path) -> dict:
    return json.loads((directory / CLAIM_FILE).read_text())


def write_claim(directory: Path, run_id: str, pid: int, host: str | None = None) -> None:
    record = {"run_id": run_id, "pid": pid, "host": host or socket.gethostname()}
    (directory / CLAIM_FILE).write_text(json.dumps({**record, "started": "2030-01-01T00:00:00"}))


def results_of(stages: int, run_id: str, T: int = 3) -> ContinualResults:
    R = torch.full((stages, T), 0.5, dtype=torch.float64)
    matrix = ScoreMatrix("accuracy", R, torch.full((T,), 0.25, dtype=torch.float64))
    return ContinualResults.from_tensors({"acc": matrix}, run_id=run_id)


@pytest.fixture
def sleeper():
    """A live process of this host that is not this one."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def dead_pid() -> int:
    command = [sys.executable, "-c", "import os; print(os.getpid())"]
    done = subprocess.run(command, text=True, capture_output=True, check=True)
    return int(done.stdout)


# ---------------------------------------------------------------------- the claim
def test_claim_names_the_run_and_is_released_when_the_run_completes(tmp_path: Path) -> None:
    assert claim_results_dir(tmp_path, "run-a", restored=False, overwrite=False) is None
    claim = claim_of(tmp_path)
    assert claim["run_id"] == "run-a" and claim["pid"] == os.getpid()
    assert claim["host"] == socket.gethostname() and claim["started"][:2] == "20"
    results_of(2, "run-a").write(tmp_path)  # 2 of 3 stages: still running
    assert claim_of(tmp_path)["run_id"] == "run-a"
    results_of(3, "run-b").write(tmp_path)  # another run's document never releases it
    assert claim_of(tmp_path)["run_id"] == "run-a"
    results_of(3, "run-a").write(tmp_path)  # complete: released
    assert not (tmp_path / CLAIM_FILE).exists()


def test_a_journal_without_results_json_is_another_runs_record(tmp_path: Path) -> None:
    # run-a killed (SIGKILL) after its baseline line, before its first results.json: a fresh
    # run-b taking over the dead claim must still refuse the directory (it rewrote the journal)
    journal = tmp_path / JOURNAL_FILE
    header = {
        "journal": "continual-eval stage journal",
        "version": 1,
        "record": {"run_id": "run-a"},
    }
    journal.write_bytes(json.dumps(header).encode() + b'\n{"baseline": {}}\n')
    write_claim(tmp_path, "run-a", dead_pid())
    before = journal.read_bytes()
    with pytest.warns(UserWarning, match="took over"):
        problem = claim_results_dir(tmp_path, "run-b", restored=False, overwrite=False)
    assert problem is not None and problem.startswith(
        f"{journal} holds the results of another run (run_id 'run-a', 0 stages; this run is "
        "'run-b')"
    )
    assert journal.read_bytes() == before and not (tmp_path / CLAIM_FILE).exists()
    assert claim_results_dir(tmp_path, "run-a", restored=True, overwrite=False) is None  # resume
    release_claim(tmp_path, "run-a")
    assert claim_results_dir(tmp_path, "run-b", restored=False, overwrite=True) is None
    release_claim(tmp_path, "run-b")
    journal.write_bytes(b'{"run_id": "run-a"')  # a torn header: nothing was recorded
    assert claim_results_dir(tmp_path, "run-b", restored=False, overwrite=False) is None


def test_live_claim_of_another_process_refused(tmp_path: Path, sleeper: int) -> None:
    write_claim(tmp_path, "run-a", sleeper)
    before = (tmp_path / CLAIM_FILE).read_bytes()
    for overwrite in (False, True):  # overwrite replaces results, never a live run's claim
        problem = claim_results_dir(tmp_path, "run-b", restored=False, overwrite=overwrite)
        assert problem is not None and problem.startswith(f"{tmp_path} is in use by run run-a")
        assert f"(pid {sleeper} on this host, since 2030-01-01T00:00:00)" in problem
        assert "Nothing was trained or written" in problem
    assert (tmp_path / CLAIM_FILE).read_bytes() == before


def test_claim_of_another_host_refused(tmp_path: Path) -> None:
    write_claim(tmp_path, "run-a", dead_pid(), host="node-17")
    problem = claim_results_dir(tmp_path, "run-b", restored=False, overwrite=True)
    assert problem is not None and "(pid " in problem and "on host node-17" in problem


def test_stale_claim_of_a_dead_process_taken_over_with_a_warning(tmp_path: Path) -> None:
    pid = dead_pid()
    write_claim(tmp_path, "run-a", pid)
    with pytest.warns(UserWarning, match=rf"took over .*run run-a \(pid {pid} on this host"):
        assert claim_results_dir(tmp_path, "run-b", restored=False, overwrite=False) is None
    assert claim_of(tmp_path)["run_id"] == "run-b"


def test_resume_and_a_later_run_of_this_process_take_the_claim(tmp_path: Path, sleeper) -> None:
    write_claim(tmp_path, "run-a", sleeper)  # run-a resumed in a new process
    assert claim_results_dir(tmp_path, "run-a", restored=True, overwrite=False) is None
    assert claim_of(tmp_path)["pid"] == os.getpid()
    # an earlier run of this very process (it stopped, or crashed) does not block the next
    assert claim_results_dir(tmp_path, "run-b", restored=False, overwrite=False) is None
    assert claim_of(tmp_path)["run_id"] == "run-b"


def test_another_runs_results_refused_and_the_claim_given_back(tmp_path: Path) -> None:
    results_of(3, "run-a").write(tmp_path)
    problem = claim_results_dir(tmp_path, "run-b", restored=False, overwrite=False)
    assert problem is not None and "holds the results of another run (run_id 'run-a'" in problem
    assert not (tmp_path / CLAIM_FILE).exists()
    assert claim_results_dir(tmp_path, "run-b", restored=False, overwrite=True) is None
    assert claim_of(tmp_path)["run_id"] == "run-b"


def test_unreadable_claim_refused(tmp_path: Path) -> None:
    (tmp_path / CLAIM_FILE).write_text("{half a record")
    problem = claim_results_dir(tmp_path, "run-b", restored=False, overwrite=True)
    assert problem is not None and "cannot be read as a claim" in problem
    assert f"delete {CLAIM_FILE} only if no run is using the directory" in problem


CLAIMANT = """
import sys, time, uuid
from continual_eval.results.files import claim_results_dir
start = float(sys.argv[2])
while time.time() < start:
    pass
print(repr(claim_results_dir(sys.argv[1], uuid.uuid4().hex, restored=False, overwrite=False)))
sys.stdout.flush()
time.sleep(3)  # alive while the others try
"""


@pytest.mark.slow
def test_concurrent_claims_one_wins(tmp_path: Path) -> None:
    for attempt in range(3):
        directory = tmp_path / f"d{attempt}"
        start = time.time() + 4  # every interpreter has started by then
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CLAIMANT, str(directory), str(start)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        outputs = [proc.communicate(timeout=120)[0].strip() for proc in procs]
        assert sorted(outputs)[-1] == "None" and outputs.count("None") == 1, outputs
        assert all("is in use by run" in out for out in outputs if out != "None")


EXITS = """
import os, signal, sys
from continual_eval.results.files import claim_results_dir
assert claim_results_dir(sys.argv[1], "run-a", restored=False, overwrite=False) is None
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_claim_given_back_at_exit_and_left_by_a_killed_process(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    for how, left in (("exit", False), ("kill", True)):
        directory = tmp_path / how
        proc = subprocess.run([sys.executable, "-c", EXITS, str(directory), how], env=env)
        assert proc.returncode == (-9 if how == "kill" else 0)
        assert (directory / CLAIM_FILE).exists() == left
    with pytest.warns(UserWarning, match="took over .*run run-a"):  # the killed one's
        assert (
            claim_results_dir(tmp_path / "kill", "run-b", restored=False, overwrite=False) is None
        )


@pytest.mark.slow
@pytest.mark.ci
def test_second_run_on_the_directory_refused_before_it_trains(tmp_path: Path) -> None:
    """Issue 19.1: a second run on the same dirpath started while the first is inside its
    baseline (before it wrote any file): refused before training, the first completes intact."""
    results_dir, markers = tmp_path / "results", tmp_path / "markers"
    markers.mkdir()
    script = HERE / "results_claim_script.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)])}
    first = subprocess.Popen(
        [sys.executable, str(script), str(results_dir), str(markers), "first", "200"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 180
    while not (markers / "first.baseline").exists():  # the first run is in its baseline
        assert first.poll() is None and time.time() < deadline
        time.sleep(0.1)
    assert not (results_dir / RESULTS_FILE).exists()  # the window the old check missed
    second = run_script(script, results_dir, markers, "second", 0, timeout=240)
    (markers / "first.release").write_text("go")
    first_id = (markers / "first.run_id").read_text()
    assert second.returncode != 0
    assert f"FileExistsError: ContinualEvalCallback: {results_dir} is in use by run {first_id}" in (
        second.stderr
    )
    assert not (markers / "second.trained").exists() and not (markers / "second.baseline").exists()
    assert first.wait(timeout=240) == 0, first.stderr.read()[-3000:]
    assert (markers / "first.trained").exists()
    results = ContinualResults.load(results_dir)
    assert results.run_id == first_id and results.complete
    assert check_results_files(results_dir) is None
    assert not (results_dir / CLAIM_FILE).exists()  # released when the run completed


def test_callback_claims_before_the_baseline(tmp_path: Path) -> None:
    tasks = make_tasks()
    seen = {}

    class Look(Classifier):
        def forward(self, x):
            if not self.training and not seen:
                seen.update(claim_of(tmp_path))  # during the baseline evaluation
            return super().forward(x)

    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path, verbose=False)
    pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path / "logs", max_epochs=1)).fit(
        Look(make_net()), train_loaders(tasks)[0]
    )
    assert seen["run_id"] == cb.run_id and seen["pid"] == os.getpid()


# ---------------------------------------------------------------------- a full disk
def full_disk_on(monkeypatch, name: str) -> None:
    """Writing a file named ``name`` fails with ENOSPC after half of its bytes."""
    real = Path.write_bytes

    def write_bytes(self: Path, data: bytes) -> int:
        if self.name.startswith(f".{name}."):
            real(self, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)


@pytest.mark.parametrize("failing", [RESULTS_FILE, SCORES_FILE])
def test_full_disk_keeps_the_last_stage_and_says_how_to_resume(
    tmp_path: Path, monkeypatch, failing: str
) -> None:
    results_of(1, "run-a").write(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    full_disk_on(monkeypatch, failing)
    with pytest.raises(ResultsWriteError) as info:
        results_of(2, "run-a").write(tmp_path)
    monkeypatch.undo()
    err = info.value
    assert err.errno == errno.ENOSPC and "\n" not in str(err)
    message = str(err)
    assert f"could not write {tmp_path / failing} (No space left on device)" in message
    assert "while recording 2 completed stage(s)" in message
    assert f"{RESULTS_FILE} on disk holds 1 completed stage(s), unchanged" in message
    assert "resume the run from its last checkpoint" in message and "nothing truncated" in message
    assert (tmp_path / RESULTS_FILE).read_bytes() == before[RESULTS_FILE]  # nothing truncated
    assert not list(tmp_path.glob(".*.tmp"))
    assert ContinualResults.load(tmp_path).stages_completed == 1
    if failing == SCORES_FILE:  # failed before anything changed
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    else:  # the CSV went ahead; the commit record says so
        assert "written with" in check_results_files(tmp_path)


def test_full_disk_during_a_run(tmp_path: Path, monkeypatch) -> None:
    tasks = make_tasks()
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path / "out", verbose=False)
    model = Classifier(make_net())
    loaders = train_loaders(tasks)
    trainers = iter(range(3))

    def trainer(task: int) -> pl.Trainer:
        next(trainers)
        if task == 1:
            full_disk_on(monkeypatch, RESULTS_FILE)
        return pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))

    with pytest.raises(ResultsWriteError, match="holds 1 completed stage") as info:
        fit_tasks(trainer, model, loaders)
    monkeypatch.undo()
    assert str(tmp_path / "out" / RESULTS_FILE) in str(info.value)
    # the stage is durable in the journal, which load replays; results.json stays as it was
    assert "stages.jsonl holds 2 stage(s)" in str(info.value)
    assert read_run_id(tmp_path / "out")[2] == 1
    assert ContinualResults.load(tmp_path / "out").stages_completed == 2

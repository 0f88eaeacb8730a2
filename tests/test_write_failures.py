"""Write failures from outside the results files' own writer (a full disk at the claim, at a
logger's files, at the step-curves picture): each is the one-line `ResultsWriteError` naming the
file, what the results directory holds and how to resume; nothing is truncated; a resume then ends
with the uninterrupted R. And a reader in a fresh process (the callback never imported) replays
the stage journal: a run killed before its first results.json, or between two rebuilds."""

from __future__ import annotations

import builtins
import errno
import io
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

import continual_eval.results.files as files
from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.report import find_runs
from continual_eval.results import ContinualResults
from continual_eval.results.files import (
    CLAIM_FILE,
    JOURNAL_FILE,
    RESULTS_FILE,
    SCORES_FILE,
    ResultsWriteError,
)

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


class _Failing:
    """A file object whose writes fail with ``errno`` after writing half of their bytes (a disk
    that fills up inside a write)."""

    def __init__(self, file, code: int, state: dict | None = None) -> None:
        self._file, self._code, self._state = file, code, state

    def write(self, data) -> int:
        if self._state is not None and not self._state["on"]:
            return self._file.write(data)
        data = bytes(data)
        self._file.write(data[: len(data) // 2])
        self._file.flush()
        raise OSError(self._code, os.strerror(self._code))

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()


def no_space_for(monkeypatch, name: str, *, under: Path | None = None, code=errno.ENOSPC):
    """From now on, every write to a file named ``name`` (or its temporary ``.name.PID.tmp``),
    under ``under`` if given, fails (through ``open``: how Python, matplotlib and Lightning all
    write; a file kept open fails from the moment the switch is on); returns the switch
    (``switch(False)`` frees the disk again)."""
    real = io.open
    state = {"on": True}

    def fake_open(file, mode="r", *args, **kwargs):
        handle = real(file, mode, *args, **kwargs)
        if not isinstance(file, (str, os.PathLike)) or not any(c in mode for c in "wax"):
            return handle
        path = Path(os.fsdecode(file))
        hit = path.name == name or (path.name.startswith(f".{name}.") and path.suffix == ".tmp")
        if hit and (under is None or under in path.parents):  # failing while switched on
            return _Failing(handle, code, state)
        return handle

    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(builtins, "open", fake_open)
    return lambda on: state.__setitem__("on", on)


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


def _fit(tasks, root: Path, cb, *, ckpt: Path | None = None, logger=None, strike=None):
    """fit_tasks with a new Trainer per task (``strike(task)`` first), checkpoints in root/ckpt."""

    def factory(task: int) -> pl.Trainer:
        if strike is not None:
            strike(task)
        kw = trainer_kwargs(root / "logs", max_epochs=1)
        if logger is not None:
            kw["logger"] = logger()
        return pl.Trainer(callbacks=[cb], **kw)

    model = Classifier(make_net(dropout=0.3))
    return fit_tasks(
        factory, model, train_loaders(tasks), checkpoint_dir=root / "ckpt", ckpt_path=ckpt, seed=3
    )


def _one_line(err: BaseException, path: Path) -> str:
    message = str(err)
    assert isinstance(err, ResultsWriteError) and "\n" not in message, message
    assert f"could not write {path}" in message and "No space left on device" in message
    assert "nothing truncated" in message or "nothing was trained or written" in message
    return message


def test_full_disk_at_the_claim_is_one_line_and_nothing_trained(tmp_path: Path, monkeypatch):
    tasks = make_tasks(2)
    out = tmp_path / "out"
    real = os.fdopen  # the claim is created exclusively (os.open), then written through fdopen
    monkeypatch.setattr(os, "fdopen", lambda *a, **k: _Failing(real(*a, **k), errno.ENOSPC))
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=out, verbose=False)
    model = Classifier(make_net())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ResultsWriteError) as info:
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(
            model, train_loaders(tasks)[0]
        )
    monkeypatch.undo()
    message = _one_line(info.value, out / CLAIM_FILE)
    assert "nothing was trained or written" in message and "start the run again" in message
    assert sorted(p.name for p in out.iterdir()) == []  # no half claim, no results, no journal
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_full_disk_on_a_csv_loggers_copy_then_resume_equals_uninterrupted(
    tasks, tmp_path: Path, monkeypatch
):
    full = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path / "full", verbose=False)
    _fit(tasks, tmp_path / "f", full)
    logs = tmp_path / "cut" / "csv"
    switch = no_space_for(monkeypatch, SCORES_FILE, under=logs)
    switch(False)
    out = tmp_path / "cut" / "res"
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=out, verbose=False)

    def strike(task: int) -> None:
        switch(task == 1)  # the logger's copy of scores.csv after stage 1 cannot be written

    logger = CSVLogger(logs, name="l")  # one logger for every task's Trainer
    with pytest.raises(ResultsWriteError) as info:
        _fit(tasks, tmp_path / "cut", cb, logger=lambda: logger, strike=strike)
    switch(False)
    copy = next(logs.rglob(SCORES_FILE))
    message = _one_line(info.value, copy)
    assert "(the CSVLogger's copy)" in message
    assert f"in the results directory {out}, " in message
    assert "stages.jsonl holds 2 stage(s)" in message and "resume the run from its last" in message
    assert copy.read_text().count("\n") == 3  # the copy after stage 0, whole (header, baseline, 0)
    assert ContinualResults.load(out).stages_completed == 2  # the stage itself is recorded
    monkeypatch.undo()
    resumed = ContinualEvalCallback(eval_loaders(tasks), dirpath=out, verbose=False)
    _fit(tasks, tmp_path / "cut", resumed, ckpt=tmp_path / "cut" / "ckpt" / "task_0.ckpt")
    assert torch.equal(resumed.scores, full.scores)  # the uninterrupted R, bitwise
    assert torch.equal(ContinualResults.load(out).primary.scores, full.scores)


@pytest.mark.parametrize("name", [RESULTS_FILE, JOURNAL_FILE])
def test_full_disk_with_the_background_writer_then_resume_equals_uninterrupted(
    tasks, tmp_path: Path, monkeypatch, name: str
):
    """No logger, verbose=False: the results are made and written on the background writer (the
    error surfaces at the next wait); the journal's line is written in the hook."""
    full = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path / "full", verbose=False)
    _fit(tasks, tmp_path / "f", full)
    out = tmp_path / "cut" / "res"
    switch = no_space_for(monkeypatch, name, under=out)
    switch(False)
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=out, verbose=False)
    with pytest.raises(ResultsWriteError) as info:
        _fit(tasks, tmp_path / "cut", cb, strike=lambda task: switch(task == 1))
    switch(False)
    _one_line(info.value, out / name)
    assert "results.json on disk holds 1 completed stage(s), unchanged" in str(info.value)
    assert files.read_document(out).stages_completed == 1  # whole, the stage before
    journal = (out / JOURNAL_FILE).read_bytes()
    assert journal.endswith(b"\n")  # no torn line
    assert ContinualResults.load(out).stages_completed == (2 if name == RESULTS_FILE else 1)
    monkeypatch.undo()
    resumed = ContinualEvalCallback(eval_loaders(tasks), dirpath=out, verbose=False)
    _fit(tasks, tmp_path / "cut", resumed, ckpt=tmp_path / "cut" / "ckpt" / "task_0.ckpt")
    assert torch.equal(resumed.scores, full.scores)
    assert torch.equal(ContinualResults.load(out).primary.scores, full.scores)
    assert files.check_results_files(out) is None


def test_a_loggers_own_file_that_cannot_be_written_names_the_logger(tmp_path: Path, monkeypatch):
    """Lightning's CSVLogger failing in save() (its metrics.csv; a write error names no file)."""
    from continual_eval.loggers import log_stage

    results = ContinualResults.load(_recorded_run(make_tasks(2), tmp_path / "res").results_dir)
    logger = CSVLogger(tmp_path / "csv", name="l")

    def save() -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(logger, "save", save)
    with pytest.raises(ResultsWriteError) as info:
        log_stage([logger], results, 1, results_dir=tmp_path / "res")
    message = str(info.value)
    assert "\n" not in message and f"(a file of the CSVLogger in {logger.log_dir})" in message
    assert f"in the results directory {tmp_path / 'res'}, results.json on disk holds 2" in message
    assert "nothing truncated" in message and "resume the run from its last checkpoint" in message


def test_full_disk_on_the_curves_picture_keeps_the_last_one(tasks, tmp_path: Path, monkeypatch):
    out = tmp_path / "res"
    switch = no_space_for(monkeypatch, "accuracy_curves.png")
    switch(False)
    cb = ContinualEvalCallback(
        eval_loaders(tasks), dirpath=out, verbose=False, eval_every_n_steps=2
    )
    pictures: list[bytes] = []

    def strike(task: int) -> None:
        if task == 1:
            pictures.append((out / "accuracy_curves.png").read_bytes())
            switch(True)

    with pytest.raises(ResultsWriteError) as info:
        _fit(tasks, tmp_path, cb, strike=strike)
    switch(False)
    _one_line(info.value, out / "accuracy_curves.png")
    assert (out / "accuracy_curves.png").read_bytes() == pictures[0]  # not truncated
    assert not list(out.glob(".*.tmp"))


# ---------------------------------------------------------------------- a reader's own process
@pytest.fixture
def fresh_reader(monkeypatch):
    """A process that imported only the results package: no journal replay registered."""
    monkeypatch.setattr(files, "_journal_replay", None)


def _recorded_run(tasks, root: Path) -> ContinualEvalCallback:
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=root, verbose=False)
    _fit(tasks, root.parent / f"{root.name}-work", cb)
    return cb


def test_load_replays_a_journal_without_results_json(tasks, tmp_path: Path, fresh_reader):
    cb = _recorded_run(tasks, tmp_path / "run")
    (tmp_path / "run" / RESULTS_FILE).unlink()  # killed before its first results.json
    loaded = ContinualResults.load(tmp_path / "run")
    assert loaded.stages_completed == 3 and torch.equal(loaded.primary.scores, cb.scores)
    assert torch.equal(loaded.primary.baseline, cb.baseline)
    [run] = find_runs([tmp_path])  # the report finds it too
    assert torch.equal(run.results.primary.scores, cb.scores)


def test_a_claim_that_cannot_be_written_is_raised_on_every_rank(tmp_path: Path, monkeypatch):
    """Rank 0's failure goes through the same broadcast as a refusal: no rank waits for it."""
    from types import SimpleNamespace

    real = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda *a, **k: _Failing(real(*a, **k), errno.ENOSPC))
    sent: list = []

    def broadcast(obj, src=0):
        sent.append(obj)
        return obj

    def trainer(rank: int):
        strategy = SimpleNamespace(broadcast=broadcast if rank == 0 else lambda obj, src=0: sent[0])
        return SimpleNamespace(is_global_zero=rank == 0, world_size=2, strategy=strategy)

    out = tmp_path / "out"
    for rank in (0, 1):
        with pytest.raises(ResultsWriteError) as info:
            files.claim_or_refuse(trainer(rank), out, run_id="r", restored=False, overwrite=False)
        assert info.value.errno == errno.ENOSPC
        assert str(info.value).startswith(
            f"[Errno 28] ContinualEvalCallback: could not write {out / CLAIM_FILE} (No space"
        )
    assert not (out / CLAIM_FILE).exists()


def test_a_failure_before_any_checkpoint_says_to_start_again(tmp_path: Path) -> None:
    err = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    (tmp_path / JOURNAL_FILE).write_bytes(b"{}\n")
    for stages in (0, 1, 2):
        message = str(files.write_failed(tmp_path / RESULTS_FILE, err, stages))
        again = "; without a checkpoint, start the run again with overwrite=True or a new dirpath"
        assert message.endswith(again) == (stages <= 1), message
        assert "resume the run from its last checkpoint" in message

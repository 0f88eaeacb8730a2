"""The stage journal (stages.jsonl): one durable line per stage, results.json rebuilt at spaced
stages, ContinualResults.load replaying the journal's newer stages, torn and broken lines, a full
disk, and a run killed between two rebuilds."""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path

import pytest
import torch

from continual_eval._class_incremental_recorder import ClassIncrementalRecord
from continual_eval._held_out_record import HeldOutRecord
from continual_eval._run_directory import RunDirectory
from continual_eval._stage_journal import REBUILD_SPACING, rebuild_due
from continual_eval.evaluation.class_incremental import (
    AGNOSTIC_NAME,
    AWARE_NAME,
    TaskAgnosticAccuracyScorer,
)
from continual_eval.record import MatrixSpec, RunRecord, Scored
from continual_eval.results import ContinualResults, InvalidResultsError
from continual_eval.results.files import JOURNAL_FILE, RESULTS_FILE, ResultsWriteError, read_run_id
from continual_eval.stage_cost import StageCost
from script_runner import run_script

HERE = Path(__file__).parent
T = 40
CLASSES = [[2 * j, 2 * j + 1] for j in range(T)]


def _record() -> RunRecord:
    specs = {
        "acc": MatrixSpec("accuracy"),
        "loss": MatrixSpec("cross_entropy", higher_is_better=False, bounds=None),
        AWARE_NAME: MatrixSpec("accuracy"),
        AGNOSTIC_NAME: MatrixSpec("accuracy"),
    }
    names = [f"task {j}" for j in range(T)]
    sections = [
        ClassIncrementalRecord(TaskAgnosticAccuracyScorer(CLASSES), names),
        HeldOutRecord(["general", "safety"], specs),
    ]
    return RunRecord(specs, names, step_curves=True, metadata={"seed": 3}, sections=sections)


def _scored(g: torch.Generator, stage: int | None) -> Scored:
    rows = {name: torch.rand(T, generator=g, dtype=torch.float64) for name in ("acc", "loss")}
    rows[AGNOSTIC_NAME] = torch.rand(T, generator=g, dtype=torch.float64) / 2
    rows[AWARE_NAME] = rows[AGNOSTIC_NAME] + 0.5
    held_out = {name: torch.rand(2, generator=g, dtype=torch.float64) for name in rows}
    if stage is None:
        return Scored(rows, held_out=held_out)
    # each task's counts: its 2 classes' rows over every class, the same samples each stage
    blocks = [torch.randint(0, 2, (2, 2 * T), generator=g) for _ in range(T)]
    for block in blocks:
        block[:, -1] += 2 * T + 10 - block.sum(1)
    return Scored(rows, {AGNOSTIC_NAME: blocks}, tuple(range(T)), held_out)


def _cost(stage: int) -> StageCost:
    return StageCost(
        stage=stage,
        train_seconds=0.25 * stage,
        eval_seconds=0.1,
        peak_memory_bytes=1000 + stage,
        memory_kind="process peak RSS",
        parameters=10,
        trainable_parameters=10,
        samples=8,
        optimizer_steps=stage + 1,
        replay_memory=None,
    )


def _run(out: Path, stages: int) -> tuple[RunRecord, list[int], RunDirectory]:
    """A record of ``stages`` stages committed stage by stage; returns it, the stage counts of
    the results.json rebuilds and the directory writer."""
    g = torch.Generator().manual_seed(0)
    record, directory = _record(), RunDirectory()
    directory.path = out
    record.record_baseline(_scored(g, None))
    directory.write(record, record.continual_results())
    rebuilt = []
    for stage in range(stages):
        record.steps_trained = 5 * (stage + 1)
        record.record_step(5 * stage + 2, stage, _scored(g, None).rows, full=False)
        record.record_stage(stage, _scored(g, stage), _cost(stage))
        record.record_step(record.steps_trained, stage, _scored(g, None).rows, full=True)
        if directory.write(record, record.continual_results(), stage=stage):
            rebuilt.append(stage + 1)
    directory.wait()  # the last stage's background write (fsync, results.json) on disk
    return record, rebuilt, directory


def test_rebuild_schedule_keeps_results_json_within_a_sixteenth_and_amortised_flat() -> None:
    for num_tasks in (5, 40, 1000):
        built, rebuilds, cells = 0, [], 0
        for n in range(1, num_tasks + 1):
            if rebuild_due(n, built, num_tasks):
                built = n
                rebuilds.append(n)
                cells += n  # a rebuild writes n rows
            assert n - built < max(1, n // REBUILD_SPACING)  # never further behind
        assert rebuilds[-1] == num_tasks
        every = min(2 * REBUILD_SPACING - 1, num_tasks)  # every stage while n // 16 <= 1
        assert rebuilds[:every] == list(range(1, every + 1))
        # amortised rows written per stage stay bounded (about 2 x REBUILD_SPACING), not ~T/2
        assert cells / num_tasks <= 2 * REBUILD_SPACING + 1


def test_load_replays_the_journal_ahead_of_results_json(tmp_path: Path) -> None:
    record, rebuilt, _ = _run(tmp_path, 38)  # 38 stages: results.json last rebuilt after 37
    assert rebuilt == [*range(1, 32), 33, 35, 37]
    assert read_run_id(tmp_path)[2] == 37
    lines = (tmp_path / JOURNAL_FILE).read_bytes().splitlines()
    assert len(lines) == 1 + 1 + 38  # header, baseline, one line per stage
    # each line holds its stage's data only: one row per matrix, the stage's two curve points,
    # its held-out rows (its size does not grow with the stages before it)
    for stage, line in enumerate(lines[2:]):
        part = json.loads(line)
        assert part["stage"] == stage and part["cost"]["stage"] == stage
        assert {len(row) for row in part["rows"].values()} == {T}
        assert part["curves"]["step"] == [5 * stage + 2, 5 * (stage + 1)]
        assert {len(rows) for rows in part["curves"]["rows"].values()} == {2}
        assert {len(row) for row in part["sections"]["held_out"].values()} == {2}
    loaded = ContinualResults.load(tmp_path)
    assert loaded.stages_completed == 38
    assert loaded.to_dict() == record.continual_results().to_dict()  # every section, bit for bit
    # the file named directly is read the same way; results.json alone is the last rebuild
    assert ContinualResults.load(tmp_path / RESULTS_FILE).stages_completed == 38
    (tmp_path / JOURNAL_FILE).unlink()
    assert ContinualResults.load(tmp_path).stages_completed == 37


def test_a_torn_last_line_is_ignored_with_a_warning(tmp_path: Path) -> None:
    _run(tmp_path, 34)  # results.json after 33, journal 34
    journal = tmp_path / JOURNAL_FILE
    with open(journal, "ab") as fh:
        fh.write(b'{"stage": 34, "rows": {"acc": [0.5, 0.')  # a write cut short
    with pytest.warns(UserWarning, match="last line is incomplete"):
        assert ContinualResults.load(tmp_path).stages_completed == 34


def test_a_broken_line_is_refused_naming_the_file_and_line(tmp_path: Path) -> None:
    _run(tmp_path, 34)
    journal = tmp_path / JOURNAL_FILE
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[4] = b"{not json}\n"
    journal.write_bytes(b"".join(lines))
    with pytest.raises(InvalidResultsError, match=r"stages\.jsonl: line 5: not JSON"):
        ContinualResults.load(tmp_path)
    bad = json.loads(lines[3])
    bad["rows"]["acc"] = bad["rows"]["acc"][:3]  # a row of 3 cells for 24 tasks
    lines[4] = (json.dumps(bad) + "\n").encode()
    journal.write_bytes(b"".join(lines))
    with pytest.raises(InvalidResultsError, match=r"stages\.jsonl: line 5: cannot be replayed"):
        ContinualResults.load(tmp_path)


def test_a_journal_of_another_run_is_not_replayed(tmp_path: Path) -> None:
    _run(tmp_path / "a", 34)
    _run(tmp_path / "b", 36)
    (tmp_path / "b" / JOURNAL_FILE).replace(tmp_path / "a" / JOURNAL_FILE)
    # run ids are random per record: b's journal beside a's results.json is ignored
    assert ContinualResults.load(tmp_path / "a").stages_completed == 33


def test_full_disk_on_the_journal_leaves_no_torn_line(tmp_path: Path, monkeypatch) -> None:
    record, _, directory = _run(tmp_path, 33)  # results.json after 33: stage 34 is journal only
    before = (tmp_path / JOURNAL_FILE).read_bytes()
    g = torch.Generator().manual_seed(1)
    record.record_stage(33, _scored(g, 33), _cost(33))

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("continual_eval._stage_journal.os.fsync", no_space)
    # the line is written here, its fsync on the background thread: the error is the wait's
    directory.write(record, record.continual_results(), stage=33)
    with pytest.raises(ResultsWriteError, match=r"stages\.jsonl .*holds 33 stage") as info:
        directory.wait()
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert (tmp_path / JOURNAL_FILE).read_bytes() == before
    assert ContinualResults.load(tmp_path).stages_completed == 33


@pytest.mark.slow
def test_kill_between_two_rebuilds_loses_no_stage(tmp_path: Path) -> None:
    full = run_script(HERE / "journal_kill_script.py", "full", tmp_path / "full", timeout=300)
    assert full.returncode == 0, full.stderr[-3000:]
    killed = run_script(HERE / "journal_kill_script.py", "killed", tmp_path / "k", timeout=300)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert read_run_id(tmp_path / "k")[2] == 35  # results.json: the rebuild after 35 stages
    loaded = ContinualResults.load(tmp_path / "k")  # + the journal's 36th stage
    reference = ContinualResults.load(tmp_path / "full")
    assert loaded.stages_completed == 36 and reference.stages_completed == 40
    assert torch.equal(loaded.primary.scores, reference.primary.scores[:36])
    assert torch.equal(loaded.primary.baseline, reference.primary.baseline)
    assert all(math.isfinite(v) for v in loaded.primary.metrics.values() if v is not None)


def test_the_fsync_and_the_rebuild_run_on_the_writer_thread(tmp_path: Path, monkeypatch) -> None:
    """A stage's write returns with its journal line in the file while the writer thread is held
    inside the rebuild of results.json; the wait then finds the rebuilt file, complete."""
    import threading

    import continual_eval.results.files as files

    record, _, directory = _run(tmp_path, 3)  # every stage of the first 31 rebuilds results.json
    lines = (tmp_path / JOURNAL_FILE).read_bytes().count(b"\n")
    g = torch.Generator().manual_seed(1)
    record.record_stage(3, _scored(g, 3), _cost(3))
    held, entered = threading.Event(), threading.Event()
    real = files._write_bytes

    def held_write(path: Path, data: bytes, *, durable: bool) -> None:
        entered.set()
        held.wait(timeout=20)
        real(path, data, durable=durable)

    monkeypatch.setattr(files, "_write_bytes", held_write)
    assert directory.write(record, record.continual_results(), stage=3)  # a rebuild stage
    assert entered.wait(timeout=20)  # the writer thread is inside the rebuild, held
    assert (tmp_path / JOURNAL_FILE).read_bytes().count(b"\n") == lines + 1  # the line: written
    assert read_run_id(tmp_path)[2] == 3  # results.json: the last rebuild's, complete
    assert ContinualResults.load(tmp_path).stages_completed == 4  # the journal replays stage 4
    held.set()
    directory.wait()
    assert read_run_id(tmp_path)[2] == 4
    assert torch.equal(
        ContinualResults.load(tmp_path).primary.scores, record.continual_results().primary.scores
    )


def test_deferred_results_are_those_of_their_stage_while_the_record_moves_on(
    tmp_path: Path,
) -> None:
    """A stage's results made later on the writer (`RunRecord.deferred_results`, a run without
    sections) hold that stage's rows, curves and costs, bit for bit, even when the next stage is
    recorded before the writer runs; results.json then equals the one written from results made
    in the hook."""
    import threading

    from continual_eval._run_directory import _REBUILDER, _Job

    specs = {"acc": MatrixSpec("accuracy"), "loss": MatrixSpec("cross_entropy", bounds=None)}
    names = [f"task {j}" for j in range(4)]
    record = RunRecord(specs, names, step_curves=True, metadata={"seed": 3})
    assert record.deferred_results() is not None
    assert _record().deferred_results() is None  # the held-out section: made in the hook
    assert _record().deferred_results(omit=["held_out"]) is not None  # class-IL: deferred too
    assert _record().deferred_results(omit=["class_incremental", "held_out"]) is not None
    g = torch.Generator().manual_seed(0)

    def rows() -> dict[str, torch.Tensor]:
        return {name: torch.rand(4, generator=g, dtype=torch.float64) for name in specs}

    eager, deferred = RunDirectory(), RunDirectory()
    eager.path, deferred.path = tmp_path / "eager", tmp_path / "deferred"
    eager.path.mkdir()
    deferred.path.mkdir()
    record.record_baseline(Scored(rows()))
    for directory in (eager, deferred):
        directory.write(record, record.continual_results())
    for stage in range(3):
        record.record_step(5 * stage + 2, stage, rows(), full=False)
        record.record_stage(stage, Scored(rows(), task_ids=tuple(range(4))), _cost(stage))
        record.record_step(5 * stage + 5, stage, rows(), full=True)
        expected = record.continual_results()
        held = threading.Event()
        _REBUILDER.submit(_Job([lambda held=held: held.wait(timeout=20)]))  # rebuilds: held
        later = record.deferred_results()
        assert later is not None
        assert deferred.write(record, later, stage=stage)
        eager.write(record, expected, stage=stage)
        # the record moves on (a step curve point) before the writer makes the results
        record.record_step(5 * stage + 7, stage + 1, rows(), full=False)
        held.set()
        deferred.wait()
        eager.wait()
        assert later().to_dict() == expected.to_dict()
        assert (deferred.path / RESULTS_FILE).read_bytes() == (
            eager.path / RESULTS_FILE
        ).read_bytes()
        loaded = ContinualResults.load(deferred.path)
        assert torch.equal(loaded.primary.scores, record.matrices["acc"].scores)


def test_deferred_class_incremental_results_are_those_of_their_stage(tmp_path: Path) -> None:
    """With a class-incremental section, results made later (`deferred_results`, the section's
    `deferred_add_to`) equal results made at the stage, bit for bit in results.json, although
    the next stage is recorded first (more confusion cells, new sums) and the section then loads
    another run's counts (new buffers and sums, as on a resume): made from the live state, the
    section would hold those."""
    g, h = torch.Generator().manual_seed(4), torch.Generator().manual_seed(5)
    record, other = _record(), _record()
    section = record.sections["class_incremental"]
    for r, gen in ((record, g), (other, h)):
        r.sections.pop("held_out")
        r.record_baseline(_scored(gen, None))
        r.record_stage(0, _scored(gen, 0), _cost(0))
    for stage in range(3):
        expected = record.continual_results()
        later = record.deferred_results()
        assert later is not None
        record.record_stage(stage + 1, _scored(g, stage + 1), _cost(stage + 1))  # moves on
        other.record_stage(stage + 1, _scored(h, stage + 1), _cost(stage + 1))
        section.load_state_dict(other.sections["class_incremental"].state_dict())
        made = later()
        assert made.class_incremental is not None and made.primary.num_stages == stage + 1
        assert made.to_document().class_incremental == expected.to_document().class_incremental
        assert made.to_dict() == expected.to_dict()


def test_a_stage_between_rebuilds_does_not_wait_for_the_rebuild(
    tmp_path: Path, monkeypatch
) -> None:
    """While the rebuild of results.json after 35 stages is held on its thread, stage 36 (no
    rebuild due) is appended to the journal without waiting for it; the held rebuild then lands
    complete, and the next rebuild, the fit's end or `wait` wait for it."""
    import threading
    import time

    import continual_eval.results.files as files

    record, rebuilt, directory = _run(tmp_path, 34)
    assert rebuilt[-1] == 33 and read_run_id(tmp_path)[2] == 33  # stage 34: journal only
    held, entered = threading.Event(), threading.Event()
    real = files._write_bytes

    def held_write(path: Path, data: bytes, *, durable: bool) -> None:
        if path.name == RESULTS_FILE:
            entered.set()
            held.wait(timeout=20)
        real(path, data, durable=durable)

    monkeypatch.setattr(files, "_write_bytes", held_write)
    safety = threading.Timer(10, held.set)  # a write that waits anyway ends after 10 s
    safety.start()
    g = torch.Generator().manual_seed(7)
    try:
        record.record_stage(34, _scored(g, 34), _cost(34))
        assert directory.write(record, record.continual_results(), stage=34)  # 35: a rebuild
        assert entered.wait(timeout=20)  # held inside the rebuild
        record.record_stage(35, _scored(g, 35), _cost(35))
        start = time.perf_counter()
        assert not directory.write(record, record.continual_results(), stage=35)  # 36: no
        seconds = time.perf_counter() - start
        assert not held.is_set() and seconds < 5, seconds  # it did not wait for the rebuild
        assert read_run_id(tmp_path)[2] == 33  # results.json: the last finished rebuild's
        assert ContinualResults.load(tmp_path).stages_completed == 36  # the journal's 36
    finally:
        held.set()
        safety.cancel()
    directory.wait()
    assert read_run_id(tmp_path)[2] == 35
    loaded = ContinualResults.load(tmp_path)
    assert loaded.stages_completed == 36
    assert loaded.to_dict() == record.continual_results().to_dict()


def test_the_online_section_of_a_file_written_here_is_not_read_again(
    tmp_path: Path, monkeypatch
) -> None:
    """A rebuild keeps the ``online`` section of the results.json it replaces: read from the file
    unless this process wrote that very file (same inode, size, times); a file replaced by
    another writer since is read again."""
    import continual_eval.results.files as files

    record, _, _ = _run(tmp_path, 3)
    reads = []
    real = files.msgspec.json.decode

    def counted(data, *args, **kwargs):
        if kwargs.get("type") is files._OnlinePart:
            reads.append(len(data))
        return real(data, *args, **kwargs)

    monkeypatch.setattr(files.msgspec.json, "decode", counted)
    document = record.continual_results().to_document(with_files=False)
    files.commit_results(tmp_path, document)
    assert reads == []  # the file this process wrote last: its section is known
    path = tmp_path / RESULTS_FILE
    path.write_bytes(path.read_bytes())  # another writer's copy: another mtime, same bytes
    files.commit_results(tmp_path, document)
    assert len(reads) == 1
    files.commit_results(tmp_path, document)
    assert len(reads) == 1


def test_a_fresh_reader_process_replays_the_newer_journal(tmp_path: Path, monkeypatch) -> None:
    """A process that never imported the callback (a script reading results, the report CLI):
    load still replays the journal's stages that results.json does not hold yet."""
    import continual_eval.results.files as files

    record, _, directory = _run(tmp_path, 33)
    g = torch.Generator().manual_seed(1)
    record.record_stage(33, _scored(g, 33), _cost(33))
    directory.write(record, record.continual_results(), stage=33)  # journal only (not due)
    directory.wait()
    assert read_run_id(tmp_path)[2] == 33
    monkeypatch.setattr(files, "_journal_replay", None)  # as in a fresh process
    loaded = ContinualResults.load(tmp_path)
    assert loaded.stages_completed == 34
    assert torch.equal(loaded.primary.scores, record.continual_results().primary.scores)

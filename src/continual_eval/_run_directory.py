"""The results directory of one [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] run,
as the callback sees it: chosen on rank 0 at the first fit, claimed on every rank before anything is
trained or written, its stage journal appended after every stage and ``results.json`` rebuilt when
due (`continual_eval._stage_journal`). The file rules (atomic writes, the claim, the commit
record) are `continual_eval.results.files`; this holds what one run knows about its directory
across fits, checkpoints and the ``ddp_spawn`` hand-over.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities import rank_zero_info

from continual_eval._stage_journal import StageJournal, rebuild_due
from continual_eval.results.files import choose_results_dir, claim_or_refuse, prepare_commit

if TYPE_CHECKING:
    from continual_eval.record import RunRecord
    from continual_eval.results import ContinualResults

__all__ = ["RunDirectory"]


class _Job:
    """Writes of one stage, run in order on the writer thread; the first error stops them."""

    def __init__(self, steps: list[Callable[[], Any]]) -> None:
        self.steps = steps
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for step in self.steps:
                step()
        except BaseException as err:  # raised by the waiting `RunDirectory.wait`
            self.error = err
        finally:
            self.done.set()


class _Writer:
    """A background writer of the process: one daemon thread taking `_Job`s in order (started on
    the first job, again in a forked child); an exiting interpreter finishes the queued jobs first
    (`atexit`)."""

    def __init__(self, name: str = "continual-eval writer") -> None:
        self.name = name
        self.lock = threading.Lock()
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.pid = -1
        self.last: _Job | None = None

    def submit(self, job: _Job) -> None:
        with self.lock:
            if self.pid != os.getpid() or self.thread is None or not self.thread.is_alive():
                self.jobs, self.pid = queue.SimpleQueue(), os.getpid()
                self.thread = threading.Thread(
                    target=self._serve, args=(self.jobs,), name=self.name, daemon=True
                )
                self.thread.start()
            self.last = job
            self.jobs.put(job)

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[_Job]) -> None:
        while True:
            jobs.get().run()

    def drain(self) -> None:
        """Wait for every job submitted (at interpreter exit)."""
        last = self.last
        if last is not None and self.pid == os.getpid():
            last.done.wait()


#: the journal's fsyncs (one short job a stage)
_WRITER = _Writer()
#: the rebuilds of results.json and the CSV files (long at large T: seconds at T = 1000 with
#: class-incremental counts), apart so that the stages recorded meanwhile need not wait for them
_REBUILDER = _Writer("continual-eval rebuild")
atexit.register(_WRITER.drain)
atexit.register(_REBUILDER.drain)


class RunDirectory:
    """Where one run's ``results.json`` and ``scores*.csv`` go (the callback's ``dirpath`` and
    ``overwrite`` are read when the directory is chosen and claimed, so changing them between
    runs takes effect)."""

    def __init__(self) -> None:
        self.path: Path | None = None  # set on rank 0 at the first fit
        self.recorded: str | None = None  # the directory a restored checkpoint names
        self.claimed = False  # claimed (or refused) before this run trained anything
        self._journal: StageJournal | None = None  # this process's writer of the journal
        self._built: int | None = None  # stages in the results.json this process last wrote
        #: whether the last `write` rebuilt results.json
        self.rebuilt = False
        self._pending: _Job | None = None  # the journal's fsync of the last stage
        self._rebuild: _Job | None = None  # the rebuild of results.json in flight
        self._building: int | None = None  # the stages it holds

    def choose(self, trainer: Any, run_id: str, dirpath: str | os.PathLike[str] | None) -> None:
        """Rank 0, at every fit: keep the directory chosen before, else the one a resumed run
        recorded (if it still holds that run), else ``dirpath`` or the logger's
        (`default_results_dir`)."""
        if trainer.is_global_zero and self.path is None:
            self.path = choose_results_dir(trainer, dirpath, recorded=self.recorded, run_id=run_id)

    def claim(
        self, trainer: Any, run_id: str, *, restored: bool, overwrite: bool, verbose: bool
    ) -> None:
        """Every rank, once per run before anything is trained or written: rank 0 claims the
        directory (and says where it is when ``verbose``); every rank raises
        ``FileExistsError`` naming why when another run uses it or holds its results (unless
        ``overwrite``)."""
        claim_or_refuse(trainer, self.path, run_id=run_id, restored=restored, overwrite=overwrite)
        self.claimed = True
        if verbose and trainer.is_global_zero and self.path is not None:
            rank_zero_info(
                f"[continual-eval] run {run_id}: results.json and scores.csv go to {self.path}"
            )

    def __getstate__(self) -> dict[str, Any]:  # a pickled copy (ddp_spawn) writes afresh
        for job in (self._pending, self._rebuild):
            if job is not None:
                job.done.wait()  # its error (if any) stays here, for this copy's `wait`
        return {
            **self.__dict__,
            "_journal": None,
            "_built": None,
            "_pending": None,
            "_rebuild": None,
            "_building": None,
        }

    def write(
        self,
        record: RunRecord,
        results: ContinualResults | Callable[[], ContinualResults],
        *,
        stage: int | None = None,
    ) -> bool:
        """Commit ``record`` (rank 0, once the directory is known; elsewhere nothing): stage
        ``stage``'s line appended to the journal (``None``: the journal rewritten from the
        record, for the baseline, a resume or the end of a run), then ``results`` (the record's)
        written as ``results.json`` and CSV files when `rebuild_due` (always with ``stage=None``);
        ``results`` may be a function making them (`RunRecord.deferred_results`), called on the
        background writer. Returns whether ``results.json`` is rewritten.

        Off the critical path: the journal line is written and flushed to the OS here (a killed
        process loses no stage; a rewritten journal is fsync'd here too) and the document of
        ``results.json`` made here (plain values) unless ``results`` is a function; its bytes and
        the CSV files', the fsyncs and the atomic replacement of the files run on background
        threads (`wait`): the journal's fsync on one, which the next write waits for; the
        rebuild on another, which only the next rebuild (one at a time, in order), a full
        rewrite (``stage=None``), `flush`, the fit's end, the ``ddp_spawn`` hand-over and a
        failed fit wait for, so that the stages between two rebuilds never wait for one (an
        error of a rebuild that has finished is raised by the next write)."""
        if stage is None:
            self.wait()
        else:
            self._wait_journal()
            self._check_rebuild()
        if self.path is None:
            self.rebuilt = True  # nothing written: every logger output is up to date anyway
            return False
        if self._journal is None or self._journal.path.parent != self.path:
            self._journal = StageJournal(self.path)
        completed = record.num_stages
        self.rebuilt = self.due(record, stage)
        if self.rebuilt:
            self._wait_rebuild()  # the rebuild before, whose files this one replaces
        jobs: list[Callable[[], Any]] = []
        if stage is None:
            self._journal.rewrite(record)
        else:  # one fsync a stage: the journal's, or the rebuilt results.json's
            sync = self._journal.append(record, stage, durable=not self.rebuilt, deferred=True)
            if sync is not None:
                jobs.append(sync)
        self._start(jobs)
        if self.rebuilt:
            # the document (plain lists, nothing the record changes later) is made here; its
            # bytes (JSON, CSV, hashes) and the files on the rebuild thread
            path = self.path
            rebuild: list[Callable[[], Any]]
            if callable(results):  # the results made, and their document, on the writer too
                make = results
                rebuild = [lambda: prepare_commit(path, make().to_document(with_files=False))()]
            else:
                document = results.to_document(with_files=False)
                rebuild = [lambda: prepare_commit(path, document)()]
            rebuild.append(lambda: setattr(self, "_built", completed))
            self._rebuild, self._building = _Job(rebuild), completed
            _REBUILDER.submit(self._rebuild)
        return self.rebuilt

    def _start(self, steps: list[Callable[[], Any]]) -> None:
        """Run ``steps`` in order on the journal's background writer (`_Writer`); the first error
        stops them and is kept for `wait`."""
        if steps:
            self._pending = _Job(steps)
            _WRITER.submit(self._pending)

    def close(self) -> None:
        """Wait for the background write, then close the journal's file (a run that ended)."""
        self.wait()
        if self._journal is not None:
            self._journal.close()

    def wait(self) -> None:
        """Wait for the background writes (if any): the journal's and the rebuild's; an error
        (a ``ResultsWriteError``: a full disk) is raised here, once (the journal's first)."""
        try:
            self._wait_journal()
        finally:
            self._wait_rebuild()

    def _wait_journal(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.done.wait()
            if pending.error is not None:
                raise pending.error

    def _wait_rebuild(self) -> None:
        rebuild, self._rebuild = self._rebuild, None
        if rebuild is not None:
            rebuild.done.wait()
            if rebuild.error is not None:
                raise rebuild.error

    def _check_rebuild(self) -> None:
        """The rebuild in flight, if it has finished: forgotten, its error raised."""
        if self._rebuild is not None and self._rebuild.done.is_set():
            self._wait_rebuild()

    def due(self, record: RunRecord, stage: int | None) -> bool:
        """Whether `write` of ``stage`` (``None``: a full rewrite) rebuilds ``results.json``
        (always where no directory is written: every output is then the stage's own)."""
        if self.path is None or stage is None:
            return True
        self._check_rebuild()
        # a rebuild in flight counts as done (its error, if any, is raised by a later write)
        built = self._building if self._rebuild is not None else self._built
        return rebuild_due(record.num_stages, built, record.num_tasks)

    def flush(self, record: RunRecord, results: ContinualResults) -> None:
        """Wait for the background write, then rebuild ``results.json`` if it is behind the
        journal (a fit that raised)."""
        try:
            self.wait()
        finally:
            if (
                self.path is not None
                and self._built is not None
                and self._built != record.num_stages
            ):
                results.write(self.path)
                self._built = record.num_stages

"""The run directory on disk: which one a run writes to, claiming it, writing its files, reading
them back. Documents in, documents out (`Document`); no
tensors, no Lightning.

Files of a run directory:

* ``scores.csv`` (the primary matrix: a ``baseline`` row, then one row per stage; an empty field
  is a cell that was not evaluated) and ``scores_<name>.csv`` per further matrix, written first;
* ``results.json``, written last: the document plus ``files``, the SHA-256 and stage count of
  every CSV written with it. It is the commit record of the set: a write interrupted between the
  files leaves a CSV one stage ahead, which
  [`check_results_files`][continual_eval.results.check_results_files] reports and a resumed run
  rewrites;
* ``.continual_eval_claim.json`` while a run is using the directory (see
  `claim_results_dir`).

One ``results.json``, two writers: with
[`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] and
[`OnlineEvalCallback`][continual_eval.online.OnlineEvalCallback] on one Trainer, the online callback
writes into the task callback's directory under its run id (the whole document: that callback's
results with the ``online`` section), and `commit_results` keeps the ``online`` section of the
``results.json`` it replaces when the new document has none and both are of the same run: the task
callback's writes never drop what the online callback wrote. Each write replaces the file
atomically, so a reader sees one complete document.

Every file is replaced atomically (a temporary ``.NAME.PID.tmp`` beside it, then
``os.replace``): a process killed at any point, or a full disk, leaves the previous complete
version; `remove_stale_temporaries` removes what killed writers left.

* ``stages.jsonl``, the stage journal of a
  [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] run: one JSON line per recorded
  stage, appended and fsync'd after every stage, the durable record of the run; ``results.json``
  and the CSV files are rebuilt from the run's record at spaced stages, so they may be a few
  stages behind it (never inconsistent). Its format and the rebuild rule are
  `continual_eval._stage_journal`'s;
  [`ContinualResults.load`][continual_eval.results.ContinualResults.load] replays the journal's
  newer stages (`replay_newer_journal`).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import socket
import stat
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from continual_eval._csv import csv_text
from continual_eval.results.schema import (
    MAX_FILE_BYTES,
    Document,
    FileRecord,
    InvalidResultsError,
    OnlineSection,
    check_online_section,
    decode_document,
    printable,
)

try:  # POSIX: serialises claims of one directory by processes of one host
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CLAIM_FILE",
    "JOURNAL_FILE",
    "RESULTS_FILE",
    "SCORES_FILE",
    "ResultsWriteError",
    "check_results_files",
    "choose_results_dir",
    "claim_or_refuse",
    "claim_results_dir",
    "commit_results",
    "default_results_dir",
    "file_records",
    "is_record_file",
    "new_version_dir",
    "prepare_commit",
    "read_document",
    "read_run_id",
    "release_claim",
    "remove_stale_temporaries",
    "replace_atomically",
    "replay_newer_journal",
    "scores_csv_name",
    "set_journal_replay",
    "write_failed",
    "write_scores_csv",
]

RESULTS_FILE = "results.json"
SCORES_FILE = "scores.csv"
CLAIM_FILE = ".continual_eval_claim.json"
JOURNAL_FILE = "stages.jsonl"
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.tmp$")
_ENCODER = msgspec.json.Encoder()


# ---------------------------------------------------------------------- atomic writes
def replace_atomically(
    path: str | os.PathLike[str], write: Callable[[Path], Any], *, durable: bool = True
) -> None:
    """Write ``path`` through ``write(tmp)`` into ``.NAME.PID.tmp`` beside it, then
    ``os.replace`` it over ``path``: a process killed at any point leaves the previous complete
    file. ``durable``: fsync the data first, so the new file also survives a power loss or an OS
    crash. On any failure the temporary file is removed and ``path`` is unchanged."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_bytes(path: Path, data: bytes, *, durable: bool) -> None:
    replace_atomically(path, lambda tmp: tmp.write_bytes(data), durable=durable)


class ResultsWriteError(OSError):
    """A results file could not be written (a full disk, a read-only directory): one line naming
    the file, what is safely on disk and how to resume; ``errno`` is the cause's, ``path`` the
    file (``None`` where the error does not say)."""

    path: Path | None = None


def write_failed(
    path: str | os.PathLike[str],
    err: OSError,
    stages: int,
    *,
    results_dir: str | os.PathLike[str] | None = None,
    what: str = "",
) -> ResultsWriteError:
    """The one-line `ResultsWriteError` of a failed write of ``path`` while ``stages`` stages
    were recorded: the file (``what``: what it is, e.g. a logger's copy), what the results
    directory ``results_dir`` (default: ``path``'s) safely holds and how to resume."""
    path = Path(path)
    directory = path.parent if results_dir is None else Path(results_dir)
    on_disk = read_run_id(directory)[2]
    kept = "" if directory == path.parent else f"in the results directory {directory}, "
    if on_disk is None:
        kept += f"no complete {RESULTS_FILE} is on disk yet"
    else:
        kept += f"{RESULTS_FILE} on disk holds {on_disk} completed stage(s), unchanged"
        if path.name == RESULTS_FILE:
            kept += " (a CSV may be a stage ahead; a resumed run rewrites it)"
        elif path.parent == directory and _is_results_file(path.name):
            kept += " (the CSV files it names are unchanged too)"
    journal = directory / JOURNAL_FILE
    if journal.is_file():
        with contextlib.suppress(OSError):
            lines = journal.read_bytes().count(b"\n")
            kept += (
                f"; the stage journal {JOURNAL_FILE} holds {max(lines - 2, 0)} stage(s) "
                "(ContinualResults.load reads them)"
            )
    resume = (
        "then resume the run from its last checkpoint (trainer.fit(..., ckpt_path=...)): it "
        "rewrites every file from the checkpoint's state"
    )
    if stages <= 1:  # the baseline's or first stage's write: a checkpoint may not exist yet
        again = " with overwrite=True or a new dirpath"
        again = again if journal.is_file() or on_disk is not None else ""
        resume += f"; without a checkpoint, start the run again{again}"
    error = ResultsWriteError(
        err.errno,
        f"could not write {path}{what} ({err.strerror or err}) while recording {stages} "
        f"completed stage(s); {kept}, nothing truncated. Free the disk (or fix the directory), "
        + resume,
    )
    error.path = path
    return error


def is_record_file(path: Path | None) -> bool:
    """Whether ``path`` is one of the files whose contents a `write_failed` message describes
    (``results.json``, a scores CSV, the journal, the claim), which nothing may rewrite after
    that message."""
    return path is not None and _is_results_file(path.name)


_write_failed = write_failed


# ---------------------------------------------------------------------- CSV files
def scores_csv_name(name: str, primary: bool) -> str:
    """``scores.csv`` for the primary matrix, ``scores_<name>.csv`` for the others."""
    return SCORES_FILE if primary else f"scores_{name}.csv"


def _scores_csv(task_names: list[str], baseline: list[Any], scores: list[list[Any]]) -> str:
    """``stage,<task names>``; a ``baseline`` row; one row per stage (every cell through
    `continual_eval._csv.csv_cell`: empty for null, names that look like formulas
    neutralised)."""
    header = csv_text(["stage", *task_names], [])
    # the cells are numbers or null: written in one pass of the JSON encoder (each float in its
    # shortest round-trip form, null as an empty field), not cell by cell
    rows = [baseline, *scores]
    body = _ENCODER.encode(rows)[2:-2].replace(b"null", b"").split(b"],[")
    labels = ["baseline", *map(str, range(len(scores)))]
    return header + "".join(
        f"{label},{row.decode()}\n" for label, row in zip(labels, body, strict=True)
    )


def _csv_files(document: Document) -> dict[str, str]:
    """File name -> CSV text of every matrix (the primary as ``scores.csv``)."""
    return {
        scores_csv_name(name, k == 0): _scores_csv(document.task_names, m.baseline, m.scores)
        for k, (name, m) in enumerate(document.matrices.items())
    }


def write_scores_csv(
    path: str | os.PathLike[str], document: Document | Mapping[str, Any], name: str | None = None
) -> Path:
    """Write the CSV of the matrix ``name`` (default: the primary one) of ``document`` (a
    `Document` or its ``dict``) atomically."""
    path = Path(path)
    if isinstance(document, Document):
        task_names = document.task_names
        matrix = document.matrices[name or document.primary_name]
        baseline, scores = matrix.baseline, matrix.scores
    else:
        task_names = list(document["task_names"])
        section = document["matrices"][name or next(iter(document["matrices"]))]
        baseline, scores = section["baseline"], section["scores"]
    text = _scores_csv(task_names, baseline, scores)
    _write_bytes(path, text.encode("utf-8"), durable=False)
    return path


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _csv_bytes(document: Document) -> dict[str, bytes]:
    return {name: text.encode("utf-8") for name, text in _csv_files(document).items()}


def _file_records(csv_files: Mapping[str, bytes], stages: int) -> dict[str, FileRecord]:
    return {
        name: FileRecord(sha256=_sha256(data), stages=stages) for name, data in csv_files.items()
    }


def file_records(document: Document) -> dict[str, FileRecord]:
    """The ``files`` entry of ``document``: the SHA-256 and stage count of every CSV file
    `commit_results` writes with it (the CSV text depends on the document alone, so
    ``ContinualResults.to_dict()`` holds the same entry as the ``results.json`` written)."""
    return _file_records(_csv_bytes(document), document.stages_completed)


# ---------------------------------------------------------------------- writing a stage
def commit_results(dirpath: str | os.PathLike[str], document: Document) -> Path:
    """Write the CSV files and then ``results.json`` (naming each CSV's SHA-256: the commit
    record) into ``dirpath``, each atomically; returns the JSON path. With every task trained the
    run is complete and its claim of the directory is released (`release_claim`; a
    document without tasks, an online run's, is released by its writer). A ``document`` without
    an ``online`` section keeps the one of the ``results.json`` it replaces when that file is of
    the same run (see the module docstring).

    Raises `ResultsWriteError` (one line: the file, what is on disk, how to resume) when a
    file cannot be written; the files already on disk stay complete.
    """
    return prepare_commit(dirpath, document)()


def prepare_commit(dirpath: str | os.PathLike[str], document: Document) -> Callable[[], Path]:
    """`commit_results` in two parts: the bytes of every file are made now (and the ``online``
    section on disk read), the returned function writes them (the files, fsync, rename, the
    claim's release) and may run on another thread, provided no other write of ``dirpath`` runs
    in between."""
    dirpath = Path(dirpath)
    checked = document.online is None  # its online section: none, or one read and checked
    if document.online is None and document.run_id is not None:
        kept = _online_on_disk(dirpath, document.run_id)
        if kept is not None:
            document = msgspec.structs.replace(document, online=kept)
    csv_files = _csv_bytes(document)
    files = _file_records(csv_files, document.stages_completed)
    stages = document.stages_completed
    data = msgspec.json.format(_ENCODER.encode(msgspec.structs.replace(document, files=files)))
    release = stages == document.num_tasks and document.num_tasks and document.run_id is not None
    run_id = document.run_id

    def commit() -> Path:
        path = dirpath
        try:
            for name, csv_data in csv_files.items():
                path = dirpath / name
                # one fsync per stage: results.json, the commit record naming each CSV's hash, is
                # the durable one; a CSV lost to a power cut is detected and rewritten on resume
                _write_bytes(path, csv_data, durable=False)
            path = dirpath / RESULTS_FILE
            _write_bytes(path, data + b"\n", durable=True)
        except OSError as err:
            raise _write_failed(path, err, stages) from None
        if checked:
            _remember_written(path, run_id, document.online)
        else:  # a section given by the caller: read back (and checked) at the next write
            _WRITTEN.pop(os.path.abspath(path), None)
        if release and run_id is not None:
            release_claim(dirpath, run_id)
        return path

    return commit


class _OnlinePart(msgspec.Struct):
    """What `commit_results` reads of the ``results.json`` it replaces."""

    run_id: Any = None
    online: OnlineSection | None = None


#: results.json path -> (its stat signature, run id, online section) as this process last wrote
#: it: the file unchanged since, its ``online`` section is known without reading it again (at
#: T = 1000 with class-incremental counts the file is ~160 MB, read back at every rebuild)
_WRITTEN: dict[str, tuple[tuple[int, ...], Any, OnlineSection | None]] = {}


def _signature(path: Path) -> tuple[int, ...]:
    info = os.stat(path)
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _remember_written(path: Path, run_id: Any, online: OnlineSection | None) -> None:
    """Note that ``path`` was just written (by this process) with ``online``."""
    try:
        _WRITTEN[os.path.abspath(path)] = (_signature(path), run_id, online)
    except OSError:
        _WRITTEN.pop(os.path.abspath(path), None)


def _online_on_disk(dirpath: Path, run_id: str) -> OnlineSection | None:
    """The ``online`` section of ``dirpath/results.json`` when that file is of the run
    ``run_id`` and its section is valid; else ``None``. Not read again when the file is the one
    this process last wrote there (same device, inode, size, mtime and ctime): the section
    written then."""
    path = dirpath / RESULTS_FILE
    known = _WRITTEN.get(os.path.abspath(path))
    if known is not None:
        try:
            same = _signature(path) == known[0]
        except OSError:
            same = False
        if same:
            return known[2] if known[1] == run_id else None
        _WRITTEN.pop(os.path.abspath(path), None)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
        part = msgspec.json.decode(data, type=_OnlinePart)
    except (OSError, msgspec.DecodeError, RecursionError):
        return None
    if part.run_id != run_id or part.online is None:
        return None
    try:
        return check_online_section(part.online, path)
    except InvalidResultsError:
        return None


# ---------------------------------------------------------------------- reading back
def read_document(path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES) -> Document:
    """Read and validate a ``results.json`` (or the directory holding one).

    Refuses ([`InvalidResultsError`][continual_eval.results.InvalidResultsError], naming the file
    and the field) anything but a regular file of at most ``max_bytes`` bytes of UTF-8 JSON
    following the schema (`continual_eval.results.schema`); ``FileNotFoundError`` without one.
    """
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.exists():
        raise FileNotFoundError(f"no {RESULTS_FILE} at {path}")
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise InvalidResultsError(path, "", "not a regular file")
    if info.st_size > max_bytes:
        raise InvalidResultsError(
            path, "", f"file of {info.st_size} bytes exceeds the limit of {max_bytes} bytes"
        )
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew since stat
        raise InvalidResultsError(path, "", f"file exceeds the limit of {max_bytes} bytes")
    return decode_document(data, path)


# ---------------------------------------------------------------------- the stage journal
#: how a stage journal newer than ``results.json`` is replayed into results: set by
#: `continual_eval._stage_journal`, which replays it through the run record; that record sits
#: above this package (it builds results), so this package cannot import it
_journal_replay: Callable[[Path, Document | None], Any] | None = None


def set_journal_replay(replay: Callable[[Path, Document | None], Any]) -> None:
    """Register ``replay(journal_path, document)``: the results of the journal at
    ``journal_path`` when it holds more stages than ``document`` (the ``results.json`` beside it,
    ``None`` when there is none), else ``None``."""
    global _journal_replay
    _journal_replay = replay


def replay_newer_journal(dirpath: str | os.PathLike[str], document: Document | None) -> Any:
    """The results of the stage journal in ``dirpath`` when it holds stages that ``document``
    (its ``results.json``) does not yet, else ``None``."""
    path = Path(dirpath) / JOURNAL_FILE
    if not path.is_file():
        return None
    replay = _journal_replay
    if replay is None:  # a process that never imported the callback (a reader, the report CLI)
        import importlib

        replay = importlib.import_module("continual_eval._stage_journal").replay_if_newer
        set_journal_replay(replay)
    return replay(path, document)


class _Header(msgspec.Struct):
    """What a directory check reads of a ``results.json`` (the rest is skipped unparsed)."""

    run_id: Any = None
    stages_completed: Any = None
    files: Any = None


def _read_header(path: Path) -> _Header:
    with open(path, "rb") as fh:
        data = fh.read(MAX_FILE_BYTES + 1)
    return msgspec.json.decode(data, type=_Header)


def read_run_id(dirpath: str | os.PathLike[str]) -> tuple[bool, str | None, int | None]:
    """``(exists, run_id, stages_completed)`` of the ``results.json`` in ``dirpath``; a file that
    cannot be read as a results document gives ``(True, None, None)``."""
    path = Path(dirpath) / RESULTS_FILE
    if not path.is_file():
        return False, None, None
    try:
        header = _read_header(path)
    except (OSError, msgspec.DecodeError, RecursionError):
        return True, None, None
    run_id, stages = header.run_id, header.stages_completed
    valid = isinstance(stages, int) and not isinstance(stages, bool)
    return True, run_id if isinstance(run_id, str) else None, stages if valid else None


def _journal_run_id(path: Path) -> tuple[bool, str | None, int | None]:
    """``(exists, run_id, stages_recorded)`` from the stage journal alone (a run killed before
    its first ``results.json``: its baseline, perhaps stages, are only in ``stages.jsonl``): the
    header line's ``run_id`` and the stage lines after the baseline line; nothing journaled
    gives ``(False, None, None)``."""
    try:
        with path.open("rb") as journal:
            first = journal.readline(MAX_FILE_BYTES)
            lines = sum(1 for line in journal if line.endswith(b"\n"))
    except OSError:
        return False, None, None
    if not first.endswith(b"\n"):
        return False, None, None  # not even a whole header line: nothing recorded
    try:
        header = msgspec.json.decode(first)
    except msgspec.DecodeError:
        return True, None, None
    record = header.get("record") if isinstance(header, dict) else None  # `_stage_journal`'s
    run_id = record.get("run_id") if isinstance(record, dict) else None
    return True, run_id if isinstance(run_id, str) else None, max(lines - 1, 0)


def check_results_files(dirpath: str | os.PathLike[str]) -> str | None:
    """``None`` when ``results.json`` and the CSV files in ``dirpath`` belong together, else why
    not (a write interrupted between them, or a file edited by hand); ``results.json`` is
    authoritative."""
    dirpath = Path(dirpath)
    json_path = dirpath / RESULTS_FILE
    try:
        files = msgspec.convert(_read_header(json_path).files or {}, dict[str, FileRecord])
    except (msgspec.DecodeError, RecursionError) as err:
        return f"{json_path} is not a results document ({printable(str(err), 160)})"
    for name, recorded in files.items():
        if Path(name).name != name:
            return f"{json_path} names {printable(name)!r}, not a file of the directory"
        csv_path = dirpath / name
        if not csv_path.is_file():
            return f"{csv_path} is missing"
        if _sha256(csv_path.read_bytes()) != recorded.sha256:
            return (
                f"{csv_path} is not the file {json_path} was written with (it records "
                f"{recorded.stages} stages); results.json is authoritative"
            )
    return None


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - another user's live process
        return True
    except OverflowError:
        return False
    return True


def _is_results_file(name: str) -> bool:
    """``results.json``, ``scores.csv``, a ``scores_<name>.csv``, the journal or the claim."""
    return name in (RESULTS_FILE, SCORES_FILE, CLAIM_FILE, JOURNAL_FILE) or (
        name.startswith("scores_") and name.endswith(".csv")
    )


def remove_stale_temporaries(dirpath: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files (``.NAME.PID.tmp``) that writers killed mid-write left in
    ``dirpath``; temporaries of live processes are kept. Returns the removed paths."""
    dirpath = Path(dirpath)
    removed: list[Path] = []
    if not dirpath.is_dir():
        return removed
    for path in dirpath.iterdir():
        match = _TEMPORARY.match(path.name)
        if match is None or not _is_results_file(match["name"]):
            continue
        if not _pid_alive(int(match["pid"])):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


# ---------------------------------------------------------------------- choosing the directory
def default_results_dir(trainer: Any, dirpath: str | os.PathLike[str] | None = None) -> Path:
    """Where a run's ``results.json`` goes; every run gets its own directory.

    ``dirpath`` when given; else, by the Trainer's first logger: its ``log_dir`` (TensorBoard,
    CSV: already one ``version_N`` per run), the W&B run's own files directory
    (``experiment.dir``, uploaded with the run), or ``default_root_dir/continual_eval/<run id>``
    for other loggers with a run id (MLflow); without a logger a new
    ``default_root_dir/continual_eval/version_N``, numbered as Lightning numbers its logs.
    """
    if dirpath is not None:
        return Path(dirpath)
    root = Path(trainer.default_root_dir)
    for logger in trainer.loggers[:1]:
        log_dir = getattr(logger, "log_dir", None)
        if log_dir:
            return Path(log_dir)
        if type(logger).__name__ == "WandbLogger":
            return Path(logger.experiment.dir)
        version = getattr(logger, "version", None)
        if version is not None and str(version):
            return root / "continual_eval" / str(version)
        save_dir = getattr(logger, "save_dir", None)
        if save_dir:
            return new_version_dir(Path(save_dir) / "continual_eval")
    return new_version_dir(root / "continual_eval")


def _open_wandb_run_note(trainer: Any, results_dir: Path) -> str:
    """When ``results_dir`` is the files directory of the W&B run of the Trainer's first logger:
    that run (id, name) and how to start a new one (a ``WandbLogger`` created while a run is open
    in the process reuses it, so a second fit finds the first one's results there); else
    ``""``."""
    for logger in list(getattr(trainer, "loggers", None) or [])[:1]:
        run = getattr(logger, "_experiment", None)
        if type(logger).__name__ != "WandbLogger" or run is None:
            return ""
        try:
            same = Path(run.dir).resolve() == Path(results_dir).resolve()
            run_id, name = str(run.id), run.name
        except Exception:  # a run without a files directory (disabled, finished)
            return ""
        if same:
            named = f" (name {printable(str(name))!r})" if name else ""
            return (
                f". {results_dir} is the files directory of the W&B run {printable(run_id)!r}"
                f"{named}, still open in this process: a WandbLogger created "
                "while a W&B run is open reuses that run (Lightning warns so). Call wandb.finish() "
                "after a run's fit: the next WandbLogger then starts a new W&B run, with a "
                "directory of its own"
            )
    return ""


def new_version_dir(parent: str | os.PathLike[str]) -> Path:
    """Create and return ``parent/version_N`` with ``N`` one more than the highest existing
    (0 for the first); the directory is claimed with an exclusive ``mkdir``, so two runs starting
    together never share one."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    existing = [
        int(p.name.removeprefix("version_"))
        for p in parent.iterdir()
        if p.is_dir() and p.name.startswith("version_") and p.name[8:].isdigit()
    ]
    version = max(existing, default=-1) + 1
    while True:
        path = parent / f"version_{version}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            version += 1


def choose_results_dir(
    trainer: Any,
    dirpath: str | os.PathLike[str] | None,
    *,
    recorded: str | None,
    run_id: str,
) -> Path:
    """The directory of this run (rank 0, at its first fit): the ``recorded`` one of a resumed
    run (if it still holds this run), else ``dirpath`` or the default directory of the Trainer's
    logger (`default_results_dir`)."""
    if dirpath is None and recorded is not None and Path(recorded).is_dir():
        exists, other_id, _ = read_run_id(recorded)
        if not exists or other_id == run_id:
            return Path(recorded)
    return default_results_dir(trainer, dirpath)


# ---------------------------------------------------------------------- claiming it
class _Claim(msgspec.Struct):
    """The claim file: which run uses the directory, in which process, since when."""

    run_id: str
    pid: int
    host: str
    started: str


def _own_claim(run_id: str) -> bytes:
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return _ENCODER.encode(_Claim(run_id, os.getpid(), socket.gethostname(), started)) + b"\n"


@contextlib.contextmanager
def _directory_lock(dirpath: Path) -> Iterator[None]:
    """An exclusive ``flock`` of the directory while a claim is read and replaced (processes of
    one host; the claim file's ``O_EXCL`` creation is what holds across hosts)."""
    fd = None
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fd = os.open(dirpath, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _read_claim(path: Path) -> _Claim | bool | None:
    """The claim in ``path``; ``False`` when there is none (any more); ``None`` when it cannot be
    read as a claim."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=_Claim)
    except FileNotFoundError:
        return False
    except (OSError, msgspec.DecodeError):
        return None


#: the claims this process holds, given back when it exits (a killed process leaves its claim,
#: which the next run on the directory takes over: it names a dead pid)
_HELD: set[tuple[Path, str]] = set()


def _give_back_held() -> None:
    for dirpath, run_id in list(_HELD):
        with contextlib.suppress(OSError):
            release_claim(dirpath, run_id)


atexit.register(_give_back_held)


def _take(path: Path, run_id: str) -> None:
    _write_bytes(path, _own_claim(run_id), durable=True)
    _HELD.add((path.parent, run_id))


def _try_claim(path: Path, run_id: str) -> str | None:
    """One attempt under the directory lock: ``None`` when this run now holds the claim, else
    why it cannot (``""``: the claim vanished meanwhile, try again)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        pass
    else:
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(_own_claim(run_id))
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:  # a full disk: no half-written claim left behind
            path.unlink(missing_ok=True)
            raise
        _HELD.add((path.parent, run_id))
        return None
    holder = _read_claim(path)
    if holder is False:
        return ""
    if holder is None:
        return f"{path} is there but cannot be read as a claim"
    assert isinstance(holder, _Claim)
    same_host = holder.host == socket.gethostname()
    if holder.run_id == run_id or (same_host and holder.pid == os.getpid()):
        _take(path, run_id)  # this run resumed, or an earlier run of this process
        return None
    if same_host and not _pid_alive(holder.pid):
        _take(path, run_id)
        warnings.warn(
            f"continual-eval: took over {path}: run {printable(holder.run_id)} (pid {holder.pid} "
            f"on this host, since {printable(holder.started)}) is no longer running",
            stacklevel=4,
        )
        return None
    where = "this host" if same_host else f"host {printable(holder.host)}"
    return (
        f"{path.parent} is in use by run {printable(holder.run_id)} (pid {holder.pid} on "
        f"{where}, since {printable(holder.started)})"
    )


def claim_results_dir(
    dirpath: str | os.PathLike[str], run_id: str, *, restored: bool, overwrite: bool
) -> str | None:
    """Claim ``dirpath`` for the run ``run_id`` before it trains; ``None`` on success, else why
    not (nothing is then changed).

    The claim is an exclusive file (``O_EXCL``) naming the run, its pid, host and start time,
    removed when the run completes (`commit_results`) or its process exits. A claim of this
    run (a resume) or of an earlier run of this process is taken; so is the claim of a dead
    process on this host, with a warning; a live run's claim, or one of another host, never is.
    A ``results.json`` of another run is refused unless ``overwrite`` (``restored``: this run was
    loaded from a checkpoint, so a ``results.json`` without a ``run_id`` may be its own).
    Temporaries of killed writers are removed.
    """
    dirpath = Path(dirpath)
    path = dirpath / CLAIM_FILE
    try:
        dirpath.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise
    except OSError as err:
        raise _claim_failed(dirpath, err) from None
    with _directory_lock(dirpath):
        problem: str | None = ""
        for _ in range(5):
            try:
                problem = _try_claim(path, run_id)
            except FileExistsError:
                raise
            except OSError as err:  # a full disk: nothing written (no half claim is left)
                raise _claim_failed(path, err) from None
            if problem != "":
                break
        if problem:
            return (
                f"{problem}; two runs never share a results directory: give this run its own "
                f"(dirpath=...), or wait for that run to end (delete {path.name} only if no run "
                "is using the directory). Nothing was trained or written"
            )
        exists, other_id, stages = read_run_id(dirpath)
        if not exists:  # a run killed before its first results.json: its journal is its record
            exists, other_id, stages = _journal_run_id(dirpath / JOURNAL_FILE)
        if exists and not overwrite and not (other_id == run_id or (other_id is None and restored)):
            _release(path, run_id)
            held = RESULTS_FILE if (dirpath / RESULTS_FILE).is_file() else JOURNAL_FILE
            return (
                f"{dirpath / held} holds the results of another run (run_id "
                f"{other_id!r}, {stages if stages is not None else '?'} stages; this run is "
                f"{run_id!r}). A run never overwrites another run's results: give this run its "
                "own directory (dirpath=..., or a logger with a new version), resume the other "
                "run from its checkpoint, or pass overwrite=True to replace them. Nothing was "
                "trained or written"
            )
    remove_stale_temporaries(dirpath)
    return None


def _claim_failed(path: Path, err: OSError) -> ResultsWriteError:
    """The one-line error of a claim (or its directory) that cannot be written at fit start."""
    return ResultsWriteError(
        err.errno,
        f"could not write {path} ({err.strerror or err}), the claim of the results directory "
        "made at fit start; nothing was trained or written. Free the disk (or fix the "
        "directory), then start the run again (a resumed run: from the same checkpoint)",
    )


def _release(path: Path, run_id: str) -> None:
    _HELD.discard((path.parent, run_id))
    holder = _read_claim(path)
    if isinstance(holder, _Claim) and holder.run_id == run_id and holder.pid == os.getpid():
        path.unlink(missing_ok=True)


def release_claim(dirpath: str | os.PathLike[str], run_id: str) -> None:
    """Remove the claim of ``dirpath`` if the run ``run_id`` holds it."""
    dirpath = Path(dirpath)
    if (dirpath / CLAIM_FILE).exists():
        with _directory_lock(dirpath):
            _release(dirpath / CLAIM_FILE, run_id)


def claim_or_refuse(
    trainer: Any,
    results_dir: Path | None,
    *,
    run_id: str,
    restored: bool,
    overwrite: bool,
    owner: str = "ContinualEvalCallback",
) -> None:
    """On every rank of ``trainer``, before anything is trained or written: rank 0 claims its
    ``results_dir`` (`claim_results_dir`); every rank raises ``FileExistsError`` with rank
    0's reason (named after ``owner``, the claiming callback) when it cannot."""
    problem = None
    failed: tuple[int | None, str] | None = None  # a claim that could not be written
    if trainer.is_global_zero and results_dir is not None:
        try:
            problem = claim_results_dir(results_dir, run_id, restored=restored, overwrite=overwrite)
        except ResultsWriteError as err:  # every rank raises it (none waits for rank 0)
            failed = (err.errno, f"{owner}: {err.strerror}")
        if problem is not None:
            problem = f"{owner}: {problem}{_open_wandb_run_note(trainer, results_dir)}"
    if trainer.world_size > 1:
        problem, failed = trainer.strategy.broadcast((problem, failed), src=0)
    if failed is not None:
        raise ResultsWriteError(*failed)
    if problem is not None:
        raise FileExistsError(problem)

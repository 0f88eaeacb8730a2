"""The results directory of a run: which one it writes to, and claiming it before any write.

A run writes ``results.json``/``scores.csv`` to a directory of its own (see
:func:`~continual_eval.results.default_results_dir`); a resumed run keeps the one it wrote to
before. A directory holding another run's ``results.json`` (another ``run_id``) is refused on
every rank before anything is trained or written, unless ``overwrite=True``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from lightning.pytorch.utilities import rank_zero_info

from continual_eval.results import (
    RESULTS_FILE,
    default_results_dir,
    read_run_id,
    remove_stale_temporaries,
)

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

__all__ = ["choose_results_dir", "open_results_dir", "refuse_foreign_results"]


def choose_results_dir(
    trainer: Trainer,
    dirpath: str | os.PathLike[str] | None,
    *,
    recorded: str | None,
    run_id: str,
) -> Path:
    """The directory of this run (rank 0, at its first fit): the ``recorded`` one of a resumed
    run, else ``dirpath`` or the default directory of the Trainer's logger."""
    return _resumed_results_dir(dirpath, recorded, run_id) or default_results_dir(trainer, dirpath)


def _resumed_results_dir(
    dirpath: str | os.PathLike[str] | None, recorded: str | None, run_id: str
) -> Path | None:
    """A resumed run keeps writing where it wrote before (without ``dirpath``, a new process
    would otherwise pick a new directory), if that directory still holds this run."""
    if dirpath is not None or recorded is None or not Path(recorded).is_dir():
        return None
    exists, other_id, _ = read_run_id(recorded)
    return Path(recorded) if not exists or other_id == run_id else None


def refuse_foreign_results(
    trainer: Trainer,
    results_dir: Path | None,
    *,
    run_id: str,
    restored: bool,
    overwrite: bool,
) -> None:
    """On every rank, before anything is written: raise ``FileExistsError`` when rank 0's
    ``results_dir`` holds another run's results (unless ``overwrite``). ``restored``: this run
    was loaded from a checkpoint (a ``results.json`` without a ``run_id`` may be its own)."""
    problem = None
    if trainer.is_global_zero and results_dir is not None:
        exists, other_id, stages = read_run_id(results_dir)
        ours = other_id == run_id or (other_id is None and restored)
        if exists and not ours and not overwrite:
            problem = (
                f"ContinualEvalCallback: {results_dir / RESULTS_FILE} holds the results "
                f"of another run (run_id {other_id!r}, {stages if stages is not None else '?'} "
                f"stages; this run is {run_id!r}). A run never overwrites another run's "
                "results: give this run its own directory (dirpath=..., or a logger with a new "
                "version), resume the other run from its checkpoint, or pass overwrite=True "
                "to replace them. Nothing was trained or written"
            )
    if trainer.world_size > 1:
        problem = trainer.strategy.broadcast(problem, src=0)
    if problem is not None:
        raise FileExistsError(problem)


def open_results_dir(results_dir: Path, *, run_id: str, verbose: bool) -> None:
    """Rank 0, once the directory is claimed: say where the files go (``verbose``) and remove
    the temporaries of writers killed mid-write."""
    if verbose:
        rank_zero_info(
            f"[continual-eval] run {run_id}: results.json and scores.csv go to {results_dir}"
        )
    remove_stale_temporaries(results_dir)

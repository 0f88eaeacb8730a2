"""Hand-over of a callback's state from spawned processes (``ddp_spawn``) to the one that made it.

Under a spawned strategy the hooks run in child processes, on a pickled copy of the callback: what
they record never reaches the callback object of the launching process, whose ``scores`` or
``results()`` the user then reads. So rank 0 of the children publishes the state to a file after
every write and at teardown, and the launching process (the *owner*, the one that created the
callback) loads it lazily, when it next reads the callback and the file changed.

The file is ``<tempdir>/continual-eval-<owner pid>-<run id>.pt``, replaced atomically (a reader
sees a complete version) and removed when the owner exits.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from continual_eval.results.files import replace_atomically

__all__ = ["Published", "SpawnHandover"]

T = TypeVar("T")


@dataclass(frozen=True)
class Published:
    """What a spawned rank 0 handed over: the callback's ``state_dict()`` (without RNG states),
    its results directory and whether that directory was claimed."""

    state: dict[str, Any]
    results_dir: Path | None
    dir_checked: bool


class SpawnHandover:
    """The hand-over file of one callback, made in its owner process and pickled with it."""

    def __init__(self, run_id: str) -> None:
        self.owner_pid = os.getpid()
        self.path = os.path.join(
            tempfile.gettempdir(), f"continual-eval-{self.owner_pid}-{run_id}.pt"
        )
        # (inode, mtime, size) of the version the owner loaded last
        self._seen: tuple[int, int, int] | None = None
        atexit.register(_remove_file, self.path)

    def in_owner(self) -> bool:
        """Whether this is the process that created the callback (no hand-over needed)."""
        return os.getpid() == self.owner_pid

    def own_copy(self, value: T) -> T:
        """``value`` in the owner; in a spawned process a deep copy of it: what was pickled over
        arrived in shared memory, and every rank would write into the same storage."""
        return value if self.in_owner() else copy.deepcopy(value)

    def publish(
        self, state: dict[str, Any], *, results_dir: Path | None, dir_checked: bool
    ) -> None:
        """Replace the file with this version of the state (called by a spawned rank 0)."""
        published = {
            "state": state,
            "results_dir": None if results_dir is None else str(results_dir),
            "dir_checked": dir_checked,
        }
        replace_atomically(self.path, lambda tmp: torch.save(published, tmp), durable=False)

    def receive(self) -> Published | None:
        """In the owner: the published version if the file changed since the last call, else
        ``None`` (also in any other process)."""
        if not self.in_owner():
            return None
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return None
        seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if seen == self._seen:
            return None
        self._seen = seen
        published = torch.load(self.path, map_location="cpu", weights_only=False)
        return Published(
            state=published["state"],
            results_dir=(
                None if published["results_dir"] is None else Path(published["results_dir"])
            ),
            dir_checked=bool(published["dir_checked"]),
        )


def _remove_file(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)

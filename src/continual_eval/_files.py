"""Replacing a file so that a reader sees the old or the new version, never a partial one."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["replace_atomically"]


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

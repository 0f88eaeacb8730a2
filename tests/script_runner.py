"""Run a test's standalone script (DDP launches, kill -9 scenarios) in a fresh Python process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
#: variables a Lightning launch sets in its children; a script must start without them
LAUNCH_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_script(script: Path, *args: object, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS...`` with the package sources and the script's folder importable;
    returns the finished process (stdout/stderr captured as text)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC), str(Path(script).parent), env.get("PYTHONPATH", "")]
    )
    for key in LAUNCH_VARIABLES:
        env.pop(key, None)
    return subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )

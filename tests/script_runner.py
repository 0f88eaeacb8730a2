"""Run a test's standalone script (DDP launches, kill -9 scenarios) in a fresh Python process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
#: variables a Lightning launch sets in its children; a script must start without them
LAUNCH_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_script(script: Path, *args: object, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS...`` with the package sources and the script's folder importable;
    returns the finished process (stdout/stderr captured as text)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC), str(TESTS), str(Path(script).parent), env.get("PYTHONPATH", "")]
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


#: what a spawned child prints when torch's gloo threads are still running at interpreter exit;
#: the child then dies with SIGABRT after its work (a torch teardown race, not this package's)
TEARDOWN_ABORT = "terminate called without an active exception"


def run_spawn_script(
    script: Path, base: Path, *args: object, timeout: float = 300
) -> tuple[subprocess.CompletedProcess, Path]:
    """:func:`run_script` with ``OUT`` = ``base/try0`` as the first argument (then ``args``);
    when a spawned child hit :data:`TEARDOWN_ABORT`, once more in a fresh ``base/try1``. Returns
    the process and the output directory it wrote."""
    out = base / "try0"
    proc = run_script(script, out, *args, timeout=timeout)
    if proc.returncode != 0 and TEARDOWN_ABORT in proc.stderr:
        out = base / "try1"
        proc = run_script(script, out, *args, timeout=timeout)
    return proc, out

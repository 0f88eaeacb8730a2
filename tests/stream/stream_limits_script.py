"""Standalone run for test_stream_limits.py: the stream command under an address-space limit.

Usage: python stream_limits_script.py OUT_DIR. Caps this interpreter's address space
(``RLIMIT_AS``) at what it maps after its imports plus 256 MiB, then runs ``continual-eval
stream`` on ``/dev/zero`` and on a FIFO streaming one 300 MB line, printing ``rc=2 limit named``
for each run that exits 2 naming the line cap. A reader that grows with its input dies here
(MemoryError), so the test sees a failed run.
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import sys
import threading
from pathlib import Path

from continual_eval.stream.cli import main

HEADROOM = 256 * 2**20
LINE_BYTES = 300 * 10**6


def mapped_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def run(argv: list[str]) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(argv)
    text = err.getvalue()
    ok = rc == 2 and "line longer than" in text and "--max-line-bytes" in text
    print("rc=2 limit named" if ok else f"rc={rc} {text[:500]!r}", flush=True)


def stream_one_line(fifo: Path) -> None:
    """Write one 300 MB line into ``fifo`` until the reader closes its end."""
    chunk = b"x" * 2**20
    try:
        with open(fifo, "wb") as fh:
            fh.write(b'{"step": 0, "reward": 0.5, "regime_id": "')
            for _ in range(LINE_BYTES // len(chunk)):
                fh.write(chunk)
            fh.write(b'"}\n')
    except BrokenPipeError:
        pass


def main_script(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fifo = out / "line.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=stream_one_line, args=(fifo,), daemon=True)
    writer.start()
    limit = mapped_bytes() + HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    run(["/dev/zero"])
    run([str(fifo)])
    writer.join(timeout=60)
    print("writer done" if not writer.is_alive() else "writer still running", flush=True)


if __name__ == "__main__":
    main_script(Path(sys.argv[1]))

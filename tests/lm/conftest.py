"""Make lm_helpers.py and the scripts beside it importable under --import-mode=importlib."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


import pytest


@pytest.fixture(scope="session")
def lm_callback_ddp_run(tmp_path_factory):
    """The output folder of one 2-process run of lm_callback_ddp_script.py (shared by the tests
    that read it: one launch)."""
    from pathlib import Path

    from script_runner import run_script

    out = tmp_path_factory.mktemp("lm_callback_ddp")
    proc = run_script(Path(__file__).parent / "lm_callback_ddp_script.py", out, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out

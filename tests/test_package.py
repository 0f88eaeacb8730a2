"""The package's import surface: public names resolve, and importing it loads no Lightning."""

from __future__ import annotations

import subprocess
import sys

import continual_eval


def test_public_names_resolve():
    for name in continual_eval.__all__:
        assert getattr(continual_eval, name) is not None, name
    assert set(continual_eval.__all__) <= set(dir(continual_eval))


def test_import_and_cli_help_load_no_lightning():
    code = (
        "import sys, continual_eval, continual_eval.stream, continual_eval.cli\n"
        "heavy = sorted(m for m in ('lightning', 'torch', 'torchmetrics') if m in sys.modules)\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "lightning" not in out.stdout and "torchmetrics" not in out.stdout, out.stdout

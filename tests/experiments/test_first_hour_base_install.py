"""``continual-eval fit`` on a base install (no extras): the real command in a subprocess where
tensorboard, matplotlib and scikit-learn cannot be imported (a ``sitecustomize`` on PYTHONPATH
installs a meta-path finder that refuses them, as an environment without the packages would)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
EXTRA = 'pip install "continual-eval[experiments]"'

SITECUSTOMIZE = """
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys

_BLOCKED = frozenset(os.environ["CONTINUAL_EVAL_TEST_BLOCKED"].split(","))
# distribution names of the blocked packages (what importlib.metadata is asked about)
_DISTRIBUTIONS = {"sklearn": "scikit-learn", "tensorboardX": "tensorboardx"}
_HIDDEN = {_DISTRIBUTIONS.get(m, m).lower().replace("_", "-") for m in _BLOCKED}


class _NotInstalled(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    \"\"\"Importing a blocked top-level package raises ModuleNotFoundError, as without it.

    ``find_spec`` answers with a spec that has no origin (probes such as torch's
    ``importlib.util.find_spec`` then skip the package); loading it raises.
    \"\"\"

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _BLOCKED:
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {spec.name!r}", name=spec.name)

    def exec_module(self, module):
        raise AssertionError("unreachable: create_module raises")


_from_name = importlib.metadata.Distribution.from_name.__func__


def _hidden_from_name(cls, name):
    # version checks (Lightning's and torchmetrics' RequirementCache) see no distribution either
    if name.lower().replace("_", "-") in _HIDDEN:
        raise importlib.metadata.PackageNotFoundError(name)
    return _from_name(cls, name)


importlib.metadata.Distribution.from_name = classmethod(_hidden_from_name)
sys.meta_path.insert(0, _NotInstalled())
"""


def run_without(
    blocked: set[str], args: list[str], cwd: Path, site: Path
) -> subprocess.CompletedProcess[str]:
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "CONTINUAL_EVAL_TEST_BLOCKED": ",".join(sorted(blocked)),
        "WANDB_MODE": "offline",
    }
    script = Path(sys.executable).with_name("continual-eval")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "continual_eval.cli"]
    return subprocess.run(
        [*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_sitecustomize_really_blocks(tmp_path: Path) -> None:
    """The harness itself: the blocked packages (installed here) do not import."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "CONTINUAL_EVAL_TEST_BLOCKED": "tensorboard,matplotlib",
    }
    code = (
        "import importlib.metadata, sys\n"
        "try:\n    importlib.metadata.version('tensorboard')\n"
        "except importlib.metadata.PackageNotFoundError:\n    pass\nelse:\n    sys.exit(1)\n"
        "try:\n    import matplotlib.pyplot\nexcept ModuleNotFoundError:\n    sys.exit(7)"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert proc.returncode == 7


@pytest.mark.slow
def test_fit_logistic_on_a_base_install_falls_back_to_csv(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    proc = run_without(
        {"tensorboard", "tensorboardX", "matplotlib", "sklearn"},
        ["fit", "--config", str(CONFIGS / "logistic.yaml")],
        work,
        tmp_path / "site",
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Traceback" not in output
    notices = [ln for ln in output.splitlines() if "tensorboard is not installed" in ln]
    assert notices == [
        "[continual-eval] tensorboard is not installed: logging to CSV only (metrics.csv); "
        f"for TensorBoard files: {EXTRA}"
    ]
    assert "Starting from v1.9.0" not in output  # Lightning's own multi-line warning
    skipped = [ln for ln in output.splitlines() if "report skipped" in ln]
    assert len(skipped) == 1 and "matplotlib" in skipped[0] and EXTRA in skipped[0]
    run = work / "runs" / "logistic" / "version_0"
    results = json.loads((run / "results.json").read_text())
    assert results["stages_completed"] == 3 and results["metrics"]["acc"] > 0
    assert (run / "scores.csv").is_file()
    assert (run / "metrics.csv").is_file()
    assert not list(run.glob("events.out.tfevents.*"))
    # the report can be drawn later, as the line says
    assert f"continual-eval report {Path('runs/logistic/version_0')}" in skipped[0]


@pytest.mark.slow
def test_fit_digits_without_scikit_learn_names_the_extra(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    proc = run_without(
        {"sklearn"},
        ["fit", "--config", str(CONFIGS / "digits_naive.yaml")],
        work,
        tmp_path / "site",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"continual-eval fit: this run needs scikit-learn, which is not installed: {EXTRA}"
    )

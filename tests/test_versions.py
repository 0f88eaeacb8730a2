"""One version number, and the lowest-versions CI pass really testing the declared floors."""

from __future__ import annotations

import importlib.metadata
import os
import re
from pathlib import Path

import pytest

import continual_eval

ROOT = Path(__file__).resolve().parents[1]
LOWEST = ROOT / ".ci" / "lowest.txt"
PINNED = ("lightning", "torchmetrics")
pytestmark = pytest.mark.lightning  # checks the lowest-versions pass itself


def _pins() -> dict[str, str]:
    pins = {}
    for line in LOWEST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def _floors() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(ROOT / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    floors = {}
    for dep in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^]]*\])?\s*>=\s*([0-9][0-9.]*)", dep.strip())
        assert m, f"dependency {dep!r} is not of the form name>=floor"
        floors[m.group(1).lower()] = m.group(3)
    return floors


def _release(version: str) -> tuple[int, ...]:
    """(2, 4) for "2.4" and "2.4.0": a floor "2.4" is the release 2.4.0."""
    parts = [int(p) for p in re.match(r"[0-9.]*[0-9]", version).group().split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def test_installed_version_is_the_package_version():
    """pyproject.toml reads its version from ``continual_eval.__version__``: one number."""
    if not (ROOT / "pyproject.toml").is_file():  # pragma: no cover - installed without sources
        pytest.skip("no source tree")
    assert importlib.metadata.version("continual-eval") == continual_eval.__version__


def test_pyproject_declares_no_second_version():
    tomllib = pytest.importorskip("tomllib")
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    assert "version" not in project
    assert "version" in project["dynamic"]


def test_lowest_constraints_pin_the_declared_floors():
    """.ci/lowest.txt pins exactly the floors of pyproject.toml (no drift after a floor bump)."""
    pins, floors = _pins(), _floors()
    assert set(pins) == set(PINNED)
    for name in PINNED:
        assert _release(pins[name]) == _release(floors[name]), (name, pins[name], floors[name])


@pytest.mark.skipif(
    os.environ.get("CONTINUAL_EVAL_LOWEST") != "1", reason="only in the lowest-versions CI pass"
)
def test_lowest_pass_runs_the_floors():
    for name, version in _pins().items():
        assert importlib.metadata.version(name) == version, name

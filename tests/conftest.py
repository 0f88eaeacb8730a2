"""Shared test set-up: make the plain-loop references in tests/ importable, keep plots headless,
mark the tests that touch Lightning or torchmetrics behaviour ``lightning``, and leave out the
slow tests not marked ``ci`` unless pytest runs with ``--run-slow``."""

import ast
import functools
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
sys.path.insert(0, os.path.dirname(__file__))


def _share_the_cores_between_workers() -> None:
    """In a pytest-xdist worker (``-n``, set in pyproject.toml's addopts), give torch this
    worker's share of the cores: 2 workers each running 2 OpenMP threads on 2 cores spin on one
    another (tests of many small torch ops ran 5 to 15 times slower). Through the environment
    too, so the scripts a test starts (DDP ranks, kill -9 runs) inherit it. An
    ``OMP_NUM_THREADS`` set by the user is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1 or "OMP_NUM_THREADS" in os.environ:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


_share_the_cores_between_workers()

#: what the lowest-versions pass of .ci/run checks: Lightning, torchmetrics, and the modules of
#: this package built on them (a torchmetrics Metric, the callback, the evaluation engine, ...)
_VERSIONED = (
    "lightning",
    "torchmetrics",
    "continual_eval.callback",
    "continual_eval.evaluation",
    "continual_eval.experiments",
    "continual_eval.metric",
    "continual_eval.references",
    "continual_eval.stream.callback",
    "continual_eval.training",
)
_CALLBACK_TESTS = Path(__file__).resolve().parent / "callback"


def _versioned(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in _VERSIONED)


def _imported_modules(node: ast.AST) -> list[str]:
    """The modules an import statement reads (``from continual_eval import X``: X's module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom) or node.level or node.module is None:
        return []
    if node.module != "continual_eval":
        return [node.module]
    import continual_eval

    return [
        getattr(getattr(continual_eval, alias.name, None), "__module__", None) or node.module
        for alias in node.names
    ]


@functools.cache
def _touches_versioned_library(path: Path) -> bool:
    """Whether the file (a test module, or a source module whose docstring examples run as
    tests) imports, anywhere in it, Lightning, torchmetrics or a module of this package built on
    them, or is one of the callback tests (every one of them drives a Trainer)."""
    if path.is_relative_to(_CALLBACK_TESTS):
        return True
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False
    return any(_versioned(m) for node in ast.walk(tree) for m in _imported_modules(node))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow",
        action="store_true",
        help="run every test marked slow (by default only the slow tests also marked ci run: "
        "a plain `python -m pytest` is what CI runs and stays under its time budget)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _touches_versioned_library(Path(item.path).resolve()):
            item.add_marker(pytest.mark.lightning)
    if config.getoption("--run-slow"):
        return
    kept, left_out = [], []
    for item in items:
        # the marks, not item.keywords: those hold parametrize ids too (a case named "slow")
        slow = item.get_closest_marker("slow") and not item.get_closest_marker("ci")
        (left_out if slow else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept

"""Executed documentation: every python block in docs/stream.md followed by a text block is run
and its printed output compared with the text block; the example script prints the seed's table."""

from __future__ import annotations

import contextlib
import io
import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "stream.md"
PAIR = re.compile(r"```python\n(.*?)```\s*```text\n(.*?)```", re.DOTALL)

SEED_OUTPUT = """\
a        J = 0.8000   adapt = --   recover = --   forget = +0.3000   variance = 0.0000
b        J = 0.6100   adapt = 3   recover = 2   forget = --   variance = 0.0477
a_again  J = 0.5000   adapt = 1   recover = 1   forget = +0.3000   variance = 0.0000
"""


def doc_examples() -> list[tuple[str, str]]:
    return PAIR.findall(DOC.read_text(encoding="utf-8"))


def test_doc_has_the_worked_example_with_the_seed_output():
    pairs = doc_examples()
    assert len(pairs) >= 3
    assert pairs[0][1] == SEED_OUTPUT


def test_doc_examples_print_what_they_show():
    namespace: dict = {}
    for code, shown in doc_examples():  # blocks share a namespace, like a notebook
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, str(DOC), "exec"), namespace)
        assert buf.getvalue() == shown, f"block:\n{code}"


def test_example_script_prints_the_seed_table():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        runpy.run_path(str(ROOT / "examples" / "stream_worked_example.py"), run_name="__main__")
    assert buf.getvalue().startswith(SEED_OUTPUT)


@pytest.mark.parametrize("name", ["per_configuration_reward", "performance_gap", "solve_rate"])
def test_doc_table_lists_every_row(name):
    assert f"`{name}`" in DOC.read_text(encoding="utf-8")

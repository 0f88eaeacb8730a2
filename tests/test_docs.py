"""Executed documentation and the documentation site.

* Every fenced ``python`` block of the site's guide pages, README.md and
  docs/continual_evaluation.md is executed: the blocks of one page share a namespace (like a
  notebook) and run in a fresh temporary directory. A block followed directly by a ``text`` block
  must print exactly that text. A block preceded by ``<!-- skip -->`` is not run (none is today;
  the marker is for shell-like or long-running examples). docs/stream.md's blocks are executed by
  tests/stream/test_stream_docs.py; here it is only checked that all of them are covered there.
* ``mkdocs build --strict`` builds the site (mkdocs.yml, API reference from the docstrings) with
  warnings as errors; skipped when mkdocs is not installed (``pip install -e ".[docs]"``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# Pages whose python blocks run here. stream.md is covered by tests/stream/test_stream_docs.py.
PAGES = [
    "docs/index.md",
    "docs/quickstart.md",
    "docs/callback.md",
    "docs/metrics.md",
    "docs/experiments.md",
    "docs/performance.md",
    "docs/continual_evaluation.md",
    "docs/sharded.md",
    "README.md",
]

# Pages written as excerpts that use names they do not define: the names are provided here, as
# tiny real objects (no stubs), before the page's first block runs.
_TOY_STREAM = """
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback


def _task(t, n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    means = 2 * torch.randn(4, 8, generator=torch.Generator().manual_seed(t))
    return DataLoader(TensorDataset(means[y] + torch.randn(n, 8, generator=g), y), batch_size=64)


class _Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


train_loaders = [_task(t, 128, seed=t) for t in range(2)]
test_loaders = [_task(t, 64, seed=100 + t) for t in range(2)]
model = _Model()
"""
PRELUDES = {
    "README.md": _TOY_STREAM,  # its Usage block uses test_loaders, model, train_loaders
    "docs/continual_evaluation.md": _TOY_STREAM,  # its block uses ContinualEvalCallback, loaders
}

_FENCE = re.compile(
    r"(?P<skip><!--\s*skip\s*-->\s*\n)?"
    r"^```python[ \t]*\n(?P<code>.*?)^```[ \t]*\n"
    r"(?:[ \t]*\n)*(?:^```text[ \t]*\n(?P<shown>.*?)^```[ \t]*$)?",
    re.DOTALL | re.MULTILINE,
)


@dataclass
class Block:
    page: str
    line: int
    code: str
    shown: str | None
    skip: bool


def python_blocks(page: str) -> list[Block]:
    text = (ROOT / page).read_text(encoding="utf-8")
    return [
        Block(
            page=page,
            line=text.count("\n", 0, m.start("code")) + 1,
            code=m.group("code"),
            shown=m.group("shown"),
            skip=m.group("skip") is not None,
        )
        for m in _FENCE.finditer(text)
    ]


def test_block_parser_reads_code_output_and_skip_marker(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text(
        "intro\n\n```python\nprint(1)\n```\n\n```text\n1\n```\n\n"
        "<!-- skip -->\n```python\nraise SystemExit\n```\n\n```bash\nls\n```\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    blocks = python_blocks("page.md")
    assert [(b.line, b.code, b.shown, b.skip) for b in blocks] == [
        (4, "print(1)\n", "1\n", False),
        (13, "raise SystemExit\n", None, True),
    ]


@pytest.mark.parametrize("page", PAGES)
def test_page_code_blocks_run(page, tmp_path, monkeypatch):
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python block"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace: dict = {"__name__": "__docs__"}
    if page in PRELUDES:
        exec(compile(PRELUDES[page], f"<prelude of {page}>", "exec"), namespace)
    for block in blocks:
        if block.skip:
            continue
        buf = io.StringIO()
        # line numbers in tracebacks point into the page
        code = compile("\n" * (block.line - 1) + block.code, str(ROOT / page), "exec")
        with contextlib.redirect_stdout(buf):
            exec(code, namespace)
        if block.shown is not None:
            assert buf.getvalue() == block.shown, f"{page}:{block.line} printed:\n{buf.getvalue()}"


def test_stream_page_blocks_are_all_executed_by_the_stream_doc_test():
    # tests/stream/test_stream_docs.py runs the python blocks followed by a text block
    blocks = python_blocks("docs/stream.md")
    assert blocks
    assert all(b.shown is not None and not b.skip for b in blocks), [
        b.line for b in blocks if b.shown is None or b.skip
    ]


def test_every_docs_page_is_in_the_nav():
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for value in node.values():
                yield from pages(value)
        elif isinstance(node, list):
            for value in node:
                yield from pages(value)

    in_nav = set(pages(config["nav"]))
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert in_nav == on_disk
    executed = {p.removeprefix("docs/") for p in PAGES} | {"stream.md"}
    guides = {p for p in on_disk if not p.startswith("api/")}
    assert guides <= executed, guides - executed


def test_site_builds_strict(tmp_path):
    if any(importlib.util.find_spec(name) is None for name in ("mkdocs", "mkdocstrings")):
        pytest.skip('mkdocs/mkdocstrings not installed: pip install -e ".[docs]" to build the site')
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    api = (tmp_path / "site" / "api" / "callback" / "index.html").read_text(encoding="utf-8")
    assert "ContinualEvalCallback" in api and "eval_every_n_steps" in api
    assert (tmp_path / "site" / "stream" / "index.html").is_file()

"""Executed documentation and the documentation site.

* Every fenced ``python`` block of the site's guide pages, README.md and
  docs/continual_evaluation.md is executed: the blocks of one page share a namespace (like a
  notebook) and run in a fresh temporary directory. A block followed directly by a ``text`` block
  must print exactly that text. A block preceded by ``<!-- skip -->`` is not run (none is today;
  the marker is for shell-like or long-running examples). docs/stream.md's blocks are executed by
  tests/stream/test_stream_docs.py (here it is only checked that all of them are covered there),
  docs/online.md's by tests/online/test_online_docs.py.
* ``mkdocs build --strict`` builds the site (mkdocs.yml, API reference from the docstrings) with
  warnings as errors and without the theme's end-of-life banner; skipped when mkdocs is not
  installed (``pip install -e ".[docs]"``). Over the built HTML: no raw reST role (``:func:``,
  ``:class:``, ...) on any page, the API pages link to each other (autorefs), tools/
  convert_roles.py finds nothing left to rewrite, and the functional API page opens in headless
  Chromium (served on 127.0.0.1) without a console message.
* Without the site: no reST role in the sources (docstrings and ``#:`` comments under src/),
  README.md or docs/ (``python tools/convert_roles.py`` rewrites them as cross-references), and
  the converter's rules on a sample.
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
    "docs/compatibility.md",
    "docs/continual_evaluation.md",
    "docs/architecture.md",
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


def test_readme_install_steps_are_what_ci_runs():
    """The README's quick start installs what .ci/run installs (torch from the local CPU wheel,
    then the dev extra), and names the CPU-only index for other machines."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme[readme.index("## Quick start") : readme.index("## Usage")]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    readme_installs = re.findall(r"^pip install (-e \S+)", quick, flags=re.M)
    assert readme_installs == ["-e .", '-e ".[experiments]"', '-e ".[dev]"']
    ci_installs = re.findall(r"python -m pip install --quiet (?:-c \S+ )?(-e \S+)", ci)
    assert ci_installs and set(ci_installs) <= set(readme_installs), ci_installs
    assert "pip install torch==2.13.0" in quick
    assert "python -m pip install --quiet torch==2.13.0" in ci
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in quick


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
    executed = {p.removeprefix("docs/") for p in PAGES} | {"stream.md", "online.md"}
    guides = {p for p in on_disk if not p.startswith("api/")}
    assert guides <= executed, guides - executed


#: Sphinx roles that the site's Markdown shows as raw text (docstrings use mkdocstrings links)
_ROLE = re.compile(r":(func|class|mod|meth|data|attr|exc|obj|math):")
#: a role as written in a source: ``:func:`name```
_SOURCE_ROLE = re.compile(r":(func|class|mod|meth|attr|data|exc|obj|math):`")
#: an object's entry in the API reference: its heading's id
_OBJECT_ID = re.compile(r'id="(continual_eval(?:\.[A-Za-z_][A-Za-z0-9_]*)+)"')
#: what the Material theme prints when it is a release that announces its end of life
_BANNERS = ("end of life", "MkDocs 2.0", "Zensical")


@dataclass
class Site:
    path: Path
    output: str


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    if any(importlib.util.find_spec(name) is None for name in ("mkdocs", "mkdocstrings")):
        pytest.skip('mkdocs/mkdocstrings not installed: pip install -e ".[docs]" to build the site')
    out = tmp_path_factory.mktemp("site") / "site"
    env = {k: v for k, v in os.environ.items() if k != "NO_MKDOCS_2_WARNING"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Site(out, proc.stdout + proc.stderr)


@pytest.mark.slow
@pytest.mark.ci  # a docstring link that resolves nowhere fails CI, not only --run-slow
def test_site_builds_strict_without_a_banner(site: Site) -> None:
    assert "WARNING" not in site.output, site.output
    assert not any(b in site.output for b in _BANNERS), site.output  # as a user runs it
    api = (site.path / "api" / "callback" / "index.html").read_text(encoding="utf-8")
    assert "ContinualEvalCallback" in api and "eval_every_n_steps" in api
    assert (site.path / "stream" / "index.html").is_file()


def roles_by_object(page: str) -> dict[str, int]:
    """Raw reST roles in a built page, counted per API object (the nearest heading id above)."""
    ids = [(m.start(), m.group(1)) for m in _OBJECT_ID.finditer(page)]
    found: dict[str, int] = {}
    for m in _ROLE.finditer(page):
        owner = next((name for start, name in reversed(ids) if start < m.start()), "(page)")
        found[owner] = found.get(owner, 0) + 1
    return found


def test_roles_are_counted_per_object() -> None:
    page = (
        '<h2 id="continual_eval.a">a</h2><p>:func:<code>x</code></p>'
        '<h3 id="continual_eval.a.B">B</h3><p>:class:<code>y</code> :mod:<code>z</code></p>'
    )
    assert roles_by_object(page) == {"continual_eval.a": 1, "continual_eval.a.B": 2}


@pytest.mark.slow
def test_api_pages_show_links_not_roles(site: Site) -> None:
    """No page of the site shows a raw reST role (the message lists the objects whose entries
    do), and the API pages link to the entries (autorefs: ``href="...#continual_eval...."``)."""
    found: dict[str, int] = {}
    for page in sorted(site.path.rglob("*.html")):
        where = page.relative_to(site.path).as_posix()
        for owner, count in roles_by_object(page.read_text(encoding="utf-8")).items():
            found[f"{where}: {owner}"] = count
    assert found == {}, f"raw roles in {found}"
    links: list[str] = []
    for page in sorted((site.path / "api").rglob("index.html")):
        html = page.read_text(encoding="utf-8")
        links += re.findall(r'<a class="autorefs autorefs-internal"[^>]*href="([^"]*)"', html)
    assert any("#continual_eval." in href for href in links), links
    page = (site.path / "api" / "functional" / "index.html").read_text(encoding="utf-8")
    links = re.findall(r'<a class="autorefs autorefs-internal"[^>]*href="([^"]*)"', page)
    # a link written in a docstring
    assert "#continual_eval.functional.intervals.PackedBits" in links
    # a role converted by tools/convert_roles.py: :func:`~continual_eval.fit_tasks` in the
    # callback's docstring
    page = (site.path / "api" / "callback" / "index.html").read_text(encoding="utf-8")
    assert re.search(
        r'<a class="autorefs autorefs-internal"[^>]*href="#continual_eval\.'
        r'training\.fit_tasks"',
        page,
    )


@pytest.mark.slow
def test_role_converter_leaves_nothing_to_rewrite(site: Site) -> None:
    """tools/convert_roles.py, against the built site's inventory, would change no file."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "convert_roles.py"),
            "--check",
            "--inventory",
            str(site.path / "objects.inv"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_sources_hold_no_rest_role() -> None:
    """Docstrings (and ``#:`` comments) under src/, README.md and docs/ use the site's
    cross-references, not reST roles: ``python tools/convert_roles.py`` rewrites them."""
    files = [*sorted((ROOT / "src").rglob("*.py")), ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _SOURCE_ROLE.search(line)
    ]
    assert offenders == [], "reST roles (run tools/convert_roles.py):\n" + "\n".join(offenders)


def _converter():
    spec = importlib.util.spec_from_file_location(
        "convert_roles", ROOT / "tools" / "convert_roles.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_role_converter_rules() -> None:
    """Rendered targets become links naming the shortest public identifier of their entry, the
    others plain code; ``~`` shows the last component; long lines are re-wrapped; idempotent."""
    convert = _converter()
    anchor = "continual_eval.training.fit_tasks"
    targets = convert.Targets({anchor: anchor, "continual_eval.fit_tasks": anchor})
    text = (
        '"""Drive it with :func:`~continual_eval.fit_tasks` or :func:`fit_tasks`, not\n'
        ":func:`_private` nor :class:`torch.Tensor` (:math:`a_t`,\n"
        ":class:`title <continual_eval.training.fit_tasks>`, :mod:`continual_eval.unknown`).\n"
        "\n"
        "Args:\n"
        "    x: " + "word " * 14 + ":func:`continual_eval.training.fit_tasks`.\n"
        '    y: more."""\n'
    )
    new, count = convert.rewrite(text, targets, "continual_eval.training", python=True)
    assert count == 8
    link = "[`fit_tasks`][continual_eval.fit_tasks]"
    assert new.startswith(f'"""Drive it with {link} or {link}, not\n`_private` nor `torch.Tensor`')
    assert "(`a_t`,\n[`title`][continual_eval.fit_tasks], `continual_eval.unknown`)" in new
    lines = convert.rewrap(new.splitlines(), set(range(len(new.splitlines()))))
    assert max(map(len, lines)) <= 100
    assert lines[-3:] == [
        "    x: " + ("word " * 14).rstrip(),
        "        [`continual_eval.training.fit_tasks`][continual_eval.fit_tasks].",
        '    y: more."""',
    ]
    again = "\n".join(lines)
    assert convert.rewrite(again, targets, "continual_eval.training", python=True) == (again, 0)


@pytest.mark.slow
def test_site_opens_in_headless_chromium(site: Site, tmp_path: Path) -> None:
    """Served over HTTP on the loopback address (as ``mkdocs serve`` would), the functional API
    page opens with no console message and shows its cross-references as links."""
    import functools
    import shutil
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    if shutil.which("chromium") is None:
        pytest.skip("chromium is not installed")

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=site.path))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        proc = subprocess.run(
            [
                "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={tmp_path / 'profile'}",
                "--enable-logging=stderr",
                "--v=0",
                "--virtual-time-budget=5000",
                "--dump-dom",
                f"http://127.0.0.1:{server.server_address[1]}/api/functional/",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line for line in proc.stderr.splitlines() if ":CONSOLE" in line] == []
    assert proc.stdout.count("autorefs-internal") >= 20
    assert 'id="continual_eval.functional.paired_bootstrap"' in proc.stdout

"""The package's import surface: public names resolve, and importing it loads no Lightning."""

from __future__ import annotations

import ast
import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

import continual_eval


def test_public_names_resolve():
    for name in continual_eval.__all__:
        assert getattr(continual_eval, name) is not None, name
    assert set(continual_eval.__all__) <= set(dir(continual_eval))


# the subpackages whose ``__all__`` is the promised API (docs/compatibility.md, "Public API")
PROMISED = ("functional", "results", "evaluation", "stream", "online")
DOCS = Path(__file__).resolve().parents[1] / "docs"


def _promised() -> dict[str, list[str]]:
    import importlib

    modules = {"continual_eval": continual_eval.__all__}
    for name in PROMISED:
        modules[f"continual_eval.{name}"] = importlib.import_module(
            f"continual_eval.{name}"
        ).__all__
    return modules


def _resolve(dotted: str) -> object:
    """The object a ``::: dotted.path`` directive renders."""
    import importlib

    module, _, attr = dotted.rpartition(".")
    if dotted in sys.modules or dotted.count(".") == 1:
        with contextlib.suppress(ImportError):
            return importlib.import_module(dotted)
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError):
        return None


def test_promised_api_is_small_resolves_and_is_documented():
    """Every promised name resolves, the promise stays small (223 public names before it was
    written down), and each one has an entry on an API reference page: a ``::: name`` directive
    or a rendered member of a ``::: package`` directive (whose members are its ``__all__``)."""
    import importlib

    promised = _promised()
    total = sum(len(names) for names in promised.values())
    assert total <= 85, total
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (DOCS / "api").glob("*.md"))
    directives = {line.split()[1] for line in pages.splitlines() if line.startswith("::: ")}
    for module, names in promised.items():
        package = importlib.import_module(module)
        for name in names:
            obj = getattr(package, name)
            assert obj is not None, (module, name)
            if name == "__version__":
                continue
            documented = any(_resolve(d) is obj for d in directives) or any(
                d in promised
                and any(getattr(_resolve(d) or package, n, None) is obj for n in promised[d])
                for d in directives
            )
            assert documented, f"{module}.{name} has no entry in docs/api"


def test_implementation_modules_are_not_promised():
    """What the package's other modules export is for its own use: no API page renders a whole
    implementation module."""
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (DOCS / "api").glob("*.md"))
    rendered = {line.split()[1] for line in pages.splitlines() if line.startswith("::: ")}
    whole_modules = {d for d in rendered if d.count(".") == 1 or d.endswith("switches")}
    allowed = {f"continual_eval.{name}" for name in PROMISED} | {
        "continual_eval.evaluation.switches"
    }
    assert whole_modules <= allowed, whole_modules - allowed


@pytest.mark.slow
def test_import_and_cli_help_load_no_lightning():
    code = (
        "import sys, continual_eval, continual_eval.stream, continual_eval.cli\n"
        "heavy = sorted(m for m in ('lightning', 'torch', 'torchmetrics') if m in sys.modules)\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "lightning" not in out.stdout and "torchmetrics" not in out.stdout, out.stdout


# ---------------------------------------------------------------------- the import graph
SRC = Path(__file__).resolve().parents[1] / "src"


def _module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under the package ``root``."""
    names = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _skipped(node: ast.AST) -> bool:
    """Blocks whose imports never run when the module is imported: ``if TYPE_CHECKING:`` (type
    annotations only) and ``if __name__ == "__main__":`` (run as a script)."""
    if not isinstance(node, ast.If):
        return False
    test = ast.unparse(node.test)
    return "TYPE_CHECKING" in test or test.replace("'", '"') == '__name__ == "__main__"'


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``module`` imports anywhere in its file (inside functions too):
    ``import a.b``, ``from a import b`` (``a.b`` when it is a module, else ``a``), relative
    imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _skipped(node):
            for child in node.orelse:  # an else branch does run
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    found.add(f"{target}.{alias.name}")
                elif target in modules:
                    found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_cycles(root: Path) -> list[list[str]]:
    """Every circle of the import graph of the package at ``root``, each as the path of modules
    that closes it (``a -> b -> a``), the strongly connected components found by Tarjan's
    algorithm (iterative)."""
    modules = _module_names(root)
    graph = {name: sorted(_imports(name, path, modules)) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(graph[node]):
                work.append((node, i + 1))
                nxt = graph[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    cycles.append(_closing_path(sorted(component), graph))
    return cycles


def _closing_path(component: list[str], graph: dict[str, list[str]]) -> list[str]:
    """A shortest path inside ``component`` from its first module back to itself."""
    members, first = set(component), component[0]
    paths = {first: [first]}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for nxt in graph[node]:
                if nxt == first:
                    return [*paths[node], first]
                if nxt in members and nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    return component  # pragma: no cover (a component always closes)


def test_the_import_graph_finds_a_circle_through_a_lazy_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import b\n")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"
        "if __name__ == '__main__':\n    import pkg.c\n"
    )
    assert import_cycles(package) == [["pkg.a", "pkg.sub.b", "pkg.a"]]


def test_no_import_circles_in_the_package():
    """No module of ``continual_eval`` imports, directly or through others, a module that
    imports it back, counting imports inside functions (a lazy import still ties the two)."""
    cycles = import_cycles(SRC / "continual_eval")
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)

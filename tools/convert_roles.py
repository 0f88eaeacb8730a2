#!/usr/bin/env python3
"""Rewrite Sphinx/reST roles as the docs site's Markdown cross-references.

The site is MkDocs + mkdocstrings, which shows ``:func:`fit_tasks``` as raw text. This script
rewrites every role in ``src/`` (docstrings and ``#:`` comments), ``README.md`` and ``docs/``:

* ``:func:`fit_tasks``` -> ``[`fit_tasks`][continual_eval.fit_tasks]`` when the target is an
  object the API reference renders; ``~`` shows the last component only, ``title <target>``
  shows the title, a leading ``.`` or ``!`` is dropped from the shown text;
* a target that is not rendered (a private name, a name on no API page, torch / Lightning /
  torchmetrics, ...) -> plain inline code ``name``, so autorefs never meets an unresolved
  reference and ``mkdocs build --strict`` stays clean;
* ``:math:`x``` -> inline code ``x`` (the site has no math renderer); ``:ref:`` -> its text.

Which identifiers are rendered is read from the site itself: the script builds it (``mkdocs
build`` into a temporary directory, or ``--inventory site/objects.inv`` of a build) and reads
``objects.inv``, the mkdocstrings inventory of every rendered object under its rendered path
and its aliases (the re-exports and the canonical path). A role's target is looked up the way
Sphinx does (the enclosing classes, the module, the name as written, then the package and its
parents) and, failing that, by importing it from the module the docstring is in and matching
the object against the inventory's objects. The link names the shortest public identifier of
the object's entry (``continual_eval.fit_tasks`` rather than ``continual_eval.training.
fit_tasks``).

With ``--fix-links``, existing links ``[text][continual_eval.x]`` whose identifier is not in the
inventory (code moved since they were written, or a module no API page renders) are re-resolved
the same way, or made plain code; without it they are left as they are.

Lines a rewrite makes longer than the line length (100) are re-wrapped within their paragraph.
Idempotent: a second run changes nothing. ``--check`` changes nothing and exits 1 when a run
would. Run from anywhere: ``python tools/convert_roles.py [--check] [--inventory FILE]
[paths...]``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import re
import subprocess
import sys
import tempfile
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "continual_eval"
LINE_LENGTH = 100

#: a role: ``:func:`x```, ``:py:meth:`~a.b```, ``:class:`title <target>```; may span lines
ROLE = re.compile(
    r"(?<![\w`:]):(?:py:)?(?P<role>func|class|mod|meth|attr|data|exc|obj|const|ref|math|term"
    r"|any):`(?P<body>[^`]+)`(?!`)"
)
#: an autorefs link to one of the package's objects: ``[text][continual_eval.x.y]``
LINK = re.compile(r"\[(?P<text>[^\[\]]+)\]\[(?P<ident>" + PACKAGE + r"(?:\.\w+)*)\]")
#: the pieces that a re-wrap must not break inside
_PROTECTED = re.compile(r"\[[^\[\]]*\]\[[^\[\]]*\]|``[^`]*``|`[^`]*`")
#: a line that starts a list item: its continuation lines are indented past the marker
_BULLET = re.compile(r"([*+-]|\d+[.)])\s+")
#: a Google-style section entry (``name: text``, ``name (type): text``): continued 4 deeper
_ENTRY = re.compile(r"\w+(\s*\([^)]*\))?:\s")
#: a line that a re-wrap does not join to the line above
_BLOCK_START = re.compile(
    r"([*+-]|\d+[.)])\s|\w+(\s*\([^)]*\))?:(\s|$)|>>>|\.\.\.|```|\.\. |[A-Z][\w ]*:$"
)


# -- the inventory: what the site renders ------------------------------------------------------


def build_inventory() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        proc = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(site)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or not (site / "objects.inv").is_file():
            sys.exit(f"mkdocs build failed:\n{proc.stdout}{proc.stderr}")
        return (site / "objects.inv").read_bytes()


def read_inventory(data: bytes) -> dict[str, str]:
    """identifier -> the anchor (rendered path) of its entry, for every inventory name."""
    lines = data.split(b"\n", 4)
    if not lines[0].startswith(b"# Sphinx inventory version 2"):
        sys.exit("not a Sphinx v2 inventory")
    names: dict[str, str] = {}
    for row in zlib.decompress(lines[4]).decode("utf-8").splitlines():
        name, _domain_role, _priority, uri = row.split(" ", 4)[:4]
        anchor = uri.partition("#")[2]
        names[name] = name if anchor in ("$", "") else anchor
    return names


# -- Python objects, for the targets that are not written as rendered names --------------------


def _import(path: str) -> tuple[Any, Any, str] | None:
    """(owner, object, attribute name) of a dotted path, or None when it does not resolve."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except Exception:
            continue
        owner, name = None, parts[cut - 1]
        try:
            for part in parts[cut:]:
                owner, obj, name = obj, getattr(obj, part), part
        except Exception:
            return None
        return owner, obj, name
    return None


def object_key(obj: Any, name: str) -> tuple[Any, ...]:
    """What two paths to the same object share: its identity, or (name, value) for data."""
    if isinstance(obj, (classmethod, staticmethod)):
        obj = obj.__func__
    if inspect.ismethod(obj):
        obj = obj.__func__
    if inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isroutine(obj):
        return ("object", id(obj))
    if isinstance(obj, property):
        return ("object", id(obj))
    return ("data", name, id(obj))


@dataclass
class Targets:
    """The rendered objects, and the identifier a link to each of them names."""

    names: dict[str, str]  # identifier -> anchor
    by_key: dict[tuple[Any, ...], set[str]] = field(default_factory=dict)  # object -> anchors
    shown: dict[str, str] = field(default_factory=dict)  # anchor -> identifier to write

    def __post_init__(self) -> None:
        per_anchor: dict[str, list[str]] = defaultdict(list)
        for name, anchor in self.names.items():
            per_anchor[anchor].append(name)
        for anchor, names in per_anchor.items():
            public = [n for n in names if not any(p.startswith("_") for p in n.split("."))]
            self.shown[anchor] = min(public or names, key=lambda n: (n.count("."), n != anchor, n))
        keys: dict[tuple[Any, ...], set[str]] = defaultdict(set)
        for name, anchor in self.names.items():
            found = _import(name)
            if found is not None:
                keys[object_key(found[1], found[2])].add(anchor)
        self.by_key = dict(keys)

    def identifier(self, name: str) -> str | None:
        anchor = self.names.get(name)
        return None if anchor is None else self.shown[anchor]

    def of_object(self, obj: Any, name: str) -> str | None:
        anchors = self.by_key.get(object_key(obj, name), set())
        return self.shown[sorted(anchors)[0]] if len(anchors) == 1 else None

    def resolve(self, target: str, module: str | None, classes: list[str]) -> str | None:
        """The identifier to link ``target`` (as written in ``module``, inside ``classes``)."""
        target = re.sub(r"\s+", "", target).removesuffix("()")
        relative = target.startswith(".")
        target = target.lstrip(".")
        if not re.fullmatch(r"\w+(\.\w+)*", target):
            return None
        scopes: list[str] = []
        if module:
            scopes += [".".join([module, *classes[:k]]) for k in range(len(classes), 0, -1)]
            scopes.append(module)
        for name in [f"{s}.{target}" for s in scopes] + [target]:
            if (found := self.identifier(name)) is not None:
                return found
        if module and (found := self._imported(target, module, classes)) is not None:
            return found
        parents = module.split(".")[:-1] if module else []
        for k in range(len(parents), 0, -1):
            if (found := self.identifier(".".join([*parents[:k], target]))) is not None:
                return found
        outside = module is None or target.split(".")[0] != PACKAGE
        if outside and (found := self.identifier(f"{PACKAGE}.{target}")) is not None:
            return found
        if relative or "." in target:
            # ``.name`` (Sphinx: any object whose path ends so) or ``Class.member``
            anchors = {a for n, a in self.names.items() if n.endswith("." + target)}
            if len(anchors) == 1:
                return self.shown[anchors.pop()]
        return None

    def _imported(self, target: str, module: str, classes: list[str]) -> str | None:
        try:
            namespace: Any = importlib.import_module(module)
        except Exception:
            return None
        head, *rest = target.split(".")
        scopes: list[Any] = []
        scope: Any = namespace
        for cls in classes:
            scope = getattr(scope, cls, None)
            if scope is None:
                break
            scopes.insert(0, scope)
        scopes.append(namespace)
        for scope in scopes:
            if not hasattr(scope, head):
                continue
            owner, obj, name = scope, getattr(scope, head), head
            try:
                for part in rest:
                    owner, obj, name = obj, getattr(obj, part), part
            except AttributeError:
                return None
            del owner
            return self.of_object(obj, name)
        found = _import(target)
        return None if found is None else self.of_object(found[1], found[2])


# -- rewriting ---------------------------------------------------------------------------------


def shown_text(role: str, body: str) -> tuple[str, str]:
    """(the text a reader sees, the target) of a role's body (which may span lines)."""
    titled = re.fullmatch(r"(?s)\s*(?P<title>.*?\S)\s*<(?P<target>[^<>]+)>\s*", body)
    if titled:
        title = re.sub(r"(?<=\.)\s*\n\s*", "", titled["title"])  # a path broken after a dot
        return " ".join(title.split()), re.sub(r"\s+", "", titled["target"])
    target = re.sub(r"\s+", "", body).lstrip("!")
    text = target.lstrip("~").lstrip(".")
    if target.startswith("~"):
        text = text.split(".")[-1]
    return text, target.lstrip("~")


def code(text: str) -> str:
    ticks = "``" if "`" in text else "`"
    return f"{ticks}{text}{ticks}"


def replacement(match: re.Match[str], targets: Targets, module: str | None, classes: list[str]):
    role, body = match["role"], match["body"]
    if role == "math":
        return code(body)
    text, target = shown_text(role, body)
    if role in ("ref", "term"):
        return text
    ident = (
        None if match["body"].lstrip().startswith("!") else targets.resolve(target, module, classes)
    )
    if ident is None:
        return code(text)
    return f"[{code(text) if ' ' not in text else text}][{ident}]"


def module_name(path: Path) -> str | None:
    try:
        rel = path.resolve().relative_to(SRC)
    except ValueError:
        return None
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def class_ranges(text: str) -> list[tuple[int, int, list[str]]]:
    """(first line, last line, class path) of each class of a module, outermost first."""
    ranges: list[tuple[int, int, list[str]]] = []

    def visit(node: ast.AST, chain: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                path = [*chain, child.name]
                ranges.append((child.lineno, child.end_lineno or child.lineno, path))
                visit(child, path)
            elif not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, chain)
            else:
                visit(child, [])  # a class inside a function is not reachable by a path

    visit(ast.parse(text), [])
    return ranges


def classes_at(ranges: list[tuple[int, int, list[str]]], line: int) -> list[str]:
    inside = [path for first, last, path in ranges if first <= line <= last]
    return max(inside, key=len) if inside else []


def rewrite(
    text: str, targets: Targets, module: str | None, python: bool, fix_links: bool = False
) -> tuple[str, int]:
    """The text with its roles and dangling links rewritten, and how many were."""
    ranges = class_ranges(text) if python else []
    count = 0
    out: list[str] = []
    pos = 0
    for m in sorted(
        [*ROLE.finditer(text), *(LINK.finditer(text) if fix_links else [])],
        key=lambda m: m.start(),
    ):
        if m.start() < pos:
            continue
        line = text.count("\n", 0, m.start()) + 1
        classes = classes_at(ranges, line)
        if "role" in m.groupdict():
            new = replacement(m, targets, module, classes)
        else:
            if targets.names.get(m["ident"]) is not None:
                continue
            ident = targets.resolve(m["ident"], module, classes)
            shown = m["text"]
            new = f"[{shown}][{ident}]" if ident else shown if shown[0] == "`" else code(shown)
        out += [text[pos : m.start()], new]
        pos = m.end()
        gap = re.match(r" {2,}(?=\S)", text[pos:])
        if gap and "\n" not in m.group(0):  # an aligned column (a table) keeps its place
            width = max(2, gap.end() + len(m.group(0)) - len(new))
            out.append(" " * width)
            pos += gap.end()
        count += 1
    out.append(text[pos:])
    return "".join(out), count


# -- re-wrapping -------------------------------------------------------------------------------


def _prefix(line: str) -> str:
    """Leading whitespace, plus ``#:``/``#`` and a space for a comment line."""
    m = re.match(r"\s*(#:? ?)?", line)
    assert m is not None
    return m.group(0)


def _break_at(line: str, start: int, limit: int) -> int | None:
    """The index of the space to break ``line`` at: the last one before ``limit`` that is
    outside links and code spans (inside a code span when there is none), else the first."""
    protected = [m.span() for m in _PROTECTED.finditer(line)]
    links = [m.span() for m in _PROTECTED.finditer(line) if m.group(0).startswith("[")]
    spaces = [i for i, c in enumerate(line) if c == " " and i > start]
    for allowed in (protected, links):
        ok = [i for i in spaces if not any(a < i < b for a, b in allowed)]
        fitting = [i for i in ok if i <= limit]
        if fitting:
            return fitting[-1]
    ok = [i for i in spaces if not any(a < i < b for a, b in links)]
    later = [i for i in ok if i > limit]
    return later[0] if later else None


def rewrap(lines: list[str], changed: set[int], limit: int = LINE_LENGTH) -> list[str]:
    """Lines in ``changed`` (indices) longer than ``limit``: the overflow moves to the start of
    the paragraph's next line (which is re-checked), or to a new line after it."""
    lines = list(lines)
    i = 0
    while i < len(lines):
        line = lines[i]
        if i not in changed or len(line) <= limit:
            i += 1
            continue
        own = _prefix(line)
        content_start = len(own) + len(line[len(own) :]) - len(line[len(own) :].lstrip('"'))
        at = _break_at(line, max(content_start, len(own)) + 8, limit)
        if at is None:
            i += 1
            continue
        head, tail = line[:at].rstrip(), line[at + 1 :].lstrip()
        nxt = lines[i + 1] if i + 1 < len(lines) else None
        body = line[len(own) :].lstrip('"')
        deeper = (
            nxt is not None
            and nxt.strip() != ""
            and len(_prefix(nxt)) > len(own)
            and _prefix(nxt).strip() == own.strip()
        )
        bullet, entry = _BULLET.match(body), _ENTRY.match(body)
        if deeper and (bullet or entry):
            prefix = _prefix(nxt or "")
        elif bullet:
            prefix = own + " " * bullet.end()
        elif entry:
            prefix = own + "    "
        else:
            prefix = own
        mergeable = (
            nxt is not None
            and nxt.startswith(prefix)
            and len(_prefix(nxt)) == len(prefix)
            and nxt[len(prefix) :].strip() != ""
            and not _BLOCK_START.match(nxt[len(prefix) :])
            and not nxt[len(prefix) :].startswith('"""')
            and '"""' not in tail
        )
        lines[i] = head
        if mergeable:
            lines[i + 1] = prefix + tail + " " + (nxt or "")[len(prefix) :]
        else:
            lines.insert(i + 1, prefix + tail)
            changed = {j + 1 if j > i else j for j in changed}
        changed.add(i + 1)
        i += 1
    return lines


def convert_file(path: Path, targets: Targets, fix_links: bool = False) -> tuple[str, str, int]:
    old = path.read_text(encoding="utf-8")
    python = path.suffix == ".py"
    new, count = rewrite(old, targets, module_name(path) if python else None, python, fix_links)
    if count and python:
        old_lines = set(old.splitlines())
        lines = new.splitlines()
        changed = {i for i, line in enumerate(lines) if line not in old_lines}
        new = "\n".join(rewrap(lines, changed)) + ("\n" if new.endswith("\n") else "")
    return old, new, count


def default_paths() -> list[Path]:
    paths = sorted(SRC.rglob("*.py")) + sorted((ROOT / "docs").rglob("*.md"))
    return paths + [p for p in (ROOT / "README.md", ROOT / "CHANGELOG.md") if p.is_file()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="files (default: src, docs, README)")
    parser.add_argument("--inventory", type=Path, help="objects.inv of a build (default: build)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if needed")
    parser.add_argument(
        "--fix-links", action="store_true", help="also re-resolve links to unrendered names"
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(SRC))
    data = args.inventory.read_bytes() if args.inventory else build_inventory()
    with contextlib.redirect_stdout(sys.stderr):
        targets = Targets(read_inventory(data))
    total = links = 0
    for path in args.paths or default_paths():
        old, new, count = convert_file(path, targets, args.fix_links)
        if new == old:
            continue
        total += count
        links += new.count("][") - old.count("][")
        print(f"{path.resolve().relative_to(ROOT)}: {count}")
        if not args.check:
            path.write_text(new, encoding="utf-8")
    checked = " (check only)" if args.check else ""
    print(f"{total} roles/links rewritten ({links} new links){checked}")
    return 1 if args.check and total else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Validation of a ``results.json`` document read from a file that may not be trustworthy.

:func:`read_results_json` reads, parses and validates a file; :func:`validate_results` checks an
already parsed document. Either raises :class:`InvalidResultsError` (a ``ValueError``) naming the
file and the offending field as a JSON path (``scores[2][1]``, ``metadata.reference[0]``) with the
expected and the found type, so no reader meets a ``KeyError``, ``TypeError`` or
``RecursionError`` later.

Schema (``format_version`` 1 or 2; ``T = num_tasks``, ``s = stages_completed``, ``N`` = the
per-step evaluations, "cell" = a finite number or ``null``):

* required: ``format_version`` (1 or 2), ``num_tasks`` (integer, ``1..MAX_TASKS``),
  ``task_names`` (``T`` strings), ``stages_completed`` (integer, ``0..T``), ``scores`` (``s`` rows
  of ``T`` cells), ``baseline`` (``T`` cells), ``metrics`` (object of cells);
* optional, checked when present: ``metrics_per_stage`` (object of ``s`` cells each),
  ``per_task`` (object of ``max(s - 1, 0)`` cells each), ``conventions`` (object of strings),
  ``metadata`` (free-form object; ``experiment``, ``method`` and ``seed`` each a string, a number,
  a boolean or null; ``reference`` ``T`` cells or null), ``curves`` and ``stability`` (per-step
  evaluation of the primary matrix, see :func:`continual_eval.results.build_curves`), ``run_id``
  (string), ``files`` (object of objects; ``files["scores.csv"]`` holds ``sha256`` and
  ``stages``);
* ``matrices`` (version 2; at most :data:`MAX_MATRICES`): name -> ``score`` (string), ``scores``,
  ``baseline``, ``metrics`` as at the top level, optional ``higher_is_better`` (boolean),
  ``bounds`` (2 cells, ``null`` = infinite, or null), ``metrics_per_stage``, ``per_task``, and
  with per-step evaluation ``step_scores`` (``N`` rows of ``T`` cells, aligned with
  ``curves.step``: only with ``curves``), ``stability`` (as at the top level) and ``plasticity``
  (see ``_check_plasticity``);
* optional sections of the callback, checked when present (not null): ``cost`` (what each stage
  cost, see ``_check_cost``) and ``reference`` (the primary matrix against a reference model,
  see ``_check_reference``), ``class_incremental`` (the class-incremental record, see
  ``_check_class_incremental``);
* unknown top-level keys are accepted (forward compatibility), within the nesting bound.

Limits on what an untrusted file may hold (a file beyond them is refused, not truncated):
:data:`MAX_FILE_BYTES` bytes, :data:`MAX_TASKS` tasks, :data:`MAX_NAME_LENGTH` characters per
name (task names, experiment, method, seed, score, convention strings, ``run_id``),
:data:`MAX_TEXT_LENGTH` characters per descriptive string (``curves.step_counter``,
``stability.source``) and :data:`MAX_DEPTH` levels of nested arrays and objects. The JSON
constants ``NaN`` and ``Infinity`` are refused (the writer stores ``null``).
"""

from __future__ import annotations

import json
import math
import os
import stat
import unicodedata
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "FORMAT_VERSION",
    "MAX_CLASSES",
    "MAX_CONFUSION_CELLS",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_MATRICES",
    "MAX_NAME_LENGTH",
    "MAX_TASKS",
    "MAX_TEXT_LENGTH",
    "InvalidResultsError",
    "parse_results_json",
    "printable",
    "read_results_json",
    "validate_results",
]

#: at most this many score matrices in one document
MAX_MATRICES = 64
#: the ``format_version`` ``continual_eval.results`` writes
FORMAT_VERSION = 2
#: the versions this reader understands (1: one matrix; 2: adds ``matrices``)
SUPPORTED_VERSIONS = (1, 2)
#: largest ``results.json`` read (bytes); T = 2000 with full curves fits comfortably
MAX_FILE_BYTES = 256 * 1024 * 1024
#: most tasks a document may hold (``num_tasks``)
MAX_TASKS = 2000
#: longest task name, experiment, method, seed string, score name, convention or ``run_id``
MAX_NAME_LENGTH = 200
#: longest descriptive string (``curves.step_counter``, ``stability.source``)
MAX_TEXT_LENGTH = 1000
#: deepest nesting of arrays and objects, the document itself counting as level 1
MAX_DEPTH = 32
#: most class ids of a ``class_incremental`` section (``num_classes``)
MAX_CLASSES = 5000
#: most confusion cells of a ``class_incremental`` section, stages x classes**2 (the reader
#: holds them as int64: 256 MiB)
MAX_CONFUSION_CELLS = 2**25

_MAX_EXACT_INT = 2**53  # integers beyond this are not exact as float64 cells
_MAX_INT64 = 2**63 - 1
_SHOWN_CHARS = 40  # characters of a found string or a key quoted in a message
_SCORES_CSV = "scores.csv"
_UNPRINTABLE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


class InvalidResultsError(ValueError):
    """A ``results.json`` that does not follow the schema.

    ``source`` is the file, ``field`` the JSON path of the offending value (``""`` when the file as
    a whole is at fault), ``problem`` what is wrong; ``str(err)`` is one line naming all three.
    """

    def __init__(self, source: str | os.PathLike, field: str, problem: str) -> None:
        self.source = str(source)
        self.field = field
        self.problem = problem
        where = f"{printable(self.source, 300)}: " + (f"{field}: " if field else "")
        super().__init__(where + problem)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.source, self.field, self.problem)


def printable(text: str, limit: int = _SHOWN_CHARS) -> str:
    """``text`` on one line: control, format and line-separator characters as ``\\uXXXX``-style
    escapes, cut to ``limit`` characters with ``...`` and the full length when longer."""
    shown = text if len(text) <= limit else text[:limit]
    out = "".join(
        ch.encode("unicode_escape").decode("ascii")
        if unicodedata.category(ch) in _UNPRINTABLE
        else ch
        for ch in shown
    )
    return out if len(text) <= limit else f"{out}... ({len(text)} characters)"


def _describe(value: Any) -> str:
    """The JSON type of ``value`` and, when short, the value itself."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        text = str(value)
        return f"integer {text}" if len(text) <= 24 else f"integer of {len(text)} digits"
    if isinstance(value, float):
        return f"number {value!r}"
    if isinstance(value, str):
        if len(value) > _SHOWN_CHARS:
            return f"string of {len(value)} characters"
        return f"string {printable(json.dumps(value, ensure_ascii=False))}"
    if isinstance(value, list):
        return f"array of {len(value)} items"
    if isinstance(value, dict):
        return f"object with {len(value)} keys"
    return type(value).__name__  # pragma: no cover - json never produces anything else


def _key_path(parent: str, key: str) -> str:
    if key.isidentifier():
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{printable(json.dumps(key), _SHOWN_CHARS)}]"


def _is_cell(value: Any) -> bool:
    kind = type(value)
    if kind is float:
        return math.isfinite(value)
    return value is None or (kind is int and -_MAX_EXACT_INT <= value <= _MAX_EXACT_INT)


class _Checker:
    """Checks of one document; every failure raises :class:`InvalidResultsError`."""

    def __init__(self, source: str | os.PathLike) -> None:
        self.source = source

    def fail(self, field: str, expected: str, value: Any) -> NoReturn:
        raise InvalidResultsError(
            self.source, field, f"expected {expected}, found {_describe(value)}"
        )

    def mapping(self, value: Any, field: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(field, "an object", value)
        return value

    def array(
        self, value: Any, field: str, length: int | None = None, most: int | None = None
    ) -> list[Any]:
        if not isinstance(value, list):
            self.fail(field, "an array", value)
        if length is not None and len(value) != length:
            self.fail(field, f"an array of {length} items", value)
        if most is not None and len(value) > most:
            self.fail(field, f"an array of at most {most} items", value)
        return value

    def integer(self, value: Any, field: str, low: int = 0, high: int = _MAX_INT64) -> int:
        if type(value) is not int or not low <= value <= high:
            if high != _MAX_INT64:
                expected = f"an integer in [{low}, {high}]"
            else:
                expected = "an integer" if low < 0 else f"an integer >= {low}"
            self.fail(field, expected, value)
        return value

    def string(self, value: Any, field: str, most: int = MAX_NAME_LENGTH) -> str:
        if not isinstance(value, str) or len(value) > most:
            self.fail(field, f"a string of at most {most} characters", value)
        return value

    def number(self, value: Any, field: str) -> None:
        if value is None or not _is_cell(value):
            self.fail(field, "a finite number", value)

    def cells(
        self, value: Any, field: str, length: int | None = None, most: int | None = None
    ) -> None:
        """An array of finite numbers or nulls (the fast path of large matrices)."""
        values = self.array(value, field, length, most)
        if not all(map(_is_cell, values)):
            i = next(i for i, v in enumerate(values) if not _is_cell(v))
            self.fail(f"{field}[{i}]", "a finite number or null", values[i])

    def matrix(self, value: Any, field: str, rows: int | None, columns: int) -> None:
        for i, row in enumerate(self.array(value, field, rows)):
            self.cells(row, f"{field}[{i}]", columns)

    def cell_table(
        self, value: Any, field: str, length: int | None, most: int | None = None
    ) -> None:
        """An object whose every value is an array of cells."""
        for key, column in self.mapping(value, field).items():
            self.cells(column, _key_path(field, key), length, most)

    def nesting(self, value: Any, field: str, depth: int) -> None:
        """Free-form JSON: at most :data:`MAX_DEPTH` levels (``depth`` = level of ``value``)."""
        stack = [(value, field, depth)]
        while stack:
            item, path, level = stack.pop()
            if not isinstance(item, (list, dict)):
                continue
            if level > MAX_DEPTH:
                raise InvalidResultsError(
                    self.source, path, f"nested deeper than {MAX_DEPTH} levels of arrays/objects"
                )
            nested = enumerate(item) if isinstance(item, list) else item.items()
            for key, child in nested:
                if isinstance(child, (list, dict)):
                    child_path = f"{path}[{key}]" if isinstance(key, int) else _key_path(path, key)
                    stack.append((child, child_path, level + 1))


def _check_metadata(check: _Checker, metadata: Any, T: int) -> None:
    metadata = check.mapping(metadata, "metadata")
    for key in ("experiment", "method", "seed"):  # shown by the report as text
        value = metadata.get(key)
        if isinstance(value, str) and len(value) <= MAX_NAME_LENGTH:
            continue
        if value is not None and not isinstance(value, bool) and not _is_cell(value):
            check.fail(
                f"metadata.{key}",
                f"a string of at most {MAX_NAME_LENGTH} characters, a number, a boolean or null",
                value,
            )
    if metadata.get("reference") is not None:
        check.cells(metadata["reference"], "metadata.reference", T)
    check.nesting(metadata, "metadata", 2)


def _check_curves(check: _Checker, curves: Any, T: int) -> None:
    curves = check.mapping(curves, "curves")
    for key in ("step", "stage", "accuracy"):
        if key not in curves:
            raise InvalidResultsError(check.source, f"curves.{key}", "missing")
    steps = check.array(curves["step"], "curves.step")
    N = len(steps)
    for n, step in enumerate(steps):
        check.integer(step, f"curves.step[{n}]")
    for n, stage in enumerate(check.array(curves["stage"], "curves.stage", N)):
        check.integer(stage, f"curves.stage[{n}]", 0, T - 1)
    check.matrix(curves["accuracy"], "curves.accuracy", N, T)
    if "full" in curves:
        for n, full in enumerate(check.array(curves["full"], "curves.full", N)):
            if not isinstance(full, bool):
                check.fail(f"curves.full[{n}]", "a boolean", full)
    if "score" in curves:
        check.string(curves["score"], "curves.score")
    if "step_counter" in curves:
        check.string(curves["step_counter"], "curves.step_counter", MAX_TEXT_LENGTH)
    if curves.get("subset") is not None:
        subset = check.mapping(curves["subset"], "curves.subset")
        if "size" in subset:
            check.integer(subset["size"], "curves.subset.size")
        if "seed" in subset:
            check.integer(subset["seed"], "curves.subset.seed", -_MAX_INT64 - 1)
        if "samples_per_task" in subset:
            sizes = check.array(subset["samples_per_task"], "curves.subset.samples_per_task", T)
            for j, size in enumerate(sizes):
                check.integer(size, f"curves.subset.samples_per_task[{j}]")
        check.nesting(subset, "curves.subset", 3)


def _check_stability(check: _Checker, stability: Any, T: int, field: str = "stability") -> None:
    stability = check.mapping(stability, field)
    for key in ("min_acc", "wc_acc"):
        if key in stability:
            check.cells(stability[key], f"{field}.{key}", most=T)
    if "per_task" in stability:
        check.cell_table(stability["per_task"], f"{field}.per_task", None, most=T)
    if "tolerance" in stability:
        check.number(stability["tolerance"], f"{field}.tolerance")
    if "source" in stability:
        check.string(stability["source"], f"{field}.source", MAX_TEXT_LENGTH)


def _check_cell(check: _Checker, section: dict[str, Any], key: str, field: str) -> None:
    if key in section and not _is_cell(section[key]):
        check.fail(f"{field}.{key}", "a finite number or null", section[key])


def _check_plasticity(check: _Checker, plasticity: Any, T: int, field: str) -> None:
    """A matrix's ``plasticity``: ``anytime_accuracy``, ``auc_forward_transfer`` (cells),
    ``stage_auc``, ``auc_forward_transfer_per_task`` (at most ``T`` cells or null), ``lca``
    (``{"beta": integer >= 0, "value": cell}`` or null)."""
    plasticity = check.mapping(plasticity, field)
    for key in ("anytime_accuracy", "auc_forward_transfer"):
        _check_cell(check, plasticity, key, field)
    for key in ("stage_auc", "auc_forward_transfer_per_task"):
        if plasticity.get(key) is not None:
            check.cells(plasticity[key], f"{field}.{key}", most=T)
    if plasticity.get("lca") is not None:
        lca = check.mapping(plasticity["lca"], f"{field}.lca")
        if "beta" not in lca:
            raise InvalidResultsError(check.source, f"{field}.lca.beta", "missing")
        check.integer(lca["beta"], f"{field}.lca.beta")
        _check_cell(check, lca, "value", f"{field}.lca")


def _check_reference(check: _Checker, reference: Any, T: int, s: int) -> None:
    """The ``reference`` section: ``kind`` (string), ``scores`` (``T`` cells), optional ``score``
    (string), ``higher_is_better`` (boolean), ``auc`` (``T`` cells or null), ``intransigence`` and
    ``fwt_isolated`` (cells), ``intransigence_per_task`` (``s`` cells),
    ``fwt_isolated_per_task`` (``max(s - 1, 0)`` cells), ``per_stage`` (object of ``s`` cells
    each), ``source`` (string)."""
    field = "reference"
    reference = check.mapping(reference, field)
    for key in ("kind", "scores"):
        if key not in reference:
            raise InvalidResultsError(check.source, f"{field}.{key}", "missing")
    check.string(reference["kind"], f"{field}.kind")
    if "score" in reference:
        check.string(reference["score"], f"{field}.score")
    if "higher_is_better" in reference and type(reference["higher_is_better"]) is not bool:
        check.fail(f"{field}.higher_is_better", "true or false", reference["higher_is_better"])
    check.cells(reference["scores"], f"{field}.scores", T)
    if reference.get("auc") is not None:
        check.cells(reference["auc"], f"{field}.auc", T)
    for key in ("intransigence", "fwt_isolated"):
        _check_cell(check, reference, key, field)
    if "intransigence_per_task" in reference:
        check.cells(reference["intransigence_per_task"], f"{field}.intransigence_per_task", s)
    if "fwt_isolated_per_task" in reference:
        check.cells(
            reference["fwt_isolated_per_task"], f"{field}.fwt_isolated_per_task", max(s - 1, 0)
        )
    if "per_stage" in reference:
        check.cell_table(reference["per_stage"], f"{field}.per_stage", s)
    if "source" in reference:
        check.string(reference["source"], f"{field}.source", MAX_TEXT_LENGTH)


_COST_COUNTS = ("peak_memory_bytes", "parameters", "trainable_parameters", "samples")
_COST_KEYS = ("stage", "train_seconds", "eval_seconds", "memory_kind", "optimizer_steps")


def _check_cost(check: _Checker, cost: Any, T: int) -> None:
    """The ``cost`` section: ``per_stage`` (at most ``T`` objects, each with ``stage`` (integer
    ``0..T-1``), ``train_seconds`` and ``eval_seconds`` (finite numbers), ``memory_kind``
    (string), integers >= 0 ``peak_memory_bytes``, ``parameters``, ``trainable_parameters``,
    ``samples``, ``optimizer_steps``, and ``replay_memory`` (integer >= 0 or null)), optional
    ``summary`` (object of cells) and ``memory_kind`` (string or null)."""
    cost = check.mapping(cost, "cost")
    if "per_stage" not in cost:
        raise InvalidResultsError(check.source, "cost.per_stage", "missing")
    for i, entry in enumerate(check.array(cost["per_stage"], "cost.per_stage", most=T)):
        field = f"cost.per_stage[{i}]"
        entry = check.mapping(entry, field)
        for key in (*_COST_KEYS, *_COST_COUNTS, "replay_memory"):
            if key not in entry:
                raise InvalidResultsError(check.source, f"{field}.{key}", "missing")
        check.integer(entry["stage"], f"{field}.stage", 0, T - 1)
        for key in ("train_seconds", "eval_seconds"):
            check.number(entry[key], f"{field}.{key}")
        check.string(entry["memory_kind"], f"{field}.memory_kind")
        for key in (*_COST_COUNTS, "optimizer_steps"):
            check.integer(entry[key], f"{field}.{key}")
        if entry["replay_memory"] is not None:
            check.integer(entry["replay_memory"], f"{field}.replay_memory")
    if "summary" in cost:
        for key, value in check.mapping(cost["summary"], "cost.summary").items():
            if not _is_cell(value):
                check.fail(_key_path("cost.summary", key), "a finite number or null", value)
    if cost.get("memory_kind") is not None:
        check.string(cost["memory_kind"], "cost.memory_kind")


_CLASS_IL_STAGE_CELLS = ("new_accuracy", "mean_class_accuracy", "amca_per_stage")
_CLASS_IL_STAGE_CELLS += ("mean_class_forgetting_per_stage",)
_CLASS_IL_TABLES = ("seen_accuracy", "old_accuracy", "recency_bias")


def _check_class_incremental(check: _Checker, section: Any, T: int, s: int) -> None:
    """The ``class_incremental`` section (:mod:`continual_eval.class_incremental_results`):
    ``task_classes`` (``T`` non-empty arrays of distinct class ids ``0 .. num_classes - 1``, no
    class in two tasks), ``num_classes`` (integer ``1 ..`` :data:`MAX_CLASSES`, with ``s *
    num_classes ** 2 <=`` :data:`MAX_CONFUSION_CELLS`), ``confusion.stages`` (``s`` strings of
    space-separated ``true:predicted:count`` cells: class ids, ``true`` a class of a task ``<= i``
    at stage ``i``, ``count >= 1``, each cell at most once); optional ``confusion.encoding``,
    ``source`` (strings), ``prediction``, ``forgetting`` (names), ``class_order`` (``num_classes``
    integers), ``per_class_accuracy`` (``s`` rows of ``num_classes`` cells), ``class_forgetting``
    (``num_classes`` cells), ``amca``, ``mean_class_forgetting`` (cells), ``new_accuracy``,
    ``mean_class_accuracy``, ``amca_per_stage``, ``mean_class_forgetting_per_stage`` (``s`` cells),
    ``seen_accuracy``, ``old_accuracy``, ``recency_bias`` (objects of ``s`` cells each),
    ``last_accuracy``, ``average_incremental_accuracy`` (objects of cells)."""
    field = "class_incremental"
    section = check.mapping(section, field)
    for key in ("task_classes", "num_classes", "confusion"):
        if key not in section:
            raise InvalidResultsError(check.source, f"{field}.{key}", "missing")
    C = check.integer(section["num_classes"], f"{field}.num_classes", 1, MAX_CLASSES)
    if s * C * C > MAX_CONFUSION_CELLS:
        check.fail(
            f"{field}.num_classes",
            f"stages * num_classes**2 <= {MAX_CONFUSION_CELLS} (here {s} stages)",
            C,
        )
    owner: dict[int, int] = {}
    for j, classes in enumerate(check.array(section["task_classes"], f"{field}.task_classes", T)):
        at = f"{field}.task_classes[{j}]"
        for k, c in enumerate(check.array(classes, at, most=C)):
            check.integer(c, f"{at}[{k}]", 0, C - 1)
            if c in owner:
                check.fail(f"{at}[{k}]", "a class id of no other task", c)
            owner[c] = j
        if not classes:
            check.fail(at, "a non-empty array of class ids", classes)
    confusion = check.mapping(section["confusion"], f"{field}.confusion")
    if "stages" not in confusion:
        raise InvalidResultsError(check.source, f"{field}.confusion.stages", "missing")
    if "encoding" in confusion:
        check.string(confusion["encoding"], f"{field}.confusion.encoding", MAX_TEXT_LENGTH)
    for i, text in enumerate(check.array(confusion["stages"], f"{field}.confusion.stages", s)):
        at = f"{field}.confusion.stages[{i}]"
        if not isinstance(text, str):
            check.fail(at, 'a string of "true:predicted:count" cells', text)
        seen: set[tuple[int, int]] = set()
        for n, cell in enumerate(text.split(" ") if text else []):
            parts = cell.split(":")
            digits = all(p.isascii() and p.isdigit() and len(p) <= 16 for p in parts)
            if len(parts) != 3 or not digits:
                check.fail(f"{at} cell {n}", "true:predicted:count (decimal integers)", cell)
            true, pred, count = (int(p) for p in parts)
            if n >= C * C or true >= C or pred >= C or not 1 <= count <= _MAX_EXACT_INT:
                check.fail(
                    f"{at} cell {n}",
                    f"class ids below {C}, a count >= 1, at most {C * C} cells",
                    cell,
                )
            if owner.get(true, T) > i:
                check.fail(f"{at} cell {n}", f"a class of a task <= {i} (seen at stage {i})", cell)
            if (true, pred) in seen:
                check.fail(f"{at} cell {n}", "each confusion cell at most once", cell)
            seen.add((true, pred))
    for key in ("prediction", "forgetting"):
        if key in section:
            check.string(section[key], f"{field}.{key}")
    if "source" in section:
        check.string(section["source"], f"{field}.source", MAX_TEXT_LENGTH)
    if "class_order" in section:
        for k, c in enumerate(check.array(section["class_order"], f"{field}.class_order", C)):
            check.integer(c, f"{field}.class_order[{k}]", 0, C - 1)
    if "per_class_accuracy" in section:
        check.matrix(section["per_class_accuracy"], f"{field}.per_class_accuracy", s, C)
    if "class_forgetting" in section:
        check.cells(section["class_forgetting"], f"{field}.class_forgetting", C)
    for key in ("amca", "mean_class_forgetting"):
        _check_cell(check, section, key, field)
    for key in _CLASS_IL_STAGE_CELLS:
        if key in section:
            check.cells(section[key], f"{field}.{key}", s)
    for key in _CLASS_IL_TABLES:
        if key in section:
            check.cell_table(section[key], f"{field}.{key}", s)
    for key in ("last_accuracy", "average_incremental_accuracy"):
        if key in section:
            for name, value in check.mapping(section[key], f"{field}.{key}").items():
                if not _is_cell(value):
                    check.fail(_key_path(f"{field}.{key}", name), "a finite number or null", value)


def _check_matrices(
    check: _Checker, matrices: Any, T: int, s: int, evaluations: int | None
) -> None:
    """``matrices``: name -> one scorer's matrix (format_version 2); ``evaluations``: the length
    of ``curves.step`` (``None`` without curves)."""
    matrices = check.mapping(matrices, "matrices")
    if len(matrices) > MAX_MATRICES:
        check.fail("matrices", f"at most {MAX_MATRICES} matrices", f"{len(matrices)} entries")
    for name, section in matrices.items():
        field = _key_path("matrices", name)
        check.string(name, f"{field} (name)")
        section = check.mapping(section, field)
        for key in ("score", "scores", "baseline", "metrics"):
            if key not in section:
                raise InvalidResultsError(check.source, f"{field}.{key}", "missing")
        check.string(section["score"], f"{field}.score")
        if "higher_is_better" in section and type(section["higher_is_better"]) is not bool:
            check.fail(f"{field}.higher_is_better", "true or false", section["higher_is_better"])
        bounds = section.get("bounds")
        if bounds is not None:
            values = check.array(bounds, f"{field}.bounds", 2)
            for k, value in enumerate(values):
                if not (value is None or _is_cell(value)):
                    check.fail(f"{field}.bounds[{k}]", "a number or null (infinite)", value)
        check.matrix(section["scores"], f"{field}.scores", s, T)
        check.cells(section["baseline"], f"{field}.baseline", T)
        for key, value in check.mapping(section["metrics"], f"{field}.metrics").items():
            if not _is_cell(value):
                check.fail(_key_path(f"{field}.metrics", key), "a finite number or null", value)
        if "metrics_per_stage" in section:
            check.cell_table(section["metrics_per_stage"], f"{field}.metrics_per_stage", s)
        if "per_task" in section:
            check.cell_table(section["per_task"], f"{field}.per_task", max(s - 1, 0))
        if section.get("step_scores") is not None:
            if evaluations is None:
                raise InvalidResultsError(
                    check.source, f"{field}.step_scores", "step curves without a curves section"
                )
            check.matrix(section["step_scores"], f"{field}.step_scores", evaluations, T)
        if section.get("stability") is not None:
            _check_stability(check, section["stability"], T, f"{field}.stability")
        if section.get("plasticity") is not None:
            _check_plasticity(check, section["plasticity"], T, f"{field}.plasticity")


def _check_files(check: _Checker, files: Any, T: int) -> None:
    files = check.mapping(files, "files")
    for name, entry in files.items():
        check.mapping(entry, _key_path("files", name))
    for csv_name in files:
        entry, field = files[csv_name], _key_path("files", csv_name)
        for key in ("sha256", "stages"):
            if key not in entry:
                raise InvalidResultsError(check.source, f"{field}.{key}", "missing")
        digest = entry["sha256"]
        if not (isinstance(digest, str) and len(digest) == 64 and digest.isascii()) or any(
            c not in "0123456789abcdef" for c in digest
        ):
            check.fail(f"{field}.sha256", "64 lowercase hexadecimal digits", digest)
        check.integer(entry["stages"], f"{field}.stages", 0, T)
    check.nesting(files, "files", 2)


_REQUIRED = (
    "format_version",
    "num_tasks",
    "task_names",
    "stages_completed",
    "scores",
    "baseline",
    "metrics",
)


def validate_results(document: Any, source: str | os.PathLike = "results.json") -> dict[str, Any]:
    """Check a parsed ``results.json`` document against the schema of this module's docstring.

    Returns the document unchanged; raises :class:`InvalidResultsError` naming ``source`` and the
    first offending field. Linear in the size of the document (about 0.1 s for T = 500 with
    curves).
    """
    check = _Checker(source)
    doc = check.mapping(document, "")
    for key in _REQUIRED:
        if key not in doc:
            raise InvalidResultsError(source, key, "missing")
    version = doc["format_version"]
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise InvalidResultsError(
            source,
            "format_version",
            f"unsupported format_version: expected one of {SUPPORTED_VERSIONS}, found "
            f"{_describe(version)}",
        )
    T = check.integer(doc["num_tasks"], "num_tasks", 1, MAX_TASKS)
    for j, name in enumerate(check.array(doc["task_names"], "task_names", T)):
        check.string(name, f"task_names[{j}]")
    s = check.integer(doc["stages_completed"], "stages_completed", 0, T)
    check.matrix(doc["scores"], "scores", s, T)
    check.cells(doc["baseline"], "baseline", T)
    for key, value in check.mapping(doc["metrics"], "metrics").items():
        if not _is_cell(value):
            check.fail(_key_path("metrics", key), "a finite number or null", value)
    if "metrics_per_stage" in doc:
        check.cell_table(doc["metrics_per_stage"], "metrics_per_stage", s)
    if "per_task" in doc:
        check.cell_table(doc["per_task"], "per_task", max(s - 1, 0))
    if "conventions" in doc:
        for key, value in check.mapping(doc["conventions"], "conventions").items():
            check.string(value, _key_path("conventions", key))
    if "metadata" in doc:
        _check_metadata(check, doc["metadata"], T)
    if doc.get("curves") is not None:
        _check_curves(check, doc["curves"], T)
    if doc.get("stability") is not None:
        _check_stability(check, doc["stability"], T)
    if "run_id" in doc:
        check.string(doc["run_id"], "run_id")
    if "files" in doc:
        _check_files(check, doc["files"], T)
    if "matrices" in doc:
        curves = doc.get("curves")
        evaluations = None if curves is None else len(curves["step"])
        _check_matrices(check, doc["matrices"], T, s, evaluations)
    if doc.get("cost") is not None:
        _check_cost(check, doc["cost"], T)
    if doc.get("reference") is not None:
        _check_reference(check, doc["reference"], T, s)
    if doc.get("class_incremental") is not None:
        _check_class_incremental(check, doc["class_incremental"], T, s)
    known = {*_REQUIRED, "metrics_per_stage", "per_task", "conventions", "metadata"}
    known |= {"curves", "stability", "run_id", "files", "matrices"}
    known |= {"cost", "reference", "class_incremental"}
    for key, value in doc.items():
        if key not in known:
            check.nesting(value, _key_path("", key), 2)
    return doc


def _refuse_constant(name: str) -> None:
    raise ValueError(f"the non-standard constant {name} (not JSON; the writer stores null)")


def parse_results_json(text: str, source: str | os.PathLike = "results.json") -> Any:
    """``json.loads(text)`` with every failure as :class:`InvalidResultsError`: syntax errors (with
    line and column), ``NaN``/``Infinity``, integers too long to convert, and nesting too deep for
    the parser (``RecursionError``)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as err:
        raise InvalidResultsError(
            source, "", f"not valid JSON: {err.msg} at line {err.lineno} column {err.colno}"
        ) from None
    except RecursionError:
        raise InvalidResultsError(
            source, "", f"nested too deeply to parse (limit {MAX_DEPTH} levels)"
        ) from None
    except ValueError as err:  # NaN/Infinity, integers beyond sys.get_int_max_str_digits()
        raise InvalidResultsError(
            source, "", f"not valid JSON: {printable(str(err), 160)}"
        ) from None


def read_results_json(
    path: str | os.PathLike, *, max_bytes: int = MAX_FILE_BYTES
) -> dict[str, Any]:
    """Read, parse and validate the ``results.json`` at ``path`` (a file).

    Refuses (:class:`InvalidResultsError`) anything but a regular file of at most ``max_bytes``
    bytes of UTF-8 JSON following the schema; ``FileNotFoundError``/``OSError`` pass through.
    """
    path = Path(path)
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise InvalidResultsError(path, "", "not a regular file")
    if info.st_size > max_bytes:
        raise InvalidResultsError(
            path, "", f"file of {info.st_size} bytes exceeds the limit of {max_bytes} bytes"
        )
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew since stat
        raise InvalidResultsError(path, "", f"file exceeds the limit of {max_bytes} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidResultsError(
            path, "", f"not UTF-8 text (invalid byte at offset {err.start})"
        ) from None
    return validate_results(parse_results_json(text, path), path)

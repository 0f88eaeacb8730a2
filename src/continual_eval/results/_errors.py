"""Naming the field of a failed validation:
[`InvalidResultsError`][continual_eval.results.InvalidResultsError], and the words for what a
msgspec type expects (``"an integer in [1, 2000]"``) and what a file holds instead
(``"string of 201 characters"``), with msgspec's path made whole (a key of an object where msgspec
writes ``[...]``)."""

from __future__ import annotations

import json
import os
import re
import types
import typing
import unicodedata
from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta, Struct

__all__ = ["InvalidResultsError", "describe", "key_path", "printable", "schema_error"]

_SHOWN_CHARS = 40  # characters of a found string or a key quoted in a message
_UNPRINTABLE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def _refuse_constant(name: str) -> None:
    raise ValueError(f"the constant {name} (not JSON; the writer stores null)")


def _parse_again(text: str) -> tuple[Any, str | None]:
    """``(the parsed JSON, None)``, or ``(None, why it is no JSON)`` (``(None, None)``: too deep
    for Python's parser, which msgspec's is not)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant), None
    except json.JSONDecodeError as err:
        return None, f"not valid JSON: {err.msg} at line {err.lineno} column {err.colno}"
    except ValueError as err:  # NaN/Infinity; or an integer too long for Python's parser
        constant = str(err).startswith("the constant")
        return None, f"not valid JSON: {printable(str(err), 160)}" if constant else None
    except RecursionError:
        return None, None


class InvalidResultsError(ValueError):
    """A ``results.json`` that does not follow the schema.

    ``source`` is the file, ``field`` the JSON path of the offending value (``""`` when the file as
    a whole is at fault), ``problem`` what is wrong; ``str(err)`` is one line naming all three.
    """

    def __init__(self, source: str | os.PathLike[str], field: str, problem: str) -> None:
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


def describe(value: Any) -> str:
    """The JSON type of ``value`` and, when short, the value itself."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        text = str(value) if abs(value) < 10**24 else ""
        return f"integer {text}" if text else f"integer of {len(str(abs(value)))} digits"
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
    return type(value).__name__


def key_path(parent: str, key: str | int) -> str:
    """``parent.key`` (``parent[3]`` for an index, ``parent["a b"]`` for other keys)."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if key.isidentifier():
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{printable(json.dumps(key), _SHOWN_CHARS)}]"


# ---------------------------------------------------------------------- what a type expects
def _strip(tp: Any) -> tuple[Any, list[Meta]]:
    """``tp`` without ``Annotated`` (and its constraints)."""
    metas: list[Meta] = []
    while typing.get_origin(tp) is Annotated:
        metas += [m for m in tp.__metadata__ if isinstance(m, Meta)]
        tp = tp.__origin__
    return tp, metas


def _arms(tp: Any) -> list[Any]:
    """The members of a union (``[tp]`` for anything else)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        return list(typing.get_args(tp))
    return [tp]


def _expected_one(tp: Any) -> str:
    tp, metas = _strip(tp)
    meta = metas[0] if metas else Meta()
    if tp is float:
        return "a finite number"
    if tp is bool:
        return "true or false"
    if tp is int:
        if meta.ge is not None and meta.le is not None and meta.le < 2**53:
            return f"an integer in [{meta.ge}, {meta.le}]"
        return f"an integer >= {meta.ge}" if meta.ge == 0 or meta.ge == 1 else "an integer"
    if tp is str:
        if meta.pattern == "^[0-9a-f]{64}$":
            return "64 lowercase hexadecimal digits"
        return (
            f"a string of at most {meta.max_length} characters" if meta.max_length else "a string"
        )
    if typing.get_origin(tp) is Literal:
        return f"one of ({', '.join(map(repr, typing.get_args(tp)))})"
    if typing.get_origin(tp) is list:
        if meta.min_length is not None and meta.min_length == meta.max_length:
            return f"an array of {meta.min_length} items"
        return "an array"
    if typing.get_origin(tp) is dict and meta.min_length:
        return f"an object of 1 to {meta.max_length} entries"
    return "an object"


def expected(tp: Any) -> str:
    """What a value of type ``tp`` must be, in words (``"a finite number or null"``)."""
    arms = _arms(_strip(tp)[0])
    if len(arms) == 1:
        arms = [tp]  # not a union: keep its constraints
    real = [arm for arm in arms if arm is not type(None)]
    words = " or ".join(dict.fromkeys(_expected_one(arm) for arm in real))
    return words + " or null" if len(real) < len(arms) else words


# ---------------------------------------------------------------------- locating a failure
_PATH = re.compile(r" - at `(?P<path>[^`]*)`$|( - at `key` in `(?P<keys>[^`]*)`)$", re.DOTALL)
_SEGMENT = re.compile(r"\.(?P<name>\w+)|\[(?P<index>\d+)\]|\[(?P<any>\.\.\.)\]")


def _inner(tp: Any) -> Any:
    """The container or Struct type of ``tp`` (``Annotated`` and ``| None`` removed)."""
    arms = [arm for arm in _arms(_strip(tp)[0]) if arm is not type(None)]
    return _strip(arms[0])[0] if len(arms) == 1 else _strip(tp)[0]


def _child_type(tp: Any, key: str | int) -> Any:
    tp = _inner(tp)
    if isinstance(tp, type) and issubclass(tp, Struct):
        hints = typing.get_type_hints(tp, include_extras=True)  # with the constraints
        for info in msgspec.structs.fields(tp):
            if info.encode_name == key:
                return hints[info.name]
        return Any
    args = typing.get_args(tp)
    return args[-1] if args else Any


def _first_bad_key(value: dict[str, Any], tp: Any, check_keys: bool) -> str | None:
    """The first key of the object ``value`` (of type ``tp``) whose key (``check_keys``) or value
    fails its type."""
    key_type, value_type = typing.get_args(_inner(tp))
    for key, item in value.items():
        try:
            msgspec.convert(key if check_keys else item, key_type if check_keys else value_type)
        except msgspec.ValidationError:
            return str(key)
    return None


def _locate(
    err: msgspec.ValidationError, document: Any, root: Any
) -> tuple[str, Any, Any, str | None]:
    """``(field, found value, its type, missing field)`` of a validation error of ``document``
    (the parsed JSON) against the type ``root``: msgspec's path with every ``[...]`` (a key of an
    object) replaced by the key that fails."""
    text = str(err)
    match = _PATH.search(text)
    path = (match["path"] or match["keys"]) if match else "$"
    missing = re.match(r"Object missing required field `(?P<name>[^`]+)`", text)
    field: str = ""
    value: Any = document
    tp: Any = root
    for seg in _SEGMENT.finditer(path.removeprefix("$")):
        key: str | int | None = seg["name"] or (int(seg["index"]) if seg["index"] else None)
        if key is None:  # an object's value: find which
            key = _first_bad_key(value, tp, False) if isinstance(value, dict) else None
            if key is None:
                break
        field, tp = key_path(field, key), _child_type(tp, key)
        if isinstance(value, dict):
            value = value.get(key)
        else:
            index = key if isinstance(key, int) else len(value or ())
            value = value[index] if isinstance(value, list) and index < len(value) else None
    if match and match["keys"] is not None and isinstance(value, dict):
        bad = _first_bad_key(value, tp, True)
        return f"{field} (a key)", bad, typing.get_args(_inner(tp))[0], None
    return field, value, tp, missing["name"] if missing else None


def schema_error(
    err: msgspec.ValidationError,
    document: Any,
    source: str | os.PathLike[str],
    *,
    text: str | None = None,
    root: Any,
    prefix: str = "",
) -> InvalidResultsError:
    """One [`InvalidResultsError`][continual_eval.results.InvalidResultsError] naming the field of
    ``err``, a validation error of ``document`` (the parsed JSON; ``None``: parsed again from
    ``text``, only on this error path) against the type ``root``, its fields under ``prefix``."""
    if document is None and text is not None:
        document, syntax = _parse_again(text)
        if syntax is not None:  # the file is no JSON: say so rather than name a field
            return InvalidResultsError(source, "", syntax)
    field, value, tp, missing = _locate(err, document, root)
    if prefix:
        field = prefix + ("." if field and not field.startswith("[") else "") + field
    if missing is not None:
        return InvalidResultsError(source, key_path(field, missing), "missing")
    if document is None or tp is Any:  # msgspec's words (the JSON could not be parsed again)
        problem = re.sub(
            r"^Expected (.+), got (.+)$", r"expected \1, found \2", str(err).split(" - at ")[0]
        )
        return InvalidResultsError(source, field, problem[:1].lower() + problem[1:])
    return InvalidResultsError(source, field, f"expected {expected(tp)}, found {describe(value)}")

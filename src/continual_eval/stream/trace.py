"""Reward-stream traces: one record per step, stored column-wise, read and written as JSON lines.

An [`EpisodeTrace`][continual_eval.stream.EpisodeTrace] is what every metric in
[`continual_eval.stream`][continual_eval.stream] consumes. It holds the reward and the regime label
of each recorded step, the label's *origin* (the regime an alias
revisits: ``a_again`` with origin ``a``), and optional per-step readings: reward components, an
invalid-action flag, the policy's effective rank and whether the step ended an episode.

Validation happens once, here: a non-finite reward, a step number that does not increase, or an
alias whose origin never occurs in the trace is an error naming the step or the label.

JSON lines are decoded against a strict typed schema
([`StepRecord`][], msgspec): a value of the wrong type is an error
naming ``file:line`` and the field, never coerced (``"false"`` is not a boolean, ``7`` is not a
label, ``1.7`` is not a step). [`read_jsonl`][continual_eval.stream.read_jsonl] decodes the file a
block at a time straight into column arrays, so no per-line Python object outlives its block.
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated, Any

import msgspec
import numpy as np

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_LINE_BYTES",
    "EpisodeStep",
    "EpisodeTrace",
    "StepRecord",
    "read_jsonl",
    "write_jsonl",
]

_INT64 = np.iinfo(np.int64)


class StepRecord(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The schema of one JSON-lines trace record (one step).

    ``step``: a JSON integer in the signed 64-bit range (``1.0``, ``1e23`` and ``"1"`` are errors).
    ``reward``: a JSON number (integers are read as floats; booleans, strings and ``null`` are
    errors; JSON has no NaN or infinity). ``regime_id`` and ``regime_origin``: strings (``7`` is not
    the label ``"7"``). ``components``: an object mapping names to numbers. ``invalid_action`` and
    ``episode_end``: ``true``/``false``. ``effective_rank``: a number. ``null`` means "not
    recorded" for the optional ``regime_origin``, ``components``, ``invalid_action`` and
    ``effective_rank``; an omitted ``episode_end`` is ``false`` and ``null`` there is an error.
    Any other field is an error (a misspelt ``episode_end`` would otherwise be ignored).
    """

    step: Annotated[int, msgspec.Meta(ge=int(_INT64.min), le=int(_INT64.max))]
    reward: float
    regime_id: str
    regime_origin: str | None = None
    components: dict[str, float] | None = None
    invalid_action: bool | None = None
    effective_rank: float | None = None
    episode_end: bool = False


_STEP_DECODER = msgspec.json.Decoder(StepRecord)
_GET = {name: operator.attrgetter(name) for name in StepRecord.__struct_fields__}


def _column(recs: list[StepRecord], field: str, dtype: Any) -> np.ndarray:
    """One field of every record as an array (``map``/``fromiter``: no Python loop per record)."""
    return np.fromiter(map(_GET[field], recs), dtype=dtype, count=len(recs))


_SCHEMA_MESSAGE = re.compile(r"(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?", re.DOTALL)


def schema_error_message(err: msgspec.DecodeError, what: str = "a trace line") -> str:
    """A readable message for a msgspec decode/validation error: which field, what was wrong."""
    text = str(err)
    if not isinstance(err, msgspec.ValidationError):
        return f"not valid JSON ({text.removeprefix('JSON is malformed: ')})"
    match = _SCHEMA_MESSAGE.fullmatch(text)
    msg, path = (match["msg"], match["path"]) if match else (text, None)
    msg = msg[:1].lower() + msg[1:]
    if path:
        field = path.lstrip(".")
        if field.endswith("[...]"):  # a value inside an object, e.g. one of `components`
            return f"a value in field `{field[:-5]}`: {msg}"
        return f"field `{field}`: {msg}"
    if msg.startswith("expected `object`"):
        return f"{what} must be a JSON object, {msg.split(', ', 1)[-1]}"
    return msg.removeprefix("object ")


class _NonFinite:
    """Stands in for the ``NaN``/``Infinity`` literals Python's ``json`` writes (not JSON)."""

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _explain_line(raw: bytes, err: msgspec.DecodeError) -> str:
    """Why one line failed to decode; names a NaN/Infinity field (and its step) when that is why."""
    if not isinstance(err, msgspec.ValidationError) and (b"NaN" in raw or b"Infinity" in raw):
        try:
            value = json.loads(raw, parse_constant=_NonFinite)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict):
            comps = value.get("components")
            bad = [(k, v) for k, v in value.items() if isinstance(v, _NonFinite)]
            if isinstance(comps, dict):
                bad += [
                    (f"components.{k}", v) for k, v in comps.items() if isinstance(v, _NonFinite)
                ]
            if bad:
                field, lit = bad[0]
                step = value.get("step")
                at = f" at step {step}" if isinstance(step, int) else ""
                return (
                    f"field `{field}`{at} is {lit.literal}, which is not a JSON number; "
                    "values must be finite"
                )
    return schema_error_message(err)


@dataclass(frozen=True)
class EpisodeStep:
    """One recorded step: ``reward`` under regime ``regime_id`` at step number ``step``.

    ``regime_origin`` names the regime this label revisits (``None``: the label is its own origin).
    ``components`` maps reward-component names to their values at this step; ``invalid_action``,
    ``effective_rank`` and ``episode_end`` are ``None``/``False`` when not recorded.
    """

    step: int
    reward: float
    regime_id: str
    regime_origin: str | None = None
    components: Mapping[str, float] | None = None
    invalid_action: bool | None = None
    effective_rank: float | None = None
    episode_end: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON-lines record: required keys always, optional keys only when recorded."""
        out: dict[str, Any] = {
            "step": int(self.step),
            "reward": float(self.reward),
            "regime_id": self.regime_id,
        }
        if self.regime_origin is not None:
            out["regime_origin"] = self.regime_origin
        if self.components:
            out["components"] = {k: float(v) for k, v in self.components.items()}
        if self.invalid_action is not None:
            out["invalid_action"] = bool(self.invalid_action)
        if self.effective_rank is not None:
            out["effective_rank"] = float(self.effective_rank)
        if self.episode_end:
            out["episode_end"] = True
        return out

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> EpisodeStep:
        """Inverse of [`to_dict`][continual_eval.stream.EpisodeStep.to_dict], validated against
        [`StepRecord`][] (no coercion)."""
        data = dict(record) if isinstance(record, Mapping) else record
        try:
            rec = msgspec.convert(data, StepRecord, strict=True)
        except msgspec.ValidationError as err:
            raise ValueError(f"trace record: {schema_error_message(err, 'a record')}") from None
        return cls.from_record(rec)

    @classmethod
    def from_record(cls, rec: StepRecord) -> EpisodeStep:
        """The step a decoded [`StepRecord`][] describes; a
        non-finite number is an error."""
        numbers = {"reward": rec.reward, "effective_rank": rec.effective_rank}
        numbers.update({f"components.{k}": v for k, v in (rec.components or {}).items()})
        for field, value in numbers.items():
            if value is not None and not math.isfinite(value):
                raise ValueError(f"field `{field}` at step {rec.step} is {value}; must be finite")
        return cls(
            step=rec.step,
            reward=rec.reward,
            regime_id=rec.regime_id,
            regime_origin=rec.regime_origin,
            components=rec.components,
            invalid_action=rec.invalid_action,
            effective_rank=rec.effective_rank,
            episode_end=rec.episode_end,
        )


def _optional_column(what: str, values: Any, step: np.ndarray) -> np.ndarray:
    """A per-step float column (NaN: not recorded) of as many values as steps; an infinite value
    (or an ``invalid_action`` other than 0/1) is an error naming the step."""
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if len(arr) != len(step):
        raise ValueError(f"{what} has {len(arr)} values for {len(step)} steps")
    if what == "invalid_action":
        bad = np.flatnonzero(~np.isnan(arr) & (arr != 0.0) & (arr != 1.0))
    else:
        bad = np.flatnonzero(np.isinf(arr))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{what} at step {int(step[i])} is {arr[i]!r}")
    return arr


def _resolve_origins(names: Sequence[str], declared: Mapping[str, str]) -> dict[str, str]:
    """Map every label to its root origin, following alias chains; reject unknown origins/cycles."""
    present = set(names)
    roots: dict[str, str] = {}
    for name in names:
        seen = [name]
        cur = name
        while cur in declared and declared[cur] != cur:
            nxt = declared[cur]
            if nxt not in present:
                raise ValueError(
                    f"regime label {cur!r} is declared an alias of {nxt!r}, "
                    f"but {nxt!r} never occurs in the trace"
                )
            if nxt in seen:
                raise ValueError(f"regime labels form an alias cycle: {' -> '.join([*seen, nxt])}")
            seen.append(nxt)
            cur = nxt
        roots[name] = cur
    return roots


class EpisodeTrace:
    """A validated reward stream, stored column-wise.

    Build it from [`EpisodeStep`][continual_eval.stream.EpisodeStep] records
    (``EpisodeTrace(steps=[...])``) or, for long traces, from arrays
    ([`from_arrays`][continual_eval.stream.EpisodeTrace.from_arrays]). Columns: ``step`` (int64,
    strictly increasing), ``reward`` (float64, finite), ``regime_code`` (int64 index into
    ``regime_names``, which lists labels in order of first appearance), ``origin_of`` (label ->
    declared origin, aliases only), ``components`` (name -> float64 column; NaN where a step did not
    record it), ``invalid_action`` and ``effective_rank`` (float64 with NaN where unrecorded, or
    ``None`` when no step recorded them), ``episode_end`` (bool).
    """

    step: np.ndarray
    reward: np.ndarray
    regime_code: np.ndarray
    regime_names: tuple[str, ...]
    origin_of: dict[str, str]
    components: dict[str, np.ndarray]
    invalid_action: np.ndarray | None
    effective_rank: np.ndarray | None
    episode_end: np.ndarray | None

    def __init__(
        self,
        steps: Iterable[EpisodeStep] | None = None,
        *,
        _columns: Mapping[str, Any] | None = None,
    ) -> None:
        cols = dict(_columns) if _columns is not None else _columns_from_steps(list(steps or []))
        n = len(cols["reward"])
        step = np.asarray(cols["step"], dtype=np.int64).reshape(-1)
        reward = np.asarray(cols["reward"], dtype=np.float64).reshape(-1)
        code = np.asarray(cols["regime_code"], dtype=np.int64).reshape(-1)
        names = tuple(str(s) for s in cols["regime_names"])
        if n == 0:
            raise ValueError("an EpisodeTrace needs at least one step")
        if len(step) != n or len(code) != n:
            raise ValueError(
                f"trace columns differ in length: step {len(step)}, reward {n}, regime {len(code)}"
            )
        bad = np.flatnonzero(~np.isfinite(reward))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"reward at step {int(step[i])} (position {i}) is {reward[i]!r}; "
                "rewards must be finite"
            )
        dec = np.flatnonzero(np.diff(step) <= 0)
        if dec.size:
            i = int(dec[0]) + 1
            raise ValueError(
                f"step numbers must increase: step {int(step[i])} at position {i} follows "
                f"step {int(step[i - 1])}"
            )
        if code.min() < 0 or code.max() >= len(names):
            raise ValueError("regime codes must index regime_names")
        used = np.unique(code)
        if len(used) < len(names):  # keep only labels that occur, in the given order
            remap = np.full(len(names), -1, dtype=np.int64)
            remap[used] = np.arange(len(used))
            code = remap[code]
            names = tuple(names[i] for i in used)
        origin_of = {str(k): str(v) for k, v in (cols.get("origin_of") or {}).items()}
        for label in origin_of:
            if label not in names:
                raise ValueError(f"origin declared for regime label {label!r}, which never occurs")
        roots = _resolve_origins(names, origin_of)
        components = {
            str(name): _optional_column(f"component {name!r}", col, step)
            for name, col in (cols.get("components") or {}).items()
        }
        optional: dict[str, np.ndarray | None] = {}
        for key in ("invalid_action", "effective_rank"):
            col = cols.get(key)
            arr = None if col is None else _optional_column(key, col, step)
            optional[key] = None if arr is None or np.isnan(arr).all() else arr
        end = cols.get("episode_end")
        end_arr = None if end is None else np.asarray(end, dtype=bool).reshape(-1)
        if end_arr is not None and len(end_arr) != n:
            raise ValueError(f"episode_end has {len(end_arr)} values for {n} steps")
        self.step = step
        self.reward = reward
        self.regime_code = code
        self.regime_names = names
        self.origin_of = origin_of
        self.components = components
        self.invalid_action = optional["invalid_action"]
        self.effective_rank = optional["effective_rank"]
        self.episode_end = end_arr
        self._roots = roots

    @classmethod
    def from_arrays(
        cls,
        reward: Sequence[float] | np.ndarray,
        regime_id: Sequence[str] | np.ndarray,
        *,
        step: Sequence[int] | np.ndarray | None = None,
        regime_names: Sequence[str] | None = None,
        origin_of: Mapping[str, str] | None = None,
        components: Mapping[str, Sequence[float] | np.ndarray] | None = None,
        invalid_action: Sequence[float] | np.ndarray | None = None,
        effective_rank: Sequence[float] | np.ndarray | None = None,
        episode_end: Sequence[bool] | np.ndarray | None = None,
    ) -> EpisodeTrace:
        """Build a trace from columns.

        ``regime_id`` is either one label per step, or (with ``regime_names``) one integer code
        per step indexing ``regime_names``. ``step`` defaults to ``0, 1, ..., n-1``.
        ``origin_of`` maps each alias label to the label it revisits.
        """
        reward = np.asarray(reward, dtype=np.float64)
        if regime_names is not None:
            code = np.asarray(regime_id, dtype=np.int64)
            names = list(regime_names)
        else:
            labels = np.asarray(regime_id, dtype=object)
            uniq, first, inv = np.unique(labels, return_index=True, return_inverse=True)
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(len(order))
            code = rank[inv.reshape(-1)]
            names = [str(uniq[i]) for i in order]
        cols = {
            "step": np.arange(len(reward)) if step is None else step,
            "reward": reward,
            "regime_code": code,
            "regime_names": names,
            "origin_of": dict(origin_of or {}),
            "components": dict(components or {}),
            "invalid_action": invalid_action,
            "effective_rank": effective_rank,
            "episode_end": episode_end,
        }
        return cls(_columns=cols)

    def __repr__(self) -> str:
        return (
            f"EpisodeTrace({len(self)} steps, regimes={list(self.regime_names)}, "
            f"origins={self.origin_of}, components={sorted(self.components)})"
        )

    def __len__(self) -> int:
        return len(self.reward)

    @property
    def regime_id(self) -> list[str]:
        """The label of every step (a Python list; prefer ``regime_code`` for long traces)."""
        names = self.regime_names
        return [names[c] for c in self.regime_code.tolist()]

    def root_of(self, label: str) -> str:
        """The regime a label ultimately revisits (itself when it is not an alias)."""
        return self._roots[label]

    @property
    def roots(self) -> dict[str, str]:
        """Label -> root origin, for every label in the trace."""
        return dict(self._roots)

    def check_components(self, names: Iterable[str]) -> None:
        """Raise naming the first component in ``names`` that this trace never recorded."""
        for name in names:
            if name not in self.components:
                known = sorted(self.components) or "none"
                raise ValueError(
                    f"unknown reward component {name!r}; this trace records components: {known}"
                )

    @property
    def steps(self) -> list[EpisodeStep]:
        """The trace as [`EpisodeStep`][continual_eval.stream.EpisodeStep] records (slow for long
        traces)."""
        out = []
        names = self.regime_names
        for i in range(len(self)):
            label = names[int(self.regime_code[i])]
            comps = {
                k: float(v[i]) for k, v in self.components.items() if not math.isnan(float(v[i]))
            }
            inv = None
            if self.invalid_action is not None and not np.isnan(self.invalid_action[i]):
                inv = bool(self.invalid_action[i])
            rank = None
            if self.effective_rank is not None and not np.isnan(self.effective_rank[i]):
                rank = float(self.effective_rank[i])
            out.append(
                EpisodeStep(
                    step=int(self.step[i]),
                    reward=float(self.reward[i]),
                    regime_id=label,
                    regime_origin=self.origin_of.get(label),
                    components=comps or None,
                    invalid_action=inv,
                    effective_rank=rank,
                    episode_end=bool(self.episode_end[i])
                    if self.episode_end is not None
                    else False,
                )
            )
        return out


def _columns_from_steps(steps: list[EpisodeStep]) -> dict[str, Any]:
    """Columns for [`EpisodeTrace`][continual_eval.stream.EpisodeTrace] from records; origins must
    agree per label."""
    names: dict[str, int] = {}
    origin_of: dict[str, str] = {}
    code = np.empty(len(steps), dtype=np.int64)
    comp_names: dict[str, None] = {}
    for i, s in enumerate(steps):
        c = names.setdefault(s.regime_id, len(names))
        code[i] = c
        if s.regime_origin is not None and s.regime_origin != s.regime_id:
            prev = origin_of.setdefault(s.regime_id, s.regime_origin)
            if prev != s.regime_origin:
                raise ValueError(
                    f"regime label {s.regime_id!r} at step {s.step} has origin "
                    f"{s.regime_origin!r}, but earlier steps gave {prev!r}"
                )
        for k in s.components or {}:
            comp_names.setdefault(k, None)
    nan = float("nan")
    components = {
        k: np.array([(s.components or {}).get(k, nan) for s in steps], dtype=np.float64)
        for k in comp_names
    }
    any_inv = any(s.invalid_action is not None for s in steps)
    any_rank = any(s.effective_rank is not None for s in steps)
    return {
        "step": np.array([s.step for s in steps], dtype=np.int64),
        "reward": np.array([s.reward for s in steps], dtype=np.float64),
        "regime_code": code,
        "regime_names": list(names),
        "origin_of": origin_of,
        "components": components,
        "invalid_action": (
            np.array([nan if s.invalid_action is None else float(s.invalid_action) for s in steps])
            if any_inv
            else None
        ),
        "effective_rank": (
            np.array([nan if s.effective_rank is None else float(s.effective_rank) for s in steps])
            if any_rank
            else None
        ),
        "episode_end": np.array([bool(s.episode_end) for s in steps], dtype=bool),
    }


class _LineTooLongError(Exception):
    """Raised by `_blocks`: the line being read is longer than the line cap."""


class _FileTooLargeError(Exception):
    """Raised by `_blocks`: the source holds more bytes than the file cap."""


def _blocks(
    fh: IO[bytes], block_size: int, max_line_bytes: int | None, max_file_bytes: int | None
) -> Iterator[bytes]:
    """Whole lines, about ``block_size`` bytes at a time (the last may lack its newline).

    Never holds more than ``block_size`` bytes plus one unfinished line, which may grow to
    ``max_line_bytes`` before `_LineTooLongError` is raised; never reads more than
    ``max_file_bytes + 1`` bytes (then `_FileTooLargeError`). Both are raised when the lines
    before the offending one have been consumed, so the reader's line count names it.
    """
    pending: list[bytes] = []
    pending_bytes = 0
    left = math.inf if max_file_bytes is None else max_file_bytes + 1
    line_cap = math.inf if max_line_bytes is None else max_line_bytes
    while data := fh.read(int(min(block_size, left))):
        if not isinstance(data, bytes):
            raise TypeError(
                "a trace source must yield bytes (open it in binary mode), got "
                f"{type(data).__name__}"
            )
        left -= len(data)
        if left <= 0:
            raise _FileTooLargeError
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            pending.append(data)
            pending_bytes += len(data)
            if pending_bytes > line_cap:
                raise _LineTooLongError
            continue
        yield b"".join([*pending, data[:cut]]) if pending else data[:cut]
        pending = [data[cut:]] if cut < len(data) else []
        pending_bytes = len(data) - cut
        if pending_bytes > line_cap:
            raise _LineTooLongError
    if pending:
        yield b"".join(pending)


class _ColumnReader:
    """Decodes JSON-lines blocks into column arrays; keeps no per-line Python objects."""

    def __init__(self, path: str | Path, max_line_bytes: int | None = None) -> None:
        self.path = path
        self.max_line_bytes = max_line_bytes
        self.n = 0
        self.next_line = 1  # the number of the first line of the next block
        self.names: dict[str, int] = {}
        self.origin_of: dict[str, tuple[str, int]] = {}  # label -> (origin, line declaring it)
        self.last_step: int | None = None
        self.columns: dict[str, list[np.ndarray]] = {
            "step": [],
            "reward": [],
            "code": [],
            "end": [],
        }
        self.optional: dict[str, list[tuple[int, np.ndarray]]] = {}  # name -> (offset, values)
        self.components: dict[str, list[tuple[int, np.ndarray]]] = {}

    def error(self, line: int, message: str) -> ValueError:
        return ValueError(f"{self.path}:{line}: {message}")

    def line_too_long(self, line: int) -> ValueError:
        return self.error(
            line,
            f"line longer than {self.max_line_bytes} bytes, the limit max_line_bytes "
            "(--max-line-bytes); a trace record is one JSON object per line, usually under a "
            "kilobyte: is this a trace file? Raise the limit if its lines really are this long",
        )

    def decode_skipping_blanks(
        self, raw_lines: list[bytes], first_line: int
    ) -> tuple[list[StepRecord], list[int]]:
        """Line by line: the records and their line numbers; the first bad line is an error."""
        recs, lines = [], []
        for i, raw in enumerate(raw_lines):
            if not raw.strip():
                continue
            try:
                recs.append(_STEP_DECODER.decode(raw))
            except msgspec.DecodeError as err:
                raise self.error(first_line + i, _explain_line(raw, err)) from None
            except RecursionError:
                raise self.error(first_line + i, "JSON nested too deeply") from None
            lines.append(first_line + i)
        return recs, lines

    def add(self, block: bytes) -> None:
        """Decode one block of whole lines, exactly one JSON object per non-blank line."""
        raw_lines = (block[:-1] if block.endswith(b"\n") else block).split(b"\n")
        first_line = self.next_line
        cap = self.max_line_bytes
        if cap is not None and len(block) > cap and max(map(len, raw_lines)) > cap:
            longest = next(i for i, raw in enumerate(raw_lines) if len(raw) > cap)
            raise self.line_too_long(first_line + longest)
        self.next_line += len(raw_lines)
        try:  # the fast path: no blank lines, no errors
            recs = list(map(_STEP_DECODER.decode, raw_lines))
            record_lines = range(first_line, first_line + len(recs))
        except (msgspec.DecodeError, RecursionError):
            recs, record_lines = self.decode_skipping_blanks(raw_lines, first_line)
        del raw_lines
        n = len(recs)
        if n == 0:
            return
        step = _column(recs, "step", np.int64)
        bad = np.flatnonzero(np.diff(step) <= 0) + 1
        if self.last_step is not None and step[0] <= self.last_step:
            bad = np.zeros(1, dtype=np.int64)
        if bad.size:
            i = int(bad[0])
            before = self.last_step if i == 0 else int(step[i - 1])
            raise self.error(
                record_lines[i],
                f"step {int(step[i])} follows step {before}; step numbers must increase",
            )
        self.last_step = int(step[-1])
        labels = list(map(_GET["regime_id"], recs))
        names = self.names
        for label in dict.fromkeys(labels):  # new labels, in order of first appearance
            names.setdefault(label, len(names))
        code = np.fromiter(map(names.__getitem__, labels), dtype=np.int64, count=n)
        # Optional fields: a block whose bytes never name one cannot hold it (a fast C search).
        if b'"regime_origin"' in block:
            origins = list(map(_GET["regime_origin"], recs))
            self.add_origins(labels, origins, record_lines)
        self.columns["step"].append(step)
        self.columns["reward"].append(_column(recs, "reward", np.float64))
        self.columns["code"].append(code)
        self.columns["end"].append(
            _column(recs, "episode_end", bool)
            if b'"episode_end"' in block
            else np.zeros(n, dtype=bool)
        )
        for key in ("invalid_action", "effective_rank"):
            if f'"{key}"'.encode() not in block:
                continue
            values = list(map(_GET[key], recs))
            if values.count(None) != n:
                col = np.array([math.nan if v is None else v for v in values], dtype=np.float64)
                self.optional.setdefault(key, []).append((self.n, col))
        comps = list(map(_GET["components"], recs)) if b'"components"' in block else []
        if comps and comps.count(None) != n:
            for name in dict.fromkeys(k for c in comps if c for k in c):
                col = np.array(
                    [math.nan if c is None else c.get(name, math.nan) for c in comps],
                    dtype=np.float64,
                )
                self.components.setdefault(name, []).append((self.n, col))
        self.n += n

    def add_origins(
        self, labels: list[str], origins: list[str | None], record_lines: Sequence[int]
    ) -> None:
        """Record each alias's declared origin; a label given two different origins is an error."""
        for label, origin in dict.fromkeys(zip(labels, origins, strict=True)):  # distinct pairs
            known = self.origin_of.get(label)
            if origin is None or origin == label or (known is not None and known[0] == origin):
                continue
            i = list(zip(labels, origins, strict=True)).index((label, origin))
            line = record_lines[i]
            if known is None:
                self.origin_of[label] = (origin, line)
                continue
            raise self.error(
                line,
                f"regime label {label!r} has origin {origin!r}, but line {known[1]} gave "
                f"{known[0]!r}",
            )

    def finish(self) -> EpisodeTrace:
        if self.n == 0:
            raise ValueError(f"{self.path}: no trace records")

        def spread(parts: list[tuple[int, np.ndarray]]) -> np.ndarray:
            out = np.full(self.n, math.nan)
            for offset, values in parts:
                out[offset : offset + len(values)] = values
            return out

        cols = {
            "step": np.concatenate(self.columns.pop("step")),
            "reward": np.concatenate(self.columns.pop("reward")),
            "regime_code": np.concatenate(self.columns.pop("code")),
            "regime_names": list(self.names),
            "origin_of": {label: origin for label, (origin, _) in self.origin_of.items()},
            "components": {name: spread(parts) for name, parts in self.components.items()},
            "invalid_action": spread(self.optional["invalid_action"])
            if "invalid_action" in self.optional
            else None,
            "effective_rank": spread(self.optional["effective_rank"])
            if "effective_rank" in self.optional
            else None,
            "episode_end": np.concatenate(self.columns.pop("end")),
        }
        try:
            return EpisodeTrace(_columns=cols)
        except ValueError as err:
            raise ValueError(f"{self.path}: {err}") from None


#: default cap on one trace line, in bytes (newline excluded): a step record is usually under a
#: kilobyte, components included
DEFAULT_MAX_LINE_BYTES = 1 << 20
#: default cap on a trace file, in bytes: about 30 million steps of 70 bytes (columns of ~25
#: bytes a step: ~0.75 GB)
DEFAULT_MAX_FILE_BYTES = 1 << 31


def _check_cap(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be an integer >= 1 or None (no limit), got {value!r}")


def read_jsonl(
    source: str | Path | IO[bytes],
    *,
    block_size: int = 1 << 22,
    max_line_bytes: int | None = DEFAULT_MAX_LINE_BYTES,
    max_file_bytes: int | None = DEFAULT_MAX_FILE_BYTES,
) -> EpisodeTrace:
    """Read one trace from JSON lines (one [`StepRecord`][] per
    line; blank lines skip).

    ``source``: a path (a regular file, a FIFO, a device) or a binary file object (anything with
    ``read(n) -> bytes``). It is decoded ``block_size`` bytes at a time straight into columns,
    so memory is the columns plus one block. Reading stops with a ``ValueError`` naming the limit
    at the first line longer than ``max_line_bytes`` (newline excluded) and once more than
    ``max_file_bytes`` bytes arrive, so an endless or hostile source (``/dev/zero``, a 300 MB
    line, a stream that never ends) costs at most about ``block_size + max_line_bytes`` bytes
    beyond the columns of the ``max_file_bytes`` read; ``None`` lifts a limit. Every error names
    ``file:line`` and the field.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    _check_cap("max_line_bytes", max_line_bytes)
    _check_cap("max_file_bytes", max_file_bytes)
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as fh:
            return _read_lines(fh, source, block_size, max_line_bytes, max_file_bytes)
    if not callable(getattr(source, "read", None)):
        raise TypeError(f"read_jsonl needs a path or a binary file object, got {source!r}")
    name = getattr(source, "name", None)
    return _read_lines(
        source,
        name if isinstance(name, (str, Path)) else "<stream>",
        block_size,
        max_line_bytes,
        max_file_bytes,
    )


def _read_lines(
    fh: IO[bytes],
    path: str | Path,
    block_size: int,
    max_line_bytes: int | None,
    max_file_bytes: int | None,
) -> EpisodeTrace:
    reader = _ColumnReader(path, max_line_bytes)
    try:
        for block in _blocks(fh, block_size, max_line_bytes, max_file_bytes):
            reader.add(block)
    except _LineTooLongError:
        raise reader.line_too_long(reader.next_line) from None
    except _FileTooLargeError:
        raise ValueError(
            f"{path}: more than {max_file_bytes} bytes, the limit max_file_bytes "
            "(--max-file-bytes); raise it to read a longer trace"
        ) from None
    return reader.finish()


def read_capped_bytes(path: str | Path, max_bytes: int, what: str) -> bytes:
    """The bytes of a small file (a ceiling file, a reward spec): a ``ValueError`` naming the
    limit once more than ``max_bytes`` arrive (so ``/dev/zero`` or a FIFO costs at most that)."""
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path}: more than {max_bytes} bytes, the limit for {what}")
    return data


def write_jsonl(trace: EpisodeTrace | Iterable[EpisodeStep], path: str | Path) -> Path:
    """Write a trace as JSON lines, one step per line; returns the path."""
    steps = trace.steps if isinstance(trace, EpisodeTrace) else list(trace)
    path = Path(path)
    with open(path, "w", encoding="utf-8") as fh:
        for s in steps:
            fh.write(json.dumps(s.to_dict()) + "\n")
    return path

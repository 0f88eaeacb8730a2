"""Reward-stream traces: one record per step, stored column-wise, read and written as JSON lines.

An :class:`EpisodeTrace` is what every metric in :mod:`continual_eval.stream` consumes. It holds
the reward and the regime label of each recorded step, the label's *origin* (the regime an alias
revisits: ``a_again`` with origin ``a``), and optional per-step readings: reward components, an
invalid-action flag, the policy's effective rank and whether the step ended an episode.

Validation happens once, here: a non-finite reward, a step number that does not increase, or an
alias whose origin never occurs in the trace is an error naming the step or the label.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EpisodeStep", "EpisodeTrace", "read_jsonl", "write_jsonl"]


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
        """Inverse of :meth:`to_dict`; ``step``, ``reward`` and ``regime_id`` are required."""
        missing = [k for k in ("step", "reward", "regime_id") if k not in record]
        if missing:
            raise ValueError(f"trace record {dict(record)!r} lacks required key(s) {missing}")
        return cls(
            step=int(record["step"]),
            reward=float(record["reward"]),
            regime_id=str(record["regime_id"]),
            regime_origin=record.get("regime_origin"),
            components=record.get("components"),
            invalid_action=record.get("invalid_action"),
            effective_rank=record.get("effective_rank"),
            episode_end=bool(record.get("episode_end", False)),
        )


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

    Build it from :class:`EpisodeStep` records (``EpisodeTrace(steps=[...])``) or, for long
    traces, from arrays (:meth:`from_arrays`). Columns: ``step`` (int64, strictly increasing),
    ``reward`` (float64, finite), ``regime_code`` (int64 index into ``regime_names``, which lists
    labels in order of first appearance), ``origin_of`` (label -> declared origin, aliases only),
    ``components`` (name -> float64 column; NaN where a step did not record it),
    ``invalid_action`` and ``effective_rank`` (float64 with NaN where unrecorded, or ``None``
    when no step recorded them), ``episode_end`` (bool).
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
        components = {}
        for name, col in (cols.get("components") or {}).items():
            arr = np.asarray(col, dtype=np.float64).reshape(-1)
            if len(arr) != n:
                raise ValueError(f"component {name!r} has {len(arr)} values for {n} steps")
            bad = np.flatnonzero(np.isinf(arr))
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"component {name!r} at step {int(step[i])} is {arr[i]!r}")
            components[str(name)] = arr
        optional = {}
        for key in ("invalid_action", "effective_rank"):
            col = cols.get(key)
            if col is not None:
                arr = np.asarray(col, dtype=np.float64).reshape(-1)
                if len(arr) != n:
                    raise ValueError(f"{key} has {len(arr)} values for {n} steps")
                bad = np.flatnonzero(np.isinf(arr))
                if key == "invalid_action":
                    bad = np.flatnonzero(~np.isnan(arr) & (arr != 0.0) & (arr != 1.0))
                if bad.size:
                    i = int(bad[0])
                    raise ValueError(f"{key} at step {int(step[i])} is {arr[i]!r}")
                optional[key] = None if np.isnan(arr).all() else arr
            else:
                optional[key] = None
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
        """The trace as :class:`EpisodeStep` records (slow for long traces)."""
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
    """Columns for :class:`EpisodeTrace` from records; origins must agree per label."""
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


def read_jsonl(path: str | Path) -> EpisodeTrace:
    """Read one trace from a JSON-lines file (one :meth:`EpisodeStep.to_dict` record per line)."""
    steps = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
            try:
                steps.append(EpisodeStep.from_dict(record))
            except (TypeError, ValueError) as err:
                raise ValueError(f"{path}:{lineno}: {err}") from err
    if not steps:
        raise ValueError(f"{path}: no trace records")
    return EpisodeTrace(steps=steps)


def write_jsonl(trace: EpisodeTrace | Iterable[EpisodeStep], path: str | Path) -> Path:
    """Write a trace as JSON lines, one step per line; returns the path."""
    steps = trace.steps if isinstance(trace, EpisodeTrace) else list(trace)
    path = Path(path)
    with open(path, "w", encoding="utf-8") as fh:
        for s in steps:
            fh.write(json.dumps(s.to_dict()) + "\n")
    return path

"""Reward specifications and the ceiling ``R_ub`` derived from them.

A [`RewardSpec`][continual_eval.stream.RewardSpec] is a weighted sum of
[`RewardComponent`][continual_eval.stream.RewardComponent] terms, each clipped to a range and paying
either on every step (``per_step``) or only on an episode's final step (``episode_end``). Three
derivations bound what the reward can pay:

* [`analytic_upper_bound`][continual_eval.stream.analytic_upper_bound] -- from the specification
  alone: each term's most is ``max(w * lo, w * hi)`` over its clip range; ``per_step`` sums the
      per-step terms and
  ``final_step`` adds the episode-end terms. Needs every component clipped (or unbounded only in
  the direction its weight never rewards).
* [`numeric_upper_bound`][continual_eval.stream.numeric_upper_bound] -- drive the composition over
  supplied contexts (component values) and take the best achieved; for specifications with unclipped
  components.
* [`data_relative_upper_bound`][continual_eval.stream.data_relative_upper_bound] -- the best reward
  observed in recorded traces. Derived from the policy being measured, so two policies compared
  against their own data-relative bounds are not compared fairly.

Every [`UpperBound`][] records its ``derivation``. A window of ``L``
steps holding ``e`` episode ends (final steps) is measured against
[`UpperBound.for_interval`][continual_eval.stream.UpperBound.for_interval]:
``((L - e) * per_step + e * final_step) / L`` -- the most its mean reward can be, since each step
pays at most ``per_step``, or ``final_step`` where an episode ends (``e = 0`` gives ``per_step``,
``e = 1`` the one-end form ``((L - 1) * p + f) / L``).

Specifications and bounds read from JSON
([`RewardSpec.from_json`][continual_eval.stream.RewardSpec.from_json],
[`read_ceiling_file`][continual_eval.stream.read_ceiling_file]) are checked against a strict typed
schema: a wrong type, a missing or an unknown field is an error naming the file and the field. A
    ``null`` clip bound means unbounded on that side.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np

from continual_eval.stream.trace import read_capped_bytes, schema_error_message

#: the most bytes a reward spec or ceiling file may hold (a few hundred is typical)
MAX_SPEC_BYTES = 1 << 20

__all__ = [
    "RewardComponent",
    "RewardSpec",
    "UpperBound",
    "analytic_upper_bound",
    "data_relative_upper_bound",
    "numeric_upper_bound",
    "read_ceiling_file",
    "window_ceilings",
]

Pays = Literal["per_step", "episode_end"]


class _ComponentRecord(msgspec.Struct, forbid_unknown_fields=True):
    """JSON schema of one component; a ``null`` clip bound is unbounded on that side."""

    name: str
    weight: float = 1.0
    clip: tuple[float | None, float | None] | None = None
    pays: Pays = "per_step"


class _SpecRecord(msgspec.Struct, forbid_unknown_fields=True):
    """JSON schema of a reward specification: ``{"name": ..., "components": [...]}``."""

    components: list[_ComponentRecord]
    name: str = ""


class _CeilingRecord(msgspec.Struct, forbid_unknown_fields=True):
    """A ``--ceiling`` file: a reward specification, or a bound ``{per_step, final_step}``."""

    components: list[_ComponentRecord] | msgspec.UnsetType = msgspec.UNSET
    name: str | msgspec.UnsetType = msgspec.UNSET
    per_step: float | msgspec.UnsetType = msgspec.UNSET
    final_step: float | msgspec.UnsetType = msgspec.UNSET
    derivation: str | msgspec.UnsetType = msgspec.UNSET


@dataclass(frozen=True)
class RewardComponent:
    """One term of a reward: ``weight * clip(value, *clip)``, paid per step or at episode end.

    ``clip=None`` means unclipped; either bound may be infinite.
    """

    name: str
    weight: float = 1.0
    clip: tuple[float, float] | None = None
    pays: Pays = "per_step"

    def __post_init__(self) -> None:
        if self.pays not in ("per_step", "episode_end"):
            raise ValueError(
                f"component {self.name!r}: pays must be 'per_step' or 'episode_end', "
                f"got {self.pays!r}"
            )
        if not math.isfinite(self.weight):
            raise ValueError(f"component {self.name!r}: weight must be finite")
        if self.clip is not None:
            lo, hi = (float(v) for v in self.clip)
            if math.isnan(lo) or math.isnan(hi) or lo > hi:
                raise ValueError(f"component {self.name!r}: clip range {self.clip} is not lo <= hi")
            object.__setattr__(self, "clip", (lo, hi))

    def contribution(self, value: float | np.ndarray) -> float | np.ndarray:
        """``weight * clip(value)``."""
        if self.clip is not None:
            value = np.clip(value, *self.clip)
        return self.weight * value

    def most(self) -> float:
        """The largest contribution the term can make: ``max(w * lo, w * hi)``; may be ``inf``."""
        if self.weight == 0.0:
            return 0.0
        lo, hi = self.clip if self.clip is not None else (-math.inf, math.inf)
        return max(self.weight * lo, self.weight * hi)


@dataclass(frozen=True)
class RewardSpec:
    """A reward as a weighted sum of clipped components."""

    components: tuple[RewardComponent, ...]
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "components", tuple(self.components))
        names = [c.name for c in self.components]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(
                f"reward spec {self.name!r}: duplicate component name(s) {sorted(dup)}"
            )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.components)

    @property
    def episode_end_names(self) -> tuple[str, ...]:
        """Names of the components that pay only at episode end."""
        return tuple(c.name for c in self.components if c.pays == "episode_end")

    def component(self, name: str) -> RewardComponent:
        for c in self.components:
            if c.name == name:
                return c
        raise ValueError(
            f"unknown reward component {name!r}; spec {self.name!r} has {list(self.names)}"
        )

    def compose(self, values: Mapping[str, float], final_step: bool = False) -> float:
        """The reward for one step: the sum of contributions (episode-end terms only if final).

        Components missing from ``values`` contribute nothing; a name the spec lacks is an error.
        """
        for key in values:
            self.component(key)
        total = 0.0
        for c in self.components:
            if c.pays == "episode_end" and not final_step:
                continue
            if c.name in values:
                total += float(c.contribution(float(values[c.name])))
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "components": [
                {
                    "name": c.name,
                    "weight": c.weight,
                    "clip": None
                    if c.clip is None
                    else [v if math.isfinite(v) else None for v in c.clip],
                    "pays": c.pays,
                }
                for c in self.components
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RewardSpec:
        """The inverse of `to_dict`, validated (no coercion; unknown fields are errors)."""
        try:
            record = msgspec.convert(
                dict(data) if isinstance(data, Mapping) else data, _SpecRecord, strict=True
            )
        except msgspec.ValidationError as err:
            raise ValueError(f"reward spec: {schema_error_message(err, 'a reward spec')}") from None
        return cls._from_records(record.components, record.name)

    @classmethod
    def from_json(cls, path: str | Path) -> RewardSpec:
        """Read a specification from a JSON file; errors name the file and the field."""
        data = read_capped_bytes(path, MAX_SPEC_BYTES, "a reward spec")
        try:
            record = msgspec.json.decode(data, type=_SpecRecord)
            return cls._from_records(record.components, record.name)
        except msgspec.DecodeError as err:
            raise ValueError(f"{path}: {schema_error_message(err, 'a reward spec')}") from None
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None

    @classmethod
    def _from_records(cls, components: Sequence[_ComponentRecord], name: str) -> RewardSpec:
        comps = []
        for i, c in enumerate(components):
            clip = None
            if c.clip is not None:
                lo, hi = c.clip
                clip = (-math.inf if lo is None else lo, math.inf if hi is None else hi)
            try:
                comps.append(RewardComponent(c.name, weight=c.weight, clip=clip, pays=c.pays))
            except ValueError as err:
                raise ValueError(f"components[{i}]: {err}") from None
        return cls(components=tuple(comps), name=name)


def window_ceilings(
    per_step: float | np.ndarray,
    final_step: float | np.ndarray,
    length: int | np.ndarray,
    ends: int | np.ndarray,
) -> np.ndarray:
    """``R_ub(L, e) = ((L - e) * p + e * f) / L`` elementwise (``p`` where ``e = 0``).

    Where the products overflow float64 (``|p|`` or ``|f|`` near ``1.8e308``) the same mean is
    taken as ``(L - e) / L * p + e / L * f``, which stays finite; elsewhere the first form, so
    ordinary bounds are unchanged to the bit.
    """
    p = np.asarray(per_step, dtype=np.float64)
    f = np.asarray(final_step, dtype=np.float64)
    length = np.asarray(length, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        mean = ((length - ends) * p + ends * f) / length
        overflowed = np.isinf(mean) & np.isfinite(p) & np.isfinite(f)
        if overflowed.any():
            mean = np.where(overflowed, (length - ends) / length * p + ends / length * f, mean)
    return np.where(ends == 0, p, mean)


@dataclass(frozen=True)
class UpperBound:
    """``R_ub`` for an ordinary step (``per_step``) and for an episode's final step.

    ``derivation`` is one of ``"analytic"``, ``"numeric"``, ``"data_relative"``, ``"explicit"``;
    ``details`` records what it was derived from.
    """

    per_step: float
    final_step: float
    derivation: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def for_interval(
        self, length: int, contains_final_step: bool = False, *, episode_ends: int | None = None
    ) -> float:
        """The ceiling of the mean of ``L`` steps holding ``e`` episode ends (final steps).

        ``R_ub(L, e) = ((L - e) * p + e * f) / L``: every step pays at most ``p = per_step``, a
        final step at most ``f = final_step``. ``e`` is ``episode_ends``, or 1 / 0 from
        ``contains_final_step`` (give one of the two).
        """
        length = int(length)
        if length < 1:
            raise ValueError(f"interval length must be >= 1, got {length}")
        if episode_ends is None:
            ends = 1 if contains_final_step else 0
        elif contains_final_step:
            raise ValueError("give contains_final_step or episode_ends, not both")
        else:
            ends = int(episode_ends)
            if ends != episode_ends or not 0 <= ends <= length:
                raise ValueError(
                    f"episode_ends must be an integer in [0, {length}] for an interval of "
                    f"{length} step(s), got {episode_ends!r}"
                )
        return float(window_ceilings(self.per_step, self.final_step, length, ends))

    @classmethod
    def explicit(cls, value: float) -> UpperBound:
        """A ceiling given by the caller, the same for every step."""
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"an explicit ceiling must be finite, got {value}")
        return cls(per_step=value, final_step=value, derivation="explicit")

    def to_dict(self) -> dict[str, Any]:
        return {
            "derivation": self.derivation,
            "per_step": self.per_step,
            "final_step": self.final_step,
            **({"details": dict(self.details)} if self.details else {}),
        }


def read_ceiling_file(path: str | Path) -> RewardSpec | UpperBound:
    """A ceiling from a JSON file: a reward specification (``{"components": [...]}``, bounded
    analytically later) or a bound ``{"per_step": p, "final_step": f, "derivation": d}`` (``f``
    defaults to ``p``, ``d`` to ``"explicit"``). Errors name the file and the field."""
    data = read_capped_bytes(path, MAX_SPEC_BYTES, "a ceiling file")
    try:
        rec = msgspec.json.decode(data, type=_CeilingRecord)
    except msgspec.DecodeError as err:
        raise ValueError(f"{path}: {schema_error_message(err, 'a ceiling file')}") from None
    is_spec = rec.components is not msgspec.UNSET
    is_bound = rec.per_step is not msgspec.UNSET
    if is_spec == is_bound:
        raise ValueError(
            f"{path}: a ceiling file holds either a reward spec ('components') or a bound "
            f"('per_step'), {'not both' if is_spec else 'found neither'}"
        )
    if is_spec:
        extra = [k for k in ("final_step", "derivation") if getattr(rec, k) is not msgspec.UNSET]
        if extra:
            raise ValueError(f"{path}: field(s) {extra} do not belong in a reward spec")
        try:
            return RewardSpec._from_records(rec.components, rec.name or "")
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
    if rec.name is not msgspec.UNSET:
        raise ValueError(f"{path}: field `name` belongs to a reward spec, not a bound")
    final = rec.per_step if rec.final_step is msgspec.UNSET else rec.final_step
    return UpperBound(
        per_step=float(rec.per_step),
        final_step=float(final),
        derivation="explicit" if rec.derivation is msgspec.UNSET else rec.derivation,
        details={"file": str(path)},
    )


def analytic_upper_bound(spec: RewardSpec) -> UpperBound:
    """``per_step = sum of per-step terms' most``; ``final_step = per_step + episode-end terms``."""
    per_step = sum(c.most() for c in spec.components if c.pays == "per_step")
    final = per_step + sum(c.most() for c in spec.components if c.pays == "episode_end")
    if not (math.isfinite(per_step) and math.isfinite(final)):
        unbounded = [c.name for c in spec.components if not math.isfinite(c.most())]
        raise ValueError(
            f"reward spec {spec.name!r} has no analytic bound: component(s) {unbounded} are "
            "unclipped in the direction their weight rewards; use numeric_upper_bound"
        )
    return UpperBound(
        per_step=float(per_step),
        final_step=float(final),
        derivation="analytic",
        details={"spec": spec.name},
    )


def numeric_upper_bound(spec: RewardSpec, contexts: Iterable[Mapping[str, float]]) -> UpperBound:
    """The best composed reward over supplied contexts (dicts of raw component values).

    ``per_step`` is the best ordinary-step reward, ``final_step`` the best final-step reward.
    """
    contexts = list(contexts)
    if not contexts:
        raise ValueError("numeric_upper_bound needs at least one context")
    per_step = max(spec.compose(ctx, final_step=False) for ctx in contexts)
    final = max(spec.compose(ctx, final_step=True) for ctx in contexts)
    return UpperBound(
        per_step=float(per_step),
        final_step=float(final),
        derivation="numeric",
        details={"spec": spec.name, "contexts": len(contexts)},
    )


def data_relative_upper_bound(traces: Sequence[Any]) -> UpperBound:
    """The best observed reward: over ordinary steps, and over steps that ended an episode.

    When no step ended an episode, ``final_step`` equals ``per_step``.
    """
    if not traces:
        raise ValueError("data_relative_upper_bound needs at least one trace")
    ordinary, final = [], []
    for tr in traces:
        end = tr.episode_end if tr.episode_end is not None else np.zeros(len(tr), dtype=bool)
        if (~end).any():
            ordinary.append(float(tr.reward[~end].max()))
        if end.any():
            final.append(float(tr.reward[end].max()))
    per_step = max(ordinary) if ordinary else max(final)
    fin = max(final) if final else per_step
    return UpperBound(
        per_step=per_step,
        final_step=fin,
        derivation="data_relative",
        details={"traces": len(traces), "note": "derived from the policy being measured"},
    )

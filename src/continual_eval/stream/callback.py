"""Lightning callback: record a reward stream during ``fit`` and score it at the end.

Per training batch, `RewardStreamCallback` records one step: the reward, the regime label
and, when present, the regime origin, reward components, the invalid-action flag, the effective
rank and the episode-end flag. Each value is taken, in order, from

1. what the module passed to `record` (``continual_eval.stream.callback.record(self,
   reward=..., regime_id=...)`` inside ``training_step``) -- the documented recording API;
2. what ``training_step`` returned (a dict), looked up under the callback's keys;
3. the batch, when it is a dict;
4. what the module logged with ``self.log(name, value)`` during that same step (``on_step=True``,
   the default in ``training_step``; components as ``components/NAME``). These are read from
   Lightning's own per-step results, whatever wrapper the module or another callback puts around
   ``log``; ``pl_module.log`` is never replaced. A value logged at an earlier step is never carried
   forward (``trainer.callback_metrics`` would: an unmeasured step would read as measured).

Effective rank: the module may supply it like any reading, or (off by default) the callback
captures it itself: given ``effective_rank_module`` (the qualified name of a submodule of the
LightningModule, e.g. ``"net.2"``) and ``effective_rank_probe`` (a fixed input batch), after every
``effective_rank_every_n_steps``-th optimizer step it runs ``pl_module(probe)`` once under
``torch.no_grad()`` in eval mode, takes the submodule's output through a forward hook, flattens it
to ``[N, D]`` and records ``erank = exp(-sum_k p_k log p_k)``, ``p_k = s_k / sum_j s_j`` over its
singular values (Roy & Vetterli, 2007; [`effective_rank`][continual_eval.stream.effective_rank]) as
that step's effective rank. Each module's train/eval mode and the CPU and CUDA random states are
restored afterwards and no gradient is touched. Cost per capture: one forward of the probe batch
plus one SVD of the ``[N, D]`` activations (float64, on the CPU).

State: the recorded steps are part of the callback's ``state_dict`` (columns of tensors), so a run
resumed from a Lightning checkpoint continues the trace it had at the checkpoint; a batch that
Lightning replays after a resume replaces its earlier record instead of duplicating it.

DDP: every rank records its own stream (its own environment, its own batches). At the end of
training the ranks' steps are gathered on every rank and scored as the traces of one run
(``compute_all_metrics(traces)``: each metric is averaged across the ranks' traces), never
interleaved -- interleaving independent streams would invent regime shifts. ``traces`` holds one
trace per rank, in rank order; ``trace`` is this rank's own.

At the end of training the traces are scored with
[`compute_all_metrics`][continual_eval.stream.compute_all_metrics]; present values are logged as
``stream/<label>/<metric>`` to every logger of the Trainer (absent ones are not logged: absence is
not zero), the table goes to TensorBoard as markdown text, and loggers with a ``log_dir`` get
``stream_table.txt``, ``stream_metrics.json`` and (``save_trace=True``) ``stream_trace.jsonl``
(under DDP one ``stream_trace_rank<r>.jsonl`` per rank). Every file is replaced atomically
(temporary file, fsync, ``os.replace``): a crash leaves the previous complete version.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn

from continual_eval.results.files import replace_atomically
from continual_eval.stream.json_output import json_text
from continual_eval.stream.metrics import compute_all_metrics, effective_rank
from continual_eval.stream.rewards import RewardSpec, UpperBound
from continual_eval.stream.table import format_markdown, format_table
from continual_eval.stream.trace import EpisodeStep, EpisodeTrace, write_jsonl

__all__ = ["RewardStreamCallback", "record"]

_MISSING = object()
_STATE_VERSION = 1
_FIELDS = (
    "reward",
    "regime_id",
    "regime_origin",
    "components",
    "invalid_action",
    "effective_rank",
    "episode_end",
)
# record() keyword -> the callback's key for the same reading (``self.keys``)
_FIELD_KEY = {
    "reward": "reward",
    "regime_id": "regime",
    "regime_origin": "origin",
    "components": "components",
    "invalid_action": "invalid",
    "effective_rank": "rank",
    "episode_end": "end",
}


def _scalar(value: Any) -> Any:
    """A Python scalar from a tensor / numpy scalar; other values unchanged."""
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        if value.numel() != 1:
            raise ValueError(f"expected a scalar, got a tensor of shape {tuple(value.shape)}")
        return value.item()
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


def _absent(value: Any) -> bool:
    """Not recorded: not found anywhere, or given as ``None``."""
    return value is _MISSING or value is None


def _write_text(text: str) -> Callable[[Path], Any]:
    return lambda p: p.write_text(text, encoding="utf-8")


def _steps_to_columns(steps: Sequence[EpisodeStep], batch_index: Sequence[int]) -> dict[str, Any]:
    """Compact, ``torch.load(weights_only=True)``-safe columns of recorded steps.

    ``regime_code`` indexes ``regime_names``; optional readings are float64 columns with NaN where
    a step did not record them (``None`` when no step did); ``components`` is a ``(n, c)`` matrix
    over ``component_names``.
    """
    n = len(steps)
    names: dict[str, int] = {}
    origins: dict[str, str] = {}
    comp_names: dict[str, int] = {}
    for s in steps:
        names.setdefault(s.regime_id, len(names))
        if s.regime_origin is not None:
            origins.setdefault(s.regime_id, s.regime_origin)
        for k in s.components or {}:
            comp_names.setdefault(k, len(comp_names))
    nan = math.nan
    components = torch.full((n, len(comp_names)), nan, dtype=torch.float64)
    for i, s in enumerate(steps):
        for k, v in (s.components or {}).items():
            components[i, comp_names[k]] = float(v)

    def optional(field: str) -> torch.Tensor | None:
        values = [getattr(s, field) for s in steps]
        if all(v is None for v in values):
            return None
        return torch.tensor([nan if v is None else float(v) for v in values], dtype=torch.float64)

    return {
        "step": torch.tensor([s.step for s in steps], dtype=torch.int64),
        "batch_index": torch.tensor(list(batch_index), dtype=torch.int64),
        "reward": torch.tensor([s.reward for s in steps], dtype=torch.float64),
        "regime_code": torch.tensor([names[s.regime_id] for s in steps], dtype=torch.int64),
        "regime_names": list(names),
        "origin_of": origins,
        "component_names": list(comp_names),
        "components": components,
        "invalid_action": optional("invalid_action"),
        "effective_rank": optional("effective_rank"),
        "episode_end": torch.tensor([bool(s.episode_end) for s in steps], dtype=torch.bool),
    }


def _columns_to_steps(cols: Mapping[str, Any]) -> tuple[list[EpisodeStep], list[int]]:
    """Inverse of `_steps_to_columns`: the records and their Lightning batch indices."""
    names = list(cols["regime_names"])
    origins = dict(cols["origin_of"])
    comp_names = list(cols["component_names"])
    components = cols["components"].tolist()
    invalid = None if cols["invalid_action"] is None else cols["invalid_action"].tolist()
    rank = None if cols["effective_rank"] is None else cols["effective_rank"].tolist()
    steps = []
    for i, (step, reward, code, end) in enumerate(
        zip(
            cols["step"].tolist(),
            cols["reward"].tolist(),
            cols["regime_code"].tolist(),
            cols["episode_end"].tolist(),
            strict=True,
        )
    ):
        label = names[code]
        comps = {k: v for k, v in zip(comp_names, components[i], strict=True) if not math.isnan(v)}
        steps.append(
            EpisodeStep(
                step=int(step),
                reward=float(reward),
                regime_id=label,
                regime_origin=origins.get(label),
                components=comps or None,
                invalid_action=None
                if invalid is None or math.isnan(invalid[i])
                else invalid[i] == 1,
                effective_rank=None if rank is None or math.isnan(rank[i]) else rank[i],
                episode_end=bool(end),
            )
        )
    return steps, [int(b) for b in cols["batch_index"].tolist()]


def _distributed(trainer: pl.Trainer) -> bool:
    return (
        trainer.world_size > 1
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
    )


def _gather(trainer: pl.Trainer, payload: Any) -> list[Any]:
    """``payload`` of every rank, in rank order, on every rank (a collective under DDP)."""
    if not _distributed(trainer):
        return [payload]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, payload)
    return out


def _check_rank_capture(
    module: str | None, probe: torch.Tensor | None, every_n_steps: int
) -> torch.Tensor | None:
    """Validate the effective-rank capture options; the probe (a detached copy) or ``None``."""
    if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
        raise ValueError(
            f"RewardStreamCallback: effective_rank_every_n_steps must be an integer >= 1, got "
            f"{every_n_steps!r}"
        )
    if module is None:
        if probe is not None:
            raise ValueError(
                "RewardStreamCallback: effective_rank_probe was given without "
                "effective_rank_module; name the submodule whose activations to measure"
            )
        return None
    if not isinstance(module, str):
        raise TypeError(
            "RewardStreamCallback: effective_rank_module must be a submodule's qualified name "
            f"(a str such as 'net.2'), got {type(module).__name__}"
        )
    if probe is None:
        raise ValueError(
            f"RewardStreamCallback: effective_rank_module={module!r} needs effective_rank_probe, "
            "a fixed input batch (a tensor) to pass through the module"
        )
    if not isinstance(probe, torch.Tensor):
        raise TypeError(
            f"RewardStreamCallback: effective_rank_probe must be a tensor, got "
            f"{type(probe).__name__}"
        )
    if probe.ndim == 0 or probe.shape[0] == 0 or probe.numel() == 0:
        raise ValueError(
            f"RewardStreamCallback: effective_rank_probe is empty (shape {tuple(probe.shape)}); "
            "it needs at least one sample along its first (batch) dimension"
        )
    return probe.detach().clone()


def _first_tensor(output: Any) -> Any:
    """A module's output, or the first element of a tuple/list output."""
    if isinstance(output, (tuple, list)) and output:
        return output[0]
    return output


def record(pl_module: pl.LightningModule, **values: Any) -> None:
    """Record readings of the current training step for every `RewardStreamCallback`.

    Call it from ``training_step`` (``record(self, reward=r, regime_id="a")``); keywords are the
    fields of [`EpisodeStep`][continual_eval.stream.EpisodeStep]: ``reward``, ``regime_id``,
    ``regime_origin``, ``components`` (name -> value), ``invalid_action``, ``effective_rank``,
    ``episode_end``. Several calls in one step add fields; a field given twice is an error.
    Recorded values take precedence over the returned dict, the batch and ``self.log``.
    """
    trainer = getattr(pl_module, "_trainer", None)
    if trainer is None:
        raise RuntimeError(
            "continual_eval.stream.record: the module is not attached to a Trainer; call it from "
            "training_step during trainer.fit"
        )
    callbacks = [cb for cb in trainer.callbacks if isinstance(cb, RewardStreamCallback)]
    if not callbacks:
        warnings.warn(
            "continual_eval.stream.record: the Trainer has no RewardStreamCallback; the recorded "
            "values are not kept",
            stacklevel=2,
        )
    for cb in callbacks:
        cb.record(**values)


class RewardStreamCallback(pl.Callback):
    """Record ``(reward, regime label, origin, ...)`` per training step; score when training ends.

    Args:
        reward_key: the key of the reward (looked up in the returned dict, the
            batch and the logged values; see the module docstring).
        regime_key: the key of the regime label (looked up in the returned dict, the
            batch and the logged values; see the module docstring).
        origin_key: the key of the regime origin (alias) (looked up in the returned dict, the
            batch and the logged values; see the module docstring).
        components_key: the key of the reward components (looked up in the returned dict, the
            batch and the logged values; see the module docstring).
        invalid_key: the key of the invalid-action flag (looked up in the returned dict, the
            batch and the logged values; see the module docstring).
        effective_rank_key: the key of the effective rank (looked up in the returned dict, the
            batch and the logged values; see the module docstring).
        episode_end_key: the key of the episode-end flag (looked up in the returned dict, the
            batch and the logged values; see the module docstring).
        anchor: passed to ``compute_all_metrics``.
        alpha: passed to ``compute_all_metrics``.
        eps: passed to ``compute_all_metrics``.
        recovery_floor: passed to ``compute_all_metrics``.
        tail_fraction: passed to ``compute_all_metrics``.
        zero_shot_window: passed to ``compute_all_metrics``.
        gamma: passed to ``compute_all_metrics``.
        episode_end_components: passed to ``compute_all_metrics``.
        solve_component: passed to ``compute_all_metrics``.
        ceiling: an explicit ceiling ``R_ub`` (a number), or ``None``.
        reward_spec: a reward specification as a dict (``RewardSpec.to_dict`` form); its analytic
            bound is the ceiling. Give at most one of ``ceiling`` and ``reward_spec``.
        save_trace: write the recorded trace as JSON lines next to the table.
        prefix: metric-name prefix for the loggers; also distinguishes the checkpoint state of
            several instances.
        effective_rank_module: capture the effective rank of this submodule's output (its
            qualified name in ``pl_module.named_modules()``, e.g. ``"net.2"``); ``None`` (the
            default) captures nothing. Needs ``effective_rank_probe``.
        effective_rank_probe: the fixed input batch passed to ``pl_module(probe)`` for the
            capture (a non-empty tensor; moved to the module's device).
        effective_rank_every_n_steps: capture after every n-th optimizer step (``n >= 1``).
    """

    def __init__(
        self,
        reward_key: str = "reward",
        regime_key: str = "regime_id",
        origin_key: str = "regime_origin",
        components_key: str = "components",
        invalid_key: str = "invalid_action",
        effective_rank_key: str = "effective_rank",
        episode_end_key: str = "episode_end",
        anchor: str = "segment",
        alpha: float | None = None,
        eps: float | None = None,
        recovery_floor: float = 0.005,
        tail_fraction: float = 0.2,
        zero_shot_window: int = 10,
        gamma: float = 0.99,
        ceiling: float | None = None,
        reward_spec: dict[str, Any] | None = None,
        episode_end_components: Sequence[str] | None = None,
        solve_component: str | None = None,
        save_trace: bool = True,
        prefix: str = "stream",
        effective_rank_module: str | None = None,
        effective_rank_probe: torch.Tensor | None = None,
        effective_rank_every_n_steps: int = 1,
    ) -> None:
        super().__init__()
        if ceiling is not None and reward_spec is not None:
            raise ValueError("give a ceiling or a reward_spec, not both")
        self._rank_probe = _check_rank_capture(
            effective_rank_module, effective_rank_probe, effective_rank_every_n_steps
        )
        self.effective_rank_module = effective_rank_module
        self.effective_rank_every_n_steps = int(effective_rank_every_n_steps)
        self._rank_target: torch.nn.Module | None = None  # the submodule, resolved at fit start
        self._global_step_before = 0  # trainer.global_step when the current batch started
        self.keys = {
            "reward": reward_key,
            "regime": regime_key,
            "origin": origin_key,
            "components": components_key,
            "invalid": invalid_key,
            "rank": effective_rank_key,
            "end": episode_end_key,
        }
        self._ceiling: float | UpperBound | RewardSpec | None = (
            RewardSpec.from_dict(reward_spec) if reward_spec is not None else ceiling
        )
        self.metric_kwargs: dict[str, Any] = {
            "anchor": anchor,
            "alpha": alpha,
            "eps": eps,
            "recovery_floor": recovery_floor,
            "tail_fraction": tail_fraction,
            "zero_shot_window": zero_shot_window,
            "gamma": gamma,
            "episode_end_components": list(episode_end_components or []) or None,
            "solve_component": solve_component,
        }
        self.save_trace = save_trace
        self.prefix = prefix
        self.steps: list[EpisodeStep] = []  # this rank's records
        self._batch_index: list[int] = []  # Lightning's total batch index of each record
        self._recorded: dict[str, Any] = {}  # what record() received during the current step
        self._in_step = False
        self._results_before: dict[str, Any] = {}  # Lightning's step values at the batch start
        self._pending_state: dict[str, Any] | None = None
        self._trainer: pl.Trainer | None = None
        self._rank_steps: list[list[EpisodeStep]] | None = None  # every rank's, after gathering
        self._rank_batch_index: list[list[int]] | None = None
        self.trace: EpisodeTrace | None = None
        self.traces: list[EpisodeTrace] = []
        self.result: dict[str, Any] | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(prefix=self.prefix)

    # ------------------------------------------------------------------ recording API
    def record(self, **values: Any) -> None:
        """Record readings of the current training step (see `record`)."""
        unknown = sorted(set(values) - set(_FIELDS))
        if unknown:
            raise TypeError(
                f"RewardStreamCallback.record: unknown field(s) {unknown}; known: {list(_FIELDS)}"
            )
        if not self._in_step:
            raise RuntimeError(
                "RewardStreamCallback.record: called outside a training step; call it from "
                "training_step (readings are recorded once per training batch)"
            )
        twice = sorted(set(values) & set(self._recorded))
        if twice:
            raise ValueError(
                f"RewardStreamCallback.record: {twice} recorded twice at training step "
                f"{len(self.steps)}"
            )
        self._recorded.update(values)

    # ------------------------------------------------------------------ lookup
    def _lightning_results(self, trainer: pl.Trainer) -> Mapping[str, Any]:
        results = getattr(trainer, "_results", None)
        return results if isinstance(results, Mapping) else {}

    def _logged_this_step(self, trainer: pl.Trainer) -> dict[str, Any]:
        """``name -> value`` of what was logged with ``on_step=True`` since the batch started.

        Lightning keeps each logged value's latest step value in ``_forward_cache`` and replaces
        that tensor on every ``log`` call, so a value is fresh iff its cache object changed.
        """
        logged = {}
        for key, metric in self._lightning_results(trainer).items():
            cache = getattr(metric, "_forward_cache", None)
            if cache is not None and cache is not self._results_before.get(key):
                logged[metric.meta.name] = cache
        return logged

    def _logged_without_step(self, trainer: pl.Trainer, name: str) -> bool:
        """Whether ``name`` was logged this step with ``on_step=False`` (no per-step value)."""
        for metric in self._lightning_results(trainer).values():
            meta = getattr(metric, "meta", None)
            if meta is not None and meta.name == name and not meta.on_step:
                return not metric.has_reset
        return False

    def _lookup(self, field: str, outputs: Any, batch: Any, logged: Mapping[str, Any]) -> Any:
        if field in self._recorded:
            return self._recorded[field]
        key = self.keys[_FIELD_KEY[field]]
        for source in (outputs, batch, logged):
            if isinstance(source, Mapping) and key in source:
                return source[key]
        return _MISSING

    def _components(self, outputs: Any, batch: Any, logged: Mapping[str, Any]) -> dict[str, float]:
        found = self._lookup("components", outputs, batch, logged)
        if not _absent(found):
            if not isinstance(found, Mapping):
                raise TypeError(
                    f"RewardStreamCallback: components at training step {len(self.steps)} must "
                    f"map names to values, got {type(found).__name__}"
                )
            return {str(k): float(_scalar(v)) for k, v in found.items()}
        head = f"{self.keys['components']}/"
        return {k[len(head) :]: float(_scalar(v)) for k, v in logged.items() if k.startswith(head)}

    # ------------------------------------------------------------------ hooks: recording
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._trainer = trainer
        if self.effective_rank_module is not None:
            strategy = type(trainer.strategy).__name__
            if "FSDP" in strategy or "DeepSpeed" in strategy:
                raise ValueError(
                    f"RewardStreamCallback: effective-rank capture runs the whole module on the "
                    f"probe batch, which {strategy} (sharded parameters) does not support; turn "
                    "the capture off (effective_rank_module=None) or use DDP"
                )
        self._rank_target = self._resolve_rank_module(pl_module)
        self._rank_steps, self._rank_batch_index = None, None
        self.trace, self.traces, self.result = None, [], None
        state = self._pending_state
        if state is None:  # a fresh fit starts a fresh trace
            self.steps, self._batch_index = [], []
            return
        ranks = state["ranks"]
        if len(ranks) != trainer.world_size:  # the loaded state stays pending, not lost
            raise ValueError(
                f"the checkpoint's RewardStreamCallback state holds the traces of {len(ranks)} "
                f"rank(s), but this run has {trainer.world_size}; resume with the same number "
                "of processes"
            )
        self.steps, self._batch_index = _columns_to_steps(ranks[trainer.global_rank])
        self._pending_state = None

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._recorded = {}
        self._in_step = True
        self._global_step_before = int(trainer.global_step)
        self._results_before = {
            key: getattr(metric, "_forward_cache", None)
            for key, metric in self._lightning_results(trainer).items()
        }

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._in_step = False
        index = int(trainer.fit_loop.epoch_loop.total_batch_idx)
        if self._batch_index and index <= self._batch_index[-1]:
            # Lightning replays a batch recorded before the checkpoint was written: the new
            # record replaces the old ones from that batch on (never a duplicate step)
            keep = sum(1 for b in self._batch_index if b < index)
            rank_zero_info(
                f"RewardStreamCallback: batch {index} is replayed; dropping "
                f"{len(self.steps) - keep} record(s) from it on"
            )
            del self.steps[keep:], self._batch_index[keep:]
        step = len(self.steps)
        logged = self._logged_this_step(trainer)
        reward = self._lookup("reward", outputs, batch, logged)
        if _absent(reward):
            key = self.keys["reward"]
            hint = (
                f" ({key!r} was logged with on_step=False, which keeps no per-step value: log it "
                "with on_step=True)"
                if self._logged_without_step(trainer, key)
                else ""
            )
            raise KeyError(
                f"RewardStreamCallback: no {key!r} at training step {step}{hint}: call "
                "continual_eval.stream.callback.record(self, reward=...) in training_step, "
                "return it from training_step or log it"
            )
        label = self._lookup("regime_id", outputs, batch, logged)
        if _absent(label):
            raise KeyError(
                f"RewardStreamCallback: no regime label {self.keys['regime']!r} at training step "
                f"{step}: record it (record(self, regime_id=...)) or return it from training_step"
            )
        label = _scalar(label)
        if isinstance(label, float) and label.is_integer():
            label = int(label)
        origin = self._lookup("regime_origin", outputs, batch, logged)
        origin = None if _absent(origin) else str(_scalar(origin))
        invalid = self._lookup("invalid_action", outputs, batch, logged)
        rank = self._lookup("effective_rank", outputs, batch, logged)
        if self._rank_target is not None:
            if not _absent(rank):
                raise ValueError(
                    f"RewardStreamCallback: an effective rank was supplied at training step "
                    f"{step}, but the callback captures it itself (effective_rank_module="
                    f"{self.effective_rank_module!r}); use one source, not both"
                )
            n = self.effective_rank_every_n_steps
            if int(trainer.global_step) // n > self._global_step_before // n:
                rank = self._capture_effective_rank(pl_module, step)
        end = self._lookup("episode_end", outputs, batch, logged)
        reward = float(_scalar(reward))
        if not math.isfinite(reward):
            raise ValueError(f"RewardStreamCallback: reward at training step {step} is {reward}")
        self.steps.append(
            EpisodeStep(
                step=step,
                reward=reward,
                regime_id=str(label),
                regime_origin=origin,
                components=self._components(outputs, batch, logged) or None,
                invalid_action=None if _absent(invalid) else bool(_scalar(invalid)),
                effective_rank=None if _absent(rank) else float(_scalar(rank)),
                episode_end=False if _absent(end) else bool(_scalar(end)),
            )
        )
        self._batch_index.append(index)
        self._recorded = {}
        self._results_before = {}

    # ------------------------------------------------------------------ effective rank
    def _resolve_rank_module(self, pl_module: pl.LightningModule) -> torch.nn.Module | None:
        """The submodule named by ``effective_rank_module`` (``None`` when capture is off)."""
        name = self.effective_rank_module
        if name is None:
            return None
        modules: dict[str, torch.nn.Module] = dict(pl_module.named_modules())
        if name not in modules:
            known = [k for k in modules if k]
            shown = ", ".join(repr(k) for k in known[:20]) + (", ..." if len(known) > 20 else "")
            raise ValueError(
                f"RewardStreamCallback: effective_rank_module={name!r} is not a submodule of "
                f"{type(pl_module).__name__}; its submodules are: {shown or 'none'}"
            )
        return modules[name]

    def _capture_effective_rank(self, pl_module: pl.LightningModule, step: int) -> float | None:
        """Run the probe batch once (no grad, eval mode) and return the submodule's effective rank.

        Every module's ``training`` flag and the CPU/CUDA random states are restored afterwards.
        Non-finite activations have no rank: a warning, and nothing is recorded for the step.
        """
        target, probe = self._rank_target, self._rank_probe
        assert target is not None and probe is not None
        if probe.device != pl_module.device:
            probe = self._rank_probe = probe.to(pl_module.device)
        captured: list[Any] = []

        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if not captured:  # a submodule called several times: its first call
                captured.append(_first_tensor(output))

        modes = [(m, m.training) for m in pl_module.modules()]
        cuda = [probe.device.index or 0] if probe.device.type == "cuda" else []
        handle = target.register_forward_hook(hook)
        try:
            with torch.random.fork_rng(devices=cuda), torch.no_grad():
                pl_module.eval()
                pl_module(probe)
        except NotImplementedError as err:
            raise RuntimeError(
                f"RewardStreamCallback: the effective-rank capture calls pl_module(probe), but "
                f"{type(pl_module).__name__} does not implement forward()"
            ) from err
        finally:
            handle.remove()
            pl_module.train(modes[0][1])
            for m, mode in modes:
                if m.training != mode:
                    m.training = mode
        if not captured:
            raise RuntimeError(
                f"RewardStreamCallback: submodule {self.effective_rank_module!r} did not run in "
                f"{type(pl_module).__name__}.forward(probe); name a submodule on the forward path"
            )
        out = captured[0]
        if not isinstance(out, torch.Tensor) or out.ndim == 0:
            raise TypeError(
                f"RewardStreamCallback: submodule {self.effective_rank_module!r} returned "
                f"{type(out).__name__ if not isinstance(out, torch.Tensor) else 'a 0-d tensor'}; "
                "the capture needs a tensor with a batch dimension"
            )
        features = out.detach().reshape(out.shape[0], -1).to("cpu", torch.float64).numpy()
        if not np.isfinite(features).all():
            warnings.warn(
                f"RewardStreamCallback: the activations of {self.effective_rank_module!r} at "
                f"training step {step} are not finite; no effective rank recorded for the step",
                stacklevel=2,
            )
            return None
        return effective_rank(features)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """``{"version", "ranks": [columns of rank 0, rank 1, ...]}``.

        Under DDP, while the Trainer runs, this gathers every rank's records (a collective:
        Lightning builds checkpoints on every rank, as ``Trainer.save_checkpoint`` requires); after
        training it uses the records gathered at the end of training.
        """
        if self._pending_state is not None:  # loaded but not yet applied
            return dict(self._pending_state)
        trainer = self._trainer
        if self._rank_steps is not None and self._rank_batch_index is not None:
            # training ended: every rank's records are already here, no collective needed
            ranks = [
                _steps_to_columns(steps, index)
                for steps, index in zip(self._rank_steps, self._rank_batch_index, strict=True)
            ]
        elif trainer is not None and trainer.state.status == TrainerStatus.RUNNING:
            ranks = _gather(trainer, _steps_to_columns(self.steps, self._batch_index))
        else:
            ranks = [_steps_to_columns(self.steps, self._batch_index)]
        return {"version": _STATE_VERSION, "ranks": ranks}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if state_dict.get("version") != _STATE_VERSION or "ranks" not in state_dict:
            raise ValueError(
                f"RewardStreamCallback state has version {state_dict.get('version')!r}; "
                f"expected {_STATE_VERSION}"
            )
        self._pending_state = dict(state_dict)

    # ------------------------------------------------------------------ scoring
    def score(self) -> dict[str, Any] | None:
        """Score every rank's trace as the traces of one run (``None`` if nothing recorded).

        Without DDP (or before the end of training) the traces are this process's own.
        """
        if self._rank_steps is not None and self._trainer is not None:
            rank_steps, own = self._rank_steps, self._trainer.global_rank
        else:
            rank_steps, own = [self.steps], 0
        self.traces = [EpisodeTrace(steps=steps) for steps in rank_steps if steps]
        self.trace = EpisodeTrace(steps=rank_steps[own]) if rank_steps[own] else None
        if not self.traces:
            self.result = None
            return None
        self.result = compute_all_metrics(self.traces, ceiling=self._ceiling, **self.metric_kwargs)
        if self._rank_probe is not None:
            self.result["params"]["effective_rank_capture"] = {
                "module": self.effective_rank_module,
                "every_n_steps": self.effective_rank_every_n_steps,
                "probe_shape": list(self._rank_probe.shape),
            }
        return self.result

    def scalar_metrics(self) -> dict[str, float]:
        """``{prefix/label/metric: value}`` for every present value (absences are left out)."""
        if self.result is None:
            return {}
        out = {}
        for label, row in self.result["per_regime"].items():
            for metric, value in row.items():
                if value is not None:
                    out[f"{self.prefix}/{label}/{metric}"] = float(value)
        for metric, value in self.result["overall"].items():
            if value is not None:
                out[f"{self.prefix}/overall/{metric}"] = float(value)
        return out

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # every rank gathers (the process group is still up here; on_fit_end runs after teardown)
        gathered = _gather(trainer, (self.steps, self._batch_index))
        self._rank_steps = [steps for steps, _ in gathered]
        self._rank_batch_index = [index for _, index in gathered]
        if self.score() is not None:
            self._publish(trainer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.result is None:
            rank_zero_warn("RewardStreamCallback recorded no training steps; nothing to score")

    @rank_zero_only
    def _publish(self, trainer: pl.Trainer) -> None:
        assert self.result is not None
        metrics = self.scalar_metrics()
        table = format_table(self.result)
        markdown = format_markdown(self.result)
        distributed = self._rank_steps is not None and len(self._rank_steps) > 1
        for lg in trainer.loggers:
            if metrics:
                lg.log_metrics(metrics, step=trainer.global_step)
            experiment = getattr(lg, "experiment", None)
            if hasattr(experiment, "add_text"):
                experiment.add_text(f"{self.prefix}/table", markdown, trainer.global_step)
            log_dir = getattr(lg, "log_dir", None)
            if log_dir:
                out = Path(log_dir)
                replace_atomically(out / "stream_table.txt", _write_text(table + "\n"))
                text = json_text(self.result) + "\n"
                replace_atomically(out / "stream_metrics.json", _write_text(text))
                if self.save_trace:
                    self._write_traces(out, distributed)
            lg.save()

    def _write_traces(self, out: Path, distributed: bool) -> None:
        assert self._rank_steps is not None
        for r, steps in enumerate(self._rank_steps):
            if not steps:
                continue
            name = f"stream_trace_rank{r}.jsonl" if distributed else "stream_trace.jsonl"
            replace_atomically(out / name, lambda p, s=steps: write_jsonl(s, p))

"""Lightning callback: record a reward stream during ``fit`` and score it at the end.

Per training batch, :class:`RewardStreamCallback` reads the reward, the regime label and, when
present, the regime origin, reward components, the invalid-action flag, the effective rank and
the episode-end flag. Each value is looked up, in order, in what ``training_step`` returned (a
dict), in the batch (when it is a dict) and in what the module logged with ``self.log`` during
that same step (components as ``components/NAME``); a value logged at an earlier step is never
carried forward (``trainer.callback_metrics`` would: an unmeasured step would read as measured).
At the end of fit the trace is scored with
:func:`~continual_eval.stream.metrics.compute_all_metrics`; present values are logged as
``stream/<label>/<metric>`` to every logger of the Trainer (absent ones are not logged: absence is
not zero), the table goes to TensorBoard as markdown text, and loggers with a ``log_dir`` get
``stream_table.txt``, ``stream_metrics.json`` and (``save_trace=True``) ``stream_trace.jsonl``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from continual_eval.stream.metrics import compute_all_metrics
from continual_eval.stream.rewards import RewardSpec, UpperBound
from continual_eval.stream.table import format_markdown, format_table
from continual_eval.stream.trace import EpisodeStep, EpisodeTrace, write_jsonl

__all__ = ["RewardStreamCallback"]

_MISSING = object()


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


class RewardStreamCallback(pl.Callback):
    """Record ``(reward, regime label, origin, ...)`` per training step; score at fit end.

    Args:
        reward_key, regime_key, origin_key, components_key, invalid_key, effective_rank_key,
            episode_end_key: where to find each reading (see the module docstring).
        anchor, alpha, eps, recovery_floor, tail_fraction, zero_shot_window, gamma,
            episode_end_components, solve_component: passed to ``compute_all_metrics``.
        ceiling: an explicit ceiling ``R_ub`` (a number), or ``None``.
        reward_spec: a reward specification as a dict (``RewardSpec.to_dict`` form); its analytic
            bound is the ceiling. Give at most one of ``ceiling`` and ``reward_spec``.
        save_trace: write the recorded trace as JSON lines next to the table.
        prefix: metric-name prefix for the loggers.
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
    ) -> None:
        super().__init__()
        if ceiling is not None and reward_spec is not None:
            raise ValueError("give a ceiling or a reward_spec, not both")
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
        self.steps: list[EpisodeStep] = []
        self._logged: dict[str, Any] = {}  # what the module logged during the current step
        self.trace: EpisodeTrace | None = None
        self.result: dict[str, Any] | None = None

    # ------------------------------------------------------------------ recording
    def _lookup(self, key: str, outputs: Any, batch: Any, trainer: pl.Trainer) -> Any:
        for source in (outputs, batch, self._logged):
            if isinstance(source, Mapping) and key in source:
                return source[key]
        return _MISSING

    def _components(self, outputs: Any, batch: Any, trainer: pl.Trainer) -> dict[str, float]:
        key = self.keys["components"]
        found = self._lookup(key, outputs, batch, trainer)
        if isinstance(found, Mapping):
            return {str(k): float(_scalar(v)) for k, v in found.items()}
        head = f"{key}/"
        return {
            k[len(head) :]: float(_scalar(v)) for k, v in self._logged.items() if k.startswith(head)
        }

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.steps, self.trace, self.result = [], None, None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Record what the module logs *at this step*: trainer.callback_metrics keeps the last
        # logged value, which would turn an unmeasured step into a stale reading (absence rule).
        logged = self._logged
        class_log = type(pl_module).log

        def log(name: str, value: Any, *args: Any, **kwargs: Any) -> None:
            logged[name] = value
            class_log(pl_module, name, value, *args, **kwargs)

        pl_module.log = log  # type: ignore[method-assign]

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._logged.clear()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pl_module.__dict__.pop("log", None)  # back to the class's own log

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        pl_module.__dict__.pop("log", None)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = len(self.steps)
        reward = self._lookup(self.keys["reward"], outputs, batch, trainer)
        if reward is _MISSING:
            raise KeyError(
                f"RewardStreamCallback: no {self.keys['reward']!r} at training step {step}: "
                "return it from training_step or log it"
            )
        label = self._lookup(self.keys["regime"], outputs, batch, trainer)
        if label is _MISSING:
            raise KeyError(
                f"RewardStreamCallback: no regime label {self.keys['regime']!r} at training step "
                f"{step}: return it from training_step"
            )
        label = _scalar(label)
        if isinstance(label, float) and label.is_integer():
            label = int(label)
        origin = self._lookup(self.keys["origin"], outputs, batch, trainer)
        origin = None if origin is _MISSING or origin is None else str(_scalar(origin))
        invalid = self._lookup(self.keys["invalid"], outputs, batch, trainer)
        rank = self._lookup(self.keys["rank"], outputs, batch, trainer)
        end = self._lookup(self.keys["end"], outputs, batch, trainer)
        reward = float(_scalar(reward))
        if not math.isfinite(reward):
            raise ValueError(f"RewardStreamCallback: reward at training step {step} is {reward}")
        self.steps.append(
            EpisodeStep(
                step=step,
                reward=reward,
                regime_id=str(label),
                regime_origin=origin,
                components=self._components(outputs, batch, trainer) or None,
                invalid_action=None if invalid is _MISSING else bool(_scalar(invalid)),
                effective_rank=None if rank is _MISSING else float(_scalar(rank)),
                episode_end=False if end is _MISSING else bool(_scalar(end)),
            )
        )

    # ------------------------------------------------------------------ scoring
    def score(self) -> dict[str, Any] | None:
        """Build the trace from what was recorded and score it (``None`` if nothing recorded)."""
        if not self.steps:
            return None
        self.trace = EpisodeTrace(steps=self.steps)
        self.result = compute_all_metrics([self.trace], ceiling=self._ceiling, **self.metric_kwargs)
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

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.score() is None:
            rank_zero_warn("RewardStreamCallback recorded no training steps; nothing to score")
            return
        self._publish(trainer)

    @rank_zero_only
    def _publish(self, trainer: pl.Trainer) -> None:
        assert self.result is not None
        metrics = self.scalar_metrics()
        table = format_table(self.result)
        markdown = format_markdown(self.result)
        for lg in trainer.loggers:
            if metrics:
                lg.log_metrics(metrics, step=trainer.global_step)
            experiment = getattr(lg, "experiment", None)
            if hasattr(experiment, "add_text"):
                experiment.add_text(f"{self.prefix}/table", markdown, trainer.global_step)
            log_dir = getattr(lg, "log_dir", None)
            if log_dir:
                out = Path(log_dir)
                out.mkdir(parents=True, exist_ok=True)
                (out / "stream_table.txt").write_text(table + "\n", encoding="utf-8")
                (out / "stream_metrics.json").write_text(
                    json.dumps(self.result, indent=2, allow_nan=False), encoding="utf-8"
                )
                if self.save_trace and self.trace is not None:
                    write_jsonl(self.trace, out / "stream_trace.jsonl")
            lg.save()

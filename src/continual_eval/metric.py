"""``ContinualMetrics``: the accuracy matrix as a torchmetrics ``Metric``, one stage at a time."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.exceptions import TorchMetricsUserError

from continual_eval.functional import continual_metrics
from continual_eval.functional._validation import (
    UNIT_BOUNDS,
    check_cells,
    check_direction,
    check_forgetting_convention,
    resolve_bounds,
)
from continual_eval.functional._workspace import (
    triangle_masks,
)
from continual_eval.functional.family import METRIC_KEYS


def replicated_reduction(gathered: Tensor) -> Tensor:
    """DDP reduction for states every rank must hold identically (the accuracy matrix).

    ``gathered`` is the ranks' copies stacked on dim 0. Summing or averaging would corrupt R (a
    sum doubles it; a mean silently blends ranks that disagree), so the copies are compared
    (NaN equal to NaN) and rank 0's is returned; ranks that disagree raise an error naming them.
    """
    reference = gathered[0]
    for rank in range(1, gathered.shape[0]):
        if not torch.equal(torch.isnan(gathered[rank]), torch.isnan(reference)) or not torch.equal(
            torch.nan_to_num(gathered[rank], nan=0.0), torch.nan_to_num(reference, nan=0.0)
        ):
            raise RuntimeError(
                f"ContinualMetrics state differs between rank 0 and rank {rank}: every rank must "
                "update with the same row (reduce correct/total counts across ranks first)"
            )
    return reference


class ContinualMetrics(Metric):
    r"""ACC, BWT, FWT and forgetting of an accuracy matrix filled one training stage at a time.

    Call [`update_baseline`][continual_eval.metric.ContinualMetrics.update_baseline] once with the
    untrained model's per-task accuracies, then
    [`update`][continual_eval.metric.ContinualMetrics.update] after each stage with that stage's row
    ``R[s, :]`` (length ``num_tasks``; NaN is allowed in cells no metric reads, ``j > s + 1``,
    and, as an absent cell, in the old tasks ``j < s`` of a stage before the last: the metrics
    that read an absent cell are NaN).
    [`compute`][continual_eval.metric.ContinualMetrics.compute] returns
    [`continual_metrics`][continual_eval.continual_metrics] of the stages so far, ``R[:s, :s]`` and
    ``b[:s]``. Calling the metric, ``metric(row)`` (torchmetrics' ``forward``), is
    ``metric.update(row); return metric.compute()``: it records the row and returns the metrics of
    all stages so far, not of that row alone (one row is no accuracy matrix).

    `load_state_dict` refuses, naming the key, a state of another ``num_tasks``, a partial
    state, a stage counter outside ``[0, num_tasks]`` and (with ``validate``) recorded rows that
    fail validation; the metric then keeps what it had recorded. Loaded states take the metric's
    dtype and device.

    Distributed: the states are *replicated*, not partial — every rank updates with the same row,
    which callers obtain by reducing correct/total counts across ranks before
    [`update`][continual_eval.metric.ContinualMetrics.update] (as
    [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] does). A sync therefore compares
    the ranks' copies and keeps rank 0's (`replicated_reduction`); it never sums or averages R.

    Args:
        num_tasks: ``T``, the number of tasks (rows and columns of R).
        forgetting: ``"peak"`` (default) or ``"chaudhry"``; see the functional layer.
        higher_is_better: ``False`` for a loss-like score: BWT, FWT and forgetting are signed as
            in [`continual_metrics`][continual_eval.continual_metrics] (positive BWT/FWT still mean
            better; forgetting is the rise above the lowest value reached). Kept as
            ``scores_higher_is_better``: torchmetrics' own ``higher_is_better`` describes the
            outputs, whose directions differ, and stays ``None``.
        bounds: validation range ``(lo, hi)`` of every recorded value (default ``(0.0, 1.0)``);
            ``None`` checks only that used values are finite.
        validate: check every row and the baseline as they arrive.
        dtype: floating dtype of R and b (default: torch's default dtype); ``float64`` keeps
            ``correct / total`` exact. ``set_dtype`` also works; the stage counter stays integer.

    Example:
        >>> import torch
        >>> metric = ContinualMetrics(num_tasks=2)
        >>> metric.update_baseline(torch.tensor([0.5, 0.5]))
        >>> metric.update(torch.tensor([0.9, 0.6]))
        >>> metric.update(torch.tensor([0.7, 0.95]))
        >>> {k: round(v.item(), 4) for k, v in metric.compute().items()}
        {'acc': 0.825, 'bwt': -0.2, 'fwt': 0.1, 'forgetting': 0.2}
    """

    is_differentiable = False
    higher_is_better: bool | None = None
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    scores_state: Tensor
    baseline_state: Tensor
    stages: Tensor

    def __init__(
        self,
        num_tasks: int,
        *,
        forgetting: str = "peak",
        higher_is_better: bool = True,
        bounds: tuple[float, float] | None = UNIT_BOUNDS,
        validate: bool = True,
        dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(num_tasks, int) or num_tasks < 1:
            raise ValueError(f"num_tasks must be a positive int, got {num_tasks!r}")
        check_forgetting_convention(forgetting)
        check_direction(higher_is_better)
        self.num_tasks = num_tasks
        self.forgetting = forgetting
        self.scores_higher_is_better = higher_is_better
        self.bounds = resolve_bounds(bounds)
        self.validate = validate
        self._checked_row: tuple[int, Tensor] | None = None  # the last row `check_row` passed
        nan = float("nan")
        dtype = dtype or torch.get_default_dtype()
        if not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating dtype, got {dtype}")
        self.add_state(
            "scores_state",
            torch.full((num_tasks, num_tasks), nan, dtype=dtype),
            dist_reduce_fx=replicated_reduction,
            persistent=True,
        )
        self.add_state(
            "baseline_state",
            torch.full((num_tasks,), nan, dtype=dtype),
            dist_reduce_fx=replicated_reduction,
            persistent=True,
        )
        self.add_state(
            "stages",
            torch.zeros((), dtype=torch.long),
            dist_reduce_fx=replicated_reduction,
            persistent=True,
        )

    # ------------------------------------------------------------------ accessors
    @property
    def num_stages(self) -> int:
        """Number of stages recorded so far."""
        return int(self.stages)

    @property
    def scores(self) -> Tensor:
        """The rows recorded so far, ``[num_stages, num_tasks]`` (NaN = not evaluated)."""
        return self.scores_state[: self.num_stages].clone()

    @property
    def baseline(self) -> Tensor:
        """The untrained baseline, ``[num_tasks]`` (NaN until
        [`update_baseline`][continual_eval.metric.ContinualMetrics.update_baseline])."""
        return self.baseline_state.clone()

    @property
    def has_baseline(self) -> bool:
        return bool(torch.isfinite(self.baseline_state[1:]).all()) or self.num_tasks == 1

    # ------------------------------------------------------------------ updates
    def _as_row(self, name: str, values: Tensor) -> Tensor:
        values = torch.as_tensor(values)
        if not values.is_floating_point():
            raise TypeError(f"{name} must have a floating dtype, got {values.dtype}")
        if values.shape != (self.num_tasks,):
            raise ValueError(
                f"{name} must have shape [num_tasks] = [{self.num_tasks}], "
                f"got {tuple(values.shape)}"
            )
        return values.detach().to(device=self.scores_state.device, dtype=self.scores_state.dtype)

    def _check(
        self, name: str, values: Tensor, mask: Tensor, desc: str, prefix: tuple[int, ...]
    ) -> None:
        try:
            check_cells(name, values, mask, desc, self.bounds, index_prefix=prefix)
        except ValueError as err:
            raise ValueError(f"{err}; nothing was recorded") from None

    def check_baseline(self, baseline: Tensor) -> Tensor:
        """Check ``baseline`` without recording it: raises what
        [`update_baseline`][continual_eval.metric.ContinualMetrics.update_baseline] would raise;
        returns it in the metric's dtype and device."""
        baseline = self._as_row("baseline", baseline)
        if self.validate:
            mask = torch.ones(self.num_tasks, dtype=torch.bool, device=baseline.device)
            mask[0] = False
            self._check("baseline", baseline, mask, "baseline[1:]", ())
        return baseline

    def update_baseline(self, baseline: Tensor) -> None:
        """Record the untrained model's accuracy on every task, ``b[j]`` (``b[0]`` may be NaN)."""
        self.baseline_state.copy_(self.check_baseline(baseline))
        self._computed = None

    def check_row(self, row: Tensor) -> Tensor:
        """Check ``row`` as the next stage's row without recording it: raises what
        [`update`][continual_eval.metric.ContinualMetrics.update] would raise; returns the row in
        the metric's dtype and device."""
        stage = self.num_stages
        if stage >= self.num_tasks:
            raise ValueError(
                f"ContinualMetrics(num_tasks={self.num_tasks}) already holds {stage} stages; "
                f"cannot record stage {stage} (more training stages than tasks)"
            )
        row = self._as_row(f"row of stage {stage}", row)
        if self.validate:
            masks = triangle_masks(self.num_tasks, row.device)
            required = masks.required[stage]
            self._check("scores", row, required, "used cells (j <= i + 1)", (stage,))
            present = masks.used[stage] & ~required & ~torch.isnan(row)  # absent: NaN allowed
            self._check("scores", row, present, "used cells (j <= i + 1)", (stage,))
        self._checked_row = (stage, row)  # `update` of this very tensor next: not checked again
        return row

    def update(self, row: Tensor) -> None:
        """Append the next stage's row ``R[s, :]`` (accuracy on every task after stage ``s``)."""
        checked, self._checked_row = self._checked_row, None
        if checked is None or checked[0] != self.num_stages or checked[1] is not row:
            row = self.check_row(row)
            self._checked_row = None
        self.scores_state[self.num_stages] = row
        self.stages += 1

    def forward(self, row: Tensor) -> dict[str, Tensor]:
        """Record ``row`` as the next stage and return
        [`compute`][continual_eval.metric.ContinualMetrics.compute] of all stages so far.

        torchmetrics' default forward computes a "batch value" on a reset metric and then merges
        it into the global state through each state's reduction; our states are not a reduction
        of batch states (the matrix grows a row per stage), so ``forward`` is simply update then
        compute. The row stays recorded if compute then raises (no baseline for FWT yet).
        """
        if self._is_synced:
            raise TorchMetricsUserError(
                "The Metric shouldn't be synced when performing ``forward``. "
                "HINT: Did you forget to call ``unsync`` ?."
            )
        self.update(row)
        result: dict[str, Tensor] = self.compute()
        self._forward_cache = result  # type: ignore[assignment]  # torchmetrics types it as None
        return result

    # ------------------------------------------------------------------ results
    def compute(self) -> dict[str, Tensor]:
        """``continual_metrics(R[:s, :s], b[:s])`` over the ``s`` stages recorded so far: the
        final metrics of the family (`METRIC_KEYS`)."""
        s = self.num_stages
        if s == 0:
            raise RuntimeError("ContinualMetrics.compute() needs at least one update(row)")
        if s > 1 and not bool(torch.isfinite(self.baseline_state[1:s]).all()):
            raise RuntimeError(
                f"ContinualMetrics has no baseline for tasks 1..{s - 1}: call update_baseline(b) "
                "with the untrained model's accuracies before computing FWT"
            )
        values = continual_metrics(
            self.scores_state[:s, :s],
            self.baseline_state[:s],
            forgetting=self.forgetting,
            higher_is_better=self.scores_higher_is_better,
            validate=False,
        )
        return {key: values[key] for key in METRIC_KEYS}

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> ContinualMetrics:
        # torchmetrics' set_dtype casts every state; the stage counter must stay an integer.
        super()._apply(fn, *args, **kwargs)
        if self.stages.is_floating_point():
            self.stages = self.stages.to(dtype=torch.long)
        return self

    def _loaded_state_problem(self, state_dict: dict[str, Any], prefix: str) -> str | None:
        """What is wrong with this metric's entries of ``state_dict`` (``None`` if nothing): the
        shapes must match ``num_tasks``, the stage counter must be an integer in
        ``[0, num_tasks]`` and, with ``validate``, the recorded rows must pass
        [`update`][continual_eval.metric.ContinualMetrics.update]'s checks."""
        T = self.num_tasks
        head = f"ContinualMetrics(num_tasks={T}) cannot load this state"
        expected_shapes = {"scores_state": (T, T), "baseline_state": (T,), "stages": ()}
        for key, shape in expected_shapes.items():
            value = state_dict[prefix + key]
            if not isinstance(value, Tensor):
                return f"{head}: {prefix}{key} is a {type(value).__name__}, not a tensor"
            if tuple(value.shape) != shape:
                if key != "stages" and value.ndim >= 1:  # the num_tasks the state was saved with
                    head = f"ContinualMetrics(num_tasks={T}) cannot load a state of "
                    head += f"num_tasks={value.shape[0]}"
                return f"{head}: {prefix}{key} has shape {tuple(value.shape)}, expected {shape}"
        for key in ("scores_state", "baseline_state"):
            if not state_dict[prefix + key].is_floating_point():
                dtype = state_dict[prefix + key].dtype
                return f"{head}: {prefix}{key} has dtype {dtype}, expected a floating dtype"
        stages = state_dict[prefix + "stages"]
        value = stages.item()
        if (
            stages.is_complex()
            or stages.dtype == torch.bool
            or not math.isfinite(value)
            or value != int(value)
        ):
            return f"{head}: {prefix}stages = {value!r} is not an integer stage counter"
        if not 0 <= value <= T:
            return (
                f"{head}: {prefix}stages = {int(value)} is out of range [0, {T}] "
                "(the number of recorded stages)"
            )
        if self.validate and int(value) > 0:
            scores = state_dict[prefix + "scores_state"].detach()[: int(value)]
            masks = triangle_masks(T, scores.device)
            required = masks.required[: int(value)]
            present = masks.used[: int(value)] & ~required & ~torch.isnan(scores)
            try:
                for mask in (required, present):
                    check_cells("scores", scores, mask, "used cells (j <= i + 1)", self.bounds)
            except ValueError as err:
                return f"{head}: in {prefix}scores_state, {err}"
        return None

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # torchmetrics assigns whatever the state holds; check it first, and on a problem report
        # it the way torch reports a size mismatch (RuntimeError from load_state_dict) and keep
        # this metric's recorded state untouched.
        keys = [prefix + key for key in self._defaults]
        present = [key for key in keys if key in state_dict]
        problem: str | None = None
        if present and len(present) < len(keys):
            absent = [key for key in keys if key not in state_dict]
            problem = (
                f"ContinualMetrics(num_tasks={self.num_tasks}) cannot load a partial state: "
                f"{', '.join(absent)} missing (found {', '.join(present)})"
            )
        elif present:
            problem = self._loaded_state_problem(state_dict, prefix)
        # none present: nothing to load (torchmetrics does not report metric states as missing)
        if problem is not None:
            error_msgs.append(problem)
            for key in present:
                state_dict.pop(key)
            return
        if present:  # cast to this metric's dtype and device, as torch does for parameters
            for key in keys:
                current = getattr(self, key[len(prefix) :])
                state_dict[key] = state_dict[key].detach().to(current.device, current.dtype)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        # torchmetrics does not persist its update counter; restore it so compute() does not warn.
        self._update_count = self.num_stages
        self._computed = None

    def plot(self, val: Any = None, ax: Any = None) -> Any:
        """Draw the accuracy matrix as a heatmap (unevaluated cells empty); returns ``(fig, ax)``.

        ``val`` may be a ``[S, T]`` matrix to draw instead of the recorded one. Needs matplotlib
        (``pip install continual-eval[plot]``).
        """
        from continual_eval.plotting import plot_accuracy_matrix

        scores = self.scores if val is None else torch.as_tensor(val)
        return plot_accuracy_matrix(scores, self.baseline if val is None else None, ax=ax)

r"""The record of a continual-learning run, without Lightning: what has been measured so far and
what ``results.json`` is built from.

`RunRecord` holds, for one run of ``T`` tasks:

* one [`ContinualMetrics`][continual_eval.ContinualMetrics] per score matrix (``R[i, j]`` and the
  baseline ``b[j]`` of every scorer, the primary first);
* the step curves of the evaluations inside and at the end of the stages
  (`StepCurves`, with ``eval_every_n_steps``) and the
  cumulative optimizer-step counter they are plotted against;
* the cost of every recorded stage (`StageCost`);
* optional *sections*, objects with the `RecordSection` protocol that record something of
  their own from every stage's evaluation (the class-incremental confusion counts are one:
  `ClassIncrementalRecord`).

It takes evaluations as `Scored` (every matrix's row over all tasks and what count-based
scorers report besides their scores), checks a whole stage before recording any of it (a bad
row of one matrix, or of a section, leaves every matrix and section as it was), round-trips
through `RunRecord.state_dict` / `RunRecord.load_state_dict` (what a checkpoint
holds) and builds the typed results, `RunRecord.continual_results`.
[`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] owns one and feeds it from its
hooks; everything here runs without a Trainer.
"""

from __future__ import annotations

import bisect
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import Tensor

from continual_eval.metric import ContinualMetrics
from continual_eval.results import (
    ContinualResults,
    Coverage,
    ReferenceScores,
    RunCost,
    ScoreMatrix,
    StepEvaluations,
)
from continual_eval.results.schema import SCORING_MODES, Scoring
from continual_eval.stage_cost import StageCost
from continual_eval.step_curves import StepCurves

if TYPE_CHECKING:  # pragma: no cover
    from continual_eval.evaluation.loop import TaskEvaluation

__all__ = ["STEP_COUNTER", "MatrixSpec", "RecordSection", "RunRecord", "Scored"]

#: What the ``step`` of a per-step evaluation counts (stored in ``results.json``).
STEP_COUNTER = (
    "cumulative optimizer steps of the whole run: increments of trainer.global_step summed over "
    "all fits (global_step restarts at 0 with each new Trainer; this counter does not)"
)


@dataclass(frozen=True)
class MatrixSpec:
    """What one score matrix holds: the scorer's ``name``, its direction and the range of its
    values (``None``: unbounded; every recorded cell is checked against it)."""

    score: str
    higher_is_better: bool = True
    bounds: tuple[float, float] | None = (0.0, 1.0)
    #: ``"teacher-forced"`` or ``"free-running"`` (a scorer's optional ``scoring``), else ``None``
    scoring: Scoring | None = None

    @classmethod
    def of(cls, scorer: Any) -> MatrixSpec:
        """The spec of a [`Scorer`][continual_eval.evaluation.Scorer]."""
        scoring = getattr(scorer, "scoring", None)  # optional: sequence-model scorers say it
        if scoring is not None and scoring not in SCORING_MODES:
            raise ValueError(
                f"scorer {scorer.name!r}: scoring must be one of {', '.join(SCORING_MODES)} "
                f"(or absent), got {scoring!r}"
            )
        return cls(str(scorer.name), bool(scorer.higher_is_better), scorer.bounds, scoring)


@dataclass(frozen=True)
class Scored:
    """One evaluation as the record takes it.

    Attributes:
        rows: matrix name -> its row ``[T]`` float64 (NaN: the task was not scored).
        details: matrix name -> what its count-based scorer reported besides the scores
            (``details(reduced_counts)``, e.g. confusion blocks ``[len(task_ids), K, C]``);
            scorers without details are absent.
        task_ids: the tasks scored, in the order of the details' rows.
        held_out: matrix name -> the held-out sets' row ``[H]`` (empty without held-out sets).
        predictions: the generation scorers' kept items, gathered from every rank
            (`continual_eval._predictions.PredictionItem`; ``None`` when not kept).
        items: matrix name -> task id -> its per-item values ``[n_j]`` in test-set order (the
            matrices with per-item records; empty without); ids ``num_tasks + h``: the held-out
            set ``h``'s items.
        labels: as ``items``, each item's label (see the field).
    """

    rows: Mapping[str, Tensor]
    details: Mapping[str, Any] = field(default_factory=dict)
    task_ids: tuple[int, ...] = ()
    held_out: Mapping[str, Tensor] = field(default_factory=dict)
    items: Mapping[str, Mapping[int, Tensor]] = field(default_factory=dict)
    predictions: tuple[Any, ...] | None = None
    #: matrix name -> task id -> its items' labels ``[n_j]`` int64 (the class-incremental
    #: scorers at the baseline, ``keep_labels``); empty without
    labels: Mapping[str, Mapping[int, Tensor]] = field(default_factory=dict)

    @classmethod
    def from_evaluation(
        cls, names: Sequence[str], evaluation: TaskEvaluation, num_tasks: int, num_held_out: int = 0
    ) -> Scored:
        """From [`evaluate_tasks`][continual_eval.evaluation.evaluate_tasks]'s result, whose scores
        are aligned with the scorers named ``names``: each row spread over the ``num_tasks`` tasks;
        the loaders after them (ids ``num_tasks + h``) are the ``num_held_out`` held-out sets."""
        ids = torch.tensor(list(evaluation.task_ids), dtype=torch.int64)
        tasks = ids < num_tasks
        rows: dict[str, Tensor] = {}
        held_out: dict[str, Tensor] = {}
        for name, scores in zip(names, evaluation.scores_by_scorer, strict=True):
            scores = scores.to(torch.float64)
            rows[name] = torch.full((num_tasks,), math.nan, dtype=torch.float64)
            rows[name][ids[tasks]] = scores[tasks]
            if num_held_out:
                held_out[name] = torch.full((num_held_out,), math.nan, dtype=torch.float64)
                held_out[name][ids[~tasks] - num_tasks] = scores[~tasks]
        details = {
            name: value
            for name, value in zip(names, evaluation.details_by_scorer, strict=False)
            if value is not None
        }
        task_ids = tuple(int(j) for j in ids[tasks])
        items = {
            name: dict(zip(evaluation.task_ids, values, strict=True))
            for name, values in zip(names, evaluation.items_by_scorer, strict=False)
            if values is not None
        }
        labels = {
            name: dict(zip(evaluation.task_ids, values, strict=True))
            for name, values in zip(names, evaluation.labels_by_scorer, strict=False)
            if values is not None
        }
        return cls(rows, details, task_ids, held_out, items, labels=labels)


class RecordSection(Protocol):
    """An optional part of a `RunRecord`: records something of its own from every stage's
    evaluation and adds it to the results.

    `record_baseline` takes the untrained model's evaluation (raise ``ValueError`` to
    refuse it); `check_stage` runs for every section before anything of the stage is
    recorded (raise ``ValueError`` to refuse the stage: nothing is recorded anywhere);
    `record_stage`
    then records it and returns warnings for the caller to show (on rank 0). ``key`` names the
    section's entry in the record's state.
    """

    key: str

    def record_baseline(self, scored: Scored) -> None: ...

    def check_stage(self, stage: int, scored: Scored) -> None: ...

    def record_stage(self, stage: int, scored: Scored) -> list[str]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None: ...

    def add_to(self, results: ContinualResults) -> ContinualResults: ...

    # the stage journal (`continual_eval._stage_journal`): JSON values, tensors through
    # `tensor_to_json`
    def journal_settings(self) -> dict[str, Any]:
        """What the section's ``from_journal`` needs to make an empty section like this one."""
        ...

    def journal_part(self, stage: int | None) -> Any:
        """What the baseline (``stage=None``) or stage ``stage`` added, as JSON values."""
        ...

    def replay_part(self, stage: int | None, part: Any) -> None:
        """Record ``part`` (`journal_part`'s) again, as `record_baseline` / `record_stage` did."""
        ...


def tensor_to_json(t: Tensor) -> dict[str, Any]:
    """A tensor as JSON values (``dtype``, ``shape``, the flat ``data``; a float NaN is ``null``,
    each float written in its shortest round-trip form, so `tensor_from_json` gives it back bit
    for bit). Non-finite floats other than NaN are not kept (every recorded cell is finite)."""
    t = t.detach().cpu()
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "data": t.reshape(-1).tolist(),
    }


def tensor_from_json(value: Mapping[str, Any]) -> Tensor:
    """The tensor `tensor_to_json` wrote (``null`` -> NaN)."""
    dtype = getattr(torch, str(value["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {value['dtype']!r}")
    shape = [int(n) for n in value["shape"]]
    if dtype.is_floating_point:
        data = torch.from_numpy(np.array(value["data"], dtype=np.float64)).to(dtype)
    else:
        data = torch.tensor(list(value["data"]), dtype=dtype)
    return data.reshape(shape)


def _row(values: Sequence[Any]) -> Tensor:
    """A journal row (``null`` -> NaN) as ``[n]`` float64."""
    return torch.from_numpy(np.array(values, dtype=np.float64).reshape(-1))


class RunRecord:
    """The matrices, curves, costs and sections of one run (see the module docstring).

    Args:
        matrices: matrix name -> `MatrixSpec`, the primary first.
        task_names: one name per task (``T`` tasks).
        forgetting: the forgetting convention of every matrix's metrics.
        metadata: free-form JSON-serialisable dict for ``results.json``.
        run_id: the run's id (default: a new one).
        reference: the primary matrix's reference scores (``reference=`` resolved).
        lca_beta: ``beta`` of the learning curve area, or ``None``.
        step_curves: whether the run evaluates inside its stages (``eval_every_n_steps``): the
            results then hold the curves of every matrix.
        step_subset: the fixed subset of the per-step evaluations as ``results.json`` describes
            it (``size``, ``seed``, ``samples_per_task``, ``rule``), ``None`` for whole test sets.
        sections: the optional sections.
    """

    def __init__(
        self,
        matrices: Mapping[str, MatrixSpec],
        task_names: Sequence[str],
        *,
        forgetting: str = "peak",
        metadata: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        reference: ReferenceScores | None = None,
        lca_beta: int | None = None,
        step_curves: bool = False,
        step_subset: Mapping[str, Any] | None = None,
        sections: Sequence[RecordSection] = (),
    ) -> None:
        if not matrices:
            raise ValueError("a run record needs at least one score matrix")
        self.specs: dict[str, MatrixSpec] = dict(matrices)
        self.task_names: list[str] = list(task_names)
        self.forgetting = forgetting
        self.metadata = dict(metadata or {})
        self.run_id = run_id or uuid.uuid4().hex
        self.reference = reference
        self.lca_beta = lca_beta
        self.step_curves = step_curves
        self.step_subset = None if step_subset is None else dict(step_subset)
        self.sections: dict[str, RecordSection] = {s.key: s for s in sections}
        #: matrix name -> its rows and baseline
        self.matrices: dict[str, ContinualMetrics] = self._new_matrices()
        self.baseline_done = False
        #: cumulative optimizer steps of the run at the last observation (the curves' step)
        self.steps_trained = 0
        self.curves = StepCurves(list(self.specs))
        self.costs: list[StageCost] = []
        #: the run ended (`end_run`) with fewer stages than tasks; a later stage clears it
        self.ended_early = False

    def _new_matrices(self) -> dict[str, ContinualMetrics]:
        return {
            name: ContinualMetrics(
                len(self.task_names),
                forgetting=self.forgetting,
                higher_is_better=spec.higher_is_better,
                bounds=spec.bounds,
                validate=True,
                dtype=torch.float64,
                # every rank records the same rows (counts are reduced before), and the states
                # stay on the CPU, which an NCCL-only process group cannot gather
                sync_on_compute=False,
            )
            for name, spec in self.specs.items()
        }

    # ------------------------------------------------------------------ views
    @property
    def num_tasks(self) -> int:
        return len(self.task_names)

    @property
    def primary(self) -> str:
        """The primary matrix's name (the first)."""
        return next(iter(self.specs))

    @property
    def num_stages(self) -> int:
        """Stages recorded (rows of every matrix)."""
        return self.matrices[self.primary].num_stages

    @property
    def coverage(self) -> Coverage | None:
        """What the metrics cover when the run ended with fewer stages than tasks."""
        if not self.ended_early:
            return None
        return Coverage(self.num_stages, self.num_tasks)

    # ------------------------------------------------------------------ recording
    def _check_rows(self, scored: Scored, check: str, problem: str) -> dict[str, Tensor]:
        """Every matrix's row passes ``check`` (``problem`` names what is refused, with
        ``{name}``), before any is recorded; returns the checked rows (the metric's dtype)."""
        checked = {}
        for name, metric in self.matrices.items():
            what = problem.format(name=repr(name))
            if name not in scored.rows:
                raise ValueError(f"{what}: the evaluation has no {name!r} row")
            try:
                checked[name] = getattr(metric, check)(scored.rows[name])
            except (TypeError, ValueError) as err:
                raise ValueError(f"{what}: {err}") from err
        return checked

    def record_baseline(self, scored: Scored) -> None:
        """Record the untrained model's scores of every matrix (all or none)."""
        self._check_rows(
            scored,
            "check_baseline",
            "the untrained model's {name} scores (the baseline) are refused",
        )
        for section in self.sections.values():
            section.record_baseline(scored)
        for name, metric in self.matrices.items():
            metric.update_baseline(scored.rows[name])
        self.baseline_done = True

    def record_stage(self, stage: int, scored: Scored, cost: StageCost | None = None) -> list[str]:
        """Record stage ``stage``'s rows (the next stage), its sections' parts and its cost; a
        refused row or section records nothing. Returns the sections' warnings."""
        if stage != self.num_stages:
            raise ValueError(
                f"stage {stage} cannot be recorded after {self.num_stages} stages (stages are "
                "recorded in order, each once)"
            )
        problem = f"stage {stage} produced {{name}} scores the metrics cannot use"
        checked = self._check_rows(scored, "check_row", problem)
        ids = torch.tensor(scored.task_ids, dtype=torch.long)
        ids = ids[ids <= stage + 1]  # the scored cells the metrics read
        for name, row in scored.rows.items():  # an old task's NaN is absent only if unscored
            scored_nan = ids[torch.isnan(row[ids])]
            if scored_nan.numel():
                j = int(scored_nan[0])
                raise ValueError(
                    f"{problem.format(name=repr(name))}: scores[{stage}, {j}] is nan although "
                    f"task {j} was evaluated (only a task that was not evaluated may be absent)"
                )
        for section in self.sections.values():
            section.check_stage(stage, scored)
        for name, metric in self.matrices.items():
            metric.update(checked[name])  # checked above: not again (`check_row`)
        self.ended_early = False
        notes = [note for s in self.sections.values() for note in s.record_stage(stage, scored)]
        if cost is not None:
            self.costs = [c for c in self.costs if c.stage < stage] + [cost]
        return notes

    def record_step(
        self, step: int, stage: int, rows: Mapping[str, Tensor], full: bool
    ) -> dict[str, Tensor] | None:
        """Add an evaluation at ``step`` inside (or at the end of) stage ``stage`` to the step
        curves; returns the whole-test-set rows it replaced (the same step and stage), if any."""
        return self.curves.add(step, stage, rows, full=full)

    def end_run(self) -> Coverage | None:
        """The run ends here (no stage will be trained after the ones recorded): with fewer
        stages than tasks (and at least one), the results record it (their ``coverage``, which
        a later recorded stage clears again); returns that coverage, ``None`` otherwise."""
        self.ended_early = 0 < self.num_stages < self.num_tasks
        return self.coverage

    # ------------------------------------------------------------------ results
    def step_evaluations(self) -> StepEvaluations | None:
        """When the per-step evaluations ran (``None`` without them)."""
        if not self.step_curves:
            return None
        steps, stage, _ = self.curves.tensors(self.num_tasks)
        return StepEvaluations(
            step=steps,
            stage=stage,
            full=tuple(self.curves.full),
            step_counter=STEP_COUNTER,
            subset=self.step_subset,
        )

    def _results_inputs(self) -> tuple[dict[str, ScoreMatrix], dict[str, Any]]:
        """The matrices and keyword arguments of `ContinualResults.from_tensors` for the stages so
        far: copies (rows, baselines, curves) or values nothing changes later (the costs' tuple,
        the settings)."""
        steps = self.step_evaluations()
        matrices = {
            name: ScoreMatrix(
                score=self.specs[name].score,
                scores=metric.scores,
                baseline=metric.baseline,
                higher_is_better=self.specs[name].higher_is_better,
                bounds=self.specs[name].bounds,
                scoring=self.specs[name].scoring,
                step_scores=None if steps is None else self.curves.tensors(0, name)[2],
            )
            for name, metric in self.matrices.items()
        }
        settings: dict[str, Any] = {"task_names": tuple(self.task_names)}
        settings["forgetting"] = self.forgetting
        settings.update(metadata=dict(self.metadata), run_id=self.run_id, steps=steps)
        settings.update(cost=RunCost(tuple(self.costs)), reference=self.reference)
        return matrices, {**settings, "lca_beta": self.lca_beta, "coverage": self.coverage}

    def continual_results(
        self, *, light: bool = False, omit: Sequence[str] = ()
    ) -> ContinualResults:
        """The typed results of the stages so far: per matrix its rows, baseline, metric family,
        per-task values and (with step curves) stability and plasticity; the costs; the
        reference metrics; then each section's part (``light``: the cheaper part of a section
        that has one, ``light_add_to``, for the results of a run in progress; ``omit``: the keys
        of sections left out)."""
        matrices, settings = self._results_inputs()
        results = ContinualResults.from_tensors(matrices, **settings)
        for key, section in self.sections.items():
            if key in omit:
                continue
            light_add_to = getattr(section, "light_add_to", None) if light else None
            results = section.add_to(results) if light_add_to is None else light_add_to(results)
        return results

    def deferred_results(
        self, *, omit: Sequence[str] = ()
    ) -> Callable[[], ContinualResults] | None:
        """`continual_results` (with ``omit``) of the stages so far, as a function to call later
        (on the background writer: the metrics are computed there): what it reads is copied
        now, so that stages recorded meanwhile do not change it; a section takes part through
        its ``deferred_add_to(num_stages)`` (the class-incremental one has it). ``None`` when a
        section not in ``omit`` has none (its state is not copied: build the results now)."""
        adders = [
            getattr(section, "deferred_add_to", None)
            for key, section in self.sections.items()
            if key not in omit
        ]
        if any(adder is None for adder in adders):
            return None
        matrices, settings = self._results_inputs()
        later = [adder(self.num_stages) for adder in adders if adder is not None]

        def make() -> ContinualResults:
            results = ContinualResults.from_tensors(matrices, **settings)
            for add in later:
                results = add(results)
            return results

        return make

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything recorded, as plain values and CPU tensors (``torch.load(weights_only=True)``
        reads it back, as Lightning loads checkpoints)."""
        return {
            "run_id": self.run_id,
            "task_names": list(self.task_names),
            "forgetting": self.forgetting,
            "baseline_done": self.baseline_done,
            "matrices": {
                name: {
                    "score_name": self.specs[name].score,
                    "scores": metric.scores.clone(),
                    "baseline": metric.baseline.clone(),
                }
                for name, metric in self.matrices.items()
            },
            "steps_trained": self.steps_trained,
            "curves": self.curves.state_dict(),
            "step_subset": self.step_subset,
            "costs": [c.to_dict() for c in self.costs],
            "sections": {key: s.state_dict() for key, s in self.sections.items()},
            "ended_early": self.ended_early,
        }

    def settings_differ(self, state: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
        """``(setting, recorded, now)`` for every setting of ``state`` that differs from this
        record's (a state recorded so would relabel or mix its rows if loaded)."""
        recorded = [
            ("number of tasks", len(state["task_names"]), self.num_tasks),
            ("forgetting", state["forgetting"], self.forgetting),
            (
                "scorers",
                {name: m["score_name"] for name, m in state["matrices"].items()},
                {name: spec.score for name, spec in self.specs.items()},
            ),
            ("sections", sorted(state["sections"]), sorted(self.sections)),
        ]
        return [(key, old, new) for key, old, new in recorded if old != new]

    def load_state_dict(self, state: Mapping[str, Any], *, keep_task_names: bool = False) -> None:
        """Replace what is recorded by ``state`` (from `state_dict`); refused with a
        ``ValueError`` naming the settings when it was recorded with others (see
        `settings_differ`), and then nothing changes. ``keep_task_names``: keep this
        record's names (given by the user) instead of the recorded ones."""
        differ = self.settings_differ(state)
        if differ:
            raise ValueError(
                "the state was recorded with other settings; loading it would relabel or mix its "
                "rows: "
                + "; ".join(f"{key}: recorded {old!r}, now {new!r}" for key, old, new in differ)
            )
        matrices = self._new_matrices()
        for name, metric in matrices.items():
            recorded = state["matrices"][name]
            if state["baseline_done"]:
                metric.update_baseline(recorded["baseline"].double())
            for row in recorded["scores"]:
                metric.update(row.double())
        curves = StepCurves(list(self.specs))
        curves.load_state_dict(state["curves"])
        costs = [StageCost.from_dict(c) for c in state["costs"]]
        loaded: list[tuple[RecordSection, dict[str, Any]]] = []
        try:
            for key, section in self.sections.items():
                before = section.state_dict()
                section.load_state_dict(state["sections"][key])
                loaded.append((section, before))
        except Exception:
            for section, before in loaded:  # a later section refused: the earlier ones go back
                section.load_state_dict(before)
            raise
        self.matrices, self.curves, self.costs = matrices, curves, costs
        self.baseline_done = bool(state["baseline_done"])
        self.steps_trained = int(state["steps_trained"])
        self.ended_early = bool(state.get("ended_early", False))  # absent before 23.2
        self.run_id = str(state["run_id"])
        if state.get("step_subset") is not None:
            self.step_subset = dict(state["step_subset"])
        if not keep_task_names:
            self.task_names = list(state["task_names"])

    # ------------------------------------------------------------------ journal
    def journal_header(self) -> dict[str, Any]:
        """The journal's first line (`continual_eval._stage_journal`): the settings an empty
        record like this one is made from (`from_journal`), its sections' included."""
        reference = self.reference
        return {
            "run_id": self.run_id,
            "task_names": list(self.task_names),
            "forgetting": self.forgetting,
            "metadata": self.metadata,
            "matrices": {
                name: {
                    "score": spec.score,
                    "higher_is_better": spec.higher_is_better,
                    "bounds": None if spec.bounds is None else list(spec.bounds),
                    "scoring": spec.scoring,
                }
                for name, spec in self.specs.items()
            },
            "reference": None
            if reference is None
            else {
                "kind": reference.kind,
                "scores": reference.scores.tolist(),
                "auc": None if reference.auc is None else reference.auc.tolist(),
                "source": reference.source,
            },
            "lca_beta": self.lca_beta,
            "step_curves": self.step_curves,
            "step_subset": self.step_subset,
            "sections": {key: s.journal_settings() for key, s in self.sections.items()},
        }

    def journal_baseline(self) -> dict[str, Any]:
        """The journal line of the baseline (every matrix's ``b``, the sections' parts)."""
        return {
            "baseline": {name: m.baseline.tolist() for name, m in self.matrices.items()},
            "sections": {key: s.journal_part(None) for key, s in self.sections.items()},
        }

    def journal_stage(self, stage: int) -> dict[str, Any]:
        """The journal line of recorded stage ``stage``: its rows, its cost, the step curves'
        evaluations inside it, the run's coverage, the sections' parts (what the stage added: the
        line's size does not grow with the stage index). The run's step counter
        (``steps_trained``) is the callback's live state, not a result: not journaled (a line
        rewritten later would carry the counter of then, not of its stage)."""
        # the curve's stages never decrease: stage ``stage``'s points are one run of them
        stages = self.curves.stages
        points = range(bisect.bisect_left(stages, stage), bisect.bisect_right(stages, stage))
        cost = next((c.to_dict() for c in self.costs if c.stage == stage), None)
        return {
            "stage": stage,
            # the row itself, not `scores` (a copy of every row: O(s T) a line, O(s^2 T) a
            # rewrite)
            "rows": {name: m.scores_state[stage].tolist() for name, m in self.matrices.items()},
            "cost": cost,
            "step_subset": self.step_subset,
            "curves": {
                "step": [self.curves.steps[k] for k in points],
                "full": [self.curves.full[k] for k in points],
                "rows": {
                    name: [rows[k].tolist() for k in points]
                    for name, rows in self.curves.rows.items()
                },
            },
            "ended_early": self.ended_early,
            "sections": {key: s.journal_part(stage) for key, s in self.sections.items()},
        }

    @classmethod
    def from_journal(
        cls, header: Mapping[str, Any], sections: Sequence[RecordSection]
    ) -> RunRecord:
        """An empty record of a journal's header (`journal_header`), with ``sections`` made
        from the header's section settings."""
        reference = header["reference"]
        record = cls(
            {
                name: MatrixSpec(
                    str(spec["score"]),
                    bool(spec["higher_is_better"]),
                    None
                    if spec["bounds"] is None
                    else (float(spec["bounds"][0]), float(spec["bounds"][1])),
                    spec["scoring"],
                )
                for name, spec in header["matrices"].items()
            },
            [str(name) for name in header["task_names"]],
            forgetting=str(header["forgetting"]),
            metadata=header["metadata"],
            run_id=str(header["run_id"]),
            reference=None
            if reference is None
            else ReferenceScores(
                kind=reference["kind"],
                scores=_row(reference["scores"]),
                auc=None if reference["auc"] is None else _row(reference["auc"]),
                source=str(reference["source"]),
            ),
            lca_beta=header["lca_beta"],
            step_curves=bool(header["step_curves"]),
            step_subset=header["step_subset"],
            sections=sections,
        )
        return record

    def replay_baseline(self, line: Mapping[str, Any]) -> None:
        """Record a journal's baseline line (`journal_baseline`) again."""
        for key, section in self.sections.items():
            section.replay_part(None, line["sections"][key])
        for name, metric in self.matrices.items():
            metric.update_baseline(_row(line["baseline"][name]))
        self.baseline_done = True

    def replay_stage(self, line: Mapping[str, Any]) -> None:
        """Record a journal's stage line (`journal_stage`) again: the next stage."""
        stage = int(line["stage"])
        if stage != self.num_stages:
            raise ValueError(f"stage {stage} after {self.num_stages} stages")
        for name, metric in self.matrices.items():
            metric.update(_row(line["rows"][name]))
        for key, section in self.sections.items():
            section.replay_part(stage, line["sections"][key])
        if line["cost"] is not None:
            self.costs.append(StageCost.from_dict(line["cost"]))
        curves = line["curves"]
        for k, step in enumerate(curves["step"]):
            rows = {name: _row(curves["rows"][name][k]) for name in self.curves.names}
            self.curves.add(int(step), stage, rows, full=bool(curves["full"][k]))
        self.step_subset = line["step_subset"]
        self.ended_early = bool(line["ended_early"])

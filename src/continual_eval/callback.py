"""``ContinualEvalCallback``: the accuracy matrix of a continual-learning run from one callback.

A stage ends in ``on_train_end`` (one ``fit`` per task) or at the end of every ``k``-th epoch
(one ``fit`` over a schedule, ``epochs_per_task=k``). The callback holds the hooks and the
argument handling; what is measured lives in its `RunRecord` (no
Lightning there), which builds the results.
"""

from __future__ import annotations

import contextlib
import copy
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from typing_extensions import override

from continual_eval import _arguments as args
from continual_eval._class_incremental_recorder import baseline_labels
from continual_eval._fit_checks import (
    as_callback_error,
    check_fit_trains,
    check_schedule,
    check_stage_exists,
    due_stage,
    empty_fit,
    schedule_end_problem,
    unsharded_loaders,
    untrained_stage,
)
from continual_eval._loader_list import as_loader_list
from continual_eval._predictions import PredictionsRecord, write_pending
from continual_eval._run_directory import RunDirectory
from continual_eval._run_end import end_run
from continual_eval._run_warnings import warn_once
from continual_eval._spawn_handover import SpawnHandover
from continual_eval._stage_budget import StageBudget
from continual_eval._train_generators import TrainGenerators
from continual_eval._trainer_scoring import TrainerScoring
from continual_eval.evaluation import Scorer
from continual_eval.evaluation.task_loaders import TaskLoaders
from continual_eval.evaluation.trainer_evaluation import module_test_loaders
from continual_eval.functional import FORGETTING_CONVENTIONS
from continual_eval.loggers import (
    format_matrix_table,
    log_baseline,
    log_stage,
    log_step,
    refuse_key_collisions,
    stage_line,
)
from continual_eval.metric import ContinualMetrics
from continual_eval.options import StepEvaluation
from continual_eval.record import RunRecord
from continual_eval.results import ContinualResults
from continual_eval.results.files import ResultsWriteError, is_record_file
from continual_eval.results.reference import check_reference_length
from continual_eval.rng import collect_rng_states, set_rng_states
from continual_eval.stage_cost import StageCostRecorder
from continual_eval.step_curves import StepCurves

__all__ = ["ContinualEvalCallback"]

_STATE_VERSION = 1


class ContinualEvalCallback(Callback):
    r"""Score every task after every training stage; record ``R``, the baseline and the metrics.

    ``R[i, j]``: the score on task ``j``'s test set after training stage ``i``; ``b[j]``: the
    untrained model's, measured before the first training step. Stages: one ``fit`` per task (a
    new Trainer per task, or [`fit_tasks`][continual_eval.fit_tasks]), or one ``fit`` over a
    schedule (``epochs_per_task``). Batches: ``continual_eval_step(self, batch, task_id) -> (preds,
    target)`` when the module defines it, else ``(x, y)`` is scored as ``module(x)`` and ``(x,
    y, t)`` as ``module(x, t)``. ``results.json`` and ``scores.csv`` go to the run's directory,
    rewritten after every stage. What is recorded: [`record`][.record].

    Every argument in full, with its details: the [options page][callback-options]
    (docs/api/callback_options.md).

    Args:
        test_dataloaders (`Sequence[Any] | None`, `None`): one test loader per task; ``None``: the
            datamodule's/module's ``test_dataloader()``.
        task_names (`Sequence[str] | None`, `None`): names for logs and files (default ``task_0``,
            ...).
        epochs_per_task (`int | None`, `None`): ``k``: one ``fit`` over a schedule of ``k`` epochs a
            stage; ``None``: a fit per task.
        evaluate (`str`, `'all'`): ``"all"`` tasks after every stage, or ``"needed"``: the cells
            the metrics read.
        metric (`Any`, `None`): a torchmetrics ``Metric`` (or factory) replacing accuracy.
        scorers (`Mapping[str, Any] | Sequence[Any] | None`, `None`): ``name -> scorer`` (or a
            list): one matrix each, the first primary.
        prefix (`str`, `'continual/'`): prefix of every logged key.
        dirpath (`str | os.PathLike[str] | None`, `None`): the results directory (default: one per
            run, the first logger's).
        metadata (`Mapping[str, Any] | None`, `None`): JSON-serialisable dict stored in
            ``results.json``.
        forgetting (`str`, `'peak'`): ``"peak"`` or ``"chaudhry"``.
        log_images (`bool`, `True`): log the matrix as a heatmap where the logger takes images.
        verbose (`bool`, `True`): a line per stage and the table at the end.
        inference_mode (`bool`, `True`): ``torch.inference_mode`` (else ``torch.no_grad``).
        eval_every_n_steps (`int | StepEvaluation | None`, `None`): ``k`` or a
            [`StepEvaluation`][continual_eval.StepEvaluation]: also score inside stages.
        cache_test_batches (`bool | None`, `None`): keep collated test batches on the device
            (``None``: where safe).
        cache_max_bytes (`int`, `256 MiB`): cap on the cached bytes.
        overwrite (`bool`, `False`): replace another run's ``results.json`` in the directory.
        restore_rng_states (`bool`, `True`): store and restore the RNG states and loader generators
            at a resume.
        reference (`Any`, `None`): reference scores of the primary scorer (the ``reference``
            section).
        lca_beta (`int | None`, `None`): ``beta`` of the learning curve area (needs
            ``eval_every_n_steps=1``).
        task_classes (`Sequence[Sequence[int]] | None`, `None`): class ids per task:
            class-incremental evaluation of a single head.
        held_out_dataloaders (`Mapping[str, Any] | None`, `None`): ``name -> loader`` of sets never
            trained (the ``held_out`` section).
        predictions (`int | None`, `None`): ``N``: write the generation scorers' first ``N``
            predictions per cell.
        stage_eval_subset (`int | None`, `None`): ``n``: score a fixed subset of ``n`` samples per
            task at stage ends.
        stage_eval_seed (`int`, `0`): seed of the stage-end subsets.
        eval_old_tasks_every (`int | None`, `None`): ``k``: score old tasks only every ``k``-th
            stage and at the last.
        item_records (`bool | Sequence[str] | Mapping[str, Any]`, `False`): keep every test item's
            value (``intervals`` and ``items`` sections).
    """

    def __init__(
        self,
        test_dataloaders: Sequence[Any] | None = None,
        *,
        task_names: Sequence[str] | None = None,
        epochs_per_task: int | None = None,
        evaluate: str = "all",
        metric: Any = None,
        scorers: Mapping[str, Any] | Sequence[Any] | None = None,
        prefix: str = "continual/",
        dirpath: str | os.PathLike[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        forgetting: str = "peak",
        log_images: bool = True,
        verbose: bool = True,
        inference_mode: bool = True,
        eval_every_n_steps: int | StepEvaluation | None = None,
        cache_test_batches: bool | None = None,
        cache_max_bytes: int = 256 * 2**20,
        overwrite: bool = False,
        restore_rng_states: bool = True,
        reference: Any = None,
        lca_beta: int | None = None,
        task_classes: Sequence[Sequence[int]] | None = None,
        held_out_dataloaders: Mapping[str, Any] | None = None,
        predictions: int | None = None,
        stage_eval_subset: int | None = None,
        stage_eval_seed: int = 0,
        eval_old_tasks_every: int | None = None,
        item_records: bool | Sequence[str] | Mapping[str, Any] = False,
    ) -> None:
        args.check_choice("evaluate", evaluate, ("all", "needed"))
        args.check_choice("forgetting", forgetting, FORGETTING_CONVENTIONS)
        args.check_flags(overwrite=overwrite, restore_rng_states=restore_rng_states)
        args.check_cache(cache_test_batches, cache_max_bytes)
        args.check_metadata(metadata)
        self.epochs_per_task = args.check_epochs_per_task(epochs_per_task)
        self.step_evaluation = StepEvaluation.of(eval_every_n_steps)
        #: ``stage_eval_subset``, ``stage_eval_seed`` and ``eval_old_tasks_every``, checked
        self.stage_budget = StageBudget(stage_eval_subset, stage_eval_seed, eval_old_tasks_every)
        args.check_budget_with_classes(eval_old_tasks_every, task_classes)
        self.lca_beta = args.check_lca_beta(lca_beta, self.step_evaluation)
        self._given_names = args.check_task_names(task_names)
        self.held_out_dataloaders = args.check_held_out(held_out_dataloaders, task_classes)
        if test_dataloaders is not None:
            test_dataloaders = as_loader_list(test_dataloaders, "test_dataloaders")
        self.evaluate, self.forgetting, self.prefix = evaluate, forgetting, prefix
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.metadata = dict(metadata or {})
        self.log_images, self.verbose, self.inference_mode = log_images, verbose, inference_mode
        self.cache_test_batches, self.cache_max_bytes = cache_test_batches, cache_max_bytes
        self.overwrite, self.restore_rng_states = overwrite, restore_rng_states
        scoring = args.resolve_scoring(
            scorers, metric, task_classes, predictions, item_records, reference
        )
        self.scorers: dict[str, Scorer] = scoring.scorers
        self.predictions, self.primary = scoring.predictions, next(iter(self.scorers))
        self.scorer: Scorer = self.scorers[self.primary]
        #: ``item_records=`` resolved (``None``: off)
        self.item_settings = scoring.item_settings
        #: the ``reference=`` argument resolved (checked against the primary scorer)
        self.reference = scoring.reference
        #: the reference's per-item values (or why it has none), for the intransigence interval
        self._reference_items = scoring.reference_items
        self._loaders_given = test_dataloaders is not None
        self.reset()
        if test_dataloaders is not None:
            self._set_loaders(test_dataloaders)
            check_reference_length(self.reference, len(test_dataloaders))

    def reset(self) -> None:
        """Forget everything recorded and start a new run (a new ``run_id``): for re-running a
        notebook cell with the same callback. The files of the previous run stay where they are;
        the new run needs its own results directory (or ``overwrite=True``)."""
        #: identifies this run in ``results.json``; kept through checkpoints
        self.run_id = uuid.uuid4().hex
        self._handover = SpawnHandover(self.run_id)  # ddp_spawn: rank 0's state to this process
        self._record: RunRecord | None = None
        self._restored = False
        self._directory = RunDirectory()
        self._fit_step_base = self._fit_steps_before = 0
        self._trained_this_fit = False
        self._cost = StageCostRecorder()  # the stage in progress: clocks read at its boundaries
        # a checkpoint's counters of the stage it was written inside, until on_train_start
        self._resumed_progress: dict[str, Any] | None = None
        self._generators = TrainGenerators()
        loaders = getattr(self, "_loaders", None)
        self._loaders: list[Any] | None = None
        self._task_loaders: TaskLoaders | None = None
        if loaders is not None and self._loaders_given:
            self._set_loaders(loaders)

    # ------------------------------------------------------------------ public views
    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(prefix=self.prefix)

    @property
    def record(self) -> RunRecord | None:
        """What the run recorded so far (``None`` before the test loaders are known)."""
        self._sync_from_child()
        return self._record

    @property
    def eval_every_n_steps(self) -> int | None:
        return None if self.step_evaluation is None else self.step_evaluation.every_n_steps

    @property
    def task_names(self) -> list[str] | None:
        return self._given_names if self._record is None else self._record.task_names

    @property
    def num_tasks(self) -> int | None:
        """``T``, known once the test loaders are (at construction or at the first fit)."""
        return None if self.record is None else self.record.num_tasks

    @property
    def metrics(self) -> ContinualMetrics | None:
        """The primary scorer's [`ContinualMetrics`][continual_eval.ContinualMetrics] (``None``
        before the first fit)."""
        return None if self.record is None else self.record.matrices[self.primary]

    @property
    def matrices(self) -> dict[str, Tensor]:
        """Every scorer's rows so far, ``name -> [stages_completed, T]`` float64."""
        record = self.record
        return {} if record is None else {n: m.scores for n, m in record.matrices.items()}

    @property
    def stages_completed(self) -> int:
        """Stages recorded so far (rows of R)."""
        return 0 if self.record is None else self.record.num_stages

    @property
    def scores(self) -> Tensor:
        """Rows of R so far, ``[stages_completed, T]`` float64 (NaN = not evaluated)."""
        metrics = self.metrics
        return torch.zeros(0, 0, dtype=torch.float64) if metrics is None else metrics.scores

    @property
    def baseline(self) -> Tensor:
        """Untrained scores ``b``, ``[T]`` (NaN until measured)."""
        metrics = self.metrics
        return torch.zeros(0, dtype=torch.float64) if metrics is None else metrics.baseline

    @property
    def results_dir(self) -> Path | None:
        """Directory holding ``results.json`` and ``scores.csv`` (set at the first fit, rank 0)."""
        self._sync_from_child()
        return self._directory.path

    @property
    def steps_trained(self) -> int:
        """Optimizer steps of the whole run so far (the step of per-step evaluations; unlike
        ``trainer.global_step`` it continues across fits)."""
        return 0 if self.record is None else self.record.steps_trained

    def results(self) -> dict[str, Any]:
        """The ``results.json`` document of the stages so far."""
        return self.continual_results().to_dict()

    def continual_results(self) -> ContinualResults:
        """The typed results of the stages so far (`RunRecord.continual_results`)."""
        if self.record is None:
            raise RuntimeError("ContinualEvalCallback has no results yet: no fit has started")
        return self.record.continual_results()

    def curves(self, name: str | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(step [N], stage [N], scores [N, T])`` of the evaluations inside and at the end of
        the stages for the scorer ``name`` (default: the primary one); empty unless
        ``eval_every_n_steps`` is set."""
        record = self.record
        if record is None:
            return StepCurves([self.primary]).tensors(0)
        return record.curves.tensors(record.num_tasks, name)

    # ------------------------------------------------------------------ the record
    def _new_record(self, task_names: Sequence[str]) -> RunRecord:
        settings: dict[str, Any] = {"forgetting": self.forgetting, "metadata": self.metadata}
        settings.update(reference=self.reference, lca_beta=self.lca_beta, run_id=self.run_id)
        held_out, steps = list(self.held_out_dataloaders), self.step_evaluation
        settings["predictions"] = self.predictions
        settings["budget"] = self.stage_budget
        settings["items"] = self.item_settings
        settings["reference_items"] = self._reference_items
        return args.run_record(self.scorers, task_names, steps=steps, held_out=held_out, **settings)

    def _set_loaders(self, loaders: list[Any]) -> None:
        T, record = len(loaders), self._record
        args.check_loader_count(T, self._given_names, None if record is None else record.num_tasks)
        record = record or self._new_record(self._given_names or [f"task_{j}" for j in range(T)])
        steps, held_out = self.step_evaluation, self.held_out_dataloaders
        self._task_loaders = TaskLoaders.for_steps(
            loaders,
            record.task_names,
            steps,
            held_out,
            cache=self.cache_test_batches,
            cache_max_bytes=self.cache_max_bytes,
            stage_subset_size=self.stage_budget.subset,
            stage_subset_seed=self.stage_budget.seed,
        )
        self._loaders, self._record = loaders, record
        args.describe_stage_subsets(record, self._task_loaders)
        record.step_subset = args.subset_description(steps, self._task_loaders.subset_sizes[:T])

    def _prepare_fit(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._loaders is None:
            self._set_loaders(module_test_loaders(trainer, pl_module))
        assert self._task_loaders is not None
        in_order = self.item_settings is not None or self.predictions is not None
        unsharded = self._task_loaders.shard(
            trainer.global_rank, trainer.world_size, in_order=in_order
        )
        if unsharded:
            self._warn(trainer, "unsharded", unsharded_loaders(unsharded))
        self._directory.choose(trainer, self.run_id, self.dirpath)

    def _claim_results_dir(self, trainer: Trainer) -> None:
        """Claim the results directory before anything is trained or written, and on a resume
        rewrite its files from the restored state (an interrupted write left them apart)."""
        flags = {"restored": self._restored, "overwrite": self.overwrite, "verbose": self.verbose}
        self._directory.claim(trainer, self.run_id, **flags)
        baseline_done = self._record is not None and self._record.baseline_done
        if trainer.is_global_zero and self._restored and baseline_done:
            self._check_prediction_files(trainer)
            self._write()

    def _check_prediction_files(self, trainer: Trainer) -> None:
        """A resume (rank 0): warn about recorded prediction files that changed, and remove
        the stage files beyond the restored stages (written after the checkpoint)."""
        assert self._record is not None
        section = self._record.sections.get(PredictionsRecord.key)
        if isinstance(section, PredictionsRecord) and self._directory.path is not None:
            self._warn(trainer, "predictions", section.check_on_disk(self._directory.path))
            section.remove_stale(self._directory.path)

    # ------------------------------------------------------------------ state
    @override
    def state_dict(self) -> dict[str, Any]:
        return self._state(with_rng=self.restore_rng_states)

    def _state(self, *, with_rng: bool) -> dict[str, Any]:
        state: dict[str, Any] = {"version": _STATE_VERSION, "run_id": self.run_id}
        state["epochs_per_task"] = self.epochs_per_task
        state["step_evaluation"] = args.step_settings(self.step_evaluation)
        if self._record is not None:
            state["record"] = self._record.state_dict()
            progress = self._cost.progress(self._record.num_stages) or self._resumed_progress
            if progress is not None:  # written inside a stage: what it has trained so far
                state["stage_progress"] = progress
        if self._directory.path is not None:
            state["results_dir"] = str(self._directory.path)
        if with_rng:
            state["rng_states"] = collect_rng_states()
            state["train_generators"] = self._generators.state_dict()
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        args.check_state_version(state_dict, _STATE_VERSION)
        recorded, record = state_dict.get("record"), self._record
        if recorded is not None:
            record = record or self._new_record(recorded["task_names"])
            args.check_same_run(
                state_dict,
                record,
                epochs_per_task=self.epochs_per_task,
                step_evaluation=self.step_evaluation,
                task_names=self._given_names,
            )
            record.load_state_dict(recorded, keep_task_names=self._given_names is not None)
        self._record, self.run_id = record, str(state_dict["run_id"])
        if record is not None:
            record.run_id = self.run_id
        self._directory.recorded = state_dict.get("results_dir")
        self._restored = True
        self._resumed_progress = state_dict.get("stage_progress")
        if self._loaders is not None:
            self._set_loaders(self._loaders)
        if self.restore_rng_states and "rng_states" in state_dict:
            set_rng_states(state_dict["rng_states"])
            self._generators.load_state_dict(state_dict.get("train_generators"))

    # ------------------------------------------------------------------ spawned processes
    def __getstate__(self) -> dict[str, Any]:
        # pickled for spawned processes (ddp_spawn) or copied: take what a child published first
        self._sync_from_child()
        state = self.__dict__.copy()
        state["_handover"] = copy.copy(self._handover)  # a copy tracks the file on its own
        return state

    def _publish_to_owner(self, trainer: Trainer) -> None:
        """Rank 0 of a spawned process group hands its state to the creating process."""
        if self._handover.in_owner() or not trainer.is_global_zero:
            return
        self._directory.wait()  # the creating process reads the files this rank wrote
        state, directory = self._state(with_rng=False), self._directory
        self._handover.publish(state, results_dir=directory.path, dir_checked=directory.claimed)

    def _sync_from_child(self) -> None:
        """In the creating process: load the state a spawned rank 0 published, if newer."""
        published = self._handover.receive()
        if published is None:
            return
        self.load_state_dict(published.state)
        self._resumed_progress = None  # a child's stage in progress is no checkpoint to resume
        if published.results_dir is not None:
            self._directory.path = published.results_dir
        self._directory.claimed = published.dir_checked

    # ------------------------------------------------------------------ evaluation
    @property
    def _scoring(self) -> TrainerScoring:
        assert self._task_loaders is not None
        return TrainerScoring(
            self.scorers,
            self._task_loaders,
            self.inference_mode,
            self.verbose,
            self.predictions,
            item_scorers=self._item_scorers(),
        )

    def _item_scorers(self) -> tuple[int, ...]:
        """The positions of the scorers whose items the record keeps."""
        section = None if self._record is None else self._record.sections.get("items")
        if section is None:
            return ()
        recorded = section.binary  # type: ignore[attr-defined]
        return tuple(k for k, name in enumerate(self.scorers) if name in recorded)

    def _current_step(self, trainer: Trainer) -> int:
        return self._fit_steps_before + trainer.global_step - self._fit_step_base

    def _record_step(self, trainer: Trainer, pl_module: LightningModule, step: int) -> None:
        record = self._record
        assert record is not None and self._task_loaders is not None
        stage, subset = record.num_stages, self._task_loaders.subsets is not None
        scored = self._scoring.score(
            trainer, pl_module, record, range(stage + 1), stage=stage, subset=subset
        )
        items = record.sections.get("items")
        if items is not None and not subset:  # before the curves: a refusal records nothing
            as_callback_error(items.record_step, step, stage, scored)  # type: ignore[attr-defined]
        record.record_step(step, stage, scored.rows, full=not subset)
        self._log_step(trainer, scored.rows, step, subset=subset)

    def _log_step(
        self, trainer: Trainer, rows: Mapping[str, Tensor], step: int, *, subset: bool = False
    ) -> None:
        if trainer.is_global_zero:
            names = self.task_names or []
            log_step(trainer.loggers, names, rows, step, prefix=self.prefix, subset=subset)

    def _record_baseline(self, trainer: Trainer, pl_module: LightningModule) -> None:
        record = self._record
        assert record is not None
        if trainer.loggers:  # every rank, before anything is measured (no collective)
            refuse_key_collisions(record.continual_results(), self.prefix)
        tasks = range(record.num_tasks)
        with baseline_labels(self.scorers, record.sections.get("items")):  # task_classes=
            scored = self._scoring.score(
                trainer, pl_module, record, tasks, stage=-1, held_out=True, predictions=True
            )
        as_callback_error(record.record_baseline, scored)
        write_pending(record, self._directory.path if trainer.is_global_zero else None)
        items = record.sections.get("items")
        if items is not None and self.verbose and trainer.is_global_zero:
            rank_zero_info(items.summary_line())  # type: ignore[attr-defined]
        if trainer.is_global_zero:
            results = self._write(trainer)
            log_baseline(
                trainer.loggers, results, prefix=self.prefix, results_dir=self._directory.path
            )

    def _record_stage(self, trainer: Trainer, pl_module: LightningModule, stage: int) -> None:
        record = self._record
        assert record is not None
        check_stage_exists(stage, record.num_tasks)
        tasks = self.stage_budget.stage_tasks(stage, record.num_tasks, self.evaluate)
        scored, cost = self._scoring.stage_end(trainer, pl_module, record, self._cost, stage, tasks)
        # every rank records the same rows: reduced across ranks before this point
        notes = as_callback_error(record.record_stage, stage, scored, cost)
        for note in notes:
            self._warn(trainer, "stage-note", note)
        write_pending(record, self._directory.path if trainer.is_global_zero else None)
        if self.step_evaluation is not None:
            record.steps_trained = self._current_step(trainer)
            replaced = record.record_step(record.steps_trained, stage, scored.rows, full=True)
            items = record.sections.get("items")
            if items is not None:  # the stage end replaced a per-step point: its items too
                items.forget_step(record.steps_trained, stage)  # type: ignore[attr-defined]
            if replaced is None:  # the whole-test-set point of every curve, under the full keys
                self._log_step(trainer, record.curves.last(), record.steps_trained)
        if trainer.is_global_zero:
            # the results are made here only for what reads them here (loggers, the printed
            # line, the curve pictures); else on the background writer, with the document
            shown = bool(trainer.loggers) or self.verbose
            shown = shown or (self.log_images and self.step_evaluation is not None)
            results = self._write(trainer, stage, deferred=not shown)
            if results is None:
                return
            log_stage(
                trainer.loggers,
                results,
                stage,
                prefix=self.prefix,
                log_images=self.log_images,
                results_dir=self._directory.path,
                whole_matrices=self._directory.rebuilt,
            )
            if self.verbose:
                rank_zero_info(stage_line(results, stage))

    def _warn(self, trainer: Trainer, kind: str, note: str | None) -> None:
        """Rank 0 warns ``note`` (if any), the first of its ``kind`` in this run only."""
        if note is not None and trainer.is_global_zero:
            warn_once(self.run_id, kind, note, stacklevel=3)

    @overload
    def _write(
        self, trainer: Trainer | None = None, stage: int | None = None
    ) -> ContinualResults: ...

    @overload
    def _write(
        self, trainer: Trainer, stage: int, *, deferred: bool
    ) -> ContinualResults | None: ...

    def _write(
        self, trainer: Trainer | None = None, stage: int | None = None, *, deferred: bool = False
    ) -> ContinualResults | None:
        """Build the results and commit them (rank 0, once the directory is known): stage
        ``stage``'s journal line, ``results.json`` when due (`RunDirectory.write`); in a spawned
        process, hand the state to the creating one when ``results.json`` was rewritten. Returns
        the results; with ``deferred`` and no section to add, ``None``: the results are made on
        the background writer, from copies (`RunRecord.deferred_results`), and only when
        ``results.json`` is rebuilt."""
        record = self._record
        assert record is not None
        # a run in progress: its sections' cheap part (no bootstrap of the item intervals) and,
        # between rebuilds, no class-incremental section (its measures read every stage's counts)
        final = stage is None or record.num_stages == record.num_tasks
        due = self._directory.due(record, stage)
        omit = () if due else ("class_incremental",)
        made: ContinualResults | Callable[[], ContinualResults] | None = None
        if deferred and stage is not None:  # not called unless results.json is rebuilt
            made = record.deferred_results(omit=omit) if due else record.continual_results
        if made is None:
            made = record.continual_results(light=not final, omit=omit)
        rebuilt = self._directory.write(record, made, stage=stage)
        results = made if isinstance(made, ContinualResults) else None
        if trainer is not None and (rebuilt or stage is None):
            self._publish_to_owner(trainer)
        return results

    # ------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._record = self._handover.own_copy(self._record)  # ddp_spawn: this rank's own copy

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._directory.wait()  # every file of the fit on disk before it returns
        if self._record is not None and self._record.num_stages == self._record.num_tasks:
            self._directory.close()  # the run is complete: no append follows
        if self._record is not None:
            self._publish_to_owner(trainer)

    @override
    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        if trainer.is_global_zero and self._record is not None and self._record.baseline_done:
            with contextlib.suppress(OSError):  # the fit's own error is the one to see
                if isinstance(exception, ResultsWriteError) and is_record_file(exception.path):
                    # results.json, a CSV or the journal failed: they stay as the message says
                    self._directory.wait()
                else:
                    self._directory.flush(self._record, self.continual_results())

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._prepare_fit(trainer, pl_module)
        self._trained_this_fit = False
        T = self.num_tasks
        assert T is not None
        check_reference_length(self.reference, T)
        if self.epochs_per_task is not None:
            check_schedule(trainer, self.epochs_per_task, T)
        else:
            check_fit_trains(trainer, self.stages_completed, T)
        if not self._directory.claimed:
            self._claim_results_dir(trainer)
        assert self._record is not None
        if not self._record.baseline_done:
            self._record_baseline(trainer, pl_module)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # a stage (or the rest of a resumed one) starts; a fit resumed (ckpt_path) from a
        # checkpoint written inside this stage continues its counters (used once)
        self._cost.start_stage(pl_module.device, trainer.global_step)
        progress, self._resumed_progress = self._resumed_progress, None
        if progress is not None and trainer.ckpt_path is not None:
            self._cost.resume_stage(progress, stage=self.stages_completed, step=trainer.global_step)
        self._fit_step_base = trainer.global_step
        self._fit_steps_before = self.steps_trained
        resumed = self._generators.on_train_start(trainer, self.epochs_per_task)
        self._warn(trainer, "resume", resumed)
        # resumed from a checkpoint written after a stage's last epoch but before its evaluation
        # (ModelCheckpoint saving in on_validation_end): score that stage now, from those weights
        stage = due_stage(trainer.current_epoch, self.epochs_per_task, self.stages_completed)
        if stage is not None:
            self._record_stage(trainer, pl_module, stage)

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._generators.watch(trainer)
        k = self.epochs_per_task
        if k is None:
            return
        check_stage_exists(trainer.current_epoch // k, self.num_tasks)
        if trainer.current_epoch % k == 0:
            self._cost.start_stage(pl_module.device, trainer.global_step)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._cost.add_batch(batch)  # the batch's leading dimension, read on the host
        record = self._record
        assert record is not None
        step = self._current_step(trainer)
        if step == record.steps_trained:
            return  # no optimizer step (gradient accumulation) since the last batch
        record.steps_trained = step
        k = self.eval_every_n_steps
        if k is not None and step % k == 0:
            self._record_step(trainer, pl_module, step)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        stage = due_stage(trainer.current_epoch + 1, self.epochs_per_task, self.stages_completed)
        if stage is None:
            return
        if trainer.global_step == self._cost.start_step:
            self._warn(trainer, "untrained-stage", untrained_stage(stage, self.task_names or []))
        self._record_stage(trainer, pl_module, stage)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._trained_this_fit = True
        k = self.epochs_per_task
        if k is None:
            self._record_stage(trainer, pl_module, self.stages_completed)
        else:
            epoch, names = trainer.current_epoch, self.task_names or []
            end = schedule_end_problem(epoch, trainer.max_epochs, k, self.stages_completed, names)
            self._warn(trainer, "schedule-end", end)

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._directory.wait()  # a background write's error is the fit's
        stage = self.stages_completed
        if self.epochs_per_task is None and not self._trained_this_fit:
            raise empty_fit(stage, self.task_names or [], self._directory.path)
        done = stage == self.num_tasks or self.epochs_per_task is not None
        if trainer.is_global_zero and self.verbose and done and stage:
            rank_zero_info(format_matrix_table(self.continual_results()))
        if self.epochs_per_task is not None:  # a schedule of fewer stages than tasks ends here
            end_run(self, trainer)

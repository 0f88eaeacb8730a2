"""``ContinualEvalCallback``: the accuracy matrix of a continual-learning run from one callback.

Attach it to a Trainer and train the task sequence in either of the two usual ways:

* one ``trainer.fit`` per task (a new Trainer per task with the same callback instance, or one
  Trainer driven by :func:`fit_tasks`); a stage ends in ``on_train_end``;
* one ``fit`` over a schedule with ``epochs_per_task=k``: the training data switches every ``k``
  epochs, with ``Trainer(reload_dataloaders_every_n_epochs=1)`` and a ``train_dataloader`` returning
  ``loaders[scheduled_task(self.trainer, k)]`` (:func:`scheduled_task` stays right when resuming
  from a checkpoint, where ``current_epoch // k`` is one epoch behind); a stage ends at the end of
  every ``k``-th epoch.

The untrained model is scored on every task once, before the first training step (the baseline
``b``); after every stage the model is scored on every task (or only ``j <= i + 1`` with
``evaluate="needed"``) while it is still on its device, and the row ``R[i, :]`` is reduced exactly
across ranks, recorded in a :class:`~continual_eval.ContinualMetrics`, logged to every logger and
written to ``results.json``/``scores.csv`` (see :mod:`continual_eval.results`).

A LightningModule may define ``continual_eval_step(self, batch, task_id) -> (preds, target)`` to
control scoring (e.g. task-incremental heads); otherwise ``(x, y)`` batches are scored as
``module(x)`` and ``(x, y, t)`` batches as ``module(x, t)``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from typing_extensions import override

from continual_eval._arguments import as_loader_list, check_metadata, resolve_scorers
from continual_eval._class_incremental_recorder import ClassIncrementalRecorder
from continual_eval._spawn_handover import SpawnHandover
from continual_eval.evaluation import Scorer, TaskLoaders
from continual_eval.evaluation.class_incremental import set_evaluation_stage
from continual_eval.evaluation.trainer_evaluation import (
    evaluate_under_trainer,
    module_test_loaders,
)
from continual_eval.functional import FORGETTING_CONVENTIONS
from continual_eval.loggers import (
    format_matrix_table,
    log_baseline,
    log_stage,
    log_step,
    stage_key_collisions,
)
from continual_eval.metric import ContinualMetrics
from continual_eval.results import ContinualResults, RunCost, ScoreMatrix, StepEvaluations
from continual_eval.results.files import choose_results_dir, claim_or_refuse
from continual_eval.results.reference import check_reference_length, resolve_reference
from continual_eval.results.schema import MAX_NAME_LENGTH, MAX_TASKS
from continual_eval.rng import collect_rng_states, set_rng_states
from continual_eval.stage_cost import StageCostRecorder, read_replay_memory
from continual_eval.step_curves import StepCurves
from continual_eval.training import fit_already_done, fit_tasks, scheduled_task

__all__ = ["ContinualEvalCallback", "fit_tasks", "scheduled_task"]

_STATE_VERSION = 1
#: What the ``step`` of a per-step evaluation counts (stored in ``results.json``).
STEP_COUNTER = (
    "cumulative optimizer steps of the whole run: increments of trainer.global_step summed over "
    "all fits (global_step restarts at 0 with each new Trainer; this counter does not)"
)


class ContinualEvalCallback(Callback):
    r"""Score every task after every training stage; record ``R``, the baseline and the metrics.

    ``R[i, j]`` is the score on task ``j``'s test set after training stage ``i``; ``b[j]`` the
    untrained model's, measured once before the first training step.

    Stages. Either one ``fit`` per task (a new Trainer per task with this same callback, or one
    Trainer driven by :func:`fit_tasks`, which also saves ``task_{i}.ckpt`` after every task with
    ``checkpoint_dir=``, so the model after any stage can be reloaded), or one ``fit`` over a
    schedule with ``epochs_per_task=k``: that needs ``Trainer(reload_dataloaders_every_n_epochs=1)``
    and a ``train_dataloader()`` returning ``loaders[scheduled_task(self.trainer, k)]`` (without the
    reload the first task's data would train every stage: refused before training).

    Batches. Each test batch is scored as follows:

    * ``continual_eval_step(self, batch, task_id) -> (preds, target)`` when the LightningModule
      defines it (task-incremental heads, dict batches, anything custom);
    * ``(x, y)``: ``preds = module(x)``;
    * ``(x, y, t)``: ``preds = module(x, t)`` (multi-head models that pick the head per sample).

    ``preds`` are class scores ``[N, C, ...]`` (argmax over dim 1) or labels shaped like
    ``target``; ``target`` holds integer labels, or one-hot/probability rows shaped like ``preds``.
    Non-finite scores, labels outside ``[0, C)`` and outputs of the wrong structure are errors
    naming the task, the test dataloader and the batch.

    Files. ``results.json`` and ``scores.csv`` go to the run's own directory (see ``dirpath``),
    printed once at the start; a directory holding another run's results is never written to.

    Cost. Every stage's cost goes to ``results.json``'s ``cost`` section and to the loggers
    (``{prefix}cost/train_seconds``, ``eval_seconds``, ``peak_memory_bytes``, ``parameters``,
    ``samples``, ``optimizer_steps``, ``replay_memory``, ``model_size_efficiency``; see
    :mod:`continual_eval.stage_cost`): clocks are read at stage boundaries only and samples are
    counted from the batches' host-side shapes, so no training step waits for the device. A
    replay method reports its memory size (stored samples) by defining
    ``continual_eval_memory_size(self) -> int`` on the LightningModule.

    Args:
        test_dataloaders: one test loader per task (index = task id). When ``None``, the
            datamodule's (else the module's) ``test_dataloader()`` must return such a list.
        task_names: names for logs and files (default ``task_0``, ``task_1``, ...).
        epochs_per_task: ``k`` for a single ``fit`` over a schedule (stage ``i`` = epochs
            ``[i*k, (i+1)*k)``); ``None`` (default) for one ``fit`` per task.
        evaluate: ``"all"`` tasks after every stage, or ``"needed"``: only ``j <= i + 1``, the cells
            the metrics read (others recorded as not evaluated).
        metric: a torchmetrics ``Metric`` (instance or factory) replacing accuracy; it receives
            ``(preds, target)`` per batch and is reset per task. Shorthand for one scorer.
        scorers: several score matrices from the same evaluation: a mapping ``name -> scorer``
            (or a list, named by each scorer's ``name``); a scorer is ``"accuracy"``, a
            torchmetrics ``Metric`` (instance or factory) or an object with the scorer protocol
            of :mod:`continual_eval.evaluation`. Each gets its own ``R``, baseline, metrics,
            log keys (``{prefix}{name}/acc|bwt|fwt|forgetting``; the accuracy scorer keeps
            ``{prefix}acc`` ...), ``scores_<name>.csv`` and step curves; the first is the
            primary one (``scores``, ``baseline``, the top level of ``results.json``).
            Default ``{"acc": "accuracy"}``.
        prefix: prefix of every logged key.
        dirpath: where ``results.json``/``scores.csv`` go. Default: one directory per run, from
            the first logger: its ``log_dir`` (TensorBoard, CSV), the W&B run's files directory,
            ``default_root_dir/continual_eval/<run id>`` (MLflow), or without a logger a new
            ``default_root_dir/continual_eval/version_N``
            (:func:`~continual_eval.results.files.default_results_dir`).
        metadata: free-form JSON-serialisable dict stored in ``results.json``.
        forgetting: forgetting convention, ``"peak"`` or ``"chaudhry"``.
        log_images: also log the matrix as a heatmap where the logger supports images.
        verbose: print a line per stage and the full table at the end of the run.
        inference_mode: use ``torch.inference_mode`` (else ``torch.no_grad``; gloo always uses
            ``no_grad``, like Lightning's own loops).
        eval_every_n_steps: ``k``: inside every stage, also score the tasks seen so far and the
            current one (``j <= stage``) every ``k`` optimizer steps, from ``on_train_batch_end``
            (training is unchanged: RNG states, train/eval flags and grads are restored or left
            alone). The step is the callback's cumulative optimizer-step counter, which continues
            across fits (see ``STEP_COUNTER``). The curves, min-ACC, WC-ACC and the per-task
            stability gap (De Lange et al., ICLR 2023) of every scorer go to ``results.json``
            (the primary's ``curves`` and ``stability``; every matrix's ``step_scores`` and
            ``stability``), the loggers (``{prefix}step/{task}`` against the step,
            ``{prefix}{name}/step/{task}`` for the other scorers; ``{prefix}min_acc``,
            ``{prefix}wc_acc`` per stage) and ``accuracy_curves.png`` (``curves_<name>.png``).
            ``None`` (default): off.
        step_eval_subset: score a fixed subset of ``n`` samples per task at the per-step
            evaluations (stage ends always use the whole test sets): task ``j`` uses
            ``sorted(randperm(len_j, generator=manual_seed(step_eval_subset_seed + j))[:n])``.
            One accuracy from ``n`` samples has binomial standard error ``sqrt(p(1-p)/n)``, at
            most ``0.5/sqrt(n)`` (n=500: <= 0.022, n=2000: <= 0.011, one sigma); the subset is
            fixed, so successive points of a curve share it and their differences are less noisy.
        step_eval_subset_seed: seed of the subsets.
        cache_test_batches: keep collated test batches on the evaluation device after their first
            pass, so repeated evaluations skip the data pipeline. ``None`` (default): on for the
            loaders the per-step evaluations read (when ``eval_every_n_steps`` is set) that
            :func:`~continual_eval.evaluation.cache_safety` deems safe (sequential sampler,
            default collate, ``TensorDataset`` or a dataset with
            ``continual_eval_deterministic = True``); ``True``: cache every test loader (you
            vouch that batches never change); ``False``: never. The cache is dropped when the
            evaluation device, rank/world size or test loader objects change; under DDP each rank
            caches its own shard. A model that edits its input batches in place must not use it.
        cache_max_bytes: cap on the cached bytes (default 256 MiB); a test set that does not fit
            is read through its loader every time.
        overwrite: a run never writes into a results directory that holds another run's
            ``results.json`` (its ``run_id`` differs; a resumed run keeps its ``run_id`` through the
            checkpoint): the fit stops before training with an error naming the directory.
            ``True`` replaces the other run's files.
        restore_rng_states: store the Python, NumPy and torch (CPU and CUDA) random states in the
            callback's checkpoint state and restore them when a checkpoint is loaded, so a
            resumed run draws the same random numbers (dropout, shuffling) as an uninterrupted
            one; Lightning does not store them. Under DDP every rank restores the state of
            rank 0 (the one saved), exact when the ranks' generators agree (as
            ``seed_everything`` leaves them when every rank draws the same number of values).
        reference: reference scores of the primary scorer, one per task (a model trained on
            each task alone, or on all tasks jointly): a ``[T]`` tensor or sequence (``None`` =
            absent), a mapping ``{"scores": [T], "auc": [T], "kind": ...}``, a
            :class:`~continual_eval.references.Reference` from
            :func:`~continual_eval.references.train_reference`, or a path to a reference run's
            ``results.json`` (the final row of its primary matrix) or to an isolated reference's
            directory (``task_j/results.json``). Checked at construction (the score and its
            direction must be the primary scorer's; the length against ``T`` when the fit
            starts). ``results.json`` then holds a ``reference`` section: the scores, the
            per-task and mean intransigence, and the per-task and mean forward transfer against
            isolated training (``convention="isolated"``; absent for a joint reference), in the
            primary score's direction, also logged per stage (``{prefix}intransigence``,
            ``{prefix}fwt_isolated``). With reference learning curves (``train_reference(...,
            eval_every_n_steps=...)``) or per-task ``auc``, the primary matrix's ``plasticity``
            also gets Continual World's normalised forward transfer. ``None`` (default): a
            reference stored as ``metadata["reference"]`` (``continual-eval fit``) is kept there.
        lca_beta: ``beta`` of the learning curve area ``LCA_beta`` (Chaudhry et al., ICLR 2019)
            in every matrix's ``plasticity`` (with the anytime accuracy ``A_AUC`` and, with a
            reference's areas, the normalised forward transfer; logged as ``{prefix}anytime_acc``,
            ``{prefix}lca``, ``{prefix}auc_fwt``). It needs the score after each of the first
            ``beta`` optimizer steps of every stage: ``eval_every_n_steps=1``. ``None`` (default):
            not computed.
        task_classes: class-incremental evaluation of a single-head model (one logit per class
            id): one list of class ids per task, e.g. ``[[0, 1], [2, 3], ...]``, or
            :func:`~continual_eval.evaluation.class_incremental.task_classes_from_loaders` of
            the test loaders. Checked at construction (a task without classes, a negative id,
            a class in two tasks: ``ValueError``; one list per test dataloader when the fit
            starts; a class id beyond the model's outputs: an error at the baseline, before
            training, naming the task). The callback then adds two matrices to ``scorers``
            (after them; ``scorers`` must not name them): ``acc_task_aware`` (task-IL: the argmax
            over task ``j``'s classes) and ``acc_task_agnostic`` (class-IL: the argmax over the
            classes of the tasks ``<= max(i, j)``, the seen classes for ``j <= i``; the baseline
            row uses ``i = -1``), see :mod:`continual_eval.evaluation.class_incremental`; it
            records after every stage the confusion counts of the task-agnostic predictions on
            the seen tasks (exact under DDP, kept in checkpoints) and writes the
            ``class_incremental`` section of ``results.json`` (per-class accuracy, seen-class
            accuracy sample- and task-weighted, last and average incremental accuracy, old/new
            accuracy, AMCA, per-class forgetting, recency bias, the confusion matrices; see
            :mod:`continual_eval.results.class_incremental`), logged as
            ``{prefix}class_il/...`` with the confusion matrix as an image. A stage where
            task-aware accuracy is below task-agnostic accuracy on some task warns (a wrong
            mapping). Multi-head models (``(x, y, t)`` batches, ``continual_eval_step``) are
            scored as before; ``task_classes`` is for single-head logits. ``None`` (default): off.
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
        eval_every_n_steps: int | None = None,
        step_eval_subset: int | None = None,
        step_eval_subset_seed: int = 0,
        cache_test_batches: bool | None = None,
        cache_max_bytes: int = 256 * 2**20,
        overwrite: bool = False,
        restore_rng_states: bool = True,
        reference: Any = None,
        lca_beta: int | None = None,
        task_classes: Sequence[Sequence[int]] | None = None,
    ) -> None:
        if evaluate not in ("all", "needed"):
            raise ValueError(f"evaluate must be 'all' or 'needed', got {evaluate!r}")
        if epochs_per_task is not None and (
            not isinstance(epochs_per_task, int) or epochs_per_task < 1
        ):
            raise ValueError(
                f"epochs_per_task must be a positive int or None, got {epochs_per_task!r}"
            )
        if forgetting not in FORGETTING_CONVENTIONS:
            raise ValueError(
                f"forgetting must be one of {FORGETTING_CONVENTIONS}, got {forgetting!r}"
            )
        for name, value in (
            ("eval_every_n_steps", eval_every_n_steps),
            ("step_eval_subset", step_eval_subset),
        ):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if step_eval_subset is not None and eval_every_n_steps is None:
            raise ValueError(
                "step_eval_subset applies to the per-step evaluations: set eval_every_n_steps too"
            )
        if lca_beta is not None and (
            not isinstance(lca_beta, int) or isinstance(lca_beta, bool) or lca_beta < 0
        ):
            raise ValueError(f"lca_beta must be a non-negative int or None, got {lca_beta!r}")
        if lca_beta is not None and (
            eval_every_n_steps is None or (lca_beta > 0 and eval_every_n_steps != 1)
        ):
            raise ValueError(
                f"lca_beta={lca_beta} reads the score of every stage's task after each of its "
                f"first {lca_beta} optimizer steps (from the per-step evaluations): set "
                f"eval_every_n_steps=1 (got {eval_every_n_steps})"
            )
        if not isinstance(step_eval_subset_seed, int) or isinstance(step_eval_subset_seed, bool):
            raise ValueError(f"step_eval_subset_seed must be an int, got {step_eval_subset_seed!r}")
        if cache_test_batches not in (None, True, False):
            raise ValueError(
                f"cache_test_batches must be None (auto), True or False, got {cache_test_batches!r}"
            )
        if not isinstance(cache_max_bytes, int) or cache_max_bytes < 0:
            raise ValueError(f"cache_max_bytes must be a non-negative int, got {cache_max_bytes!r}")
        for name, flag in (("overwrite", overwrite), ("restore_rng_states", restore_rng_states)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        check_metadata(metadata)
        if task_names is not None and (
            isinstance(task_names, str) or not all(isinstance(n, str) for n in task_names)
        ):
            raise TypeError(f"task_names must be a list of strings, got {task_names!r}")
        if task_names is not None:
            for j, name in enumerate(task_names):
                if not name or len(name) > MAX_NAME_LENGTH:
                    raise ValueError(
                        f"task_names[{j}] has {len(name)} characters; a task name must have 1 to "
                        f"{MAX_NAME_LENGTH} (the results.json limit readers enforce)"
                    )
        if test_dataloaders is not None:
            test_dataloaders = as_loader_list(test_dataloaders, "test_dataloaders")
        self._given_names = list(task_names) if task_names is not None else None
        self.epochs_per_task = epochs_per_task
        self.evaluate = evaluate
        self.scorers: dict[str, Scorer] = resolve_scorers(scorers, metric)
        # with task_classes: the two class-incremental matrices, after the user's scorers
        self._class_il = ClassIncrementalRecorder.attach(task_classes, self.scorers)
        self.primary = next(iter(self.scorers))
        self.scorer: Scorer = self.scorers[self.primary]
        #: the ``reference=`` argument resolved (checked against the primary scorer)
        self.reference = resolve_reference(reference, self.scorer)
        self.lca_beta = lca_beta
        self.prefix = prefix
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.metadata = dict(metadata or {})
        self.forgetting = forgetting
        self.log_images = log_images
        self.verbose = verbose
        self.inference_mode = inference_mode
        self.eval_every_n_steps = eval_every_n_steps
        self.step_eval_subset = step_eval_subset
        self.step_eval_subset_seed = step_eval_subset_seed
        self.cache_test_batches = cache_test_batches
        self.cache_max_bytes = cache_max_bytes
        self.overwrite = overwrite
        self.restore_rng_states = restore_rng_states
        #: identifies this run in ``results.json``; kept through checkpoints (a resume is the same
        #: run)
        self.run_id = uuid.uuid4().hex
        # spawned strategies (ddp_spawn) run the hooks in child processes: rank 0 hands its state
        # back to this process through a file (see _publish_to_owner / _sync_from_child)
        self._handover = SpawnHandover(self.run_id)
        self._restored = False
        self._dir_checked = False
        self._recorded_results_dir: str | None = None

        self._matrices: dict[str, ContinualMetrics] | None = None
        self.task_names: list[str] | None = None
        self._loaders: list[Any] | None = None
        self._task_loaders: TaskLoaders | None = None
        self._baseline_done = False
        self._pending_state: dict[str, Any] | None = None
        self._results_dir: Path | None = None
        self._stage_start_step = 0
        self._trained_this_fit = False
        self._warned_unsharded = False
        # per-step evaluation: the cumulative step counter and the curves
        self._steps_done = 0  # cumulative optimizer steps at the last observation
        self._fit_step_base = 0  # trainer.global_step when this fit's training started
        self._fit_steps_before = 0  # self._steps_done at that moment
        self._curves = StepCurves(list(self.scorers))  # every scorer's, the primary first
        # what each stage cost: clocks and counters read at stage boundaries only
        self._cost = StageCostRecorder()
        # a checkpoint's counters of the stage it was written inside (``stage_progress``), until
        # the resumed fit's on_train_start takes them over
        self._resumed_progress: dict[str, Any] | None = None
        self._loaders_given = test_dataloaders is not None
        if test_dataloaders is not None:
            self._set_loaders(test_dataloaders)
            check_reference_length(self.reference, len(test_dataloaders))

    def reset(self) -> None:
        """Forget everything recorded and start a new run (a new ``run_id``): for re-running a
        notebook cell with the same callback. The files of the previous run stay where they are;
        the new run needs its own results directory (or ``overwrite=True``)."""
        self._matrices = None
        self._pending_state = None
        self._baseline_done = False
        self._results_dir = None
        self._recorded_results_dir = None
        self._dir_checked = False
        self._restored = False
        self._steps_done = 0
        self._fit_step_base = self._fit_steps_before = self._stage_start_step = 0
        self._curves.clear()
        self._cost = StageCostRecorder()
        self._resumed_progress = None
        if self._class_il is not None:
            self._class_il.reset()
        self._warned_unsharded = False
        self.run_id = uuid.uuid4().hex
        # a new hand-over file: what a spawned child published for the old run is not read back
        self._handover = SpawnHandover(self.run_id)
        if self._loaders is not None and self._loaders_given:
            self._set_loaders(self._loaders)
        else:
            self._loaders, self.task_names = None, None

    # ------------------------------------------------------------------ public views
    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(prefix=self.prefix)

    @property
    def num_tasks(self) -> int | None:
        """``T``, known once the test loaders are (at construction or at the first fit)."""
        return None if self._loaders is None else len(self._loaders)

    @property
    def metrics(self) -> ContinualMetrics | None:
        """The primary scorer's :class:`ContinualMetrics` (``None`` before the first fit)."""
        return None if self._matrices is None else self._matrices[self.primary]

    @property
    def matrices(self) -> dict[str, Tensor]:
        """Every scorer's rows so far, ``name -> [stages_completed, T]`` float64."""
        self._sync_from_child()
        if self._matrices is None:
            return {}
        return {name: metric.scores for name, metric in self._matrices.items()}

    @property
    def stages_completed(self) -> int:
        """Stages recorded so far (rows of R)."""
        self._sync_from_child()
        if self.metrics is not None:
            return self.metrics.num_stages
        return len(self._pending_state["scores"]) if self._pending_state else 0

    @property
    def scores(self) -> Tensor:
        """Rows of R so far, ``[stages_completed, T]`` float64 (NaN = not evaluated)."""
        self._sync_from_child()
        if self.metrics is None:
            return torch.zeros(0, 0, dtype=torch.float64)
        return self.metrics.scores

    @property
    def baseline(self) -> Tensor:
        """Untrained scores ``b``, ``[T]`` (NaN until measured)."""
        self._sync_from_child()
        if self.metrics is None:
            return torch.zeros(0, dtype=torch.float64)
        return self.metrics.baseline

    @property
    def results_dir(self) -> Path | None:
        """Directory holding ``results.json`` and ``scores.csv`` (set at the first fit, rank 0)."""
        self._sync_from_child()
        return self._results_dir

    def results(self) -> dict[str, Any]:
        """The ``results.json`` document of the stages so far (the dict view of
        :meth:`continual_results`)."""
        return self.continual_results().to_dict()

    def continual_results(self) -> ContinualResults:
        """The results of the stages so far as a typed
        :class:`~continual_eval.results.ContinualResults`: per scorer its rows, baseline, metric
        family (one functional pass), per-task values and, with ``eval_every_n_steps``, its step
        curves, stability and plasticity metrics; the cost of every stage (``cost``) and, with
        ``reference=``, the primary matrix against it (``reference_metrics``); ``to_dict()`` is
        the ``results.json`` document."""
        self._sync_from_child()
        if self.metrics is None or self.task_names is None:
            raise RuntimeError("ContinualEvalCallback has no results yet: no fit has started")
        assert self._matrices is not None
        steps = self._step_evaluations()
        T = self.metrics.num_tasks
        results = ContinualResults.from_tensors(
            {
                name: ScoreMatrix(
                    score=self.scorers[name].name,
                    scores=metric.scores,
                    baseline=metric.baseline,
                    higher_is_better=bool(self.scorers[name].higher_is_better),
                    bounds=self.scorers[name].bounds,
                    step_scores=None if steps is None else self._curves.tensors(T, name)[2],
                )
                for name, metric in self._matrices.items()
            },
            task_names=self.task_names,
            forgetting=self.forgetting,
            metadata=self.metadata,
            run_id=self.run_id,
            steps=steps,
            cost=RunCost(tuple(self._cost.costs)),
            reference=self.reference,
            lca_beta=self.lca_beta,
        )
        if self._class_il is None:
            return results
        section = self._class_il.results(self.metrics.num_stages, self.forgetting)
        return dataclasses.replace(results, class_incremental=section)

    @property
    def steps_trained(self) -> int:
        """Optimizer steps of the whole run so far: the step of per-step evaluations (unlike
        ``trainer.global_step`` it continues across fits)."""
        self._sync_from_child()
        return self._steps_done

    def curves(self, name: str | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(step [N], stage [N], scores [N, T])`` of the evaluations inside and at the end of
        the stages (NaN = not evaluated) for the scorer ``name`` (default: the primary one);
        empty unless ``eval_every_n_steps`` is set."""
        self._sync_from_child()
        return self._curves.tensors(self.num_tasks or 0, name)

    def _step_evaluations(self) -> StepEvaluations | None:
        """When the per-step evaluations ran (``None`` without ``eval_every_n_steps``)."""
        if self.eval_every_n_steps is None:
            return None
        steps, stage, _ = self._curves.tensors(self.num_tasks or 0)
        subset = None
        if self.step_eval_subset is not None:
            subset = {
                "size": self.step_eval_subset,
                "seed": self.step_eval_subset_seed,
                "samples_per_task": list(
                    self._task_loaders.subset_sizes if self._task_loaders else []
                ),
                "rule": "task j: sorted(randperm(len_j, generator=manual_seed(seed + j))[:size])",
            }
        return StepEvaluations(
            step=steps,
            stage=stage,
            full=tuple(self._curves.full),
            step_counter=STEP_COUNTER,
            subset=subset,
        )

    # ------------------------------------------------------------------ setup
    def _set_loaders(self, loaders: list[Any]) -> None:
        T = len(loaders)
        if T > MAX_TASKS:
            raise ValueError(f"{T} test dataloaders; results.json holds at most {MAX_TASKS} tasks")
        if T == 0:
            raise ValueError(
                "ContinualEvalCallback needs at least one test dataloader (one per task)"
            )
        if self._given_names is not None and len(self._given_names) != T:
            raise ValueError(
                f"task_names has {len(self._given_names)} names for {T} test dataloaders"
            )
        if self._class_il is not None:
            self._class_il.check_num_tasks(T)
        self._loaders = loaders
        self.task_names = self._given_names or [f"task_{j}" for j in range(T)]
        self._task_loaders = TaskLoaders(
            loaders,
            self.task_names,
            subset_size=self.step_eval_subset,
            subset_seed=self.step_eval_subset_seed,
            cache=self.cache_test_batches,
            cache_max_bytes=self.cache_max_bytes,
            per_step=self.eval_every_n_steps is not None,
        )
        if self.metrics is not None and self.metrics.num_tasks != T:
            raise ValueError(
                f"ContinualEvalCallback recorded a run of {self.metrics.num_tasks} tasks but "
                f"{T} test dataloaders were given"
            )
        if self._matrices is None:
            self._matrices = self._new_matrices(T)
        self._apply_pending_state()

    def _new_matrices(self, num_tasks: int) -> dict[str, ContinualMetrics]:
        return {name: self._new_metrics(num_tasks, scorer) for name, scorer in self.scorers.items()}

    def _new_metrics(self, num_tasks: int, scorer: Scorer) -> ContinualMetrics:
        return ContinualMetrics(
            num_tasks,
            forgetting=self.forgetting,
            higher_is_better=bool(scorer.higher_is_better),
            bounds=scorer.bounds,
            validate=True,
            dtype=torch.float64,
            # every rank updates with the same row (counts are reduced before update), and
            # the states stay on the CPU, which an NCCL-only process group cannot gather
            sync_on_compute=False,
        )

    def _prepare_fit(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._loaders is None:
            self._set_loaders(module_test_loaders(trainer, pl_module))
        assert self._task_loaders is not None
        unsharded = self._task_loaders.shard(trainer.global_rank, trainer.world_size)
        if unsharded and trainer.is_global_zero and not self._warned_unsharded:
            self._warned_unsharded = True
            warnings.warn(
                f"ContinualEvalCallback: test dataloaders {sorted(unsharded)} cannot be "
                "sharded (an iterable dataset, a custom sampler or batch sampler, or not a torch "
                "DataLoader); rank 0 scores them alone",
                stacklevel=2,
            )
        if trainer.is_global_zero and self._results_dir is None:
            self._results_dir = choose_results_dir(
                trainer, self.dirpath, recorded=self._recorded_results_dir, run_id=self.run_id
            )

    def _claim_results_dir(self, trainer: Trainer) -> None:
        """Before anything is trained or written: claim the results directory (refused when
        another run uses it or holds its results, unless ``overwrite``: see
        :func:`~continual_eval.results.files.claim_results_dir`), and on a resume rewrite both
        files from the restored state (a write interrupted between them left them apart)."""
        claim_or_refuse(
            trainer,
            self._results_dir,
            run_id=self.run_id,
            restored=self._restored,
            overwrite=self.overwrite,
        )
        self._dir_checked = True
        if trainer.is_global_zero and self._results_dir is not None:
            if self.verbose:
                rank_zero_info(
                    f"[continual-eval] run {self.run_id}: results.json and scores.csv go to "
                    f"{self._results_dir}"
                )
            if self._restored and self.metrics is not None and self._baseline_done:
                self._write()

    # ------------------------------------------------------------------ state
    @override
    def state_dict(self) -> dict[str, Any]:
        if self.metrics is None:
            state = dict(self._pending_state or {})
        else:
            state = {
                "version": _STATE_VERSION,
                "run_id": self.run_id,
                "num_tasks": self.metrics.num_tasks,
                "task_names": list(self.task_names or []),
                "baseline_done": self._baseline_done,
                "baseline": self.metrics.baseline.clone(),
                "scores": self.metrics.scores.clone(),
                "epochs_per_task": self.epochs_per_task,
                "forgetting": self.forgetting,
                "score_name": self.scorer.name,
                "step_eval_subset": self.step_eval_subset,
                "step_eval_subset_seed": self.step_eval_subset_seed,
                "steps_done": self._steps_done,
                **self._curves.state_dict(),
                # what the recorded stages cost (absent in checkpoints of older versions)
                "stage_costs": self._cost.state_dict(),
                # every scorer's rows (the primary's are also the top-level scores/baseline)
                "matrices": {
                    name: {
                        "score_name": self.scorers[name].name,
                        "scores": metric.scores.clone(),
                        "baseline": metric.baseline.clone(),
                    }
                    for name, metric in (self._matrices or {}).items()
                },
            }
            if self._class_il is not None:  # the confusion counts of every recorded stage
                state["class_incremental"] = self._class_il.state_dict()
            progress = self._stage_progress()
            if progress is not None:  # written inside a stage: what it has trained so far
                state["stage_progress"] = progress
        if self._results_dir is not None:
            state["results_dir"] = str(self._results_dir)
        if self.restore_rng_states:
            state["rng_states"] = collect_rng_states()
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if state_dict.get("version") != _STATE_VERSION:
            raise ValueError(
                f"ContinualEvalCallback state has version {state_dict.get('version')!r}; expected "
                f"{_STATE_VERSION}"
            )
        state = dict(state_dict)
        self._check_same_run(state)
        rng_states = state.pop("rng_states", None)
        if "run_id" in state:
            self.run_id = str(state["run_id"])
        self._recorded_results_dir = state.get("results_dir")
        self._restored = True
        self._pending_state = state
        self._cost.load_state_dict(state.get("stage_costs") or {})
        self._resumed_progress = state.get("stage_progress")
        if self._loaders is not None:
            self._matrices = None  # rebuilt from the loaded rows
            self._set_loaders(self._loaders)
        if self.restore_rng_states and rng_states is not None:
            set_rng_states(rng_states)

    def _check_same_run(self, state: Mapping[str, Any]) -> None:
        """Refuse a state recorded under settings that would relabel or mix its rows."""
        recorded: list[tuple[str, Any, Any]] = [
            ("forgetting", state.get("forgetting"), self.forgetting),
            ("epochs_per_task", state.get("epochs_per_task"), self.epochs_per_task),
        ]
        if self._given_names is not None:
            recorded.append(("task_names", list(state.get("task_names", [])), self._given_names))
        scorers = {name: scorer.name for name, scorer in self.scorers.items()}
        if "matrices" in state:
            recorded.append(
                (
                    "scorers",
                    {name: m["score_name"] for name, m in state["matrices"].items()},
                    scorers,
                )
            )
        elif len(scorers) > 1:  # written before several matrices were kept: the primary's rows
            recorded.append(
                ("scorers", {self.primary: state.get("score_name", "accuracy")}, scorers)
            )
        for key, current in (
            ("score_name", self.scorer.name),
            ("step_eval_subset", self.step_eval_subset),
            ("step_eval_subset_seed", self.step_eval_subset_seed),
        ):
            if key in state:  # states written before these were recorded cannot be checked
                recorded.append((key, state[key], current))
        differ = [(key, old, new) for key, old, new in recorded if old != new]
        if differ:
            raise ValueError(
                "ContinualEvalCallback: the checkpoint's state was recorded with other settings; "
                "resuming would relabel or mix its rows: "
                + "; ".join(f"{key}: recorded {old!r}, now {new!r}" for key, old, new in differ)
                + ". Resume with the recorded settings, or start a new run (no checkpoint)"
            )

    def _stage_progress(self) -> dict[str, Any] | None:
        """The counters of the stage in progress (its index, ``trainer.global_step`` at its start,
        this rank's samples and training seconds so far), ``None`` between stages; a loaded one
        not taken over yet is kept as loaded."""
        current = self._cost.progress()
        if current is None or self.metrics is None:
            return self._resumed_progress
        return {"stage": self.metrics.num_stages, "start_step": self._stage_start_step, **current}

    def _resume_stage_progress(self, trainer: Trainer) -> None:
        """In ``on_train_start``: a fit resumed (``ckpt_path``) from a checkpoint written inside
        the stage now training continues its counters, so its cost equals an uninterrupted
        stage's. A checkpoint's counters are used once, and never by a fit that did not resume
        the training loop (e.g. ``fit_tasks(ckpt_path=...)`` retrains the stage from its start)."""
        progress, self._resumed_progress = self._resumed_progress, None
        if (
            progress is None
            or trainer.ckpt_path is None
            or int(progress["stage"]) != self.stages_completed
            or int(progress["start_step"]) > trainer.global_step
        ):
            return
        self._stage_start_step = int(progress["start_step"])
        self._cost.resume_stage(progress)

    def _apply_pending_state(self) -> None:
        state, self._pending_state = self._pending_state, None
        if state is None:
            return
        assert self.metrics is not None
        T = self.metrics.num_tasks
        if state["num_tasks"] != T:
            raise ValueError(
                f"the checkpoint's ContinualEvalCallback state has {state['num_tasks']} tasks but "
                f"{T} test dataloaders were given"
            )
        if self._given_names is None and state.get("task_names"):
            self.task_names = list(state["task_names"])
        assert self._matrices is not None
        recorded = state.get("matrices") or {
            self.primary: {"scores": state["scores"], "baseline": state["baseline"]}
        }
        for name, metric in self._matrices.items():
            if state["baseline_done"]:
                metric.update_baseline(recorded[name]["baseline"].double())
            for row in recorded[name]["scores"]:
                metric.update(row.double())
        self._baseline_done = bool(state["baseline_done"])
        self._steps_done = int(state.get("steps_done", 0))
        self._curves.load_state_dict(state)
        if self._class_il is not None:  # absent in older checkpoints: those stages lack counts
            self._class_il.load_state_dict(state.get("class_incremental"))

    # ------------------------------------------------------------------ spawned processes
    def __getstate__(self) -> dict[str, Any]:
        # pickled for spawned processes (ddp_spawn) or copied: take what a child published first
        self._sync_from_child()
        state = self.__dict__.copy()
        state["_handover"] = copy.copy(self._handover)  # a copy tracks the file on its own
        return state

    def _detach_from_owner(self) -> None:
        """In a process spawned from the one that created the callback (``ddp_spawn``): the
        metric's tensors arrived in shared memory, so every rank would write into the same
        storage; give this process its own copy."""
        if self._handover.in_owner() or self._matrices is None:
            return
        self._matrices = copy.deepcopy(self._matrices)

    def _publish_to_owner(self, trainer: Trainer) -> None:
        """Rank 0 of a spawned process group hands its state to the creating process."""
        if self._handover.in_owner() or not trainer.is_global_zero:
            return
        rng, self.restore_rng_states = self.restore_rng_states, False
        try:
            state = self.state_dict()
        finally:
            self.restore_rng_states = rng
        self._handover.publish(state, results_dir=self._results_dir, dir_checked=self._dir_checked)

    def _sync_from_child(self) -> None:
        """In the creating process: load the state a spawned rank 0 published, if newer."""
        published = self._handover.receive()
        if published is None:
            return
        state = published.state
        self._pending_state = None
        self._matrices = None
        rng, self.restore_rng_states = self.restore_rng_states, False
        try:
            self.load_state_dict(state)
        finally:
            self.restore_rng_states = rng
        self._resumed_progress = None  # a child's stage in progress is no checkpoint to resume
        if self.metrics is None and self._pending_state is not None:
            # loaders are resolved in the children (datamodule): rebuild from the state alone
            self._matrices = self._new_matrices(int(state["num_tasks"]))
            self.task_names = list(state["task_names"])
            self._apply_pending_state()
        if published.results_dir is not None:
            self._results_dir = published.results_dir
        self._dir_checked = published.dir_checked

    # ------------------------------------------------------------------ evaluation
    def _evaluate(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        task_ids: Sequence[int],
        subset: bool = False,
        primary_only: bool = False,
    ) -> dict[str, Tensor]:
        """Score ``task_ids`` with every scorer (or the primary one); ``name -> row [T]``, NaN
        for tasks not scored."""
        assert self._loaders is not None and self._task_loaders is not None
        names = [self.primary] if primary_only else list(self.scorers)
        # the stage a task-agnostic scorer restricts to: -1 (baseline), else the stage being
        # trained (per-step evaluations) or just finished (its rows are not recorded yet)
        metrics = self.metrics
        stage = metrics.num_stages if self._baseline_done and metrics is not None else -1
        set_evaluation_stage(self.scorers.values(), stage)
        return evaluate_under_trainer(
            trainer,
            pl_module,
            self._task_loaders,
            task_ids,
            {name: self.scorers[name] for name in names},
            inference_mode=self.inference_mode,
            task_names=self.task_names,
            subset=subset,
        )

    # ------------------------------------------------------------------ per-step evaluation
    def _current_step(self, trainer: Trainer) -> int:
        return self._fit_steps_before + trainer.global_step - self._fit_step_base

    def _record_step(self, trainer: Trainer, pl_module: LightningModule, step: int) -> None:
        assert self.task_names is not None
        stage = self.stages_completed
        subset = self._task_loaders is not None and self._task_loaders.subsets is not None
        # one forward pass per batch feeds every scorer: each gets its step curve
        rows = self._evaluate(trainer, pl_module, range(stage + 1), subset=subset)
        self._curves.add(step, stage, rows, full=not subset)
        if trainer.is_global_zero:
            log_step(
                trainer.loggers, self.task_names, rows, step, prefix=self.prefix, subset=subset
            )

    def _check_each(
        self, values: Mapping[str, Tensor], *, baseline: bool, problem: Callable[[str], str]
    ) -> None:
        """Check every matrix's new row (or baseline) before any is recorded: all matrices get
        it or none does."""
        assert self._matrices is not None
        for name, metric in self._matrices.items():
            check = metric.check_baseline if baseline else metric.check_row
            try:
                check(values[name])
            except ValueError as err:
                raise ValueError(f"ContinualEvalCallback: {problem(name)}: {err}") from err

    def _record_baseline(self, trainer: Trainer, pl_module: LightningModule) -> None:
        assert self.metrics is not None and self._matrices is not None
        if trainer.loggers:  # every rank, before anything is measured (no collective)
            collisions = stage_key_collisions(self.continual_results(), self.prefix)
            if collisions:
                raise ValueError(
                    "ContinualEvalCallback: two different values would be logged under the same "
                    f"key{'s' if len(collisions) > 1 else ''} {', '.join(map(repr, collisions))}"
                    " (a task named like a metric, or a scorer named like the primary's score or "
                    "`cost`): rename the task or the scorer. Nothing was trained"
                )
        baselines = self._evaluate(trainer, pl_module, range(self.metrics.num_tasks))
        self._check_each(
            baselines,
            baseline=True,
            problem=lambda name: (
                f"the untrained model's {name!r} scores (the baseline) cannot be used"
            ),
        )
        for name, metric in self._matrices.items():
            metric.update_baseline(baselines[name])
        self._baseline_done = True
        if trainer.is_global_zero:
            results = self._write(trainer)
            log_baseline(trainer.loggers, results, prefix=self.prefix)

    def _record_stage(self, trainer: Trainer, pl_module: LightningModule, stage: int) -> None:
        assert self.metrics is not None and self.task_names is not None
        T = self.metrics.num_tasks
        if stage >= T:
            raise _too_many_stages(stage, T)
        # the stage's cost: its training clock stops before the evaluation starts
        train_seconds = self._cost.train_seconds()
        samples = self._stage_samples(trainer)
        eval_start = time.perf_counter()
        tasks = range(T) if self.evaluate == "all" else range(min(stage + 2, T))
        rows = self._evaluate(trainer, pl_module, tasks)
        assert self._matrices is not None
        self._check_each(
            rows,
            baseline=False,
            problem=lambda name: f"stage {stage} produced {name!r} scores the metrics cannot use",
        )
        # the replay-memory hook may raise: read it before anything of the stage is recorded
        replay_memory = read_replay_memory(pl_module)
        # every rank records the same rows: they come from counts (or metric states) reduced
        # across ranks before this point (see evaluate_tasks)
        for name, metric in self._matrices.items():
            metric.update(rows[name])
        if self._class_il is not None:  # the stage's confusion counts (seen tasks), reduced
            self._class_il.record_stage(
                stage, rows, task_names=self.task_names, warn=trainer.is_global_zero
            )
        if self.eval_every_n_steps is not None:
            self._steps_done = self._current_step(trainer)
            replaced = self._curves.add(self._steps_done, stage, rows, full=True)
            if trainer.is_global_zero and replaced is None:
                # the whole-test-set point of every curve at this step, under the full-set keys
                log_step(
                    trainer.loggers,
                    self.task_names,
                    self._curves.last(),
                    self._steps_done,
                    prefix=self.prefix,
                )
        self._cost.finish_stage(
            stage,
            pl_module,
            train_seconds=train_seconds,
            eval_seconds=time.perf_counter() - eval_start,
            samples=samples,
            optimizer_steps=trainer.global_step - self._stage_start_step,
            replay_memory=replay_memory,
        )
        if trainer.is_global_zero:
            results = self._write(trainer)
            log_stage(
                trainer.loggers,
                results,
                stage,
                prefix=self.prefix,
                log_images=self.log_images,
                results_dir=self._results_dir,
            )
            if self.verbose:
                m = results.primary.metrics
                rank_zero_info(
                    f"[continual-eval] stage {stage + 1}/{T} ({self.task_names[stage]}; row "
                    f"{stage} of R): "
                    + "  ".join(f"{k}={v:.4f}" for k, v in m.items() if math.isfinite(v))
                )

    def _stage_samples(self, trainer: Trainer) -> int:
        """Samples trained in the current stage, summed over the ranks: one reduce at the stage
        end (outside any training step) in which every rank takes part."""
        samples = self._cost.samples
        if trainer.world_size > 1:
            local = torch.tensor(samples, dtype=torch.int64, device=trainer.strategy.root_device)
            samples = int(trainer.strategy.reduce(local, reduce_op="sum").item())
        return samples

    def _write(self, trainer: Trainer | None = None) -> ContinualResults:
        """Build the results, write their files (rank 0, once the directory is known) and, in a
        spawned process, hand the state to the creating one; returns the results."""
        results = self.continual_results()
        if self._results_dir is not None:
            results.write(self._results_dir)
        if trainer is not None:
            self._publish_to_owner(trainer)
        return results

    # ------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._detach_from_owner()

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.metrics is not None:
            self._publish_to_owner(trainer)

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._prepare_fit(trainer, pl_module)
        self._trained_this_fit = False
        T = self.num_tasks
        assert T is not None
        check_reference_length(self.reference, T)
        k = self.epochs_per_task
        if k is not None and trainer.max_epochs is not None and trainer.max_epochs > T * k:
            raise ValueError(
                f"max_epochs={trainer.max_epochs} trains {math.ceil(trainer.max_epochs / k)} "
                f"stages of epochs_per_task={k} epochs, but there are only {T} tasks (test "
                "dataloaders)"
            )
        if k is not None:
            stages = T if trainer.max_epochs in (None, -1) else math.ceil(trainer.max_epochs / k)
            # set on the Trainer by Lightning's data connector, not declared on the class
            reload: int = trainer.reload_dataloaders_every_n_epochs  # type: ignore[attr-defined]
            if stages > 1 and (reload < 1 or k % reload):
                raise ValueError(
                    f"ContinualEvalCallback(epochs_per_task={k}): the training data must switch "
                    f"to the next task every {k} epochs, but Trainer("
                    f"reload_dataloaders_every_n_epochs={reload}) "
                    + (
                        "never reloads the train dataloader"
                        if reload < 1
                        else "does not reload it at every stage boundary"
                    )
                    + ", so the first task's data would train every stage. Use Trainer("
                    "reload_dataloaders_every_n_epochs=1) with a train_dataloader() returning "
                    f"loaders[continual_eval.scheduled_task(self.trainer, {k})]; nothing was "
                    "trained"
                )
        if k is None and self.stages_completed >= T:
            raise _too_many_stages(self.stages_completed, T)
        if k is None and fit_already_done(trainer):
            raise ValueError(
                f"ContinualEvalCallback: this fit (stage {self.stages_completed}) would train "
                f"nothing: the Trainer already reached max_epochs={trainer.max_epochs} / "
                f"max_steps={trainer.max_steps}. A second fit on the same Trainer trains only if "
                "trainer.fit_loop.max_epochs is raised; use continual_eval.fit_tasks(trainer, "
                "model, train_dataloaders) to run a task sequence on one Trainer, or a new "
                "Trainer per task"
            )
        if not self._dir_checked:
            self._claim_results_dir(trainer)
        if not self._baseline_done:
            self._record_baseline(trainer, pl_module)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stage_start_step = trainer.global_step
        self._cost.start_stage(pl_module.device)  # a stage (or the rest of a resumed one) starts
        self._resume_stage_progress(trainer)
        self._fit_step_base = trainer.global_step
        self._fit_steps_before = self._steps_done
        k = self.epochs_per_task
        if k is None:
            return
        # resumed from a checkpoint written after a stage's last epoch but before its evaluation
        # (ModelCheckpoint saving in on_validation_end): score that stage now, from those weights
        epochs_done = trainer.current_epoch
        if epochs_done % k == 0 and self.stages_completed == epochs_done // k - 1:
            self._record_stage(trainer, pl_module, epochs_done // k - 1)

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        k = self.epochs_per_task
        if k is None:
            return
        stage = trainer.current_epoch // k
        assert self.num_tasks is not None
        if stage >= self.num_tasks:
            raise _too_many_stages(stage, self.num_tasks)
        if trainer.current_epoch % k == 0:
            self._stage_start_step = trainer.global_step
            self._cost.start_stage(pl_module.device)

    @override
    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._cost.add_batch(batch)  # the batch's leading dimension, read on the host
        step = self._current_step(trainer)
        if step == self._steps_done:
            return  # no optimizer step (gradient accumulation) since the last batch
        self._steps_done = step
        k = self.eval_every_n_steps
        if k is not None and step % k == 0:
            self._record_step(trainer, pl_module, step)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        k = self.epochs_per_task
        if k is None or (trainer.current_epoch + 1) % k:
            return
        stage = (trainer.current_epoch + 1) // k - 1
        if stage == self.stages_completed:
            if trainer.global_step == self._stage_start_step and trainer.is_global_zero:
                assert self.task_names is not None
                warnings.warn(
                    f"ContinualEvalCallback: stage {stage} (task {stage}, "
                    f"{self.task_names[stage]!r}) ended without a training step: its train "
                    "dataloader yielded no batch. The row is recorded from the unchanged model",
                    stacklevel=2,
                )
            self._record_stage(trainer, pl_module, stage)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._trained_this_fit = True
        k = self.epochs_per_task
        if k is None:
            self._record_stage(trainer, pl_module, self.stages_completed)
            return
        if not trainer.is_global_zero:
            return
        assert self.num_tasks is not None and self.task_names is not None
        epoch, stage = trainer.current_epoch, self.stages_completed
        max_epochs = trainer.max_epochs
        planned = (
            self.num_tasks if max_epochs in (None, -1) else min(self.num_tasks, max_epochs // k)
        )
        if epoch % k:
            warnings.warn(
                f"ContinualEvalCallback: training stopped inside stage {epoch // k} after "
                f"{epoch % k} of its {k} epochs; that stage is not recorded",
                stacklevel=2,
            )
        elif stage < planned:
            warnings.warn(
                f"ContinualEvalCallback: training ended after {stage} of {planned} scheduled "
                f"stages: stage {stage} (task {stage}, {self.task_names[stage]!r}) ended without a "
                "training step (its train dataloader yielded no batch, or the fit was stopped). "
                f"Stages 0..{stage - 1} are recorded",
                stacklevel=2,
            )

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.epochs_per_task is None and not self._trained_this_fit:
            stage = self.stages_completed
            name = (
                self.task_names[stage] if self.task_names and stage < len(self.task_names) else "?"
            )
            raise RuntimeError(
                f"ContinualEvalCallback: the fit for stage {stage} (task {stage}, {name!r}) "
                "trained nothing and no row was recorded: its train dataloader yielded no batch "
                "(or limit_train_batches=0). Everything recorded before is kept in "
                f"{self._results_dir or 'the results directory'}"
            )
        done = self.num_tasks is not None and self.stages_completed == self.num_tasks
        if (
            trainer.is_global_zero
            and self.verbose
            and (done or self.epochs_per_task is not None)
            and self.stages_completed
        ):
            rank_zero_info(format_matrix_table(self.continual_results()))


def _too_many_stages(stage: int, num_tasks: int) -> ValueError:
    return ValueError(
        f"ContinualEvalCallback: training stage {stage} would be stage {stage + 1} of a sequence "
        f"with only {num_tasks} tasks ({num_tasks} test dataloaders); more training stages than "
        "tasks"
    )

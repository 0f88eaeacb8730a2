"""Evaluation engine: score a module on several task test loaders, exactly, on every rank.

Kept apart from [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback]'s hook plumbing so
that other callers (evaluation every k steps inside a stage, cached device batches) can reuse it.

[`evaluate_tasks`][continual_eval.evaluation.evaluate_tasks] runs the module in eval mode under a
no-grad/inference context, restores every submodule's own ``training`` flag and the RNG states
afterwards, moves batches with a plain device move (no user transfer hooks), and reduces per-task
counts across ranks with one collective per call. Under data parallelism each map-style test set is
sharded *without padding* (`shard_dataloader`), so the reduced counts equal the single-process
counts exactly; a test loader over a ``DistributedSampler`` means its whole dataset, and a loader
whose samples cannot be split exactly (a random ``drop_last`` tail) is refused. Non-finite
predictions and targets that are not labels are counted on the device and reported after each task,
naming it.

Reading the batches (exact: the scores are identical with either switch off): tensor-backed test
sets are sliced a batch at a time instead of fetched and collated sample by sample
(`fast_loader`; ``switches.FAST_PATH = False`` turns it off). Test loaders with worker
processes that `fast_loader` cannot read share one persistent worker pool per group of equal
settings (``num_workers``, ``collate_fn``, ``pin_memory``, ``timeout``, ``multiprocessing_context``,
``prefetch_factor``; batch sizes may differ; no ``worker_init_fn``, which may read
``get_worker_info().dataset``): one DataLoader over the concatenated test sets whose batch sampler
yields each task's batches as its own loader makes them, never mixing two tasks. The pool is kept
for the next evaluation while its loaders and datasets are the same objects (a dataset edited in
place after the workers started is not seen: replace the loader), and shut down when they are gone
or more than two pools are kept. ``switches.POOLED_LOADERS = False`` gives each loader its own
workers.

Under a strategy whose forward pass is a collective (FSDP2, FSDP1, DeepSpeed ZeRO-3) the ranks
evaluate in lockstep (`lockstep`): every rank runs the same number
of forward passes per task, the extra ones on a sample it already has, discarded; the Trainer's
strategy decides it and how the model is called (`strategy`).

Layout (every public name is re-exported here):

* `loop`: [`evaluate_tasks`][continual_eval.evaluation.evaluate_tasks],
  [`TaskEvaluation`][continual_eval.evaluation.TaskEvaluation],
  [`EvaluationProgress`][continual_eval.evaluation.EvaluationProgress] (what its ``progress=``
  hears); the pieces it runs: `sources` (where each task's batches come from), `feed` (the output
  watch and the scorers' feed), `reduction` (counts across ranks, their problems in words);
* `lockstep`: `Lockstep`; and
  `strategy`: [`collective_forward`][continual_eval.evaluation.collective_forward], `LOCKSTEP_ATTR`,
  the forward redirection of wrapping strategies;
* `guards`: train/eval flags, RNG states, grad context;
* `step`: the batch step, `default_batch_step`;
* `scorers`: the [`Scorer`][continual_eval.evaluation.Scorer] protocol, the built-in scorers,
  [`make_scorer`][continual_eval.evaluation.make_scorer];
* [`class_incremental`][continual_eval.evaluation.class_incremental]: the task-aware and
  task-agnostic accuracy scorers of single-head class-incremental models,
  [`task_classes_from_loaders`][continual_eval.task_classes_from_loaders];
* `loaders`: `shard_dataloader`, `subset_dataloader`,
  `spare_dataloader`;
* `fast_path`, `pools`: reading
  the batches (`fast_loader`, worker pools);
* `cache`: `BatchCache`, [`cache_safety`][continual_eval.evaluation.cache_safety];
* `errors`: [`EvaluationError`][continual_eval.evaluation.EvaluationError].

The two switches ``FAST_PATH`` and ``POOLED_LOADERS`` live in
[`switches`][continual_eval.evaluation.switches] and are read at call time, so
``continual_eval.evaluation.switches.FAST_PATH = False`` (or a ``monkeypatch.setattr`` on that
module) takes effect on the next evaluation.
"""

from __future__ import annotations

# private names are re-exported for the tests and tools that reach into the engine
from continual_eval.evaluation.cache import (
    DETERMINISTIC_ATTR,
    BatchCache,
    cache_safety,
)
from continual_eval.evaluation.cache import _CachedLoader as _CachedLoader
from continual_eval.evaluation.class_incremental import (
    TaskAgnosticAccuracyScorer,
    TaskAwareAccuracyScorer,
    task_classes_from_loaders,
)
from continual_eval.evaluation.errors import EvaluationError
from continual_eval.evaluation.fast_path import fast_loader
from continual_eval.evaluation.guards import (
    grad_free_context,
    preserve_rng_state,
    preserve_training_flags,
)
from continual_eval.evaluation.loaders import (
    _loader_label as _loader_label,
)
from continual_eval.evaluation.loaders import (
    _sampled_indices as _sampled_indices,
)
from continual_eval.evaluation.loaders import (
    _ShardSampler as _ShardSampler,
)
from continual_eval.evaluation.loaders import (
    shard_dataloader,
    spare_dataloader,
    subset_dataloader,
)
from continual_eval.evaluation.lockstep import Lockstep
from continual_eval.evaluation.loop import EvaluationProgress, TaskEvaluation, evaluate_tasks
from continual_eval.evaluation.pools import _POOLS as _POOLS
from continual_eval.evaluation.pools import _PoolView as _PoolView
from continual_eval.evaluation.scorers import (
    AccuracyScorer,
    LossScorer,
    MetricScorer,
    Scorer,
    TopKAccuracyScorer,
    make_scorer,
)
from continual_eval.evaluation.sources import _batch_sources as _batch_sources
from continual_eval.evaluation.step import BatchStep, default_batch_step
from continual_eval.evaluation.strategy import (
    LOCKSTEP_ATTR,
    collective_forward,
)
from continual_eval.evaluation.task_loaders import TaskLoaders

#: what the evaluation engine promises; the built-in scorer classes (``make_scorer`` builds
#: them), the loaders' helpers and the names re-exported for the tests stay importable without a
#: promise
# the promised API (docs/compatibility.md): other names here are importable, not promised
__all__ = [
    "LOCKSTEP_ATTR",
    "EvaluationError",
    "EvaluationProgress",
    "Scorer",
    "TaskEvaluation",
    "cache_safety",
    "collective_forward",
    "evaluate_tasks",
    "make_scorer",
]

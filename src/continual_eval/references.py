r"""Reference models: the same network trained without the continual sequence.

Two metrics compare the continual run with a model trained *without* the sequence:

* forward transfer against isolated training (``forward_transfer(R, ref,
  convention="isolated")``, the handbook's FWT: ``R[j, j] - ref[j]`` for ``j >= 1``), whose
  ``ref[j]`` is "same architecture and training budget, no other tasks present";
* intransigence (``intransigence(R, ref)``, Chaudhry et al., 2018: ``ref[j] - R[j, j]`` over every
  ``j``), whose ``ref[j]`` is a model trained on task ``j`` alone or on all tasks jointly.

[`train_reference`][continual_eval.train_reference] trains such models with a real Lightning Trainer
and scores them with a [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] (the same
evaluation, scorers and options as the continual run), so ``ref`` is measured exactly like ``R``.

Budgets (``E`` = the Trainer's ``max_epochs``, the continual run's epochs *per task*):

* ``"isolated"``: ``T`` copies of the untrained model (the same initial weights), copy ``j``
  trained on task ``j``'s loader alone for ``E`` epochs: exactly stage ``j``'s budget in the
  continual run, with a fresh optimiser from ``configure_optimizers`` (Lightning builds one at
  every ``fit``, so each continual stage starts a fresh optimiser too). ``ref[j]`` is copy
  ``j``'s score on task ``j``. This is Continual World's reference for forward transfer (each
  task trained alone from scratch, with the same number of steps; Wołczyk et al., 2021).
* ``"joint"``: one copy trained on the union of all tasks' training data for the same ``E``
  epochs over the union, not ``T * E``: every example is seen ``E`` times, as in the continual
  run, so the reference gets the continual run's data budget (its optimiser steps add up to the
  sum of the tasks' steps, ``T`` times one task's for equal-sized tasks). This is what the
  common joint ("multitask upper bound") baselines do: Avalanche's ``JointTraining`` trains the
  concatenated experiences for ``train_epochs``, Mammoth's ``joint`` trains the union for
  ``n_epochs``, and GEM's protocol gives every learner a single pass over all the data.
  ``ref[j]`` is its score on task ``j``. (Chaudhry et al. define the reference of task ``k`` on
  the tasks ``0..k``; one model on all ``T`` tasks is the usual simplification.)
* ``"cumulative"``: Chaudhry et al.'s own reference for intransigence (RWalk, ECCV 2018: a
  model trained with access to the data of all tasks up to ``k``): ``T`` copies of the
  untrained model, copy ``k`` trained on the union of the tasks ``0..k`` for the same ``E``
  epochs over that union as the joint copy gets over its union (every example seen ``E``
  times), from the same initial weights, with a fresh optimiser. ``ref[k]`` is copy ``k``'s
  score on task ``k``. Copy ``0`` trains on task 0 alone: the isolated copy 0. ``T`` fits of
  growing size: about ``(T + 1) / 2`` times the joint reference's optimizer steps for
  equal-sized tasks.

Copies: ``model.reference_model()`` when the model defines it, else ``copy.deepcopy(model)``;
with ``model_factory``, ``model_factory()`` loaded with ``model``'s full state dict (the way to
copy a sharded model, which cannot be deep-copied: parameters that are DTensors, as FSDP2
``fully_shard`` and tensor parallelism leave them after a fit under ``ModelParallelStrategy``, are
gathered with torch's distributed state dict on rank 0 once per call and broadcast into every
copy; both are collectives that every rank runs equally often).

Random numbers: the caller's Python, NumPy and torch random states, and the states of the training
loaders' own ``torch.Generator`` objects (``DataLoader(generator=...)``, a sampler's
``generator``), are restored afterwards, so a continual run started after
[`train_reference`][continual_eval.train_reference] draws what it would draw without it. Every
reference fit starts from the caller's random state (with ``seed=s``: ``seed_everything(s + j)``
before copy ``j``, ``seed_everything(s)`` before the joint copy; the first is what
[`fit_tasks`][continual_eval.fit_tasks] with ``seed=s`` does before stage ``j``).
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from continual_eval._item_record import ItemRecord
from continual_eval.callback import ContinualEvalCallback
from continual_eval.evaluation.strategy import parameter_sharding
from continual_eval.functional.intervals import PackedBits, pack_bits
from continual_eval.options import StepEvaluation
from continual_eval.results.reference import Reference, ReferenceCurve
from continual_eval.rng import collect_rng_states, loader_generators, set_rng_states

__all__ = [
    "REFERENCE_DIRS",
    "REFERENCE_KINDS",
    "Reference",
    "ReferenceCurve",
    "check_reference_kind",
    "train_reference",
    "union_dataloader",
]

#: the kinds of reference [`train_reference`][continual_eval.train_reference] trains
REFERENCE_KINDS = ("isolated", "joint", "cumulative")
#: the sub-directory of a run that ``continual-eval fit`` gives each kind's results
REFERENCE_DIRS = {
    "isolated": "isolated_reference",
    "joint": "joint_reference",
    "cumulative": "cumulative_reference",
}
#: [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] arguments that
#: [`train_reference`][continual_eval.train_reference] sets itself
_SET_HERE = (
    "test_dataloaders",
    "task_names",
    "epochs_per_task",
    "evaluate",
    "dirpath",
    "metadata",
    "eval_every_n_steps",
    "verbose",
    "log_images",
    "reference",
    "lca_beta",
)


def check_reference_kind(kind: object) -> str:
    """``kind`` when it is one of `REFERENCE_KINDS`, else a `ValueError` naming the
    choices."""
    if not isinstance(kind, str) or kind not in REFERENCE_KINDS:
        raise ValueError(
            f"reference kind must be one of {', '.join(map(repr, REFERENCE_KINDS))}, got {kind!r}"
        )
    return kind


def union_dataloader(train_dataloaders: Sequence[Any], what: str = "joint") -> DataLoader[Any]:
    """A loader over the union of the tasks' training data, built like ``train_dataloaders[0]``.

    Every loader must be a torch ``DataLoader`` over a map-style dataset with the default batch
    sampler, a sequential or (without replacement) random sampler, and the same batch size and
    shuffling as the first; the union is their ``ConcatDataset`` (task order) with the first
    loader's batch size, shuffling, collate function, workers, pinning, ``drop_last`` and
    generator. Anything else: a `ValueError` asking for ``joint_dataloader=``.
    """
    first = train_dataloaders[0]
    datasets = []
    for j, loader in enumerate(train_dataloaders):
        problem = _union_problem(loader, first)
        if problem is not None:
            raise ValueError(
                f"{what} reference: cannot build the union of the training loaders: "
                f"train_dataloaders[{j}] {problem}; pass joint_dataloader= (one loader over every "
                "task's training data)"
            )
        datasets.append(loader.dataset)
    return DataLoader(
        ConcatDataset(datasets),
        batch_size=first.batch_size,
        shuffle=isinstance(first.sampler, RandomSampler),
        collate_fn=first.collate_fn,
        num_workers=first.num_workers,
        pin_memory=first.pin_memory,
        drop_last=first.drop_last,
        timeout=first.timeout,
        worker_init_fn=first.worker_init_fn,
        generator=first.generator,
        persistent_workers=first.persistent_workers,
        **({"prefetch_factor": first.prefetch_factor} if first.num_workers > 0 else {}),
    )


def _union_problem(loader: Any, first: Any) -> str | None:
    if not isinstance(loader, DataLoader):
        return f"is a {type(loader).__name__}, not a torch DataLoader"
    if isinstance(loader.dataset, IterableDataset):
        return "reads an IterableDataset"
    if type(loader.batch_sampler) is not BatchSampler or loader.batch_size is None:
        return "has a custom batch sampler"
    sampler = loader.sampler
    if type(sampler) is RandomSampler:
        if sampler.replacement or sampler._num_samples is not None:
            return "samples with replacement or a fixed number of samples"
    elif type(sampler) is not SequentialSampler:
        return f"has a custom sampler ({type(sampler).__name__})"
    if loader.batch_size != first.batch_size:
        return f"has batch size {loader.batch_size}, train_dataloaders[0] {first.batch_size}"
    if type(sampler) is not type(first.sampler):
        return "shuffles differently from train_dataloaders[0]"
    return None


def _default_copy(model: LightningModule) -> LightningModule:
    """``model.reference_model()`` when the model defines it, else ``copy.deepcopy(model)``."""
    make = getattr(model, "reference_model", None)
    if callable(make):
        return make()  # type: ignore[no-any-return]
    return copy.deepcopy(model)


def _copier(
    model: LightningModule,
    model_factory: Callable[[], LightningModule] | None,
    copy_model: Callable[[LightningModule], LightningModule] | None,
) -> Callable[[LightningModule], LightningModule]:
    """How [`train_reference`][continual_eval.train_reference] copies ``model``: ``copy_model``, a
    `_StateDictCopies` of ``model_factory``, or `_default_copy`; a sharded model without
    ``model_factory`` (or ``copy_model``) refused. Decided from ``model`` alone, so every rank
    decides alike before any collective."""
    if model_factory is not None and copy_model is not None:
        raise ValueError("pass model_factory or copy_model, not both")
    if model_factory is not None and not callable(model_factory):
        raise TypeError(f"model_factory must be a callable, got {type(model_factory).__name__}")
    if copy_model is not None:
        return copy_model
    sharding = parameter_sharding(model)
    if sharding == "flattened":
        raise ValueError(
            "train_reference cannot copy a model whose parameters FSDP1 flattened or DeepSpeed "
            "ZeRO-3 partitioned (torch's distributed state dict reads DTensors, as FSDP2 and "
            "ModelParallelStrategy leave them): call train_reference before the sharded fit, "
            "on the unsharded model"
        )
    if model_factory is not None:
        return _StateDictCopies(model, model_factory, sharded=sharding == "dtensor")
    if sharding == "dtensor":
        raise ValueError(
            "train_reference: model's parameters are sharded (DTensors: FSDP2 fully_shard or "
            "tensor parallelism), and a sharded module cannot be deep-copied; pass "
            "model_factory= (a function building the unsharded model; every copy loads model's "
            "full state dict)"
        )
    return _default_copy


class _StateDictCopies:
    """``model_factory()`` with ``model``'s full state dict loaded, once per call.

    Sharded (``sharded=True``): the full state dict is gathered once, here, with
    ``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` (rank 0 alone receives the
    tensors, on the CPU), and each copy loads it with ``set_model_state_dict(...,
    broadcast_from_rank0=True)`` (rank 0 broadcasts it tensor by tensor). Both are collectives:
    every rank constructs this once per [`train_reference`][continual_eval.train_reference] and
    makes one copy per reference fit, so the counts agree. A factory whose module's keys, shapes or
    dtypes differ from ``model``'s is refused before the collective, on every rank alike
    (``model.state_dict()`` gives a DTensor's global shape without communicating).
    """

    def __init__(
        self,
        model: LightningModule,
        model_factory: Callable[[], LightningModule],
        *,
        sharded: bool,
    ) -> None:
        self.factory, self.sharded = model_factory, sharded
        self.layout = _layout(model.state_dict())
        self.state: dict[str, Any]
        if sharded:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            self.state = get_model_state_dict(model, options=options)
        else:
            self.state = model.state_dict()

    def __call__(self, model: LightningModule) -> LightningModule:
        fresh = self.factory()
        if not isinstance(fresh, LightningModule):
            raise TypeError(
                f"model_factory must return a LightningModule, got {type(fresh).__name__}"
            )
        if fresh is model:
            raise ValueError("model_factory returned the model itself, not a new model")
        problem = _layout_difference(self.layout, _layout(fresh.state_dict()))
        if problem is not None:
            raise ValueError(
                f"model_factory built a model that cannot load model's state dict: {problem}"
            )
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_model_state_dict(fresh, self.state, options=options)
        else:
            fresh.load_state_dict(self.state)
        return fresh


def _layout(state: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], torch.dtype] | None]:
    """Key -> (shape, dtype) of a state dict's tensors (a DTensor's global shape), ``None`` for
    other entries."""
    return {
        key: (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else None
        for key, value in state.items()
    }


def _layout_difference(
    want: Mapping[str, tuple[tuple[int, ...], torch.dtype] | None],
    got: Mapping[str, tuple[tuple[int, ...], torch.dtype] | None],
) -> str | None:
    missing, unexpected = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing or unexpected:
        return f"keys missing {missing[:5]}, unexpected {unexpected[:5]}"
    for key, layout in want.items():
        if got[key] != layout:
            return f"{key!r} is {got[key]} in the new model, {layout} in model"
    return None


@contextlib.contextmanager
def _caller_rng(
    generators: Sequence[torch.Generator] = (),
) -> Iterator[Callable[[int | None], None]]:
    """Restore the caller's random states (and Lightning's seed variables, and the states of
    ``generators``: the training loaders' own) on exit; yields ``rewind(seed)``: back to the
    caller's global states, then ``seed_everything(seed)`` (if given)."""
    from lightning.pytorch import seed_everything

    if torch.cuda.is_available() and not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        # CUDA generators are recorded only once CUDA is initialised; the reference fits may
        # be its first use, and the caller's CUDA state must come back after them too
        torch.cuda.init()  # type: ignore[no-untyped-call]
    states = collect_rng_states()
    generator_states = [generator.get_state() for generator in generators]
    env = {key: os.environ.get(key) for key in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")}

    def rewind(seed: int | None) -> None:
        set_rng_states(states)
        if seed is not None:
            seed_everything(seed, verbose=False)

    try:
        yield rewind
    finally:
        set_rng_states(states)
        for generator, state in zip(generators, generator_states, strict=True):
            generator.set_state(state)
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _callbacks(trainer: Trainer) -> list[Callback]:
    """``trainer.callbacks`` (an attribute Lightning's callback connector sets, unknown to
    the type checker)."""
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]
    return callbacks


def _new_trainer(trainer_factory: Callable[[], Trainer], epochs: int | None) -> Trainer:
    trainer = trainer_factory()
    if not isinstance(trainer, Trainer):
        raise TypeError(
            f"trainer_factory must return a lightning.pytorch.Trainer, got {type(trainer).__name__}"
        )
    max_epochs = trainer.fit_loop.max_epochs
    if max_epochs is None or max_epochs < 1 or trainer.fit_loop.max_steps != -1:
        raise ValueError(
            "train_reference needs Trainer(max_epochs=E) with E >= 1 and no max_steps: the "
            f"budget is E epochs per task (got max_epochs={max_epochs}, "
            f"max_steps={trainer.fit_loop.max_steps})"
        )
    if epochs is not None and max_epochs != epochs:
        raise ValueError(
            f"trainer_factory returned Trainers with max_epochs={epochs} and {max_epochs}; every "
            "reference model gets the same budget"
        )
    if trainer.global_step or trainer.current_epoch:
        raise ValueError(
            "trainer_factory returned a Trainer that has already trained: it must return a new "
            "Trainer at every call"
        )
    if any(isinstance(cb, ContinualEvalCallback) for cb in _callbacks(trainer)):
        raise ValueError(
            "trainer_factory's Trainer already holds a ContinualEvalCallback; train_reference "
            "scores the reference with its own (a shared one would record the reference as a "
            "stage of the continual run). Pass the scoring options as callback_kwargs"
        )
    return trainer


def train_reference(
    model: LightningModule,
    train_dataloaders: Sequence[Any],
    test_dataloaders: Sequence[Any],
    *,
    kind: str,
    trainer_factory: Callable[[], Trainer],
    joint_dataloader: Any = None,
    task_names: Sequence[str] | None = None,
    eval_every_n_steps: int | StepEvaluation | None = None,
    callback_kwargs: Mapping[str, Any] | None = None,
    seed: int | None = None,
    dirpath: str | os.PathLike[str] | None = None,
    copy_model: Callable[[LightningModule], LightningModule] | None = None,
    model_factory: Callable[[], LightningModule] | None = None,
) -> Reference:
    """Train reference copies of the untrained ``model`` and score them like ``R``.

    Call it before the continual run trains ``model`` (the copies start from its current
    weights; ``model`` itself is not changed). See the module documentation for the budgets.

    Args:
        model: the untrained LightningModule of the continual run.
        train_dataloaders: one training loader per task, as the continual run uses them.
        test_dataloaders: one test loader per task (index = task id), as the continual run's
            [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] scores them.
        kind: ``"isolated"`` (copy ``j`` trained on task ``j`` alone), ``"joint"`` (one copy
            trained on the union of every task's training data) or ``"cumulative"`` (copy ``k``
            trained on the union of tasks ``0..k``, scored on task ``k``; Chaudhry et al.,
            2018).
        trainer_factory: ``() -> Trainer``, called once per reference model: a new Trainer with
            the continual run's training settings and ``max_epochs`` = its epochs per task
            (typically without logger or checkpoints). The scoring callback is appended to its
            callbacks; it must not hold a ContinualEvalCallback of its own.
        joint_dataloader: ``"joint"``: the loader over every task's training data; default
            `union_dataloader` of ``train_dataloaders``. ``"cumulative"``: ``T`` loaders, loader
            ``k`` over the training data of tasks ``0..k``; default `union_dataloader` of
            ``train_dataloaders[:k + 1]``.
        task_names: one name per task (default ``task_0``, ...).
        eval_every_n_steps: ``"isolated"`` only: also score copy ``j`` on task ``j`` every ``k``
            optimizer steps (an int ``k``, or a [`StepEvaluation`][continual_eval.StepEvaluation]
            with a fixed subset; the callback's per-step evaluation), returned as
            `Reference.curves` (the reference learning curves of plasticity metrics such as
            Continual World's normalised forward transfer, which compares areas under them).
        callback_kwargs: further [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback]
            arguments (``scorers``, ``metric``, ``inference_mode``, ``item_records``, ...), the
            continual run's, so the reference is scored the same way (``item_records`` recording
            the primary scorer: the reference's per-item values in `Reference.items`). Those that
            [`train_reference`][continual_eval.train_reference] sets itself (test loaders, names,
            dirpath, metadata, ``evaluate="all"``, ``verbose=False``, ``log_images=False``,
            ``eval_every_n_steps``, ``reference``, ``lca_beta``) are ignored; ``epochs_per_task`` is
            refused.
        seed: ``seed_everything(seed + j)`` before copy ``j`` (isolated, cumulative),
            ``seed_everything(seed)``
            before the joint copy; ``None``: every reference fit starts from the caller's random
            state. The caller's random state is restored afterwards in both cases.
        dirpath: where the reference runs write ``results.json``: ``dirpath/task_j`` (isolated
            and cumulative, a one-task run), ``dirpath`` (joint, one stage of a ``T``-task run);
            their metadata
            is ``{"reference_run": kind, "tasks": [names]}``. ``None``: a temporary directory,
            removed afterwards.
        copy_model: ``model -> fresh copy`` (default: ``model.reference_model()`` when defined,
            e.g. to drop a replay memory, else ``copy.deepcopy(model)``).
        model_factory: ``() -> LightningModule`` building the *unsharded* model (the same
            architecture, the state dict's keys, shapes and dtypes); each copy is
            ``model_factory()`` with the full state dict of ``model`` loaded, so every copy starts
            from ``model``'s current weights (``reference_model`` is not called). Needed when
            ``model`` is sharded (its parameters are DTensors: ``train_reference`` called after
            a fit under ``ModelParallelStrategy`` sharded it), which ``copy.deepcopy`` refuses:
            the full state dict is then gathered once to rank 0 (on the CPU) and broadcast into
            each copy; call [`train_reference`][continual_eval.train_reference] on every rank. Not
            with ``copy_model``.

    Returns:
        The [`Reference`][continual_eval.Reference] (``scores`` = ``ref`` ``[T]`` float64, ``kind``,
        curves; ``items``, the reference's per-item values of the primary matrix behind ``ref``,
        when ``callback_kwargs`` holds ``item_records`` recording it: what the continual run's
        ``item_records`` needs for the paired interval of intransigence).

    Raises:
        ValueError: an unknown ``kind``, loader counts that differ, a Trainer without an epoch
            budget, per-step curves asked of the joint kind, ``epochs_per_task`` in
            ``callback_kwargs``, a sharded ``model`` without ``model_factory`` (or one that FSDP1
            or DeepSpeed ZeRO-3 flattened), a ``model_factory`` whose model does not match
            ``model``'s state dict, both ``model_factory`` and ``copy_model``.
    """
    kind = check_reference_kind(kind)
    names = _check_reference_arguments(
        kind, train_dataloaders, test_dataloaders, task_names, eval_every_n_steps, joint_dataloader
    )
    options = _scoring_options(callback_kwargs)
    copier = _copier(model, model_factory, copy_model)  # the sharded gather: every rank, once
    with contextlib.ExitStack() as stack:
        extra = [] if joint_dataloader is None else [joint_dataloader]
        if kind == "cumulative" and joint_dataloader is not None:
            extra = list(joint_dataloader)
        loaders = [*train_dataloaders, *extra]
        rewind = stack.enter_context(_caller_rng(loader_generators(loaders)))
        root = Path(dirpath) if dirpath is not None else Path(stack.enter_context(_temporary()))
        fits = _ReferenceFits(
            model,
            test_dataloaders,
            names,
            kind=kind,
            trainer_factory=trainer_factory,
            callback_kwargs={"eval_every_n_steps": eval_every_n_steps, **options},
            copy_model=copier,
            rewind=rewind,
        )
        if kind == "joint":
            union = joint_dataloader
            if union is None:
                union = union_dataloader(train_dataloaders)
            fits.fit(list(range(len(names))), union, root, seed)
        elif kind == "cumulative":
            for k in range(len(names)):
                union = (
                    union_dataloader(train_dataloaders[: k + 1], "cumulative")
                    if joint_dataloader is None
                    else joint_dataloader[k]
                )
                fits.fit([k], union, root / f"task_{k}", None if seed is None else seed + k)
        else:
            for j, loader in enumerate(train_dataloaders):
                fits.fit([j], loader, root / f"task_{j}", None if seed is None else seed + j)
        return fits.reference(keep_dirs=dirpath is not None)


def _check_reference_arguments(
    kind: str,
    train_dataloaders: Sequence[Any],
    test_dataloaders: Sequence[Any],
    task_names: Sequence[str] | None,
    eval_every_n_steps: int | StepEvaluation | None,
    joint_dataloader: Any,
) -> list[str]:
    """The task names of a reference (default ``task_j``), after checking that the loaders and
    options fit ``kind``."""
    num_tasks = len(train_dataloaders)
    if num_tasks == 0:
        raise ValueError("train_reference needs at least one task (train_dataloaders is empty)")
    if len(test_dataloaders) != num_tasks:
        raise ValueError(
            f"train_reference: {num_tasks} train_dataloaders but {len(test_dataloaders)} "
            "test_dataloaders (one of each per task)"
        )
    names = [f"task_{j}" for j in range(num_tasks)] if task_names is None else list(task_names)
    if len(names) != num_tasks:
        raise ValueError(f"task_names has {len(names)} names for {num_tasks} tasks")
    if eval_every_n_steps is not None and kind != "isolated":
        raise ValueError(
            "eval_every_n_steps: per-step reference curves are defined for kind='isolated' "
            "(copy j's curve on task j); the joint reference has no such curve"
        )
    if joint_dataloader is not None and kind == "isolated":
        raise ValueError("joint_dataloader is for kind='joint' or kind='cumulative'")
    if joint_dataloader is not None and kind == "cumulative":
        if isinstance(joint_dataloader, (str, bytes)) or not isinstance(joint_dataloader, Sequence):
            raise ValueError(
                "kind='cumulative': joint_dataloader must be a sequence of T loaders (loader k "
                f"over the training data of tasks 0..k), got {type(joint_dataloader).__name__}"
            )
        if len(joint_dataloader) != num_tasks:
            raise ValueError(
                f"kind='cumulative': joint_dataloader has {len(joint_dataloader)} loaders for "
                f"{num_tasks} tasks (loader k over the training data of tasks 0..k)"
            )
    return names


def _scoring_options(callback_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The continual run's callback options that also score the reference (those
    [`train_reference`][continual_eval.train_reference] sets itself dropped; ``epochs_per_task``
    refused)."""
    options = dict(callback_kwargs or {})
    if options.get("epochs_per_task") is not None:
        raise ValueError(
            "callback_kwargs: epochs_per_task does not apply to a reference (one fit per model)"
        )
    for key in _SET_HERE:
        options.pop(key, None)
    return options


class _ReferenceFits:
    """The reference models of one [`train_reference`][continual_eval.train_reference] call: one
    Trainer and one scoring callback per model, every fit from the caller's random state
    (``rewind``)."""

    def __init__(
        self,
        model: LightningModule,
        test_dataloaders: Sequence[Any],
        names: Sequence[str],
        *,
        kind: str,
        trainer_factory: Callable[[], Trainer],
        callback_kwargs: Mapping[str, Any],
        copy_model: Callable[[LightningModule], LightningModule],
        rewind: Callable[[int | None], None],
    ) -> None:
        self.model, self.test_dataloaders, self.names, self.kind = (
            model,
            test_dataloaders,
            list(names),
            kind,
        )
        self.trainer_factory, self.callback_kwargs = trainer_factory, dict(callback_kwargs)
        self.copy_model, self.rewind = copy_model, rewind
        self.runs: list[tuple[ContinualEvalCallback, Trainer]] = []

    def fit(self, task_ids: list[int], train_loader: Any, run_dir: Path, seed: int | None) -> None:
        """Train a fresh copy of the model on ``train_loader``, scored on ``task_ids``."""
        budget = self.runs[0][1].max_epochs if self.runs else None
        trainer = _new_trainer(self.trainer_factory, budget)
        tasks = [self.names[j] for j in task_ids]
        callback = ContinualEvalCallback(
            [self.test_dataloaders[j] for j in task_ids],
            task_names=tasks,
            evaluate="all",
            dirpath=run_dir,
            metadata={"reference_run": self.kind, "tasks": tasks},
            verbose=False,
            log_images=False,
            **self.callback_kwargs,
        )
        _callbacks(trainer).append(callback)
        self.rewind(seed)  # a copy that re-initialises draws from the caller's state too
        fresh = self.copy_model(self.model)
        if fresh is self.model:
            raise ValueError("copy_model returned the model itself, not a copy")
        self.rewind(seed)
        trainer.fit(fresh, train_dataloaders=train_loader)
        self.runs.append((callback, trainer))

    def reference(self, *, keep_dirs: bool) -> Reference:
        """What the fits measured: the joint copy's scores on every task, or copy ``j``'s on
        task ``j`` (isolated, cumulative; with per-step evaluations, its curve)."""
        callbacks = [callback for callback, _ in self.runs]
        if self.kind == "joint":
            scores, baseline = callbacks[0].scores[0], callbacks[0].baseline
        else:
            scores = torch.stack([callback.scores[0, 0] for callback in callbacks])
            baseline = torch.stack([callback.baseline[0] for callback in callbacks])
        curves = None
        if self.callback_kwargs.get("eval_every_n_steps") is not None:
            curves = tuple(
                ReferenceCurve(step.to(torch.int64), values[:, 0].to(torch.float64))
                for step, _, values in (callback.curves() for callback in callbacks)
            )
        primary = callbacks[0].scorer
        items = _reference_items(callbacks, self.kind)
        return Reference(
            kind=self.kind,
            scores=scores.to(torch.float64).clone(),
            baseline=baseline.to(torch.float64).clone(),
            epochs=int(self.runs[0][1].max_epochs or 0),
            steps_trained=tuple(int(trainer.global_step) for _, trainer in self.runs),
            score_name=str(primary.name),
            higher_is_better=bool(primary.higher_is_better),
            task_names=tuple(self.names),
            curves=curves,
            results_dirs=tuple(
                Path(callback.results_dir)
                for callback in callbacks
                if keep_dirs and callback.results_dir is not None
            ),
            items=items,
        )


def _reference_items(
    callbacks: Sequence[ContinualEvalCallback], kind: str
) -> tuple[PackedBits | torch.Tensor, ...] | None:
    """The primary matrix's per-item values of the cells of ``ref`` when the reference runs
    recorded them (``item_records`` in ``callback_kwargs``): joint, the joint copy's items of
    every task after its stage; isolated and cumulative, copy ``j``'s items of its task ``j``
    (task 0 of its one-task run). Packed for 0/1 items."""
    sections = [None if c.record is None else c.record.sections.get("items") for c in callbacks]
    primary = callbacks[0].primary
    if any(not isinstance(s, ItemRecord) or primary not in s.binary for s in sections):
        return None
    records = [s for s in sections if isinstance(s, ItemRecord)]
    if kind == "joint":
        values = records[0].values(primary, 0)
        tasks = [values[j] for j in range(len(values))]
    else:
        tasks = [record.values(primary, 0)[0] for record in records]
    binary = records[0].binary[primary]
    return tuple(pack_bits(v) if binary else v.clone() for v in tasks)


def _temporary() -> contextlib.AbstractContextManager[str]:
    return tempfile.TemporaryDirectory(prefix="continual-eval-reference-")

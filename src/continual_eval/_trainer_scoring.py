"""The callback's evaluations under a running Trainer, in the form the run record takes them:
every task scored on this rank's shards with every scorer, counts reduced across the Trainer's
ranks (`evaluate_under_trainer`), and a
stage end measured (its cost) before anything of it is recorded."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from lightning.pytorch import LightningModule, Trainer

from continual_eval._predictions import gather_predictions, generation_scorers
from continual_eval._progress import evaluation_description, evaluation_progress
from continual_eval.evaluation import Scorer
from continual_eval.evaluation.task_loaders import TaskLoaders
from continual_eval.evaluation.trainer_evaluation import evaluate_under_trainer
from continual_eval.record import RunRecord, Scored
from continual_eval.stage_cost import StageCost, StageCostRecorder, read_replay_memory

__all__ = ["TrainerScoring"]


@dataclass(frozen=True)
class TrainerScoring:
    """The callback's scorers on its test loaders, scored under a Trainer; with ``verbose``
    every evaluation shows its progress on the Trainer's progress bar (`continual_eval._progress`)
    and rank 0 reports the batch cache; ``predictions``: the baseline and stage-end evaluations
    gather the generation scorers' first ``predictions`` items per cell
    (`continual_eval._predictions`)."""

    scorers: Mapping[str, Scorer]
    task_loaders: TaskLoaders
    inference_mode: bool
    verbose: bool = True
    predictions: int | None = None
    #: the scorers (positions) whose per-item values the evaluations keep (the baseline, the
    #: stage ends and the per-step evaluations of whole test sets)
    item_scorers: tuple[int, ...] = ()

    def score(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        record: RunRecord,
        task_ids: Sequence[int],
        *,
        stage: int,
        subset: bool = False,
        held_out: bool = False,
        stage_end: bool = False,
        predictions: bool = False,
    ) -> Scored:
        """Score ``task_ids`` (their fixed subsets with ``subset``), and with ``held_out`` the
        held-out sets (whole); ``stage`` is ``-1`` for the baseline, else the stage being
        trained (per-step evaluations) or just finished (``stage_end``); with ``predictions``
        (and ``predictions=`` set) the kept items of every rank go into the `Scored`."""
        T, H = record.num_tasks, self.task_loaders.num_held_out if held_out else 0
        description = evaluation_description(stage, stage_end=stage_end)
        with evaluation_progress(trainer, description, enabled=self.verbose) as progress:
            evaluation = evaluate_under_trainer(
                trainer,
                pl_module,
                self.task_loaders,
                [*task_ids, *range(T, T + H)],
                self.scorers,
                inference_mode=self.inference_mode,
                task_names=self.task_loaders.task_names,
                subset=subset,
                stage=stage,
                progress=progress,
                verbose=self.verbose,
                # the per-step evaluations' too, on whole test sets (a subset's are not kept)
                item_scorers=() if subset else self.item_scorers,
            )
        scored = Scored.from_evaluation(list(self.scorers), evaluation, T, H)
        if not predictions or self.predictions is None:
            return scored
        world, strategy = trainer.world_size, trainer.strategy
        items = gather_predictions(
            list(generation_scorers(self.scorers).values()),
            [*task_ids, *range(T, T + H)],
            self.task_loaders,
            self.predictions,
            all_reduce=partial(strategy.reduce, reduce_op="sum") if world > 1 else None,
            rank=trainer.global_rank,
            world_size=world,
            device=strategy.root_device,
        )
        return dataclasses.replace(scored, predictions=items)

    def stage_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        record: RunRecord,
        meter: StageCostRecorder,
        stage: int,
        tasks: Sequence[int],
    ) -> tuple[Scored, StageCost]:
        """Stage ``stage``'s rows of ``tasks`` (the callback's ``evaluate`` and
        ``eval_old_tasks_every`` choose them) and its cost: the training clock stops before the
        evaluation starts; the samples are summed over the ranks; the replay-memory hook is read
        last (it may raise). Nothing recorded."""
        train_seconds = meter.train_seconds()
        samples = meter.samples
        if trainer.world_size > 1:  # one reduce at the stage end, outside any training step
            local = torch.tensor(samples, dtype=torch.int64, device=trainer.strategy.root_device)
            samples = int(trainer.strategy.reduce(local, reduce_op="sum").item())
        start = time.perf_counter()
        scored = self.score(
            trainer,
            pl_module,
            record,
            tasks,
            stage=stage,
            held_out=True,
            stage_end=True,
            predictions=True,
        )
        cost = meter.finish_stage(
            stage,
            pl_module,
            train_seconds=train_seconds,
            eval_seconds=time.perf_counter() - start,
            samples=samples,
            optimizer_steps=trainer.global_step - meter.start_step,
            replay_memory=read_replay_memory(pl_module),
        )
        return scored, cost

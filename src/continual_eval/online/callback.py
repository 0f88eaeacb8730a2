r"""``OnlineEvalCallback``: online continual learning evaluation inside a Lightning training loop.

Attach it to a ``Trainer`` that trains over a stream (one pass, task boundaries or not) and it
scores, per window of ``window_batches`` training batches:

* **online (prequential) accuracy**: each training batch scored by the model before the optimizer
  step on it (Cai et al., ICCV 2021). Two ways, the same numbers (``prequential``):

  - ``"outputs"``: the training step's own predictions, returned as ``outputs["preds"]`` (class
    scores ``[N, C]``; the targets from ``outputs["target"]`` or the batch): no extra forward
    pass. They are eval-mode predictions only when no submodule behaves differently in training
    mode: dropout, batch norm (batch statistics), instance norm with running statistics, RReLU
    and attention with dropout make them differ (`train_mode_modules`), and so would augmentation
    inside ``training_step``;
  - ``"forward"``: one eval-mode forward of the training batch in ``on_train_batch_start``,
    before the training step and its optimizer step, through the evaluation engine's batch step,
    with every submodule's train/eval flag and the RNG states restored (the training that follows
    is unchanged);
  - ``"auto"`` (default): ``"forward"`` on the run's first batch, compared with the training
    step's outputs on it; ``"outputs"`` from then on when the module has no train-mode-dependent
    submodule and both give the same predictions (on every rank), else ``"forward"``;

* **near-future accuracy** at each of ``near_future_delays`` (batches): the model before its step
  on batch ``k`` scored on the stream's batch ``k + delay`` (Hammoud et al., ICCV 2023), read
  ahead from the training loader's dataset order or from ``stream`` (see
  `continual_eval.online.stream`): one read and one eval-mode forward per delay per batch;
* **label-delay accuracy** at each of ``label_delays``: the stream's batch ``t`` predicted by the
  model trained on the labels of batches before ``t - d`` (Csaba et al., NeurIPS 2024): the
  near-future scores at delay ``d`` plus the first ``d`` batches scored by the untrained model;
* **blind baselines** on the same samples: the most frequent of the last ``blind_window`` revealed
  labels (``mode``), the last revealed label (``last``) and the most frequent label so far
  (``prior``), each knowing exactly the labels the learner has trained on
  (`continual_eval.functional.online`);
* **held-out sets over the stream** (``held_out``): scored before training, every
  ``eval_every_n_windows`` windows, at every segment boundary (``segment_starts``) and at the end,
  through [`evaluate_tasks`][continual_eval.evaluation.evaluate_tasks]; from them the anytime
  accuracy and forgetting over time and, with segment starts, the matrix ``R`` (row ``i`` when
  segment ``i`` ends) with its metrics;
* **compute** next to every window: samples, optimizer steps, wall time, held-out evaluation
  time, the callback's own forward passes, peak memory
  (`StageCostRecorder`, one "stage" per window).

Exact under DDP: rows of every sample scored are gathered once per window and counted by stream
position (each sample once, a ``DistributedSampler``'s padding left out), so 2 processes with
batch size ``B`` give the counts of 1 process with batch size ``2B``. The global stream order is
the sampler's interleaving (`continual_eval.online.stream`).

Resumable: the record, the open window (every rank's rows, gathered into the checkpoint), the blind
predictors' state and the stream position are the callback's ``state_dict``; a run killed and
resumed from a checkpoint gives the record of an uninterrupted run when its training data resumes
where the checkpoint was written (checkpoints at epoch ends, or a resumable loader; Lightning
replays a plain loader's epoch from its start, which this callback warns about).

Files: the record is the ``online`` section of the run's ``results.json``
([`OnlineResults`][continual_eval.results.OnlineResults]), beside it ``online.png``
([`plot_online`][continual_eval.plotting.plot_online]); logged per window to every logger
(`continual_eval.online.publish`). Which ``results.json``:

* with a [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] on the same Trainer, that
  callback's (its directory and run id; this callback's ``dirpath`` must then be unset or the same):
  each write is that callback's results of the stages so far with the ``online`` section, and that
  callback's own writes keep the section (`commit_results`):
  one record of the run, whichever callback wrote last;
* alone, its own: ``dirpath``, else the first logger's directory (as ``ContinualEvalCallback``
  chooses), claimed for the run like that callback claims it (another run's ``results.json`` is
  refused unless ``overwrite=True``); the document has no tasks (``num_tasks`` 0,
  [`ContinualResults.from_online`][continual_eval.results.ContinualResults.from_online]),
  its ``metadata`` is this callback's ``metadata``.

The file is replaced atomically (a reader sees one complete document) at most every
`WRITE_INTERVAL_SECONDS` during training, at every epoch end and at the end of training.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DistributedSampler, RandomSampler

from continual_eval.callback import ContinualEvalCallback
from continual_eval.online.held_out import HeldOutSets
from continual_eval.online.plot import ONLINE_PNG, plot_online
from continual_eval.online.publish import (
    format_summary,
    held_out_scalars,
    log_final,
    log_scalars,
    window_scalars,
)
from continual_eval.online.record import (
    HeldOut,
    HeldOutEvaluation,
    OnlineProtocol,
    OnlineResults,
    OnlineWindow,
    WindowCost,
)
from continual_eval.online.scoring import (
    batch_target,
    forward_labels,
    predicted_labels,
    scoring_context,
    train_mode_modules,
)
from continual_eval.online.stream import (
    LookaheadReader,
    StreamLayout,
    readable_order,
    valid_samples,
)
from continual_eval.online.window import BlindState, WindowBuffer, score_rows
from continual_eval.results import ContinualResults
from continual_eval.results.files import (
    RESULTS_FILE,
    claim_or_refuse,
    default_results_dir,
    release_claim,
)
from continual_eval.stage_cost import StageCostRecorder, batch_samples

__all__ = ["OnlineEvalCallback"]

_STATE_VERSION = 1
_PREQUENTIAL = ("auto", "outputs", "forward")
#: a window's record is written at most this often during training (and at every epoch end and
#: at the end of training)
WRITE_INTERVAL_SECONDS = 30.0


def _delays(name: str, value: Sequence[int]) -> list[int]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"OnlineEvalCallback: {name} must be a list of integers, got {value!r}")
    out = []
    for d in value:
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise ValueError(
                f"OnlineEvalCallback: {name} must hold integers >= 1 (batches ahead), got {d!r}"
            )
        out.append(d)
    if len(set(out)) != len(out):
        raise ValueError(f"OnlineEvalCallback: {name} repeats a delay: {out}")
    return sorted(out)


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"OnlineEvalCallback: {name} must be an integer >= 1, got {value!r}")
    return value


def _distributed(trainer: Trainer) -> bool:
    return (
        trainer.world_size > 1
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
    )


def _gather_rows(trainer: Trainer, rows: Tensor, header: Tensor) -> tuple[Tensor, Tensor]:
    """Every rank's ``rows`` (concatenated in rank order) and ``header`` (``[W, 3]``): two
    collectives, on every rank."""
    if not _distributed(trainer):
        return rows, header.unsqueeze(0)
    world = torch.distributed.get_world_size()
    headers = [torch.zeros_like(header) for _ in range(world)]
    torch.distributed.all_gather(headers, header)
    sizes = [int(h[0]) for h in headers]
    padded = rows.new_zeros(max(sizes), rows.shape[1])
    padded[: rows.shape[0]] = rows
    parts = [torch.zeros_like(padded) for _ in range(world)]
    torch.distributed.all_gather(parts, padded)
    return torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)]), torch.stack(headers)


def _train_loader(trainer: Trainer) -> Any:
    loader = trainer.train_dataloader
    if isinstance(loader, (list, tuple, Mapping)):
        raise ValueError(
            "OnlineEvalCallback scores one stream: the Trainer has several training loaders "
            f"({type(loader).__name__}); train on one DataLoader"
        )
    return loader


class OnlineEvalCallback(Callback):
    r"""Online, near-future, label-delay and blind-baseline accuracy of a Lightning run over a
    stream, with held-out curves over time and the compute beside every number.

    See the module docstring for the protocols. The training batches are ``(x, y)``,
    ``(x, y, task_id)`` or anything the LightningModule's ``continual_eval_step(batch, task_id)``
    turns into ``(preds, target)`` (``task_id`` is 0 here); predictions are class scores ``[N,
    C]`` and targets class indices ``[N]`` (or one-hot rows).

    Args:
        near_future_delays: delays (in training batches) of the near-future accuracy; the delay
            must be long enough for the stream's labels to decorrelate, which the blind scores
            show (a warning says when, at the longest delay, the blind ``mode`` predictor beats
            chance, the larger of the ``prior`` predictor's score and ``1 / classes seen``, by more
            than ``blind_margin``). ``[]``: none.
        label_delays: label delays (in training batches) to score; ``[]``: none (default).
        window_batches: training batches per window (the unit of the record, the logs and the
            picture).
        blind_window: how many of the most recent labels the ``mode`` blind predictor counts.
        prequential: ``"auto"``, ``"outputs"`` or ``"forward"`` (module docstring).
        preds_key: where ``training_step``'s returned dict holds the predictions for
            ``prequential="outputs"``.
        target_key: where it holds the targets (optional: else the batch's).
        stream: an indexable dataset holding the whole stream in order (``stream[p]`` is the
            sample at stream position ``p``), to read lookahead batches from, across epochs;
            default: the training loader's own dataset order within the current epoch.
        held_out: held-out loaders scored over the stream (one per stream segment, or any sets).
        held_out_names: their names (default ``held_out_0``, ...).
        segment_starts: the stream position where each held-out set's segment starts (first 0):
            evaluations at each boundary give the matrix ``R``; ``None``: sets not tied to stream
            positions.
        eval_every_n_windows: score the held-out sets after every ``n``-th window (besides the
            start, the segment boundaries and the end); ``None``: only those.
        blind_margin: warn when the learner's online accuracy is not more than this above the
            best blind predictor's.
        dirpath: the results directory (default: the first logger's, as for
            ``ContinualEvalCallback``); with a ``ContinualEvalCallback`` on the Trainer, unset or
            that callback's (the record goes into its ``results.json``).
        metadata: free-form, JSON-serialisable ``metadata`` of the ``results.json`` this callback
            writes alone (``experiment``, ``method``, ``seed`` label the run in ``continual-eval
            report``); with a ``ContinualEvalCallback``, that callback's metadata is the file's.
        prefix: prefix of every logged key.
        overwrite: replace a ``results.json`` of another run in the directory (default: refuse).
        inference_mode: score under ``torch.inference_mode`` (else ``no_grad``; gloo always gets
            ``no_grad``, as in Lightning).
        verbose: say where the files go and which prequential path is used.
    """

    def __init__(
        self,
        *,
        near_future_delays: Sequence[int] = (10,),
        label_delays: Sequence[int] = (),
        window_batches: int = 50,
        blind_window: int = 100,
        prequential: str = "auto",
        preds_key: str = "preds",
        target_key: str = "target",
        stream: Any | None = None,
        held_out: Sequence[Any] | None = None,
        held_out_names: Sequence[str] | None = None,
        segment_starts: Sequence[int] | None = None,
        eval_every_n_windows: int | None = 1,
        blind_margin: float = 0.05,
        dirpath: str | os.PathLike[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        prefix: str = "online/",
        overwrite: bool = False,
        inference_mode: bool = True,
        verbose: bool = True,
    ) -> None:
        super().__init__()
        self.near_future_delays = _delays("near_future_delays", near_future_delays)
        self.label_delays = _delays("label_delays", label_delays)
        self.window_batches = _positive("window_batches", window_batches)
        self.blind_window = _positive("blind_window", blind_window)
        if prequential not in _PREQUENTIAL:
            raise ValueError(
                f"OnlineEvalCallback: prequential must be one of {_PREQUENTIAL}, "
                f"got {prequential!r}"
            )
        self.prequential = prequential
        self.preds_key, self.target_key = preds_key, target_key
        if stream is not None and not (
            hasattr(stream, "__getitem__") and hasattr(stream, "__len__")
        ):
            raise TypeError(
                "OnlineEvalCallback: stream must be an indexable dataset (with __getitem__ and "
                f"__len__) holding the stream in order, got {type(stream).__name__}"
            )
        self.stream = stream
        if held_out is None and (held_out_names is not None or segment_starts is not None):
            raise ValueError(
                "OnlineEvalCallback: held_out_names / segment_starts describe held_out loaders; "
                "pass held_out=[loader, ...]"
            )
        self.held_out = (
            HeldOutSets(held_out, held_out_names, segment_starts) if held_out is not None else None
        )
        self.eval_every_n_windows = (
            None
            if eval_every_n_windows is None
            else _positive("eval_every_n_windows", eval_every_n_windows)
        )
        if not isinstance(blind_margin, (int, float)) or not 0 <= blind_margin <= 1:
            raise ValueError(
                f"OnlineEvalCallback: blind_margin must be a number in [0, 1], got {blind_margin!r}"
            )
        self.blind_margin = float(blind_margin)
        self.dirpath = dirpath
        self.metadata = dict(metadata or {})
        self.prefix = prefix
        self.overwrite = overwrite
        self.inference_mode = inference_mode
        self.verbose = verbose

        self.results: OnlineResults | None = None
        self.results_dir: Path | None = None
        self.run_id: str | None = None
        self._pending: dict[str, Any] | None = None
        self._restored = False
        #: the ContinualEvalCallback whose results.json holds the online section (None: alone)
        self._owner: ContinualEvalCallback | None = None
        self._trainer: Trainer | None = None
        self.layout = StreamLayout(0, 1)
        self.reader: LookaheadReader | None = None
        self.buffer = WindowBuffer()
        self.blind = BlindState()
        self.cost = StageCostRecorder()
        self.batches = 0  # training batches of the run
        self.optimizer_steps = 0  # optimizer steps of the run (over all fits)
        self.window_first_batch = 0
        self.window_first_step = 0
        self.segments_done = 0  # held-out segments whose row of R is recorded
        self.mode = prequential  # "auto" until decided
        self._cost_progress: dict[str, Any] | None = None
        self._batch: dict[str, Any] = {}
        self._last_write = 0.0
        self._unsafe_warned = False

    @property
    def state_key(self) -> str:
        return f"OnlineEvalCallback[{self.prefix}]"

    # ------------------------------------------------------------------ setup
    def _offsets(self, first_batch: bool) -> list[int]:
        """The lookahead offsets read at a training step (the run's first step also reads the
        label-delay head)."""
        offsets = set(self.near_future_delays) | set(self.label_delays)
        if first_batch and self.label_delays:
            offsets |= set(range(1, max(self.label_delays)))
        return sorted(offsets)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._trainer = trainer
        if self._pending is not None:
            self._restore(trainer, self._pending)
            self._pending = None
        elif self.results is None:
            self.layout = StreamLayout(trainer.global_rank, trainer.world_size)
        elif (self.layout.rank, self.layout.world_size) != (
            trainer.global_rank,
            trainer.world_size,
        ):
            raise ValueError(
                f"OnlineEvalCallback: this run's stream was scored on {self.layout.world_size} "
                f"process(es); this fit has {trainer.world_size}: keep the number of processes"
            )
        if self.run_id is None:
            run_id = uuid.uuid4().hex[:12] if trainer.is_global_zero else None
            self.run_id = trainer.strategy.broadcast(run_id, src=0)
        self._claim_results_dir(trainer)

    def _find_owner(self, trainer: Trainer) -> ContinualEvalCallback | None:
        """The ``ContinualEvalCallback`` of ``trainer`` whose ``results.json`` takes the online
        section (the first one), or ``None``; refuses two online callbacks for one file and a
        ``dirpath`` of another directory."""
        callbacks = list(getattr(trainer, "callbacks", []))
        owners = [cb for cb in callbacks if isinstance(cb, ContinualEvalCallback)]
        if not owners:
            return None
        owner = owners[0]
        others = [cb for cb in callbacks if isinstance(cb, OnlineEvalCallback) and cb is not self]
        if others:
            raise ValueError(
                "OnlineEvalCallback: the Trainer holds a ContinualEvalCallback and more than one "
                "OnlineEvalCallback; the run's results.json has one online section: attach one "
                "OnlineEvalCallback"
            )
        if self.dirpath is not None and (
            owner.dirpath is None or Path(owner.dirpath).resolve() != Path(self.dirpath).resolve()
        ):
            raise ValueError(
                f"OnlineEvalCallback: dirpath={str(self.dirpath)!r}, but with a "
                "ContinualEvalCallback on the Trainer the online section goes into that "
                f"callback's results.json (dirpath={owner.dirpath!r}): leave dirpath unset"
            )
        return owner

    def _claim_results_dir(self, trainer: Trainer) -> None:
        """Alone: choose the directory (rank 0) and claim it for this run, as
        ``ContinualEvalCallback`` does; with a ``ContinualEvalCallback`` that callback owns it."""
        self._owner = self._find_owner(trainer)
        if self._owner is not None:
            return
        if trainer.is_global_zero and (self.results_dir is None or self.dirpath is not None):
            self.results_dir = default_results_dir(trainer, self.dirpath)
        assert self.run_id is not None
        claim_or_refuse(
            trainer,
            self.results_dir if trainer.is_global_zero else None,
            run_id=self.run_id,
            restored=self._restored,
            overwrite=self.overwrite,
            owner="OnlineEvalCallback",
        )
        if trainer.is_global_zero and self.verbose and self.results_dir is not None:
            rank_zero_info(
                f"[continual-eval] online evaluation goes to {self.results_dir / RESULTS_FILE}"
            )

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loader = _train_loader(trainer)
        batch_size = getattr(loader, "batch_size", None)
        sampler = getattr(loader, "sampler", None)
        if isinstance(sampler, DistributedSampler) and sampler.shuffle:
            raise ValueError(
                "OnlineEvalCallback: the training loader's DistributedSampler shuffles the stream "
                "(shuffle=True), so the order the stream is trained in is a random permutation. "
                "Lightning puts a shuffling DistributedSampler into every training loader under "
                "DDP, whatever the loader's own sampler: pass Trainer(use_distributed_sampler="
                "False) and DataLoader(dataset, sampler=DistributedSampler(dataset, "
                "shuffle=False)) built in train_dataloader()"
            )
        lookahead = bool(self.near_future_delays or self.label_delays)
        if lookahead:
            if not isinstance(batch_size, int) or batch_size < 1:
                raise ValueError(
                    "OnlineEvalCallback: near-future and label-delay scoring read the stream a "
                    "fixed number of batches ahead, which needs a training loader with a "
                    "batch_size (not a custom batch_sampler)"
                )
            problem = readable_order(loader) if self.stream is None else None
            if isinstance(sampler, RandomSampler) and self.stream is not None:
                problem = (
                    "the training loader shuffles (a RandomSampler) while stream= holds the stream "
                    "in order: the batches read ahead would not be the ones trained next"
                )
            if problem is not None:
                raise ValueError(
                    f"OnlineEvalCallback: cannot read the stream ahead: {problem}. Pass the "
                    "stream in order as stream=..., or set near_future_delays=[] and "
                    "label_delays=[]"
                )
            if self.reader is None or self.reader.batch_size != batch_size:
                self.reader = LookaheadReader(self.stream, batch_size)
        protocol = OnlineProtocol(
            world_size=trainer.world_size,
            batch_size=int(batch_size or 0),
            global_batch_size=int(batch_size or 0) * trainer.world_size,
            window_batches=self.window_batches,
            near_future_delays=self.near_future_delays,
            label_delays=self.label_delays,
            blind_window=self.blind_window,
            prequential="forward" if self.mode == "auto" else self.mode,  # type: ignore[arg-type]
            stream_source=self.reader.source if self.reader is not None else "none",  # type: ignore[arg-type]
        )
        if self.results is None:
            held = self.held_out
            self.results = OnlineResults(
                protocol,
                held_out=None
                if held is None
                else HeldOut(
                    names=held.names,
                    segment_starts=held.segment_starts,
                    scorer="accuracy",
                    evaluations=[],
                ),
            )
        else:
            self._check_protocol(protocol)
        if self.held_out is not None:
            self.held_out.shard(trainer)
        if self.layout.local and not self._resumable(loader):
            warnings.warn(
                "OnlineEvalCallback: resuming in the middle of an epoch with a training loader "
                "that is not resumable (no state_dict/load_state_dict): Lightning replays the "
                "epoch from its first batch, so the record continues at stream position "
                f"{self.layout.batch_start()} with batches from the epoch's start and will not "
                "equal an uninterrupted run. Checkpoint at epoch ends, or use a resumable loader",
                stacklevel=2,
            )
        self.cost.start_stage(trainer.strategy.root_device)
        if self._cost_progress is not None:
            self.cost.resume_stage(
                self._cost_progress, stage=len(self.results.windows), step=self.optimizer_steps
            )
            self._cost_progress = None
        recorded = self.results.held_out
        untrained = self.batches == 0 and recorded is not None and not recorded.evaluations
        if self.held_out is not None and untrained:  # the model before any training
            self._evaluate_held_out(trainer, pl_module, segments=[])

    @staticmethod
    def _resumable(loader: Any) -> bool:
        return callable(getattr(loader, "state_dict", None)) and callable(
            getattr(loader, "load_state_dict", None)
        )

    def _check_protocol(self, protocol: OnlineProtocol) -> None:
        assert self.results is not None
        recorded = self.results.protocol
        held = self.results.held_out
        names = None if held is None else (held.names, held.segment_starts)
        given = (
            None if self.held_out is None else (self.held_out.names, self.held_out.segment_starts)
        )
        if names != given:
            raise ValueError(
                f"OnlineEvalCallback: this run's held-out sets were {names}; this fit has {given}. "
                "A stream keeps its held-out sets"
            )
        fields = ("world_size", "batch_size", "window_batches", "blind_window", "stream_source")
        for name in fields:
            if getattr(recorded, name) != getattr(protocol, name):
                raise ValueError(
                    f"OnlineEvalCallback: this run was scored with {name} = "
                    f"{getattr(recorded, name)!r}; this fit has {getattr(protocol, name)!r}. A "
                    "stream keeps one protocol"
                )

    # ------------------------------------------------------------------ per batch
    def _begin_epoch(self, trainer: Trainer, loader: Any) -> None:
        layout = self.layout
        if layout.epoch != trainer.current_epoch:
            if layout.epoch is not None:
                layout.end_epoch()
            layout.epoch = trainer.current_epoch
            layout.epoch_limit = valid_samples(loader)
            if self.reader is not None:
                self.reader.begin_epoch(loader)
        elif self.reader is not None and not self.reader.ready():
            self.reader.begin_epoch(loader)  # resumed inside this epoch

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.layout.epoch != trainer.current_epoch or (
            self.reader is not None and not self.reader.ready()
        ):
            self._begin_epoch(trainer, _train_loader(trainer))
        layout = self.layout
        n = batch_samples(batch)
        if n is None:
            raise ValueError(
                f"OnlineEvalCallback: training batch {self.batches} holds no tensor with a "
                "batch dimension; cannot place it in the stream"
            )
        if self.reader is not None and n > self.reader.batch_size:
            raise ValueError(
                f"OnlineEvalCallback: training batch {self.batches} has {n} samples, more than "
                f"the loader's batch_size {self.reader.batch_size}"
            )
        start = layout.batch_start()
        if self.held_out is not None and start >= self.held_out.next_boundary(self.segments_done):
            ended = self.held_out.ended_segments(start, self.segments_done)
            self._evaluate_held_out(trainer, pl_module, segments=ended)
        self._batch = {
            "n": n,
            "first": layout.first_position(layout.local),
            "valid": layout.valid_count(layout.local, n),
            "start": start,
            "step": self.buffer.steps,
            "global_step": int(trainer.global_step),
        }
        forward = self.mode in ("forward", "auto")
        offsets = self._offsets(first_batch=self.batches == 0)
        if self.mode == "auto":
            self._batch["unsafe"] = train_mode_modules(pl_module)
        if not (forward or offsets):
            return
        with scoring_context(trainer, pl_module, inference_mode=self.inference_mode):
            if forward:
                pred, top, target, classes = forward_labels(
                    trainer,
                    pl_module,
                    batch,
                    where=f"OnlineEvalCallback, training batch {self.batches}",
                    on_device=True,
                )
                self._batch["forward"] = pred
                self._add(0, pred, top, target, classes, self._batch["first"], self._batch["valid"])
                self.buffer.forwards += 1
            for m in offsets:
                self._score_ahead(trainer, pl_module, m)

    def _add(
        self,
        offset: int,
        pred: Tensor,
        top: Tensor | None,
        target: Tensor,
        classes: int,
        first: int,
        n: int,
    ) -> None:
        if n < pred.shape[0]:  # the padding a DistributedSampler adds: never scored
            pred, target = pred[:n], target[:n]
            top = None if top is None else top[:n]
        self.buffer.add(
            self._batch["step"],
            offset,
            pred,
            top,
            target,
            first=first,
            stride=self.layout.world_size,
            cutoff=self._batch["start"],
            classes=classes,
        )

    def _score_ahead(self, trainer: Trainer, pl_module: LightningModule, m: int) -> None:
        """Score this rank's share of the batch ``m`` ahead (inside the scoring context)."""
        assert self.reader is not None
        read = self.reader.read(self.layout, m)
        if read is None:
            return
        batch, first, n = read
        pred, top, target, classes = forward_labels(
            trainer,
            pl_module,
            batch,
            where=f"OnlineEvalCallback, the batch {m} ahead of training batch {self.batches}",
            on_device=False,
        )
        self._add(m, pred, top, target, classes, first, n)
        self.buffer.forwards += 1

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        info = self._batch
        if self.mode == "outputs":
            pred, top, target, classes = self._from_outputs(outputs, batch)
            self._add(0, pred, top, target, classes, info["first"], info["valid"])
        elif self.mode == "auto":
            self._decide(trainer, pl_module, outputs, batch)
        self.layout.advance(info["n"])
        self.buffer.samples += info["n"]
        self.buffer.steps += 1
        self.batches += 1
        self.optimizer_steps += int(trainer.global_step) - info["global_step"]
        self._batch = {}
        if self.buffer.steps >= self.window_batches:
            self._close_window(trainer, pl_module)

    def _from_outputs(self, outputs: Any, batch: Any) -> tuple[Tensor, Tensor | None, Tensor, int]:
        where = f"OnlineEvalCallback, training batch {self.batches}"
        if not isinstance(outputs, Mapping) or self.preds_key not in outputs:
            raise ValueError(
                f"{where}: prequential='outputs' scores the training step's own predictions, but "
                f"training_step returned {type(outputs).__name__}"
                + (f" without {self.preds_key!r}" if isinstance(outputs, Mapping) else "")
                + f"; return {{'loss': loss, {self.preds_key!r}: logits.detach()}}, or use "
                "prequential='forward'"
            )
        target = outputs.get(self.target_key)
        if target is None:
            target = batch_target(batch, where)
        return predicted_labels(outputs[self.preds_key], target, where)

    def _decide(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any
    ) -> None:
        """``prequential="auto"``: reuse the training step's outputs from now on when that is
        safe and they agree with the eval-mode forward on this batch, on every rank."""
        info = self._batch
        reason = None
        if info["unsafe"]:
            shown = ", ".join(info["unsafe"][:5]) + (", ..." if len(info["unsafe"]) > 5 else "")
            reason = f"submodules behave differently in training mode ({shown})"
        elif not isinstance(outputs, Mapping) or self.preds_key not in outputs:
            reason = f"training_step does not return {self.preds_key!r}"
        else:
            try:
                pred, _, _, _ = self._from_outputs(outputs, batch)
            except (TypeError, ValueError) as err:
                reason = f"its outputs cannot be scored ({err})"
            else:
                if not torch.equal(pred.to(info["forward"].device), info["forward"]):
                    reason = "its predictions differ from an eval-mode forward on the first batch"
        agree = torch.tensor(int(reason is None), device=trainer.strategy.root_device)
        if trainer.world_size > 1:
            agree = trainer.strategy.reduce(agree, reduce_op="min")
        self.mode = "outputs" if int(agree) == 1 else "forward"
        if reason is None and self.mode == "forward":
            reason = "another rank's outputs cannot be reused"
        assert self.results is not None
        self.results.protocol = msgspec.structs.replace(
            self.results.protocol, prequential=self.mode
        )
        if self.verbose:
            rank_zero_info(
                "[continual-eval] online accuracy: "
                + (
                    "reusing the training step's predictions (no extra forward pass)"
                    if self.mode == "outputs"
                    else f"one eval-mode forward per training batch: {reason}"
                )
            )

    # ------------------------------------------------------------------ windows
    def _close_window(
        self, trainer: Trainer, pl_module: LightningModule, *, final: bool = False
    ) -> None:
        assert self.results is not None
        device = trainer.strategy.root_device
        buffer = self.buffer
        rows = buffer.rows(device)
        header = torch.tensor(
            [rows.shape[0], buffer.samples, buffer.forwards], dtype=torch.int64, device=device
        )
        rows, headers = _gather_rows(trainer, rows, header)
        index = len(self.results.windows)
        start = self.results.windows[-1].stream_end if self.results.windows else 0
        try:
            scores, self.blind, end = self._score(rows, index, start)
        except ValueError:
            if trainer.is_global_zero:
                self._write()  # what was recorded before this window stays
            raise
        train_seconds = self.cost.train_seconds()
        eval_seconds = 0.0
        n = self.eval_every_n_windows
        if self.held_out is not None and (final or (n is not None and (index + 1) % n == 0)):
            eval_seconds = self._evaluate_held_out(
                trainer,
                pl_module,
                segments=self._final_segments(end) if final else [],
                window=index,
            )
        totals = headers.sum(dim=0).tolist()
        stage = self.cost.finish_stage(
            index,
            pl_module,
            train_seconds=train_seconds,
            eval_seconds=eval_seconds,
            samples=int(totals[1]),
            optimizer_steps=self.optimizer_steps - self.window_first_step,
            replay_memory=None,
        )
        window = OnlineWindow(
            index=index,
            first_batch=self.window_first_batch,
            last_batch=self.batches - 1,
            stream_start=start,
            stream_end=end,
            global_step=self.optimizer_steps,
            classes_seen=int((self.blind.counts > 0).sum()),
            scores=scores,
            cost=WindowCost(
                samples=stage.samples,
                optimizer_steps=stage.optimizer_steps,
                train_seconds=stage.train_seconds,
                eval_seconds=stage.eval_seconds,
                scoring_forwards=int(totals[2]),
                peak_memory_bytes=stage.peak_memory_bytes,
                memory_kind=stage.memory_kind,
                parameters=stage.parameters,
                trainable_parameters=stage.trainable_parameters,
            ),
        )
        self.results.windows.append(window)
        self.buffer = WindowBuffer()
        self.window_first_batch = self.batches
        self.window_first_step = self.optimizer_steps
        if trainer.is_global_zero:
            scalars = window_scalars(self.results, index, self.prefix)
            if eval_seconds:
                scalars.update(held_out_scalars(self.results, self.prefix))
            log_scalars(trainer.loggers, scalars, int(trainer.global_step))
            if time.monotonic() - self._last_write >= WRITE_INTERVAL_SECONDS:
                self._write()
        if not final:
            self.cost.start_stage(device)

    def _score(self, rows: Tensor, index: int, start: int) -> Any:
        return score_rows(
            rows,
            window_start=start,
            steps=self.buffer.steps,
            head=self.window_first_batch == 0,
            near_future_delays=self.near_future_delays,
            label_delays=self.label_delays,
            blind_window=self.blind_window,
            blind=self.blind,
            where=f"OnlineEvalCallback, window {index} (training batches "
            f"{self.window_first_batch}..{self.batches - 1})",
        )

    def _final_segments(self, position: int) -> list[int]:
        """The segments that end with the stream: every one not yet ended that the stream
        entered."""
        assert self.held_out is not None
        starts = self.held_out.segment_starts
        if starts is None:
            return []
        return [j for j in range(self.segments_done, len(starts)) if starts[j] < position]

    def _evaluate_held_out(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        *,
        segments: list[int],
        window: int | None = None,
    ) -> float:
        """Score every held-out set now (or mark the evaluation just made, at this same point, as
        ending ``segments``); returns its wall seconds."""
        assert self.held_out is not None and self.results is not None
        held = self.results.held_out
        assert held is not None
        position = self.layout.offset + self.layout.consumed()
        last = held.evaluations[-1] if held.evaluations else None
        if last is not None and last.batches == self.batches:
            held.evaluations[-1] = msgspec.structs.replace(
                last, segments_ended=sorted({*last.segments_ended, *segments})
            )
            seconds = 0.0
        else:
            scores, seconds = self.held_out.evaluate(
                trainer, pl_module, inference_mode=self.inference_mode
            )
            held.evaluations.append(
                HeldOutEvaluation(
                    stream_position=position,
                    batches=self.batches,
                    optimizer_steps=self.optimizer_steps,
                    window=len(self.results.windows) - 1 if window is None else window,
                    segments_ended=segments,
                    scores=list[float | None](scores),
                    seconds=seconds,
                )
            )
            if trainer.is_global_zero and window is None:
                log_scalars(
                    trainer.loggers,
                    held_out_scalars(self.results, self.prefix),
                    int(trainer.global_step),
                )
        if segments:
            self.segments_done = max(segments) + 1
        return seconds

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.layout.epoch is not None:
            self.layout.end_epoch()
        if trainer.is_global_zero and self.results is not None:
            self._write()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.results is None:
            return
        if self.buffer.steps:
            self._close_window(trainer, pl_module, final=True)
        elif self.held_out is not None:
            position = self.results.windows[-1].stream_end if self.results.windows else 0
            segments = self._final_segments(position)
            held = self.results.held_out
            assert held is not None
            if not held.evaluations or held.evaluations[-1].batches != self.batches or segments:
                seconds = self._evaluate_held_out(trainer, pl_module, segments=segments)
                if self.results.windows and seconds:
                    last = self.results.windows[-1]
                    cost = msgspec.structs.replace(
                        last.cost, eval_seconds=last.cost.eval_seconds + seconds
                    )
                    self.results.windows[-1] = msgspec.structs.replace(last, cost=cost)
        if self.layout.epoch is not None:
            self.layout.end_epoch()
        if trainer.is_global_zero:
            self._publish(trainer)

    def continual_results(self) -> ContinualResults:
        """The run's results with the online record so far as their ``online`` section: those of
        the ``ContinualEvalCallback`` on the Trainer, else an online run's
        ([`ContinualResults.from_online`][continual_eval.results.ContinualResults.from_online],
        with ``metadata``)."""
        if self.results is None:
            raise RuntimeError("OnlineEvalCallback has no results yet: no fit has started")
        if self._owner is not None and self._owner.record is not None:
            return dataclasses.replace(self._owner.continual_results(), online=self.results)
        return ContinualResults.from_online(
            self.results, metadata=self.metadata, run_id=self.run_id
        )

    @property
    def files_dir(self) -> Path | None:
        """The directory of the ``results.json`` holding the online section (and of
        ``online.png``): the ``ContinualEvalCallback``'s, else ``results_dir`` (rank 0)."""
        if self._owner is not None:
            return self._owner.results_dir
        return self.results_dir

    def _write(self) -> None:
        """Write the run's ``results.json`` with the online section (rank 0), atomically."""
        directory = self.files_dir
        if directory is None or self.results is None:
            return
        if self._owner is not None:  # its background write of the same file first
            self._owner._directory.wait()
        self.continual_results().write(directory)
        self._last_write = time.monotonic()

    def _publish(self, trainer: Trainer) -> None:
        assert self.results is not None
        self._write()
        directory = self.files_dir
        if self._owner is None and self.results_dir is not None and self.run_id is not None:
            release_claim(self.results_dir, self.run_id)  # a later fit of this run claims again
        figure = None
        if self.results.windows:
            try:
                figure = plot_online(
                    self.results, None if directory is None else directory / ONLINE_PNG
                )
            except ModuleNotFoundError as err:
                warnings.warn(f"OnlineEvalCallback: no picture ({err})", stacklevel=2)
        try:
            log_final(trainer.loggers, self.results, int(trainer.global_step), self.prefix, figure)
        finally:
            if figure is not None:
                import matplotlib.pyplot as plt

                plt.close(figure)
        if self.verbose and self.results.windows:
            rank_zero_info("[continual-eval] online evaluation:\n" + format_summary(self.results))
        self._warn_blind()

    def _warn_blind(self) -> None:
        assert self.results is not None
        summary = self.results.summary()["scores"]
        online = summary["online"]
        best = max((v for v in online["blind"].values() if v is not None), default=None)
        learner = online["accuracy"]
        if learner is not None and best is not None and learner - best <= self.blind_margin:
            warnings.warn(
                f"OnlineEvalCallback: the online accuracy {learner:.4f} is not more than "
                f"{self.blind_margin} above a blind predictor's {best:.4f}, which never sees the "
                "input: the stream's label correlation explains it. Read the near-future "
                "accuracy and the held-out curves instead",
                stacklevel=2,
            )
        if self.near_future_delays and self.results.windows:
            key = f"near_future/{self.near_future_delays[-1]}"
            recent, prior = summary[key]["blind"]["mode"], summary[key]["blind"]["prior"]
            # chance: the label frequencies' own predictor, or 1 / classes for balanced labels
            chance = max(prior or 0.0, 1 / max(1, self.results.windows[-1].classes_seen))
            if recent is not None and recent - chance > self.blind_margin:
                warnings.warn(
                    f"OnlineEvalCallback: at the longest near-future delay "
                    f"({self.near_future_delays[-1]} batches) the recent-label predictor still "
                    f"scores {recent:.4f} against a chance level of {chance:.4f}: the labels are "
                    "still correlated that far ahead; raise near_future_delays",
                    stacklevel=2,
                )

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        if self._pending is not None:
            return dict(self._pending)
        if self.results is None:
            return {}
        trainer = self._trainer
        buffer = self.buffer
        if trainer is not None and trainer.state.status == TrainerStatus.RUNNING:
            device = trainer.strategy.root_device
            rows = buffer.rows(device)
            header = torch.tensor(
                [rows.shape[0], buffer.samples, buffer.forwards], dtype=torch.int64, device=device
            )
            rows, headers = _gather_rows(trainer, rows, header)
            totals = headers.sum(dim=0).tolist()
        else:
            rows = buffer.rows(torch.device("cpu"))
            totals = [rows.shape[0], buffer.samples, buffer.forwards]
        return {
            "version": _STATE_VERSION,
            "run_id": self.run_id,
            "results_dir": None if self.results_dir is None else str(self.results_dir),
            "world_size": self.layout.world_size,
            "record": self.results.to_dict(summary=False),
            "layout": self.layout.state_dict(),
            "buffer": {
                "rows": rows.cpu(),
                "samples": int(totals[1]),
                "forwards": int(totals[2]),
                "steps": buffer.steps,
            },
            "blind": self.blind.state_dict(),
            "counters": {
                "batches": self.batches,
                "optimizer_steps": self.optimizer_steps,
                "window_first_batch": self.window_first_batch,
                "window_first_step": self.window_first_step,
                "segments_done": self.segments_done,
                "mode": self.mode,
            },
            "cost_progress": self.cost.progress(len(self.results.windows)),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if state_dict.get("version") != _STATE_VERSION:
            raise ValueError(
                f"OnlineEvalCallback state has version {state_dict.get('version')!r}; expected "
                f"{_STATE_VERSION}"
            )
        self._pending = dict(state_dict)

    def _restore(self, trainer: Trainer, state: dict[str, Any]) -> None:
        """Apply a checkpoint's state (the state stays pending, not lost, when this raises)."""
        if state["world_size"] != trainer.world_size:
            raise ValueError(
                f"OnlineEvalCallback: the checkpoint scored the stream on {state['world_size']} "
                f"process(es); this run has {trainer.world_size}. Resume with the same number of "
                "processes (the stream's global batches depend on it)"
            )
        self.results = OnlineResults.from_dict(state["record"], source="the checkpoint's state")
        self.run_id = state["run_id"]
        self._restored = True
        self.results_dir = None if state["results_dir"] is None else Path(state["results_dir"])
        self.layout = StreamLayout(trainer.global_rank, trainer.world_size)
        self.layout.load_state_dict(state["layout"])
        buffer = state["buffer"]
        self.buffer = WindowBuffer(steps=int(buffer["steps"]))
        if trainer.is_global_zero:  # the merged rows and sums live on rank 0; the others add 0
            self.buffer.merged = buffer["rows"].to(torch.int64)
            self.buffer.samples, self.buffer.forwards = buffer["samples"], buffer["forwards"]
        self.blind = BlindState.from_state(state["blind"])
        counters = state["counters"]
        self.batches = int(counters["batches"])
        self.optimizer_steps = int(counters["optimizer_steps"])
        self.window_first_batch = int(counters["window_first_batch"])
        self.window_first_step = int(counters["window_first_step"])
        self.segments_done = int(counters["segments_done"])
        self.mode = counters["mode"]
        self._cost_progress = state["cost_progress"]

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.results is not None and not self.results.windows and trainer.is_global_zero:
            warnings.warn("OnlineEvalCallback scored no training batch", stacklevel=2)

    def accuracy(self, score: str = "online", blind: str | None = None) -> float | None:
        """The score over the stream so far (``None`` before anything was scored)."""
        return None if self.results is None else self.results.accuracy(score, blind)

    def __repr__(self) -> str:
        return (
            f"OnlineEvalCallback(near_future_delays={self.near_future_delays}, "
            f"label_delays={self.label_delays}, window_batches={self.window_batches}, "
            f"prequential={self.mode!r})"
        )

r"""What each training stage cost: wall time of training and of the evaluation, peak memory,
parameters, samples and optimizer steps trained, and the replay memory a method reports.

The callback owns one `StageCostRecorder`, the meter of the stage in progress; it reads
clocks only at stage boundaries and around its own evaluation (never inside a training step: no
device sync is added there), and counts samples from the batches' host-side shapes. The costs of
finished stages belong to the run record (`RunRecord`).

Per stage ``i`` (one `StageCost`):

* ``train_seconds``: wall time from the stage's start (``on_train_start`` of its fit, or the
  ``on_train_epoch_start`` of its first epoch under ``epochs_per_task``) to its end, before the
  end-of-stage evaluation (on a GPU the clock is read after one ``torch.cuda.synchronize()`` at
  the stage end, outside any step); it includes what runs inside the stage (validation loops,
  per-step evaluations of ``eval_every_n_steps``); a stage resumed from a checkpoint written
  inside it (``trainer.fit(ckpt_path=...)``) adds the time it had trained when the checkpoint was
  written to the time since the resume.
* ``eval_seconds``: wall time of the end-of-stage evaluation (the forward passes, the reduction
  across ranks, the checks of its rows; the files and logs written after it are not counted),
  measured on each rank (``results.json`` holds rank 0's).
* ``peak_memory_bytes``: ``torch.cuda.max_memory_allocated`` over the stage on a CUDA device
  (reset at the stage start), else the process's peak resident set size so far
  (``ru_maxrss``; it never decreases), named by ``memory_kind``.
* ``parameters`` / ``trainable_parameters``: element counts of ``pl_module.parameters()`` as the
  model was built: a sharded parameter counts its global size (FSDP2/tensor-parallel DTensors,
  DeepSpeed ZeRO-3's ``ds_numel``); under FSDP1 they are not read (0, with a warning).
* ``samples`` / ``optimizer_steps``: trained in the stage (samples summed over ranks, the
  padding a ``DistributedSampler`` adds included; the leading dimension of the first tensor of
  each batch; optimizer steps are the increments of ``trainer.global_step``). A stage resumed
  from a checkpoint written inside it counts what it had trained before the checkpoint too, as an
  uninterrupted stage would (under DDP every rank takes rank 0's count from the checkpoint: exact
  when the ranks train equally many samples, as with Lightning's ``DistributedSampler``).
* ``replay_memory``: ``pl_module.continual_eval_memory_size()`` when the module defines it (the
  number of stored samples of a replay method), else ``None``.

Model-size efficiency (Diaz-Rodriguez et al., 2018) over the stages:
`MS = \min\left(1, \frac{1}{s}\sum_i \frac{|\theta_1|}{|\theta_i|}\right)`, see
`model_size_efficiency`.
"""

from __future__ import annotations

import dataclasses
import numbers
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from continual_eval._run_warnings import ONCE_PER_RUN

__all__ = [
    "MEMORY_HOOK",
    "StageCost",
    "StageCostRecorder",
    "batch_samples",
    "memory_kind",
    "model_size_efficiency",
    "read_replay_memory",
    "summarize_costs",
]

#: the LightningModule method a replay method defines to report its memory size (samples)
MEMORY_HOOK = "continual_eval_memory_size"


@dataclasses.dataclass(frozen=True)
class StageCost:
    """The cost of one training stage (see the module docstring for each field)."""

    stage: int
    train_seconds: float
    eval_seconds: float
    peak_memory_bytes: int
    memory_kind: str
    parameters: int
    trainable_parameters: int
    samples: int
    optimizer_steps: int
    replay_memory: int | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageCost:
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = fields - set(data)
        if missing:
            raise ValueError(f"stage cost lacks {sorted(missing)}")
        return cls(**{name: data[name] for name in fields})


def batch_samples(batch: Any) -> int | None:
    """The leading dimension of the first tensor in ``batch`` (tuples, lists and dicts searched
    depth first), or ``None`` when it holds no tensor with a dimension. Host-side: no sync."""
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.ndim else None
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            found = batch_samples(item)
            if found is not None:
                return found
    return None


def model_size_efficiency(parameters: Sequence[int] | Tensor) -> float | None:
    r"""`MS = \min(1, \frac{1}{s}\sum_{i=1}^{s} |\theta_1| / |\theta_i|)` over the
    parameter counts of stages ``1..s`` (Diaz-Rodriguez et al., "Don't forget, there is more
    than forgetting", 2018); 1 for a model that never grows, ``None`` with no stage.

    >>> model_size_efficiency([100, 100, 200])
    0.8333333333333334
    """
    counts = torch.as_tensor(parameters, dtype=torch.float64)
    if counts.numel() == 0:
        return None
    if bool((counts <= 0).any()):
        raise ValueError(f"parameter counts must be positive, got {counts.tolist()}")
    return float(torch.clamp((counts[0] / counts).mean(), max=1.0))


_SUMMARY_KEYS = (
    "train_seconds",
    "eval_seconds",
    "samples",
    "optimizer_steps",
    "peak_memory_bytes",
    "model_size_efficiency",
)


def summarize_costs(costs: Sequence[StageCost]) -> dict[str, Any]:
    """Totals over ``costs`` (``train_seconds``, ``eval_seconds``, ``samples``,
    ``optimizer_steps``), the largest ``peak_memory_bytes`` and the `model_size_efficiency`
    of their parameter counts (every value ``None`` without a stage). The efficiency is ``None``
    unless ``costs`` are the stages ``0, 1, ..., s-1`` in order (its first count is stage 0's),
    and for a model without parameters at some stage (a non-parametric learner keeping its state
    in buffers: MS is undefined)."""
    if not costs:  # nothing measured: absent, never 0
        return dict.fromkeys(_SUMMARY_KEYS)
    stages = [c.stage for c in costs]
    complete = stages == list(range(len(stages))) and all(c.parameters > 0 for c in costs)
    return {
        "train_seconds": sum(c.train_seconds for c in costs),
        "eval_seconds": sum(c.eval_seconds for c in costs),
        "samples": sum(c.samples for c in costs),
        "optimizer_steps": sum(c.optimizer_steps for c in costs),
        "peak_memory_bytes": max((c.peak_memory_bytes for c in costs), default=0),
        "model_size_efficiency": (
            model_size_efficiency([c.parameters for c in costs]) if complete else None
        ),
    }


def memory_kind(costs: Sequence[StageCost]) -> str | None:
    """What the stages' ``peak_memory_bytes`` measure: their common ``memory_kind``, ``"mixed"``
    when they differ (a run resumed on another device), ``None`` without a stage."""
    kinds = {c.memory_kind for c in costs}
    if not kinds:
        return None
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _peak_rss_bytes() -> int:
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


def _parameter_counts(module: nn.Module, *, warn: bool = True) -> tuple[int, int]:
    """``(all, trainable)`` parameter counts of the model as built, sharded or not
    (`parameter_counts`); ``(0, 0)`` under FSDP1 (its
    flattened shards do not tell them; model-size efficiency is then ``None``), with a warning
    when ``warn``."""
    from continual_eval.evaluation.strategy import parameter_counts

    counts = parameter_counts(module)
    if counts is None:
        if not warn:
            return 0, 0
        warnings.warn(
            "continual-eval: the parameter counts of a model under FSDP1 (FSDPStrategy) are not "
            "read (its flattened shards do not tell them); the stage costs record 0 parameters "
            "and no model-size efficiency. ModelParallelStrategy (FSDP2) parameters are counted"
            + ONCE_PER_RUN,
            stacklevel=3,
        )
        return 0, 0
    return counts


class _Unread:
    """Marks an argument not given (``None`` is a value: no replay memory)."""


_UNREAD = _Unread()


def read_replay_memory(module: nn.Module) -> int | None:
    """``module.continual_eval_memory_size()`` (an int >= 0), ``None`` when the module does not
    define the hook; a clear error for anything else."""
    return _replay_memory(module)


def _replay_memory(module: nn.Module) -> int | None:
    hook = getattr(module, MEMORY_HOOK, None)
    if hook is None:
        return None
    if not callable(hook):
        raise TypeError(f"{type(module).__name__}.{MEMORY_HOOK} must be a method returning an int")
    size = hook()
    if isinstance(size, Tensor) and size.numel() == 1:
        size = size.item()
    # any integer type (a NumPy integer too), not a bool
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
        raise ValueError(
            f"{type(module).__name__}.{MEMORY_HOOK}() returned {size!r}; it must return the "
            "number of stored samples, an int >= 0"
        )
    return int(size)


class StageCostRecorder:
    """Clocks and counters of the stage in progress; `finish_stage` gives its
    `StageCost`."""

    def __init__(self) -> None:
        #: ``trainer.global_step`` when the stage in progress started (its optimizer steps are
        #: counted from there)
        self.start_step = 0
        self._start: float | None = None
        self._samples = 0
        self._device: torch.device | None = None
        self._counts_warned = False  # the FSDP1 parameter-count warning: once per run

    def start_stage(self, device: torch.device, step: int = 0) -> None:
        """A stage's training starts (or resumes) now on ``device``, at optimizer step ``step``."""
        self.start_step = step
        self._device = device
        self._samples = 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self._start = time.perf_counter()

    def add_batch(self, batch: Any) -> None:
        """One training batch was consumed (host-side shape read; no device sync)."""
        found = batch_samples(batch)
        if found is not None:
            self._samples += found

    def train_seconds(self) -> float:
        """Wall time of the current stage's training so far (syncs the CUDA device once)."""
        if self._start is None:
            return 0.0
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        return time.perf_counter() - self._start

    @property
    def samples(self) -> int:
        """Samples trained on this rank in the current stage."""
        return self._samples

    def progress(self, stage: int) -> dict[str, Any] | None:
        """The counters of stage ``stage``, in progress, for a checkpoint written inside it: its
        index, ``start_step``, ``samples`` (this rank's) and ``train_seconds`` (no device sync);
        ``None`` between stages."""
        if self._start is None:
            return None
        return {
            "stage": stage,
            "start_step": self.start_step,
            "samples": self._samples,
            "train_seconds": time.perf_counter() - self._start,
        }

    def resume_stage(self, progress: Mapping[str, Any], *, stage: int, step: int) -> bool:
        """Continue stage ``stage``, just started (`start_stage`) at optimizer step
        ``step``, from a checkpoint's `progress` written inside it: its start step,
        samples and training time count too. ``False`` (nothing changes) when the progress is of
        another stage or of a later step (the fit did not resume that stage's training)."""
        if int(progress["stage"]) != stage or int(progress["start_step"]) > step:
            return False
        self.start_step = int(progress["start_step"])
        self._samples += int(progress["samples"])
        if self._start is not None:
            self._start -= max(0.0, float(progress["train_seconds"]))
        return True

    def finish_stage(
        self,
        stage: int,
        module: nn.Module,
        *,
        train_seconds: float,
        eval_seconds: float,
        samples: int,
        optimizer_steps: int,
        replay_memory: int | _Unread | None = _UNREAD,
    ) -> StageCost:
        """The cost of stage ``stage``, which ends now (the clock stops). ``replay_memory``: read
        from ``module``'s hook unless given (`read_replay_memory`)."""
        if isinstance(replay_memory, _Unread):
            replay_memory = read_replay_memory(module)
        device = self._device
        if device is not None and device.type == "cuda":
            peak, kind = int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
        else:
            peak, kind = _peak_rss_bytes(), "process_peak_rss"
        total, trainable = _parameter_counts(module, warn=not self._counts_warned)
        if (total, trainable) == (0, 0):  # warned by now when the counts could not be read
            self._counts_warned = True
        cost = StageCost(
            stage=stage,
            train_seconds=float(train_seconds),
            eval_seconds=float(eval_seconds),
            peak_memory_bytes=peak,
            memory_kind=kind,
            parameters=total,
            trainable_parameters=trainable,
            samples=int(samples),
            optimizer_steps=int(optimizer_steps),
            replay_memory=replay_memory,
        )
        self._start = None
        return cost

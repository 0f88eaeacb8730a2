"""The per-item records' part of a `RunRecord`: every test item's value at the baseline and
after every stage, for the matrices whose per-task score is a mean over items, and what they
give the results (the ``intervals`` and ``items`` sections, `continual_eval.results.intervals`).

Storage, per matrix and evaluation (the baseline, then each stage; stage ``i`` holds the tasks it
scored): 0/1 items bit-packed ([`PackedBits`][continual_eval.functional.intervals.PackedBits], 1 bit
per
item), other items float64 (64 bits per item). A run of ``T`` tasks holds at most ``T + 1``
evaluations of ``sum_j n_j`` items per matrix; that bound is checked at the baseline against
``max_bytes`` (refused before anything is trained, naming the size). The state is one entry per
evaluation (``"baseline"``, then ``stages[i]``), so each stage's part stands alone.

Per-step (in-stage) evaluations (``eval_every_n_steps``, whole test sets): each keeps the items
of the tasks it scored (``<= stage``), stored as the stage ends' are, as ``(step, stage,
items)`` entries (`ItemRecord.steps`; in the checkpoint, and in the stage journal with the
stage they ran in). Their count depends on the run's length, so they are checked as they come:
an evaluation that would take the records (with the stage ends still to come) past
``max_bytes`` is refused, naming the bound. They give the intervals of min-ACC, WC-ACC, the
stability gap, the stage areas, anytime accuracy, ``LCA_beta`` and the AUC forward transfer
(``intervals.matrices.*.step_metrics`` and ``metrics``, by
`continual_eval.functional._step_intervals`): the same paired resample of a task's items in
every per-step and stage-end evaluation.

Intervals and transitions are a function of the record (`ItemRecord.results`), computed when
the results are built and kept until the next stage is recorded.

Intransigence: with the reference model's items of the primary matrix (``reference=`` a
[`Reference`][continual_eval.Reference] of ``train_reference(..., callback_kwargs={"item_records":
...})``, or its results directory's ``stages.jsonl``), task ``j``'s reference items are resampled
with the same weights as its ``R[j, j]`` (the reference is scored on the same test items; a
reference with another item count for a task is refused at the baseline, naming the task). They
are part of the record's settings (the checkpoint's state and the journal's header). A reference
of scores only has no intransigence interval: the section states why (``unavailable``); an
interval holding ``ref[j]`` fixed would ignore the reference's own test-set error.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from continual_eval.evaluation.class_incremental import AGNOSTIC_NAME
from continual_eval.functional._class_il_intervals import class_il_bootstrap
from continual_eval.functional._step_intervals import step_bootstrap
from continual_eval.functional.intervals import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    PackedBits,
    held_out_bootstrap,
    pack_bits,
    paired_bootstrap,
    student_t_interval,
    unpack_bits,
    wilson_interval,
)
from continual_eval.functional.items import item_transitions
from continual_eval.results.intervals import (
    CLASS_IL_PAIRED,
    ClassIncrementalIntervals,
    ClassIncrementalPaired,
    HeldOutIntervals,
    IntervalResults,
    ItemResults,
    MatrixIntervals,
    Transitions,
)

if TYPE_CHECKING:
    from continual_eval.record import MatrixSpec, Scored
    from continual_eval.results import ContinualResults

__all__ = ["DEFAULT_MAX_BYTES", "ItemRecord", "ItemSettings"]

#: the default bound of the per-item records (bytes, every matrix and evaluation together)
DEFAULT_MAX_BYTES = 256 * 2**20
#: the bootstrap's metrics as ``results.json`` names them (``acc`` ... as the matrices do)
_METRICS = (
    "acc",
    "bwt",
    "fwt",
    "forgetting",
    "learning_accuracy",
    "average_incremental_accuracy",
    "intransigence",
    "fwt_isolated",
)

Stored = PackedBits | Tensor

#: the numbers a run reports that one run's per-item records give no interval, and why (stated
#: in the ``intervals`` section's ``unavailable``)
UNAVAILABLE = {
    "cost": "measured (times, samples, memory), not estimated from test items",
}
#: stated with per-step evaluations (``step_metrics``): what their intervals do not give
STEP_UNAVAILABLE = {
    "gap_recovery_steps_band": (
        "gap_recovery_steps is a first passage on the evaluation grid: its interval is the hull "
        "of the recovery steps of the two edges of a simultaneous bootstrap band of the curve's "
        "margin over boundary - tolerance, the resampled recovery steps' order statistics and "
        "the estimate; a null end means 'not recovered within stage j + 1' (a null high: "
        "recovery within the stage is not established). Conservative: 97-100% coverage "
        "measured at nominal 95% (clear, slow, flat and double-dip recoveries, no gap, plateaus "
        "that never come back; n = 256, tests/test_step_intervals.py): read it as wide"
    ),
    "min_acc_ties": (
        "min-ACC, WC-ACC and the gap's minimum and depth take a minimum over evaluations: their "
        "interval, the hull of the percentile and the basic bootstrap intervals, covers 94-96% "
        "at nominal 95% where the minimum is clear and where four to eight evaluations come "
        "within 0.02 of it (each interval alone: 82-85% and 93% there), and undercovers a "
        "little where evaluations are exactly tied at the minimum (about 92% with eight tied, "
        "n = 256; tests/test_step_intervals.py): read such an interval as slightly too narrow"
    ),
    "auc_forward_transfer_reference": (
        "the AUC forward transfer's interval holds the reference's areas fixed (a reference of "
        "scores): the reference run's own test-set error is not in it"
    ),
}
#: why the per-step metrics have no interval where the per-step evaluations kept no items
STEP_SUBSET = (
    "the per-step evaluations score a fixed subset (StepEvaluation(subset=...)), whose items "
    "are not recorded: min-ACC, WC-ACC, the stability gap and the plasticity metrics have no "
    "interval"
)
STEP_MISSING = (
    "the per-step evaluations' items are not all recorded (a run resumed from a checkpoint or "
    "journal without them): min-ACC, WC-ACC, the stability gap and the plasticity metrics have "
    "no interval"
)
#: the step-curve keys kept per stage (``step_metrics``) and as one number (``metrics``)
_STEP_VECTORS = (
    "min_acc",
    "wc_acc",
    "gap_boundary",
    "gap_minimum",
    "gap_depth",
    "gap_recovery_steps",
    "stage_auc",
    "auc_forward_transfer_per_task",
)
_STEP_SCALARS = ("anytime_accuracy", "lca", "auc_forward_transfer")


@dataclasses.dataclass(frozen=True)
class ItemSettings:
    """What ``item_records=`` asked for: the matrices to record (``None``: every one that is a
    mean over items), the memory bound, and the intervals' ``confidence``, ``resamples`` and
    ``seed``."""

    matrices: tuple[str, ...] | None = None
    max_bytes: int = DEFAULT_MAX_BYTES
    confidence: float = DEFAULT_CONFIDENCE
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["matrices"] = None if self.matrices is None else list(self.matrices)
        return out


def _nbytes(binary: bool, n: int) -> int:
    return -(-n // 8) if binary else 8 * n


def _store(values: Tensor, binary: bool) -> Stored:
    return pack_bits(values.bool()) if binary else values.detach().to("cpu", torch.float64).clone()


def _values(stored: Stored) -> Tensor:
    return unpack_bits(stored) if isinstance(stored, PackedBits) else stored


def _reference_items(
    items: Sequence[Tensor | PackedBits], binary: bool, num_tasks: int
) -> dict[int, Stored]:
    """The reference's items, task ``j`` -> stored like the matrix's (packed 0/1 or float64),
    checked: one ``[n_j]`` entry per task, 0/1 for a 0/1 matrix."""
    if len(items) != num_tasks:
        raise ValueError(
            f"per-item records: the reference holds items of {len(items)} tasks, the run has "
            f"{num_tasks}"
        )
    out: dict[int, Stored] = {}
    for j, entry in enumerate(items):
        if isinstance(entry, PackedBits):
            if binary:
                out[j] = PackedBits(
                    entry.bits.detach().to("cpu", torch.uint8).clone(), entry.num_items
                )
                continue
            entry = unpack_bits(entry)
        if not isinstance(entry, Tensor) or entry.ndim != 1:
            raise ValueError(
                f"per-item records: the reference's items of task {j} must be a [n_j] tensor or "
                f"PackedBits, got {type(entry).__name__}"
                + (f" of shape {tuple(entry.shape)}" if isinstance(entry, Tensor) else "")
            )
        if binary and entry.dtype != torch.bool:
            raise ValueError(
                f"per-item records: the reference's items of task {j} are {entry.dtype}, the "
                "primary matrix's items are 0/1 (bool)"
            )
        out[j] = _store(entry, binary)
    return out


def _num(stored: Stored) -> int:
    return stored.num_items if isinstance(stored, PackedBits) else int(stored.numel())


def _label_bytes(labels: Mapping[int, Tensor] | None) -> int:
    if labels is None:
        return 0
    return sum(v.numel() * v.element_size() for v in labels.values())


def _small_ints(values: Tensor, what: str) -> Tensor:
    """Class ids ``[n]`` as int16 (int32 past 32767), refused unless whole numbers >= 0."""
    flat = values.detach().to("cpu").reshape(-1)
    if flat.is_floating_point():
        if not bool((flat == flat.round()).all()):
            raise ValueError(f"{what} are not whole class ids")
        flat = flat.long()
    flat = flat.to(torch.int64)
    if flat.numel() and int(flat.min()) < 0:
        raise ValueError(f"{what}: class id {int(flat.min())} is negative")
    small = flat.numel() == 0 or int(flat.max()) <= torch.iinfo(torch.int16).max
    return flat.to(torch.int16 if small else torch.int32)


def _restored_labels(
    given: Mapping[Any, Tensor] | None, num_items: Sequence[int] | None, source: str
) -> dict[int, Tensor] | None:
    """The item labels a checkpoint or journal holds (``None``: none), checked: one ``[n_j]``
    entry of class ids per task."""
    if given is None:
        return None
    sizes = list(num_items or [])
    out = {int(j): _small_ints(v, f"{source}'s item labels of task {j}") for j, v in given.items()}
    wrong = [j for j in range(len(sizes)) if j not in out or out[j].numel() != sizes[j]]
    if wrong or len(out) != len(sizes):
        j = wrong[0] if wrong else len(sizes)
        raise ValueError(
            f"per-item records: {source}'s item labels do not match the test sets: task {j} "
            f"has {out[j].numel() if j in out else 'no'} labels"
            + (f" for its {sizes[j]} items" if j < len(sizes) else " (no such task)")
        )
    return out


class ItemRecord:
    """Per-item records of the matrices ``binary`` names (matrix -> 0/1 items), a record
    section (see the module docstring).

    Args:
        specs: every recorded matrix's spec (direction, bounds).
        binary: recorded matrix -> whether its items are 0/1.
        skipped: matrix -> why it is not recorded (stated in the ``items`` section).
        num_tasks: ``T``.
        settings: the bound and the intervals' settings.
        forgetting: the run's forgetting convention (the bootstrap's).
        primary: the primary matrix's name (the one ``reference`` scores).
        reference: the reference model's items of the primary matrix, one ``[n_j]`` entry per
            task (bool or [`PackedBits`][continual_eval.functional.intervals.PackedBits] for 0/1
            items,
            else floating): the intransigence interval.
        reference_note: why the run's reference has no items (stated in the ``intervals``
            section as intransigence's ``unavailable`` reason); ``None``: no reference.
        held_out: the held-out sets (task ids ``T + h`` of the evaluations): their items are
            kept beside the tasks' and give the ``intervals`` section's ``held_out`` part.
    """

    key = "items"

    def __init__(
        self,
        specs: Mapping[str, MatrixSpec],
        binary: Mapping[str, bool],
        skipped: Mapping[str, str],
        num_tasks: int,
        settings: ItemSettings,
        *,
        forgetting: str = "peak",
        primary: str | None = None,
        reference: Sequence[Tensor | PackedBits] | None = None,
        reference_note: str | None = None,
        reference_kind: str | None = None,
        held_out: Sequence[str] = (),
    ) -> None:
        self.specs = {name: specs[name] for name in binary}
        self.binary = dict(binary)
        self.skipped = dict(skipped)
        self.num_tasks = num_tasks
        self.settings = settings
        self.forgetting = forgetting
        self.primary = primary if primary in self.binary else None
        #: the reference's items of the primary matrix, task -> stored (``None``: none)
        self.reference: dict[int, Stored] | None = None
        if reference is not None and self.primary is not None:
            self.reference = _reference_items(reference, self.binary[self.primary], num_tasks)
        self.reference_note = reference_note
        #: ``isolated``, ``joint`` or ``cumulative``: FWT against isolated training
        #: (``fwt_isolated``) has an interval against an isolated reference only
        self.reference_kind = reference_kind
        self.held_out = list(held_out)
        self.num_items: list[int] | None = None
        #: the held-out sets' item counts (ids ``T + h`` in the evaluations)
        self.held_out_sizes: list[int] = []
        self.baseline: dict[str, dict[int, Stored]] = {}
        self.stages: list[dict[str, dict[int, Stored]]] = []
        #: the test items' labels, task -> ``[n_j]`` int16/int32 class ids (recorded once, at
        #: the baseline, with ``task_classes``: the per-class intervals); ``None``: not recorded
        self.labels: dict[int, Tensor] | None = None
        #: the per-step evaluations' items, ``(step, stage, matrix -> task -> stored)`` in order
        self.steps: list[tuple[int, int, dict[str, dict[int, Stored]]]] = []
        self._cache: tuple[tuple[int, bool], IntervalResults | None, ItemResults] | None = None
        self._step_cache: tuple[Any, dict[str, Any]] | None = None
        self._class_il_cache: tuple[tuple[int, bool], ClassIncrementalIntervals] | None = None

    # ------------------------------------------------------------------ memory
    def evaluation_bytes(self, num_items: Sequence[int]) -> int:
        """Bytes of one evaluation of every task (and held-out set) and recorded matrix."""
        sizes = [*num_items, *self.held_out_sizes]
        return sum(_nbytes(b, n) for b in self.binary.values() for n in sizes)

    def _size(self, j: int) -> int:
        """Item count of task ``j`` (``j >= T``: held-out set ``j - T``)."""
        assert self.num_items is not None
        return self.num_items[j] if j < self.num_tasks else self.held_out_sizes[j - self.num_tasks]

    @property
    def memory_bytes(self) -> int:
        """Bytes held now (the reference's items included)."""
        if self.num_items is None:
            return 0
        held = 0
        if self.reference is not None and self.primary is not None:
            binary = self.binary[self.primary]
            held += sum(_nbytes(binary, _num(v)) for v in self.reference.values())
        held += _label_bytes(self.labels)
        for evaluation in [self.baseline, *self.stages, *(e for _, _, e in self.steps)]:
            for name, tasks in evaluation.items():
                held += sum(_nbytes(self.binary[name], self._size(j)) for j in tasks)
        return held

    def _check_size(self, num_items: Sequence[int], label_bytes: int = 0) -> None:
        per = self.evaluation_bytes(num_items)
        total = (self.num_tasks + 1) * per + label_bytes
        if total > self.settings.max_bytes:
            kinds = ", ".join(
                f"{name}: {1 if b else 64} bit(s) per item" for name, b in self.binary.items()
            )
            raise ValueError(
                f"per-item records would hold {total / 2**20:.1f} MiB ({total} bytes: "
                f"{self.num_tasks + 1} evaluations (the baseline and {self.num_tasks} stages) x "
                f"{sum(num_items) + sum(self.held_out_sizes)} test items x "
                f"{len(self.binary)} matrices ({kinds}); "
                f"{per} bytes per evaluation"
                + (f"; and {label_bytes} bytes of the items' labels" if label_bytes else "")
                + "), over item_records max_bytes="
                f"{self.settings.max_bytes}; raise max_bytes or record fewer matrices"
            )

    def _check_reference(self, sizes: Sequence[int]) -> None:
        """The reference's items must be the test items: the same count per task."""
        if self.reference is None:
            return
        for j, stored in self.reference.items():
            if _num(stored) != sizes[j]:
                raise ValueError(
                    f"per-item records: the reference holds {_num(stored)} items of task {j} "
                    f"({self.primary!r}), its test set has {sizes[j]}: the intransigence interval "
                    "pairs the reference's and the run's items of the same test set; score the "
                    "reference on the run's test loaders"
                )

    def summary_line(self) -> str:
        """What is recorded, its bound over the run, and what is skipped and why (one line)."""
        kinds = ", ".join(f"{n} ({1 if b else 64} bit/item)" for n, b in self.binary.items())
        line = f"[continual-eval] per-item records: {kinds}"
        if self.num_items is not None:
            most = (self.num_tasks + 1) * self.evaluation_bytes(self.num_items)
            line += f", at most {most / 2**20:.2f} MiB ({most} bytes) over the run"
        if self.skipped:
            line += "; not recorded: " + "; ".join(f"{n} ({w})" for n, w in self.skipped.items())
        return line

    # ------------------------------------------------------------------ recording
    def _checked(
        self, scored: Scored, what: str, tasks: Sequence[int]
    ) -> dict[str, dict[int, Tensor]]:
        """Each recorded matrix's items of ``tasks`` and of the held-out sets (ids ``T + h``),
        checked against the test-set sizes."""
        out: dict[str, dict[int, Tensor]] = {}
        T = self.num_tasks
        held = [T + h for h in range(len(self.held_out))] if scored.held_out else []
        for name in self.binary:
            given = scored.items.get(name)
            if given is None:
                raise ValueError(f"{what} holds no per-item values of matrix {name!r}")
            absent = [j - T for j in held if j not in given]
            if absent:
                raise ValueError(
                    f"{what} holds no per-item values of matrix {name!r} for the held-out set "
                    f"{self.held_out[absent[0]]!r}"
                )
            if self.num_items is not None and self.held_out_sizes:
                for j in held:
                    if given[j].numel() != self._size(j):
                        raise ValueError(
                            f"{what}: matrix {name!r} has {given[j].numel()} items of the "
                            f"held-out set {self.held_out[j - T]!r}, the baseline had "
                            f"{self._size(j)} (a test set changed size)"
                        )
            missing = [j for j in tasks if j not in given]
            if missing:
                raise ValueError(
                    f"{what} holds no per-item values of matrix {name!r} for task {missing[0]}"
                )
            if self.num_items is not None:
                for j in tasks:
                    if given[j].numel() != self.num_items[j]:
                        raise ValueError(
                            f"{what}: matrix {name!r} has {given[j].numel()} items of task {j}, "
                            f"the baseline had {self.num_items[j]} (a test set changed size)"
                        )
            out[name] = {j: given[j] for j in [*tasks, *held]}
        return out

    def record_baseline(self, scored: Scored) -> None:
        tasks = list(range(self.num_tasks))
        items = self._checked(scored, "the baseline", tasks)
        first = next(iter(items.values()))
        sizes = [int(first[j].numel()) for j in tasks]
        self.held_out_sizes = [int(first[j].numel()) for j in sorted(first) if j >= self.num_tasks]
        if 0 in self.held_out_sizes:
            h = self.held_out_sizes.index(0)
            raise ValueError(f"per-item records: the held-out set {self.held_out[h]!r} has no item")
        empty = [j for j in tasks if sizes[j] == 0]
        if empty:
            raise ValueError(f"per-item records: task {empty[0]}'s test set has no item")
        labels = self._baseline_labels(scored, sizes)
        self._check_size(sizes, _label_bytes(labels))
        self._check_reference(sizes)
        self.num_items = sizes
        self.baseline = {
            name: {j: _store(v, self.binary[name]) for j, v in tasks_.items()}
            for name, tasks_ in items.items()
        }
        self.labels = labels
        self.stages, self._cache = [], None
        self._class_il_cache = None

    def _baseline_labels(self, scored: Scored, sizes: Sequence[int]) -> dict[int, Tensor] | None:
        """The task-agnostic scorer's item labels of the baseline (``task_classes=`` with its
        items recorded), task -> ``[n_j]`` int16 (int32 past 32767 classes); ``None`` without."""
        given = scored.labels.get(AGNOSTIC_NAME) if AGNOSTIC_NAME in self.binary else None
        if given is None:
            return None
        out = {}
        for j in range(self.num_tasks):
            values = given.get(j)
            if values is None or values.numel() != sizes[j]:
                raise ValueError(
                    f"the baseline holds {'no' if values is None else values.numel()} item "
                    f"labels of task {j} for its {sizes[j]} items ({AGNOSTIC_NAME!r})"
                )
            out[j] = _small_ints(values, f"the baseline's item labels of task {j}")
        return out

    def check_stage(self, stage: int, scored: Scored) -> None:
        self._checked(scored, f"stage {stage}", scored.task_ids)

    def record_stage(self, stage: int, scored: Scored) -> list[str]:
        items = self._checked(scored, f"stage {stage}", scored.task_ids)
        entry = {
            name: {j: _store(v, self.binary[name]) for j, v in tasks.items()}
            for name, tasks in items.items()
        }
        self.stages = [*self.stages[:stage], entry]
        self.steps = [e for e in self.steps if e[1] <= stage]
        self._cache = self._step_cache = self._class_il_cache = None
        return []

    def record_step(self, step: int, stage: int, scored: Scored) -> None:
        """Keep a per-step evaluation's items (tasks ``<= stage``, no held-out set); refused
        (``ValueError`` naming ``max_bytes``) when it and the stage ends still to come would
        take the records past the bound."""
        tasks = list(range(stage + 1))
        items = self._checked(dataclasses.replace(scored, held_out={}), f"step {step}", tasks)
        assert self.num_items is not None
        adds = sum(_nbytes(self.binary[n], self.num_items[j]) for n in items for j in tasks)
        to_come = (self.num_tasks - stage) * self.evaluation_bytes(self.num_items)
        total = self.memory_bytes + adds + to_come
        if total > self.settings.max_bytes:
            raise ValueError(
                f"per-item records: the per-step evaluation at step {step} (stage {stage}) "
                f"would take them to {total / 2**20:.1f} MiB ({total} bytes: "
                f"{self.memory_bytes} held, {adds} for this evaluation, {to_come} for the "
                f"{self.num_tasks - stage} stage ends to come), over item_records max_bytes="
                f"{self.settings.max_bytes}; raise max_bytes, evaluate less often "
                "(eval_every_n_steps) or record fewer matrices"
            )
        entry = {
            name: {j: _store(v, self.binary[name]) for j, v in values.items() if j in tasks}
            for name, values in items.items()
        }
        if self.steps and self.steps[-1][:2] == (step, stage):
            self.steps.pop()  # the same evaluation again (a stage end at that step)
        self.steps.append((int(step), int(stage), entry))
        self._step_cache = None

    def forget_step(self, step: int, stage: int) -> None:
        """Drop the per-step evaluation at ``(step, stage)`` (the stage end at that step
        replaced its curve point; the stage end's items stand for it)."""
        before = len(self.steps)
        self.steps = [e for e in self.steps if e[:2] != (step, stage)]
        if len(self.steps) != before:
            self._step_cache = None

    def values(self, name: str, stage: int | None = None) -> dict[int, Tensor]:
        """Matrix ``name``'s items of every task the evaluation scored (``stage=None``: the
        baseline), task id -> ``[n_j]`` (bool for 0/1 items, else float64), test-set order."""
        evaluation = self.baseline if stage is None else self.stages[stage]
        return {j: _values(stored) for j, stored in evaluation.get(name, {}).items()}

    # ------------------------------------------------------------------ state
    @staticmethod
    def _plain(evaluation: Mapping[str, Mapping[int, Stored]]) -> dict[str, dict[int, Tensor]]:
        return {
            name: {
                j: (v.bits if isinstance(v, PackedBits) else v).clone() for j, v in tasks.items()
            }
            for name, tasks in evaluation.items()
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "matrices": {name: bool(b) for name, b in self.binary.items()},
            "num_items": None if self.num_items is None else list(self.num_items),
            "held_out_sizes": list(self.held_out_sizes),
            "baseline": self._plain(self.baseline),
            "stages": [self._plain(stage) for stage in self.stages],
            "steps": [
                {"step": step, "stage": stage, "items": self._plain(entry)}
                for step, stage, entry in self.steps
            ],
            "reference": None if self.reference is None else self._reference_state(),
            "labels": None
            if self.labels is None
            else {j: v.clone() for j, v in self.labels.items()},
        }

    def _reference_state(self) -> dict[str, Any]:
        assert self.reference is not None and self.primary is not None
        return {
            "num_items": [_num(self.reference[j]) for j in range(self.num_tasks)],
            "items": self._plain({self.primary: self.reference})[self.primary],
        }

    def _restore_reference(self, state: Mapping[str, Any] | None, source: str) -> None:
        """The reference items of a checkpoint or journal; they must equal the ones given now
        (``reference=`` again at a resume) when both are given."""
        if state is None:
            return
        if self.primary is None:
            raise ValueError(f"per-item records: {source} holds reference items, no primary")
        binary, sizes = self.binary[self.primary], [int(n) for n in state["num_items"]]
        items = state["items"]
        restored: dict[int, Stored] = {
            int(j): PackedBits(t.to(torch.uint8), sizes[int(j)]) if binary else t.double()
            for j, t in items.items()
        }
        if self.reference is not None:
            for j, stored in self.reference.items():
                if not torch.equal(_values(stored), _values(restored[j])):
                    raise ValueError(
                        f"per-item records: the reference's items of task {j} differ from "
                        f"those {source} holds (another reference than the run's)"
                    )
        self.reference = restored

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        recorded = None if state is None else dict(state["matrices"])
        if recorded != self.binary:
            raise ValueError(f"per-item records: recorded matrices {recorded}, now {self.binary}")
        assert state is not None
        sizes = state["num_items"]
        self.held_out_sizes = [int(n) for n in state.get("held_out_sizes", [])]
        every = None if sizes is None else [*sizes, *self.held_out_sizes]

        def restored(
            evaluation: Mapping[str, Mapping[int, Tensor]],
        ) -> dict[str, dict[int, Stored]]:
            assert every is not None or not evaluation
            return {
                name: {
                    int(j): PackedBits(t.to(torch.uint8), every[int(j)])  # type: ignore[index]
                    if self.binary[name]
                    else t.double()
                    for j, t in tasks.items()
                }
                for name, tasks in evaluation.items()
            }

        self.num_items = None if sizes is None else [int(n) for n in sizes]
        self.baseline = restored(state["baseline"])
        self.stages = [restored(stage) for stage in state["stages"]]
        self.steps = [  # absent in older checkpoints
            (int(e["step"]), int(e["stage"]), restored(e["items"])) for e in state.get("steps", [])
        ]
        self._step_cache = None
        self._restore_reference(
            state.get("reference"), "the checkpoint"
        )  # absent in older checkpoints
        if self.num_items is not None:
            self._check_reference(self.num_items)
        self.labels = _restored_labels(state.get("labels"), self.num_items, "the checkpoint")
        self._cache = self._class_il_cache = None

    # ------------------------------------------------------------------ journal
    def journal_settings(self) -> dict[str, Any]:
        return {
            "matrices": {name: bool(b) for name, b in self.binary.items()},
            "skipped": dict(self.skipped),
            "num_tasks": self.num_tasks,
            "settings": self.settings.to_dict(),
            "forgetting": self.forgetting,
            "primary": self.primary,
            "reference": None if self.reference is None else self._reference_journal(),
            "reference_note": self.reference_note,
            "reference_kind": self.reference_kind,
            "held_out": list(self.held_out),
        }

    def _reference_journal(self) -> dict[str, Any]:
        from continual_eval.record import tensor_to_json

        assert self.reference is not None
        return {
            "num_items": [_num(self.reference[j]) for j in range(self.num_tasks)],
            "items": {
                str(j): v.bits.numpy().tobytes().hex()
                if isinstance(v, PackedBits)
                else tensor_to_json(v)
                for j, v in self.reference.items()
            },
        }

    @classmethod
    def from_journal(
        cls, settings: Mapping[str, Any], specs: Mapping[str, MatrixSpec]
    ) -> ItemRecord:
        given = dict(settings["settings"])
        matrices = given.pop("matrices")
        options = ItemSettings(None if matrices is None else tuple(matrices), **given)
        record = cls(
            specs,
            {str(k): bool(v) for k, v in settings["matrices"].items()},
            {str(k): str(v) for k, v in settings["skipped"].items()},
            int(settings["num_tasks"]),
            options,
            forgetting=str(settings["forgetting"]),
            primary=settings.get("primary"),
            reference_note=settings.get("reference_note"),
            reference_kind=settings.get("reference_kind"),
            held_out=[str(h) for h in settings.get("held_out", [])],
        )
        reference = settings.get("reference")
        if reference is not None:
            record._restore_reference(record._reference_from_journal(reference), "the journal")
        return record

    def _reference_from_journal(self, part: Mapping[str, Any]) -> dict[str, Any]:
        from continual_eval.record import tensor_from_json

        assert self.primary is not None
        binary = self.binary[self.primary]
        return {
            "num_items": part["num_items"],
            "items": {
                int(key): torch.frombuffer(bytearray(bytes.fromhex(value)), dtype=torch.uint8)
                if binary
                else tensor_from_json(value)
                for key, value in part["items"].items()
            },
        }

    def journal_part(self, stage: int | None) -> dict[str, Any]:
        """The items of the baseline (with the test-set sizes) or of ``stage`` (and of its
        per-step evaluations, ``steps``): per matrix and task, 0/1 items as the hex of their
        packed bytes, other items by `tensor_to_json`."""
        from continual_eval.record import tensor_to_json

        def encoded(evaluation: Mapping[str, Mapping[int, Stored]]) -> dict[str, Any]:
            return {
                name: {
                    str(j): v.bits.numpy().tobytes().hex()
                    if isinstance(v, PackedBits)
                    else tensor_to_json(v)
                    for j, v in tasks.items()
                }
                for name, tasks in evaluation.items()
            }

        evaluation = self.baseline if stage is None else self.stages[stage]
        part: dict[str, Any] = {"items": encoded(evaluation)}
        if stage is not None:  # the stage's per-step evaluations
            part["steps"] = [
                {"step": step, "items": encoded(entry)}
                for step, at, entry in self.steps
                if at == stage
            ]
        if stage is None:
            part["num_items"] = None if self.num_items is None else list(self.num_items)
            part["held_out_sizes"] = list(self.held_out_sizes)
            if self.labels is not None:
                part["labels"] = {str(j): tensor_to_json(v) for j, v in self.labels.items()}
        return part

    def replay_part(self, stage: int | None, part: Mapping[str, Any]) -> None:
        from continual_eval.record import tensor_from_json

        if stage is None:
            self.num_items = [int(n) for n in part["num_items"]]
            self.held_out_sizes = [int(n) for n in part.get("held_out_sizes", [])]
        assert self.num_items is not None
        sizes = [*self.num_items, *self.held_out_sizes]

        def decoded(items: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[int, Stored]]:
            evaluation: dict[str, dict[int, Stored]] = {}
            for name, tasks in items.items():
                evaluation[name] = {}
                for key, value in tasks.items():
                    j = int(key)
                    if self.binary[name]:
                        raw = torch.frombuffer(bytearray(bytes.fromhex(value)), dtype=torch.uint8)
                        evaluation[name][j] = PackedBits(raw.clone(), sizes[j])
                    else:
                        evaluation[name][j] = tensor_from_json(value).double()
            return evaluation

        evaluation = decoded(part["items"])
        if stage is None:
            self.baseline, self.stages, self.steps = evaluation, [], []
            given = part.get("labels")
            self.labels = _restored_labels(
                None if given is None else {k: tensor_from_json(v) for k, v in given.items()},
                self.num_items,
                "the journal",
            )
        else:
            self.stages = [*self.stages[:stage], evaluation]
            kept = [e for e in self.steps if e[1] < stage]
            steps = part.get("steps", [])  # absent in older journals
            self.steps = kept + [(int(e["step"]), stage, decoded(e["items"])) for e in steps]
        self._cache = self._step_cache = self._class_il_cache = None

    # ------------------------------------------------------------------ results
    def _dense(self, name: str, s: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(values [s + 1, N], evaluated [s + 1, T], task [N])``: row 0 the baseline, row
        ``i + 1`` stage ``i``; every task's items side by side (zero where not evaluated)."""
        assert self.num_items is not None
        T, binary = self.num_tasks, self.binary[name]
        sizes = torch.tensor(self.num_items)
        start = torch.cumsum(sizes, 0) - sizes
        values = torch.zeros(s + 1, int(sizes.sum()), dtype=torch.bool if binary else torch.float64)
        evaluated = torch.zeros(s + 1, T, dtype=torch.bool)
        for row, evaluation in enumerate([self.baseline, *self.stages[:s]]):
            for j, stored in evaluation.get(name, {}).items():
                if j >= T:  # a held-out set
                    continue
                values[row, int(start[j]) : int(start[j]) + self.num_items[j]] = _values(stored)
                evaluated[row, j] = True
        return values, evaluated, torch.repeat_interleave(torch.arange(T), sizes)

    def _cells(self, name: str, s: int) -> tuple[str, Tensor, Tensor]:
        """Every evaluated cell's interval ``[s + 1, T]`` (row 0 the baseline), NaN elsewhere:
        Wilson for 0/1 items, Student t otherwise."""
        values, evaluated, task = self._dense(name, s)
        T, n = self.num_tasks, torch.tensor(self.num_items, dtype=torch.float64)
        sums = torch.zeros(s + 1, T, dtype=torch.float64).index_add_(1, task, values.double())
        confidence = self.settings.confidence
        if self.binary[name]:
            low, high = wilson_interval(sums, n.expand_as(sums), confidence=confidence)
            method = "wilson"
        else:
            mean = sums / n
            centred = (values - mean[:, task]).square()
            squares = torch.zeros_like(sums).index_add_(1, task, centred)
            std = (squares / (n - 1)).sqrt()
            low, high = student_t_interval(mean, std, n.expand_as(mean), confidence=confidence)
            method = "t"
        nan = torch.tensor(math.nan, dtype=torch.float64)
        return method, torch.where(evaluated, low, nan), torch.where(evaluated, high, nan)

    def _per_task_items(self, name: str, s: int) -> tuple[list[Tensor], list[Tensor]]:
        """The leading ``s`` tasks' items ``[s, n_j]`` (their first ``s`` stages) and baseline
        ``[n_j]``, what the functional layer reads (unevaluated cells: zeros, never read)."""
        values, _, _ = self._dense(name, s)
        assert self.num_items is not None
        parts = torch.split(values, self.num_items, dim=1)[:s]
        return [p[1:] for p in parts], [p[0] for p in parts]

    def _unavailable(self, name: str) -> dict[str, str]:
        """Metric -> why it has no interval (intransigence of a reference without items)."""
        if name != self.primary or self.reference is not None or self.reference_note is None:
            return {}
        out = {"intransigence": self.reference_note}
        if self.reference_kind == "isolated":
            out["fwt_isolated"] = "as intransigence"
        return out

    def _bootstrap(
        self, name: str, s: int
    ) -> tuple[dict[str, tuple[float, float, float]], dict[str, tuple[Tensor, Tensor, Tensor]]]:
        """The metrics' paired-bootstrap intervals and the per-task values' (same resamples)."""
        if s == 0:
            return {}, {}
        items, baseline = self._per_task_items(name, s)
        settings = self.settings
        reference = None
        if name == self.primary and self.reference is not None:
            reference = [self.reference[j] for j in range(s)]
        result = paired_bootstrap(
            items,
            baseline=baseline,
            reference=reference,
            forgetting=self.forgetting,
            higher_is_better=self.specs[name].higher_is_better,
            confidence=settings.confidence,
            resamples=settings.resamples,
            seed=settings.seed,
        )
        out = {}
        for key in _METRICS:
            if key == "fwt_isolated" and self.reference_kind != "isolated":
                continue  # R[j, j] - ref[j] is FWT against isolated training only
            interval = result.metrics.get(key)
            if interval is not None:
                out[key] = (
                    float(interval.estimate),
                    float(interval.low),
                    float(interval.high),
                )
        per_task = {key: tuple(v) for key, v in result.per_task.items()}
        return out, per_task  # type: ignore[return-value]

    def _held_out_intervals(
        self, name: str, s: int, light: bool = False
    ) -> HeldOutIntervals | None:
        """Held-out set cells (Wilson / t) and ``delta`` / ``worst_drop`` by the paired
        bootstrap over each set's items (``light``: their estimates only, NaN ends, as the
        metrics of a run in progress); ``None`` without held-out items."""
        T, H = self.num_tasks, len(self.held_out_sizes)
        if not H:
            return None
        evaluations = [self.baseline, *self.stages[:s]]
        rows = [
            torch.stack([_values(e[name][T + h]) for e in evaluations]) for h in range(H)
        ]  # per set [s + 1, n_h]
        n = torch.tensor(self.held_out_sizes, dtype=torch.float64)
        confidence, binary = self.settings.confidence, self.binary[name]
        if binary:
            hits = torch.stack([r.sum(dim=1) for r in rows], dim=1).double()  # [s + 1, H]
            low, high = wilson_interval(hits, n.expand_as(hits), confidence=confidence)
        else:
            mean = torch.stack([r.mean(dim=1) for r in rows], dim=1)
            std = torch.stack([r.std(dim=1) for r in rows], dim=1)
            low, high = student_t_interval(mean, std, n.expand_as(mean), confidence=confidence)
        delta, worst = held_out_bootstrap(
            rows,
            higher_is_better=self.specs[name].higher_is_better,
            confidence=confidence,
            resamples=1 if light else self.settings.resamples,
            seed=self.settings.seed,
        )
        if light:
            delta, worst = (
                type(t)(
                    t.estimate, torch.full_like(t.low, math.nan), torch.full_like(t.high, math.nan)
                )
                for t in (delta, worst)
            )
        return HeldOutIntervals(
            cell_method="wilson" if binary else "t",
            low=low[1:],
            high=high[1:],
            baseline_low=low[0],
            baseline_high=high[0],
            delta=tuple(delta),  # type: ignore[arg-type]
            worst_drop=tuple(worst),  # type: ignore[arg-type]
            num_items=tuple(self.held_out_sizes),
        )

    def _transitions(self, name: str, s: int) -> Transitions:
        assert self.num_items is not None
        T = self.num_tasks
        keys = ("right_to_wrong", "wrong_to_right", "forgotten", "recovered", "forgotten_once")
        full = {k: torch.full((s, T), math.nan, dtype=torch.float64) for k in keys}
        if s:
            items, baseline = self._per_task_items(name, s)
            moves = item_transitions(items, baseline=baseline)
            for k in keys:
                full[k][:, :s] = getattr(moves, k)
        return Transitions(
            **full, num_items=tuple(self.num_items), confidence=self.settings.confidence
        )

    def results(self, s: int, light: bool = False) -> tuple[IntervalResults | None, ItemResults]:
        """The ``intervals`` (``None`` before the baseline) and ``items`` sections of the first
        ``s`` stages (cached until the record changes); ``light``: without the paired bootstrap
        of the metrics (their ``metrics`` empty: seconds per build at 20 x 2000 items, left to
        the end of the run and to readers)."""
        if self._cache is not None and self._cache[0] == (s, light):
            return self._cache[1], self._cache[2]
        intervals = None
        if self.num_items is not None:
            matrices = {}
            held_out: dict[str, HeldOutIntervals] = {}
            for name in self.binary:
                method, low, high = self._cells(name, s)
                metrics, per_task = ({}, {}) if light else self._bootstrap(name, s)
                held = self._held_out_intervals(name, s, light)
                if held is not None:
                    held_out[name] = held
                matrices[name] = MatrixIntervals(
                    cell_method=method,
                    low=low[1:],
                    high=high[1:],
                    baseline_low=low[0],
                    baseline_high=high[0],
                    metrics=metrics,
                    num_items=tuple(self.num_items),
                    unavailable=self._unavailable(name),
                    per_task=per_task,
                )
            settings = self.settings
            intervals = IntervalResults(
                method="paired percentile bootstrap over test items",
                confidence=settings.confidence,
                resamples=settings.resamples,
                seed=settings.seed,
                weights="double_or_nothing",
                forgetting_convention=self.forgetting,
                fwt_convention="gem",
                matrices=matrices,
                held_out=held_out,
                held_out_names=tuple(self.held_out) if held_out else (),
                unavailable=dict(UNAVAILABLE),
            )
        items = ItemResults(
            bits_per_item={name: 1 if b else 64 for name, b in self.binary.items()},
            memory_bytes=self.memory_bytes,
            skipped=dict(self.skipped),
            transitions={
                name: self._transitions(name, s)
                for name, b in self.binary.items()
                if b and self.num_items is not None
            },
        )
        self._cache = ((s, light), intervals, items)
        return intervals, items

    def add_to(self, results: ContinualResults) -> ContinualResults:
        """``results`` with the ``intervals`` and ``items`` sections of its stages."""
        intervals, items = self.results(results.primary.num_stages)
        intervals = self._with_class_il(intervals, results)
        intervals = self._with_steps(intervals, results)
        return dataclasses.replace(results, intervals=intervals, items=items)

    # ------------------------------------------------------------------ step curves
    def _step_rows(self, results: ContinualResults) -> list[dict[str, dict[int, Stored]]] | None:
        """The items of every curve evaluation of the completed stages, in the curves' order
        (a stage's last one is its end: ``stages[k]``); ``None`` when one has no items."""
        steps = results.steps
        assert steps is not None
        s = results.primary.num_stages
        stage, step = steps.stage.tolist(), steps.step.tolist()
        kept = {(t, k): entry for t, k, entry in self.steps}
        rows: list[dict[str, dict[int, Stored]]] = []
        for n, (k, t) in enumerate(zip(stage, step, strict=True)):
            if k >= s:
                break
            if n + 1 == len(stage) or stage[n + 1] != k:  # the stage's end
                rows.append(self.stages[k])
            elif (t, k) in kept:
                rows.append(kept[(t, k)])
            else:
                return None
        return rows

    def _step_intervals(
        self, name: str, results: ContinualResults, rows: Sequence[Mapping[str, Any]]
    ) -> dict[str, tuple[Tensor, Tensor, Tensor]]:
        """Matrix ``name``'s curve metrics by the paired bootstrap over test items (one resample
        of each task's items in the baseline, every stage end and every per-step evaluation):
        `step_bootstrap`'s keys, estimate/low/high each."""
        from continual_eval.results.model import _best_score

        assert self.num_items is not None and results.steps is not None
        T, s = self.num_tasks, results.primary.num_stages
        evaluations = [self.baseline, *self.stages[:s], *rows]
        E = len(evaluations)
        evaluated = torch.zeros(E, T, dtype=torch.bool)
        binary = self.binary[name]
        values = []
        for j in range(T):
            n = self.num_items[j]
            v = torch.zeros(E, n, dtype=torch.bool if binary else torch.float64)
            for e, evaluation in enumerate(evaluations):
                stored = evaluation.get(name, {}).get(j)
                if stored is not None:
                    v[e], evaluated[e, j] = _values(stored), True
            values.append(v)
        matrix = results[name]
        N = len(rows)
        plasticity = matrix.plasticity
        reference = results.reference
        reference_auc = None
        if name == results.primary_name and reference is not None:
            reference_auc = reference.auc
        settings = self.settings
        stability = matrix.stability
        found = step_bootstrap(
            values,
            evaluated,
            results.steps.stage[:N],
            results.steps.step[:N],
            s,
            higher_is_better=matrix.higher_is_better,
            lca_beta=None if plasticity is None else plasticity.lca_beta,
            reference_auc=reference_auc,
            best=_best_score(matrix.higher_is_better, matrix.bounds),
            bounds=matrix.bounds,
            tolerance=0.0 if stability is None else stability.tolerance,
            confidence=settings.confidence,
            resamples=settings.resamples,
            seed=settings.seed,
        )
        return {key: tuple(t) for key, t in found.items()}  # type: ignore[misc]

    def _with_steps(
        self, intervals: IntervalResults | None, results: ContinualResults
    ) -> IntervalResults | None:
        """``intervals`` with every recorded matrix's curve-metric intervals (``step_metrics``,
        and ``anytime_accuracy``, ``lca``, ``auc_forward_transfer`` in ``metrics``) when the run
        has step curves; what they cannot give in ``unavailable``."""
        if intervals is None or results.steps is None or self.num_items is None:
            return intervals
        s = results.primary.num_stages
        unavailable = dict(intervals.unavailable)
        if s == 0:
            return intervals
        if results.steps.subset is not None and not all(results.steps.full):
            unavailable["stability"] = unavailable["plasticity"] = STEP_SUBSET
            return dataclasses.replace(intervals, unavailable=unavailable)
        rows = self._step_rows(results)
        if rows is None:
            unavailable["stability"] = unavailable["plasticity"] = STEP_MISSING
            return dataclasses.replace(intervals, unavailable=unavailable)
        key = (s, len(rows), len(self.steps))
        if self._step_cache is None or self._step_cache[0] != key:
            found = {name: self._step_intervals(name, results, rows) for name in self.binary}
            self._step_cache = (key, found)
        found = self._step_cache[1]
        matrices = {}
        for name, m in intervals.matrices.items():
            mine = found[name]
            scalars = {k: tuple(float(t) for t in mine[k]) for k in _STEP_SCALARS if k in mine}
            matrices[name] = dataclasses.replace(
                m,
                metrics={**m.metrics, **scalars},
                step_metrics={k: mine[k] for k in _STEP_VECTORS if k in mine},
            )
        unavailable |= STEP_UNAVAILABLE
        return dataclasses.replace(intervals, matrices=matrices, unavailable=unavailable)

    def light_add_to(self, results: ContinualResults) -> ContinualResults:
        """`add_to` without the metrics' paired bootstrap (the per-stage results of a run in
        progress: cell intervals and transitions only)."""
        intervals, items = self.results(results.primary.num_stages, light=True)
        intervals = self._with_class_il(intervals, results, light=True)
        return dataclasses.replace(results, intervals=intervals, items=items)

    def _with_class_il(
        self, intervals: IntervalResults | None, results: ContinualResults, light: bool = False
    ) -> IntervalResults | None:
        """``intervals`` with the class-incremental intervals when the results have a
        ``class_incremental`` section: the Wilson intervals of its proportions (from the
        confusion counts) and, from ``acc_task_agnostic``'s items and the items' labels, the
        paired bootstrap of the numbers that read each item's class (``light``: left to the
        end of the run; cached until the record changes)."""
        section = results.class_incremental
        if intervals is None or section is None:
            return intervals
        key = (section.num_stages, light)
        if self._class_il_cache is None or self._class_il_cache[0] != key:
            class_il = ClassIncrementalIntervals.compute(section, self.settings.confidence)
            paired, reason = self._class_il_paired(section, light)
            unavailable = dict(class_il.unavailable)
            if paired is not None:
                unavailable = {k: v for k, v in unavailable.items() if k not in CLASS_IL_PAIRED}
            else:
                unavailable |= dict.fromkeys(CLASS_IL_PAIRED, reason)
            class_il = dataclasses.replace(class_il, paired=paired, unavailable=unavailable)
            self._class_il_cache = (key, class_il)
        return dataclasses.replace(intervals, class_incremental=self._class_il_cache[1])

    def _class_il_paired(
        self, section: Any, light: bool
    ) -> tuple[ClassIncrementalPaired | None, str]:
        """The paired bootstrap of the class-IL numbers (`class_il_bootstrap`) of the section's
        stages, or ``None`` and why not."""
        s = int(section.num_stages)
        if AGNOSTIC_NAME not in self.binary:
            return None, (
                f"item_records does not record {AGNOSTIC_NAME!r}, whose items (with their "
                "labels) the paired interval resamples"
            )
        if self.labels is None:
            return None, (
                "the test items' labels were not recorded at the baseline (a record made "
                "before they were): the per-class numbers need each item's class"
            )
        if light:
            return None, (
                "the paired bootstrap is made at the end of the run (left out of the results "
                "of a run in progress)"
            )
        if s == 0 or s > len(self.stages):
            return None, "no stage with item records"
        items, _ = self._per_task_items(AGNOSTIC_NAME, s)
        settings = self.settings
        values = class_il_bootstrap(
            items,
            [self.labels[j] for j in range(s)],
            section.checked.class_task,
            forgetting=self.forgetting,
            confidence=settings.confidence,
            resamples=settings.resamples,
            seed=settings.seed,
        )
        return ClassIncrementalPaired.from_bootstrap(values, AGNOSTIC_NAME), ""

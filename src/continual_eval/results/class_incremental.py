r"""The ``class_incremental`` section of ``results.json``:
[`ClassIncrementalResults`][continual_eval.results.ClassIncrementalResults].

What ``ContinualEvalCallback(task_classes=...)`` records besides its two matrices
``acc_task_aware`` and ``acc_task_agnostic``: after every stage ``i`` the confusion counts of the
task-agnostic predictions on the test samples of the seen tasks ``j <= i`` (true class by
predicted class, ``[C, C]`` integers, summed exactly across ranks), the test samples of each
class (``test_samples``: every stage's counts of a seen class add up to it), and everything the
class-incremental literature computes from them
(`continual_eval.functional.class_incremental`):

* ``per_class_accuracy`` ``[s, C]``: ``conf[c, c] / n_c`` of the seen classes (null: not seen yet);
* ``seen_accuracy`` per stage in both weightings: ``sample`` pools every seen test sample,
  ``sum_{j<=i} correct_ij / sum_{j<=i} n_j`` (iCaRL, PyCIL); ``task`` averages the task
  accuracies, ``(1/(i+1)) sum_{j<=i} R[i, j]`` of ``acc_task_agnostic``. They differ when the
  seen tasks have test sets of different sizes;
* ``last_accuracy`` (the final stage's seen accuracy) and ``average_incremental_accuracy`` (its
  mean over the stages), each in both weightings;
* ``old_accuracy`` (tasks ``< i``, both weightings) and ``new_accuracy`` (task ``i``) per stage;
* ``mean_class_accuracy`` per stage and ``amca``, their mean over the stages (Avalanche's average
  mean class accuracy); ``amca_per_stage``, its running value;
* ``class_forgetting`` ``[C]``: per class, its best accuracy before the final stage (or at it,
  ``peak``; the run's forgetting convention) minus the final one; ``mean_class_forgetting`` and its
  value after each stage (``mean_class_forgetting_per_stage``);
* ``recency_bias`` per stage: the share of the seen test samples predicted as a class of the newest
  task (``prediction_share``) against that task's share of those samples (``sample_share``): a
  prediction share above the sample share is a bias towards the new classes.

Undefined values are NaN here and ``null`` in the file. The counts are the record; the measures
are a pure function of them, recomputed when a file is read.

The counts are held sparsely: only the nonzero cells of each stage, a sparse COO
``[s, C, C]`` int64 tensor (`ClassIncrementalResults.confusion`, 32 bytes per stored cell:
three int64 indices and the count), and every measure is computed from those cells with
scatter sums (``O(nnz + s * C)``; no dense ``[s, C, C]`` tensor is made). A stage stores at most
one cell per test sample of its seen tasks (fewer when several samples share a cell), so the
worst case is ``sum_i`` (test samples of the tasks ``<= i``); the dense per-class tables
(``per_class_accuracy``, ``[s, C]`` float64) take 8 bytes per stage and class.

Confusion encoding (``confusion.stages``): one string per stage holding the nonzero cells of that
stage's matrix as space-separated ``true:predicted:count`` triples of decimal integers, in
row-major order, e.g. ``"0:0:181 0:3:2 1:1:176"``: exact integer counts, one JSON value per stage.
An empty string is a stage without counts (its measures are null).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from continual_eval.functional.class_incremental import (
    TaskClasses,
    _class_accuracy,
    _group_accuracy,
    _mean_class_forgetting_per_stage,
    _new_predictions,
    _recency_from_counts,
    _sparse_counts,
    check_task_classes,
    confusion_in_arrival_order,
    per_class_forgetting,
)
from continual_eval.results._convert import cells, present
from continual_eval.results.schema import (
    ClassIncrementalSection,
    ConfusionSection,
    confusion_cells,
)

__all__ = [
    "CLASS_IL_SOURCE",
    "CONFUSION_ENCODING",
    "ClassIncrementalResults",
    "class_incremental_scalars",
    "decode_confusion",
    "encode_cells",
    "encode_confusion",
    "sparse_confusion",
]

#: where the definitions come from
CLASS_IL_SOURCE = (
    "Masana et al., Class-incremental learning: survey and performance evaluation, TPAMI 2022 "
    "(task-aware / task-agnostic); Rebuffi et al., iCaRL, CVPR 2017 (average incremental "
    "accuracy); Verwimp et al., CLAD, 2022 (AMCA); Wu et al., BiC, CVPR 2019 (recency bias)"
)
#: how ``confusion.stages`` is written
CONFUSION_ENCODING = (
    "per stage, one string: space-separated true:predicted:count of every nonzero cell, row-major "
    "(class ids); counts of the task-agnostic predictions on the seen tasks' test samples"
)
#: how the task-agnostic argmax chooses: among the seen classes (the tasks <= max(i, j)), or all
PREDICTIONS = ("seen", "all")
WEIGHTINGS = ("sample", "task")


def encode_confusion(matrix: Tensor) -> str:
    """One ``[C, C]`` integer matrix (dense or sparse COO) as ``"true:predicted:count ..."`` over
    its nonzero cells, row-major (see the module docstring)."""
    if matrix.layout == torch.sparse_coo:
        matrix = matrix.coalesce()
        cells = torch.cat([matrix.indices().T, matrix.values()[:, None].long()], 1)
        return encode_cells(cells[cells[:, 2] != 0])
    index = matrix.nonzero()
    counts = matrix[index[:, 0], index[:, 1]]
    return encode_cells(torch.cat([index, counts[:, None].to(index.dtype)], 1))


def encode_cells(cells: Tensor) -> str:
    """``[n, 3]`` integer ``(true, predicted, count)`` rows as ``"true:predicted:count ..."``, in
    their order (one stage's string of ``confusion.stages``)."""
    flat = cells.reshape(-1).tolist()
    return " ".join(["%d:%d:%d"] * len(cells)) % tuple(flat)


def decode_confusion(text: str, num_classes: int) -> Tensor:
    """The ``[C, C]`` int64 matrix of `encode_confusion`'s text."""
    matrix = torch.zeros(num_classes, num_classes, dtype=torch.int64)
    values = torch.from_numpy(confusion_cells(text))
    matrix.index_put_((values[:, 0], values[:, 1]), values[:, 2], accumulate=True)
    return matrix


def sparse_confusion(stage_cells: Sequence[Tensor], num_classes: int) -> Tensor:
    """The coalesced sparse COO ``[s, C, C]`` int64 counts of ``s`` stages, each given as its
    ``[n, 3]`` ``(true, predicted, count)`` cells (any order; a repeated cell is summed)."""
    s, C = len(stage_cells), num_classes
    if not s:
        return _empty_confusion(0, C)
    sizes = torch.tensor([len(c) for c in stage_cells], dtype=torch.long)
    cells = torch.cat([torch.as_tensor(c, dtype=torch.int64).reshape(-1, 3) for c in stage_cells])
    stage = torch.repeat_interleave(torch.arange(s), sizes)
    indices = torch.stack([stage, cells[:, 0], cells[:, 1]])
    counts = cells[:, 2]
    ordered = bool(
        (torch.diff((stage * C + cells[:, 0]) * C + cells[:, 1]) > 0).all()
    )  # already sorted and distinct (what the record keeps): no sort needed
    return torch.sparse_coo_tensor(
        indices, counts, (s, C, C), is_coalesced=ordered, check_invariants=False
    ).coalesce()


def _empty_confusion(s: int, C: int) -> Tensor:
    return torch.sparse_coo_tensor(
        torch.zeros(3, 0, dtype=torch.long),
        torch.zeros(0, dtype=torch.int64),
        (s, C, C),
        is_coalesced=True,
        check_invariants=False,
    )


def _as_sparse(given: Any) -> Tensor:
    """``given`` (dense or sparse ``[s, C, C]``) as a coalesced sparse COO int64 tensor."""
    confusion = torch.as_tensor(given).detach().to("cpu")
    if confusion.ndim != 3 or confusion.shape[1] != confusion.shape[2]:
        raise ValueError(f"confusion must be [s, C, C], got {tuple(confusion.shape)}")
    if confusion.is_floating_point() or confusion.is_complex() or confusion.dtype == torch.bool:
        raise ValueError(f"confusion must hold integer counts, got {confusion.dtype}")
    if confusion.layout != torch.sparse_coo:
        confusion = confusion.to_sparse()
    return confusion.coalesce().to(torch.int64)


def _class_lists(task_classes: TaskClasses) -> tuple[tuple[int, ...], ...]:
    order, bounds = task_classes.order.tolist(), task_classes.boundaries.tolist()
    return tuple(tuple(order[bounds[j] : bounds[j + 1]]) for j in range(task_classes.num_tasks))


def _running_mean(values: Tensor) -> Tensor:
    counts = torch.arange(1, len(values) + 1, dtype=torch.float64)
    return torch.cumsum(values, 0) / counts


def _test_samples(totals: Tensor, class_task: Tensor) -> Tensor:
    """``[C]`` test samples per class from the per-stage row sums ``totals [s, C]``: its counts
    at the stages with counts, the same at each (a ``ValueError`` naming the stage and class when
    they differ)."""
    stage = torch.arange(len(totals))[:, None]
    seen = (class_task >= 0) & (class_task <= stage) & (totals.sum(-1, keepdim=True) > 0)
    samples = torch.where(seen, totals, 0).amax(0) if len(totals) else totals.sum(0)
    wrong = (seen & (totals != samples)).nonzero()
    if len(wrong):
        i, c = (int(v) for v in wrong[0])
        raise ValueError(
            f"class {c} has {int(totals[i, c])} test samples at stage {i} but {int(samples[c])} "
            "at another: the test loaders must yield the same samples at every stage"
        )
    return samples


@dataclass(frozen=True, eq=False)
class ClassIncrementalResults:
    """The class-incremental record of a run: the per-stage confusion counts and the measures
    computed from them (see the module docstring). Build it with
    [`compute`][continual_eval.results.ClassIncrementalResults.compute]; NaN = undefined."""

    #: ``T`` tuples of class ids, each task's classes in the order given
    task_classes: tuple[tuple[int, ...], ...]
    #: ``[s, C, C]`` int64, a coalesced sparse COO tensor (its nonzero cells only): after stage
    #: ``i``, ``confusion[i, c, p]`` test samples of the seen class ``c`` predicted as class ``p``
    #: (task-agnostic predictions); ``stage_confusion(i)`` is one stage's dense ``[C, C]``
    confusion: Tensor
    #: ``"seen"``: predictions among the seen classes; ``"all"``: among all outputs
    prediction: str = "seen"
    #: the per-class forgetting convention (``"peak"`` or ``"chaudhry"``)
    forgetting: str = "peak"
    #: ``[C]`` int64: the test samples of each class (every stage's counts of a seen class)
    test_samples: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    #: ``[s, C]`` per-class accuracy (NaN: class not seen yet or no test sample)
    per_class_accuracy: Tensor = field(default_factory=lambda: torch.zeros(0, 0))
    #: ``"sample"``/``"task"`` -> ``[s]`` seen-class accuracy per stage
    seen_accuracy: dict[str, Tensor] = field(default_factory=dict)
    #: ``"sample"``/``"task"`` -> ``[s]`` accuracy on the old classes (tasks ``< i``)
    old_accuracy: dict[str, Tensor] = field(default_factory=dict)
    #: ``[s]`` accuracy on the new classes (task ``i``)
    new_accuracy: Tensor = field(default_factory=lambda: torch.zeros(0))
    #: ``[s]`` mean class accuracy over the seen classes
    mean_class_accuracy: Tensor = field(default_factory=lambda: torch.zeros(0))
    #: ``[s]`` mean of ``mean_class_accuracy`` over the stages ``<= i`` (its last value: AMCA)
    amca_per_stage: Tensor = field(default_factory=lambda: torch.zeros(0))
    #: ``[C]`` per-class forgetting after the final stage
    class_forgetting: Tensor = field(default_factory=lambda: torch.zeros(0))
    #: ``[s]`` the mean per-class forgetting after each stage (from the stages ``<= i``)
    mean_class_forgetting_per_stage: Tensor = field(default_factory=lambda: torch.zeros(0))
    #: ``[s]`` share of the seen test samples predicted as a class of task ``i``
    recency_prediction_share: Tensor = field(default_factory=lambda: torch.zeros(0))
    #: ``[s]`` task ``i``'s share of the seen test samples
    recency_sample_share: Tensor = field(default_factory=lambda: torch.zeros(0))
    #: ``s`` strings: `encode_confusion` of each stage (``confusion.stages``)
    confusion_text: tuple[str, ...] = ()

    # ------------------------------------------------------------------ views
    @property
    def num_stages(self) -> int:
        """``s``, the stages recorded."""
        return int(self.confusion.shape[0])

    @property
    def num_classes(self) -> int:
        """``C``, the class ids (the largest one + 1)."""
        return int(self.confusion.shape[-1])

    @property
    def num_tasks(self) -> int:
        return len(self.task_classes)

    @property
    def last_accuracy(self) -> dict[str, float]:
        """``"sample"``/``"task"`` -> the final stage's seen-class accuracy (NaN: none)."""
        return {w: _last(self.seen_accuracy[w]) for w in WEIGHTINGS}

    @property
    def average_incremental_accuracy(self) -> dict[str, float]:
        """``"sample"``/``"task"`` -> the mean over the stages of the seen-class accuracy."""
        return {w: _mean(self.seen_accuracy[w]) for w in WEIGHTINGS}

    @property
    def amca(self) -> float:
        """The average mean class accuracy (the mean of ``mean_class_accuracy`` over stages)."""
        return _last(self.amca_per_stage)

    @property
    def mean_class_forgetting(self) -> float:
        """The mean of ``class_forgetting`` over the classes where it is defined."""
        return _last(self.mean_class_forgetting_per_stage)

    def _known(self, checked: TaskClasses) -> ClassIncrementalResults:
        self.__dict__["checked"] = checked  # what compute() validated: no second check
        return self

    @cached_property
    def checked(self) -> TaskClasses:
        """`TaskClasses` of
        `task_classes` (class-to-task map, arrival order, task boundaries)."""
        return check_task_classes([list(c) for c in self.task_classes], self.num_classes)

    @property
    def class_order(self) -> list[int]:
        """The class ids in arrival order (task 0's as listed, then task 1's, ...)."""
        return self.checked.order.tolist()

    def stage_confusion(self, stage: int = -1) -> Tensor:
        """Stage ``stage``'s counts as a dense ``[C, C]`` int64 matrix (``C**2`` cells of 8
        bytes: one stage only)."""
        if not -self.num_stages <= stage < self.num_stages:
            raise IndexError(f"stage {stage} of {self.num_stages} recorded stages")
        return self.confusion[stage % self.num_stages].to_dense()

    def arrival_confusion(self, stage: int = -1) -> tuple[Tensor, Tensor]:
        """Stage ``stage``'s confusion counts (dense ``[C, C]``) with rows and columns in arrival
        order, and the task boundaries (offsets into that order); see
        `confusion_in_arrival_order`."""
        return confusion_in_arrival_order(self.stage_confusion(stage), self.checked)

    # ------------------------------------------------------------------ construction
    @classmethod
    def compute(
        cls,
        task_classes: Sequence[Sequence[int]],
        confusion: Tensor,
        *,
        prediction: str = "seen",
        forgetting: str = "peak",
        confusion_text: Sequence[str] | None = None,
        checked: TaskClasses | None = None,
        stage_counts: tuple[Tensor, Tensor, Tensor] | None = None,
    ) -> ClassIncrementalResults:
        """Every measure from the per-stage confusion counts ``confusion [s, C, C]``, dense or
        sparse COO (stage ``i`` = row ``i``; an all-zero matrix = a stage without counts), computed
        from its nonzero cells. ``confusion_text``: their `encode_confusion` strings when already
        known (a recorder encodes each stage once); ``checked``:
        [`check_task_classes`][continual_eval.functional.class_incremental.check_task_classes] of
        ``task_classes``
        over the ``C`` classes, when already made; ``stage_counts``: the sums of ``confusion``
        every measure reads, when already made (a recorder keeps them as each stage is recorded,
        so that the measures cost ``O(s * C)``, not a pass over every stored cell): per stage
        and class the correct predictions and the test samples (``[s, C]`` int64 each: the
        diagonal and the row sums), and per stage ``i`` the seen-class samples predicted as a
        class of task ``i`` (``[s]`` int64). They are taken as given (the counts' own check,
        >= 0, is then the caller's)."""
        if prediction not in PREDICTIONS:
            raise ValueError(f"prediction must be one of {PREDICTIONS}, got {prediction!r}")
        confusion = _as_sparse(confusion)
        if stage_counts is None and bool((confusion.values() < 0).any()):
            raise ValueError("confusion counts must be >= 0")
        s, C = confusion.shape[0], confusion.shape[-1]
        if checked is None or checked.num_classes != C:
            checked = check_task_classes([list(c) for c in task_classes], C)
        if confusion_text is None:
            confusion_text = _stage_texts(confusion)
        elif len(confusion_text) != s:
            raise ValueError(f"{len(confusion_text)} confusion strings for {s} stages")
        if stage_counts is None:
            stage_counts = sums_of_counts(confusion, checked.class_task)
        elif any(len(part) != s for part in stage_counts) or any(
            part.shape[1:] != (C,) for part in stage_counts[:2]
        ):
            raise ValueError(
                f"stage_counts must be ([{s}, {C}], [{s}, {C}], [{s}]), got "
                f"{[tuple(part.shape) for part in stage_counts]}"
            )
        measures, totals = _measures(*stage_counts, checked.class_task, forgetting)
        return cls(
            _class_lists(checked),
            confusion,
            prediction,
            forgetting,
            test_samples=_test_samples(totals, checked.class_task),
            confusion_text=tuple(confusion_text),
            **measures,
        )._known(checked)

    @classmethod
    def from_section(cls, section: ClassIncrementalSection) -> ClassIncrementalResults:
        """From a checked ``class_incremental`` section: the counts as recorded, the measures
        recomputed from them."""
        stages = list(section.confusion.stages)
        cells = [torch.from_numpy(confusion_cells(text)) for text in stages]
        confusion = sparse_confusion(cells, section.num_classes)
        return cls.compute(
            section.task_classes,
            confusion,
            prediction=section.prediction,
            forgetting=section.forgetting,
            confusion_text=stages,
        )

    # ------------------------------------------------------------------ output
    def to_section(self) -> ClassIncrementalSection:
        """The ``class_incremental`` section (``null`` for undefined values)."""

        def both(values: dict[str, Tensor]) -> dict[str, Any]:
            return {w: cells(values[w]) for w in WEIGHTINGS}

        return ClassIncrementalSection(
            task_classes=[list(c) for c in self.task_classes],
            num_classes=self.num_classes,
            test_samples=self.test_samples.tolist(),
            class_order=self.class_order,
            prediction=self.prediction,  # type: ignore[arg-type]
            forgetting=self.forgetting,
            confusion=ConfusionSection(
                encoding=CONFUSION_ENCODING, stages=list(self.confusion_text)
            ),
            per_class_accuracy=cells(self.per_class_accuracy),
            seen_accuracy=both(self.seen_accuracy),
            last_accuracy={w: present(v) for w, v in self.last_accuracy.items()},
            average_incremental_accuracy={
                w: present(v) for w, v in self.average_incremental_accuracy.items()
            },
            old_accuracy=both(self.old_accuracy),
            new_accuracy=cells(self.new_accuracy),
            mean_class_accuracy=cells(self.mean_class_accuracy),
            amca=present(self.amca),
            amca_per_stage=cells(self.amca_per_stage),
            class_forgetting=cells(self.class_forgetting),
            mean_class_forgetting=present(self.mean_class_forgetting),
            mean_class_forgetting_per_stage=cells(self.mean_class_forgetting_per_stage),
            recency_bias={
                "prediction_share": cells(self.recency_prediction_share),
                "sample_share": cells(self.recency_sample_share),
            },
            source=CLASS_IL_SOURCE,
        )

    def scalars(self, stage: int, prefix: str = "continual/") -> dict[str, float]:
        """The values of ``stage`` logged as ``{prefix}class_il/...`` (NaN left out):
        ``seen_acc_sample``, ``seen_acc_task``, ``old_acc`` (sample-weighted), ``new_acc``,
        ``amca`` (over the stages so far), ``recency_prediction_share``,
        ``recency_sample_share`` and ``class_forgetting`` (the mean per-class forgetting after
        that stage)."""
        if not 0 <= stage < self.num_stages:
            return {}
        values = {
            "seen_acc_sample": self.seen_accuracy["sample"][stage],
            "seen_acc_task": self.seen_accuracy["task"][stage],
            "old_acc": self.old_accuracy["sample"][stage],
            "new_acc": self.new_accuracy[stage],
            "amca": self.amca_per_stage[stage],
            "recency_prediction_share": self.recency_prediction_share[stage],
            "recency_sample_share": self.recency_sample_share[stage],
            "class_forgetting": self.mean_class_forgetting_per_stage[stage],
        }
        return {
            f"{prefix}class_il/{key}": float(value)
            for key, value in values.items()
            if present(value) is not None
        }

    def confusion_figure(self, stage: int = -1, *, title: str | None = None) -> Any:
        """The confusion matrix after ``stage`` in arrival order, task blocks marked (row-
        normalised: each true class's share of predictions), a matplotlib figure."""
        from continual_eval.plotting import plot_confusion_matrix

        stage = stage % self.num_stages
        fig, _ = plot_confusion_matrix(
            self.stage_confusion(stage),
            [list(c) for c in self.task_classes],
            title=title or f"task-agnostic confusion after stage {stage}",
        )
        return fig


def _stage_texts(confusion: Tensor) -> list[str]:
    """`encode_confusion` of every stage of a coalesced sparse ``[s, C, C]``, from its cells
    (row-major within a stage: the coalesced order)."""
    stage = confusion.indices()[0]
    cells = torch.cat([confusion.indices()[1:].T, confusion.values()[:, None]], 1)
    cells = cells[cells[:, 2] != 0]
    stage = stage[confusion.values() != 0]
    sizes = torch.bincount(stage, minlength=confusion.shape[0]).tolist()
    return [encode_cells(part) for part in torch.split(cells, sizes)]


def sums_of_counts(confusion: Tensor, class_task: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(correct [s, C], total [s, C], new_predictions [s])`` of a coalesced sparse
    ``[s, C, C]`` (see `ClassIncrementalResults.compute`'s ``stage_counts``): one pass over its
    stored cells."""
    correct, total = _sparse_counts(confusion)
    stages = torch.arange(confusion.shape[0]).unsqueeze(-1)
    return correct, total, _new_predictions(confusion, class_task, stages)


def _measures(
    correct: Tensor, total: Tensor, new_predictions: Tensor, class_task: Tensor, forgetting: str
) -> tuple[dict[str, Any], Tensor]:
    """Every measure of [`ClassIncrementalResults`][continual_eval.results.ClassIncrementalResults]
    from the per-stage sums of the counts (`sums_of_counts`; the functional layer's own
    count-based steps, so the values equal its functions' on the confusion counts), and the
    per-stage row sums ``[s, C]``."""
    s, C = total.shape
    empty = torch.zeros(0, dtype=torch.float64)
    if s == 0:
        return {
            "per_class_accuracy": torch.zeros(0, C, dtype=torch.float64),
            "seen_accuracy": dict.fromkeys(WEIGHTINGS, empty),
            "old_accuracy": dict.fromkeys(WEIGHTINGS, empty),
            "class_forgetting": torch.full((C,), math.nan, dtype=torch.float64),
            **dict.fromkeys(_PER_STAGE, empty),
        }, total
    stages = torch.arange(s).unsqueeze(-1)  # [s, 1]
    accuracy = _class_accuracy(correct, total, class_task, stages)
    mca = torch.nanmean(accuracy, dim=-1)  # mean_class_accuracy, from the accuracy made once
    bias = _recency_from_counts(total, new_predictions, class_task, stages)

    def group(member: Any, weighting: str) -> Tensor:
        return _group_accuracy(correct, total, class_task, member, weighting)

    return {
        "per_class_accuracy": accuracy,
        "seen_accuracy": {w: group(lambda t: t <= stages, w) for w in WEIGHTINGS},
        "old_accuracy": {w: group(lambda t: t < stages, w) for w in WEIGHTINGS},
        "new_accuracy": group(lambda t: t == stages, "sample"),
        "mean_class_accuracy": mca,
        "amca_per_stage": _running_mean(mca),
        "class_forgetting": per_class_forgetting(accuracy, convention=forgetting),
        "mean_class_forgetting_per_stage": _mean_class_forgetting_per_stage(
            accuracy, convention=forgetting
        ),
        "recency_prediction_share": bias.prediction_share,
        "recency_sample_share": bias.sample_share,
    }, total


_PER_STAGE = (
    "new_accuracy",
    "mean_class_accuracy",
    "amca_per_stage",
    "mean_class_forgetting_per_stage",
    "recency_prediction_share",
    "recency_sample_share",
)


def _last(values: Tensor) -> float:
    return float(values[-1]) if len(values) else math.nan


def _mean(values: Tensor) -> float:
    return float(values.double().mean()) if len(values) else math.nan


def class_incremental_scalars(results: Any, stage: int, prefix: str) -> dict[str, float]:
    """[`ClassIncrementalResults.scalars`][continual_eval.results.ClassIncrementalResults.scalars]
    of ``results.class_incremental`` (``{}`` when the results have no such section)."""
    section = getattr(results, "class_incremental", None)
    return {} if section is None else section.scalars(stage, prefix)

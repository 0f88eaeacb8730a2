r"""The ``class_incremental`` section of ``results.json``: :class:`ClassIncrementalResults`.

What ``ContinualEvalCallback(task_classes=...)`` records besides its two matrices
``acc_task_aware`` and ``acc_task_agnostic``: after every stage ``i`` the confusion counts of the
task-agnostic predictions on the test samples of the seen tasks ``j <= i`` (true class by
predicted class, ``[C, C]`` integers, summed exactly across ranks), and everything the
class-incremental literature computes from them
(:mod:`continual_eval.functional.class_incremental`):

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

Undefined values are NaN here and ``null`` in the file. The section stores the counts and the
measures; :meth:`ClassIncrementalResults.from_dict` recomputes the measures from the stored counts
(the counts are the record, the measures a pure function of them).

Confusion encoding (``confusion.stages``): one string per stage holding the nonzero cells of that
stage's matrix as space-separated ``true:predicted:count`` triples of decimal integers (class ids
and the count), in row-major order (by true class, then predicted class), e.g.
``"0:0:181 0:3:2 1:1:176"``. Integer counts, exact; a string per stage keeps ``results.json``
small and quick to write (one JSON value per stage instead of three per cell). A stage without
counts (recorded by a version that did not count them, e.g. resumed from an older checkpoint) is
the empty string and its measures are null. :func:`encode_confusion` and
:func:`decode_confusion` convert.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from continual_eval.functional.class_incremental import (
    TaskClasses,
    check_task_classes,
    confusion_in_arrival_order,
    mean_class_accuracy,
    mean_class_forgetting,
    old_new_accuracy,
    per_class_accuracy,
    per_class_forgetting,
    recency_bias,
    seen_accuracy,
)

__all__ = [
    "CLASS_IL_SOURCE",
    "CONFUSION_ENCODING",
    "PREDICTIONS",
    "ClassIncrementalResults",
    "class_incremental_scalars",
    "decode_confusion",
    "encode_confusion",
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
#: outputs
PREDICTIONS = ("seen", "all")
WEIGHTINGS = ("sample", "task")


def _present(value: Tensor | float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _cells(values: Any) -> Any:
    if isinstance(values, list):
        return [_cells(v) for v in values]
    return values if math.isfinite(values) else None


def _list(t: Tensor) -> Any:
    """Nested lists of floats, ``None`` for NaN/inf."""
    return _cells(t.detach().to("cpu", torch.float64).tolist())


def _nan() -> Tensor:
    return torch.tensor(math.nan, dtype=torch.float64)


def _running_mean(values: Tensor) -> Tensor:
    counts = torch.arange(1, len(values) + 1, dtype=torch.float64)
    return torch.cumsum(values, 0) / counts


def encode_confusion(matrix: Tensor) -> str:
    """One ``[C, C]`` integer matrix as ``"true:predicted:count ..."`` over its nonzero cells,
    row-major (see the module docstring)."""
    cells = matrix.nonzero()
    counts = matrix[cells[:, 0], cells[:, 1]]
    flat = torch.cat([cells, counts[:, None].to(cells.dtype)], 1).flatten().tolist()
    return " ".join(["%d:%d:%d"] * len(cells)) % tuple(flat)


def decode_confusion(text: str, num_classes: int) -> Tensor:
    """The ``[C, C]`` int64 matrix of :func:`encode_confusion`'s text (cells added up)."""
    matrix = torch.zeros(num_classes, num_classes, dtype=torch.int64)
    numbers = text.replace(":", " ").split()
    if numbers:
        values = torch.tensor([int(v) for v in numbers], dtype=torch.int64).reshape(-1, 3)
        matrix.index_put_((values[:, 0], values[:, 1]), values[:, 2], accumulate=True)
    return matrix


def _class_lists(task_classes: TaskClasses) -> tuple[tuple[int, ...], ...]:
    order, bounds = task_classes.order.tolist(), task_classes.boundaries.tolist()
    return tuple(tuple(order[bounds[j] : bounds[j + 1]]) for j in range(task_classes.num_tasks))


@dataclass(frozen=True, eq=False)
class ClassIncrementalResults:
    """The class-incremental record of a run: the per-stage confusion counts and the measures
    computed from them (see the module docstring). Build it with :meth:`compute`; NaN =
    undefined."""

    #: ``T`` tuples of class ids, each task's classes in the order given
    task_classes: tuple[tuple[int, ...], ...]
    #: ``[s, C, C]`` int64: after stage ``i``, ``confusion[i, c, p]`` test samples of the seen
    #: class ``c`` predicted as class ``p`` (task-agnostic predictions)
    confusion: Tensor
    #: ``"seen"``: predictions among the seen classes; ``"all"``: among all outputs
    prediction: str = "seen"
    #: the per-class forgetting convention (``"peak"`` or ``"chaudhry"``)
    forgetting: str = "peak"
    #: ``[s, C]`` per-class accuracy (NaN: class not seen yet or no test sample)
    per_class_accuracy: Tensor = field(default_factory=lambda: torch.zeros(0, 0))
    #: ``"sample"``/``"task"`` -> ``[s]`` seen-class accuracy per stage
    seen_accuracy: dict[str, Tensor] = field(default_factory=dict)
    #: ``"sample"``/``"task"`` -> the final stage's seen-class accuracy
    last_accuracy: dict[str, float] = field(default_factory=dict)
    #: ``"sample"``/``"task"`` -> the mean over stages of the seen-class accuracy
    average_incremental_accuracy: dict[str, float] = field(default_factory=dict)
    #: ``"sample"``/``"task"`` -> ``[s]`` accuracy on the old classes (tasks ``< i``)
    old_accuracy: dict[str, Tensor] = field(default_factory=dict)
    #: ``[s]`` accuracy on the new classes (task ``i``)
    new_accuracy: Tensor = field(default_factory=lambda: torch.zeros(0))
    #: ``[s]`` mean class accuracy over the seen classes
    mean_class_accuracy: Tensor = field(default_factory=lambda: torch.zeros(0))
    #: the average mean class accuracy (mean of ``mean_class_accuracy`` over the stages)
    amca: float = math.nan
    #: ``[s]`` AMCA over the stages ``<= i``
    amca_per_stage: Tensor = field(default_factory=lambda: torch.zeros(0))
    #: ``[C]`` per-class forgetting after the final stage
    class_forgetting: Tensor = field(default_factory=lambda: torch.zeros(0))
    #: the mean of ``class_forgetting`` over the classes where it is defined
    mean_class_forgetting: float = math.nan
    #: ``[s]`` the mean per-class forgetting after each stage (from the stages ``<= i``)
    mean_class_forgetting_per_stage: Tensor = field(default_factory=lambda: torch.zeros(0))
    #: ``[s]`` share of the seen test samples predicted as a class of task ``i``
    recency_prediction_share: Tensor = field(default_factory=lambda: torch.zeros(0))
    #: ``[s]`` task ``i``'s share of the seen test samples
    recency_sample_share: Tensor = field(default_factory=lambda: torch.zeros(0))
    #: ``s`` strings: :func:`encode_confusion` of each stage (``confusion.stages``)
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

    def _known(self, checked: TaskClasses) -> ClassIncrementalResults:
        self.__dict__["checked"] = checked  # what compute() validated: no second check
        return self

    @cached_property
    def checked(self) -> TaskClasses:
        """:class:`~continual_eval.functional.class_incremental.TaskClasses` of
        :attr:`task_classes` (class-to-task map, arrival order, task boundaries)."""
        return check_task_classes([list(c) for c in self.task_classes], self.num_classes)

    @property
    def class_order(self) -> list[int]:
        """The class ids in arrival order (task 0's as listed, then task 1's, ...)."""
        return self.checked.order.tolist()

    def arrival_confusion(self, stage: int = -1) -> tuple[Tensor, Tensor]:
        """Stage ``stage``'s confusion counts with rows and columns in arrival order, and the task
        boundaries (offsets into that order); see
        :func:`~continual_eval.functional.class_incremental.confusion_in_arrival_order`."""
        return confusion_in_arrival_order(self.confusion[stage], self.checked)

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
    ) -> ClassIncrementalResults:
        """Every measure from the per-stage confusion counts ``confusion [s, C, C]`` (stage ``i``
        = row ``i``; an all-zero matrix = a stage without counts). ``confusion_text``: their
        :func:`encode_confusion` strings when already known (a recorder encodes each stage
        once); ``checked``: :func:`check_task_classes` of ``task_classes`` over the ``C``
        classes, when already made."""
        if prediction not in PREDICTIONS:
            raise ValueError(f"prediction must be one of {PREDICTIONS}, got {prediction!r}")
        confusion = torch.as_tensor(confusion).detach().to("cpu", torch.int64)
        if confusion.ndim != 3 or confusion.shape[1] != confusion.shape[2]:
            raise ValueError(f"confusion must be [s, C, C], got {tuple(confusion.shape)}")
        if checked is None or checked.num_classes != confusion.shape[-1]:
            checked = check_task_classes([list(c) for c in task_classes], confusion.shape[-1])
        lists = _class_lists(checked)
        s, C = confusion.shape[0], confusion.shape[-1]
        class_task = checked.class_task
        if confusion_text is None:
            text = tuple(encode_confusion(matrix) for matrix in confusion)
        elif len(confusion_text) != s:
            raise ValueError(f"{len(confusion_text)} confusion strings for {s} stages")
        else:
            text = tuple(confusion_text)
        if s == 0:
            empty = torch.zeros(0, dtype=torch.float64)
            return cls(
                lists,
                confusion,
                prediction,
                forgetting,
                per_class_accuracy=torch.zeros(0, C, dtype=torch.float64),
                seen_accuracy={w: empty for w in WEIGHTINGS},
                last_accuracy=dict.fromkeys(WEIGHTINGS, math.nan),
                average_incremental_accuracy=dict.fromkeys(WEIGHTINGS, math.nan),
                old_accuracy={w: empty for w in WEIGHTINGS},
                new_accuracy=empty,
                mean_class_accuracy=empty,
                amca_per_stage=empty,
                class_forgetting=torch.full((C,), math.nan, dtype=torch.float64),
                mean_class_forgetting_per_stage=empty,
                recency_prediction_share=empty,
                recency_sample_share=empty,
                confusion_text=text,
            )._known(checked)
        if bool((confusion < 0).any()):
            raise ValueError("confusion counts must be >= 0")
        options = {"validate": False}  # checked once here
        accuracy = per_class_accuracy(confusion, class_task, **options)
        seen = {w: seen_accuracy(confusion, class_task, weighting=w, **options) for w in WEIGHTINGS}
        old = {
            w: old_new_accuracy(confusion, class_task, weighting=w, validate=False).old
            for w in WEIGHTINGS
        }
        new = old_new_accuracy(confusion, class_task, validate=False).new
        mca = mean_class_accuracy(confusion, class_task, **options)
        amca_curve = _running_mean(mca)
        forgetting_curve = torch.stack(
            [
                mean_class_forgetting(accuracy[: i + 1], convention=forgetting) if i else _nan()
                for i in range(s)
            ]
        ).double()
        bias = recency_bias(confusion, class_task, **options)
        return cls(
            lists,
            confusion,
            prediction,
            forgetting,
            per_class_accuracy=accuracy,
            seen_accuracy=seen,
            last_accuracy={w: float(seen[w][-1]) for w in WEIGHTINGS},
            average_incremental_accuracy={w: float(seen[w].mean()) for w in WEIGHTINGS},
            old_accuracy=old,
            new_accuracy=new,
            mean_class_accuracy=mca,
            amca=float(amca_curve[-1]),
            amca_per_stage=amca_curve,
            class_forgetting=per_class_forgetting(accuracy, convention=forgetting),
            mean_class_forgetting=float(forgetting_curve[-1]),
            mean_class_forgetting_per_stage=forgetting_curve,
            recency_prediction_share=bias.prediction_share,
            recency_sample_share=bias.sample_share,
            confusion_text=text,
        )._known(checked)

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> ClassIncrementalResults:
        """From a document's ``class_incremental`` section (validated by
        :func:`~continual_eval.results_schema.validate_results`): the counts as recorded, the
        measures recomputed from them."""
        task_classes = [list(c) for c in section["task_classes"]]
        C = int(section["num_classes"])
        stages = [str(text) for text in section["confusion"]["stages"]]
        confusion = torch.zeros(len(stages), C, C, dtype=torch.int64)
        for i, text in enumerate(stages):
            confusion[i] = decode_confusion(text, C)
        return cls.compute(
            task_classes,
            confusion,
            prediction=str(section.get("prediction", "seen")),
            forgetting=str(section.get("forgetting", "peak")),
            confusion_text=stages,
        )

    # ------------------------------------------------------------------ output
    def to_dict(self) -> dict[str, Any]:
        """The ``class_incremental`` section (``None`` for undefined values)."""
        both = {w: _list(self.seen_accuracy[w]) for w in WEIGHTINGS}
        return {
            "task_classes": [list(c) for c in self.task_classes],
            "num_classes": self.num_classes,
            "class_order": self.class_order,
            "prediction": self.prediction,
            "forgetting": self.forgetting,
            "confusion": {"encoding": CONFUSION_ENCODING, "stages": list(self.confusion_text)},
            "per_class_accuracy": _list(self.per_class_accuracy) if self.num_stages else [],
            "seen_accuracy": both,
            "last_accuracy": {w: _present(self.last_accuracy[w]) for w in WEIGHTINGS},
            "average_incremental_accuracy": {
                w: _present(self.average_incremental_accuracy[w]) for w in WEIGHTINGS
            },
            "old_accuracy": {w: _list(self.old_accuracy[w]) for w in WEIGHTINGS},
            "new_accuracy": _list(self.new_accuracy),
            "mean_class_accuracy": _list(self.mean_class_accuracy),
            "amca": _present(self.amca),
            "amca_per_stage": _list(self.amca_per_stage),
            "class_forgetting": _list(self.class_forgetting),
            "mean_class_forgetting": _present(self.mean_class_forgetting),
            "mean_class_forgetting_per_stage": _list(self.mean_class_forgetting_per_stage),
            "recency_bias": {
                "prediction_share": _list(self.recency_prediction_share),
                "sample_share": _list(self.recency_sample_share),
            },
            "source": CLASS_IL_SOURCE,
        }

    def scalars(self, stage: int, prefix: str = "continual/") -> dict[str, float]:
        """The values of ``stage`` logged as ``{prefix}class_il/...`` (NaN left out):
        ``seen_acc_sample``, ``seen_acc_task``, ``old_acc`` (sample-weighted), ``new_acc``,
        ``amca`` (over the stages so far), ``recency_prediction_share``,
        ``recency_sample_share`` and ``class_forgetting`` (the mean per-class forgetting after
        that stage)."""
        if not 0 <= stage < self.num_stages:
            return {}
        base = f"{prefix}class_il/"
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
            f"{base}{key}": float(value)
            for key, value in values.items()
            if _present(value) is not None
        }

    def confusion_figure(self, stage: int = -1, *, title: str | None = None) -> Any:
        """The confusion matrix after ``stage`` in arrival order, task blocks marked (row-
        normalised: each true class's share of predictions), a matplotlib figure."""
        from continual_eval.plotting import plot_confusion_matrix

        stage = stage % self.num_stages
        fig, _ = plot_confusion_matrix(
            self.confusion[stage],
            [list(c) for c in self.task_classes],
            title=title or f"task-agnostic confusion after stage {stage}",
        )
        return fig


def class_incremental_scalars(results: Any, stage: int, prefix: str) -> dict[str, float]:
    """:meth:`ClassIncrementalResults.scalars` of ``results.class_incremental`` (``{}`` when the
    results have no such section)."""
    section = getattr(results, "class_incremental", None)
    return {} if section is None else section.scalars(stage, prefix)

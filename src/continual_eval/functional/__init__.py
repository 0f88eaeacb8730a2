"""Pure tensor functions of the accuracy matrix ``R[i, j]`` and the untrained baseline ``b[j]``.

Nothing here keeps state or modifies its inputs; every function takes ``validate`` to skip the
value checks (which read back from the device) in hot loops. Every accuracy-matrix function takes
``higher_is_better`` (``False`` for a loss: transfer and forgetting keep their meaning) and
``bounds`` (the validation range, `UNIT_BOUNDS` by default, ``None`` for unbounded); the
stability functions take ``higher_is_better``.
"""

from continual_eval.functional._validation import (
    FORGETTING_CONVENTIONS,
    UNIT_BOUNDS,
    check_scores,
)
from continual_eval.functional._workspace import (
    used_cells,
)
from continual_eval.functional.accuracy_matrix import (
    FWT_CONVENTIONS,
    average_accuracy,
    average_incremental_accuracy,
    backward_transfer,
    backward_transfer_per_task,
    continual_metrics,
    forgetting,
    forgetting_per_task,
    forward_transfer,
    forward_transfer_per_task,
    intransigence,
    intransigence_per_task,
    learning_accuracy,
)
from continual_eval.functional.class_incremental import (
    SEEN_WEIGHTINGS,
    OldNewAccuracy,
    RecencyBias,
    TaskClasses,
    average_incremental_seen_accuracy,
    average_mean_class_accuracy,
    check_task_classes,
    confusion_counts,
    confusion_in_arrival_order,
    last_accuracy,
    mean_class_accuracy,
    mean_class_forgetting,
    old_new_accuracy,
    per_class_accuracy,
    per_class_forgetting,
    per_task_accuracy,
    recency_bias,
    seen_accuracy,
    task_agnostic_predictions,
    task_aware_predictions,
)
from continual_eval.functional.curves import (
    CURVE_KEYS,
    all_continual_metrics,
    continual_metrics_curve,
    running_peak,
)
from continual_eval.functional.intervals import (
    BootstrapIntervals,
    CellIntervals,
    IntervalTensors,
    PackedBits,
    cell_intervals,
    pack_bits,
    paired_bootstrap,
    resample_weights,
    student_t_interval,
    unpack_bits,
    wilson_interval,
)
from continual_eval.functional.items import (
    ItemTransitions,
    forgetting_events,
    item_transitions,
)
from continual_eval.functional.plasticity import (
    anytime_accuracy,
    auc_forward_transfer,
    auc_forward_transfer_per_task,
    learning_curve,
    learning_curve_area,
    seen_task_accuracy,
    stage_auc,
    stage_start_accuracy,
)
from continual_eval.functional.stability import (
    boundary_indices,
    min_accuracy,
    stability_gap,
    stage_minima,
    worst_case_accuracy,
)

#: what the functional layer promises (the metric functions); the constants, result tuples and
#: helpers it imports stay importable from their modules without a promise
# the promised API (docs/compatibility.md): other names here are importable, not promised
__all__ = [
    "FORGETTING_CONVENTIONS",
    "all_continual_metrics",
    "anytime_accuracy",
    "auc_forward_transfer",
    "auc_forward_transfer_per_task",
    "average_accuracy",
    "average_incremental_accuracy",
    "backward_transfer",
    "backward_transfer_per_task",
    "cell_intervals",
    "confusion_counts",
    "continual_metrics",
    "continual_metrics_curve",
    "forgetting",
    "forgetting_events",
    "forgetting_per_task",
    "forward_transfer",
    "forward_transfer_per_task",
    "intransigence",
    "intransigence_per_task",
    "item_transitions",
    "last_accuracy",
    "learning_accuracy",
    "learning_curve",
    "learning_curve_area",
    "mean_class_accuracy",
    "min_accuracy",
    "paired_bootstrap",
    "stability_gap",
    "stage_auc",
    "stage_start_accuracy",
    "worst_case_accuracy",
]

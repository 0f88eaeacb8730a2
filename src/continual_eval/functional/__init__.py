"""Pure tensor functions of the accuracy matrix ``R[i, j]`` and the untrained baseline ``b[j]``.

Nothing here keeps state or modifies its inputs; every function takes ``validate`` to skip the
value checks (which read back from the device) in hot loops. Every accuracy-matrix function takes
``higher_is_better`` (``False`` for a loss: transfer and forgetting keep their meaning) and
``bounds`` (the validation range, :data:`UNIT_BOUNDS` by default, ``None`` for unbounded); the
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
from continual_eval.functional.curves import (
    CURVE_KEYS,
    all_continual_metrics,
    continual_metrics_curve,
    running_peak,
)
from continual_eval.functional.stability import (
    boundary_indices,
    min_accuracy,
    stability_gap,
    stage_minima,
    worst_case_accuracy,
)

__all__ = [
    "CURVE_KEYS",
    "FORGETTING_CONVENTIONS",
    "FWT_CONVENTIONS",
    "UNIT_BOUNDS",
    "all_continual_metrics",
    "average_accuracy",
    "average_incremental_accuracy",
    "backward_transfer",
    "backward_transfer_per_task",
    "boundary_indices",
    "check_scores",
    "continual_metrics",
    "continual_metrics_curve",
    "forgetting",
    "forgetting_per_task",
    "forward_transfer",
    "forward_transfer_per_task",
    "intransigence",
    "intransigence_per_task",
    "learning_accuracy",
    "min_accuracy",
    "running_peak",
    "stability_gap",
    "stage_minima",
    "used_cells",
    "worst_case_accuracy",
]

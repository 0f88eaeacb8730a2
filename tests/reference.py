"""Plain-loop reference implementations of the accuracy-matrix metrics, written from the formulas
(seed 000 section 2, Chaudhry et al. 2018, Rebuffi et al. 2017) with Python floats only: the
independent oracle the vectorised library is tested against.

``higher_is_better=False`` is written out from the lower-is-better formulas themselves (``min``
for the best value, reversed differences), not by negating the input, so that it checks the
library's negation trick rather than repeating it."""

from __future__ import annotations


def reference_metrics(
    R: list[list[float]], b: list[float], forgetting: str = "peak", higher_is_better: bool = True
) -> dict:
    """ACC, BWT, FWT and forgetting of the square matrix ``R`` by explicit loops."""
    T = len(R)
    if T == 1:
        return {"acc": R[0][0], "bwt": 0.0, "fwt": 0.0, "forgetting": 0.0}
    acc = sum(R[T - 1][j] for j in range(T)) / T
    last_peak_stage = T - 1 if forgetting == "peak" else T - 2
    drops = []
    if higher_is_better:
        bwt = sum(R[T - 1][j] - R[j][j] for j in range(T - 1)) / (T - 1)
        fwt = sum(R[j - 1][j] - b[j] for j in range(1, T)) / (T - 1)
        for j in range(T - 1):
            peak = max(R[i][j] for i in range(j, last_peak_stage + 1))
            drops.append(peak - R[T - 1][j])
    else:  # a loss: improvement is a decrease, the best value reached is the lowest
        bwt = sum(R[j][j] - R[T - 1][j] for j in range(T - 1)) / (T - 1)
        fwt = sum(b[j] - R[j - 1][j] for j in range(1, T)) / (T - 1)
        for j in range(T - 1):
            lowest = min(R[i][j] for i in range(j, last_peak_stage + 1))
            drops.append(R[T - 1][j] - lowest)
    return {"acc": acc, "bwt": bwt, "fwt": fwt, "forgetting": sum(drops) / (T - 1)}


def reference_curve(
    R: list[list[float]], b: list[float], forgetting: str = "peak", higher_is_better: bool = True
) -> dict:
    """Every metric after every stage: the reference metrics of each leading sub-matrix."""
    T = len(R)
    curve: dict[str, list[float]] = {}
    for s in range(T):
        sub = [row[: s + 1] for row in R[: s + 1]]
        for key, value in reference_metrics(sub, b[: s + 1], forgetting, higher_is_better).items():
            curve.setdefault(key, []).append(value)
        curve.setdefault("learning_accuracy", []).append(
            sum(R[j][j] for j in range(s + 1)) / (s + 1)
        )
    aia = []
    for s in range(T):
        aia.append(sum(curve["acc"][: s + 1]) / (s + 1))
    curve["average_incremental_accuracy"] = aia
    return curve


def reference_per_task(
    R: list[list[float]],
    b: list[float],
    reference: list[float],
    forgetting: str = "peak",
    higher_is_better: bool = True,
) -> dict:
    """Per-task BWT ``[T-1]``, FWT ``[T-1]``, forgetting ``[T-1]`` and intransigence ``[T]``."""
    T = len(R)
    last = T - 1
    peak_end = last if forgetting == "peak" else last - 1
    if higher_is_better:
        return {
            "bwt": [R[last][j] - R[j][j] for j in range(last)],
            "fwt": [R[j - 1][j] - b[j] for j in range(1, T)],
            "forgetting": [
                max(R[i][j] for i in range(j, peak_end + 1)) - R[last][j] for j in range(last)
            ],
            "intransigence": [reference[j] - R[j][j] for j in range(T)],
        }
    return {
        "bwt": [R[j][j] - R[last][j] for j in range(last)],
        "fwt": [b[j] - R[j - 1][j] for j in range(1, T)],
        "forgetting": [
            R[last][j] - min(R[i][j] for i in range(j, peak_end + 1)) for j in range(last)
        ],
        "intransigence": [R[j][j] - reference[j] for j in range(T)],
    }

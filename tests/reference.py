"""Plain-loop reference implementations of the accuracy-matrix metrics, written from the formulas
(seed 000 section 2, Chaudhry et al. 2018, Rebuffi et al. 2017) with Python floats only: the
independent oracle the vectorised library is tested against."""

from __future__ import annotations


def reference_metrics(R: list[list[float]], b: list[float], forgetting: str = "peak") -> dict:
    """ACC, BWT, FWT and forgetting of the square matrix ``R`` by explicit loops."""
    T = len(R)
    if T == 1:
        return {"acc": R[0][0], "bwt": 0.0, "fwt": 0.0, "forgetting": 0.0}
    acc = sum(R[T - 1][j] for j in range(T)) / T
    bwt = sum(R[T - 1][j] - R[j][j] for j in range(T - 1)) / (T - 1)
    fwt = sum(R[j - 1][j] - b[j] for j in range(1, T)) / (T - 1)
    last_peak_stage = T - 1 if forgetting == "peak" else T - 2
    drops = []
    for j in range(T - 1):
        peak = max(R[i][j] for i in range(j, last_peak_stage + 1))
        drops.append(peak - R[T - 1][j])
    return {"acc": acc, "bwt": bwt, "fwt": fwt, "forgetting": sum(drops) / (T - 1)}


def reference_curve(R: list[list[float]], b: list[float], forgetting: str = "peak") -> dict:
    """Every metric after every stage: the reference metrics of each leading sub-matrix."""
    T = len(R)
    curve: dict[str, list[float]] = {}
    for s in range(T):
        sub = [row[: s + 1] for row in R[: s + 1]]
        for key, value in reference_metrics(sub, b[: s + 1], forgetting).items():
            curve.setdefault(key, []).append(value)
        curve.setdefault("learning_accuracy", []).append(
            sum(R[j][j] for j in range(s + 1)) / (s + 1)
        )
    aia = []
    for s in range(T):
        aia.append(sum(curve["acc"][: s + 1]) / (s + 1))
    curve["average_incremental_accuracy"] = aia
    return curve

"""Float64 arithmetic that overflows only where the true value does.

Rewards are any finite float64, up to ``±1.8e308``. Sums, running means and squared deviations
of such values overflow to ``inf`` (and ``inf - inf`` to NaN, which the metrics would read as
*absent*) although most of the quantities they feed, a mean for one, are representable. So
large values are first divided by a power of two (exact: only the exponent changes) that brings
the largest magnitude to at most `SAFE_MAGNITUDE`, and each result is multiplied back by
that power once per reward unit it carries (a mean once, a variance twice). A result then is
``±inf`` only when its true value lies beyond float64's range; magnitudes at or below
`SAFE_MAGNITUDE` are never rescaled, so ordinary traces give the same bits as without it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["SAFE_MAGNITUDE", "mean", "power_of_two_scale", "sample_std", "unscale"]

#: the largest magnitude computed with as it is: 2**400, so that squares (2**800) summed over up
#: to 2**63 steps (2**863) stay inside float64 (2**1024)
SAFE_MAGNITUDE = 2.0**400


def power_of_two_scale(*arrays: np.ndarray | Sequence[float] | float | None) -> float:
    """``2**k`` (``k >= 0``) with ``max |x| / 2**k <= SAFE_MAGNITUDE`` over the finite entries
    of ``arrays`` (``None`` and NaN entries skipped); ``1.0`` when no entry exceeds it."""
    top = 0.0
    for values in arrays:
        if values is None:
            continue
        a = np.asarray(values, dtype=np.float64).reshape(-1)
        if a.size:  # fmax/fmin skip NaN; no copy of the array
            high, low = np.fmax.reduce(a), np.fmin.reduce(a)
            top = max([top, *(abs(float(v)) for v in (high, low) if math.isfinite(v))])
    if top <= SAFE_MAGNITUDE:
        return 1.0
    return math.ldexp(1.0, math.frexp(top)[1] - math.frexp(SAFE_MAGNITUDE)[1] + 1)


def unscale(value: np.ndarray, scale: float, degree: int) -> np.ndarray:
    """``value * scale**degree``, one multiplication at a time (``scale**2`` alone may overflow
    where the product does not)."""
    if scale == 1.0:
        return value
    with np.errstate(over="ignore"):  # beyond float64: inf, the true value's rounding
        for _ in range(degree):
            value = value * scale
    return value


def mean(values: Sequence[float]) -> float:
    """The mean of ``values`` (non-empty): ``fsum / n``, or ``fsum(v / n)`` where the sum
    overflows although the mean does not; ``±inf``/NaN as IEEE arithmetic gives for non-finite
    values (``inf`` and ``-inf`` together: NaN)."""
    n = len(values)
    if not all(map(math.isfinite, values)):
        return float(sum(v for v in values if not math.isfinite(v)))
    try:
        return math.fsum(values) / n
    except OverflowError:
        return math.fsum(v / n for v in values)


def sample_std(values: Sequence[float], center: float) -> float:
    """The sample standard deviation (``ddof = 1``, ``len(values) >= 2``) about ``center``,
    computed on values divided by a power of two when large, so it is ``inf`` only when the true
    value is; NaN when a value (or ``center``) is not finite."""
    if not (math.isfinite(center) and all(map(math.isfinite, values))):
        return math.nan
    scale = power_of_two_scale(values)
    c = center / scale
    ss = math.fsum((v / scale - c) ** 2 for v in values)
    return math.sqrt(ss / (len(values) - 1)) * scale

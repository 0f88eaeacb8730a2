"""Configuration intervals: maximal runs of one regime label.

Runs are segmented by the regime label and by nothing else. Interval ``j`` covers trace positions
``start[j] <= t < stop[j]``; interval 0 is the run's first and is not preceded by a shift.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Intervals", "configuration_intervals", "running_means", "tail_lengths"]


@dataclass(frozen=True)
class Intervals:
    """Configuration intervals of one trace, as parallel arrays (one entry per interval)."""

    start: np.ndarray  # int64, first position of the interval
    stop: np.ndarray  # int64, one past the last position
    code: np.ndarray  # int64, the interval's regime code

    @property
    def length(self) -> np.ndarray:
        """``|T_k|`` of every interval."""
        return self.stop - self.start

    def __len__(self) -> int:
        return len(self.start)

    def index_of_position(self) -> np.ndarray:
        """For every trace position, the index of the interval holding it."""
        return np.repeat(np.arange(len(self)), self.length)

    def position_in_interval(self) -> np.ndarray:
        """For every trace position, ``tau`` = 1-based position within its interval."""
        n = int(self.stop[-1])
        return np.arange(1, n + 1) - np.repeat(self.start, self.length)


def configuration_intervals(regime_code: np.ndarray) -> Intervals:
    """Split a sequence of regime codes into maximal constant runs."""
    code = np.asarray(regime_code)
    if code.size == 0:
        raise ValueError("no steps: a trace without steps has no configuration intervals")
    change = np.flatnonzero(code[1:] != code[:-1]) + 1
    start = np.concatenate(([0], change)).astype(np.int64)
    stop = np.concatenate((change, [code.size])).astype(np.int64)
    return Intervals(start=start, stop=stop, code=code[start].astype(np.int64))


def running_means(reward: np.ndarray, intervals: Intervals) -> np.ndarray:
    """``bar r_tau = (1/tau) * sum_{i<=tau} r_i`` within each interval, for every position."""
    csum = np.concatenate(([0.0], np.cumsum(reward, dtype=np.float64)))
    base = np.repeat(csum[intervals.start], intervals.length)
    return (csum[1:] - base) / intervals.position_in_interval()


def tail_lengths(length: np.ndarray, fraction: float) -> np.ndarray:
    """``ceil(fraction * L)`` computed exactly (``fraction`` read as its shortest decimal).

    Exact arithmetic matters: in floating point ``0.2 * 15`` is ``3.0000000000000004``, whose
    ceiling is 4, not 3.
    """
    from fractions import Fraction

    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"tail fraction must lie in (0, 1], got {fraction}")
    frac = Fraction(repr(float(fraction)))
    num, den = frac.numerator, frac.denominator
    length = np.asarray(length, dtype=np.int64)
    return np.maximum((length * num + den - 1) // den, 1)

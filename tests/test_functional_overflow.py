"""Issue 19 item 7: finite scores whose metrics do not fit the dtype (``bounds=None``).

A difference beyond the dtype (``1e308 - (-1e308)``) is a ``ValueError`` naming the metric, the
task (and stage) and the cells, from every function that computes it, never a silent ``inf``
(results.json would store ``null``). A sum that overflows although the metric is representable
(the mean of ``1e308`` and ``1e308``) gives the exact value: checked against plain-loop
definitions in exact rational arithmetic.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

import pytest
import torch

import continual_eval.functional as F

BIG = 1e308
nan = math.nan


def matrix(rows, dtype=torch.float64):
    return torch.tensor(rows, dtype=dtype)


def every_function(R, b, ref=None, **kwargs):
    """Each public function of the family that reads the cells (``kwargs``: direction)."""
    opts = {"bounds": None, **kwargs}
    calls = {
        "backward_transfer_per_task": lambda: F.backward_transfer_per_task(R, **opts),
        "backward_transfer": lambda: F.backward_transfer(R, **opts),
        "forgetting_per_task": lambda: F.forgetting_per_task(R, **opts),
        "forgetting": lambda: F.forgetting(R, **opts),
        "forward_transfer_per_task": lambda: F.forward_transfer_per_task(R, b, **opts),
        "forward_transfer": lambda: F.forward_transfer(R, b, **opts),
        "continual_metrics": lambda: F.continual_metrics(R, b, **opts),
        "continual_metrics_curve": lambda: F.continual_metrics_curve(R, b, **opts),
        "all_continual_metrics": lambda: F.all_continual_metrics(R, b, ref, **opts),
    }
    if ref is not None:
        calls["intransigence_per_task"] = lambda: F.intransigence_per_task(R, ref, **opts)
        calls["intransigence"] = lambda: F.intransigence(R, ref, **opts)
    return calls


OVERFLOWS = [
    # (R, b, ref, functions that must refuse, message)
    (
        [[-BIG, 0.5], [BIG, 0.5]],
        [nan, 0.0],
        None,
        ("backward_transfer", "continual_metrics", "all_continual_metrics"),
        "backward transfer of task 0 overflows float64: it combines scores[1, 0] = 1e+308, "
        "scores[0, 0] = -1e+308",
    ),
    (
        [[BIG, 0.5], [-BIG, 0.5]],
        [nan, 0.0],
        None,
        ("forgetting", "continual_metrics", "all_continual_metrics"),
        "forgetting of task 0 overflows float64: it combines scores[0, 0] = 1e+308, "
        "scores[1, 0] = -1e+308",
    ),
    (
        [[0.5, BIG], [0.5, 0.5]],
        [nan, -BIG],
        None,
        ("forward_transfer", "continual_metrics", "all_continual_metrics"),
        "forward transfer of task 1 overflows float64: it combines scores[0, 1] = 1e+308, "
        "baseline[1] = -1e+308",
    ),
    (
        [[-BIG, 0.5], [-BIG, 0.5]],
        [nan, 0.0],
        [BIG, 0.5],
        ("intransigence", "all_continual_metrics"),
        "intransigence of task 0 overflows float64: it combines reference[0] = 1e+308, "
        "scores[0, 0] = -1e+308",
    ),
]


@pytest.mark.parametrize(("rows", "b", "ref", "refusing", "message"), OVERFLOWS)
def test_a_difference_beyond_float64_is_an_error_naming_metric_task_and_cells(
    rows, b, ref, refusing, message
):
    R, b = matrix(rows), matrix(b)
    ref = None if ref is None else matrix(ref)
    for name, call in every_function(R, b, ref).items():
        if not any(name.startswith(r) for r in refusing):
            continue
        with pytest.raises(ValueError) as info:
            call()
        text = str(info.value)
        if "curve" in name or name == "all_continual_metrics":
            # the curves name the first overflowing term by stage (here the final stage, 1),
            # whichever metric it belongs to (BWT and forgetting may overflow together)
            assert re.match(r"[a-z ]+ of (stage 1, )?task \d overflows float64: it combines", text)
            metric, rest = message.split(" of task ", 1)
            if metric in text:
                assert text.startswith(f"{metric} of stage 1, task {rest}") or text.startswith(
                    message
                ), (name, text)
        else:
            assert text.startswith(message), (name, text)
        assert "rescale the scores" in text


def test_lower_is_better_overflow_names_the_best_cell():
    # for a loss the best is the lowest: forgetting R[T-1,j] - min R[i,j] = 1e308 - (-1e308)
    R = matrix([[-BIG, 0.5], [BIG, 0.5]])
    with pytest.raises(ValueError, match=r"forgetting of task 0 .* scores\[0, 0\] = -1e\+308"):
        F.forgetting(R, higher_is_better=False, bounds=None)


def test_an_intermediate_stage_that_overflows_is_named_by_stage():
    """R[1,0] - R[0,0] overflows at stage 1; the final BWT (R[2,0] - R[0,0] = 0) does not."""
    R = matrix([[-BIG, 0.5, nan], [BIG, 0.5, 0.5], [-BIG, 0.5, 0.5]])
    b = matrix([nan, 0.0, 0.0])
    assert float(F.backward_transfer(R, bounds=None)) == 0.0  # the final value is fine
    with pytest.raises(ValueError, match=r"backward transfer of stage 1, task 0 overflows"):
        F.continual_metrics_curve(R, b, bounds=None)
    with pytest.raises(ValueError, match=r"backward transfer of stage 1, task 0 overflows"):
        F.all_continual_metrics(R, b, bounds=None)


def test_float32_overflows_at_its_own_range():
    R = matrix([[-3e38, 0.5], [3e38, 0.5]], dtype=torch.float32)
    with pytest.raises(ValueError, match=r"overflows float32: .*beyond ±3\.403e\+38"):
        F.backward_transfer(R, bounds=None)


def test_without_validation_nothing_is_checked():
    R = matrix([[-BIG, 0.5], [BIG, 0.5]])
    assert math.isinf(float(F.backward_transfer(R, bounds=None, validate=False)))


# --------------------------------------------------------------------------- sums that overflow
def exact_curves(R: list[list[float]], b: list[float]) -> dict[str, list[float]]:
    """The curves of the docstring of continual_metrics_curve, by plain loops over Fractions."""
    T = len(R)
    q = [[Fraction(x) if not math.isnan(x) else None for x in row] for row in R]
    qb = [Fraction(x) if not math.isnan(x) else None for x in b]
    out: dict[str, list[Fraction]] = {k: [] for k in ("acc", "bwt", "fwt", "forgetting")}
    out["learning_accuracy"], out["average_incremental_accuracy"] = [], []
    for s in range(T):
        out["acc"].append(sum(q[s][j] for j in range(s + 1)) / (s + 1))
        out["learning_accuracy"].append(sum(q[j][j] for j in range(s + 1)) / (s + 1))
        out["average_incremental_accuracy"].append(sum(out["acc"]) / (s + 1))
        if s == 0:
            for key in ("bwt", "fwt", "forgetting"):
                out[key].append(Fraction(0))
            continue
        out["bwt"].append(sum(q[s][j] - q[j][j] for j in range(s)) / s)
        out["fwt"].append(sum(q[j - 1][j] - qb[j] for j in range(1, s + 1)) / s)
        drops = [max(q[i][j] for i in range(j, s + 1)) - q[s][j] for j in range(s)]
        out["forgetting"].append(sum(drops) / s)
    return {k: [float(v) for v in values] for k, values in out.items()}


@pytest.mark.parametrize("hib", [True, False])
def test_huge_representable_scores_give_exact_metrics(hib):
    """Every cell near 1e308: row sums overflow, but each mean, transfer and forgetting is a
    float64; each curve and final value equals the exact-arithmetic definition."""
    rows = [
        [BIG, 0.9 * BIG, nan, nan],
        [0.99 * BIG, BIG, 0.8 * BIG, nan],
        [0.98 * BIG, 0.97 * BIG, BIG, 0.7 * BIG],
        [0.95 * BIG, 0.96 * BIG, 0.9 * BIG, BIG],
    ]
    b = [nan, 0.85 * BIG, 0.75 * BIG, 0.65 * BIG]
    sign = 1.0 if hib else -1.0
    R = matrix([[sign * x for x in row] for row in rows])
    base = matrix([sign * x for x in b])
    expected = exact_curves(rows, b)  # of the higher-is-better matrix; a loss: -R
    out = F.all_continual_metrics(R, base, higher_is_better=hib, bounds=None)
    for key, values in expected.items():
        if not hib and key in ("acc", "learning_accuracy", "average_incremental_accuracy"):
            values = [-v for v in values]  # in the score's own units
        got = out["curve"][key].tolist()
        assert all(math.isfinite(v) for v in got), (key, got)
        for g, e in zip(got, values, strict=True):
            assert math.isclose(g, e, rel_tol=1e-13, abs_tol=1e-13 * BIG), (key, got, values)
    single = F.continual_metrics(R, base, higher_is_better=hib, bounds=None)
    for key in ("acc", "bwt", "fwt", "forgetting"):
        assert math.isclose(float(single[key]), float(out[key]), rel_tol=1e-13, abs_tol=1e294)
    aia = F.average_incremental_accuracy(R, higher_is_better=hib, bounds=None)
    assert math.isclose(float(aia), float(out["average_incremental_accuracy"]), rel_tol=1e-13)


def test_ordinary_scores_keep_every_bit():
    """The recompute path is only taken on overflow: ordinary results are unchanged."""
    g = torch.Generator().manual_seed(0)
    R = torch.rand(6, 6, generator=g, dtype=torch.float64)
    b = torch.rand(6, generator=g, dtype=torch.float64)
    checked = F.all_continual_metrics(R, b, bounds=None)
    unchecked = F.all_continual_metrics(R, b, bounds=None, validate=False)
    for key in ("acc", "bwt", "fwt", "forgetting", "average_incremental_accuracy"):
        assert torch.equal(checked[key], unchecked[key])
        assert torch.equal(checked["curve"][key], unchecked["curve"][key])

"""Issue 10, item 2: the functional layer for any score direction (``higher_is_better``) and range
(``bounds``), with seed 000's contract as the bit-for-bit default.

What is exact and what is approximate:

* the default is *bitwise* the previous implementation: golden outputs saved from it (seed
  example, float64 and float32), and exact (``==``) agreement with the plain-loop oracle on
  dyadic matrices, where every sum is exact and only the one final division rounds;
* negating a higher-is-better matrix and flipping the direction gives *exactly* the same BWT, FWT,
  forgetting and intransigence (finals, curves, per task) and exactly the negated ACC, learning
  accuracy and average incremental accuracy (negation is exact and rounding is symmetric, so no
  last-bit difference arises; compared with ``torch.equal``, i.e. up to the sign of a zero);
* lower-is-better against the oracle's own lower-is-better formulas (``min``, reversed
  differences): ``1e-12`` relative on arbitrary floats, exact on dyadic ones.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from continual_eval import ContinualMetrics
from continual_eval import functional as F
from reference import reference_curve, reference_metrics, reference_per_task

NAN = float("nan")
SEED_R = [[0.5, 0.2, NAN], [0.9, 0.6, 0.3], [0.7, 0.8, 0.9]]
SEED_B = [NAN, 0.1, 0.15]
SEED_REF = [0.95, 0.85, 0.99]
LEVEL_KEYS = ("acc", "learning_accuracy", "average_incremental_accuracy")  # in the score's units
SIGNED_KEYS = ("bwt", "fwt", "forgetting", "intransigence")  # "better" keeps its sign

# all_continual_metrics(seed example, reference=SEED_REF) as computed by the implementation
# before issue 10 (commit fb217ba), as float.hex: the default must reproduce every bit.
GOLDEN = {
    "float64": {
        "acc": ("0x1.9999999999999p-1",),
        "bwt": ("0x1.9999999999998p-3",),
        "fwt": ("0x1.0000000000000p-3",),
        "forgetting": ("0x1.99999999999a0p-4",),
        "learning_accuracy": ("0x1.5555555555555p-1",),
        "average_incremental_accuracy": ("0x1.5ddddddddddddp-1",),
        "intransigence": ("0x1.0da740da740dap-2",),
        "curve.acc": ("0x1.0000000000000p-1", "0x1.8000000000000p-1", "0x1.9999999999999p-1"),
        "curve.bwt": ("0x0.0p+0", "0x1.9999999999998p-2", "0x1.9999999999998p-3"),
        "curve.fwt": ("0x0.0p+0", "0x1.999999999999ap-4", "0x1.0000000000000p-3"),
        "curve.forgetting": ("0x0.0p+0", "0x0.0p+0", "0x1.99999999999a0p-4"),
        "curve.learning_accuracy": (
            "0x1.0000000000000p-1",
            "0x1.199999999999ap-1",
            "0x1.5555555555555p-1",
        ),
        "curve.average_incremental_accuracy": (
            "0x1.0000000000000p-1",
            "0x1.4000000000000p-1",
            "0x1.5ddddddddddddp-1",
        ),
        "per_task.bwt": ("0x1.9999999999998p-3", "0x1.999999999999cp-3"),
        "per_task.fwt": ("0x1.999999999999ap-4", "0x1.3333333333333p-3"),
        "per_task.forgetting": ("0x1.999999999999cp-3", "0x0.0p+0"),
        "per_task.intransigence": (
            "0x1.cccccccccccccp-2",
            "0x1.0000000000000p-2",
            "0x1.70a3d70a3d708p-4",
        ),
        "chaudhry.forgetting": ("0x0.0p+0",),
        "chaudhry.curve.forgetting": ("0x0.0p+0", "-0x1.999999999999ap-2", "0x0.0p+0"),
        "chaudhry.per_task.forgetting": ("0x1.999999999999cp-3", "-0x1.999999999999cp-3"),
    },
    "float32": {
        "acc": ("0x1.99999a0000000p-1",),
        "bwt": ("0x1.9999a00000000p-3",),
        "fwt": ("0x1.0000000000000p-3",),
        "forgetting": ("0x1.9999800000000p-4",),
        "learning_accuracy": ("0x1.5555560000000p-1",),
        "average_incremental_accuracy": ("0x1.5dddde0000000p-1",),
        "intransigence": ("0x1.0da7420000000p-2",),
        "curve.acc": ("0x1.0000000000000p-1", "0x1.8000000000000p-1", "0x1.99999a0000000p-1"),
        "curve.bwt": ("0x0.0p+0", "0x1.9999980000000p-2", "0x1.9999a00000000p-3"),
        "curve.fwt": ("0x0.0p+0", "0x1.99999a0000000p-4", "0x1.0000000000000p-3"),
        "curve.forgetting": ("0x0.0p+0", "0x0.0p+0", "0x1.9999800000000p-4"),
        "curve.learning_accuracy": (
            "0x1.0000000000000p-1",
            "0x1.19999a0000000p-1",
            "0x1.5555560000000p-1",
        ),
        "curve.average_incremental_accuracy": (
            "0x1.0000000000000p-1",
            "0x1.4000000000000p-1",
            "0x1.5dddde0000000p-1",
        ),
        "per_task.bwt": ("0x1.9999980000000p-3", "0x1.9999980000000p-3"),
        "per_task.fwt": ("0x1.99999a0000000p-4", "0x1.3333340000000p-3"),
        "per_task.forgetting": ("0x1.9999980000000p-3", "0x0.0p+0"),
        "per_task.intransigence": (
            "0x1.cccccc0000000p-2",
            "0x1.0000000000000p-2",
            "0x1.70a3e00000000p-4",
        ),
        "chaudhry.forgetting": ("-0x1.0000000000000p-24",),
        "chaudhry.curve.forgetting": (
            "0x0.0p+0",
            "-0x1.9999980000000p-2",
            "-0x1.0000000000000p-24",
        ),
        "chaudhry.per_task.forgetting": ("0x1.9999980000000p-3", "-0x1.9999980000000p-3"),
    },
}

# continual_metrics(seed example) by the same implementation
CONTINUAL_METRICS_GOLDEN = {
    ("float64", "peak"): {
        "acc": "0x1.9999999999999p-1",
        "bwt": "0x1.999999999999ap-3",
        "fwt": "0x1.0000000000000p-3",
        "forgetting": "0x1.999999999999cp-4",
    },
    ("float64", "chaudhry"): {
        "acc": "0x1.9999999999999p-1",
        "bwt": "0x1.999999999999ap-3",
        "fwt": "0x1.0000000000000p-3",
        "forgetting": "0x0.0p+0",
    },
    ("float32", "peak"): {
        "acc": "0x1.99999a0000000p-1",
        "bwt": "0x1.9999980000000p-3",
        "fwt": "0x1.0000000000000p-3",
        "forgetting": "0x1.9999980000000p-4",
    },
    ("float32", "chaudhry"): {
        "acc": "0x1.99999a0000000p-1",
        "bwt": "0x1.9999980000000p-3",
        "fwt": "0x1.0000000000000p-3",
        "forgetting": "0x0.0p+0",
    },
}


def tensors(*values, dtype=torch.float64):
    return tuple(torch.tensor(v, dtype=dtype) for v in values)


def flatten(result: dict) -> dict[str, torch.Tensor]:
    """``all_continual_metrics``' nested result as ``{"curve.acc": ..., "acc": ...}``."""
    flat = {}
    for key, value in result.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def assert_flipped(hib: dict, lib: dict) -> None:
    """``lib`` (lower-is-better of ``-R``) against ``hib`` (higher-is-better of ``R``): signed
    metrics identical, level metrics negated, exactly."""
    assert hib.keys() == lib.keys()
    for key, value in hib.items():
        expected = -value if key.split(".")[-1] in LEVEL_KEYS else value
        assert key.split(".")[-1] in LEVEL_KEYS + SIGNED_KEYS, key
        assert torch.equal(lib[key], expected), (key, lib[key], expected)


# ---------------------------------------------------------------- the default, bit for bit
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_default_reproduces_the_previous_implementation_bit_for_bit(dtype):
    R, b, ref = tensors(SEED_R, SEED_B, SEED_REF, dtype=getattr(torch, dtype))
    golden = GOLDEN[dtype]
    for forgetting in F.FORGETTING_CONVENTIONS:
        for explicit in ({}, {"higher_is_better": True, "bounds": (0.0, 1.0)}):
            out = flatten(F.all_continual_metrics(R, b, ref, forgetting=forgetting, **explicit))
            for key, value in out.items():
                name = f"chaudhry.{key}" if forgetting == "chaudhry" else key
                if forgetting == "chaudhry" and name not in golden:
                    name = key  # unchanged by the convention
                got = tuple(float(v).hex() for v in value.reshape(-1).tolist())
                assert got == golden[name], (forgetting, key, explicit)
            finals = F.continual_metrics(R, b, forgetting=forgetting, **explicit)
            for key, value in finals.items():  # a mean of differences, not of the curves' sums
                assert float(value).hex() == CONTINUAL_METRICS_GOLDEN[dtype, forgetting][key], key


@st.composite
def dyadic_matrices(draw, max_tasks: int = 12, scale: int = 64, high: int = 64):
    """Matrices of multiples of ``1/scale`` in ``[0, high/scale]``: every sum is exact."""
    T = draw(st.integers(1, max_tasks))
    cell = st.integers(0, high).map(lambda k: k / scale)
    R = [[draw(cell) if j <= i + 1 else NAN for j in range(T)] for i in range(T)]
    b = [NAN] + [draw(cell) for _ in range(T - 1)]
    ref = [draw(cell) for _ in range(T)]
    return R, b, ref


def plain_aia(acc_curve: list[float]) -> list[float]:
    """Average incremental accuracy by a left-to-right loop (``sum`` compensates since 3.12)."""
    out, total = [], 0.0
    for s, value in enumerate(acc_curve):
        total += value
        out.append(total / (s + 1))
    return out


@settings(max_examples=150, deadline=None)
@given(
    dyadic_matrices(),
    st.sampled_from(F.FORGETTING_CONVENTIONS),
    st.booleans(),
)
def test_exact_against_the_plain_loop_on_dyadic_matrices(inputs, forgetting, higher_is_better):
    """Every sum is exact on dyadic cells, so the library must match the oracle to the bit, in
    both directions (the default path included)."""
    R, b, ref = inputs
    kwargs = {"forgetting": forgetting, "higher_is_better": higher_is_better, "bounds": (0, 1)}
    out = F.all_continual_metrics(*tensors(R, b, ref), **kwargs)
    curve = reference_curve(R, b, forgetting, higher_is_better)
    curve["average_incremental_accuracy"] = plain_aia(curve["acc"])
    for key, values in curve.items():
        assert out["curve"][key].tolist() == values, key
        assert out[key].item() == values[-1], key
    per_task = reference_per_task(R, b, ref, forgetting, higher_is_better)
    for key, values in per_task.items():
        assert out["per_task"][key].tolist() == values, key
    finals = F.continual_metrics(*tensors(R, b), **kwargs)
    for key, value in reference_metrics(R, b, forgetting, higher_is_better).items():
        assert finals[key].item() == value, key


# ---------------------------------------------------------------- negation + flipped direction
@st.composite
def score_matrices(draw, max_tasks: int = 40, low: float = 0.0, high: float = 1.0):
    T = draw(st.integers(1, max_tasks))
    cell = st.floats(low, high, allow_nan=False, allow_infinity=False)
    R = [[draw(cell) if j <= i + 1 else NAN for j in range(T)] for i in range(T)]
    b = [NAN] + [draw(cell) for _ in range(T - 1)]
    ref = [draw(cell) for _ in range(T)]
    return R, b, ref


def every_metric(R, b, ref, forgetting, **kwargs) -> dict[str, torch.Tensor]:
    """Every function of the accuracy-matrix layer, flattened under distinct keys."""
    out = {
        f"all.{k}": v
        for k, v in flatten(
            F.all_continual_metrics(R, b, ref, **kwargs, forgetting=forgetting)
        ).items()
    }
    out.update(
        {
            f"cm.{k}": v
            for k, v in F.continual_metrics(R, b, forgetting=forgetting, **kwargs).items()
        }
    )
    out.update(
        {
            f"curve.{k}": v
            for k, v in F.continual_metrics_curve(R, b, forgetting=forgetting, **kwargs).items()
        }
    )
    out["fn.acc"] = F.average_accuracy(R, **kwargs)
    out["fn.learning_accuracy"] = F.learning_accuracy(R, **kwargs)
    out["fn.average_incremental_accuracy"] = F.average_incremental_accuracy(R, **kwargs)
    out["fn.bwt"] = F.backward_transfer(R, **kwargs)
    out["per_task.bwt"] = F.backward_transfer_per_task(R, **kwargs)
    for convention in F.FWT_CONVENTIONS:
        out[f"fn.{convention}.fwt"] = F.forward_transfer(R, b, convention=convention, **kwargs)
        out[f"per_task.{convention}.fwt"] = F.forward_transfer_per_task(
            R, b, convention=convention, **kwargs
        )
    out["fn.forgetting"] = F.forgetting(R, convention=forgetting, **kwargs)
    out["per_task.forgetting"] = F.forgetting_per_task(R, convention=forgetting, **kwargs)
    out["fn.intransigence"] = F.intransigence(R, ref, **kwargs)
    out["per_task.intransigence"] = F.intransigence_per_task(R, ref, **kwargs)
    return out


@settings(max_examples=100, deadline=None)
@given(
    score_matrices(max_tasks=34),  # past one 32-stage block of the scan
    st.sampled_from(F.FORGETTING_CONVENTIONS),
    st.sampled_from([torch.float64, torch.float32]),
)
def test_negating_and_flipping_the_direction_gives_the_same_metrics(inputs, forgetting, dtype):
    R, b, ref = tensors(*inputs, dtype=dtype)
    hib = every_metric(R, b, ref, forgetting)
    lib = every_metric(-R, -b, -ref, forgetting, higher_is_better=False, bounds=(-1.0, 0.0))
    assert_flipped(hib, lib)
    torch.testing.assert_close(
        F.running_peak(-R, higher_is_better=False), -F.running_peak(R), rtol=0, atol=0
    )


@settings(max_examples=60, deadline=None)
@given(score_matrices(low=-1e6, high=1e6), st.sampled_from(F.FORGETTING_CONVENTIONS))
def test_flipping_is_exact_for_unbounded_scores_of_either_sign(inputs, forgetting):
    """Scores of both signs take the higher-is-better path's masked (``-inf``) history too."""
    R, b, ref = tensors(*inputs)
    hib = every_metric(R, b, ref, forgetting, bounds=None)
    lib = every_metric(-R, -b, -ref, forgetting, higher_is_better=False, bounds=None)
    assert_flipped(hib, lib)


# ---------------------------------------------------------------- lower-is-better vs the oracle
@settings(max_examples=100, deadline=None)
@given(score_matrices(low=0.0, high=10.0), st.sampled_from(F.FORGETTING_CONVENTIONS))
def test_lower_is_better_matches_the_plain_loop_formulas(inputs, forgetting):
    R, b, ref = inputs
    out = F.all_continual_metrics(
        *tensors(R, b, ref), forgetting=forgetting, higher_is_better=False, bounds=None
    )
    for key, values in reference_curve(R, b, forgetting, higher_is_better=False).items():
        assert out["curve"][key].tolist() == pytest.approx(values, rel=1e-12, abs=1e-12), key
    per_task = reference_per_task(R, b, ref, forgetting, higher_is_better=False)
    for key, values in per_task.items():
        assert out["per_task"][key].tolist() == pytest.approx(values, rel=1e-12, abs=1e-12), key
    if forgetting == "peak":  # the best value reached is the lowest: never negative
        assert (out["per_task"]["forgetting"] >= 0).all()


def test_a_loss_matrix_by_hand():
    # losses after each stage; lower is better. Task 0: 2.0 -> 2.5 -> 3.0 (got worse by 1, its
    # lowest was 2.0); task 1: 3.5 before training, 1.0 when learned, 1.5 at the end.
    R, b = tensors([[2.0, 3.5, NAN], [2.5, 1.0, 2.0], [3.0, 1.5, 0.5]], [NAN, 4.0, 3.0])
    out = F.continual_metrics(R, b, higher_is_better=False, bounds=(0.0, math.inf))
    assert out["acc"].item() == pytest.approx(5.0 / 3)  # mean final loss, in its own units
    assert F.backward_transfer_per_task(R, higher_is_better=False, bounds=None).tolist() == [
        -1.0,
        -0.5,
    ]  # R[j,j] - R[T-1,j]: negative, both got worse
    assert out["bwt"].item() == pytest.approx(-0.75)
    # b[j] - R[j-1,j]: 4.0 - 3.5 and 3.0 - 2.0, both lower than the untrained model
    assert out["fwt"].item() == pytest.approx(0.75)
    # R[T-1,j] - min_{j<=i} R[i,j]: 3.0 - 2.0 and 1.5 - 1.0
    assert F.forgetting_per_task(R, higher_is_better=False, bounds=None).tolist() == [1.0, 0.5]
    assert out["forgetting"].item() == pytest.approx(0.75)
    # Chaudhry: the lowest strictly before the final stage; task 1 only has stage 1 (1.0)
    chaudhry = F.forgetting_per_task(R, convention="chaudhry", higher_is_better=False, bounds=None)
    assert chaudhry.tolist() == [1.0, 0.5]
    ref = torch.tensor([1.5, 1.0, 0.25], dtype=torch.float64)
    # R[j,j] - ref[j]: positive where sequential training learned the task less well
    assert F.intransigence_per_task(R, ref, higher_is_better=False, bounds=None).tolist() == [
        0.5,
        0.0,
        0.25,
    ]
    assert F.running_peak(R, higher_is_better=False).tolist() == [
        [2.0, math.inf, math.inf],
        [2.0, 1.0, math.inf],
        [2.0, 1.0, 0.5],
    ]


@pytest.mark.parametrize("T", [31, 32, 33, 70])
@pytest.mark.parametrize("higher_is_better", [True, False])
def test_blocked_scan_in_both_directions_and_signs_across_block_boundaries(T, higher_is_better):
    gen = torch.Generator().manual_seed(T)
    R = (torch.rand(T, T, generator=gen, dtype=torch.float64) - 0.5) * 200  # both signs
    b = (torch.rand(T, generator=gen, dtype=torch.float64) - 0.5) * 200
    idx = torch.arange(T)
    R[idx.unsqueeze(0) > idx.unsqueeze(1) + 1] = NAN
    b[0] = NAN
    kwargs = {"higher_is_better": higher_is_better, "bounds": None}
    for forgetting in F.FORGETTING_CONVENTIONS:
        curve = F.continual_metrics_curve(R, b, forgetting=forgetting, **kwargs)
        expected = reference_curve(R.tolist(), b.tolist(), forgetting, higher_is_better)
        for key, values in expected.items():
            assert curve[key].tolist() == pytest.approx(values, rel=1e-12, abs=1e-9), key
    grad_peak = F.running_peak(R.clone().requires_grad_(), higher_is_better=higher_is_better)
    torch.testing.assert_close(F.running_peak(R, higher_is_better=higher_is_better), grad_peak)


def test_gradients_flow_for_a_loss():
    R, b = tensors([[2.0, 3.5, NAN], [2.5, 1.0, 2.0], [3.0, 1.5, 0.5]], [NAN, 4.0, 3.0])
    R.requires_grad_(True)
    out = F.all_continual_metrics(R, b, higher_is_better=False, bounds=None)
    (out["forgetting"] + out["curve"]["forgetting"].sum()).backward()
    assert torch.isfinite(R.grad).all()
    assert R.grad[0, 2].item() == 0.0  # an unused cell
    # task 0's final loss enters forgetting with +1/2 (two old tasks), once in the final value and
    # once in the curve's last stage
    assert R.grad[2, 0].item() == 1.0
    # its lowest value, R[0, 0], enters with -1 at stage 1 (one old task) and -1/2 twice at stage 2
    assert R.grad[0, 0].item() == -2.0


# ---------------------------------------------------------------- bounds
@settings(max_examples=60, deadline=None)
@given(score_matrices(max_tasks=12, low=-1e150, high=1e150), st.booleans())
def test_unbounded_accepts_values_outside_the_unit_interval_and_large_values(inputs, hib):
    R, b, ref = inputs
    out = F.all_continual_metrics(*tensors(R, b, ref), higher_is_better=hib, bounds=None)
    expected = reference_curve(R, b, "peak", hib)
    for key, values in expected.items():
        assert out["curve"][key].tolist() == pytest.approx(values, rel=1e-9, abs=1e141), key
        assert torch.isfinite(out["curve"][key]).all()


def test_unbounded_and_custom_bounds_on_percentages():
    R, b = tensors([[50.0, 20.0], [90.0, 60.0]], [NAN, 10.0])
    with pytest.raises(ValueError, match=r"scores\[0, 0\] = 50.0 is outside \[0, 1\]"):
        F.continual_metrics(R, b)  # the default stays the unit interval
    for bounds in (None, (0, 100), [0.0, 100.0], (-math.inf, math.inf)):
        out = F.continual_metrics(R, b, bounds=bounds)
        assert out["acc"].item() == 75.0 and out["bwt"].item() == 40.0
    with pytest.raises(
        ValueError,
        match=r"scores\[1, 0\] = 90.0 is outside \[0, 80\]; scores must lie within bounds = "
        r"\(0, 80\)",
    ):
        F.continual_metrics(R, b, bounds=(0, 80))
    with pytest.raises(ValueError, match=r"baseline\[1\] = 10.0 is outside \[20, 100\]"):
        F.continual_metrics(R.clamp(min=20), b, bounds=(20, 100))


def test_bounds_that_exclude_zero_still_ignore_unused_cells():
    # the fast check reads tril(R) (zeros above the used cells): zeros must not fail (1, 10)
    R, b = tensors([[2.0, 3.0, NAN, NAN], [2.0, 3.0, 4.0, NAN]] + [[5.0] * 4] * 2, [NAN, 9, 9, 9])
    assert F.continual_metrics(R, b, bounds=(1.0, 10.0))["acc"].item() == 5.0
    assert F.continual_metrics(-R, -b, bounds=(-10.0, -1.0))["acc"].item() == -5.0
    bad = R.clone()
    bad[3, 2] = 0.5
    with pytest.raises(ValueError, match=r"scores\[3, 2\] = 0.5 is outside \[1, 10\]"):
        F.continual_metrics(bad, b, bounds=(1.0, 10.0))


def test_unbounded_still_requires_finite_used_values():
    R, b = tensors(SEED_R, SEED_B)
    for value, shown in ((math.inf, "inf"), (-math.inf, "-inf"), (NAN, "nan")):
        bad = R.clone()
        bad[2, 1] = value
        for bounds in (None, (0.0, math.inf), (-math.inf, 1.0)):
            with pytest.raises(ValueError, match=rf"scores\[2, 1\] is {shown}; .* must be finite"):
                F.all_continual_metrics(bad, b, bounds=bounds)
        bad_b = b.clone()
        bad_b[1] = value
        with pytest.raises(ValueError, match=rf"baseline\[1\] is {shown}"):
            F.continual_metrics(R, bad_b, bounds=None)
    ref = torch.tensor([0.5, math.inf, 0.5], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"reference\[1\] is inf"):
        F.intransigence(R, ref, bounds=None, higher_is_better=False)
    assert F.continual_metrics(R * 1e300, b, bounds=None)["acc"].item() == pytest.approx(0.8e300)


def test_half_open_bounds_for_a_loss():
    R, b = tensors([[2.0, 3.5], [1e30, 1.0]], [NAN, 4.0])
    out = F.continual_metrics(R, b, higher_is_better=False, bounds=(0.0, math.inf))
    assert out["bwt"].item() == 2.0 - 1e30
    bad = R.clone()
    bad[1, 1] = -1.0
    with pytest.raises(ValueError, match=r"scores\[1, 1\] = -1.0 is outside \[0, inf\]"):
        F.continual_metrics(bad, b, higher_is_better=False, bounds=(0.0, math.inf))


@pytest.mark.parametrize("value", [100 + 2**-45, -1e-300, 100 * (1 + 2**-52)])
def test_out_of_bounds_messages_print_the_exact_value(value):
    R, b = tensors([[50.0, 20.0], [90.0, 60.0]], [NAN, 10.0])
    bad = R.clone()
    bad[1, 1] = value
    with pytest.raises(ValueError, match=r"scores\[1, 1\] = (\S+) is outside \[0, 100\]") as err:
        F.continual_metrics(bad, b, bounds=(0, 100))
    assert float(err.value.args[0].split(" = ")[1].split(" ")[0]) == value
    fractional = (0.1, 99.9)  # ends are printed with every digit too
    with pytest.raises(ValueError, match=r"is outside \[0.1, 99.9\]"):
        F.continual_metrics(bad, b, bounds=fractional)


@pytest.mark.parametrize(
    ("bounds", "error"),
    [
        ((1.0, 0.0), ValueError),
        ((NAN, 1.0), ValueError),
        ((0.0,), TypeError),
        ((0.0, 1.0, 2.0), TypeError),
        ("01", TypeError),
        ((True, 2), TypeError),
        (1.0, TypeError),
        ((0.0, "1"), TypeError),
    ],
)
def test_bad_bounds_are_refused(bounds, error):
    R, b = tensors(SEED_R, SEED_B)
    with pytest.raises(error, match="bounds must"):
        F.continual_metrics(R, b, bounds=bounds)
    with pytest.raises(error, match="bounds must"):
        F.forgetting_per_task(R, bounds=bounds, validate=False)
    with pytest.raises(error, match="bounds must"):
        ContinualMetrics(3, bounds=bounds)


ALL_FUNCTIONS = [
    lambda R, b, **kw: F.continual_metrics(R, b, **kw),
    lambda R, b, **kw: F.continual_metrics_curve(R, b, **kw),
    lambda R, b, **kw: F.all_continual_metrics(R, b, **kw),
    lambda R, b, **kw: F.average_accuracy(R, **kw),
    lambda R, b, **kw: F.backward_transfer(R, **kw),
    lambda R, b, **kw: F.forward_transfer(R, b, **kw),
    lambda R, b, **kw: F.forgetting(R, **kw),
    lambda R, b, **kw: F.learning_accuracy(R, **kw),
    lambda R, b, **kw: F.average_incremental_accuracy(R, **kw),
    lambda R, b, **kw: F.intransigence(R, b.nan_to_num(0.5), **kw),
    lambda R, b, **kw: F.running_peak(R, higher_is_better=kw["higher_is_better"]),
]


@pytest.mark.parametrize("fn", ALL_FUNCTIONS)
@pytest.mark.parametrize("direction", ["min", 0, None, 1.0])
def test_higher_is_better_must_be_a_bool(fn, direction):
    R, b = tensors(SEED_R, SEED_B)
    with pytest.raises(TypeError, match="higher_is_better must be True or False"):
        fn(R, b, higher_is_better=direction)


@pytest.mark.parametrize("fn", ALL_FUNCTIONS[:-1])
def test_every_function_validates_against_its_bounds(fn):
    R, b = tensors(SEED_R, SEED_B)
    bad = R.clone()
    bad[1, 1] = 1.5
    fn(bad, b, higher_is_better=False, bounds=None)  # accepted unbounded
    fn(bad, b, higher_is_better=False, bounds=(0, 2))
    with pytest.raises(ValueError, match=r"scores\[1, 1\] = 1.5 is outside \[0, 1\]"):
        fn(bad, b, higher_is_better=False)
    with pytest.raises(ValueError, match=r"scores\[1, 1\] = 1.5 is outside \[0, 1.25\]"):
        fn(bad, b, bounds=(0, 1.25))


# ---------------------------------------------------------------- stability functions
ACC = torch.tensor(
    [
        [0.5, NAN, NAN],
        [0.9, 0.1, NAN],
        [0.4, 0.5, NAN],
        [0.7, 0.8, NAN],
        [0.85, 0.9, NAN],
        [0.88, 0.95, 0.2],
        [0.6, 0.5, 0.7],
        [0.7, 0.96, 0.8],
        [0.65, 0.9, 0.9],
    ],
    dtype=torch.float64,
)
STAGE = torch.tensor([0, 0, 1, 1, 1, 1, 2, 2, 2])
STEPS = torch.tensor([5, 10, 12, 14, 16, 20, 22, 24, 30])


def test_stability_metrics_of_an_error_rate_by_hand():
    error = 1 - ACC  # lower is better: the worst value is the highest
    min_acc = F.min_accuracy(error, STAGE, higher_is_better=False)
    assert math.isnan(min_acc[0].item())
    # worst (highest) error of task 0 during stage 1: 0.6; mean(0.6, task 1's worst in stage 2: 0.5)
    assert min_acc[1:].tolist() == pytest.approx([0.6, 0.55])
    wc = F.worst_case_accuracy(error, STAGE, higher_is_better=False)
    assert wc.tolist() == pytest.approx([0.1, 0.05 / 2 + 0.6 / 2, 0.1 / 3 + 2 / 3 * 0.55])
    gap = F.stability_gap(error, STAGE, STEPS, tolerance=0.04, higher_is_better=False)
    assert gap["boundary"].tolist() == pytest.approx([0.1, 0.05])
    assert gap["minimum"].tolist() == pytest.approx([0.6, 0.5])  # the worst: the maximum
    assert gap["depth"].tolist() == pytest.approx([0.5, 0.45])  # worst - boundary: a gap
    # task 0 back to <= 0.14 at step 20 (0.12); task 1 to <= 0.09 at step 24 (0.04)
    assert gap["recovery_steps"].tolist() == [10.0, 4.0]


@st.composite
def stage_curves(draw):
    T = draw(st.integers(1, 5))
    counts = [draw(st.integers(1, 4)) for _ in range(T)]
    cell = st.floats(-100.0, 100.0, allow_nan=False)
    acc, stage = [], []
    for k, count in enumerate(counts):
        for _ in range(count):
            acc.append([draw(cell) if j <= k + 1 else NAN for j in range(T)])
            stage.append(k)
    steps = list(range(0, 3 * len(stage), 3))
    return acc, stage, steps, draw(st.sampled_from([0.0, 0.5, 5.0]))


@settings(max_examples=100, deadline=None)
@given(stage_curves())
def test_stability_negated_and_flipped_is_exact(data):
    acc, stage, steps, tolerance = data
    A, s, n = torch.tensor(acc, dtype=torch.float64), torch.tensor(stage), torch.tensor(steps)
    nan_equal = {"rtol": 0, "atol": 0, "equal_nan": True}
    torch.testing.assert_close(
        F.min_accuracy(-A, s, higher_is_better=False), -F.min_accuracy(A, s), **nan_equal
    )
    torch.testing.assert_close(
        F.worst_case_accuracy(-A, s, higher_is_better=False),
        -F.worst_case_accuracy(A, s),
        **nan_equal,
    )
    low = F.stability_gap(-A, s, n, tolerance=tolerance, higher_is_better=False)
    high = F.stability_gap(A, s, n, tolerance=tolerance)
    for key in ("boundary", "minimum"):
        torch.testing.assert_close(low[key], -high[key], **nan_equal)
    for key in ("depth", "recovery_steps"):
        torch.testing.assert_close(low[key], high[key], **nan_equal)


def test_stability_functions_check_direction_and_curves_in_both_directions():
    for fn in (F.min_accuracy, F.worst_case_accuracy):
        with pytest.raises(TypeError, match="higher_is_better must be True or False"):
            fn(ACC, STAGE, higher_is_better="max")
        with pytest.raises(ValueError, match="non-decreasing"):
            fn(ACC, STAGE.flip(0), higher_is_better=False)
    with pytest.raises(ValueError, match="steps must"):
        F.stability_gap(ACC, STAGE, STEPS.flip(0), higher_is_better=False)

"""The functional layer against the seed's worked example and a plain-loop reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import continual_eval
from continual_eval import functional as F
from reference import reference_curve, reference_metrics

NAN = float("nan")
SEED_R = [[0.5, 0.2, NAN], [0.9, 0.6, 0.3], [0.7, 0.8, 0.9]]
SEED_B = [NAN, 0.1, 0.15]


def seed_inputs(dtype=torch.float64):
    return torch.tensor(SEED_R, dtype=dtype), torch.tensor(SEED_B, dtype=dtype)


def with_unused_cells(R: torch.Tensor, b: torch.Tensor, value: float):
    """Copies of R and b with every cell no metric reads (j > i + 1, and b[0]) set to ``value``."""
    T = R.shape[0]
    R, b = R.clone(), b.clone()
    for i in range(T):
        for j in range(i + 2, T):
            R[i, j] = value
    b[0] = value
    return R, b


# ---------------------------------------------------------------- the seed's contract
def test_seed_worked_example():
    R, b = seed_inputs()
    out = continual_eval.continual_metrics(R, b)
    assert list(out) == ["acc", "bwt", "fwt", "forgetting"]
    expected = {"acc": 0.8, "bwt": 0.2, "fwt": 0.125, "forgetting": 0.1}
    for key, value in expected.items():
        assert out[key].shape == ()
        assert out[key].item() == pytest.approx(value, abs=1e-12)


def test_exported_at_top_level_and_functional():
    assert continual_eval.continual_metrics is F.continual_metrics


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_single_task_rule(dtype):
    R = torch.tensor([[0.7]], dtype=dtype)
    b = torch.tensor([NAN], dtype=dtype)
    out = F.continual_metrics(R, b)
    assert out["acc"].item() == pytest.approx(0.7)
    for key in ("bwt", "fwt", "forgetting"):
        assert out[key].item() == 0.0
        assert out[key].dtype == dtype
    curve = F.continual_metrics_curve(R, b)
    assert curve["acc"].tolist() == pytest.approx([0.7])
    assert curve["bwt"].tolist() == [0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_and_device_preserved(dtype):
    R, b = seed_inputs(dtype)
    for value in F.continual_metrics(R, b).values():
        assert value.dtype == dtype and value.device == R.device and value.ndim == 0
    for value in F.continual_metrics_curve(R, b).values():
        assert value.dtype == dtype and value.shape == (3,)


def test_nan_in_every_unused_cell_never_reaches_a_result():
    torch.manual_seed(0)
    T = 7
    R = torch.rand(T, T, dtype=torch.float64)
    b = torch.rand(T, dtype=torch.float64)
    R_nan, b_nan = with_unused_cells(R, b, NAN)
    R_other, b_other = with_unused_cells(R, b, 0.123)
    for forgetting in F.FORGETTING_CONVENTIONS:
        with_nan = F.continual_metrics(R_nan, b_nan, forgetting=forgetting)
        with_values = F.continual_metrics(R_other, b_other, forgetting=forgetting)
        for key in with_nan:
            assert torch.isfinite(with_nan[key])
            assert with_nan[key].item() == with_values[key].item()
        curve_nan = F.continual_metrics_curve(R_nan, b_nan, forgetting=forgetting)
        curve_values = F.continual_metrics_curve(R_other, b_other, forgetting=forgetting)
        for key in curve_nan:
            assert torch.isfinite(curve_nan[key]).all(), key
            torch.testing.assert_close(curve_nan[key], curve_values[key], rtol=0, atol=0)
    for fn in (F.backward_transfer_per_task, F.forgetting_per_task, F.learning_accuracy):
        assert torch.isfinite(fn(R_nan)).all()
    assert torch.isfinite(F.forward_transfer_per_task(R_nan, b_nan)).all()
    assert torch.isfinite(F.average_incremental_accuracy(R_nan))


def test_inputs_unchanged_and_no_state():
    R, b = seed_inputs()
    R_copy, b_copy = R.clone(), b.clone()
    first = F.continual_metrics(R, b)
    F.continual_metrics_curve(R, b, forgetting="chaudhry")
    first["acc"].add_(1.0)  # mutating a result must not touch the input
    second = F.continual_metrics(R, b)
    torch.testing.assert_close(R, R_copy, equal_nan=True)
    torch.testing.assert_close(b, b_copy, equal_nan=True)
    assert second["acc"].item() == pytest.approx(0.8)


def test_gradients_flow_and_stay_finite_with_nan_cells():
    R, b = seed_inputs()
    R.requires_grad_(True)
    b.requires_grad_(True)
    out = F.continual_metrics(R, b)
    total = sum(out.values())
    total.backward()
    assert torch.isfinite(R.grad).all() and torch.isfinite(b.grad).all()
    # d(acc)/dR[2, j] = 1/3 for every j; the unused cell R[0, 2] gets no gradient.
    assert R.grad[0, 2].item() == 0.0
    curve = F.continual_metrics_curve(R, b)
    sum(v.sum() for v in curve.values()).backward()
    assert torch.isfinite(R.grad).all()


def test_forgetting_conventions_differ_as_documented():
    R, b = seed_inputs()
    # peak includes the final stage: task 0 peak 0.9 -> 0.7 (0.2), task 1 peak 0.8 -> 0.8 (0.0).
    assert F.forgetting_per_task(R).tolist() == pytest.approx([0.2, 0.0])
    # Chaudhry: peaks strictly before the final stage; task 1: 0.6 - 0.8 = -0.2 (negative allowed).
    assert F.forgetting_per_task(R, convention="chaudhry").tolist() == pytest.approx([0.2, -0.2])
    assert F.continual_metrics(R, b, forgetting="chaudhry")["forgetting"].item() == pytest.approx(
        0.0
    )
    # Avalanche's per-task forgetting R[j,j] - R[T-1,j] is minus BWT per task.
    assert (-F.backward_transfer_per_task(R)).tolist() == pytest.approx([0.5 - 0.7, 0.6 - 0.8])
    with pytest.raises(ValueError, match="unknown forgetting convention"):
        F.continual_metrics(R, b, forgetting="max")


def test_other_published_metrics_on_the_seed_example():
    R, b = seed_inputs()
    assert F.learning_accuracy(R).item() == pytest.approx((0.5 + 0.6 + 0.9) / 3)
    assert F.average_incremental_accuracy(R).item() == pytest.approx((0.5 + 0.75 + 0.8) / 3)
    reference = torch.tensor([0.95, 0.95, 0.95], dtype=torch.float64)
    assert F.intransigence_per_task(R, reference).tolist() == pytest.approx([0.45, 0.35, 0.05])
    assert F.intransigence(R, reference).item() == pytest.approx(0.85 / 3)
    assert F.forward_transfer_per_task(R, b).tolist() == pytest.approx([0.1, 0.15])
    isolated = torch.tensor([0.9, 0.5, 0.8], dtype=torch.float64)
    assert F.forward_transfer_per_task(
        R, isolated, convention="isolated"
    ).tolist() == pytest.approx([0.1, 0.1])


# ---------------------------------------------------------------- property tests vs the reference
@st.composite
def accuracy_matrices(draw, max_tasks: int = 8):
    T = draw(st.integers(min_value=1, max_value=max_tasks))
    unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
    R = [[draw(unit) if j <= i + 1 else NAN for j in range(T)] for i in range(T)]
    b = [NAN] + [draw(unit) for _ in range(T - 1)]
    return R, b


@settings(max_examples=200, deadline=None)
@given(accuracy_matrices(), st.sampled_from(F.FORGETTING_CONVENTIONS))
def test_metrics_match_plain_loop_reference(inputs, forgetting):
    R, b = inputs
    out = F.continual_metrics(
        torch.tensor(R, dtype=torch.float64),
        torch.tensor(b, dtype=torch.float64),
        forgetting=forgetting,
    )
    expected = reference_metrics(R, b, forgetting)
    for key, value in expected.items():
        assert out[key].item() == pytest.approx(value, abs=1e-12), key


@settings(max_examples=150, deadline=None)
@given(accuracy_matrices(), st.sampled_from(F.FORGETTING_CONVENTIONS))
def test_curves_match_reference_and_end_at_the_final_metrics(inputs, forgetting):
    R, b = inputs
    Rt, bt = torch.tensor(R, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    curve = F.continual_metrics_curve(Rt, bt, forgetting=forgetting)
    expected = reference_curve(R, b, forgetting)
    assert set(curve) == set(expected) == set(F.CURVE_KEYS)
    for key, values in expected.items():
        assert curve[key].tolist() == pytest.approx(values, abs=1e-12), key
    final = F.continual_metrics(Rt, bt, forgetting=forgetting)
    for key, value in final.items():
        assert curve[key][-1].item() == pytest.approx(value.item(), abs=1e-12)
    assert curve["learning_accuracy"][-1].item() == pytest.approx(F.learning_accuracy(Rt).item())
    assert curve["average_incremental_accuracy"][-1].item() == pytest.approx(
        F.average_incremental_accuracy(Rt).item()
    )


@settings(max_examples=100, deadline=None)
@given(accuracy_matrices())
def test_peak_forgetting_is_non_negative_and_bounds_minus_bwt(inputs):
    R, _ = inputs
    Rt = torch.tensor(R, dtype=torch.float64)
    peak = F.forgetting_per_task(Rt)
    assert (peak >= 0).all()
    # the peak is at least the just-learned score, so peak forgetting >= -BWT per task
    assert (peak >= -F.backward_transfer_per_task(Rt) - 1e-12).all()


# ---------------------------------------------------------------- validation
def test_validation_errors_name_the_problem():
    R, b = seed_inputs()
    with pytest.raises(ValueError, match=r"square \[T, T\]"):
        F.continual_metrics(R[:2], b)
    with pytest.raises(ValueError, match=r"square \[T, T\]"):
        F.continual_metrics(R[0], b)
    with pytest.raises(ValueError, match=r"baseline must have shape \[T\] = \[3\]"):
        F.continual_metrics(R, b[:2])
    with pytest.raises(TypeError, match="floating dtype"):
        F.continual_metrics(torch.ones(2, 2, dtype=torch.long), torch.ones(2))
    with pytest.raises(TypeError, match="floating dtype"):
        F.continual_metrics(R, torch.ones(3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        F.continual_metrics(SEED_R, b)
    with pytest.raises(TypeError, match="does not match"):
        F.continual_metrics(R, b.float())
    bad = R.clone()
    bad[1, 2] = NAN
    with pytest.raises(ValueError, match=r"scores\[1, 2\] is nan"):
        F.continual_metrics(bad, b)
    bad = R.clone()
    bad[2, 0] = math.inf
    with pytest.raises(ValueError, match=r"scores\[2, 0\] is inf"):
        F.continual_metrics(bad, b)
    bad_b = b.clone()
    bad_b[2] = NAN
    with pytest.raises(ValueError, match=r"baseline\[2\] is nan"):
        F.continual_metrics(R, bad_b)
    bad = R.clone()
    bad[1, 1] = 1.5
    with pytest.raises(ValueError, match=r"scores\[1, 1\] = 1.5 is outside \[0, 1\]"):
        F.continual_metrics(bad, b)
    bad_b = b.clone()
    bad_b[1] = -0.1
    with pytest.raises(ValueError, match=r"baseline\[1\] = -0.1 is outside \[0, 1\]"):
        F.continual_metrics(R, bad_b)
    reference = torch.tensor([0.9, NAN, 0.9], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"reference\[1\] is nan"):
        F.intransigence(R, reference)


def test_validation_can_be_turned_off():
    R, b = seed_inputs()
    R = R * 100  # percentages, say: out of range, accepted without validation
    out = F.continual_metrics(R, b * 100, validate=False)
    assert out["acc"].item() == pytest.approx(80.0)


@pytest.mark.parametrize("T", [31, 32, 33, 70])
def test_curves_across_scan_block_boundaries_match_reference(T):
    """The running peak is a blocked scan (blocks of 32 stages): check sizes around the block."""
    gen = torch.Generator().manual_seed(T)
    R = torch.rand(T, T, generator=gen, dtype=torch.float64)
    b = torch.rand(T, generator=gen, dtype=torch.float64)
    R, b = with_unused_cells(R, b, NAN)
    for forgetting in F.FORGETTING_CONVENTIONS:
        curve = F.continual_metrics_curve(R, b, forgetting=forgetting)
        expected = reference_curve(R.tolist(), b.tolist(), forgetting)
        for key, values in expected.items():
            assert curve[key].tolist() == pytest.approx(values, abs=1e-12), (key, forgetting)
    torch.testing.assert_close(F.running_peak(R), F.running_peak(R.clone().requires_grad_()))


@settings(max_examples=100, deadline=None)
@given(accuracy_matrices(max_tasks=40), st.sampled_from(F.FORGETTING_CONVENTIONS))
def test_all_metrics_in_one_pass_match_the_plain_loop(inputs, forgetting):
    R, b = inputs
    T = len(R)
    Rt, bt = torch.tensor(R, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    reference = torch.linspace(0.5, 1.0, T, dtype=torch.float64)
    out = F.all_continual_metrics(Rt, bt, reference, forgetting=forgetting)
    expected_curve = reference_curve(R, b, forgetting)
    for key, values in expected_curve.items():
        assert out["curve"][key].tolist() == pytest.approx(values, abs=1e-12), key
        assert out[key].item() == pytest.approx(values[-1], abs=1e-12), key
    last = T - 1
    peak_end = last if forgetting == "peak" else last - 1
    per_task = {
        "bwt": [R[last][j] - R[j][j] for j in range(last)],
        "fwt": [R[j - 1][j] - b[j] for j in range(1, T)],
        "forgetting": [
            max(R[i][j] for i in range(j, peak_end + 1)) - R[last][j] for j in range(last)
        ],
        "intransigence": [reference[j].item() - R[j][j] for j in range(T)],
    }
    for key, values in per_task.items():
        assert out["per_task"][key].tolist() == pytest.approx(values, abs=1e-12), key
    assert out["intransigence"].item() == pytest.approx(sum(per_task["intransigence"]) / T)


def test_results_survive_calls_under_inference_mode_and_later_calls():
    """The scratch workspace is per mode: a call under inference_mode must not break later calls,
    and no returned tensor may change when the functions are called again."""
    R, b = seed_inputs()
    with torch.inference_mode():
        inside = F.all_continual_metrics(R, b)
    outside = F.all_continual_metrics(R, b)
    kept = {k: v.clone() for k, v in outside["per_task"].items()}
    F.all_continual_metrics(torch.rand(3, 3, dtype=torch.float64), b.nan_to_num(0.5))
    F.forgetting_per_task(torch.rand(3, 3, dtype=torch.float64))
    for key, value in kept.items():
        torch.testing.assert_close(outside["per_task"][key], value)
        torch.testing.assert_close(inside["per_task"][key], value)
    assert outside["forgetting"].item() == pytest.approx(0.1)


@pytest.mark.parametrize("value", [1 + 1e-12, -1e-15, 1 + 2**-52])
def test_out_of_range_messages_print_the_exact_value(value):
    # a 6-significant-digit message would claim "= 1 is outside [0, 1]" (or "-1e-15" rounded)
    R, b = seed_inputs()
    bad = R.clone()
    bad[2, 1] = value
    with pytest.raises(ValueError, match=r"scores\[2, 1\] = (\S+) is outside") as err:
        F.continual_metrics(bad, b)
    printed = err.value.args[0].split(" = ")[1].split(" ")[0]
    assert float(printed) == value  # the message round-trips to the rejected value
    bad_b = b.clone()
    bad_b[2] = value
    with pytest.raises(ValueError, match=r"baseline\[2\] = \S+ is outside") as err:
        F.continual_metrics(R, bad_b)
    assert float(err.value.args[0].split(" = ")[1].split(" ")[0]) == value

"""Stream metrics against the seed's worked example and a plain-loop reference written here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from continual_eval.stream import (
    EpisodeStep,
    EpisodeTrace,
    RewardComponent,
    RewardSpec,
    UpperBound,
    compute_all_metrics,
    configuration_intervals,
)

# ----------------------------------------------------------------------------- the seed's example
SEED_OUTPUT = """\
a        J = 0.8000   adapt = --   recover = --   forget = +0.3000   variance = 0.0000
b        J = 0.6100   adapt = 3   recover = 2   forget = --   variance = 0.0477
a_again  J = 0.5000   adapt = 1   recover = 1   forget = +0.3000   variance = 0.0000"""


def worked_example_trace() -> EpisodeTrace:
    rewards = [0.8] * 10 + [0.1, 0.9, 0.9] + [0.6] * 7 + [0.5] * 10
    labels = ["a"] * 10 + ["b"] * 10 + ["a_again"] * 10
    return EpisodeTrace(
        steps=[
            EpisodeStep(
                step=i,
                reward=rewards[i],
                regime_id=labels[i],
                regime_origin="a" if labels[i] == "a_again" else None,
            )
            for i in range(30)
        ]
    )


def seed_lines(table: dict) -> str:
    """The seed's own print loop, verbatim in substance."""
    out = []
    for k in ("a", "b", "a_again"):
        row = table["per_regime"][k]

        def fmt(v, spec):
            return "--" if v is None else format(v, spec)

        out.append(
            f"{k:<8} J = {fmt(row['per_configuration_reward'], '.4f')}"
            f"   adapt = {fmt(row['adaptation_speed'], '.0f')}"
            f"   recover = {fmt(row['recovery_time'], '.0f')}"
            f"   forget = {fmt(row['forgetting'], '+.4f')}"
            f"   variance = {fmt(row['stability_variance'], '.4f')}"
        )
    return "\n".join(out)


def test_worked_example_reproduces_seed_table():
    assert seed_lines(compute_all_metrics([worked_example_trace()])) == SEED_OUTPUT


def test_worked_example_absences_are_none_not_zero():
    row = compute_all_metrics([worked_example_trace()])["per_regime"]
    assert row["a"]["adaptation_speed"] is None
    assert row["a"]["recovery_time"] is None
    assert row["b"]["forgetting"] is None
    assert row["a"]["stability_variance"] is not None  # a value: 0.0, not absence
    assert row["a"]["stability_variance"] == pytest.approx(0.0, abs=1e-12)
    assert row["b"]["performance_gap"] is None  # no ceiling


# ----------------------------------------------------------------------------- plain-loop reference
def ceil_frac(length: int, fraction: float) -> int:
    from fractions import Fraction

    return max(math.ceil(Fraction(repr(fraction)) * length), 1)


def reference_metrics(
    rewards,
    labels,
    origins,
    *,
    anchor="segment",
    alpha=None,
    eps=None,
    floor=0.005,
    ceiling=None,
    gamma=0.99,
    window=10,
):
    """Every per-label metric, one step at a time, with lists and loops only."""
    alpha = (0.9 if anchor == "segment" else 0.5) if alpha is None else alpha
    intervals = []  # [label, [rewards]]
    for r, z in zip(rewards, labels, strict=True):
        if intervals and intervals[-1][0] == z:
            intervals[-1][1].append(r)
        else:
            intervals.append([z, [r]])

    def root(z):
        while z in origins and origins[z] != z:
            z = origins[z]
        return z

    per_iv = []
    for j, (z, rs) in enumerate(intervals):
        L = len(rs)
        running, s = [], 0.0
        for tau, r in enumerate(rs, start=1):
            s += r
            running.append(s / tau)
        n_tail = ceil_frac(L, 0.2)
        tail = 0.0
        for r in rs[L - n_tail :]:
            tail += r
        tail /= n_tail
        adapt = rec = zs = None
        if j > 0:
            thr = alpha * max(running) if anchor == "segment" else alpha * ceiling
            for tau, m in enumerate(running, start=1):
                if m >= thr:
                    adapt = tau
                    break
            if adapt is None and anchor == "segment":
                adapt = L
            if anchor == "segment":
                A, band = tail, max((0.3 if eps is None else eps) * abs(tail), floor)
            else:
                A = ceiling
                band = max(0.5 * abs(ceiling) if eps is None else eps, floor)
            for tau, m in enumerate(running, start=1):
                if abs(m - A) <= band:
                    rec = tau
                    break
            w = min(window, L)
            zs = sum(rs[:w]) / w
        mean = sum(rs) / L
        var = None
        if L > 1:
            var = sum((r - mean) ** 2 for r in rs) / (L - 1)
        per_iv.append(
            {
                "label": z,
                "adapt": adapt,
                "rec": rec,
                "zs": zs,
                "tail": tail,
                "mean": mean,
                "var": var,
                "len": L,
            }
        )

    def avg(vals):
        vals = [v for v in vals if v is not None]
        return sum(vals) / len(vals) if vals else None

    encounters = {}
    for d in per_iv:
        encounters.setdefault(root(d["label"]), []).append(d["mean"])
    out = {}
    for z in dict.fromkeys(labels):
        rs = [r for r, lab in zip(rewards, labels, strict=True) if lab == z]
        mean = sum(rs) / len(rs)
        ivs = [d for d in per_iv if d["label"] == z]
        enc = encounters[root(z)]
        disc = 0.0
        for t, (r, lab) in enumerate(zip(rewards, labels, strict=True)):
            if lab == z:
                disc += gamma**t * r
        out[z] = {
            "per_configuration_reward": mean,
            "adaptation_speed": avg([d["adapt"] for d in ivs]),
            "recovery_time": avg([d["rec"] for d in ivs]),
            "forgetting": enc[0] - enc[1] if len(enc) >= 2 else None,
            "stability_variance": (
                sum((r - mean) ** 2 for r in rs) / (len(rs) - 1) if len(rs) > 1 else None
            ),
            "performance_gap": (ceiling - ivs[0]["tail"]) if ceiling is not None else None,
            "zero_shot_reward": avg([d["zs"] for d in ivs]),
            "settled_reward": avg([d["tail"] for d in ivs]),
            "discounted_return": disc,
            "undiscounted_return": sum(rs),
        }
    return out, per_iv


def assert_rows_match(result, expected, exact_keys=(), rel=1e-9):
    for z, exp in expected.items():
        got = result["per_regime"][z]
        for key, val in exp.items():
            if val is None:
                assert got[key] is None, (z, key, got[key])
            elif key in exact_keys:
                assert got[key] == val, (z, key, got[key], val)
            else:
                assert got[key] == pytest.approx(val, rel=rel, abs=1e-9), (z, key)


def test_worked_example_matches_reference_on_every_row():
    tr = worked_example_trace()
    exp, _ = reference_metrics(tr.reward.tolist(), tr.regime_id, {"a_again": "a"})
    assert_rows_match(
        compute_all_metrics(tr), exp, exact_keys=("adaptation_speed", "recovery_time")
    )


# Dyadic rewards (k/8) keep every sum exact, so thresholds compare identically in both
# implementations and step counts can be compared exactly.
dyadic = st.integers(-16, 16).map(lambda k: k / 8)


@st.composite
def schedules(draw):
    n_blocks = draw(st.integers(1, 6))
    labels, rewards = [], []
    names = ["a", "b", "c", "a_again"]
    prev = None
    for _ in range(n_blocks):
        z = draw(st.sampled_from([n for n in names if n != prev]))
        L = draw(st.integers(1, 25))
        labels += [z] * L
        rewards += draw(st.lists(dyadic, min_size=L, max_size=L))
        prev = z
    origins = {"a_again": "a"} if "a_again" in labels and "a" in labels else {}
    return rewards, labels, origins


@settings(max_examples=150, deadline=None)
@given(schedules(), st.sampled_from(["segment", "ceiling"]), st.sampled_from([None, 1.0, 0.25]))
def test_property_matches_plain_loop(sched, anchor, ceiling):
    rewards, labels, origins = sched
    if anchor == "ceiling" and ceiling is None:
        ceiling = 0.5
    tr = EpisodeTrace.from_arrays(rewards, labels, origin_of=origins)
    got = compute_all_metrics(tr, anchor=anchor, ceiling=ceiling)
    exp, per_iv = reference_metrics(rewards, labels, origins, anchor=anchor, ceiling=ceiling)
    assert_rows_match(got, exp, exact_keys=())
    # Per-interval step counts compare exactly.
    for d, g in zip(per_iv, got["per_trace"][0]["per_interval"], strict=True):
        assert g["length"] == d["len"]
        assert g["adaptation_speed"] == d["adapt"]
        assert g["recovery_time"] == d["rec"]
        if d["var"] is None:
            assert g["stability_variance"] is None
        else:
            assert g["stability_variance"] == pytest.approx(d["var"], abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=60),
    st.integers(1, 5),
)
def test_property_arbitrary_floats_smooth_metrics(rewards, n_regimes):
    labels = [f"r{(i * n_regimes) // len(rewards)}" for i in range(len(rewards))]
    tr = EpisodeTrace.from_arrays(rewards, labels)
    got = compute_all_metrics(tr)
    exp, _ = reference_metrics(rewards, labels, {})
    for z in exp:
        for key in (
            "per_configuration_reward",
            "stability_variance",
            "discounted_return",
            "undiscounted_return",
            "settled_reward",
            "zero_shot_reward",
        ):
            e, g = exp[z][key], got["per_regime"][z][key]
            if e is None:
                assert g is None
            else:
                assert g == pytest.approx(e, rel=1e-7, abs=1e-6)


def test_intervals_are_maximal_runs():
    iv = configuration_intervals(np.array([0, 0, 1, 1, 1, 0, 2]))
    assert iv.start.tolist() == [0, 2, 5, 6]
    assert iv.stop.tolist() == [2, 5, 6, 7]
    assert iv.code.tolist() == [0, 1, 0, 2]


# ----------------------------------------------------------------------------- absence cases
def test_first_interval_has_no_adaptation_and_stationary_run_answers_little():
    tr = EpisodeTrace.from_arrays([0.1, 0.4, 0.2, 0.3], ["only"] * 4)
    row = compute_all_metrics(tr)["per_regime"]["only"]
    for key in (
        "adaptation_speed",
        "recovery_time",
        "forgetting",
        "zero_shot_reward",
        "performance_gap",
        "regret",
        "effective_rank",
        "settled_reward_policy",
        "invalid_action_rate",
        "solve_rate",
    ):
        assert row[key] is None, key
    assert row["per_configuration_reward"] == pytest.approx(0.25)
    assert row["stability_variance"] == pytest.approx(np.var([0.1, 0.4, 0.2, 0.3], ddof=1))


def test_single_step_interval_has_no_variance():
    tr = EpisodeTrace.from_arrays([1.0, 1.0, 0.5, 2.0, 2.0], ["a", "a", "b", "c", "c"])
    res = compute_all_metrics(tr)
    assert res["per_regime"]["b"]["stability_variance"] is None
    assert res["per_trace"][0]["per_interval"][1]["stability_variance"] is None
    assert res["per_regime"]["c"]["stability_variance"] == 0.0


def test_no_recurrence_means_no_forgetting_and_plain_label_repeat_counts():
    tr = EpisodeTrace.from_arrays([1, 1, 0, 0, 0.5, 0.5], ["a", "a", "b", "b", "a", "a"])
    res = compute_all_metrics(tr)["per_regime"]
    assert res["b"]["forgetting"] is None
    assert res["a"]["forgetting"] == pytest.approx(0.5)


def test_no_ceiling_means_no_gap_and_ceiling_gives_one():
    tr = worked_example_trace()
    assert all(r["performance_gap"] is None for r in compute_all_metrics(tr)["per_regime"].values())
    rows = compute_all_metrics(tr, ceiling=1.0)["per_regime"]
    assert rows["b"]["performance_gap"] == pytest.approx(1.0 - 0.6)
    assert rows["a"]["performance_gap"] == pytest.approx(1.0 - 0.8)


def test_segment_never_crossing_reports_interval_length():
    # Negative rewards: alpha * peak lies above the peak, so the threshold is never met.
    tr = EpisodeTrace.from_arrays([0.0] * 3 + [-1.0, -2.0, -3.0, -4.0], ["a"] * 3 + ["b"] * 4)
    res = compute_all_metrics(tr)
    assert res["per_regime"]["b"]["adaptation_speed"] == 4


def test_ceiling_never_crossing_is_absent():
    tr = worked_example_trace()
    res = compute_all_metrics(tr, anchor="ceiling", ceiling=10.0)
    assert res["per_regime"]["b"]["adaptation_speed"] is None
    assert res["per_regime"]["a_again"]["adaptation_speed"] is None
    assert res["params"]["anchor"] == "ceiling" and res["params"]["alpha"] == 0.5
    # Reachable ceiling: 0.5 * 1.0 = 0.5 -> b's running means 0.1, 0.5 -> tau = 2.
    res = compute_all_metrics(tr, anchor="ceiling", ceiling=1.0)
    assert res["per_regime"]["b"]["adaptation_speed"] == 2


def test_recovery_floor_triggers_at_settled_reward_zero():
    # b settles at exactly 0 (tail mean 0): eps * |A| is a zero-width band, the floor is not.
    tr = EpisodeTrace.from_arrays([1.0] * 5 + [0.02, -0.012, 0.0, 0.0, 0.0], ["a"] * 5 + ["b"] * 5)
    # running means 0.02, 0.004, 0.00267, ... never exactly 0
    assert compute_all_metrics(tr)["per_regime"]["b"]["recovery_time"] == 2
    assert compute_all_metrics(tr, recovery_floor=0.0)["per_regime"]["b"]["recovery_time"] is None
    assert compute_all_metrics(tr)["params"]["recovery_floor"] == 0.005


def test_tail_uses_exact_ceiling_of_twenty_percent():
    # |T| = 15 -> ceil(0.2 * 15) = 3; floating point (0.2 * 15 = 3.0000000000000004) gives 4.
    b = [0.0] * 11 + [1.0, 1.0, 1.0, 0.0]
    tr = EpisodeTrace.from_arrays([0.0, 0.0, *b], ["a"] * 2 + ["b"] * 15)
    settled = compute_all_metrics(tr)["per_regime"]["b"]["settled_reward"]
    assert settled == pytest.approx(2 / 3)


# ----------------------------------------------------------------------------- further rows
def test_further_rows_against_loops():
    rng = np.random.default_rng(0)
    n = 40
    rewards = rng.normal(size=n)
    labels = ["a"] * 10 + ["b"] * 15 + ["a2"] * 15
    ref = rewards + rng.uniform(0, 1, size=n)
    invalid = (rng.uniform(size=n) < 0.3).astype(float)
    rank = rng.uniform(1, 5, size=n)
    rank[:10] = np.nan
    solved = rng.choice([0.0, 1.0, -1.0], size=n)
    bonus = np.zeros(n)
    bonus[[24, 39]] = 5.0
    tr = EpisodeTrace.from_arrays(
        rewards,
        labels,
        origin_of={"a2": "a"},
        components={"solved": solved, "bonus": bonus},
        invalid_action=invalid,
        effective_rank=rank,
    )
    res = compute_all_metrics(
        tr, reference=[ref], episode_end_components=["bonus"], solve_component="solved"
    )
    rows = res["per_regime"]
    for z in ("a", "b", "a2"):
        idx = [i for i in range(n) if labels[i] == z]
        assert rows[z]["regret"] == pytest.approx(sum(ref[i] - rewards[i] for i in idx))
        assert rows[z]["invalid_action_rate"] == pytest.approx(
            sum(invalid[i] for i in idx) / len(idx)
        )
        assert rows[z]["solve_rate"] == pytest.approx(
            sum(1 for i in idx if solved[i] > 0) / len(idx)
        )
        ranks = [rank[i] for i in idx if not math.isnan(rank[i])]
        if ranks:
            assert rows[z]["effective_rank"] == pytest.approx(sum(ranks) / len(ranks))
        else:
            assert rows[z]["effective_rank"] is None
        tail_idx = idx[len(idx) - ceil_frac(len(idx), 0.2) :]
        kept = [rewards[i] for i in tail_idx if bonus[i] == 0]
        assert rows[z]["settled_reward_policy"] == pytest.approx(sum(kept) / len(kept))
    # Forgetting excludes the episode-end payout steps (39 lies in a2's interval).
    first = [rewards[i] for i in range(10)]
    second = [rewards[i] for i in range(25, 40) if bonus[i] == 0]
    expected = sum(first) / len(first) - sum(second) / len(second)
    assert rows["a"]["forgetting"] == pytest.approx(expected)
    assert rows["a2"]["forgetting"] == pytest.approx(expected)
    assert res["totals"]["regret"] == pytest.approx(float((ref - rewards).sum()))
    disc = sum(0.99**t * rewards[t] for t in range(n))
    assert res["totals"]["discounted_return"] == pytest.approx(disc)
    assert res["params"]["episode_end_components"] == ["bonus"]


def test_ceiling_from_spec_uses_interval_form_and_records_derivation():
    spec = RewardSpec(
        components=(
            RewardComponent("progress", weight=1.0, clip=(0.0, 1.0)),
            RewardComponent("goal", weight=2.0, clip=(0.0, 1.0), pays="episode_end"),
        ),
        name="toy",
    )
    rewards = [0.5] * 4 + [0.2] * 5
    end = [False] * 8 + [True]
    tr = EpisodeTrace.from_arrays(rewards, ["a"] * 4 + ["b"] * 5, episode_end=end)
    res = compute_all_metrics(tr, ceiling=spec)
    assert res["bound"]["derivation"] == "analytic"
    ivs = res["per_trace"][0]["per_interval"]
    assert ivs[0]["ceiling"] == pytest.approx(1.0)
    assert ivs[1]["ceiling"] == pytest.approx((4 * 1.0 + 3.0) / 5)
    # the gap compares b's tail (its last step, which ends the episode: at most 1 + 2 = 3.0)
    # with the ceiling of that same tail, not with the interval's: 3.0 - 0.2
    assert ivs[1]["settled_ceiling"] == pytest.approx(3.0)
    assert ivs[0]["settled_ceiling"] == pytest.approx(1.0)
    assert res["per_regime"]["b"]["performance_gap"] == pytest.approx(3.0 - 0.2)


def test_per_label_ceilings_and_missing_label_errors():
    tr = worked_example_trace()
    res = compute_all_metrics(tr, ceiling={"a": 1.0, "b": 0.7, "a_again": UpperBound.explicit(2)})
    assert res["per_regime"]["b"]["performance_gap"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="a_again"):
        compute_all_metrics(tr, anchor="ceiling", ceiling={"a": 1.0, "b": 0.7})
    with pytest.raises(ValueError, match="needs a ceiling"):
        compute_all_metrics(tr, anchor="ceiling")


def test_multiple_traces_stage_one_counts():
    t1 = worked_example_trace()
    t2 = EpisodeTrace.from_arrays([0.2] * 5 + [0.4] * 5, ["a"] * 5 + ["b"] * 5)
    res = compute_all_metrics([t1, t2])
    assert res["per_regime"]["a"]["per_configuration_reward"] == pytest.approx((0.8 + 0.2) / 2)
    assert res["n"]["a"]["per_configuration_reward"] == 2
    assert res["n"]["a_again"]["per_configuration_reward"] == 1
    # forgetting: t1 has a value, t2 has none -> rests on one value, not averaged with 0.
    assert res["per_regime"]["a"]["forgetting"] == pytest.approx(0.3)
    assert res["n"]["a"]["forgetting"] == 1
    # stage 2: across labels, absences dropped
    b_adapt = res["per_regime"]["b"]["adaptation_speed"]
    assert res["overall"]["adaptation_speed"] == pytest.approx(
        (b_adapt + res["per_regime"]["a_again"]["adaptation_speed"]) / 2
    )
    assert res["overall_n"]["adaptation_speed"] == 2
    assert res["overall_n"]["performance_gap"] == 0 and res["overall"]["performance_gap"] is None


def test_params_record_everything():
    p = compute_all_metrics(worked_example_trace())["params"]
    assert p["anchor"] == "segment" and p["alpha"] == 0.9 and p["eps"] == 0.3
    assert p["recovery_floor"] == 0.005 and p["tail_fraction"] == 0.2
    assert p["zero_shot_window"] == 10 and p["gamma"] == 0.99

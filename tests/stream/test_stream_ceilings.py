"""The interval ceiling and the performance gap's ceiling against a brute-force maximum.

The reward rule (the seed's): every component pays ``weight * clip(value)``; per-step components
pay on every step, episode-end components only on a step that ends an episode. The tests
enumerate every sequence of per-step rewards that rule allows (each component's value on a grid
over its clip range, endpoints included) for a small interval with the episode ends where the
trace has them, and take the best mean by brute force -- no use of the package's bound.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest

from continual_eval.stream import (
    EpisodeTrace,
    RewardComponent,
    RewardSpec,
    UpperBound,
    analytic_upper_bound,
    compute_all_metrics,
)

# (name, weight, (lo, hi), pays) -- two specifications: one with a reward per step, one whose only
# per-step term is a penalty (its best ordinary step pays 0)
SPECS = {
    "experiment": [
        ("progress", 1 / 3, (-1.0, 1.0), "per_step"),
        ("penalty", -0.5, (0.0, 2.0), "per_step"),
        ("goal", 2 / 3, (0.0, 1.0), "episode_end"),
    ],
    "paper": [
        ("collision", -1.0, (0.0, 1.0), "per_step"),
        ("success", 0.5, (0.0, 1.0), "episode_end"),
    ],
}


def spec_of(name: str) -> RewardSpec:
    return RewardSpec(
        tuple(RewardComponent(n, weight=w, clip=c, pays=p) for n, w, c, p in SPECS[name]),
        name=name,
    )


def step_rewards(name: str, ends_episode: bool) -> np.ndarray:
    """Every reward one step can pay under the rule, from a 3-point grid per component."""
    comps = SPECS[name]
    grids = [np.linspace(lo, hi, 3) for _, _, (lo, hi), _ in comps]
    out = set()
    for values in itertools.product(*grids):
        r = 0.0
        for (_, w, (lo, hi), pays), v in zip(comps, values, strict=True):
            if pays == "per_step" or ends_episode:
                r += w * min(max(v, lo), hi)
        out.add(round(r, 12))
    return np.array(sorted(out))


def brute_force(name: str, ends: tuple[bool, ...]) -> tuple[float, list[float]]:
    """The best mean over every reward sequence of ``len(ends)`` steps, and one sequence that
    reaches it (the outer sum enumerates all ``prod(len(choices))`` sequences)."""
    choices = [step_rewards(name, e) for e in ends]
    sums = functools.reduce(np.add.outer, choices)
    best = np.unravel_index(int(np.argmax(sums)), sums.shape)
    return float(sums.max()) / len(ends), [float(c[i]) for c, i in zip(choices, best, strict=True)]


def end_patterns(max_len: int):
    for length in range(1, max_len + 1):
        yield from itertools.product((False, True), repeat=length)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_interval_ceiling_is_the_brute_force_maximum_for_any_number_of_episode_ends(name):
    bound = analytic_upper_bound(spec_of(name))
    for ends in end_patterns(4):
        L, e = len(ends), sum(ends)
        best, _ = brute_force(name, ends)
        assert bound.for_interval(L, episode_ends=e) == pytest.approx(best, abs=1e-12), ends
        if e <= 1:  # the one-end form is the same bound where it applies
            assert bound.for_interval(L, contains_final_step=bool(e)) == pytest.approx(best)
        else:  # ... and falls short of what the reward can pay when there are more ends
            one_end = ((L - 1) * bound.per_step + bound.final_step) / L
            assert one_end < best - 1e-9, ends


def test_for_interval_counts_are_validated():
    b = UpperBound(per_step=0.25, final_step=1.0, derivation="explicit")
    assert b.for_interval(4, episode_ends=2) == pytest.approx((2 * 0.25 + 2 * 1.0) / 4)
    assert b.for_interval(4, episode_ends=0) == 0.25
    with pytest.raises(ValueError, match=r"episode_ends must be an integer in \[0, 3\]"):
        b.for_interval(3, episode_ends=4)
    with pytest.raises(ValueError, match="episode_ends"):
        b.for_interval(3, episode_ends=-1)
    with pytest.raises(ValueError, match="episode_ends"):
        b.for_interval(3, episode_ends=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        b.for_interval(3, True, episode_ends=1)


def scored(name: str, ends: tuple[bool, ...], rewards: list[float], tail_fraction: float):
    """Regime ``a`` (3 quiet steps) then regime ``b`` = the interval under test."""
    lead = step_rewards(name, False)[:1].tolist() * 3
    tr = EpisodeTrace.from_arrays(
        lead + rewards, ["a"] * 3 + ["b"] * len(rewards), episode_end=[False] * 3 + list(ends)
    )
    res = compute_all_metrics(tr, ceiling=spec_of(name), tail_fraction=tail_fraction)
    return res["per_trace"][0]["per_interval"][1], res["per_regime"]["b"]


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("tail_fraction", [0.5, 1.0])
def test_metrics_ceilings_are_brute_force_maxima_and_a_perfect_policy_has_no_gap(
    name, tail_fraction
):
    rng = np.random.default_rng(0)
    for ends in end_patterns(4):
        L = len(ends)
        n_tail = math.ceil(tail_fraction * L)
        best_mean, perfect = brute_force(name, ends)
        best_tail, _ = brute_force(name, ends[L - n_tail :])
        iv, row = scored(name, ends, perfect, tail_fraction)
        assert iv["ceiling"] == pytest.approx(best_mean, abs=1e-12), ends
        assert iv["settled_ceiling"] == pytest.approx(best_tail, abs=1e-12), ends
        # the policy that earns the most the rule allows falls short of nothing
        assert row["performance_gap"] == pytest.approx(0.0, abs=1e-12), ends
        # any other policy: a gap >= 0, equal to the distance of its tail mean from the best
        other = [float(rng.choice(step_rewards(name, e))) for e in ends]
        iv, row = scored(name, ends, other, tail_fraction)
        tail_mean = sum(other[L - n_tail :]) / n_tail
        assert row["performance_gap"] == pytest.approx(best_tail - tail_mean, abs=1e-12)
        assert row["performance_gap"] >= -1e-12


def test_two_episode_ends_in_the_default_tail():
    # 10 steps, the default tail is the last 2, both end an episode: the perfect policy's tail
    # pays the final-step maximum twice (brute force), and its gap is 0, not negative
    name, L = "experiment", 10
    ends = (False,) * 8 + (True, True)
    best_tail, tail = brute_force(name, ends[-2:])
    ordinary = float(step_rewards(name, False).max())
    iv, row = scored(name, ends, [ordinary] * 8 + tail, 0.2)
    assert iv["settled_ceiling"] == pytest.approx(best_tail)
    assert row["performance_gap"] == pytest.approx(0.0, abs=1e-12)
    bound = analytic_upper_bound(spec_of(name))
    assert iv["ceiling"] == pytest.approx((8 * bound.per_step + 2 * bound.final_step) / L)

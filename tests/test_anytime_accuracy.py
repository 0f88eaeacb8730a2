"""Anytime accuracy: the trapezoid rule (ours) and Koh et al.'s literal mean over evaluations
(ICLR 2022; their code's ``np.mean`` of the accuracy on the seen classes' test data), against
plain loops."""

from __future__ import annotations

import math

import pytest
import torch

from continual_eval import functional as F

NAN = math.nan
# 2 tasks, evaluations every 10 steps; task 1 unseen during stage 0
ACC = torch.tensor([[0.5, NAN], [0.7, NAN], [0.6, 0.2], [0.65, 0.4]], dtype=torch.float64)
STAGE = torch.tensor([0, 0, 1, 1])
STEPS = torch.tensor([10, 20, 30, 40])


def test_koh_rule_is_the_mean_of_the_seen_task_score_over_evaluations():
    f = [0.5, 0.7, (0.6 + 0.2) / 2, (0.65 + 0.4) / 2]
    koh = F.anytime_accuracy(ACC, STAGE, STEPS, rule="koh")
    assert koh.item() == pytest.approx(sum(f) / 4, rel=1e-15)
    # trapezoid on the even grid: the first and last points get half weight
    trapezoid = F.anytime_accuracy(ACC, STAGE, STEPS)
    assert trapezoid.item() == pytest.approx((sum(f) - (f[0] + f[-1]) / 2) / 3, rel=1e-15)


def test_test_set_weights_give_the_pooled_accuracy_of_the_seen_tasks():
    sizes = torch.tensor([10.0, 30.0], dtype=torch.float64)
    # pooled items of the seen tasks: task 0 alone in stage 0, then (10 a0 + 30 a1) / 40
    f = [0.5, 0.7, (10 * 0.6 + 30 * 0.2) / 40, (10 * 0.65 + 30 * 0.4) / 40]
    seen = F.seen_task_accuracy(ACC, STAGE, weights=sizes)
    assert seen.tolist() == pytest.approx(f, rel=1e-15)
    koh = F.anytime_accuracy(ACC, STAGE, STEPS, rule="koh", weights=sizes)
    assert koh.item() == pytest.approx(sum(f) / 4, rel=1e-15)
    equal = F.seen_task_accuracy(ACC, STAGE, weights=torch.ones(2, dtype=torch.float64))
    assert torch.allclose(equal, F.seen_task_accuracy(ACC, STAGE), rtol=1e-15, atol=0)


def test_options_are_checked():
    with pytest.raises(ValueError, match="unknown anytime-accuracy rule 'simpson'"):
        F.anytime_accuracy(ACC, STAGE, STEPS, rule="simpson")
    with pytest.raises(ValueError, match='rule="koh" takes no initial point'):
        F.anytime_accuracy(ACC, STAGE, STEPS, rule="koh", initial=torch.zeros(2).double())
    with pytest.raises(ValueError, match=r"weights\[1\] is 0.0"):
        F.anytime_accuracy(ACC, STAGE, STEPS, weights=torch.tensor([1.0, 0.0]).double())
    assert math.isnan(F.anytime_accuracy(ACC[:0], STAGE[:0], STEPS[:0], rule="koh").item())

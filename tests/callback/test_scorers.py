"""Scorers: each against a plain-torch reference, several in one evaluation (one forward per batch),
the reduction (one collective, float sums), make_scorer's errors, the package's switches, and a
2-process DDP run equal to one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from scorers_ddp_script import (
    BATCH,
    NUM_CLASSES,
    Confidence,
    brier,
    loaders,
    make_problem,
    make_scorers,
)
from torch import Tensor, nn
from torchmetrics import MeanSquaredError
from torchmetrics.classification import MulticlassF1Score

from continual_eval import evaluation
from continual_eval.evaluation import (
    AccuracyScorer,
    EvaluationError,
    LossScorer,
    MetricScorer,
    TopKAccuracyScorer,
    evaluate_tasks,
    fast_loader,
    make_scorer,
)
from script_runner import run_script

HERE = Path(__file__).parent
#: float scores: the scorers sum float32 per-sample values (rounded at ~6e-8 relative) in float64;
#: the references work in float64 from the same float32 logits
FLOAT_TOL = {"rtol": 1e-6, "atol": 1e-6}


def logits_of(net: nn.Module, x: Tensor) -> Tensor:
    """``net``'s logits computed batch by batch, as the loaders feed it (same float32 rounding)."""
    with torch.no_grad():
        return torch.cat([net(x[i : i + BATCH]) for i in range(0, len(x), BATCH)])


def macro_f1(pred: Tensor, y: Tensor) -> float:
    """Mean over the classes that occur (in preds or targets) of 2 tp / (2 tp + fp + fn)."""
    values = []
    for c in range(NUM_CLASSES):
        tp = int(((pred == c) & (y == c)).sum())
        fp, fn = int(((pred == c) & (y != c)).sum()), int(((pred != c) & (y == c)).sum())
        if tp + fp + fn:
            values.append(2 * tp / (2 * tp + fp + fn))
    return sum(values) / len(values)


def reference(net: nn.Module, tests) -> dict[str, Tensor]:
    """Plain torch, per task, float64 where it matters."""
    rows: dict[str, list[float]] = {}
    for x, y in tests:
        z = logits_of(net, x)
        zd = z.double()
        values = {
            "accuracy": (z.argmax(1) == y).double().mean(),
            "cross_entropy": nn.functional.cross_entropy(zd, y),
            "top5_accuracy": (z.topk(5, dim=1).indices == y[:, None]).any(1).double().mean(),
            "MulticlassF1Score": macro_f1(z.argmax(1), y),
            "brier": brier(zd, y).mean(),
            "nll_loss": -zd.gather(1, y[:, None]).mean(),
            "confidence": zd.softmax(1).amax(1).mean(),
        }
        for name, value in values.items():
            rows.setdefault(name, []).append(float(value))
    return {name: torch.tensor(v, dtype=torch.float64) for name, v in rows.items()}


EXACT = ("accuracy", "top5_accuracy")  # ratios of integer counts


def assert_matches(name: str, got: Tensor, expected: Tensor) -> None:
    if name in EXACT:
        assert torch.equal(got, expected), name
    else:
        torch.testing.assert_close(got, expected, **FLOAT_TOL, msg=name)


def make_f1() -> MulticlassF1Score:
    return MulticlassF1Score(num_classes=NUM_CLASSES)


class CountingNet(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net, self.calls = net, 0

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        return self.net(x)


@pytest.fixture()
def problem():
    return make_problem()


def test_each_scorer_equals_plain_torch(problem):
    net, tests = problem
    expected = reference(net, tests)
    for spec in make_scorers():
        result = evaluate_tasks(net, loaders(tests), range(3), scorers=[spec])
        (name,) = result.scorer_names
        assert_matches(name, result.scores, expected[name])
        assert torch.equal(result.scores, result.scores_by_scorer[0])
        assert result.total.tolist() == [len(y) for _, y in tests]


def test_several_scorers_one_forward_per_batch_same_numbers(problem):
    net, tests = problem
    counted = CountingNet(net)
    together = evaluate_tasks(counted, loaders(tests), range(3), scorers=make_scorers())
    batches = sum(-(-len(y) // BATCH) for _, y in tests)
    assert counted.calls == batches  # one forward per test batch for all 7 scorers

    expected = reference(net, tests)
    assert together.scorer_names == tuple(expected)
    for name, scores in zip(together.scorer_names, together.scores_by_scorer, strict=True):
        assert_matches(name, scores, expected[name])
        counted.calls = 0
        (spec,) = [s for s in make_scorers() if make_scorer(s).name == name]
        alone = evaluate_tasks(counted, loaders(tests), range(3), scorers=[spec])
        assert counted.calls == batches
        assert torch.equal(alone.scores, scores), name  # the same numbers, bit for bit
    assert torch.equal(together.scores, together.scores_by_scorer[0])
    assert torch.equal(together.correct, (expected["accuracy"] * together.total).round().long())


def test_scorer_keyword_keeps_the_single_scorer_result(problem):
    net, tests = problem
    one = evaluate_tasks(net, loaders(tests), [2, 0], scorer=AccuracyScorer())
    z = [logits_of(net, x) for x, _ in tests]
    correct = [int((z[j].argmax(1) == tests[j][1]).sum()) for j in (2, 0)]
    assert one.task_ids == (2, 0)
    assert one.correct.tolist() == correct and one.total.tolist() == [41, 37]
    assert torch.equal(one.scores, torch.tensor(correct, dtype=torch.float64) / one.total)
    assert one.scores_by_scorer == (one.scores,) and one.scorer_names == ("accuracy",)
    # a non-count first scorer: no correct counts; a loss first: its sums are not counts either
    metric = evaluate_tasks(net, loaders(tests), [0], scorer=MetricScorer(make_f1))
    loss = evaluate_tasks(net, loaders(tests), [0], scorers=["loss", "acc"])
    assert metric.correct.tolist() == [-1] and loss.correct.tolist() == [-1]
    assert loss.total.dtype == torch.int64 and loss.total.tolist() == [37]
    with pytest.raises(TypeError, match="not both"):
        evaluate_tasks(net, loaders(tests), [0], scorer=AccuracyScorer(), scorers=["acc"])
    with pytest.raises(ValueError, match="empty"):
        evaluate_tasks(net, loaders(tests), [0], scorers=[])
    empty = evaluate_tasks(net, loaders(tests), [], scorers=["acc", "loss"])
    assert [s.numel() for s in empty.scores_by_scorer] == [0, 0]


def test_one_collective_per_call_and_float_sums_reduced_exactly(problem):
    """Count scorers alone reduce as int64; with a loss the call is one float64 tensor, its integer
    counts cast back exactly. Two identical 'ranks' (x + x): same scores, doubled counts."""
    net, tests = problem
    calls: list[torch.dtype] = []

    def two_ranks(t: Tensor) -> Tensor:
        calls.append(t.dtype)
        return t + t

    plain = evaluate_tasks(net, loaders(tests), range(3), scorers=["acc", "loss", "top5"])
    ints = evaluate_tasks(
        net, loaders(tests), range(3), scorers=["acc", "top5"], all_reduce=two_ranks
    )
    assert calls == [torch.int64]
    floats = evaluate_tasks(
        net, loaders(tests), range(3), scorers=["acc", "loss", "top5"], all_reduce=two_ranks
    )
    assert calls == [torch.int64, torch.float64]  # still one collective for the call
    assert floats.correct.dtype == torch.int64 and floats.correct.tolist() == [
        2 * c for c in plain.correct.tolist()
    ]
    assert torch.equal(ints.scores, plain.scores)
    for got, want in zip(floats.scores_by_scorer, plain.scores_by_scorer, strict=True):
        assert torch.equal(got, want)  # x + x is exact in floating point
    # a metric scorer: one reduction per task, then the metric's own compute
    calls.clear()
    evaluate_tasks(
        net,
        loaders(tests),
        range(3),
        scorers=["acc", MulticlassF1Score(num_classes=NUM_CLASSES), "loss"],
        all_reduce=two_ranks,
    )
    assert calls == [torch.float64] * 3


def test_scorer_directions_bounds_and_names():
    assert (AccuracyScorer.name, AccuracyScorer.higher_is_better, AccuracyScorer.bounds) == (
        "accuracy",
        True,
        (0.0, 1.0),
    )
    top = TopKAccuracyScorer(3)
    assert (top.name, top.higher_is_better, top.bounds) == ("top3_accuracy", True, (0.0, 1.0))
    ce = LossScorer()
    assert (ce.name, ce.higher_is_better, ce.bounds) == ("cross_entropy", False, None)
    assert LossScorer(brier).name == "brier" and LossScorer(lambda p, t: p).name == "loss"
    assert LossScorer(nn.MSELoss()).name == "MSELoss" and LossScorer(brier, name="b").name == "b"
    f1 = MetricScorer(MulticlassF1Score(num_classes=3))
    assert (f1.name, f1.higher_is_better, f1.bounds) == ("MulticlassF1Score", True, (0.0, 1.0))
    mse = MetricScorer(MeanSquaredError)  # plot bounds (0, None): unbounded above
    assert (mse.higher_is_better, mse.bounds) == (False, None)

    class Undeclared(MeanSquaredError):  # noqa: N818 (a metric, not an exception)
        higher_is_better = None

    assert MetricScorer(Undeclared()).higher_is_better is True
    with pytest.raises(ValueError, match="positive integer"):
        TopKAccuracyScorer(0)


def test_make_scorer_specifications():
    assert type(make_scorer("accuracy")) is AccuracyScorer
    assert type(make_scorer(" ACC ")) is AccuracyScorer
    assert type(make_scorer("loss")) is LossScorer and make_scorer("cross_entropy").loss_fn is None
    for spec in ("top5", "top_5", "top5_accuracy", "top_5_acc"):
        assert make_scorer(spec).name == "top5_accuracy", spec
    assert make_scorer(MulticlassF1Score(num_classes=3)).name == "MulticlassF1Score"
    assert make_scorer(MeanSquaredError).name == "MeanSquaredError"  # a Metric class
    assert make_scorer(lambda: MeanSquaredError()).name == "MeanSquaredError"  # a factory
    assert make_scorer(brier).loss_fn is brier
    assert make_scorer(nn.CrossEntropyLoss()).name == "CrossEntropyLoss"
    mine = Confidence()
    assert make_scorer(mine) is mine


def test_make_scorer_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"unknown scorer 'f1'.*'accuracy'/'acc'"):
        make_scorer("f1")
    with pytest.raises(ValueError, match=r"give k: 'top5'"):
        make_scorer("top_k")
    with pytest.raises(ValueError, match="unknown scorer 'top0'"):
        make_scorer("top0")
    with pytest.raises(TypeError, match="got the class AccuracyScorer; pass an instance"):
        make_scorer(AccuracyScorer)

    class Partial:
        name = "partial"

        def start(self, device): ...

        def update(self, preds, target): ...

    with pytest.raises(
        TypeError,
        match=r"Partial does not satisfy the Scorer protocol: `higher_is_better`; `bounds`; "
        r"`count_based`; method `local_counts\(\)`; method `result\(\)`",
    ):
        make_scorer(Partial())

    class BadBounds(Confidence):
        bounds = (1.0, 0.0)
        higher_is_better = "yes"

    with pytest.raises(TypeError, match=r"`higher_is_better` must be a bool.*`bounds` must be"):
        make_scorer(BadBounds())
    with pytest.raises(TypeError, match="read as a metric factory, but it returned an int"):
        make_scorer(lambda: 3)
    with pytest.raises(TypeError, match=r"cannot make a scorer of an int.*`higher_is_better`"):
        make_scorer(3)


def test_invalid_targets_reported_once_whatever_scorers_found_them(problem):
    net, tests = problem
    x, y = tests[0]
    y = y.clone()
    y[5] = NUM_CLASSES + 2  # outside the class dimension: cross-entropy must not index it
    bad = loaders([(x, y)])
    with pytest.raises(EvaluationError) as err:
        evaluate_tasks(net, bad, [0], scorers=["acc", "loss", "top5"])
    message = str(err.value)
    assert message.startswith("task 0 ('task_0'), test dataloader 0: targets lie outside")
    assert message.count("targets lie outside the class dimension") == 1


def test_loss_problems(problem):
    net, tests = problem

    def infinite(preds: Tensor, target: Tensor) -> Tensor:
        return torch.where(target == 0, torch.inf, 1.0)

    with pytest.raises(EvaluationError, match="the mean loss is not finite"):
        evaluate_tasks(net, loaders(tests), [0], scorers=[infinite])
    with pytest.raises(EvaluationError, match=r"shape \[9\] for a batch of 8"):
        evaluate_tasks(net, loaders(tests), [0], scorers=[lambda p, t: torch.ones(9)])
    with pytest.raises(EvaluationError, match="returned a str, not a tensor"):
        evaluate_tasks(net, loaders(tests), [0], scorers=[lambda p, t: "0.5"])
    labels = [(x, y) for x, y in tests[:1]]

    class Labels(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return net(x).argmax(1)

    with pytest.raises(EvaluationError, match="cross_entropy needs class scores"):
        evaluate_tasks(Labels(), loaders(labels), [0], scorers=["loss"])
    with pytest.raises(EvaluationError, match="top9_accuracy needs at least 9 classes"):
        evaluate_tasks(net, loaders(labels), [0], scorers=["top9"])


def test_soft_targets_and_scalar_mean_losses(problem):
    """One-hot targets give the cross-entropy of their labels; a mean loss is weighted by N."""
    net, tests = problem
    one_hot = [(x, nn.functional.one_hot(y, NUM_CLASSES).float()) for x, y in tests]
    hard = evaluate_tasks(net, loaders(tests), range(3), scorers=["loss", "acc"])
    soft = evaluate_tasks(net, loaders(one_hot), range(3), scorers=["loss", "acc"])
    torch.testing.assert_close(soft.scores_by_scorer[0], hard.scores_by_scorer[0], **FLOAT_TOL)
    assert torch.equal(soft.scores_by_scorer[1], hard.scores_by_scorer[1])
    mean = evaluate_tasks(net, loaders(tests), range(3), scorers=[nn.CrossEntropyLoss()])
    torch.testing.assert_close(mean.scores, hard.scores, **FLOAT_TOL)


def test_switches_set_on_the_package_take_effect(monkeypatch):
    x, y = torch.randn(10, 2), torch.arange(10)
    loader = loaders([(x, y)])[0]
    assert fast_loader(loader) is not loader
    monkeypatch.setattr(evaluation, "FAST_PATH", False)
    assert fast_loader(loader) is loader
    monkeypatch.undo()
    assert fast_loader(loader) is not loader

    from continual_eval.evaluation import pools

    workers = torch.utils.data.DataLoader(loader.dataset, batch_size=4, num_workers=1)
    assert pools._pool_settings(workers) is not None
    monkeypatch.setattr(evaluation, "POOLED_LOADERS", False)
    assert pools._pool_settings(workers) is None
    monkeypatch.undo()
    assert pools._pool_settings(workers) is not None
    assert evaluation._POOLS is pools._POOLS  # one list, mutated in place


@pytest.mark.slow
def test_ddp_two_processes_every_scorer_equals_single_process(tmp_path):
    proc = run_script(HERE / "scorers_ddp_script.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert rank0["world_size"] == 2
    assert [a + b for a, b in zip(rank0["shard_sizes"], rank1["shard_sizes"], strict=True)] == [
        37,
        29,
        41,
    ]  # unpadded shards
    assert rank0["names"] == rank1["names"]
    for a, b in zip(rank0["scores"], rank1["scores"], strict=True):
        assert torch.equal(a, b)  # every rank holds the same numbers

    net, tests = make_problem()
    single = evaluate_tasks(net, loaders(tests), range(3), scorers=make_scorers())
    expected = reference(net, tests)
    assert rank0["names"] == single.scorer_names
    assert rank0["total"].tolist() == [37, 29, 41]
    for name, ddp, one in zip(
        rank0["names"], rank0["scores"], single.scores_by_scorer, strict=True
    ):
        if name in EXACT or name == "MulticlassF1Score":  # integer counts / integer metric states
            assert torch.equal(ddp, one), name
        else:
            # float sums: the float64 sum over ranks only reorders the terms (~1e-16), but the
            # float32 terms themselves come from other batches and another thread count (each
            # DDP process runs its own kernels; a scalar loss is a float32 mean over another
            # batch), so they may differ by a few float32 ulps: observed ~1e-8 relative
            torch.testing.assert_close(ddp, one, **FLOAT_TOL, msg=name)
        assert_matches(name, ddp, expected[name])

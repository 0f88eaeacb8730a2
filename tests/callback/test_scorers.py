"""Scorers: each against a plain-torch reference, several in one evaluation (one forward per batch),
the reduction (one collective, float sums), make_scorer's errors, the package's switches, and a
2-process DDP run equal to one process."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from scorers_ddp_script import (
    BATCH,
    NUM_CLASSES,
    TINY_SIZES,
    Confidence,
    MedianConfidence,
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
from continual_eval.evaluation import scorers as scorers_module
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
            "MedianConfidence": z.softmax(1).amax(1).median(),
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
    # a metric with sum-reduced states: its states are counts too, still one collective; its
    # doubled states give the same F1 (x + x scales every count by 2, exactly)
    calls.clear()
    with_f1 = evaluate_tasks(
        net,
        loaders(tests),
        range(3),
        scorers=["acc", MulticlassF1Score(num_classes=NUM_CLASSES), "loss"],
        all_reduce=two_ranks,
    )
    assert calls == [torch.float64]
    f1 = evaluate_tasks(net, loaders(tests), range(3), scorers=[make_f1])
    assert torch.equal(with_f1.scores_by_scorer[1], f1.scores)
    # a metric with list states: one reduction per task, then the metric's own sync and compute
    calls.clear()
    evaluate_tasks(
        net, loaders(tests), range(3), scorers=["acc", MedianConfidence()], all_reduce=two_ranks
    )
    assert calls == [torch.int64] * 3


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
    monkeypatch.setattr(evaluation.switches, "FAST_PATH", False)
    assert fast_loader(loader) is loader
    monkeypatch.undo()
    assert fast_loader(loader) is not loader

    from continual_eval.evaluation import pools

    workers = torch.utils.data.DataLoader(loader.dataset, batch_size=4, num_workers=1)
    assert pools._pool_settings(workers) is not None
    monkeypatch.setattr(evaluation.switches, "POOLED_LOADERS", False)
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


@pytest.mark.slow
@pytest.mark.ci
def test_ddp_shards_of_zero_and_one_sample_every_scorer_equals_single_process(tmp_path):
    """Issue 19 item 3: test sets of 1 and 3 samples on 2 ranks (rank 1 holds no sample of the
    first), every scorer kind plus the list-state AUROC and average precision, which
    torchmetrics' own sync cannot gather from an empty rank (gloo: "Received data size doesn't
    match"): every rank finishes with the numbers one process computes."""
    proc = run_script(HERE / "scorers_ddp_script.py", tmp_path, "tiny", timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert rank0["shard_sizes"] == [1, 2] and rank1["shard_sizes"] == [0, 1]
    for a, b in zip(rank0["scores"], rank1["scores"], strict=True):
        assert torch.equal(a, b)  # every rank holds the same numbers
    net, tests = make_problem(sizes=TINY_SIZES)
    single = evaluate_tasks(net, loaders(tests), range(2), scorers=make_scorers(tiny=True))
    assert rank0["names"] == single.scorer_names
    assert rank0["names"][-3:] == (
        "MulticlassAUROC",
        "MulticlassAveragePrecision",
        "MulticlassAUROC",
    )
    assert rank0["total"].tolist() == list(TINY_SIZES)
    for name, ddp, one in zip(
        rank0["names"], rank0["scores"], single.scores_by_scorer, strict=True
    ):
        assert torch.isfinite(ddp).all(), name
        if name in EXACT or name == "MulticlassF1Score":
            assert torch.equal(ddp, one), name
        else:  # float sums and curves over the same samples in another order
            torch.testing.assert_close(ddp, one, **FLOAT_TOL, msg=name)


# ------------------------------------------------- batches fed concatenated (batch_additive)
class CallCounting(Confidence):
    """A user's scorer that declares batch_additive: how many update calls it got."""

    batch_additive = True

    def start(self, device: torch.device) -> None:
        super().start(device)
        self.calls = 0

    def update(self, preds: Tensor, target: Tensor) -> None:
        self.calls += 1
        super().update(preds, target)


def test_batches_fed_concatenated_count_what_single_batches_count(problem, monkeypatch):
    """Each task's batches reach the batch-additive scorers in one update (F1, accuracy, loss,
    top-5, a user's scorer); with a buffer of 1 byte every batch is fed alone. Same counts, bit
    for bit; float sums up to summation order; both equal to plain torch."""
    net, tests = problem
    expected = reference(net, tests)
    batches = [-(-len(y) // BATCH) for _, y in tests]

    def run() -> tuple[Any, list[int]]:
        counting = CallCounting()
        calls = []
        original = counting.local_counts

        def local_counts() -> Tensor:
            calls.append(counting.calls)
            return original()

        counting.local_counts = local_counts  # type: ignore[method-assign]
        result = evaluate_tasks(net, loaders(tests), range(3), scorers=[*make_scorers(), counting])
        return result, calls

    grouped, grouped_calls = run()
    monkeypatch.setattr(scorers_module, "BUFFER_BYTES", 1)
    single, single_calls = run()
    assert grouped_calls == [1, 1, 1]  # one update per task
    assert single_calls == batches  # one update per batch
    for name, a, b in zip(
        grouped.scorer_names, grouped.scores_by_scorer, single.scores_by_scorer, strict=True
    ):
        if name in (*EXACT, "MulticlassF1Score", "MedianConfidence"):
            assert torch.equal(a, b), name
        else:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)
        if name in expected:
            assert_matches(name, a, expected[name])
    assert torch.equal(grouped.correct, single.correct)


def test_batches_of_other_shapes_start_a_new_group_and_nan_names_its_batch():
    """Sequence outputs [N, C, L] with L changing between batches, and batch sizes that are not
    all equal: each scorer equals plain torch over the elements, the F1 equals the metric updated
    by hand batch by batch; a NaN names its batch whichever group holds it."""
    g = torch.Generator().manual_seed(3)
    # (N, L): groups of 4 batches (equal but the last), 3 (the last larger), 1, 3 (unequal)
    shapes = [
        (4, 5),
        (4, 5),
        (4, 5),
        (3, 5),
        (2, 7),
        (2, 7),
        (5, 7),
        (3, 2),
        (2, 4),
        (5, 4),
        (1, 4),
    ]
    batches = [
        (
            torch.randn(n, NUM_CLASSES, length, generator=g),
            torch.randint(0, NUM_CLASSES, (n, length), generator=g),
        )
        for n, length in shapes
    ]
    f1 = MulticlassF1Score(num_classes=NUM_CLASSES)
    result = evaluate_tasks(
        nn.Identity(), [batches], [0], scorers=["acc", "loss", "top3", f1.clone()]
    )
    hits = top3 = elements = 0
    loss_sum = torch.zeros((), dtype=torch.float64)
    by_hand = f1.clone()
    for z, y in batches:
        hits += int((z.argmax(1) == y).sum())
        top3 += int((z.topk(3, dim=1).indices == y[:, None]).any(1).sum())
        loss_sum += nn.functional.cross_entropy(z.double(), y, reduction="sum")
        elements += y.numel()
        by_hand.update(z, y)
    accuracy, loss, top, f1_score = result.scores_by_scorer
    assert accuracy.tolist() == [hits / elements] and top.tolist() == [top3 / elements]
    torch.testing.assert_close(loss, (loss_sum / elements).reshape(1), **FLOAT_TOL)
    assert torch.equal(f1_score, by_hand.compute().double().reshape(1))
    assert result.total.tolist() == [elements]

    for bad in (2, 3, 6, 7, 9):
        broken = [(z.clone(), y) for z, y in batches]
        broken[bad][0][-1, :, 0] = math.nan
        with pytest.raises(EvaluationError, match=rf"first in batch {bad} of the test"):
            evaluate_tasks(nn.Identity(), [broken], [0], scorers=["acc", "loss"])


def test_a_batch_too_big_to_copy_keeps_the_batch_order(monkeypatch):
    """A batch of the group's shape but over BUFFER_BYTES is fed alone, after the group held
    before it: a NaN names its own batch, and the batches after it start a new group."""
    monkeypatch.setattr(scorers_module, "BUFFER_BYTES", 300)  # 2 rows: 96 bytes, 8 rows: 384
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(n, 10, generator=g), torch.randint(0, 10, (n,), generator=g))
        for n in (2, 2, 8, 2, 2)
    ]
    for bad in ((1,), (3,), (4,), (1, 2)):
        broken = [(z.clone(), y) for z, y in batches]
        for b in bad:
            broken[b][0][0, 0] = math.nan
        with pytest.raises(EvaluationError, match=rf"first in batch {bad[0]} of the test"):
            evaluate_tasks(nn.Identity(), [broken], [0], scorers=["acc"])


def test_a_step_that_reuses_its_output_buffers_is_scored_right(problem):
    """Outputs written into the same tensors at every batch (as CUDA graphs do): the loop copies
    what it holds for a later concatenation."""
    net, tests = problem
    out, labels = torch.empty(BATCH, NUM_CLASSES), torch.empty(BATCH, dtype=torch.int64)

    def step(module: nn.Module, batch: Any, task_id: int) -> tuple[Tensor, Tensor]:
        x, y = batch
        out[: len(y)] = module(x)
        labels[: len(y)] = y
        return out[: len(y)], labels[: len(y)]

    result = evaluate_tasks(net, loaders(tests), range(3), scorers=make_scorers()[:4], step=step)
    expected = reference(net, tests)
    for name, scores in zip(result.scorer_names, result.scores_by_scorer, strict=True):
        assert_matches(name, scores, expected[name])


# ------------------------------------------------------------------- torchmetrics metrics
class Binary(nn.Module):
    """Scores for a binary metric: batch 0 holds probabilities in [0, 1], later batches logits,
    so a binary metric applies a sigmoid to some batches only (it decides per batch)."""

    def forward(self, x: Tensor) -> Tensor:
        return x


def binary_batches() -> list[tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(5)
    probabilities = torch.rand(BATCH, generator=g)
    logits = [torch.randn(BATCH, generator=g) * 3 for _ in range(3)]
    return [
        (scores, torch.randint(0, 2, (BATCH,), generator=g)) for scores in (probabilities, *logits)
    ]


def by_hand(metric: Any, batches: list[tuple[Tensor, Tensor]]) -> Tensor:
    """The metric updated batch by batch, as a user calls it."""
    metric = metric.clone()
    for preds, target in batches:
        metric.update(preds, target)
    return metric.compute().double().reshape(())


def metric_cases() -> list[tuple[Any, bool, bool]]:
    """(metric, count_based, batch_additive)"""
    from torchmetrics.classification import (
        BinaryF1Score,
        MulticlassAccuracy,
        MulticlassAUROC,
        MulticlassCohenKappa,
        MulticlassJaccardIndex,
        MulticlassPrecision,
    )

    return [
        (MulticlassF1Score(num_classes=NUM_CLASSES, average="macro"), True, True),
        (MulticlassAccuracy(num_classes=NUM_CLASSES, average="micro", top_k=2), True, True),
        (
            MulticlassPrecision(num_classes=NUM_CLASSES, average="weighted", ignore_index=0),
            True,
            True,
        ),
        (MulticlassJaccardIndex(num_classes=NUM_CLASSES), True, True),
        (MulticlassCohenKappa(num_classes=NUM_CLASSES), True, True),
        # not batch-additive: a softmax applied or not per batch; integer binned states
        (MulticlassAUROC(num_classes=NUM_CLASSES, thresholds=11), True, False),
        (MulticlassAUROC(num_classes=NUM_CLASSES), False, False),  # list states
        (BinaryF1Score(), True, False),  # a sigmoid applied or not per batch
        (MeanSquaredError(), True, False),  # float states
        (MulticlassF1Score(num_classes=NUM_CLASSES, multidim_average="samplewise"), False, False),
        (MulticlassF1Score(num_classes=NUM_CLASSES, sync_on_compute=False), False, False),
    ]


def test_each_metric_equals_the_metric_called_by_hand(problem):
    """Whatever the path (states among the loop's counts or the metric's own sync; batches fed
    concatenated or one by one), a metric's score is the metric updated by hand batch by batch
    over the task's batches: bit for bit."""
    net, tests = problem
    for metric, count_based, batch_additive in metric_cases():
        scorer = MetricScorer(metric)
        assert (scorer.count_based, scorer.batch_additive) == (count_based, batch_additive), metric
        if isinstance(metric, MeanSquaredError) or getattr(metric, "multidim_average", "") != (
            "global"
        ):
            continue  # scores for regression; one score per sample
        name = type(metric).__name__
        if name == "BinaryF1Score":
            batches = binary_batches()
            result = evaluate_tasks(Binary(), [batches], [0], scorers=[scorer])
            assert result.scores.tolist() == [float(by_hand(metric, batches))], name
            continue
        result = evaluate_tasks(net, loaders(tests), range(3), scorers=[scorer])
        for j, (x, y) in enumerate(tests):
            z = logits_of(net, x)
            task_batches = [(z[i : i + BATCH], y[i : i + BATCH]) for i in range(0, len(y), BATCH)]
            assert float(result.scores[j]) == float(by_hand(metric, task_batches)), (name, j)


def test_a_batch_dependent_metric_forced_batch_additive_sees_the_concatenation():
    """The binary test data tells the difference: BinaryF1Score over the concatenation (all
    sigmoid) is not its score batch by batch; batch_additive=True gives the former."""
    from torchmetrics.classification import BinaryF1Score

    batches = binary_batches()
    joined = [(torch.cat([p for p, _ in batches]), torch.cat([t for _, t in batches]))]
    per_batch, concatenated = by_hand(BinaryF1Score(), batches), by_hand(BinaryF1Score(), joined)
    assert per_batch != concatenated
    forced = MetricScorer(BinaryF1Score(), batch_additive=True)
    result = evaluate_tasks(Binary(), [batches], [0], scorers=[forced])
    assert result.scores.tolist() == [float(concatenated)]
    with pytest.raises(TypeError, match="batch_additive must be None, True or False"):
        MetricScorer(BinaryF1Score(), batch_additive="yes")  # type: ignore[arg-type]


def test_batch_additive_only_for_the_update_it_knows():
    from torchmetrics.classification import MulticlassAccuracy

    class Mine(MulticlassAccuracy):
        def update(self, preds: Tensor, target: Tensor) -> None:
            super().update(preds[: len(preds) // 2 + 1], target[: len(target) // 2 + 1])

    assert MetricScorer(MulticlassAccuracy(num_classes=3)).batch_additive is True
    assert MetricScorer(Mine(num_classes=3)).batch_additive is False
    assert MetricScorer(Mine(num_classes=3)).count_based is True
    assert (
        MetricScorer(
            MulticlassAccuracy(num_classes=3, dist_sync_fn=lambda t, group=None: [t])
        ).count_based
        is False
    )
    assert AccuracyScorer.batch_additive and TopKAccuracyScorer(2).batch_additive
    assert LossScorer().batch_additive and not LossScorer(brier).batch_additive


def test_a_metric_state_that_changes_shape_is_an_error():
    from torchmetrics import Metric

    class Growing(Metric):
        full_state_update = False

        def __init__(self) -> None:
            super().__init__()
            self.add_state("s", torch.zeros(()), dist_reduce_fx="sum")

        def update(self, preds: Tensor, target: Tensor) -> None:
            self.s = self.s + preds.sum(0)

        def compute(self) -> Tensor:
            return self.s.sum()

    net, tests = make_problem()
    with pytest.raises(
        EvaluationError, match=r"task 0 \('task_0'\), test dataloader 0: metric Growing: state 's'"
    ):
        evaluate_tasks(net, loaders(tests), range(3), scorers=[Growing()])

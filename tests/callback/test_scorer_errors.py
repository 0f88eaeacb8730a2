"""Issue 19 item 6: a scorer that misbehaves is a named error, never a silently changed matrix.

A loss must return a real floating tensor; a loss (or a user's scorer, or metric) that modifies
``preds``/``target`` in place is refused naming it (with the default inference mode, where torch
keeps no version counters, and under ``no_grad``); a user scorer's ``result()`` of the wrong
length, 2-D or a list, a torchmetrics metric with the wrong ``num_classes`` and a meta-device
output are each an error naming the scorer, the task and the batch. Every error is compared with
the words it must hold; the good cases with a plain-torch reference.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from continual_eval.evaluation import EvaluationError, evaluate_tasks

PREFIX = r"task (\d) \('task_\d'\), test dataloader \d: "


def problem(n: int = 20, classes: int = 3, batch: int = 8) -> tuple[nn.Module, list[DataLoader]]:
    g = torch.Generator().manual_seed(0)
    net = nn.Linear(4, classes)
    with torch.no_grad():
        net.weight.copy_(torch.randn(classes, 4, generator=g))
    x = torch.randn(n, 4, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return net, [DataLoader(TensorDataset(x, y), batch_size=batch) for _ in range(2)]


def error_of(scorers, *, net=None, loaders=None, **kwargs) -> EvaluationError:
    if net is None:
        net, loaders = problem()
    with pytest.raises(EvaluationError) as info:
        evaluate_tasks(net, loaders, [0, 1], scorers=scorers, **kwargs)
    return info.value


def names_scorer_task_batch(err: Exception, scorer: str, batch: int = 0) -> str:
    """The message after the task/batch/scorer prefix (which it must start with): ``batch b``,
    or ``batches b-e`` for a scorer fed consecutive batches together (batch-additive)."""
    text = str(err)
    where = rf"(?:batch {batch}|batches {batch}-\d+)"
    match = re.match(PREFIX + rf"{where}, scorer '{re.escape(scorer)}': (.*)", text, re.S)
    assert match, text
    return match.group(2)


# --------------------------------------------------------------------------- a loss's output
@pytest.mark.parametrize(
    ("dtype", "shown"),
    [(torch.int64, "int64"), (torch.bool, "bool"), (torch.complex64, "complex64")],
)
def test_a_loss_of_integers_booleans_or_complex_numbers_is_refused(dtype, shown):
    def bad_loss(preds: Tensor, target: Tensor) -> Tensor:
        return torch.ones(preds.shape[0], dtype=dtype)

    err = error_of(["accuracy", bad_loss])
    rest = names_scorer_task_batch(err, "bad_loss")
    assert rest.startswith(f"loss bad_loss returned a {shown} tensor; a loss is a real floating")


def test_a_float_loss_is_accepted_and_exact():
    net, loaders = problem()

    def squared(preds: Tensor, target: Tensor) -> Tensor:
        return (preds.double() ** 2).sum(dim=1)

    got = evaluate_tasks(net, loaders, [0], scorers=[squared]).scores
    x = loaders[0].dataset.tensors[0]
    with torch.no_grad():
        expected = (net(x).double() ** 2).sum(dim=1).mean()
    torch.testing.assert_close(got, expected.reshape(1), rtol=1e-6, atol=1e-9)


# --------------------------------------------------------------------------- in-place writes
def add_to_preds(preds: Tensor, target: Tensor) -> Tensor:
    preds.add_(100.0)  # e.g. a "temperature" applied in place
    return preds.logsumexp(dim=1)


def write_through_a_view(preds: Tensor, target: Tensor) -> Tensor:
    preds[:, 0] = 1e9
    return preds.sum(dim=1)


def zero_the_target(preds: Tensor, target: Tensor) -> Tensor:
    target.zero_()
    return preds.sum(dim=1)


@pytest.mark.parametrize("inference_mode", [True, False])
@pytest.mark.parametrize(
    ("loss", "which"),
    [(add_to_preds, "preds"), (write_through_a_view, "preds"), (zero_the_target, "target")],
)
def test_a_loss_that_modifies_its_inputs_in_place_is_refused(loss, which, inference_mode):
    """The loss comes first, so today its write would change the accuracy after it."""
    kwargs = {} if inference_mode else {"grad_context": torch.no_grad}
    err = error_of([loss, "accuracy", MulticlassAccuracy(num_classes=3)], **kwargs)
    rest = names_scorer_task_batch(err, loss.__name__)
    assert rest.startswith(f"loss {loss.__name__} modified {which} in place; every scorer")


def test_under_inference_mode_the_loss_gets_copies_the_others_never_see():
    """A loss that only reads gives the same accuracy as without it, with both grad contexts."""
    net, loaders = problem()
    alone = evaluate_tasks(net, loaders, [0, 1], scorers=["accuracy"]).scores
    for kwargs in ({}, {"grad_context": torch.no_grad}):
        both = evaluate_tasks(
            net, loaders, [0, 1], scorers=[lambda p, t: p.logsumexp(1), "accuracy"], **kwargs
        )
        assert torch.equal(both.scores_by_scorer[1], alone)


class Writer:
    """A user's protocol scorer whose update writes into ``preds``."""

    name = "writer"
    higher_is_better = True
    bounds = None
    count_based = True

    def start(self, device: torch.device) -> None:
        self.total = 0

    def update(self, preds: Tensor, target: Tensor) -> None:
        preds.mul_(-1)
        self.total += preds.shape[0]

    def local_counts(self) -> Tensor:
        return torch.tensor([0, self.total])

    def result(self, reduced_counts: Tensor) -> Tensor:
        return reduced_counts[:, 0].double()


def test_a_user_scorer_that_modifies_preds_is_refused_where_torch_counts_writes():
    err = error_of([Writer(), "accuracy"], grad_context=torch.no_grad)
    rest = names_scorer_task_batch(err, "writer")
    assert rest.startswith("its update modified preds in place")


# --------------------------------------------------------------------------- result()
class Protocol:
    """A count-based user scorer whose ``result`` returns what it is told to."""

    higher_is_better = True
    bounds = None

    def __init__(self, name: str, result, count_based: bool = True) -> None:
        self.name, self._result, self.count_based = name, result, count_based

    def start(self, device: torch.device) -> None:
        self.total = 0

    def update(self, preds: Tensor, target: Tensor) -> None:
        self.total += preds.shape[0]

    def local_counts(self) -> Tensor:
        return torch.tensor([1, self.total])

    def result(self, reduced_counts: Tensor):
        return self._result(reduced_counts)


@pytest.mark.parametrize(
    ("result", "words"),
    [
        (
            lambda c: c[:1, 0].double(),
            "returned a tensor of shape [1], not [2], one score per task",
        ),
        (lambda c: c.double(), "returned a tensor of shape [2, 2], not [2], one score per task"),
        (
            lambda c: [0.5, 0.5],
            "returned a list [float, float], not a tensor of [2], one score per task",
        ),
        (lambda c: c[:, 0] > 0, "returned a torch.bool tensor; scores are real numbers"),
        (
            lambda c: torch.zeros(2, device="meta"),
            "returned a tensor on the meta device",
        ),
    ],
)
def test_a_count_based_result_of_the_wrong_form_names_the_scorer_and_tasks(result, words):
    err = error_of([Protocol("custom", result)])
    assert str(err).startswith("scorer 'custom': result() over the 2 task(s) [0, 1] " + words)


def test_a_result_of_the_wrong_form_names_the_task_when_scored_per_task():
    err = error_of([Protocol("per_task", lambda c: c.double(), count_based=False)])
    assert re.match(
        PREFIX + r"scorer 'per_task': result\(\) returned a tensor of shape \[2\], not one number",
        str(err),
    ), str(err)


def test_a_right_result_passes_unchanged():
    net, loaders = problem()
    got = evaluate_tasks(
        net, loaders, [0, 1], scorers=[Protocol("half", lambda c: c[:, 0] / 2.0)]
    ).scores
    assert torch.equal(got, torch.tensor([0.5, 0.5], dtype=torch.float64))


# --------------------------------------------------------------------------- torchmetrics errors
def test_a_metric_with_the_wrong_num_classes_is_named_with_task_and_batch():
    net, loaders = problem(classes=5)
    err = error_of([MulticlassAccuracy(num_classes=3)], net=net, loaders=loaders)
    rest = names_scorer_task_batch(err, "MulticlassAccuracy")
    assert rest.startswith("metric MulticlassAccuracy: its update raised ")
    assert "number of classes" in rest
    assert err.__cause__ is not None and err.__cause__.__cause__ is not None  # chained


def test_an_exception_in_a_user_scorer_is_named_with_task_and_batch():
    def fail(preds: Tensor, target: Tensor) -> None:
        raise RuntimeError("CUDA error: device-side assert triggered")

    scorer = Protocol("fragile", lambda c: c[:, 0].double())
    scorer.update = fail  # type: ignore[method-assign]
    err = error_of([scorer])
    rest = names_scorer_task_batch(err, "fragile")
    assert rest == "its update raised RuntimeError: CUDA error: device-side assert triggered"


def test_the_batch_named_is_the_one_that_failed():
    net, loaders = problem()
    seen = [0]

    def fails_on_the_third(preds: Tensor, target: Tensor) -> Tensor:
        seen[0] += 1
        if seen[0] == 3:
            return torch.ones(preds.shape[0], dtype=torch.int32)
        return preds.sum(dim=1)

    err = error_of([fails_on_the_third], net=net, loaders=loaders)
    rest = names_scorer_task_batch(err, "fails_on_the_third", batch=2)
    assert "int32" in rest


# --------------------------------------------------------------------------- the meta device
class MetaNet(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.zeros(x.shape[0], 3, device="meta")


@pytest.mark.parametrize(
    ("scorer", "name"),
    [
        ("accuracy", "accuracy"),
        ("cross_entropy", "cross_entropy"),
        ("top2", "top2_accuracy"),
        (MulticlassAccuracy(num_classes=3), "MulticlassAccuracy"),
        (lambda p, t: p.sum(1), "loss"),
        (Protocol("custom", lambda c: c[:, 0].double()), "custom"),
    ],
)
def test_a_meta_device_output_says_what_it_is(scorer, name):
    _, loaders = problem()
    err = error_of([scorer], net=MetaNet(), loaders=loaders, device="cpu")
    rest = names_scorer_task_batch(err, name)
    assert rest.startswith("the model returned a tensor on the meta device, which holds no values")


def test_a_one_element_matrix_is_not_one_number():
    """``[[0.5]]`` (2-D) is refused where one number is meant; ``0.5`` and ``[0.5]`` pass."""
    err = error_of([Protocol("per_task", lambda c: torch.tensor([[0.5]]), count_based=False)])
    assert re.match(
        PREFIX + r"scorer 'per_task': result\(\) returned a tensor of shape \[1, 1\], not one "
        r"number",
        str(err),
    ), str(err)
    net, loaders = problem()
    for value in (torch.tensor(0.5), torch.tensor([0.5])):
        scorer = Protocol("one", lambda c, v=value: v, count_based=False)
        got = evaluate_tasks(net, loaders, [0, 1], scorers=[scorer]).scores
        assert torch.equal(got, torch.tensor([0.5, 0.5], dtype=torch.float64))


def test_a_scorer_error_in_a_fit_names_the_key_given_in_scorers(tmp_path):
    """The key of ``scorers=`` (the matrix's name, the user's word for it) and the object's own
    ``name`` when they differ."""
    import lightning.pytorch as pl
    from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, trainer_kwargs

    from continual_eval import ContinualEvalCallback

    tasks = make_tasks(2)
    bad = Protocol("proto", lambda c: c.double())  # [2, 2]: not one score per task
    cb = ContinualEvalCallback(
        eval_loaders(tasks), scorers={"acc": "accuracy", "mine": bad}, verbose=False
    )
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))
    with pytest.raises(Exception, match=r"scorer 'mine' \(name 'proto'\): result\(\)") as info:
        trainer.fit(Classifier(make_net()), eval_loaders(tasks)[0])
    assert "scorer 'proto':" not in str(info.value)

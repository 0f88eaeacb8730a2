"""Bad model output or targets: an error naming the task, the test dataloader and what was wrong,
never a silently wrong R; what was recorded before stays on disk. Real Trainer runs on CPU."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import (
    NUM_CLASSES,
    Classifier,
    eval_loaders,
    make_net,
    make_tasks,
    train_loaders,
    trainer_kwargs,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy

from continual_eval.callback import ContinualEvalCallback
from continual_eval.evaluation import EvaluationError, evaluate_tasks
from continual_eval.results import ContinualResults


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


def fit_one(cb, model, tasks, tmp_path, task: int = 0) -> None:
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))
    trainer.fit(model, train_loaders(tasks)[task])


def plain_accuracy(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Reference: argmax hits / samples, one forward over the whole test set."""
    net.eval()
    with torch.no_grad():
        return int((net(x).argmax(1) == y).sum()) / len(y)


# ---------------------------------------------------------------- item 4: non-finite predictions
def test_nan_logits_for_some_samples_name_task_batch_and_count(tasks, tmp_path):
    loaders = eval_loaders(tasks)  # batch size 8
    cb = ContinualEvalCallback(loaders, dirpath=tmp_path, verbose=False)
    model = Classifier(make_net())
    fit_one(cb, model, tasks, tmp_path)  # baseline and stage 0 recorded
    recorded = cb.scores.clone()
    x1 = tasks[1][1][0]  # the tensor task 1's test loader reads
    original = x1[19:22].clone()
    x1[19:22] = math.nan  # rows of batch 2 (16..23): every logit of those rows is NaN
    try:
        with pytest.raises(
            EvaluationError,
            match=r"task 1 \('task_1'\), test dataloader 1: .*non-finite.* 3 of the 29 "
            r"predictions.*first in batch 2",
        ):
            fit_one(cb, model, tasks, tmp_path, task=1)
    finally:
        x1[19:22] = original
    saved = ContinualResults.load(tmp_path).to_dict()
    assert saved["stages_completed"] == 1
    assert saved["scores"] == recorded.tolist()


def test_nan_in_one_logit_column_is_an_error_not_class_frequencies(tasks, tmp_path):
    class NaNColumn(Classifier):
        def forward(self, x):
            out = self.net(x)
            return torch.cat([out[:, :2], torch.full_like(out[:, 2:], math.nan)], 1)

    cb = ContinualEvalCallback(eval_loaders(tasks), task_names=["a", "b", "c"], verbose=False)
    with pytest.raises(
        EvaluationError,
        match=r"task 0 \('a'\), test dataloader 0: .*non-finite.* 37 of the 37 predictions"
        r".*first in batch 0",
    ):
        fit_one(cb, NaNColumn(make_net()), tasks, tmp_path)


# ---------------------------------------------------------------- item 5: float targets
def test_one_hot_and_probability_targets_score_as_their_argmax(tasks, tmp_path):
    plain, one_hot, smoothed = eval_loaders(tasks), [], []
    for _, (x, y) in tasks:
        hot = torch.nn.functional.one_hot(y, NUM_CLASSES).float()
        one_hot.append(DataLoader(TensorDataset(x, hot), batch_size=8))
        smoothed.append(DataLoader(TensorDataset(x, 0.8 * hot + 0.2 / NUM_CLASSES), batch_size=8))
    whole = [DataLoader(TensorDataset(x, y.float()), batch_size=8) for _, (x, y) in tasks]
    integer_one_hot = [
        DataLoader(TensorDataset(x, torch.nn.functional.one_hot(y, NUM_CLASSES)), batch_size=8)
        for _, (x, y) in tasks
    ]
    callbacks = [
        ContinualEvalCallback(dl, prefix=f"{k}/", dirpath=tmp_path / str(k), verbose=False)
        for k, dl in enumerate([plain, one_hot, smoothed, whole, integer_one_hot])
    ]
    model = Classifier(make_net())
    pl.Trainer(callbacks=callbacks, **trainer_kwargs(tmp_path, max_epochs=1)).fit(
        model, train_loaders(tasks)[0]
    )
    expected = torch.tensor(
        [plain_accuracy(model.net, x, y) for _, (x, y) in tasks], dtype=torch.float64
    )
    for cb in callbacks:
        assert torch.equal(cb.scores[0], expected)


@pytest.mark.parametrize(
    ("make_target", "message"),
    [
        (lambda y: y.float() + 0.5, r"29 floating-point targets are not whole numbers"),
        (
            lambda y: torch.nn.functional.one_hot(y, NUM_CLASSES).float() + 1.0,  # multi-hot
            r"29 target rows shaped like the predictions are not one-hot or probability",
        ),
    ],
)
def test_float_targets_that_are_not_labels_are_an_error(tasks, tmp_path, make_target, message):
    loaders = eval_loaders(tasks)
    x, y = tasks[1][1]
    loaders[1] = DataLoader(TensorDataset(x, make_target(y)), batch_size=8)
    cb = ContinualEvalCallback(loaders, verbose=False)
    with pytest.raises(
        EvaluationError, match=r"task 1 \('task_1'\), test dataloader 1: " + message
    ):
        fit_one(cb, Classifier(make_net()), tasks, tmp_path)


# ---------------------------------------------------------------- item 6: common mistakes
class ReturnsTuple(Classifier):
    def forward(self, x):
        return self.net(x), x.sum(1)


class ReturnsDict(Classifier):
    def forward(self, x):
        return {"logits": self.net(x)}


class StepReturnsOneTensor(Classifier):
    def continual_eval_step(self, batch, task_id):
        return self(batch[0])


@pytest.mark.parametrize(
    ("model_cls", "message"),
    [
        (
            ReturnsTuple,
            r"the model returned a tuple \(Tensor\[8, 3\] float32, Tensor\[8\] float32\).*"
            r"continual_eval_step",
        ),
        (ReturnsDict, r"the model returned a dict \{'logits': Tensor\[8, 3\] float32\}"),
        (
            StepReturnsOneTensor,
            r"continual_eval_step returned a Tensor\[8, 3\] float32.*pair \(preds, target\)",
        ),
    ],
)
def test_model_output_that_is_not_scores(tasks, tmp_path, model_cls, message):
    cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
    with pytest.raises(
        EvaluationError, match=r"task 0 \('task_0'\), test dataloader 0: " + message
    ):
        fit_one(cb, model_cls(make_net()), tasks, tmp_path)


def test_task_id_batch_with_a_forward_that_takes_no_task_id(tasks, tmp_path):
    loaders = [
        DataLoader(TensorDataset(x, y, torch.full_like(y, j)), batch_size=8)
        for j, (_, (x, y)) in enumerate(tasks)
    ]
    cb = ContinualEvalCallback(loaders, verbose=False)
    with pytest.raises(
        EvaluationError,
        match=r"task 0 \('task_0'\), test dataloader 0: the batch had 3 elements, so it was "
        r"scored as module\(x, t\).*continual_eval_step",
    ) as raised:
        fit_one(cb, Classifier(make_net()), tasks, tmp_path)
    cause = raised.value
    while cause.__cause__ is not None:
        cause = cause.__cause__
    assert isinstance(cause, TypeError)  # the original error is kept


class RecallOfClass(Metric):
    """Recall of one class: NaN (0/0) on a test set without that class."""

    full_state_update = False

    def __init__(self, class_index: int) -> None:
        super().__init__()
        self.class_index = class_index
        self.add_state("hits", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, preds, target):
        mask = target == self.class_index
        self.hits += (preds.argmax(1)[mask] == self.class_index).sum()
        self.count += mask.sum()

    def compute(self):
        return self.hits / self.count


def test_metric_returning_nan_or_a_vector_is_an_error_naming_task_and_metric(tasks, tmp_path):
    loaders = eval_loaders(tasks)
    x, y = tasks[2][1]
    keep = y != 1
    loaders[2] = DataLoader(TensorDataset(x[keep], y[keep]), batch_size=8)  # no class 1
    cb = ContinualEvalCallback(loaders, metric=RecallOfClass(1), verbose=False)
    with pytest.raises(
        EvaluationError, match=r"task 2 \('task_2'\), test dataloader 2: metric RecallOfClass .*nan"
    ):
        fit_one(cb, Classifier(make_net()), tasks, tmp_path)

    vector = MulticlassAccuracy(num_classes=NUM_CLASSES, average="none")
    cb = ContinualEvalCallback(eval_loaders(tasks), metric=vector, verbose=False)
    with pytest.raises(
        EvaluationError,
        match=r"task 0 \('task_0'\), test dataloader 0: metric MulticlassAccuracy returned a "
        r"tensor of shape \[3\]",
    ):
        fit_one(cb, Classifier(make_net()), tasks, tmp_path)


def test_masked_classes_at_minus_inf_are_scored(tasks, tmp_path):
    """Task-incremental masking: -inf next to finite scores is a valid prediction."""

    class Masked(Classifier):
        def forward(self, x):
            out = self.net(x)
            return torch.cat([out[:, :2], torch.full_like(out[:, 2:], -math.inf)], 1)

    model = Masked(make_net())
    cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False)
    fit_one(cb, model, tasks, tmp_path)
    expected = [plain_accuracy(model, x, y) for _, (x, y) in tasks]
    assert cb.scores[0].tolist() == expected


class HostSyncCounter(TorchDispatchMode):
    """Counts the ops that read a tensor's value on the host (``.item()``, ``int()``, ``bool()``,
    ``torch.equal``): each is a device-to-host sync on an accelerator."""

    READS = frozenset(
        {
            torch.ops.aten.item.default,
            torch.ops.aten._local_scalar_dense.default,
            torch.ops.aten.is_nonzero.default,
            torch.ops.aten.equal.default,
        }
    )

    def __init__(self) -> None:
        super().__init__()
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.syncs += func in self.READS
        return func(*args, **(kwargs or {}))


def test_accuracy_path_has_no_host_sync_per_batch(tasks):
    net = make_net()
    x, y = tasks[0][1]

    def syncs(num_batches: int, target: torch.Tensor) -> int:
        batches = [(x[:8], target[:8])] * num_batches  # pre-collated: no DataLoader
        with HostSyncCounter() as counter:
            evaluate_tasks(net, [batches], [0])
        return counter.syncs

    one_hot = torch.nn.functional.one_hot(y, NUM_CLASSES).float()
    for target in (y, y.float(), one_hot):
        assert syncs(3, target) == syncs(12, target)  # per task, not per batch


def test_several_scorers_have_no_host_sync_per_batch(tasks):
    """Accuracy, cross-entropy, top-2 and a torchmetrics F1 (count-based, fed concatenated
    batches) with a list-state metric (its own per-batch updates): host reads per task, not per
    batch."""
    from torchmetrics.classification import MulticlassF1Score
    from torchmetrics.utilities import dim_zero_cat

    class TopScores(Metric):
        full_state_update = False

        def __init__(self) -> None:
            super().__init__()
            self.add_state("top", [], dist_reduce_fx="cat")

        def update(self, preds, target):
            self.top.append(preds.amax(1))

        def compute(self):
            return dim_zero_cat(self.top).mean()

    net = make_net()
    x, y = tasks[0][1]

    def syncs(num_batches: int, with_list_metric: bool) -> int:
        batches = [(x[:8], y[:8])] * num_batches
        scorers = ["acc", "loss", "top2", MulticlassF1Score(num_classes=NUM_CLASSES)]
        if with_list_metric:
            scorers.append(TopScores())
        with HostSyncCounter() as counter:
            evaluate_tasks(net, [batches, batches], [0, 1], scorers=scorers)
        return counter.syncs

    for with_list_metric in (False, True):
        assert syncs(3, with_list_metric) == syncs(12, with_list_metric)

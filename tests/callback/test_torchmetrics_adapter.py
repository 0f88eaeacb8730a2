"""The torchmetrics internals MetricScorer relies on (evaluation/_torchmetrics_adapter.py): the
versions they were checked on, and each assumption checked against the installed torchmetrics
(CI runs this file with the newest and with the lowest declared version)."""

from __future__ import annotations

from pathlib import Path

import torch
import torchmetrics
from torch import Tensor
from torchmetrics.classification import MulticlassAccuracy, MulticlassAUROC

from continual_eval.evaluation import _torchmetrics_adapter as tm

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_torchmetrics_is_a_checked_version():
    """A torchmetrics outside the checked versions may have moved the internals: re-check every
    function of the adapter (and this file) on it, then add it to CHECKED_VERSIONS."""
    assert torchmetrics.__version__ in tm.CHECKED_VERSIONS, (
        f"torchmetrics {torchmetrics.__version__} is not among the versions the adapter was "
        f"checked on, {tm.CHECKED_VERSIONS}"
    )


def test_the_lowest_checked_version_is_the_ci_floor():
    pins = dict(
        line.split("#", 1)[0].strip().split("==")
        for line in (ROOT / ".ci" / "lowest.txt").read_text().splitlines()
        if "==" in line.split("#", 1)[0]
    )
    assert tm.CHECKED_VERSIONS[0] == pins["torchmetrics"]


def test_states_and_reductions():
    acc = MulticlassAccuracy(num_classes=3, average="micro")
    defaults = tm.state_defaults(acc)
    assert list(defaults) == ["tp", "fp", "tn", "fn"]
    assert all(isinstance(d, Tensor) for d in defaults.values())
    assert all(tm.is_sum_reduction(f) for f in tm.state_reductions(acc).values())
    auroc = MulticlassAUROC(num_classes=3)  # thresholds=None: every sample's scores kept
    assert tm.state_defaults(auroc) == {"preds": [], "target": []}
    assert all(tm.is_cat_reduction(f) for f in tm.state_reductions(auroc).values())
    assert not any(tm.is_sum_reduction(f) for f in tm.state_reductions(auroc).values())
    assert tm.state_defaults(object()) == {} and tm.state_reductions(object()) == {}


class OwnSync(MulticlassAccuracy):
    def _sync_dist(self, dist_sync_fn=None, process_group=None) -> None:  # type: ignore[override]
        pass


class OwnKernel(MulticlassAccuracy):
    def _update_state(self, tp, fp, tn, fn) -> None:  # type: ignore[override]
        super()._update_state(tp, fp, tn, fn)


def test_default_sync_and_the_metrics_inside():
    acc = MulticlassAccuracy(num_classes=3)
    assert tm.default_sync(acc) and tm.metrics_in(acc) == [acc]
    composed = acc + MulticlassAccuracy(num_classes=3, average="micro")
    assert tm.default_sync(composed)  # CompositionalMetric: its children sync themselves
    assert len(tm.metrics_in(composed)) == 3
    assert not tm.default_sync(OwnSync(num_classes=3))


def test_own_update_state():
    from torchmetrics.classification import MulticlassStatScores

    assert tm.own_update_state(MulticlassAccuracy(num_classes=3), MulticlassStatScores)
    assert not tm.own_update_state(OwnKernel(num_classes=3), MulticlassStatScores)


def test_unwrapped_compute_reads_the_states_without_cache():
    acc = MulticlassAccuracy(num_classes=2, average="micro")
    acc.update(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))
    assert float(acc.compute()) == 0.5  # the instance's compute caches this value
    acc.tp, acc.fn = torch.tensor(2), torch.tensor(0)
    assert float(tm.unwrapped_compute(acc)) == 1.0  # the states as they are now
    assert float(acc.compute()) == 0.5  # the wrapper's cache: what unwrapped_compute avoids


def test_sync_disabled_keeps_compute_from_syncing():
    calls: list[Tensor] = []

    def gather(tensor: Tensor, group=None) -> list[Tensor]:
        calls.append(tensor)
        return [tensor]

    def make() -> MulticlassAUROC:
        metric = MulticlassAUROC(
            num_classes=2, dist_sync_fn=gather, distributed_available_fn=lambda: True
        )
        metric.update(torch.tensor([[0.8, 0.2], [0.3, 0.7]]), torch.tensor([0, 1]))
        return metric

    make().compute()
    assert calls  # torchmetrics syncs when it believes it runs distributed
    calls.clear()
    metric = make()
    with tm.sync_disabled(metric):
        assert not metric.distributed_available_fn()
        assert float(metric.compute()) == 1.0
    assert not calls
    assert metric.distributed_available_fn()  # restored


def test_torchmetrics_sends_an_empty_rank_a_placeholder_of_another_shape():
    """Why MetricScorer gathers list states itself: torchmetrics' sync sends a rank without
    samples a 1-D tensor of the metric's dtype where the others send ``[n, C]`` scores and
    int64 targets, so a real all_gather's sizes differ between ranks."""
    shapes: list[tuple[tuple[int, ...], torch.dtype]] = []

    def record(tensor: Tensor, group=None) -> list[Tensor]:
        shapes.append((tuple(tensor.shape), tensor.dtype))
        return [tensor]

    empty, full = MulticlassAUROC(num_classes=3), MulticlassAUROC(num_classes=3)
    full.update(torch.rand(4, 3), torch.tensor([0, 1, 2, 0]))
    for metric in (empty, full):
        metric._sync_dist(record)
    (empty_preds, empty_target), (full_preds, full_target) = shapes[:2], shapes[2:]
    assert empty_preds == ((0,), torch.float32) and empty_target == ((0,), torch.float32)
    assert full_preds == ((4, 3), torch.float32) and full_target == ((4,), torch.int64)

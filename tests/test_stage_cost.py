"""The pure parts of continual_eval.stage_cost, against plain-Python references."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from continual_eval.stage_cost import (
    StageCost,
    StageCostRecorder,
    batch_samples,
    model_size_efficiency,
    summarize_costs,
)


def _ms_reference(counts: list[int]) -> float:
    total = 0.0
    for c in counts:
        total += counts[0] / c
    return min(1.0, total / len(counts))


@pytest.mark.parametrize("counts", [[10], [10, 10, 10], [10, 20, 40], [40, 20], [3, 7, 7, 11, 13]])
def test_model_size_efficiency_matches_loop(counts: list[int]) -> None:
    assert model_size_efficiency(counts) == pytest.approx(_ms_reference(counts), abs=1e-15)


def test_model_size_efficiency_absent_and_invalid() -> None:
    assert model_size_efficiency([]) is None
    with pytest.raises(ValueError, match="positive"):
        model_size_efficiency([10, 0])


def test_batch_samples_reads_first_tensor() -> None:
    x, y = torch.zeros(7, 3), torch.zeros(7)
    assert batch_samples((x, y)) == 7
    assert batch_samples({"meta": "a", "x": torch.zeros(5, 2)}) == 5
    assert batch_samples([["no tensor"], (torch.zeros(()), torch.zeros(4))]) == 4
    assert batch_samples("text") is None
    assert batch_samples(torch.zeros(())) is None


class _Replay(nn.Module):
    def __init__(self, size: object) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.frozen = nn.Parameter(torch.zeros(4), requires_grad=False)
        self.size = size

    def continual_eval_memory_size(self) -> object:
        return self.size


def test_recorder_counts_every_stage() -> None:
    recorder = StageCostRecorder()
    module = _Replay(12)
    costs = []
    for stage in range(2):
        recorder.start_stage(torch.device("cpu"))
        for n in (4, 4, 3):
            recorder.add_batch((torch.zeros(n, 3), torch.zeros(n)))
        assert recorder.samples == 11
        seconds = recorder.train_seconds()
        assert seconds >= 0
        cost = recorder.finish_stage(
            stage,
            module,
            train_seconds=seconds,
            eval_seconds=0.5,
            samples=recorder.samples,
            optimizer_steps=3,
        )
        assert cost.parameters == 3 * 2 + 2 + 4
        assert cost.trainable_parameters == 3 * 2 + 2
        assert cost.replay_memory == 12
        assert cost.memory_kind == "process_peak_rss" and cost.peak_memory_bytes > 0
        costs.append(cost)
        assert recorder.progress(stage) is None  # the stage ended
    summary = summarize_costs(costs)
    assert summary["samples"] == 22 and summary["optimizer_steps"] == 6
    assert summary["model_size_efficiency"] == 1.0


@pytest.mark.parametrize("size", [-1, 1.5, "many", True])
def test_replay_hook_must_return_a_count(size: object) -> None:
    recorder = StageCostRecorder()
    recorder.start_stage(torch.device("cpu"))
    with pytest.raises(ValueError, match="continual_eval_memory_size"):
        recorder.finish_stage(
            0, _Replay(size), train_seconds=0.0, eval_seconds=0.0, samples=0, optimizer_steps=0
        )


def test_stage_cost_from_dict_names_missing_fields() -> None:
    cost = StageCost(0, 1.0, 0.1, 10, "process_peak_rss", 5, 5, 8, 2, None)
    assert StageCost.from_dict(cost.to_dict()) == cost
    data = cost.to_dict()
    del data["samples"]
    with pytest.raises(ValueError, match="samples"):
        StageCost.from_dict(data)


def test_summary_and_memory_kind_of_a_list_of_costs() -> None:
    from continual_eval.stage_cost import memory_kind, summarize_costs

    a = StageCost(0, 1.0, 0.5, 30, "process_peak_rss", 10, 10, 8, 2, None)
    b = StageCost(1, 2.0, 0.25, 20, "cuda_max_allocated", 20, 20, 4, 1, 7)
    summary = summarize_costs([a, b])
    assert summary == {
        "train_seconds": 3.0,
        "eval_seconds": 0.75,
        "samples": 12,
        "optimizer_steps": 3,
        "peak_memory_bytes": 30,
        "model_size_efficiency": _ms_reference([10, 20]),
    }
    assert summarize_costs([])["model_size_efficiency"] is None
    assert memory_kind([a]) == "process_peak_rss" and memory_kind([a, b]) == "mixed"
    assert memory_kind([]) is None


def test_model_size_efficiency_needs_the_stages_from_the_first() -> None:
    """MS divides stage 0's parameter count by each stage's: without stage 0 (a run resumed from
    a checkpoint written before costs were recorded) or with a gap it is absent, not the MS of
    the stages that happen to be recorded."""
    from continual_eval.stage_cost import summarize_costs

    def cost(stage: int, parameters: int) -> StageCost:
        return StageCost(
            stage, 1.0, 0.5, 30, "process_peak_rss", parameters, parameters, 8, 2, None
        )

    assert summarize_costs([cost(0, 10), cost(1, 20)])["model_size_efficiency"] == 0.75
    assert summarize_costs([cost(1, 20), cost(2, 20)])["model_size_efficiency"] is None
    assert summarize_costs([cost(0, 10), cost(2, 20)])["model_size_efficiency"] is None


def test_replay_hook_may_return_a_numpy_integer() -> None:
    np = pytest.importorskip("numpy")
    recorder = StageCostRecorder()
    recorder.start_stage(torch.device("cpu"))
    cost = recorder.finish_stage(
        0, _Replay(np.int64(12)), train_seconds=0.0, eval_seconds=0.0, samples=0, optimizer_steps=0
    )
    assert cost.replay_memory == 12 and type(cost.replay_memory) is int


def test_summary_without_stages_is_absent_not_zero() -> None:
    from continual_eval.stage_cost import summarize_costs

    summary = summarize_costs([])
    assert summary and all(value is None for value in summary.values())
    assert set(summary) == {
        "train_seconds",
        "eval_seconds",
        "samples",
        "optimizer_steps",
        "peak_memory_bytes",
        "model_size_efficiency",
    }

"""``ddp`` and ``ddp_spawn`` on 2 CPU processes: every stage recorded once, R exact, and the process
that started a ``ddp_spawn`` run sees the rows its children recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cl_helpers import make_net, make_tasks

from continual_eval.results import check_results_files, load_results, results_to_tensors
from script_runner import run_spawn_script

HERE = Path(__file__).parent
NUM_TASKS = 4


def plain_accuracy(state: dict, tasks) -> torch.Tensor:
    """Accuracy of the saved weights on every whole test set: one process, plain torch."""
    net = make_net()
    net.load_state_dict({k.removeprefix("net."): v for k, v in state.items()})
    net.eval()
    with torch.no_grad():
        return torch.tensor(
            [int((net(x).argmax(1) == y).sum()) / len(y) for _, (x, y) in tasks],
            dtype=torch.float64,
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "pattern"),
    [("ddp_spawn", "schedule"), ("ddp_spawn", "fit_tasks"), ("ddp", "schedule")],
)
def test_two_processes_record_every_stage_once(tmp_path, strategy, pattern):
    proc, out = run_spawn_script(HERE / "spawn_script.py", tmp_path, strategy, pattern)
    assert proc.returncode == 0, proc.stderr[-4000:]

    tasks = make_tasks(NUM_TASKS)
    reference = torch.stack(
        [plain_accuracy(torch.load(out / f"weights_{i}.pt"), tasks) for i in range(NUM_TASKS)]
    )
    assert not torch.equal(reference[0], reference[1])  # the stages differ: a repeat would show

    main = torch.load(out / "main_process.pt", weights_only=False)
    assert main["stages"] == NUM_TASKS
    assert torch.equal(main["scores"], reference)
    assert Path(main["results_dir"]) == out / "results"
    assert main["results"]["stages_completed"] == NUM_TASKS

    on_disk = load_results(out / "results")
    scores, baseline = results_to_tensors(on_disk)
    assert torch.equal(scores, reference)
    assert torch.equal(baseline, main["baseline"])
    assert check_results_files(out / "results") is None
    assert not list((out / "results").glob(".*.tmp"))

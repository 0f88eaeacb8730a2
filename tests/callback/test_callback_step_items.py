"""Per-item records of the per-step (in-stage) evaluations (``item_records=`` with
``eval_every_n_steps``): each per-step evaluation's items equal a plain-torch loop's over the
weights of that step (one process here; 2-process DDP with odd shards in
``step_items_ddp_script.py``); the ``step_metrics`` intervals equal
``step_bootstrap`` of the plain loop's items; a resume from a checkpoint and the stage journal's
replay keep them; the bound counts them (the refusal names ``max_bytes``); the logs carry
``.../lo`` and ``.../hi``."""

from __future__ import annotations

import math
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import (
    Classifier,
    Snapshots,
    eval_loaders,
    make_net,
    make_tasks,
    train_loaders,
    trainer_kwargs,
)
from test_callback_items import plain_items

from continual_eval import ContinualEvalCallback, StepEvaluation, fit_tasks
from continual_eval.functional._step_intervals import step_bootstrap
from continual_eval.loggers import stage_scalars
from continual_eval.results import ContinualResults
from script_runner import run_script

RESAMPLES = 300
SCORERS = {"acc": "accuracy", "loss": "cross_entropy"}


class StepWeights(pl.Callback):
    """The weights after every optimizer step, by the run's cumulative step (placed before the
    evaluation callback: the same weights it scores)."""

    def __init__(self) -> None:
        self.weights: dict[int, dict] = {}
        self.step = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.step += 1
        self.weights[self.step] = {k: v.clone() for k, v in pl_module.state_dict().items()}


def _fit(root: Path, *, tasks=None, item_records=None, every=1):
    tasks = tasks or make_tasks()
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        scorers=SCORERS,
        eval_every_n_steps=every,
        lca_beta=2,
        dirpath=root / "out",
        verbose=False,
        item_records=item_records or {"resamples": RESAMPLES, "seed": 1},
    )
    steps, snapshots = StepWeights(), Snapshots()
    trainer = pl.Trainer(callbacks=[steps, snapshots, cb], **trainer_kwargs(root, max_epochs=1))
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    return cb, steps, snapshots, tasks


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("step_items")
    return (*_fit(root), root)


def test_step_items_equal_a_plain_loop(run):
    cb, steps, _, tasks, _ = run
    record = cb.record.sections["items"]
    curve_steps = cb.results()["curves"]["step"]
    stage_ends = {3, 6, 9}  # 48 samples / 16 per batch: 3 steps per stage
    assert [(t, k) for t, k, _ in record.steps] == [
        (t, (t - 1) // 3) for t in curve_steps if t not in stage_ends
    ]
    for step, stage, entry in record.steps:
        right, losses = plain_items(steps.weights[step], tasks)
        assert sorted(entry["acc"]) == list(range(stage + 1))  # the tasks seen so far
        for j in range(stage + 1):
            got = record.values("acc", None)  # the baseline's, for the sizes
            assert got[j].numel() == right[j].numel()
            from continual_eval._item_record import _values

            assert torch.equal(_values(entry["acc"][j]), right[j]), (step, j)
            torch.testing.assert_close(_values(entry["loss"][j]), losses[j], rtol=0, atol=1e-5)


def _plain_values(cb, steps: StepWeights, snapshots: Snapshots, tasks, name: str):
    """Per task the ``[E, n_j]`` rows `step_bootstrap` takes, from the plain loop alone: the
    baseline, every stage end, every curve evaluation (a stage end's: its weights)."""
    results = cb.continual_results()
    T = len(tasks)
    rows = [snapshots.weights[0], *snapshots.weights[1:]]  # baseline, stage ends
    curve = results.steps
    rows += [steps.weights[int(t)] for t in curve.step]
    plain = [plain_items(w, tasks)[0 if name == "acc" else 1] for w in rows]
    values = [torch.stack([p[j] for p in plain]) for j in range(T)]
    evaluated = torch.ones(len(rows), T, dtype=torch.bool)
    evaluated[1 + T :] = torch.arange(T).unsqueeze(0) <= curve.stage.unsqueeze(1)
    return values, evaluated, curve


def test_step_intervals_equal_the_bootstrap_of_plain_items(run):
    cb, steps, snapshots, tasks, _ = run
    section = cb.continual_results().intervals
    assert section is not None
    for name in SCORERS:
        values, evaluated, curve = _plain_values(cb, steps, snapshots, tasks, name)
        want = step_bootstrap(
            values,
            evaluated,
            curve.stage,
            curve.step,
            3,
            higher_is_better=name == "acc",
            lca_beta=2,
            best=1.0 if name == "acc" else 0.0 if name == "loss" else None,
            resamples=RESAMPLES,
            seed=1,
        )
        held = section.matrices[name]
        keys = ("min_acc", "wc_acc", "gap_depth", "gap_minimum", "gap_recovery_steps", "stage_auc")
        for key in keys:
            for got, expected in zip(held.step_metrics[key], want[key], strict=True):
                torch.testing.assert_close(got, expected, rtol=0, atol=1e-5, equal_nan=True)
        for key in ("anytime_accuracy", "lca"):
            for got, expected in zip(held.metrics[key], want[key], strict=True):
                assert got == pytest.approx(expected.item(), abs=1e-5)
        recovery = cb.continual_results()[name].stability.per_task["recovery_steps"]
        torch.testing.assert_close(
            held.step_metrics["gap_recovery_steps"][0], recovery, equal_nan=True
        )
    # the estimates are the results' own stability and plasticity values
    results = cb.continual_results()
    held = section.matrices["acc"]
    torch.testing.assert_close(
        held.step_metrics["min_acc"][0], results["acc"].stability.min_acc, equal_nan=True
    )
    assert held.metrics["lca"][0] == pytest.approx(results["acc"].plasticity.lca, abs=1e-12)
    assert "stability" not in section.unavailable and "min_acc_ties" in section.unavailable
    assert "gap_recovery_steps" not in section.unavailable  # it has an interval
    low, high = held.step_metrics["min_acc"][1:]
    assert bool((low[1:] <= high[1:]).all()) and math.isnan(low[0])


def test_logs_carry_lo_and_hi(run):
    cb, _, _, _, root = run
    scalars = stage_scalars(cb.continual_results(), 2)
    for key in ("min_acc", "wc_acc", "anytime_acc", "lca", "loss/min_acc", "loss/lca"):
        low, high = scalars[f"continual/{key}/lo"], scalars[f"continual/{key}/hi"]
        assert low <= high
    name = cb.task_names[1]
    assert scalars[f"continual/gap_depth/{name}/lo"] <= scalars[f"continual/gap_depth/{name}/hi"]
    # task 1 never comes back within stage 2, certainly: both ends "not recovered", not logged
    held = cb.continual_results().intervals.matrices["acc"]
    assert all(math.isnan(t[1].item()) for t in held.step_metrics["gap_recovery_steps"])
    assert not any(key.startswith(f"continual/gap_recovery_steps/{name}") for key in scalars)
    # and results.json holds them, checked on load
    back = ContinualResults.load(root / "out")
    assert back.intervals is not None
    assert set(back.intervals.matrices["acc"].step_metrics) >= {"min_acc", "wc_acc", "gap_depth"}


def test_gap_recovery_interval_in_results_logs_and_report(tmp_path):
    """A stage that trains on the new task, then on the old one again (replay at the end):
    task 0 dips and comes back within stage 1. Its recovery steps' interval is in results.json
    (``step_metrics``, read back from disk), logged as ``.../lo`` and ``.../hi`` beside the
    value, and shown in the report's table of the run's intervals."""
    import json

    from torch.utils.data import DataLoader, TensorDataset

    from continual_eval._items_report import items_run_lines
    from continual_eval._markdown import escape_markdown

    tasks = make_tasks(2, test_sizes=(200, 200))
    (x0, y0), (x1, y1) = tasks[0][0], tasks[1][0]
    loaders = [
        DataLoader(TensorDataset(x0, y0), batch_size=16),
        DataLoader(TensorDataset(torch.cat([x1, x0, x0]), torch.cat([y1, y0, y0])), batch_size=16),
    ]
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        eval_every_n_steps=1,
        dirpath=tmp_path / "out",
        verbose=False,
        item_records={"resamples": RESAMPLES, "seed": 1},
    )
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))
    fit_tasks(trainer, Classifier(make_net()), loaders)
    back = ContinualResults.load(tmp_path / "out")
    task = back.task_names[0]
    recovery = back["acc"].stability.per_task["recovery_steps"][0].item()
    assert back["acc"].stability.per_task["depth"][0].item() > 0.2 and 0 < recovery < 9
    interval = back.intervals.matrices["acc"].step_metrics["gap_recovery_steps"]
    est, low, high = (float(t[0]) for t in interval)
    assert est == recovery and low <= est <= high < math.inf
    document = json.loads((tmp_path / "out" / "results.json").read_text())
    section = document["intervals"]["matrices"]["acc"]["step_metrics"]["gap_recovery_steps"]
    assert section == {"estimate": [est], "low": [low], "high": [high]}
    assert "gap_recovery_steps" not in document["intervals"]["unavailable"]
    assert "gap_recovery_steps_band" in document["intervals"]["unavailable"]
    scalars = stage_scalars(back, 1)
    key = f"continual/gap_recovery_steps/{task}"
    assert (scalars[key], scalars[f"{key}/lo"], scalars[f"{key}/hi"]) == (est, low, high)
    lines = items_run_lines(back, "run", "run", tmp_path, str)
    row = escape_markdown(f"gap_recovery_steps ({task})")
    assert f"| {row} | {est:.0f} | {low:.0f} | {high:.0f} |" in lines


def test_the_journal_replays_the_step_items(run):
    from continual_eval._stage_journal import replay
    from continual_eval.results.files import JOURNAL_FILE

    cb, _, _, _, root = run
    replayed = replay(root / "out" / JOURNAL_FILE)
    live, section = cb.record.sections["items"], replayed.sections["items"]
    assert [e[:2] for e in section.steps] == [e[:2] for e in live.steps]
    from continual_eval._item_record import _values

    for (_, _, a), (_, _, b) in zip(section.steps, live.steps, strict=True):
        for name in SCORERS:
            for j in b[name]:
                assert torch.equal(_values(a[name][j]), _values(b[name][j]))
    assert replayed.continual_results().to_dict()["intervals"] == cb.results()["intervals"]


def test_resume_keeps_the_step_items(tmp_path):
    tasks = make_tasks()

    def run(root, loaders, ckpt_path=None):
        cb = ContinualEvalCallback(
            eval_loaders(tasks),
            scorers=SCORERS,
            eval_every_n_steps=1,
            dirpath=root,
            verbose=False,
            item_records={"resamples": RESAMPLES},
        )

        def factory(task):
            return pl.Trainer(callbacks=[cb], **trainer_kwargs(root, max_epochs=1))

        fit_tasks(
            factory,
            Classifier(make_net()),
            loaders,
            checkpoint_dir=root / "ckpt",
            ckpt_path=ckpt_path,
            seed=7,
        )
        return cb

    loaders = train_loaders(tasks)
    full = run(tmp_path / "full", loaders)
    run(tmp_path / "cut", loaders[:2])
    ckpt = tmp_path / "cut" / "ckpt" / "task_1.ckpt"
    state = torch.load(ckpt, weights_only=True)
    held = next(
        v["record"]["sections"]["items"] for v in state["callbacks"].values() if "record" in v
    )
    assert [(e["step"], e["stage"]) for e in held["steps"]] == [(1, 0), (2, 0), (4, 1), (5, 1)]
    resumed = run(tmp_path / "cut", loaders, ckpt_path=ckpt)
    a, b = resumed.results()["intervals"], full.results()["intervals"]
    assert a == b and "step_metrics" in a["matrices"]["acc"]
    assert [e[:2] for e in resumed.record.sections["items"].steps] == [
        e[:2] for e in full.record.sections["items"].steps
    ]


def test_the_bound_counts_the_step_evaluations(tmp_path):
    """The baseline and stage ends fit (4 evaluations of 37 + 29 + 41 items, 1 bit each: 5 + 4
    + 6 = 15 bytes each, 60 bytes), the per-step ones do not (the first takes 5 more): refused
    at the first one, naming the bound."""
    with pytest.raises(ValueError, match=r"per-step evaluation at step 1 .*max_bytes=64"):
        _fit(tmp_path, item_records={"scorers": ["acc"], "max_bytes": 64, "resamples": 50})


def test_subset_step_evaluations_state_why(tmp_path):
    tasks = make_tasks()
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        eval_every_n_steps=StepEvaluation(1, subset=5),
        dirpath=tmp_path / "out",
        verbose=False,
        item_records={"resamples": 100},
    )
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    assert cb.record.sections["items"].steps == []
    unavailable = cb.results()["intervals"]["unavailable"]
    assert "fixed subset" in unavailable["stability"]
    assert (
        "step_metrics" not in cb.results()["intervals"]["matrices"]["acc"]
        or not (cb.results()["intervals"]["matrices"]["acc"]["step_metrics"])
    )


@pytest.mark.slow
def test_ddp_step_items_equal_a_plain_loop(tmp_path):
    """2 gloo processes, odd test sets (37, 29, 41): every rank's per-step records equal the
    plain loop's over rank 0's weights of that step, and both ranks' intervals agree."""
    proc = run_script(Path(__file__).parent / "step_items_ddp_script.py", tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tasks = torch.load(tmp_path / "tasks.pt", weights_only=True)
    weights = torch.load(tmp_path / "weights.pt", weights_only=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0]["steps"] and ranks[0]["intervals"] == ranks[1]["intervals"]
    for saved in ranks:
        for (step, stage), items in zip(saved["steps"], saved["acc"], strict=True):
            right, _ = plain_items(weights[step], tasks)
            assert len(items) == stage + 1
            for j in range(stage + 1):
                assert torch.equal(items[j], right[j]), (step, j)
        for (step, stage), items in zip(saved["steps"], saved["loss"], strict=True):
            _, losses = plain_items(weights[step], tasks)
            for j in range(stage + 1):
                torch.testing.assert_close(items[j], losses[j], rtol=0, atol=1e-5)


def test_step_metrics_checked_on_load_naming_the_field(run, tmp_path):
    import json

    from continual_eval.results import InvalidResultsError

    cb, _, _, _, _ = run
    document = cb.results()
    field = "intervals.matrices.acc.step_metrics"

    def load(change):
        bad = json.loads(json.dumps(document))
        change(bad["intervals"]["matrices"]["acc"]["step_metrics"])
        path = tmp_path / "results.json"
        path.write_text(json.dumps(bad))
        return ContinualResults.load(path)

    load(lambda m: None)  # as written: accepted
    with pytest.raises(InvalidResultsError, match=rf"{field}\.min_acc\.low"):
        load(lambda m: m["min_acc"]["low"].pop())
    with pytest.raises(InvalidResultsError, match=rf"{field}\.gap_depth\.low"):
        load(lambda m: m["gap_depth"].update(low=[1.0, 1.0], high=[0.0, 0.0]))
    with pytest.raises(InvalidResultsError, match=rf"{field}\.median_acc"):
        load(lambda m: m.update(median_acc=m["min_acc"]))

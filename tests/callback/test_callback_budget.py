"""Budgeted stage-end evaluation: ``eval_old_tasks_every=k`` leaves the skipped cells absent
(``null``) and the metrics that read them absent, every other value equal to a full run's;
``stage_eval_subset=n`` scores a fixed subset per task, stratified by class (checked against a
plain loop over the rule), scored exactly (against plain torch on the saved weights), the same on
1 and 2 processes (a 2-process gloo run); both recorded in the ``stage_evaluation`` section."""

from __future__ import annotations

import json
import math
from fractions import Fraction

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
from torch.utils.data import DataLoader, Subset, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.evaluation.loaders import stage_subset_dataloader, subset_dataloader
from continual_eval.record import Scored
from continual_eval.results import ContinualResults
from script_runner import run_script

T = 5
HERE = __import__("pathlib").Path(__file__).resolve().parent


def _fit(root, name, tasks, **options):
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        dirpath=root / name,
        verbose=False,
        **options,
    )
    snapshots = Snapshots()
    trainer = pl.Trainer(callbacks=[snapshots, cb], **trainer_kwargs(root, max_epochs=1))
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    return cb, snapshots


@pytest.fixture(scope="module")
def every_k(tmp_path_factory):
    root = tmp_path_factory.mktemp("every_k")
    tasks = make_tasks(T)
    full, _ = _fit(root, "full", tasks)
    skipped, _ = _fit(root, "skipped", tasks, eval_old_tasks_every=2)
    return full, skipped, root


def _evaluated(i: int, j: int, k: int = 2) -> bool:
    """The rule stated in the docs: old tasks j < i at stage i when (i + 1) % k == 0 or at the
    final stage; the diagonal and later tasks always."""
    return j >= i or (i + 1) % k == 0 or i == T - 1


def test_every_k_stages_leaves_skipped_cells_and_their_metrics_absent(every_k):
    _, skipped, root = every_k
    a = json.loads((root / "full" / "results.json").read_text())
    b = json.loads((root / "skipped" / "results.json").read_text())
    ContinualResults.load(root / "skipped")  # a valid results.json
    assert any(not _evaluated(i, j) for i in range(T) for j in range(T))  # something is skipped
    for name in ("acc", "loss"):
        A, B = a["matrices"][name], b["matrices"][name]
        for i in range(T):
            for j in range(T):
                if _evaluated(i, j):
                    assert B["scores"][i][j] == A["scores"][i][j]  # the same weights, the same cell
                else:
                    assert B["scores"][i][j] is None  # absent, never imputed
        assert B["baseline"] == A["baseline"]
        # metrics: absent exactly when a cell they read is absent (README formulas)
        for j in range(T - 1):
            column_complete = all(_evaluated(i, j) for i in range(j, T))
            want = A["per_task"]["forgetting"][j] if column_complete else None
            assert B["per_task"]["forgetting"][j] == want
            assert B["per_task"]["bwt"][j] == A["per_task"]["bwt"][j]  # R[T-1, j], R[j, j]
            assert B["per_task"]["fwt"][j] == A["per_task"]["fwt"][j]
        assert B["metrics"]["forgetting"] is None
        for key in ("acc", "bwt", "fwt"):
            assert B["metrics"][key] == A["metrics"][key]
        for s in range(T):
            row_complete = all(_evaluated(s, j) for j in range(s + 1))
            for key in ("acc", "bwt"):
                want = A["metrics_per_stage"][key][s] if row_complete else None
                assert B["metrics_per_stage"][key][s] == want, (key, s)
            assert B["metrics_per_stage"]["fwt"][s] == A["metrics_per_stage"]["fwt"][s]
            assert (
                B["metrics_per_stage"]["learning_accuracy"][s]
                == A["metrics_per_stage"]["learning_accuracy"][s]
            )
            prefix_complete = all(_evaluated(i, j) for i in range(s + 1) for j in range(i + 1))
            want = A["metrics_per_stage"]["average_incremental_accuracy"][s]
            assert B["metrics_per_stage"]["average_incremental_accuracy"][s] == (
                want if prefix_complete else None
            )
    section = b["stage_evaluation"]
    assert section["old_tasks_every"] == 2 and "(i + 1) % 2 == 0" in section["old_tasks_rule"]
    assert "subset" not in section and "stage_evaluation" not in a
    # fewer evaluations: the skipped cells were never scored
    loaded = ContinualResults.load(root / "skipped")
    assert loaded.stage_evaluation is not None and loaded.stage_evaluation.old_tasks_every == 2
    from continual_eval.loggers import format_matrix_table

    assert "forgetting=--" in format_matrix_table(loaded)  # printed as absent, never blank or 0
    _assert_journal_replays(root / "skipped", skipped)


def _assert_journal_replays(directory, callback) -> None:
    """The stage journal holds the section: a replay rebuilds the same results."""
    from continual_eval._stage_journal import replay
    from continual_eval.results.files import JOURNAL_FILE

    replayed = replay(directory / JOURNAL_FILE).continual_results().to_dict()
    recorded = callback.results()
    for key in ("stage_evaluation", "scores", "metrics", "metrics_per_stage", "per_task"):
        assert replayed[key] == recorded[key], key


def test_an_evaluated_task_may_not_be_absent(every_k):
    _, skipped, _ = every_k
    record = skipped.record
    assert record is not None
    fresh = type(record)(record.specs, record.task_names)
    fresh.record_baseline(
        Scored({n: torch.full((T,), 0.5, dtype=torch.float64) for n in record.specs})
    )
    row = torch.full((T,), 0.5, dtype=torch.float64)
    fresh.record_stage(0, Scored(dict.fromkeys(record.specs, row), task_ids=tuple(range(T))))
    bad = row.clone()
    bad[0] = math.nan  # R[1, 0] may be absent, but task 0 was scored
    rows = dict.fromkeys(record.specs, bad)
    with pytest.raises(ValueError, match=r"scores\[1, 0\] is nan although task 0 was evaluated"):
        fresh.record_stage(1, Scored(rows, task_ids=tuple(range(T))))
    assert fresh.num_stages == 1  # nothing recorded


def test_resuming_with_other_budget_settings_is_refused(every_k):
    _, skipped, _ = every_k
    state = skipped.state_dict()
    other = ContinualEvalCallback(
        eval_loaders(make_tasks(T)),
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        eval_old_tasks_every=3,
    )
    with pytest.raises(ValueError, match="other stage-evaluation settings"):
        other.load_state_dict(state)
    same = ContinualEvalCallback(
        eval_loaders(make_tasks(T)),
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        eval_old_tasks_every=2,
    )
    same.load_state_dict(state)
    assert torch.equal(same.scores.isnan(), skipped.scores.isnan())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stage_eval_subset": 0}, "stage_eval_subset must be a positive int or None"),
        ({"stage_eval_subset": 2.5}, "stage_eval_subset must be a positive int"),
        ({"stage_eval_seed": "0"}, "stage_eval_seed must be an int"),
        ({"eval_old_tasks_every": 0}, "eval_old_tasks_every must be a positive int or None"),
        ({"eval_old_tasks_every": True}, "eval_old_tasks_every must be a positive int"),
    ],
)
def test_bad_budget_arguments_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        ContinualEvalCallback(eval_loaders(make_tasks(2)), **options)


def test_old_tasks_every_k_needs_no_class_incremental_section():
    with pytest.raises(ValueError, match="cannot be combined with task_classes"):
        ContinualEvalCallback(
            eval_loaders(make_tasks(2)), task_classes=[[0], [1]], eval_old_tasks_every=2
        )


# ----------------------------------------------------------------------------- the subset
def plain_stratified(labels: list[int], n: int, seed: int) -> list[int]:
    """The documented rule as a plain loop: largest-remainder quotas (ties: the smaller label),
    each class's first n_c samples in randperm order, sorted."""
    N = len(labels)
    order = torch.randperm(N, generator=torch.Generator().manual_seed(seed)).tolist()
    if n >= N:
        return list(range(N))
    classes = sorted(set(labels))
    exact = {c: Fraction(n * labels.count(c), N) for c in classes}
    quota = {c: math.floor(exact[c]) for c in classes}
    by_remainder = sorted(classes, key=lambda c: (-(exact[c] - quota[c]), c))
    for c in by_remainder[: n - sum(quota.values())]:
        quota[c] += 1
    chosen, taken = [], dict.fromkeys(classes, 0)
    for position in order:
        c = labels[position]
        if taken[c] < quota[c]:
            chosen.append(position)
            taken[c] += 1
    return sorted(chosen)


@pytest.mark.parametrize("n", [1, 7, 20, 36, 37, 100])
def test_stratified_subset_follows_the_rule(n):
    g = torch.Generator().manual_seed(n)
    y = torch.randint(0, 4, (37,), generator=g)
    y[:3] = 9  # a rare class
    dataset = TensorDataset(torch.randn(37, 2, generator=g), y)
    loader, indices, rule = stage_subset_dataloader(DataLoader(dataset, batch_size=5), n, 11)
    assert rule == "stratified"
    assert indices.tolist() == plain_stratified(y.tolist(), n, 11)
    assert [int(b[1].numel()) for b in loader] == [5] * (min(n, 37) // 5) + (
        [min(n, 37) % 5] if min(n, 37) % 5 else []
    )
    # each class within one sample of its share
    for c in set(y.tolist()):
        share = min(n, 37) * (y == c).sum().item() / 37
        assert abs(int((y[indices] == c).sum()) - share) < 1
    # through a Subset: the labels at its indices; positions are the Subset's
    inner = Subset(dataset, list(range(36, -1, -1)))
    _, sub_indices, sub_rule = stage_subset_dataloader(DataLoader(inner, batch_size=5), n, 11)
    assert sub_rule == "stratified"
    assert sub_indices.tolist() == plain_stratified(y.flip(0).tolist(), n, 11)


def test_without_readable_labels_the_subset_is_uniform():
    x = torch.randn(30, 2)
    for dataset in (TensorDataset(x), TensorDataset(x, torch.rand(30))):  # no labels, float targets
        loader = DataLoader(dataset, batch_size=4)
        _, indices, rule = stage_subset_dataloader(loader, 10, 3)
        assert rule == "uniform"
        assert indices.tolist() == subset_dataloader(loader, 10, 3)[1].tolist()


def _plain_accuracy(weights, x, y) -> float:
    net = make_net()
    net.load_state_dict({k.removeprefix("net."): v for k, v in weights.items()})
    with torch.no_grad():
        return int((net(x).argmax(1) == y).sum()) / len(y)


def test_stage_subset_is_scored_exactly(tmp_path):
    tasks = make_tasks(3)
    cb, snapshots = _fit(tmp_path, "subset", tasks, stage_eval_subset=20, stage_eval_seed=5)
    subsets = [
        plain_stratified(te[1].tolist(), 20, 5 + j) for j, (_, te) in enumerate(tasks)
    ]  # the rule, from the labels
    for i, weights in enumerate(snapshots.weights):
        row = [
            _plain_accuracy(weights, te[0][subsets[j]], te[1][subsets[j]])
            for j, (_, te) in enumerate(tasks)
        ]
        got = cb.baseline if i == 0 else cb.scores[i - 1]
        assert got.tolist() == row  # the baseline on the same subsets
    section = cb.results()["stage_evaluation"]["subset"]
    assert section["size"] == 20 and section["seed"] == 5
    assert section["samples_per_task"] == [20, 20, 20]
    assert section["rule_per_task"] == ["stratified"] * 3
    assert section["standard_error_bound"] == [0.5 / math.sqrt(20)] * 3
    assert "largest remainder" in section["rules"]["stratified"]
    _assert_journal_replays(tmp_path / "subset", cb)


@pytest.mark.slow
def test_stage_subset_is_the_same_on_two_processes(tmp_path):
    """2-process gloo: every rank draws the single-process subsets, and R on them is exact
    (plain torch on the saved weights and the single-process subset indices), skipped cells
    absent on both ranks."""
    proc = run_script(HERE / "budget_ddp_script.py", tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    tasks = make_tasks(4)
    single = ContinualEvalCallback(eval_loaders(tasks), stage_eval_subset=20, stage_eval_seed=5)
    indices = [i.tolist() for i in single._task_loaders.stage_indices]  # type: ignore[union-attr]
    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert rank0["world_size"] == 2
    assert rank0["indices"] == indices and rank1["indices"] == indices
    assert torch.equal(rank0["scores"].isnan(), rank1["scores"].isnan())
    assert torch.equal(rank0["scores"].nan_to_num(), rank1["scores"].nan_to_num())
    for i in range(4):
        weights = torch.load(tmp_path / f"weights_{i}.pt")
        for j, (_, (x, y)) in enumerate(tasks):
            value = float(rank0["scores"][i, j])
            if j < i and i == 2:  # (2 + 1) % 2 != 0 and not the final stage: skipped
                assert math.isnan(value)
            else:
                assert value == _plain_accuracy(weights, x[indices[j]], y[indices[j]])
    baseline = torch.load(tmp_path / "weights_baseline.pt")
    assert rank0["baseline"].tolist() == [
        _plain_accuracy(baseline, x[indices[j]], y[indices[j]])
        for j, (_, (x, y)) in enumerate(tasks)
    ]
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert written["stage_evaluation"]["subset"]["samples_per_task"] == [20] * 4

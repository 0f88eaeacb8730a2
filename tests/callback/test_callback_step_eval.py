"""Evaluation every k training steps (issue 6): curves against a plain-torch reference evaluating at
the same steps, the stability metrics against hand-computed values, training unchanged, subsets,
and the device batch cache."""

from __future__ import annotations

import csv
import json
import logging
import math
import tempfile

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import (
    BATCH,
    Classifier,
    by_step,
    eval_loaders,
    make_net,
    make_tasks,
    train_loaders,
    trainer_kwargs,
)
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from continual_eval import ContinualEvalCallback, StepEvaluation, fit_tasks, scheduled_task
from continual_eval.evaluation import BatchCache, cache_safety
from continual_eval.results import ContinualResults

EPOCHS = 2
K = 4  # 48 train samples / batch 16 = 3 steps per epoch, 6 per task: evaluations at 4, 8, 12, 16


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


def reference_curves(
    tasks, k: int, epochs: int = EPOCHS, subset: dict | None = None, loss: bool = False
):
    """Plain torch: SGD in fixed order; after every k-th optimizer step (counted over the whole
    run) score tasks 0..i (on ``subset[j]`` indices if given); at the end of task i score every
    task on the whole test set, replacing a per-step row taken at the same step. Returns
    ``(steps, stages, rows, full)`` as Python lists (NaN = not evaluated); with ``loss`` each
    cell is ``(accuracy, mean cross-entropy)``."""
    net = make_net()
    T = len(tasks)

    def score(j, idx=None):
        x, y = tasks[j][1]
        if idx is not None:
            x, y = x[idx], y[idx]
        net.eval()
        with torch.no_grad():
            correct = sum(
                int((net(x[s : s + 8]).argmax(1) == y[s : s + 8]).sum())
                for s in range(0, len(y), 8)
            )
            ce = sum(
                float(nn.functional.cross_entropy(net(x[s : s + 8]), y[s : s + 8], reduction="sum"))
                for s in range(0, len(y), 8)
            )
        net.train()
        return (correct / len(y), ce / len(y)) if loss else correct / len(y)

    opt = torch.optim.SGD(net.parameters(), lr=0.2)
    steps, stages, rows, full = [], [], [], []
    step = 0
    for i, ((x, y), _) in enumerate(tasks):
        for _ in range(epochs):
            for s in range(0, len(y), BATCH):
                opt.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(net(x[s : s + BATCH]), y[s : s + BATCH]).backward()
                opt.step()
                step += 1
                if step % k == 0:
                    row = [math.nan] * T
                    for j in range(i + 1):
                        row[j] = score(j, None if subset is None else subset[j])
                    steps.append(step), stages.append(i), rows.append(row)
                    full.append(subset is None)
        row = [score(j) if j <= i else math.nan for j in range(T)]
        if steps and steps[-1] == step:
            steps.pop(), stages.pop(), rows.pop(), full.pop()
        steps.append(step), stages.append(i), rows.append(row), full.append(True)
    return steps, stages, rows, full


def same(a: torch.Tensor, b) -> bool:
    b = torch.as_tensor(b, dtype=torch.float64)
    return a.shape == b.shape and torch.equal(a.nan_to_num(-1.0), b.nan_to_num(-1.0))


def hand_stability(steps, stages, rows):
    """min-ACC, WC-ACC (De Lange et al. 2023, eqs. 4-5) and gap depth / recovery written out with
    plain loops over the curve rows."""
    S = max(stages) + 1
    last = [max(n for n in range(len(stages)) if stages[n] == s) for s in range(S)]
    min_acc, wc_acc = [], []
    for k in range(S):
        if k == 0:
            min_acc.append(math.nan)
            wc_acc.append(rows[last[0]][0])
            continue
        worst = [min(rows[n][i] for n in range(len(rows)) if i < stages[n] <= k) for i in range(k)]
        min_acc.append(sum(worst) / k)
        wc_acc.append(rows[last[k]][k] / (k + 1) + (1 - 1 / (k + 1)) * min_acc[-1])
    depth, recovery = [], []
    for j in range(S - 1):
        boundary = rows[last[j]][j]
        during = [n for n in range(len(rows)) if stages[n] == j + 1]
        low = min(rows[n][j] for n in during)
        depth.append(boundary - low)
        first_min = next(n for n in during if rows[n][j] == low)
        if boundary - low <= 0:
            recovery.append(0.0)
            continue
        back = [n for n in during if n >= first_min and rows[n][j] >= boundary]
        recovery.append(float(steps[back[0]] - steps[last[j]]) if back else math.nan)
    return min_acc, wc_acc, depth, recovery


def run_per_task(tasks, tmp_path, logger=False, **cb_kwargs):
    model = Classifier(make_net())
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path / "out", **cb_kwargs)
    for dl in train_loaders(tasks):
        kwargs = trainer_kwargs(tmp_path, max_epochs=EPOCHS, logger=logger)
        pl.Trainer(callbacks=[cb], **kwargs).fit(model, dl)
    return cb, model


def test_step_curves_equal_plain_torch_reference(tasks, tmp_path):
    steps, stages, rows, full = reference_curves(tasks, K)
    assert steps == [4, 6, 8, 12, 16, 18]  # 12 is a stage end: the full row replaced the step one
    cb, _ = run_per_task(tasks, tmp_path, eval_every_n_steps=K, verbose=False)
    got_steps, got_stages, got_rows = cb.curves()
    assert got_steps.tolist() == steps and got_stages.tolist() == stages
    assert same(got_rows, rows)
    assert cb.steps_trained == 18  # continues across the three Trainers (each restarts at 0)

    loaded = ContinualResults.load(tmp_path / "out")
    results = loaded.to_dict()
    r_steps, r_stages, r_rows = loaded.curves()
    assert r_steps.tolist() == steps and r_stages.tolist() == stages and same(r_rows, rows)
    assert results["curves"]["full"] == full and results["curves"]["subset"] is None
    assert "global_step" in results["curves"]["step_counter"]
    assert results["scores"] == cb.scores.tolist()  # the existing keys are unchanged

    min_acc, wc_acc, depth, recovery = hand_stability(steps, stages, rows)
    st = results["stability"]
    assert st["min_acc"][0] is None  # undefined at stage 0: null, never 0
    assert st["min_acc"][1:] == pytest.approx(min_acc[1:], abs=1e-12)
    assert st["wc_acc"] == pytest.approx(wc_acc, abs=1e-12)
    assert st["per_task"]["depth"] == pytest.approx(depth, abs=1e-12)
    assert [math.nan if v is None else v for v in st["per_task"]["recovery_steps"]] == (
        pytest.approx(recovery, nan_ok=True)
    )
    assert (tmp_path / "out" / "accuracy_curves.png").stat().st_size > 1000


def test_single_fit_schedule_and_fit_tasks_give_the_same_curves(tasks, tmp_path):
    steps, stages, rows, _ = reference_curves(tasks, 3)
    loaders = train_loaders(tasks)

    class Scheduled(Classifier):
        def train_dataloader(self):
            return loaders[scheduled_task(self.trainer, EPOCHS)]

    cb = ContinualEvalCallback(
        eval_loaders(tasks), epochs_per_task=EPOCHS, eval_every_n_steps=3, verbose=False
    )
    pl.Trainer(
        callbacks=[cb],
        reload_dataloaders_every_n_epochs=1,
        **trainer_kwargs(tmp_path / "a", max_epochs=EPOCHS * len(tasks)),
    ).fit(Scheduled(make_net()))
    got = cb.curves()
    assert got[0].tolist() == steps and got[1].tolist() == stages and same(got[2], rows)

    cb = ContinualEvalCallback(eval_loaders(tasks), eval_every_n_steps=3, verbose=False)
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path / "b", max_epochs=EPOCHS))
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    got = cb.curves()
    assert got[0].tolist() == steps and got[1].tolist() == stages and same(got[2], rows)


class DropoutClassifier(Classifier):
    def __init__(self, net):
        super().__init__(net)
        self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)


def test_training_identical_with_and_without_step_evaluation(tasks, tmp_path):
    """Dropout and shuffled train loaders draw from the global RNG; evaluating every step mid-epoch
    must not move it, nor change flags, grads or requires_grad."""
    weights, grads = [], []
    for with_cb in (False, True):
        pl.seed_everything(7)
        model = DropoutClassifier(make_net(dropout=0.5))
        cbs = (
            [ContinualEvalCallback(eval_loaders(tasks), eval_every_n_steps=1, verbose=False)]
            if with_cb
            else []
        )
        for dl in train_loaders(tasks, shuffle=True):
            pl.Trainer(callbacks=cbs, **trainer_kwargs(tmp_path, max_epochs=2)).fit(model, dl)
        assert model.training and not model.frozen.requires_grad
        assert all(p.requires_grad for p in model.net.parameters())
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
        grads.append([p.grad.clone() for p in model.net.parameters()])
        if with_cb:
            assert len(cbs[0].curves()[0]) == 18  # one evaluation per step
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_subset_at_steps_full_sets_at_stage_ends(tasks, tmp_path):
    n, seed = 10, 5
    subset = [
        torch.randperm(len(te[1]), generator=torch.Generator().manual_seed(seed + j))[:n]
        .sort()
        .values
        for j, (_, te) in enumerate(tasks)
    ]
    steps, stages, rows, full = reference_curves(tasks, K, subset=subset)
    cb, _ = run_per_task(
        tasks,
        tmp_path,
        logger=CSVLogger(tmp_path, name="csv"),
        eval_every_n_steps=StepEvaluation(K, subset=n, subset_seed=seed),
        verbose=False,
    )
    got = cb.curves()
    assert got[0].tolist() == steps and got[1].tolist() == stages and same(got[2], rows)
    results = ContinualResults.load(tmp_path / "out").to_dict()
    assert results["curves"]["full"] == full == [False, True, False, True, False, True]
    # one key, one kind of value: whole test sets under step/, the subset under step_subset/
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as fh:
        logged = list(csv.DictReader(fh))
    whole = [
        (int(r["step"]), float(r["continual/step/task_0"]))
        for r in logged
        if r.get("continual/step/task_0")
    ]
    part = [int(r["step"]) for r in logged if r.get("continual/step_subset/task_0")]
    assert whole == [(st, got[2][i, 0].item()) for i, st in enumerate(steps) if full[i]]
    assert part == [4, 8, 12, 16]  # every per-step evaluation, 12 included
    assert results["curves"]["subset"]["samples_per_task"] == [n] * 3
    assert results["curves"]["subset"]["seed"] == seed
    # stage-end rows are the full-test-set rows of R
    R = cb.scores
    for row, stage, is_full in zip(got[2], got[1].tolist(), full, strict=True):
        if is_full:
            assert same(row[: stage + 1], R[stage, : stage + 1])


class CountingDataset(Dataset):
    """A deterministic test set that counts its reads."""

    continual_eval_deterministic = True

    def __init__(self, x, y):
        self.x, self.y, self.reads = x, y, 0

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        self.reads += 1
        return self.x[i], self.y[i]


def counting_loaders(tasks, **kwargs):
    return [DataLoader(CountingDataset(*te), batch_size=8, **kwargs) for _, te in tasks]


def run_loaders(tasks, tmp_path, loaders, **cb_kwargs):
    model = Classifier(make_net())
    cb = ContinualEvalCallback(loaders, **{"verbose": False, **cb_kwargs})
    root = tempfile.mkdtemp(dir=tmp_path)  # every run its own results directory
    for dl in train_loaders(tasks):
        pl.Trainer(callbacks=[cb], **trainer_kwargs(root, max_epochs=EPOCHS)).fit(model, dl)
    return cb


def test_cache_reads_each_test_set_once_and_gives_the_same_curves(tasks, tmp_path, caplog):
    steps, _stages, rows, _ = reference_curves(tasks, 1)
    sizes = [len(te[1]) for _, te in tasks]
    results = {}
    for cache in (None, False):
        loaders = counting_loaders(tasks)
        with caplog.at_level(logging.INFO):
            cb = run_loaders(  # verbose: the cache's line (verbose=False silences it)
                tasks,
                tmp_path,
                loaders,
                eval_every_n_steps=1,
                cache_test_batches=cache,
                verbose=True,
            )
        got = cb.curves()
        assert got[0].tolist() == steps and same(got[2], rows)
        results[cache] = (cb.scores, [dl.dataset.reads for dl in loaders])
    assert torch.equal(results[None][0], results[False][0])
    assert results[None][1] == sizes  # auto: cached after the first pass
    # uncached: baseline + 18 per-step evaluations of tasks <= stage + 3 stage ends of all tasks
    evaluations = [1 + 18 - 6 * j + 3 for j in range(3)]
    assert results[False][1] == [n * e for n, e in zip(sizes, evaluations, strict=True)]
    lines = [r.getMessage() for r in caplog.records if "caching collated" in r.getMessage()]
    assert len(lines) == 1 and "3 test loader(s)" in lines[0] and "MB" in lines[0]


def test_cache_auto_off_when_unsafe_and_cap_respected(tasks, tmp_path):
    x, y = tasks[0][1]
    assert cache_safety(DataLoader(TensorDataset(x, y), batch_size=8)) is None
    assert "RandomSampler" in cache_safety(DataLoader(TensorDataset(x, y), shuffle=True))
    plain = DataLoader(CountingDataset(x, y), batch_size=8)
    type(plain.dataset).continual_eval_deterministic = False
    try:
        assert "random transforms" in cache_safety(plain)
    finally:
        type(plain.dataset).continual_eval_deterministic = True
    assert "collate_fn" in cache_safety(DataLoader(TensorDataset(x, y), collate_fn=lambda b: b))

    sizes = [len(te[1]) for _, te in tasks]
    shuffled = counting_loaders(tasks, shuffle=True)  # order changes nothing in a score
    cb = run_loaders(tasks, tmp_path, shuffled, eval_every_n_steps=6)
    assert all(r > n for r, n in zip([dl.dataset.reads for dl in shuffled], sizes, strict=True))
    assert cb._task_loaders.cache.num_cached == 0

    forced = counting_loaders(tasks, shuffle=True)
    cb_forced = run_loaders(tasks, tmp_path, forced, eval_every_n_steps=6, cache_test_batches=True)
    assert [dl.dataset.reads for dl in forced] == sizes
    assert torch.equal(cb_forced.scores, cb.scores)

    capped = counting_loaders(tasks)
    cb = run_loaders(tasks, tmp_path, capped, eval_every_n_steps=6, cache_max_bytes=1000)
    # 29 x (6 float32 + int64) = 928 bytes fit; the 37- and 41-sample sets do not
    assert (
        cb._task_loaders.cache.nbytes == 928
        and cb._task_loaders.cache.num_cached == 1
        and cb._task_loaders.cache.num_refused == 2
    )
    reads = [dl.dataset.reads for dl in capped]
    assert reads[1] == sizes[1] and reads[0] > sizes[0] and reads[2] > sizes[2]
    assert torch.equal(cb.scores, cb_forced.scores)


def test_cache_dropped_when_device_or_loaders_change(tasks, tmp_path):
    loaders = counting_loaders(tasks)
    cb = run_loaders(tasks, tmp_path, loaders, eval_every_n_steps=6)
    assert cb._task_loaders.cache.num_cached == 3
    reads = [dl.dataset.reads for dl in loaders]

    task_loaders = cb._task_loaders
    cpu = task_loaders.for_evaluation([0], device=torch.device("cpu"))
    list(cpu[0])
    assert (
        cb._task_loaders.cache.num_cached == 3 and loaders[0].dataset.reads == reads[0]
    )  # served cached

    meta = task_loaders.for_evaluation([0], device=torch.device("meta"))
    assert cb._task_loaders.cache.num_cached == 0  # another device: everything dropped
    batches = list(meta[0])
    assert all(b[0].device.type == "meta" for b in batches)
    assert loaders[0].dataset.reads == reads[0] + len(tasks[0][1][1])  # read again

    new = counting_loaders(tasks)
    task_loaders.loaders = task_loaders.rank_loaders = new  # other loader objects, same cache
    again = task_loaders.for_evaluation([0], device=torch.device("meta"))
    assert cb._task_loaders.cache.num_cached == 0  # new loader objects: dropped
    list(again[0])
    assert new[0].dataset.reads == len(tasks[0][1][1])


def test_batch_cache_unit():
    x, y = torch.arange(20.0).reshape(10, 2), torch.arange(10)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    cache = BatchCache(max_bytes=10**6)
    cache.set_key("a")
    first = list(cache.wrap(0, loader, torch.device("cpu")))
    assert cache.cached(0) and cache.nbytes == 10 * 2 * 4 + 10 * 8
    second = list(cache.wrap(0, loader, torch.device("cpu")))
    assert all(a[0] is b[0] for a, b in zip(first, second, strict=True))
    it = iter(cache.wrap(1, loader, torch.device("cpu")))
    next(it)  # abandoned mid-way: not cached
    assert not cache.cached(1)
    cache.set_key("a")
    assert cache.cached(0)
    cache.set_key("b")
    assert not cache.cached(0) and cache.nbytes == 0


def test_logged_against_the_step_and_per_stage(tasks, tmp_path):
    cb, _ = run_per_task(
        tasks,
        tmp_path,
        logger=CSVLogger(tmp_path, name="csv"),
        eval_every_n_steps=K,
        verbose=False,
    )
    steps, _stages, rows = cb.curves()
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as fh:
        logged = list(csv.DictReader(fh))
    per_step = [r for r in logged if r.get("continual/step/task_0")]
    # one value per step, the curve's: per-step evaluations (4, 8, 12, 16) and the stage ends
    # (6, 12, 18; at 12 the two are the same evaluation of the same weights)
    assert [int(r["step"]) for r in per_step] == steps.tolist() == [4, 6, 8, 12, 16, 18]
    for n, r in enumerate(per_step):
        assert float(r["continual/step/task_0"]) == rows[n, 0].item()
    results = cb.results()
    per_stage = [r for r in logged if r.get("continual/wc_acc")]
    assert [int(r["step"]) for r in per_stage] == [0, 1, 2]
    assert [float(r["continual/wc_acc"]) for r in per_stage] == pytest.approx(
        results["stability"]["wc_acc"]
    )
    assert per_stage[0]["continual/min_acc"] == ""  # undefined at stage 0: not logged as 0
    assert float(per_stage[2]["continual/min_acc"]) == pytest.approx(
        results["stability"]["min_acc"][2]
    )
    assert float(per_stage[1]["continual/gap_depth/task_0"]) == pytest.approx(
        results["stability"]["per_task"]["depth"][0]
    )
    json.dumps(results, allow_nan=False)


def test_default_leaves_results_unchanged(tasks, tmp_path):
    cb, _ = run_per_task(tasks, tmp_path, verbose=False)
    results = ContinualResults.load(tmp_path / "out").to_dict()
    assert "curves" not in results and "stability" not in results
    assert cb.curves()[0].numel() == 0 and cb._task_loaders.cache.num_cached == 0
    assert not (tmp_path / "out" / "accuracy_curves.png").exists()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"eval_every_n_steps": 0}, "eval_every_n_steps must be a positive int"),
        ({"eval_every_n_steps": 2.0}, "eval_every_n_steps must be a positive int"),
        ({"eval_every_n_steps": True}, "eval_every_n_steps must be a positive int"),
        ({"lca_beta": 2}, r"lca_beta=2 .* set eval_every_n_steps=1 \(got None\)"),
        ({"cache_test_batches": "yes"}, "cache_test_batches must be None"),
        ({"cache_max_bytes": -1}, "cache_max_bytes must be"),
    ],
)
def test_bad_arguments(tasks, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ContinualEvalCallback(eval_loaders(tasks), **kwargs)


def test_subset_needs_map_style_loaders(tasks):
    x, y = tasks[0][1]
    with pytest.raises(ValueError, match=r"test dataloader 1 \('task_1'\).*map-style"):
        ContinualEvalCallback(
            [DataLoader(TensorDataset(x, y)), list(zip(x, y, strict=True))],
            eval_every_n_steps=StepEvaluation(1, subset=4),
        )


def test_resume_keeps_curves_and_step_counter(tasks, tmp_path):
    """fit_tasks resumed from task_0.ckpt gives the curves of an uninterrupted run."""
    steps, stages, rows, _ = reference_curves(tasks, K)
    cb = ContinualEvalCallback(eval_loaders(tasks), eval_every_n_steps=K, verbose=False)
    model = Classifier(make_net())
    trainer = pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=EPOCHS))
    fit_tasks(trainer, model, train_loaders(tasks)[:1], checkpoint_dir=tmp_path)

    cb2 = ContinualEvalCallback(eval_loaders(tasks), eval_every_n_steps=K, verbose=False)
    trainer = pl.Trainer(callbacks=[cb2], **trainer_kwargs(tmp_path, max_epochs=EPOCHS))
    fit_tasks(
        trainer,
        Classifier(make_net(seed=1)),
        train_loaders(tasks),
        ckpt_path=tmp_path / "task_0.ckpt",
    )
    got = cb2.curves()
    assert got[0].tolist() == steps and got[1].tolist() == stages and same(got[2], rows)


def test_plot_accuracy_curves():
    from continual_eval.plotting import plot_accuracy_curves

    acc = torch.tensor([[0.5, math.nan], [0.9, math.nan], [0.4, 0.6], [0.7, 0.9]])
    fig, ax = plot_accuracy_curves([2, 4, 6, 8], acc, [4, 8], task_names=["a", "b"])
    lines = ax.get_lines()
    assert len(lines) == 4  # two boundary lines, two task curves
    assert [list(line.get_xdata()) for line in lines[:2]] == [[4, 4], [8, 8]]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"]
    assert list(lines[3].get_ydata())[2:] == pytest.approx([0.6, 0.9])
    with pytest.raises(ValueError, match="3 steps for 4 rows"):
        plot_accuracy_curves([2, 4, 6], acc, [4])
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_tensorboard_wandb_mlflow_get_steps_and_curves_figure(tasks, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    import wandb
    from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from test_callback_logging import _wandb_history

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file:{tmp_path / 'mlruns'}"
    tb = TensorBoardLogger(tmp_path, name="tb")
    wb = WandbLogger(project="continual-eval-test", save_dir=str(tmp_path), offline=True)
    ml = MLFlowLogger(experiment_name="continual", tracking_uri=uri)
    try:
        cb, _ = run_per_task(tasks, tmp_path, logger=[tb, wb, ml], eval_every_n_steps=K)
        run_dir = wb.experiment.dir.rsplit("/files", 1)[0]
    finally:
        wandb.finish()
    _, _, rows = cb.curves()

    acc = EventAccumulator(str(tb.log_dir), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    events = by_step(acc.Scalars("continual/step/task_0"))
    assert [e.step for e in events] == [4, 6, 8, 12, 16, 18]
    assert events[0].value == pytest.approx(rows[0, 0].item(), abs=1e-6)
    assert [e.step for e in by_step(acc.Scalars("continual/wc_acc"))] == [0, 1, 2]
    images = by_step(acc.Images("continual/accuracy_curves"))
    assert [im.step for im in images] == [0, 1, 2]
    assert images[-1].encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"

    history = _wandb_history(run_dir, records=9)
    per_step = [h for h in history if "continual/step/task_0" in h]
    assert [int(h["trainer/global_step"]) for h in per_step] == [4, 6, 8, 12, 16, 18]
    staged = [h for h in history if "continual/acc" in h]
    assert json.loads(staged[-1]["continual/accuracy_curves/_type"]) == "image-file"

    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(ml.run_id, "continual/step/task_1")
    assert sorted(m.step for m in history) == [8, 12, 16, 18]
    artifacts = {a.path for a in client.list_artifacts(ml.run_id, "continual")}
    assert "continual/accuracy_curves_stage_002.png" in artifacts


# ---------------------------------------------------------------- every scorer per step
SCORERS = {"acc": "accuracy", "loss": "cross_entropy"}


class CountingClassifier(Classifier):
    """Counts the forward passes of evaluations (the model in eval mode)."""

    def __init__(self, net):
        super().__init__(net)
        self.eval_forwards = 0

    def forward(self, x):
        if not self.training:
            self.eval_forwards += 1
        return super().forward(x)


def split_cells(rows):
    """``(accuracy rows, loss rows)`` of :func:`reference_curves` with ``loss=True``."""
    acc = [[c[0] if isinstance(c, tuple) else math.nan for c in row] for row in rows]
    ce = [[c[1] if isinstance(c, tuple) else math.nan for c in row] for row in rows]
    return acc, ce


def close(a: torch.Tensor, b, rtol: float = 1e-6) -> bool:
    """Same NaN cells, the others within ``rtol`` (float32 per-sample losses)."""
    b = torch.as_tensor(b, dtype=torch.float64)
    nan = torch.isnan(a)
    return (
        a.shape == b.shape
        and torch.equal(nan, torch.isnan(b))
        and torch.allclose(a[~nan], b[~nan], rtol=rtol, atol=0)
    )


def hand_loss_stability(stages, rows):
    """min-ACC, WC-ACC and gap depth of a lower-is-better curve with loops (worst = highest)."""
    S = max(stages) + 1
    last = [max(n for n in range(len(stages)) if stages[n] == s) for s in range(S)]
    min_acc, wc_acc = [math.nan], [rows[last[0]][0]]
    for k in range(1, S):
        worst = [max(rows[n][i] for n in range(len(rows)) if i < stages[n] <= k) for i in range(k)]
        min_acc.append(sum(worst) / k)
        wc_acc.append(rows[last[k]][k] / (k + 1) + (1 - 1 / (k + 1)) * min_acc[-1])
    depth = [
        max(rows[n][j] for n in range(len(rows)) if stages[n] == j + 1) - rows[last[j]][j]
        for j in range(S - 1)
    ]
    return min_acc, wc_acc, depth


def test_every_scorer_gets_step_curves_from_the_same_forward_passes(tasks, tmp_path):
    steps, stages, rows, _ = reference_curves(tasks, K, loss=True)
    acc_rows, loss_rows = split_cells(rows)
    forwards = {}
    for scorers in ({"acc": "accuracy"}, SCORERS):
        model = CountingClassifier(make_net())
        out = tmp_path / str(len(scorers))
        cb = ContinualEvalCallback(
            eval_loaders(tasks), scorers=scorers, eval_every_n_steps=K, dirpath=out, verbose=False
        )
        logger = CSVLogger(out, name="csv")
        for dl in train_loaders(tasks):
            kwargs = trainer_kwargs(out, max_epochs=EPOCHS, logger=logger)
            pl.Trainer(callbacks=[cb], **kwargs).fit(model, dl)
        forwards[len(scorers)] = model.eval_forwards
    assert forwards[2] == forwards[1]  # one forward pass per test batch feeds every scorer

    got = cb.curves()
    assert got[0].tolist() == steps and got[1].tolist() == stages and same(got[2], acc_rows)
    loss = cb.curves("loss")
    assert loss[0].tolist() == steps and close(loss[2], loss_rows)
    # stage-end rows of the loss curve are the rows of the loss matrix
    for n in (1, 3, 5):
        stage = stages[n]
        assert same(loss[2][n, : stage + 1], cb.matrices["loss"][stage, : stage + 1])

    document = ContinualResults.load(out).to_dict()
    assert document["matrices"]["loss"]["step_scores"] == json.loads(
        json.dumps([[None if math.isnan(v) else v for v in r] for r in loss[2].tolist()])
    )
    assert document["curves"]["accuracy"] == document["matrices"]["acc"]["step_scores"]
    results = ContinualResults.load(out)
    stability = results["loss"].stability
    min_acc, wc_acc, depth = hand_loss_stability(stages, loss[2].tolist())
    assert stability.min_acc[1:].tolist() == pytest.approx(min_acc[1:], abs=1e-12)
    assert stability.wc_acc.tolist() == pytest.approx(wc_acc, abs=1e-12)
    assert stability.per_task["depth"].tolist() == pytest.approx(depth, abs=1e-12)
    assert (out / "accuracy_curves.png").stat().st_size > 1000
    assert (out / "curves_loss.png").stat().st_size > 1000

    # logged per scorer: the primary keeps its keys, the loss carries its name
    with open(out / "csv" / "version_0" / "metrics.csv") as fh:
        logged = list(csv.DictReader(fh))
    per_step = [r for r in logged if r.get("continual/loss/step/task_0")]
    assert [int(r["step"]) for r in per_step] == steps
    assert [float(r["continual/loss/step/task_0"]) for r in per_step] == loss[2][:, 0].tolist()
    assert [float(r["continual/step/task_0"]) for r in per_step] == got[2][:, 0].tolist()
    staged = [r for r in logged if r.get("continual/loss/wc_acc")]
    assert [int(r["step"]) for r in staged] == [0, 1, 2]
    assert [float(r["continual/loss/wc_acc"]) for r in staged] == pytest.approx(wc_acc)
    assert float(staged[1]["continual/loss/gap_depth/task_0"]) == pytest.approx(depth[0])
    assert float(staged[2]["continual/wc_acc"]) == pytest.approx(
        results.primary.stability.wc_acc[2].item()
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"every_n_steps": 0}, "every_n_steps must be a positive int"),
        ({"every_n_steps": 1, "subset": -1}, "subset must be a positive int or None"),
        ({"every_n_steps": 1, "subset": 4, "subset_seed": "0"}, "subset_seed must be an int"),
    ],
)
def test_bad_step_evaluation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StepEvaluation(**kwargs)

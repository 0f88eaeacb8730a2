"""The progress of the callback's evaluations (issue 23.3): a bar per evaluation through the
Trainer's TQDM or Rich progress bar, advanced per batch by the evaluation loop; nothing without
a progress bar; one line per stage with its evaluation time; ``verbose=False`` prints nothing of
ours at all."""

from __future__ import annotations

import logging

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders, trainer_kwargs

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.evaluation import evaluate_tasks

# test sets of 37, 29 and 41 samples in batches of 8: 5 + 4 + 6 batches
BATCHES = 15


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


def _run(tasks, tmp_path, *, verbose=True, bar=None, **trainer_overrides):
    cb = ContinualEvalCallback(
        eval_loaders(tasks), dirpath=tmp_path / "run", verbose=verbose, cache_test_batches=True
    )
    kwargs = trainer_kwargs(tmp_path, max_epochs=1, **trainer_overrides)
    callbacks = [cb] if bar is None else [cb, bar]
    fit_tasks(
        pl.Trainer(callbacks=callbacks, **kwargs), Classifier(make_net()), train_loaders(tasks)
    )
    return cb


class _Recorder:
    def __init__(self):
        self.events = []

    def start(self, total):
        self.events.append(("start", total))

    def advance(self):
        self.events.append(("advance",))


def test_the_loop_reports_the_batch_total_then_every_batch(tasks):
    recorder = _Recorder()
    evaluate_tasks(make_net(), eval_loaders(tasks), [0, 2], progress=recorder)
    assert recorder.events == [("start", 5 + 6)] + [("advance",)] * 11

    class Unsized(torch.utils.data.IterableDataset):
        def __iter__(self):
            x, y = tasks[0][1]
            return iter(zip(x[:20], y[:20], strict=True))

    recorder = _Recorder()
    unsized = torch.utils.data.DataLoader(Unsized(), batch_size=8)
    evaluate_tasks(make_net(), [unsized], [0], progress=recorder)
    assert recorder.events == [("start", None)] + [("advance",)] * 3


def test_tqdm_bar_per_evaluation_and_a_line_per_stage(tasks, tmp_path, capfd, caplog):
    from lightning.pytorch.callbacks import TQDMProgressBar

    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        cb = _run(tasks, tmp_path, bar=TQDMProgressBar(), enable_progress_bar=True)
    out = capfd.readouterr()
    text = out.out + out.err
    for what in ("baseline", "after stage 0", "after stage 1", "after stage 2"):
        bars = [part for part in text.split("\r") if f"Continual eval ({what})" in part]
        assert bars, what
        assert any(f"{BATCHES}/{BATCHES}" in part for part in bars), bars  # advanced per batch
    lines = [r.getMessage() for r in caplog.records if "[continual-eval] stage" in r.getMessage()]
    assert len(lines) == 3
    for stage, line in enumerate(lines):
        seconds = cb.continual_results().cost.at(stage).eval_seconds
        assert line.endswith(f"(evaluation {seconds:.2f} s)")


def test_no_bar_without_a_progress_bar(tasks, tmp_path, capfd, caplog):
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        _run(tasks, tmp_path, enable_progress_bar=False)
    out = capfd.readouterr()
    assert "Continual eval" not in out.out + out.err + caplog.text
    assert caplog.text.count("(evaluation ") == 3  # the lines per stage are still there
    assert "caching collated test batches" in caplog.text


def test_rich_bar_per_evaluation(tasks, tmp_path, capfd):
    pytest.importorskip("rich")
    from lightning.pytorch.callbacks import RichProgressBar

    bar = RichProgressBar(refresh_rate=1, console_kwargs={"force_terminal": True, "width": 200})
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path / "run")
    kwargs = trainer_kwargs(tmp_path, max_epochs=1, enable_progress_bar=True)
    pl.Trainer(callbacks=[cb, bar], **kwargs).fit(Classifier(make_net()), train_loaders(tasks)[0])
    text = capfd.readouterr().out
    assert "Continual eval (baseline)" in text and "Continual eval (after stage 0)" in text
    assert f"{BATCHES}/{BATCHES}" in text


@pytest.mark.parametrize("progress_bar", ["tqdm", "rich", None])
def test_verbose_false_prints_nothing_of_ours(tasks, tmp_path, capfd, caplog, progress_bar):
    from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

    bar = {"tqdm": TQDMProgressBar(), "rich": None, None: None}[progress_bar]
    if progress_bar == "rich":
        pytest.importorskip("rich")
        bar = RichProgressBar(console_kwargs={"force_terminal": True, "width": 200})
    with caplog.at_level(logging.DEBUG):
        cb = _run(
            tasks, tmp_path, verbose=False, bar=bar, enable_progress_bar=progress_bar is not None
        )
    out = capfd.readouterr()
    text = out.out + out.err + caplog.text
    assert cb.stages_completed == 3 and cb._task_loaders.cache.num_cached  # the cache did fill
    for ours in ("continual-eval", "continual_eval", "Continual eval", "ContinualEval"):
        assert ours not in text

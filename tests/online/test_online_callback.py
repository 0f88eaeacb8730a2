"""OnlineEvalCallback in real Trainer runs on CPU, against plain test-then-train loops."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from online_helpers import (
    CLASSES,
    Learner,
    blind_counts,
    loader,
    make_net,
    plain_table,
    run_stream,
    trainer,
    window_sums,
)
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader, DistributedSampler, TensorDataset

from continual_eval.online import (
    ONLINE_PNG,
    OnlineEvalCallback,
    OnlineResults,
    read_online,
)
from continual_eval.online.synthetic import StreamClassifier, autocorrelated_stream
from continual_eval.results import InvalidResultsError
from continual_eval.results.files import RESULTS_FILE

B, WINDOW, BLIND = 10, 4, 7


def _fit(tmp_path, net, x, y, *, batch_size=B, return_preds=True, **options):
    options.setdefault("window_batches", WINDOW)
    options.setdefault("blind_window", BLIND)
    cb = OnlineEvalCallback(dirpath=tmp_path / "results", verbose=False, **options)
    model = Learner(copy.deepcopy(net), return_preds=return_preds)
    trainer(tmp_path, [cb]).fit(model, loader(x, y, batch_size))
    return cb, model


def _check_against_plain_loop(cb, net, x, y, delays, label_delays):
    offsets = max([0, *delays, *label_delays]) + 1
    correct, total, reference = plain_table(net, x, y, B, offsets)
    results = cb.results
    scores = [("online", 0, False)]
    scores += [(f"near_future/{d}", d, False) for d in delays]
    scores += [(f"label_delay/{d}", d, True) for d in label_delays]
    for key, delay, head in scores:
        assert [w.scores[key].correct for w in results.windows] == window_sums(
            correct, WINDOW, delay, head
        ), key
        assert [w.scores[key].total for w in results.windows] == window_sums(
            total, WINDOW, delay, head
        ), key
        blind = blind_counts(y.tolist(), B, delay, BLIND, head)
        for name, per_batch in blind.items():
            expected = [sum(per_batch[i : i + WINDOW]) for i in range(0, len(per_batch), WINDOW)]
            assert [w.scores[key].blind[name] for w in results.windows] == expected, (key, name)
    return reference


@pytest.mark.parametrize(
    ("dropout", "prequential", "return_preds", "expected_mode"),
    [
        (0.0, "auto", True, "outputs"),  # outputs reused: no extra forward pass
        (0.3, "auto", True, "forward"),  # dropout in train mode: one eval-mode forward
        (0.0, "forward", False, "forward"),
        (0.0, "outputs", True, "outputs"),
    ],
)
def test_online_near_future_label_delay_and_blind_equal_a_plain_loop(
    tmp_path, dropout, prequential, return_preds, expected_mode
):
    x, y = run_stream(230, 17, seed=1)
    net = make_net(dropout)
    cb, model = _fit(
        tmp_path,
        net,
        x,
        y,
        return_preds=return_preds,
        prequential=prequential,
        near_future_delays=[1, 3],
        label_delays=[2],
    )
    assert cb.results.protocol.prequential == expected_mode
    reference = _check_against_plain_loop(cb, net, x, y, [1, 3], [2])
    # the callback's eval forwards changed nothing in the training (RNG, train/eval flags)
    for p, q in zip(model.net.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)
    batches = math.ceil(230 / B)
    # one read and forward per offset per batch with a batch that far ahead; label delay 2's
    # head (offset 1 at batch 0) is near-future 1's read
    lookahead = sum(batches - d for d in (1, 2, 3))
    prequential_forwards = batches if expected_mode == "forward" else 0
    if prequential == "auto" and expected_mode == "outputs":
        prequential_forwards = 1  # the first batch's check
    forwards = sum(w.cost.scoring_forwards for w in cb.results.windows)
    assert forwards == lookahead + prequential_forwards


def test_batch_norm_is_scored_in_eval_mode(tmp_path):
    x, y = run_stream(120, 9, seed=4)
    net = make_net(batch_norm=True)
    cb, _ = _fit(tmp_path, net, x, y, near_future_delays=[2])
    assert cb.results.protocol.prequential == "forward"
    _check_against_plain_loop(cb, net, x, y, [2], [])


def test_blind_predictors_on_a_hand_made_stream(tmp_path):
    y = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2, 0, 0, 0])
    x = torch.randn(12, 6)
    cb, _ = _fit(
        tmp_path,
        make_net(),
        x,
        y,
        batch_size=2,
        window_batches=6,
        blind_window=3,
        near_future_delays=[1],
        label_delays=[1],
    )
    (window,) = cb.results.windows
    online, future = window.scores["online"], window.scores["near_future/1"]
    # batches [0,0] [0,1] [1,1] [1,2] [2,0] [0,0], each predicted from the labels before it
    assert online.total == 12 and future.total == 10
    assert online.blind == {"last": 7, "mode": 2, "prior": 4}
    assert future.blind == {"last": 1, "mode": 0, "prior": 0}
    delayed = window.scores["label_delay/1"]  # batches 0 and 1 have no label yet: never right
    assert delayed.total == 12 and delayed.blind == {"last": 1, "mode": 0, "prior": 0}


def test_autocorrelated_stream_fools_online_but_not_near_future_accuracy(tmp_path):
    classes, run, batch, delay = 10, 100, 10, 40  # 40 batches = 400 samples = 4 runs ahead
    stream, _ = autocorrelated_stream(3000, classes, run, dim=20, separation=4.0, seed=0)
    cb = OnlineEvalCallback(
        near_future_delays=[delay],
        window_batches=50,
        blind_window=batch,
        dirpath=tmp_path / "results",
        verbose=False,
    )
    model = StreamClassifier(dim=20, num_classes=classes, hidden=32, lr=0.05)
    trainer(tmp_path, [cb]).fit(model, DataLoader(stream, batch_size=batch))
    results = cb.results
    blind_online = results.accuracy("online", "mode")
    blind_future = results.accuracy(f"near_future/{delay}", "mode")
    # runs of 100 = 10 batches: the blind predictor misses only a run's first batch
    assert blind_online > 0.8
    assert abs(blind_future - 1 / classes) < 0.08  # four runs ahead: chance (about 26 run pairs)
    learner_future = results.accuracy(f"near_future/{delay}")
    assert learner_future > blind_future + 0.1  # the learner did learn something about x


def test_blind_near_future_accuracy_is_chance_in_simulation():
    """Over 40 seeded streams (no Trainer): the blind predictors' online accuracy is high and
    their accuracy 4 runs ahead is 1 / classes (a run's class differs from the previous run's,
    uniformly: 4 runs on, the same class has probability 0.1001)."""
    from continual_eval.functional.online import last_label, recent_mode
    from continual_eval.online.synthetic import autocorrelated_labels

    classes, run, batch, delay = 10, 100, 10, 40
    online, future = [], []
    for seed in range(40):
        y = autocorrelated_labels(3000, classes, run, generator=torch.Generator().manual_seed(seed))
        starts = torch.arange(0, 3000, batch)
        cutoffs = starts.repeat_interleave(batch)  # each sample: the labels before its batch
        online.append(
            float((recent_mode(y, cutoffs, batch, num_classes=classes) == y).double().mean())
        )
        ahead = torch.arange(3000 - delay * batch)
        guess = last_label(y, cutoffs[: ahead.numel()])
        future.append(float((guess == y[ahead + delay * batch]).double().mean()))
    assert sum(online) / 40 > 0.85
    assert abs(sum(future) / 40 - 0.1001) < 0.015  # standard error about 0.008


def test_held_out_evaluations_equal_plain_evaluations(tmp_path):
    x, y = run_stream(200, 25, seed=2)
    tests = [run_stream(33, 33, seed=10 + j) for j in range(2)]
    held = [DataLoader(TensorDataset(tx, ty), batch_size=8) for tx, ty in tests]
    net = make_net()
    cb, _ = _fit(
        tmp_path,
        net,
        x,
        y,
        near_future_delays=[],
        held_out=held,
        held_out_names=["first", "second"],
        segment_starts=[0, 95],
        eval_every_n_windows=2,
    )
    evaluations = cb.results.held_out.evaluations
    # before training, every 2nd window (8 batches), the boundary at 95 (batch 10 starts at 100),
    # and the end (20 batches: the last window's end, which is a 2nd window)
    assert [e.batches for e in evaluations] == [0, 8, 10, 16, 20]
    assert [e.segments_ended for e in evaluations] == [[], [], [0], [], [1]]
    # a plain loop: train batch by batch, evaluate at the same batch counts
    plain = copy.deepcopy(net)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    torch.manual_seed(7)
    expected = {}
    for k in range(21):
        if k in (0, 8, 10, 16, 20):
            plain.eval()
            with torch.no_grad():
                expected[k] = [int((plain(tx).argmax(1) == ty).sum()) / len(ty) for tx, ty in tests]
            plain.train()
        if k < 20:
            bx, by = x[k * B : (k + 1) * B], y[k * B : (k + 1) * B]
            loss = nn.functional.cross_entropy(plain(bx), by)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert [e.scores for e in evaluations] == [expected[e.batches] for e in evaluations]
    R, b = cb.results.held_out_rows()
    assert R.tolist() == [expected[10], expected[20]] and b.tolist() == expected[0]
    summary = cb.results.summary()["held_out"]
    assert summary["matrix"] == R.tolist()
    assert summary["metrics"]["acc"] == pytest.approx(sum(expected[20]) / 2)
    eval_seconds = sum(w.cost.eval_seconds for w in cb.results.windows)
    assert eval_seconds > 0


def test_a_stream_over_several_epochs_reads_ahead_across_them(tmp_path):
    x, y = run_stream(120, 13, seed=6)
    stream = ConcatDataset([TensorDataset(x, y)] * 2)
    net = make_net()
    cb = OnlineEvalCallback(
        near_future_delays=[2],
        window_batches=WINDOW,
        blind_window=BLIND,
        stream=stream,
        dirpath=tmp_path / "results",
        verbose=False,
    )
    trainer(tmp_path, [cb], max_epochs=2).fit(Learner(copy.deepcopy(net)), loader(x, y, B))
    x2, y2 = torch.cat([x, x]), torch.cat([y, y])
    _check_against_plain_loop(cb, net, x2, y2, [2], [])
    assert cb.results.windows[-1].stream_end == 240


def test_files_and_loggers(tmp_path):
    x, y = run_stream(160, 20, seed=3)
    held = [DataLoader(TensorDataset(*run_stream(20, 20, seed=9)), batch_size=8)]
    loggers = [CSVLogger(tmp_path, name="csv"), TensorBoardLogger(tmp_path, name="tb")]
    cb = OnlineEvalCallback(
        near_future_delays=[2], window_batches=WINDOW, held_out=held, verbose=False
    )
    trainer(tmp_path, [cb], logger=loggers).fit(Learner(make_net()), loader(x, y, B))
    results_dir = cb.results_dir
    assert results_dir == tmp_path / "csv" / "version_0"  # the first logger's directory
    on_disk = read_online(results_dir)
    assert on_disk.to_dict() == cb.results.to_dict()
    assert (results_dir / ONLINE_PNG).stat().st_size > 10_000
    rows = (results_dir / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    column = header.index("online/acc")
    values = [r.split(",")[column] for r in rows[1:] if r.split(",")[column]]
    expected = [w.scores["online"].correct / w.scores["online"].total for w in on_disk.windows]
    assert [float(v) for v in values] == pytest.approx(expected)
    assert "online/blind_mode/near_future/2/acc" in header
    assert "online/held_out/seen" in header and "online/cost/train_seconds" in header

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(loggers[1].log_dir), size_guidance={"images": 0})
    events.Reload()
    assert len(events.Scalars("online/acc")) == len(on_disk.windows)
    assert "online/curves" in events.Tags()["images"]


def test_record_round_trip_and_schema_errors(tmp_path):
    x, y = run_stream(80, 10, seed=5)
    cb, _ = _fit(tmp_path, make_net(), x, y, near_future_delays=[1])
    document = cb.results.to_dict()
    again = OnlineResults.from_dict(json.loads(json.dumps(document)))
    assert again.to_dict() == document
    broken = json.loads(json.dumps(document))
    broken["windows"][1]["scores"]["online"]["correct"] = "3"
    with pytest.raises(
        InvalidResultsError,
        match=r"online\.windows\[1\]\.scores\.online\.correct: expected an integer >= 0, "
        'found string "3"',
    ):
        OnlineResults.from_dict(broken)
    broken = json.loads(json.dumps(document))
    del broken["windows"][0]["cost"]
    with pytest.raises(InvalidResultsError, match=r"online\.windows\[0\]\.cost: missing"):
        OnlineResults.from_dict(broken)
    broken = json.loads(json.dumps(document))
    broken["windows"][1]["stream_start"] += 1
    with pytest.raises(
        InvalidResultsError,
        match=r"online\.windows\[1\]\.stream_start: expected integer 40 \(the window continues "
        r"window 0\)",
    ):
        OnlineResults.from_dict(broken)


class _Diverges(Learner):
    """Returns NaN class scores from training batch 9 on (the third window)."""

    def forward(self, x):
        out = super().forward(x)
        if self.trainer.fit_loop.total_batch_idx >= 9:
            out = out * float("nan")
        return out


def test_non_finite_predictions_name_the_window_and_keep_the_record(tmp_path):
    x, y = run_stream(200, 10, seed=1)
    cb = OnlineEvalCallback(
        near_future_delays=[], window_batches=WINDOW, dirpath=tmp_path / "r", verbose=False
    )
    model = _Diverges(make_net(), return_preds=False)
    with pytest.raises(ValueError, match=r"window 2 \(training batches 8\.\.11\).*non-finite"):
        trainer(tmp_path, [cb]).fit(model, loader(x, y, B))
    kept = read_online(tmp_path / "r")
    assert len(kept.windows) == 2  # what was recorded before the bad window is on disk


class _ClampsTargets(Learner):
    """Trains on targets clamped into the class range (the scores see the raw targets)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return super().training_step((x, y.clamp(max=CLASSES - 1)), batch_idx)


def test_bad_input_is_refused_with_its_reason(tmp_path):
    x, y = run_stream(60, 10, seed=1)
    with pytest.raises(ValueError, match=r"training batch 0: prequential='outputs'.*'preds'"):
        _fit(tmp_path / "a", make_net(), x, y, prequential="outputs", return_preds=False)
    shuffled = DataLoader(TensorDataset(x, y), batch_size=B, shuffle=True)
    cb = OnlineEvalCallback(dirpath=tmp_path / "b", verbose=False)
    with pytest.raises(ValueError, match=r"cannot read the stream ahead.*RandomSampler"):
        trainer(tmp_path, [cb]).fit(Learner(make_net()), shuffled)
    cb = OnlineEvalCallback(stream=TensorDataset(x, y), dirpath=tmp_path / "e", verbose=False)
    with pytest.raises(ValueError, match=r"RandomSampler\) while stream= holds the stream"):
        trainer(tmp_path, [cb]).fit(Learner(make_net()), shuffled)
    dataset = TensorDataset(x, y)  # what Lightning puts into a training loader under DDP:
    shuffling = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True)
    cb = OnlineEvalCallback(near_future_delays=[], dirpath=tmp_path / "d", verbose=False)
    with pytest.raises(ValueError, match=r"shuffles the stream.*use_distributed_sampler=False"):
        trainer(tmp_path, [cb]).fit(
            Learner(make_net()), DataLoader(dataset, batch_size=B, sampler=shuffling)
        )
    bad_y = y.clone()
    bad_y[33] = CLASSES + 3
    cb = OnlineEvalCallback(
        near_future_delays=[], window_batches=WINDOW, dirpath=tmp_path / "c", verbose=False
    )
    with pytest.raises(ValueError, match=r"window 0 .*targets that are not labels.*position 33"):
        trainer(tmp_path, [cb]).fit(_ClampsTargets(make_net()), loader(x, bad_y, B))
    for kwargs, message in [
        ({"near_future_delays": [0]}, "integers >= 1"),
        ({"window_batches": 0}, "window_batches must be"),
        ({"prequential": "train"}, "prequential must be one of"),
        ({"held_out": [loader(x, y, 4)], "segment_starts": [5]}, "beginning at 0"),
        ({"held_out": [loader(x, y, 4)], "held_out_names": ["a", "b"]}, "name each of the 1"),
        ({"segment_starts": [0]}, "pass held_out"),
    ]:
        with pytest.raises(ValueError, match=message):
            OnlineEvalCallback(**kwargs)


def test_another_runs_record_is_never_overwritten(tmp_path):
    x, y = run_stream(60, 10, seed=1)
    _fit(tmp_path, make_net(), x, y, near_future_delays=[])
    before = (tmp_path / "results" / RESULTS_FILE).read_text()
    with pytest.raises(FileExistsError, match=r"OnlineEvalCallback: .*another run"):
        _fit(tmp_path, make_net(), x, y, near_future_delays=[])
    assert (tmp_path / "results" / RESULTS_FILE).read_text() == before
    _fit(tmp_path, make_net(), x, y, near_future_delays=[], overwrite=True)

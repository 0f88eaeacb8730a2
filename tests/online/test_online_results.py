"""The ``online`` section of ``results.json``: written by OnlineEvalCallback alone (a run without
tasks) and together with ContinualEvalCallback (one record in that callback's file, whichever
callback writes last), read back through the results model, and refused with the field named
when it is broken."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from online_helpers import Learner, loader, make_net, run_stream, trainer
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.online import OnlineEvalCallback, OnlineResults, read_online
from continual_eval.results import ContinualResults, InvalidResultsError
from continual_eval.results.files import RESULTS_FILE, commit_results, read_document

B, WINDOW = 10, 4


def _held_out(seed: int) -> DataLoader:
    return DataLoader(TensorDataset(*run_stream(40, 10, seed=seed)), batch_size=16)


def _online_only(tmp_path):
    x, y = run_stream(120, 10, seed=5)
    cb = OnlineEvalCallback(
        near_future_delays=[1, 3],
        label_delays=[2],
        window_batches=WINDOW,
        held_out=[_held_out(1), _held_out(2)],
        segment_starts=[0, 60],
        dirpath=tmp_path / "run",
        metadata={"experiment": "online", "method": "sgd", "seed": 0},
        verbose=False,
    )
    trainer(tmp_path, [cb]).fit(Learner(make_net()), loader(x, y, B))
    return cb


def test_online_run_writes_its_record_into_results_json(tmp_path):
    cb = _online_only(tmp_path)
    path = tmp_path / "run" / RESULTS_FILE
    loaded = ContinualResults.load(path)
    assert loaded.num_tasks == 0 and loaded.online is not None
    assert loaded.run_id == cb.run_id
    assert loaded.metadata == {"experiment": "online", "method": "sgd", "seed": 0}
    assert loaded.online.to_dict() == cb.results.to_dict()
    assert read_online(tmp_path / "run").to_dict() == cb.results.to_dict()
    # the derived summary is in the file, beside the counts it is recomputed from
    on_disk = json.loads(path.read_text())
    summary = on_disk["online"]["summary"]
    assert summary["scores"]["near_future/3"]["accuracy"] == cb.accuracy("near_future/3")
    assert summary["held_out"]["metrics"]["acc"] is not None  # R over the two segments
    assert set(on_disk["online"]["windows"][0]["cost"]) >= {
        "samples",
        "optimizer_steps",
        "train_seconds",
    }
    # round trips: the document, the model, the file
    document = loaded.to_dict()
    assert ContinualResults.from_dict(json.loads(json.dumps(document))).to_dict() == document
    assert cb.continual_results().to_dict() == document
    assert OnlineResults.from_dict(document["online"]).to_dict() == document["online"]
    assert not (tmp_path / "run" / ".continual_eval_claim.json").exists()  # released at the end


@pytest.mark.parametrize(
    ("where", "value", "field", "problem"),
    [
        (
            ["windows", 1, "scores", "online", "correct"],
            10**6,
            "online.windows[1].scores.online.correct",
            "expected at most total (40), found integer 1000000",
        ),
        (
            ["windows", 0, "scores", "near_future/3", "total"],
            -1,
            'online.windows[0].scores["near_future/3"].total',
            "expected an integer >= 0, found integer -1",
        ),
        (
            ["protocol", "window_batches"],
            0,
            "online.protocol.window_batches",
            "expected an integer >= 1, found integer 0",
        ),
        (
            ["protocol", "prequential"],
            "train",
            "online.protocol.prequential",
            "expected one of ('outputs', 'forward'), found string \"train\"",
        ),
        (
            ["windows", 2, "index"],
            7,
            "online.windows[2].index",
            "expected integer 2 (windows are numbered 0, 1, ...), found integer 7",
        ),
        (
            ["held_out", "evaluations", 1, "scores"],
            [0.5],
            "online.held_out.evaluations[1].scores",
            "expected an array of 2 items, found array of 1 items",
        ),
        (
            ["held_out", "evaluations", 0, "scores", 0],
            1.5,
            "online.held_out.evaluations[0].scores[0]",
            "expected a value in [0.0, 1.0] (an accuracy), found number 1.5",
        ),
        (["windows", 0, "cost"], None, "online.windows[0].cost", "expected an object, found null"),
    ],
)
def test_a_broken_online_section_is_refused_naming_the_field(
    tmp_path, where, value, field, problem
):
    _online_only(tmp_path)
    path = tmp_path / "run" / RESULTS_FILE
    document = json.loads(path.read_text())
    target = document["online"]
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    path.write_text(json.dumps(document))
    with pytest.raises(InvalidResultsError) as err:
        ContinualResults.load(path)
    assert err.value.field == field
    assert err.value.problem == problem
    assert str(err.value) == f"{path}: {field}: {problem}"
    with pytest.raises(InvalidResultsError, match="online"):
        ContinualResults.from_dict(document)


def test_a_document_without_tasks_needs_an_online_section(tmp_path):
    cb = _online_only(tmp_path)
    document = cb.continual_results().to_dict()
    del document["online"]
    with pytest.raises(InvalidResultsError, match=r"num_tasks: .*0 only in a document with an"):
        ContinualResults.from_dict(document)


def _two_task_run(tmp_path, order: str, *, dirpath=None):
    x, y = run_stream(160, 20, seed=3)
    stream = TensorDataset(x, y)
    task = ContinualEvalCallback(
        [_held_out(1), _held_out(2)],
        task_names=["first", "second"],
        dirpath=tmp_path / "run",
        metadata={"method": "sgd"},
        verbose=False,
    )
    online = OnlineEvalCallback(
        near_future_delays=[2],
        window_batches=WINDOW,
        stream=stream,
        held_out=[_held_out(1), _held_out(2)],
        segment_starts=[0, 80],
        dirpath=dirpath,
        verbose=False,
    )
    callbacks = [task, online] if order == "task first" else [online, task]
    fit_tasks(
        trainer(tmp_path, callbacks),
        Learner(copy.deepcopy(make_net())),
        [loader(x[:80], y[:80], B), loader(x[80:], y[80:], B)],
    )
    return task, online


@pytest.mark.parametrize("order", ["task first", "online first"])
def test_with_continual_eval_callback_one_results_json_holds_both(tmp_path, order):
    task, online = _two_task_run(tmp_path, order)
    assert online.files_dir == task.results_dir == tmp_path / "run"
    loaded = ContinualResults.load(tmp_path / "run")
    assert loaded.run_id == task.run_id and loaded.metadata == {"method": "sgd"}
    assert loaded.task_names == ("first", "second") and loaded.stages_completed == 2
    assert loaded.primary.scores.tolist() == task.scores.tolist()
    assert loaded.online is not None
    assert loaded.online.to_dict() == online.results.to_dict()
    # the whole stream, read ahead across the two fits through stream=
    assert online.results.windows[-1].stream_end == 160
    assert sum(w.scores["near_future/2"].total for w in online.results.windows) == 160 - 2 * B
    assert online.continual_results().to_dict() == loaded.to_dict()
    # a write of the task callback's results alone keeps the online section of its run
    commit_results(tmp_path / "run", task.continual_results().to_document())
    assert read_document(tmp_path / "run").online is not None
    assert read_online(tmp_path / "run").to_dict() == online.results.to_dict()
    # ... but not one of another run
    other = dataclasses.replace(task.continual_results(), run_id="another")
    other.write(tmp_path / "run")
    assert read_document(tmp_path / "run").online is None


def test_with_continual_eval_callback_dirpath_and_a_second_online_callback_are_refused(tmp_path):
    with pytest.raises(ValueError, match="leave dirpath unset"):
        _two_task_run(tmp_path / "a", "task first", dirpath=tmp_path / "elsewhere")
    x, y = run_stream(40, 10)
    callbacks = [
        ContinualEvalCallback([_held_out(1)], dirpath=tmp_path / "b", verbose=False),
        OnlineEvalCallback(near_future_delays=[], verbose=False),
        OnlineEvalCallback(near_future_delays=[], prefix="second/", verbose=False),
    ]
    with pytest.raises(ValueError, match="one online section"):
        trainer(tmp_path, callbacks).fit(Learner(make_net()), loader(x, y, B))

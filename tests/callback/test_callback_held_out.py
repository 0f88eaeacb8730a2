"""Held-out sets (``held_out_dataloaders``): scored with every scorer at the baseline and after
every stage, against a plain-torch loop over the same weights; never part of R; the
``held_out`` section of results.json (round trip, refusals naming the field), the log keys,
the run record's state round trip and the argument checks."""

from __future__ import annotations

import copy
import csv
import json

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
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.results import ContinualResults, InvalidResultsError

SETS = ("general", "tiny")


def held_out_data():
    """Two sets never trained: 23 samples of a fourth domain, and a 1-sample set."""
    (_, general), (_, tiny) = make_tasks(2, seed=7, test_sizes=(23, 1))
    return {"general": general, "tiny": tiny}


def plain_scores(weights: dict, data) -> dict[str, list[float]]:
    """Accuracy and mean cross-entropy of each set, whole sets at once."""
    net = make_net()
    net.load_state_dict({k.removeprefix("net."): v for k, v in weights.items()})
    net.eval()
    out: dict[str, list[float]] = {"acc": [], "loss": []}
    with torch.no_grad():
        for name in SETS:
            x, y = data[name]
            logits = net(x)
            out["acc"].append(int((logits.argmax(1) == y).sum()) / len(y))
            losses = nn.functional.cross_entropy(logits, y, reduction="none").double()
            out["loss"].append(float(losses.sum()) / len(y))
    return out


def _fit(root, held_out):
    tasks = make_tasks()
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        held_out_dataloaders=held_out,
        dirpath=root / "out",
        verbose=False,
    )
    snapshots = Snapshots()
    logger = CSVLogger(root, name="csv")
    trainer = pl.Trainer(
        callbacks=[snapshots, cb], **trainer_kwargs(root, max_epochs=1, logger=logger)
    )
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    return cb, snapshots, logger


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("held_out")
    data = held_out_data()
    loaders = {
        name: DataLoader(TensorDataset(*data[name]), batch_size=5) for name in SETS
    }  # 23 = 4 full batches + 3
    cb, snapshots, logger = _fit(root, loaders)
    return cb, snapshots, logger, data, root


def test_held_out_scores_equal_a_plain_loop_at_the_baseline_and_every_stage(run):
    cb, snapshots, _, data, _ = run
    held_out = cb.continual_results().held_out
    assert held_out is not None and held_out.names == SETS
    expected = [plain_scores(w, data) for w in snapshots.weights]
    assert len(expected) == 4  # baseline + 3 stages
    for name in ("acc", "loss"):
        want = torch.tensor([e[name] for e in expected], dtype=torch.float64)
        got = torch.cat([held_out.baseline[name][None], held_out.scores[name]])
        if name == "acc":  # counts: exact
            assert torch.equal(got, want)
        else:  # float32 per-sample losses summed in another order
            assert torch.allclose(got, want, rtol=1e-6, atol=0)
    acc = held_out.scores["acc"]
    assert torch.equal(held_out.delta("acc"), acc - held_out.baseline["acc"])
    worst = (held_out.baseline["acc"] - acc).amax(0)
    assert torch.equal(held_out.worst_drop("acc"), worst)
    loss = held_out.scores["loss"]  # lower is better: a drop is a rise
    assert torch.equal(held_out.worst_drop("loss"), (loss - held_out.baseline["loss"]).amax(0))


def test_held_out_sets_never_enter_R(run, tmp_path):
    cb, _, _, _, _ = run
    alone, _, _ = _fit(tmp_path, None)
    for name in ("acc", "loss"):
        assert torch.equal(cb.matrices[name], alone.matrices[name])
        assert torch.equal(
            cb.continual_results()[name].baseline, alone.continual_results()[name].baseline
        )
    assert cb.continual_results().primary.metrics == alone.continual_results().primary.metrics
    assert alone.continual_results().held_out is None


def test_the_held_out_section_round_trips_and_broken_ones_are_refused(run, tmp_path):
    cb, _, _, _, root = run
    on_disk = json.loads((root / "out" / "results.json").read_text())
    assert on_disk["held_out"]["names"] == list(SETS)
    assert on_disk["held_out"] == cb.results()["held_out"]
    loaded = ContinualResults.load(root / "out")
    assert loaded.held_out is not None
    for name in ("acc", "loss"):
        assert torch.equal(
            loaded.held_out.scores[name], cb.continual_results().held_out.scores[name]
        )
    broken = copy.deepcopy(on_disk)
    broken["held_out"]["matrices"]["loss"]["scores"][1] = [0.5]
    with pytest.raises(InvalidResultsError, match=r"held_out\.matrices\.loss\.scores\[1\]"):
        ContinualResults.from_dict(broken)
    broken = copy.deepcopy(on_disk)
    broken["held_out"]["matrices"]["acc"]["baseline"][0] = 1.5
    with pytest.raises(InvalidResultsError, match=r"held_out\.matrices\.acc\.baseline\[0\]"):
        ContinualResults.from_dict(broken)
    broken = copy.deepcopy(on_disk)
    del broken["held_out"]["matrices"]["loss"]
    with pytest.raises(InvalidResultsError, match="one entry per score matrix"):
        ContinualResults.from_dict(broken)


def test_held_out_scores_are_logged_per_stage_with_their_delta(run):
    cb, _, logger, _, _ = run
    with open(f"{logger.log_dir}/metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    key = "continual/held_out/general/acc"
    logged = [float(r[key]) for r in rows if r.get(key)]
    held_out = cb.continual_results().held_out
    expected = [float(held_out.baseline["acc"][0]), *held_out.scores["acc"][:, 0].tolist()]
    assert logged == expected
    delta = [float(r[f"{key}/delta"]) for r in rows if r.get(f"{key}/delta")]
    assert delta == held_out.delta("acc")[:, 0].tolist()


def test_the_record_state_round_trips_without_a_trainer(run):
    cb, _, _, _, _ = run
    state = cb.state_dict()
    fresh = ContinualEvalCallback(
        cb._loaders,
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        held_out_dataloaders=cb.held_out_dataloaders,
        verbose=False,
    )
    fresh.load_state_dict(state)
    assert fresh.results()["held_out"] == cb.results()["held_out"]
    other = ContinualEvalCallback(
        cb._loaders,
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        held_out_dataloaders={"general": cb.held_out_dataloaders["general"]},
        verbose=False,
    )
    with pytest.raises(ValueError, match="held-out sets"):
        other.load_state_dict(state)


def test_bad_held_out_arguments_are_refused_at_construction():
    loaders = eval_loaders(make_tasks())
    with pytest.raises(TypeError, match="held_out_dataloaders must be a mapping"):
        ContinualEvalCallback(loaders, held_out_dataloaders=[loaders[0]])
    with pytest.raises(ValueError, match="is not a name"):
        ContinualEvalCallback(loaders, held_out_dataloaders={"": loaders[0]})
    with pytest.raises(TypeError, match=r"held_out_dataloaders \('g', 'once'.*1 is a .*iterator"):
        ContinualEvalCallback(
            loaders, held_out_dataloaders={"g": loaders[0], "once": iter(loaders[1])}
        )
    with pytest.raises(ValueError, match="cannot be combined with task_classes"):
        ContinualEvalCallback(
            loaders, held_out_dataloaders={"g": loaders[0]}, task_classes=[[0], [1], [2]]
        )


@pytest.mark.parametrize(
    ("value", "problem"),
    [(float("nan"), "must be finite"), (float("inf"), "must be finite"), (1.5, "outside")],
)
def test_a_bad_held_out_cell_is_refused_naming_the_matrix_and_the_sets(value, problem):
    from continual_eval._held_out_record import HeldOutRecord
    from continual_eval.record import MatrixSpec, Scored

    record = HeldOutRecord(SETS, {"acc": MatrixSpec("accuracy")})
    row = torch.tensor([0.5, value], dtype=torch.float64)
    scored = Scored({}, held_out={"acc": row})
    with pytest.raises(
        ValueError, match=rf"stage 2 \(held-out sets .*tiny.*\): acc held-out\[1\].*{problem}"
    ):
        record.check_stage(2, scored)
    with pytest.raises(ValueError, match="the baseline"):
        record.record_baseline(scored)
    assert record.baseline == {}  # nothing recorded
    with pytest.raises(ValueError, match="has no acc scores"):
        record.check_stage(0, Scored({}, held_out={"acc": row[:1]}))

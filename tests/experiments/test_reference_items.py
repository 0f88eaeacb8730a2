"""The paired interval of intransigence (``item_records=`` with ``reference=``): the reference
runs of ``train_reference`` record their per-item values when ``callback_kwargs`` holds
``item_records`` (equal to a plain-torch loop over plain-trained weights, per kind), and the
continual run's ``intervals`` section gains intransigence, equal to the functional
``paired_bootstrap`` of the plain loops' items of the run and of the reference (from the object
and from the reference's results directory, through its stage journal); a reference of scores
only states why it has no interval; a reference of other test-set sizes is refused naming the
task; the reference items survive a checkpoint and a journal replay."""

from __future__ import annotations

import dataclasses
import json

import lightning.pytorch as pl
import pytest
import torch
from test_references import (
    EPOCHS,
    SEED,
    TEST,
    TRAIN,
    Tiny,
    eval_loaders,
    new_trainer,
    plain_training,
    reference,
    train_loaders,
)
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks, train_reference
from continual_eval.functional import PackedBits, paired_bootstrap, unpack_bits

T = len(TRAIN)
RESAMPLES = 400
ITEMS = {"resamples": RESAMPLES, "seed": 5}


def right(net: nn.Module, j: int) -> torch.Tensor:
    """Plain loop: each test item of task j correct or not, dataset order."""
    x, y = TEST[j].tensors
    with torch.no_grad():
        return net(x).argmax(dim=1) == y


def linear(weights: dict) -> nn.Linear:
    net = nn.Linear(4, 2)
    net.load_state_dict({k.removeprefix("net."): v for k, v in weights.items()})
    return net


def plain_reference_items(initial: dict, kind: str) -> list[torch.Tensor]:
    """The reference's items by plain-torch training (the budgets of `train_reference`)."""
    if kind == "joint":
        net, _ = plain_training(initial, ConcatDataset(TRAIN), EPOCHS, seed=SEED)
        return [right(net, j) for j in range(T)]
    out = []
    for j in range(T):
        data = TRAIN[j] if kind == "isolated" else ConcatDataset(TRAIN[: j + 1])
        net, _ = plain_training(initial, data, EPOCHS, seed=SEED + j)
        out.append(right(net, j))
    return out


class Snapshots(pl.Callback):
    """The weights at the baseline and after every stage."""

    def __init__(self) -> None:
        self.weights: list[dict] = []

    def on_fit_start(self, trainer, pl_module):
        if not self.weights:
            self.weights.append({k: v.clone() for k, v in pl_module.state_dict().items()})

    def on_train_end(self, trainer, pl_module):
        self.weights.append({k: v.clone() for k, v in pl_module.state_dict().items()})


@pytest.fixture(scope="module")
def initial() -> tuple[Tiny, dict]:
    torch.manual_seed(0)
    model = Tiny()
    return model, {k: v.clone() for k, v in model.net.state_dict().items()}


@pytest.fixture(scope="module")
def trained(initial, tmp_path_factory) -> dict:
    model, _ = initial
    root = tmp_path_factory.mktemp("refs")
    kw = {"callback_kwargs": {"item_records": ITEMS}}
    return {
        kind: (reference(model, kind, root / kind, **kw), root / kind)
        for kind in ("isolated", "joint", "cumulative")
    }


def continual_run(model: Tiny, ref, root, **kwargs):
    cb = ContinualEvalCallback(
        eval_loaders(), dirpath=root, verbose=False, reference=ref, item_records=ITEMS, **kwargs
    )
    snapshots = Snapshots()

    def factory(task):
        return pl.Trainer(
            max_epochs=EPOCHS,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[snapshots, cb],
        )

    fit_tasks(factory, model, train_loaders(), seed=SEED, checkpoint_dir=root / "ckpt")
    return cb, snapshots


@pytest.mark.parametrize("kind", ["isolated", "joint", "cumulative"])
def test_reference_items_equal_a_plain_loop(initial, trained, kind) -> None:
    _, weights = initial
    ref, _ = trained[kind]
    expected = plain_reference_items(weights, kind)
    assert ref.items is not None and len(ref.items) == T
    for j, packed in enumerate(ref.items):
        assert isinstance(packed, PackedBits) and packed.num_items == len(TEST[j])
        assert torch.equal(unpack_bits(packed), expected[j]), (kind, j)
        # the reference score is the mean of its items
        assert expected[j].double().mean().item() == ref.scores[j].item()


def test_no_items_without_item_records(initial) -> None:
    model, _ = initial
    assert reference(model, "joint").items is None


@pytest.fixture(scope="module")
def runs(initial, trained, tmp_path_factory) -> dict:
    """One continual run per form of the isolated reference (the object, its directory)."""
    model, _ = initial
    root = tmp_path_factory.mktemp("continual")
    ref, directory = trained["isolated"]
    out = {}
    for name, given in (("object", ref), ("directory", directory)):
        torch.manual_seed(0)
        fresh = Tiny()
        fresh.load_state_dict(model.state_dict())
        out[name] = (*continual_run(fresh, given, root / name), root / name)
    return out


@pytest.mark.parametrize("form", ["object", "directory"])
def test_intransigence_interval_equals_the_functional_layer(initial, runs, form) -> None:
    _, weights = initial
    cb, snapshots, root = runs[form]
    rows = [[right(linear(w), j) for j in range(T)] for w in snapshots.weights]
    items = [torch.stack([rows[i + 1][j] for i in range(T)]) for j in range(T)]
    ref_items = plain_reference_items(weights, "isolated")
    expected = paired_bootstrap(
        items, baseline=rows[0], reference=ref_items, resamples=RESAMPLES, seed=5
    )
    document = json.loads((root / "results.json").read_text())
    section = document["intervals"]["matrices"][cb.primary]
    got = section["metrics"]["intransigence"]
    want = expected.metrics["intransigence"]
    assert [got["estimate"], got["low"], got["high"]] == [
        float(want.estimate),
        float(want.low),
        float(want.high),
    ]
    assert section["unavailable"] == {}
    # FWT against isolated training, the same resamples: the functional layer's, estimate the
    # reference section's fwt_isolated (the report's FWT (isolated) column)
    fwt = section["metrics"]["fwt_isolated"]
    want_fwt = expected.metrics["fwt_isolated"]
    assert [fwt["low"], fwt["high"]] == [float(want_fwt.low), float(want_fwt.high)]
    assert fwt["estimate"] == pytest.approx(document["reference"]["fwt_isolated"], abs=1e-12)
    # the estimate is the reference section's intransigence; the interval is a real one
    assert got["estimate"] == pytest.approx(document["reference"]["intransigence"], abs=1e-12)
    assert got["low"] < got["estimate"] < got["high"]
    # the report's table of the run's intervals has its row
    from continual_eval._items_report import items_run_lines

    lines = items_run_lines(cb.continual_results(), "run", "run", root, str)
    assert any(
        line.startswith("| intransigence | ") and "no interval" not in line for line in lines
    )
    # the loggers' scalars of the last stage carry its ends beside the value
    from continual_eval.loggers import stage_scalars

    scalars = stage_scalars(cb.continual_results(), T - 1)
    assert scalars["continual/intransigence/lo"] == got["low"]
    assert scalars["continual/intransigence/hi"] == got["high"]
    assert "continual/intransigence/lo" not in stage_scalars(cb.continual_results(), T - 2)
    # the other metrics are unchanged by the reference
    for key in ("acc", "bwt", "fwt", "forgetting"):
        assert section["metrics"][key]["low"] == float(expected.metrics[key].low), key


def test_a_reference_of_scores_only_states_why_it_has_no_interval(initial, trained, tmp_path):
    model, _ = initial
    ref, _ = trained["isolated"]
    fresh = Tiny()
    fresh.load_state_dict(model.state_dict())
    cb, _ = continual_run(fresh, ref.scores, tmp_path)
    section = json.loads((tmp_path / "results.json").read_text())["intervals"]
    primary = section["matrices"][cb.primary]
    assert "intransigence" not in primary["metrics"] and "acc" in primary["metrics"]
    reason = primary["unavailable"]["intransigence"]
    assert "holds scores only" in reason and "tensor" in reason
    assert cb.continual_results().intervals.matrices[cb.primary].unavailable == {
        "intransigence": reason
    }
    # the report's table of the run's intervals says so
    from continual_eval._items_report import items_run_lines

    lines = items_run_lines(cb.continual_results(), "run", "run", tmp_path, str)
    assert any(line.startswith("| intransigence | no interval: the reference") for line in lines)


def test_a_reference_of_other_test_items_is_refused_naming_the_task(initial, tmp_path):
    """A reference scored on other test sets (task 1's without its last 3 items): refused at
    the baseline, before anything is trained, naming the task and both sizes."""
    model, _ = initial
    loaders = eval_loaders()
    x, y = TEST[1].tensors
    loaders[1] = DataLoader(TensorDataset(x[:-3], y[:-3]), batch_size=128)
    ref = train_reference(
        model,
        train_loaders(),
        loaders,
        kind="joint",
        trainer_factory=new_trainer,
        seed=SEED,
        callback_kwargs={"item_records": ITEMS},
    )
    assert ref.items is not None and ref.items[1].num_items == len(TEST[1]) - 3
    fresh = Tiny()
    with pytest.raises(ValueError, match=r"397 items of task 1 .*test set has 400"):
        continual_run(fresh, ref, tmp_path)
    assert not (tmp_path / "ckpt").exists()  # nothing trained


def test_reference_items_survive_a_checkpoint_and_the_journal(initial, runs, tmp_path) -> None:
    from continual_eval._stage_journal import replay
    from continual_eval.results import ContinualResults
    from continual_eval.results.files import JOURNAL_FILE

    cb, _, root = runs["object"]
    live = cb.record.sections["items"]
    expected = cb.results()["intervals"]
    assert "intransigence" in expected["matrices"][cb.primary]["metrics"]
    # the checkpoint: a new callback without a reference restores the items from the state
    state = torch.load(root / "ckpt" / f"task_{T - 1}.ckpt", weights_only=True)
    held = state["callbacks"][cb.state_key]["record"]["sections"]["items"]["reference"]
    assert held["num_items"] == [len(ds) for ds in TEST]
    other = ContinualEvalCallback(eval_loaders(), verbose=False, item_records=ITEMS)
    other.load_state_dict(state["callbacks"][cb.state_key])
    restored = other.record.sections["items"]
    for j in range(T):
        assert torch.equal(unpack_bits(restored.reference[j]), unpack_bits(live.reference[j]))
    assert (
        other.results()["intervals"]["matrices"][cb.primary]["metrics"]["intransigence"]
        == (expected["matrices"][cb.primary]["metrics"]["intransigence"])
    )
    # another reference's items than the checkpoint's: refused, naming the task
    ref = runs["object"][0].record.sections["items"].reference
    flipped = [unpack_bits(ref[j]) for j in range(T)]
    flipped[2] = ~flipped[2]
    means = torch.stack([f.double().mean() for f in flipped])
    given = dataclasses.replace(_any_reference(), items=tuple(flipped), scores=means)
    third = ContinualEvalCallback(
        eval_loaders(), verbose=False, item_records=ITEMS, reference=given
    )
    with pytest.raises(ValueError, match="items of task 2 differ"):
        third.load_state_dict(state["callbacks"][cb.state_key])
    # the journal's header carries them: its replay gives the same intervals
    replayed = replay(root / JOURNAL_FILE)
    assert replayed.continual_results().to_dict()["intervals"] == expected
    assert ContinualResults.load(root).to_dict()["intervals"] == expected


def _any_reference():
    from continual_eval import Reference

    return Reference(
        kind="isolated",
        scores=torch.zeros(T, dtype=torch.float64),
        baseline=torch.zeros(T, dtype=torch.float64),
        epochs=EPOCHS,
        steps_trained=(0,) * T,
        score_name="accuracy",
        higher_is_better=True,
        task_names=tuple(f"task_{j}" for j in range(T)),
    )


def test_items_and_scores_of_different_runs_are_refused(trained) -> None:
    isolated, _ = trained["isolated"]
    joint, _ = trained["joint"]
    mixed = dataclasses.replace(isolated, items=joint.items)
    with pytest.raises(ValueError, match=r"items of task \d have mean .* its score is"):
        ContinualEvalCallback(eval_loaders(), item_records=ITEMS, reference=mixed)
    # without item_records the items are not read (nor checked): the scores alone are used
    assert ContinualEvalCallback(eval_loaders(), reference=mixed).reference is not None


def test_per_sample_losses_of_the_reference(initial, tmp_path) -> None:
    """A floating primary matrix (per-sample cross-entropy, lower is better): the reference's
    losses are float64 items, and intransigence's interval is the functional layer's of the plain
    loops' losses (to float32 rounding of the scorer's per-item losses)."""
    model, weights = initial
    scorers = {"loss": "cross_entropy"}
    kw = {"callback_kwargs": {"scorers": scorers, "item_records": ITEMS}}
    ref = reference(model, "joint", **kw)
    net, _ = plain_training(weights, ConcatDataset(TRAIN), EPOCHS, seed=SEED)

    def losses(net: nn.Module) -> list[torch.Tensor]:
        with torch.no_grad():
            return [
                nn.functional.cross_entropy(
                    net(ds.tensors[0]), ds.tensors[1], reduction="none"
                ).double()
                for ds in TEST
            ]

    assert ref.items is not None
    for j, values in enumerate(losses(net)):
        assert ref.items[j].dtype == torch.float64
        torch.testing.assert_close(ref.items[j], values, rtol=0, atol=1e-5)
    fresh = Tiny()
    fresh.load_state_dict(model.state_dict())
    cb, snapshots = continual_run(fresh, ref, tmp_path, scorers=scorers)
    rows = [losses(linear(w)) for w in snapshots.weights]
    items = [torch.stack([rows[i + 1][j] for i in range(T)]) for j in range(T)]
    expected = paired_bootstrap(
        items,
        baseline=rows[0],
        reference=losses(net),
        higher_is_better=False,
        resamples=RESAMPLES,
        seed=5,
    ).metrics["intransigence"]
    got = cb.continual_results().intervals.matrices["loss"].metrics["intransigence"]
    torch.testing.assert_close(
        torch.tensor(got, dtype=torch.float64),
        torch.stack([expected.estimate, expected.low, expected.high]).double(),
        rtol=0,
        atol=1e-5,
    )
    # the journal's header carries the float64 items: its replay gives the same interval
    from continual_eval._stage_journal import replay
    from continual_eval.results.files import JOURNAL_FILE

    replayed = replay(tmp_path / JOURNAL_FILE).continual_results().intervals
    assert replayed is not None and replayed.matrices["loss"].metrics["intransigence"] == got
    # the bytes held count the reference's items (64 bits each) beside the run's evaluations
    record = cb.record.sections["items"]
    n = sum(len(ds) for ds in TEST)
    assert record.memory_bytes == (T + 1) * 8 * n + 8 * n


def test_the_unavailable_field_is_checked_on_load(initial, runs, tmp_path) -> None:
    from continual_eval.results import ContinualResults, InvalidResultsError

    cb, _, root = runs["object"]
    document = json.loads((root / "results.json").read_text())
    name = cb.primary
    # absent in files written before the field: read as empty
    del document["intervals"]["matrices"][name]["unavailable"]
    (tmp_path / "results.json").write_text(json.dumps(document))
    loaded = ContinualResults.load(tmp_path)
    assert loaded.intervals is not None and loaded.intervals.matrices[name].unavailable == {}
    # a metric with an interval and a reason it has none: refused, naming the field
    document["intervals"]["matrices"][name]["unavailable"] = {"intransigence": "no items"}
    (tmp_path / "results.json").write_text(json.dumps(document))
    with pytest.raises(InvalidResultsError, match=rf"intervals\.matrices\.{name}\.unavailable"):
        ContinualResults.load(tmp_path)


def test_the_fit_command_gives_intransigence_its_interval(tmp_path, capfd, caplog, monkeypatch):
    """``continual-eval fit`` passes the continual callback's options (``item_records``
    included) to the reference runs, so intransigence gets its paired interval; the written
    reference directory gives the same items back."""
    from test_references import _fit

    from continual_eval._arguments import path_reference_items

    monkeypatch.chdir(tmp_path)
    code, text = _fit(capfd, caplog, "--stream.reference=isolated", "--continual.item_records=true")
    assert code == 0, text
    run = tmp_path / "runs" / "logistic" / "version_0"
    results = json.loads((run / "results.json").read_text())
    primary = next(iter(results["matrices"]))
    got = results["intervals"]["matrices"][primary]["metrics"]["intransigence"]
    assert got["estimate"] == pytest.approx(results["reference"]["intransigence"], abs=1e-12)
    assert got["low"] <= got["estimate"] <= got["high"]
    items = path_reference_items(run / "isolated_reference")
    assert items is not None
    ref = results["reference"]["scores"]
    assert [v.double().mean().item() for v in items] == pytest.approx(ref, abs=1e-12)


def test_holding_the_reference_fixed_would_undercover_by_simulation() -> None:
    """Why a reference of scores only gets no interval: 1000 simulated runs (seeded) of 3 tasks x
    256 items, the run's items correlated across its cells, the reference's drawn on their own
    (another model). The paired interval of intransigence (the reference's items resampled with
    the run's) covers the truth in about 95 % of runs; the interval holding ``ref[j]`` fixed
    (``mean_j ref[j]`` minus the learning accuracy's interval) leaves out the reference's own
    test-set error and covers 90 % here (paired: 95 %; Monte Carlo standard error 0.7 points)."""
    from statistics import NormalDist

    import numpy as np

    from continual_eval import functional as F

    true_r = [[0.80, 0.30, 0.20], [0.88, 0.80, 0.35], [0.70, 0.86, 0.86]]
    true_ref = [0.95, 0.93, 0.92]
    runs, n, rho = 1000, 256, 0.6
    rng = np.random.default_rng(11)
    thresholds = torch.tensor(
        [[NormalDist().inv_cdf(true_r[i][j]) for i in range(3)] for j in range(3)]
    ).double()
    shared = rng.standard_normal((runs, 3, 1, n))
    latent = np.sqrt(rho) * shared + np.sqrt(1 - rho) * rng.standard_normal((runs, 3, 3, n))
    right = torch.from_numpy(latent) < thresholds[None, :, :, None]
    items = [right[:, j] for j in range(3)]
    ref = [torch.from_numpy(rng.random((runs, n)) < p) for p in true_ref]
    truth = F.intransigence(torch.tensor(true_r).double(), torch.tensor(true_ref).double())
    res = paired_bootstrap(items, reference=ref, resamples=500, seed=0)
    paired = res.metrics["intransigence"]
    paired_cover = ((paired.low <= truth) & (truth <= paired.high)).double().mean().item()
    learning = res.metrics["learning_accuracy"]
    mean_ref = torch.stack([r.double().mean(dim=-1) for r in ref], dim=-1).mean(dim=-1)
    low, high = mean_ref - learning.high, mean_ref - learning.low
    fixed_cover = ((low <= truth) & (truth <= high)).double().mean().item()
    assert 0.93 <= paired_cover <= 0.97, paired_cover
    assert fixed_cover < 0.92 and fixed_cover < paired_cover - 0.03, (fixed_cover, paired_cover)

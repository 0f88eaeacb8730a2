"""Reference models (continual_eval.references.train_reference) against hand-written plain-torch
training, the ``stream.reference`` option of ``continual-eval fit``, and the README's identity
between forward transfer against isolated training and intransigence.

Why exact equality holds: a reference copy starts from the continual model's initial weights, and
Lightning's automatic optimisation of ``training_step`` performs the same float operations as the
plain loop (forward, ``cross_entropy``, ``backward``, ``SGD.step`` with momentum, gradients reset
to ``None`` in between), on the CPU, in the same batch order (the same seed drawn from the global
torch generator by the same ``RandomSampler``; the callback's evaluations restore the random
state). The weights are therefore bitwise equal, so are the predictions, and an accuracy is
``correct / total`` of two integers, a correctly rounded float64 in both computations.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import ConcatDataset, DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback
from continual_eval.cli import main as continual_eval
from continual_eval.functional import (
    forward_transfer,
    forward_transfer_per_task,
    intransigence,
    intransigence_per_task,
)
from continual_eval.references import Reference, train_reference, union_dataloader

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "logistic.yaml"
T, EPOCHS, BATCH, LR, MOMENTUM, SEED = 3, 2, 16, 0.05, 0.9, 7


def blobs(task: int, n: int, seed: int) -> TensorDataset:
    """Two noisy classes along a task-specific direction in 4-D (overlapping: accuracy < 1)."""
    g = torch.Generator().manual_seed(seed)
    direction = torch.nn.functional.normalize(
        torch.randn(4, generator=torch.Generator().manual_seed(100 + task)), dim=0
    )
    y = torch.randint(0, 2, (n,), generator=g)
    x = torch.randn(n, 4, generator=g) + (2 * y[:, None] - 1).float() * 0.6 * direction
    return TensorDataset(x, y)


TRAIN = [blobs(t, 48, seed=t) for t in range(T)]
TEST = [blobs(t, 400, seed=50 + t) for t in range(T)]


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=MOMENTUM)


def train_loaders() -> list[DataLoader]:
    return [DataLoader(ds, batch_size=BATCH, shuffle=True) for ds in TRAIN]


def eval_loaders() -> list[DataLoader]:
    return [DataLoader(ds, batch_size=128) for ds in TEST]


def new_trainer(epochs: int = EPOCHS) -> pl.Trainer:
    return pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def accuracy(net: nn.Module, dataset: TensorDataset) -> float:
    x, y = dataset.tensors
    with torch.no_grad():
        correct = int((net(x).argmax(dim=1) == y).sum())
    return correct / len(y)


def plain_training(
    initial: dict[str, Tensor], dataset, epochs: int, seed: int, watch: int | None = None
) -> tuple[nn.Linear, dict[int, float]]:
    """Plain torch: the same initial weights, a new SGD with momentum, ``epochs`` shuffled passes
    of batches of 16 after ``torch.manual_seed(seed)``. With ``watch=j``: the accuracy on task j
    after every step (``{step: accuracy}``)."""
    net = nn.Linear(4, 2)
    net.load_state_dict(initial)
    optimizer = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    torch.manual_seed(seed)
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True)
    curve, step = {}, 0
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(net(x), y).backward()
            optimizer.step()
            step += 1
            if watch is not None:
                curve[step] = accuracy(net, TEST[watch])
    return net, curve


@pytest.fixture(scope="module")
def model_and_initial() -> tuple[Tiny, dict[str, Tensor]]:
    torch.manual_seed(0)
    model = Tiny()
    initial = {k: v.clone() for k, v in model.net.state_dict().items()}
    return model, initial


def reference(model: Tiny, kind: str, tmp: Path | None = None, **kwargs) -> Reference:
    return train_reference(
        model,
        train_loaders(),
        eval_loaders(),
        kind=kind,
        trainer_factory=new_trainer,
        seed=SEED,
        dirpath=tmp,
        **kwargs,
    )


def test_isolated_reference_equals_plain_training(model_and_initial, tmp_path) -> None:
    model, initial = model_and_initial
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    ref = reference(model, "isolated", tmp_path, eval_every_n_steps=2)
    after_reference = torch.rand(3)
    torch.set_rng_state(state)
    assert torch.equal(after_reference, torch.rand(3))  # the caller's random state is restored
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # not trained

    expected, curves = [], []
    for j in range(T):
        net, curve = plain_training(initial, TRAIN[j], EPOCHS, seed=SEED + j, watch=j)
        expected.append(accuracy(net, TEST[j]))
        curves.append(curve)
    assert ref.kind == "isolated" and ref.scores.dtype == torch.float64
    assert ref.scores.shape == (T,) and ref.scores.tolist() == expected
    untrained = nn.Linear(4, 2)
    untrained.load_state_dict(initial)
    assert ref.baseline.tolist() == [accuracy(untrained, TEST[j]) for j in range(T)]
    assert ref.epochs == EPOCHS and ref.steps_trained == (6, 6, 6)  # 48 / 16 = 3 steps per epoch
    # the budget matters here: one more epoch, or no shuffling seed, changes the accuracies
    longer = [plain_training(initial, TRAIN[j], EPOCHS + 1, SEED + j)[0] for j in range(T)]
    assert [accuracy(net, TEST[j]) for j, net in enumerate(longer)] != expected

    # the per-step curves: copy j on task j every 2 steps (step counted from its own start)
    assert ref.curves is not None and len(ref.curves) == T
    for j, curve in enumerate(ref.curves):
        assert curve.step.tolist() == [2, 4, 6] and curve.step.dtype == torch.int64
        assert curve.scores.tolist() == [curves[j][s] for s in (2, 4, 6)]
        assert curve.scores[-1] == ref.scores[j]
    # every copy wrote its own run
    assert [p.name for p in ref.results_dirs] == ["task_0", "task_1", "task_2"]
    written = json.loads((tmp_path / "task_1" / "results.json").read_text())
    assert written["task_names"] == ["task_1"] and written["scores"] == [[expected[1]]]
    assert written["metadata"] == {"reference_run": "isolated", "tasks": ["task_1"]}


def test_joint_reference_equals_plain_training(model_and_initial) -> None:
    model, initial = model_and_initial
    ref = reference(model, "joint")
    union = ConcatDataset(TRAIN)
    net, _ = plain_training(initial, union, EPOCHS, seed=SEED)
    expected = [accuracy(net, TEST[j]) for j in range(T)]
    assert ref.kind == "joint" and ref.scores.tolist() == expected
    # the budget: EPOCHS epochs over the union (3 tasks x 3 batches x 2 epochs = 18 steps), not
    # T x EPOCHS epochs; the two differ on this problem
    assert ref.epochs == EPOCHS and ref.steps_trained == (18,)
    longer, _ = plain_training(initial, union, T * EPOCHS, seed=SEED)
    assert [accuracy(longer, TEST[j]) for j in range(T)] != expected
    assert ref.curves is None and ref.results_dirs == ()  # no dirpath: a temporary directory
    assert ref.to_list() == expected


def test_cumulative_reference_equals_plain_training(model_and_initial, tmp_path) -> None:
    """Copy k: the same initial weights, trained on the union of tasks 0..k for EPOCHS epochs
    over that union (after seed + k), scored on task k; copy 0 is the isolated copy 0 and, with
    the same seed, copy T-1 the joint copy (the same data, epochs and shuffling)."""
    model, initial = model_and_initial
    ref = reference(model, "cumulative", tmp_path)
    expected = []
    for k in range(T):
        net, _ = plain_training(initial, ConcatDataset(TRAIN[: k + 1]), EPOCHS, seed=SEED + k)
        expected.append(accuracy(net, TEST[k]))
    assert ref.kind == "cumulative" and ref.scores.tolist() == expected
    assert ref.epochs == EPOCHS and ref.steps_trained == (6, 12, 18)  # 3 batches per task-epoch
    untrained = nn.Linear(4, 2)
    untrained.load_state_dict(initial)
    assert ref.baseline.tolist() == [accuracy(untrained, TEST[k]) for k in range(T)]
    assert ref.scores[0] == reference(model, "isolated").scores[0]
    joint = train_reference(
        model,
        train_loaders(),
        eval_loaders(),
        kind="joint",
        trainer_factory=new_trainer,
        seed=SEED + T - 1,
    )
    assert ref.scores[-1] == joint.scores[-1]
    # the budget: not the joint reference's union for every copy (copy 1 on all tasks differs)
    on_all, _ = plain_training(initial, ConcatDataset(TRAIN), EPOCHS, seed=SEED + 1)
    assert accuracy(on_all, TEST[1]) != expected[1]
    written = json.loads((tmp_path / "task_2" / "results.json").read_text())
    assert written["metadata"] == {"reference_run": "cumulative", "tasks": ["task_2"]}
    assert written["scores"] == [[expected[2]]]
    # given to a callback (the object, or the directory the copies wrote): intransigence
    # against it, no FWT against isolated training
    from continual_eval.results.reference import resolve_reference

    for given in (ref, tmp_path):
        resolved = resolve_reference(given, ContinualEvalCallback(eval_loaders()).scorer)
        assert resolved is not None and resolved.kind == "cumulative"
        assert resolved.scores.tolist() == expected


def test_cumulative_reference_takes_its_loaders(model_and_initial) -> None:
    """``joint_dataloader`` for the cumulative kind: T loaders, loader k over tasks 0..k."""
    model, _ = model_and_initial
    unions = [
        DataLoader(ConcatDataset(TRAIN[: k + 1]), batch_size=BATCH, shuffle=True) for k in range(T)
    ]
    ref = reference(model, "cumulative", joint_dataloader=unions)
    assert ref.scores.tolist() == reference(model, "cumulative").scores.tolist()
    with pytest.raises(ValueError, match="joint_dataloader has 2 loaders for 3 tasks"):
        reference(model, "cumulative", joint_dataloader=unions[:2])
    with pytest.raises(ValueError, match="must be a sequence of T loaders"):
        reference(model, "cumulative", joint_dataloader=unions[0])
    with pytest.raises(ValueError, match="per-step reference curves are defined for kind='isol"):
        reference(model, "cumulative", eval_every_n_steps=2)


def test_union_dataloader_copies_the_first_loader() -> None:
    union = union_dataloader(train_loaders())
    assert isinstance(union.dataset, ConcatDataset) and len(union.dataset) == 3 * 48
    assert union.batch_size == BATCH and isinstance(union.sampler, torch.utils.data.RandomSampler)
    mixed = [DataLoader(TRAIN[0], batch_size=16), DataLoader(TRAIN[1], batch_size=8)]
    with pytest.raises(
        ValueError, match=r"train_dataloaders\[1\] has batch size 8.*joint_dataloader="
    ):
        union_dataloader(mixed)


def test_reference_uses_the_models_reference_copy(model_and_initial) -> None:
    """``reference_model()`` supplies the copy (DigitsMLP drops its replay memory there)."""
    model, _ = model_and_initial
    made = []

    class WithHook(Tiny):
        def reference_model(self) -> Tiny:
            made.append(1)
            plain = Tiny()
            plain.load_state_dict(self.state_dict())
            return plain

    hooked = WithHook()
    hooked.load_state_dict(model.state_dict())
    ref = reference(hooked, "isolated")
    assert len(made) == T
    assert ref.scores.tolist() == reference(model, "isolated").scores.tolist()


def test_model_factory_copies_start_from_the_models_weights(model_and_initial) -> None:
    """``model_factory()`` builds each copy (its own random initialisation), and the model's
    state dict overwrites it: the reference equals the deep-copied one bitwise."""
    model, _ = model_and_initial
    made = []

    class WithHook(Tiny):
        def reference_model(self) -> Tiny:
            made.append(1)
            return Tiny()

    hooked = WithHook()
    hooked.load_state_dict(model.state_dict())
    built: list[Tiny] = []

    def factory() -> Tiny:
        built.append(Tiny())
        return built[-1]

    ref = reference(hooked, "isolated", model_factory=factory)
    assert len(built) == T and not made  # reference_model() is not called with a factory
    plain = reference(model, "isolated")
    assert torch.equal(ref.scores, plain.scores) and torch.equal(ref.baseline, plain.baseline)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in hooked.state_dict().items())


def test_model_factory_and_sharded_models_refused(model_and_initial) -> None:
    model, _ = model_and_initial
    with pytest.raises(ValueError, match="pass model_factory or copy_model, not both"):
        reference(model, "isolated", model_factory=Tiny, copy_model=lambda m: Tiny())

    class Wider(Tiny):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 3)

    with pytest.raises(ValueError, match=r"cannot load model's state dict: 'net.weight' is"):
        reference(model, "isolated", model_factory=Wider)
    with pytest.raises(TypeError, match="model_factory must return a LightningModule, got Lin"):
        reference(model, "isolated", model_factory=lambda: nn.Linear(4, 2))
    with pytest.raises(ValueError, match="model_factory returned the model itself"):
        reference(model, "isolated", model_factory=lambda: model)
    partitioned = Tiny()  # what DeepSpeed ZeRO-3 marks its partitioned parameters with
    partitioned.net.weight.ds_id = 0  # type: ignore[attr-defined]
    for factory in (None, Tiny):
        with pytest.raises(ValueError, match="FSDP1 flattened or DeepSpeed ZeRO-3 partitioned"):
            reference(partitioned, "isolated", model_factory=factory)


@pytest.mark.parametrize("kind", ["isolated", "joint"])
def test_the_loaders_own_generators_are_restored(model_and_initial, kind: str) -> None:
    """Loaders shuffling with their own torch.Generator: the reference fits draw from it, and
    train_reference puts it back, so the continual run after it shuffles as it would without."""
    model, _ = model_and_initial
    shared = torch.Generator().manual_seed(5)  # one generator for every task's loader
    sampler_generator = torch.Generator().manual_seed(6)  # a sampler's own (isolated copy 1)
    loaders = [DataLoader(ds, batch_size=BATCH, shuffle=True, generator=shared) for ds in TRAIN]
    sampler = torch.utils.data.RandomSampler(TRAIN[1], generator=sampler_generator)
    loaders[1] = DataLoader(TRAIN[1], batch_size=BATCH, sampler=sampler)
    before = [shared.get_state(), sampler_generator.get_state()]
    train_reference(model, loaders, eval_loaders(), kind=kind, trainer_factory=new_trainer)
    assert torch.equal(shared.get_state(), before[0])
    assert torch.equal(sampler_generator.get_state(), before[1])


def test_bad_arguments_are_refused(model_and_initial) -> None:
    model, _ = model_and_initial
    with pytest.raises(ValueError, match=r"one of 'isolated', 'joint', 'cumulative', got 'both'"):
        reference(model, "both")
    with pytest.raises(ValueError, match="per-step reference curves are defined for kind='isol"):
        reference(model, "joint", eval_every_n_steps=2)
    with pytest.raises(ValueError, match="3 train_dataloaders but 2 test_dataloaders"):
        train_reference(
            model, train_loaders(), eval_loaders()[:2], kind="joint", trainer_factory=new_trainer
        )
    with pytest.raises(ValueError, match="no max_steps"):
        train_reference(
            model,
            train_loaders(),
            eval_loaders(),
            kind="isolated",
            trainer_factory=lambda: pl.Trainer(max_steps=3, logger=False),
        )
    shared = new_trainer()
    with pytest.raises(ValueError, match="must return a new Trainer at every call"):
        train_reference(
            model, train_loaders(), eval_loaders(), kind="isolated", trainer_factory=lambda: shared
        )
    with pytest.raises(ValueError, match="already holds a ContinualEvalCallback"):
        train_reference(
            model,
            train_loaders(),
            eval_loaders(),
            kind="joint",
            trainer_factory=lambda: pl.Trainer(
                max_epochs=1, logger=False, callbacks=[ContinualEvalCallback(eval_loaders())]
            ),
        )
    with pytest.raises(ValueError, match="epochs_per_task does not apply"):
        reference(model, "isolated", callback_kwargs={"epochs_per_task": 2})


# ----------------------------------------------------------------------------- the fit command
def _fit(capfd, caplog, *options: str) -> tuple[int, str]:
    caplog.clear()
    code = continual_eval(["fit", "--config", str(CONFIG), "--stream.report=false", *options])
    printed = capfd.readouterr()
    return code, printed.out + printed.err + caplog.text


def test_fit_writes_the_isolated_reference(tmp_path, capfd, caplog, monkeypatch) -> None:
    """Logistic stream: tasks 0 and 1 alone from w = 0 are learned perfectly in 36 steps; task 2
    alone ends with 8 test points on its decision line, so its reference is 0.9 or 1.0 depending
    on rounding (tests/experiments/test_logistic.py::test_isolated_reference). The printed
    metrics are those of the functional layer on the written R and reference."""
    caplog.set_level(logging.INFO)
    monkeypatch.chdir(tmp_path)
    code, text = _fit(capfd, caplog, "--stream.reference=isolated")
    assert code == 0, text
    run = tmp_path / "runs" / "logistic" / "version_0"
    results = json.loads((run / "results.json").read_text())
    ref = results["metadata"]["reference"]
    assert ref[:2] == [1.0, 1.0] and 0.9 <= ref[2] <= 1.0
    assert results["metadata"]["reference_kind"] == "isolated"
    R = results["scores"]
    assert R == [[1.0, 0.4, 0.2], [0.4, 1.0, 0.4], [0.2, 0.4, 1.0]]  # the stream is unchanged
    assert "isolated reference accuracy: " + "  ".join(f"{v:.4f}" for v in ref) in text
    per_int = [ref[j] - R[j][j] for j in range(3)]
    per_fwt = [R[j][j] - ref[j] for j in (1, 2)]
    assert (
        f"intransigence={sum(per_int) / 3:.4f} (isolated reference; ref[j] - R[j, j] per task: "
        + "  ".join(f"{v:.4f}" for v in per_int)
        + ")"
    ) in text
    assert (
        f"fwt_isolated={sum(per_fwt) / 2:.4f} (R[j, j] - ref[j] per task j >= 1: "
        + "  ".join(f"{v:.4f}" for v in per_fwt)
        + ")"
    ) in text
    # the callback got the reference: results.json's reference section agrees with the loops
    section = results["reference"]
    assert section["kind"] == "isolated" and section["scores"] == ref
    assert section["intransigence_per_task"] == pytest.approx(per_int, abs=1e-12)
    assert section["fwt_isolated_per_task"] == pytest.approx(per_fwt, abs=1e-12)
    # and the report shows the isolated FWT as its own column
    from continual_eval.report import write_report

    report = write_report([run], tmp_path / "report").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| method |"))
    assert "FWT (isolated)" in header
    row = next(line for line in report.splitlines() if line.startswith("| naive |"))
    cells = dict(zip(header.split("|"), row.split("|"), strict=True))
    assert cells[" FWT (isolated) "].strip() == f"{sum(per_fwt) / 2:.4f}"
    assert sorted(p.parent.name for p in (run / "isolated_reference").glob("*/results.json")) == [
        "task_0",
        "task_1",
        "task_2",
    ]


def test_fit_joint_reference(tmp_path, capfd, caplog, monkeypatch) -> None:
    """``stream.reference: joint`` trains the joint reference: the joint copy sees the three
    tasks' batches in turn (tests/experiments/test_logistic.py re-derives [0, 0.6, 0.8] in
    scalars) and intransigence is mean(ref[j] - 1)."""
    caplog.set_level(logging.INFO)
    monkeypatch.chdir(tmp_path)
    code, text = _fit(capfd, caplog, "--stream.reference=joint")
    assert code == 0, text
    results = json.loads((tmp_path / "runs/logistic/version_0/results.json").read_text())
    assert results["metadata"]["reference"] == pytest.approx([0.0, 0.6, 0.8], abs=1e-12)
    assert results["metadata"]["reference_kind"] == "joint"
    assert results["reference"]["kind"] == "joint"
    assert results["reference"]["intransigence"] == pytest.approx(-0.5333, abs=5e-5)
    assert results["reference"]["fwt_isolated"] is None
    assert "intransigence=-0.5333 (joint reference; ref[j] - R[j, j] per task: -1.0000" in text
    assert "fwt_isolated" not in text  # FWT is against isolated training only


def test_fit_cumulative_reference(tmp_path, capfd, caplog, monkeypatch) -> None:
    """``stream.reference: cumulative``: copy k on tasks 0..k. Copy 0 is the isolated copy 0
    (task 0 alone: learned perfectly, 1.0) and copy 2 the joint copy (all three tasks: 0.8 on
    task 2, test_fit_joint_reference); the copies' runs in cumulative_reference/task_k."""
    caplog.set_level(logging.INFO)
    monkeypatch.chdir(tmp_path)
    code, text = _fit(capfd, caplog, "--stream.reference=cumulative")
    assert code == 0, text
    run = tmp_path / "runs/logistic/version_0"
    results = json.loads((run / "results.json").read_text())
    ref = results["metadata"]["reference"]
    assert ref[0] == 1.0 and ref[2] == pytest.approx(0.8, abs=1e-12) and 0.0 <= ref[1] <= 1.0
    assert results["metadata"]["reference_kind"] == "cumulative"
    section = results["reference"]
    assert section["kind"] == "cumulative" and section["fwt_isolated"] is None
    R = results["scores"]
    assert section["intransigence_per_task"] == pytest.approx(
        [ref[j] - R[j][j] for j in range(3)], abs=1e-12
    )
    assert "cumulative reference: training 3 fresh copies, copy k on tasks 0..k" in text
    assert sorted(p.parent.name for p in (run / "cumulative_reference").glob("*/results.json")) == [
        "task_0",
        "task_1",
        "task_2",
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--stream.reference=both"],
            "stream.reference: 'both' is not one of none, isolated, joint",
        ),
    ],
)
def test_fit_refuses_bad_reference_options(
    tmp_path, capfd, caplog, monkeypatch, options, message
) -> None:
    monkeypatch.chdir(tmp_path)
    code, text = _fit(capfd, caplog, *options)
    assert code == 2 and "continual-eval fit: stream." in text and message in text
    assert not (tmp_path / "runs").exists()  # refused before anything ran


def test_fit_stream_refuses_a_second_reference_before_training_one(tmp_path, monkeypatch) -> None:
    """``fit_stream(reference=...)`` with a callback ``reference`` as well is refused before the
    reference (which can take as long as the stream) is trained, not after."""
    from continual_eval.experiments import stream
    from continual_eval.experiments.logistic import CircleGridTasks, LogisticClassifier

    def no_training(*args, **kwargs):
        raise AssertionError("the reference was trained before the options were checked")

    monkeypatch.setattr(stream, "stream_reference", no_training)
    with pytest.raises(ValueError, match="trains the reference itself"):
        stream.fit_stream(
            new_trainer(),
            LogisticClassifier(),
            CircleGridTasks(),
            callback_kwargs={"dirpath": tmp_path / "run", "reference": [1.0, 1.0, 1.0]},
            reference="isolated",
        )
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- README identity
@pytest.mark.parametrize("higher_is_better", [True, False])
@pytest.mark.parametrize("T", [2, 3, 7])
def test_isolated_fwt_is_minus_intransigence(T: int, higher_is_better: bool) -> None:
    """README, Metrics: against the same reference ``ref``, per task ``j >= 1``
    ``FWT_isolated[j] = R[j, j] - ref[j] = -I[j]`` (both reversed for lower-is-better), and the
    means (FWT over ``j >= 1``, intransigence over every ``j``) satisfy
    ``FWT_isolated = -(T * I - I[0]) / (T - 1)``."""
    g = torch.Generator().manual_seed(T + 10 * higher_is_better)
    for _ in range(20):
        R = torch.rand(T, T, generator=g, dtype=torch.float64)
        ref = torch.rand(T, generator=g, dtype=torch.float64)
        options = {"higher_is_better": higher_is_better}
        per_fwt = forward_transfer_per_task(R, ref, convention="isolated", **options)
        per_int = intransigence_per_task(R, ref, **options)
        assert torch.equal(per_fwt, -per_int[1:])  # exact: the same subtraction, negated
        fwt = forward_transfer(R, ref, convention="isolated", **options)
        mean_int = intransigence(R, ref, **options)
        assert float(fwt) == pytest.approx(-(T * float(mean_int) - float(per_int[0])) / (T - 1))

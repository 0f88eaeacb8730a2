"""Effective rank: the pure function, and its capture by RewardStreamCallback in a real Trainer."""

from __future__ import annotations

import math
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from continual_eval.stream import effective_rank
from continual_eval.stream.callback import RewardStreamCallback, record


def erank_by_hand(singular_values: np.ndarray) -> float:
    p = singular_values / singular_values.sum()
    return math.exp(-sum(float(q) * math.log(float(q)) for q in p if q > 0))


# --------------------------------------------------------------------------- the pure function
@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_identity_has_full_effective_rank(n):
    assert effective_rank(np.eye(n)) == pytest.approx(n, rel=1e-12)


def test_rank_one_matrix_has_effective_rank_one():
    a = np.outer([1.0, -2.0, 3.0, 0.5], [4.0, 5.0, -1.0])
    assert effective_rank(a) == pytest.approx(1.0, abs=1e-9)


def test_hand_computed_spectrum():
    # singular values 3 and 1: p = (3/4, 1/4), H = -(3/4 ln 3/4 + 1/4 ln 1/4)
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert effective_rank(np.diag([3.0, 1.0])) == pytest.approx(math.exp(h), rel=1e-12)
    assert effective_rank(np.diag([3.0, 1.0])) == pytest.approx(1.7548, abs=1e-4)
    assert effective_rank(np.zeros((3, 2))) == 0.0  # no spectrum: rank 0


@pytest.mark.parametrize("shape", [(7, 3), (3, 7), (20, 20)])
def test_random_matrix_against_numpy_svd_and_eigenvalues(shape):
    a = np.random.default_rng(1).normal(size=shape)
    s = np.linalg.svd(a, compute_uv=False)
    # independent spectrum: singular values are the square roots of the Gram matrix's eigenvalues
    gram = a @ a.T if shape[0] <= shape[1] else a.T @ a
    s_eig = np.sqrt(np.clip(np.linalg.eigvalsh(gram), 0.0, None))[::-1]
    np.testing.assert_allclose(s, s_eig, rtol=1e-9)
    got = effective_rank(a)
    assert got == pytest.approx(erank_by_hand(s), rel=1e-12)
    assert got == pytest.approx(erank_by_hand(s_eig), rel=1e-9)
    assert 1.0 <= got <= min(shape)
    assert effective_rank(5.0 * a) == pytest.approx(got, rel=1e-12)  # scale-free


def test_effective_rank_refuses_bad_matrices():
    with pytest.raises(ValueError, match=r"\[N, D\] matrix"):
        effective_rank(np.ones(3))
    with pytest.raises(ValueError, match="non-empty"):
        effective_rank(np.ones((0, 3)))
    with pytest.raises(ValueError, match="NaN or infinite"):
        effective_rank(np.array([[1.0, np.nan]]))


# --------------------------------------------------------------------------- the capture
BATCHES = 6
PROBE = torch.linspace(-1.0, 1.0, 10 * 4).reshape(10, 4)


class Net(pl.LightningModule):
    """A small regressor with dropout; the reward draws from torch's RNG and the module notes,
    at every step, whether all its submodules were in training mode and grad was enabled."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1)
        )
        self.modes: list[bool] = []
        self.rewards: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(1)
        data = torch.randn(BATCHES * 4, 4, generator=g)
        return DataLoader(list(zip(data, data.sum(1, keepdim=True), strict=True)), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.modes.append(all(m.training for m in self.modules()) and torch.is_grad_enabled())
        reward = float(torch.rand(()))  # consumes the RNG: a capture that moved it would show
        self.rewards.append(reward)
        label = "a" if self.global_step < BATCHES // 2 or self.global_step >= BATCHES else "b"
        record(self, reward=reward, regime_id=label)
        return torch.nn.functional.mse_loss(self(x), y)


class Reference(pl.Callback):
    """After the stream callback: the grads and weights it left, and the effective rank of
    ``net.2`` computed by hand (eval mode: dropout is the identity) from the current weights."""

    def __init__(self) -> None:
        self.ranks: dict[int, float] = {}
        self.grads_before: list[torch.Tensor] = []
        self.grads_same: list[bool] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads_before = [p.grad.clone() for p in pl_module.parameters()]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        grads = [p.grad for p in pl_module.parameters()]
        self.grads_same.append(
            all(torch.equal(a, b) for a, b in zip(self.grads_before, grads, strict=True))
            and all(m.training for m in pl_module.modules())
        )
        w, b = pl_module.net[0].weight.detach(), pl_module.net[0].bias.detach()
        h = torch.relu(PROBE @ w.T + b).double().numpy()
        s = np.sqrt(np.clip(np.linalg.eigvalsh(h.T @ h), 0.0, None))
        self.ranks[trainer.global_step] = erank_by_hand(s[s > 1e-9 * s.max()])


def fit(module, *callbacks, max_epochs=1, root=None, ckpt_path=None) -> pl.Trainer:
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=max_epochs,
        logger=False,
        callbacks=list(callbacks),
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
    )
    trainer.fit(module, ckpt_path=ckpt_path)
    return trainer


def capture(n: int = 2, module: str = "net.2") -> RewardStreamCallback:
    return RewardStreamCallback(
        effective_rank_module=module, effective_rank_probe=PROBE, effective_rank_every_n_steps=n
    )


def test_capture_records_the_hand_computed_rank_every_n_optimizer_steps():
    torch.manual_seed(123)
    stream, ref = capture(n=2), Reference()
    module = Net()
    fit(module, stream, ref)
    ranks = [s.effective_rank for s in stream.steps]
    # optimizer steps 1..6 end batches 0..5; every 2nd (global step 2, 4, 6) is measured
    assert [r is not None for r in ranks] == [False, True, False, True, False, True]
    for i, r in enumerate(ranks):
        if r is not None:
            assert r == pytest.approx(ref.ranks[i + 1], rel=1e-6)
            assert 1.0 <= r <= 8.0
    assert len({round(r, 9) for r in ranks if r is not None}) > 1  # the weights moved
    # eval-safe: training mode, grad mode and the gradients are as they were
    assert all(module.modes) and all(ref.grads_same)
    # the existing averaging reports it: per label, the mean over the measured steps
    rows = stream.result["per_regime"]
    assert rows["a"]["effective_rank"] == pytest.approx(ranks[1])
    assert rows["b"]["effective_rank"] == pytest.approx((ranks[3] + ranks[5]) / 2)
    assert stream.scalar_metrics()["stream/b/effective_rank"] == pytest.approx(
        (ranks[3] + ranks[5]) / 2
    )
    assert stream.result["params"]["effective_rank_capture"] == {
        "module": "net.2",
        "every_n_steps": 2,
        "probe_shape": [10, 4],
    }


class Noisy(Net):
    """Its forward draws from the RNG in every mode (without changing the output)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x + 0.0 * torch.randn_like(x))


def test_capture_does_not_change_training_or_the_random_stream():
    torch.manual_seed(7)
    plain_module = Noisy()
    plain = RewardStreamCallback()
    fit(plain_module, plain)
    torch.manual_seed(7)
    captured_module = Noisy()
    captured = capture(n=1)
    fit(captured_module, captured)
    assert captured_module.rewards == plain_module.rewards  # same RNG draws
    for a, b in zip(plain_module.parameters(), captured_module.parameters(), strict=True):
        assert torch.equal(a, b)
    assert [s.reward for s in captured.steps] == [s.reward for s in plain.steps]
    assert all(s.effective_rank is not None for s in captured.steps)
    # off by default: nothing measured, and the row is absent, not zero
    assert all(s.effective_rank is None for s in plain.steps)
    assert plain.result["per_regime"]["a"]["effective_rank"] is None
    assert "effective_rank_capture" not in plain.result["params"]


class SeededPerStep(Net):
    """Reseeds torch at every step, so a resumed run draws what an uninterrupted one does
    (Lightning does not checkpoint the global random state)."""

    def training_step(self, batch, batch_idx):
        torch.manual_seed(1000 + self.global_step)
        return super().training_step(batch, batch_idx)


def test_captured_ranks_are_in_the_checkpoint_and_survive_a_resume(tmp_path: Path):
    whole = capture(n=1)
    fit(SeededPerStep(), whole, max_epochs=2)

    first = capture(n=1)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    fit(SeededPerStep(), first, ckpt, max_epochs=1, root=tmp_path)
    path = tmp_path / "ckpt" / f"epoch=0-step={BATCHES}.ckpt"
    state = torch.load(path, weights_only=False)["callbacks"][first.state_key]
    saved = state["ranks"][0]["effective_rank"].tolist()
    assert saved == pytest.approx([s.effective_rank for s in first.steps])

    resumed = capture(n=1)
    fit(SeededPerStep(), resumed, max_epochs=2, root=tmp_path, ckpt_path=path)
    got = [s.effective_rank for s in resumed.steps]
    assert len(got) == 2 * BATCHES
    assert got == pytest.approx([s.effective_rank for s in whole.steps], rel=1e-9)


def test_capture_options_are_checked():
    with pytest.raises(ValueError, match="empty"):
        capture_with(probe=torch.empty(0, 4))
    with pytest.raises(ValueError, match="empty"):
        capture_with(probe=torch.tensor(1.0))
    with pytest.raises(TypeError, match="must be a tensor"):
        capture_with(probe=[[1.0, 2.0]])
    for n in (0, -3):
        with pytest.raises(ValueError, match="every_n_steps must be an integer >= 1"):
            capture_with(n=n)
    with pytest.raises(ValueError, match="needs effective_rank_probe"):
        RewardStreamCallback(effective_rank_module="net.2")
    with pytest.raises(ValueError, match="without effective_rank_module"):
        RewardStreamCallback(effective_rank_probe=PROBE)


def capture_with(probe=PROBE, n=1):
    return RewardStreamCallback(
        effective_rank_module="net.0", effective_rank_probe=probe, effective_rank_every_n_steps=n
    )


def test_unknown_module_name_is_a_clear_error_before_training():
    module = Net()
    with pytest.raises(ValueError, match=r"'net\.9' is not a submodule of Net.*'net\.2'"):
        fit(module, capture(module="net.9"))
    assert module.rewards == []  # raised at fit start, no step ran


class SuppliesRank(Net):
    def training_step(self, batch, batch_idx):
        record(self, effective_rank=3.0)
        return super().training_step(batch, batch_idx)


def test_a_supplied_rank_while_capturing_is_an_error():
    with pytest.raises(ValueError, match="captures it itself"):
        fit(SuppliesRank(), capture(n=1))


@pytest.mark.parametrize("strategy", ["FSDPStrategy", "DeepSpeedStrategy"])
def test_capture_is_refused_under_sharded_strategies(strategy):
    from types import SimpleNamespace

    sharded = type(strategy, (), {})()
    callback = capture_with()
    with pytest.raises(ValueError, match=f"{strategy}.*sharded"):
        callback.on_fit_start(SimpleNamespace(strategy=sharded), torch.nn.Linear(2, 2))

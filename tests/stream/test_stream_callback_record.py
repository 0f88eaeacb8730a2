"""How RewardStreamCallback receives readings: record(), and self.log without patching ``log``."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.core import LightningModule
from torch.utils.data import DataLoader

from continual_eval.stream.callback import RewardStreamCallback, record

# the worked example of docs/stream.md: its printed numbers are the reference
REWARDS = [0.8] * 10 + [0.1, 0.9, 0.9] + [0.6] * 7 + [0.5] * 10
LABELS = ["a"] * 10 + ["b"] * 10 + ["a_again"] * 10


def assert_worked_example(cb: RewardStreamCallback) -> None:
    assert [s.reward for s in cb.steps] == pytest.approx(REWARDS)
    assert [s.regime_id for s in cb.steps] == LABELS
    rows = cb.result["per_regime"]
    assert f"{rows['b']['per_configuration_reward']:.4f}" == "0.6100"
    assert rows["b"]["adaptation_speed"] == 3 and rows["b"]["recovery_time"] == 2
    assert f"{rows['a_again']['forgetting']:+.4f}" == "+0.3000"
    assert f"{rows['b']['stability_variance']:.4f}" == "0.0477"


class Example(pl.LightningModule):
    """Replays the worked example; ``via`` picks the channel: ``record``, ``log`` or ``outputs``."""

    def __init__(self, via: str = "record") -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.via = via

    def train_dataloader(self) -> DataLoader:
        return DataLoader(list(range(len(REWARDS))), batch_size=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> Any:
        t = int(batch[0])
        label = LABELS[t]
        origin = "a" if label == "a_again" else None
        loss = (self.w * 0.0).sum()
        if self.via == "record":
            record(self, reward=torch.tensor(REWARDS[t]), regime_id=label, regime_origin=origin)
            record(self, components={"solved": float(REWARDS[t] > 0.55)})
            return loss  # a bare loss: nothing else returned
        if self.via == "log":
            self.log("reward", REWARDS[t])
            self.log("components/solved", float(REWARDS[t] > 0.55))
        return {"loss": loss, "regime_id": label, "regime_origin": origin}


def fit(module: pl.LightningModule, *callbacks: pl.Callback) -> pl.Trainer:
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        callbacks=list(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(module)
    return trainer


def test_record_api_with_a_bare_loss():
    cb = RewardStreamCallback(solve_component="solved")
    fit(Example("record"), cb)
    assert_worked_example(cb)
    assert [s.regime_origin for s in cb.steps] == [
        "a" if lb == "a_again" else None for lb in LABELS
    ]
    assert cb.result["per_regime"]["b"]["solve_rate"] == pytest.approx(9 / 10)


class WrappedInInit(Example):
    """A user's own ``self.log`` wrapper, installed on the instance in ``__init__``."""

    def __init__(self) -> None:
        super().__init__("log")
        self.log_calls: list[str] = []
        class_log = self.log

        def log(name: str, value: Any, *args: Any, **kwargs: Any) -> None:
            self.log_calls.append(name)
            class_log(name, value, *args, **kwargs)

        self.log = log  # type: ignore[method-assign]


class WrappedAtTrainStart(Example):
    """A wrapper installed in the module's own on_train_start (after callbacks' on_train_start)
    that calls the class's ``log`` directly, bypassing whatever is on the instance."""

    def __init__(self) -> None:
        super().__init__("log")
        self.log_calls: list[str] = []

    def on_train_start(self) -> None:
        def log(name: str, value: Any, *args: Any, **kwargs: Any) -> None:
            self.log_calls.append(name)
            LightningModule.log(self, name, value, *args, **kwargs)

        self.log = log  # type: ignore[method-assign]


@pytest.mark.parametrize("module_cls", [WrappedInInit, WrappedAtTrainStart])
def test_module_that_wraps_its_own_log_still_records(module_cls):
    module = module_cls()
    cb = RewardStreamCallback(solve_component="solved")
    trainer = fit(module, cb)
    wrapper = module.__dict__.get("log")
    assert_worked_example(cb)
    assert cb.result["per_regime"]["b"]["solve_rate"] == pytest.approx(9 / 10)
    assert module.log_calls == ["reward", "components/solved"] * len(REWARDS)  # wrapper ran
    assert wrapper is not None and wrapper.__name__ == "log"  # and is still the module's log
    assert trainer.logged_metrics["reward"] == pytest.approx(REWARDS[-1])


class LogTap(pl.Callback):
    """Another callback that captures values by wrapping ``pl_module.log`` in on_train_start."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def on_train_start(self, trainer, pl_module):
        inner = pl_module.log

        def log(name: str, value: Any, *args: Any, **kwargs: Any) -> None:
            if name == "reward":
                self.seen.append(float(value))
            inner(name, value, *args, **kwargs)

        pl_module.log = log


@pytest.mark.parametrize("tap_first", [True, False], ids=["tap-first", "tap-last"])
def test_another_callback_wrapping_log_and_the_stream_both_see_every_value(tap_first):
    tap, cb = LogTap(), RewardStreamCallback()
    fit(Example("log"), *((tap, cb) if tap_first else (cb, tap)))
    assert tap.seen == pytest.approx(REWARDS)
    assert_worked_example(cb)


def test_record_takes_precedence_and_bad_calls_are_clear_errors():
    class Both(Example):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            out["reward"] = -1.0  # overridden by record()
            record(self, reward=REWARDS[int(batch[0])])
            return out

    cb = RewardStreamCallback()
    fit(Both("outputs"), cb)
    assert [s.reward for s in cb.steps] == pytest.approx(REWARDS)

    class Twice(Example):
        def training_step(self, batch, batch_idx):
            record(self, reward=1.0)
            record(self, reward=2.0)

    with pytest.raises(ValueError, match=r"\['reward'\] recorded twice at training step 0"):
        fit(Twice(), RewardStreamCallback())

    class Unknown(Example):
        def training_step(self, batch, batch_idx):
            record(self, rewrd=1.0)

    with pytest.raises(TypeError, match=r"unknown field\(s\) \['rewrd'\]"):
        fit(Unknown(), RewardStreamCallback())

    class InValidation(Example):
        def training_step(self, batch, batch_idx):
            return {"loss": (self.w * 0.0).sum(), "reward": 1.0, "regime_id": "a"}

        def val_dataloader(self):
            return DataLoader([0], batch_size=1)

        def validation_step(self, batch, batch_idx):
            record(self, reward=1.0)

    with pytest.raises(RuntimeError, match="outside a training step"):
        fit(InValidation(), RewardStreamCallback())

    with pytest.raises(RuntimeError, match="not attached to a Trainer"):
        record(Example(), reward=1.0)


def test_record_without_a_stream_callback_warns():
    with pytest.warns(UserWarning, match="no RewardStreamCallback"):
        fit(Example("record"))


def test_reward_logged_without_a_step_value_is_named():
    class EpochOnly(Example):
        def training_step(self, batch, batch_idx):
            self.log("reward", REWARDS[int(batch[0])], on_step=False, on_epoch=True)
            return {"loss": (self.w * 0.0).sum(), "regime_id": "a"}

    cb = RewardStreamCallback()
    with pytest.raises(KeyError, match="on_step=False"):
        fit(EpochOnly(), cb)
    assert cb.steps == []  # nothing half-recorded

"""An example non-stationary task: a multi-armed bandit whose payoffs switch regimes.

The schedule runs regimes in order (``[["a", 200], ["b", 200], ["a_again", 200]]``); an alias
(``a_again`` with origin ``a``) revisits its origin's payoffs under a fresh label, which is what
forgetting pairs. The policy is a softmax over arm logits trained by REINFORCE with a running
baseline, one pull per training step. ``training_step`` returns what
`RewardStreamCallback` records: the reward, the regime
label and origin, the components ``payoff`` and ``best_arm`` (1 when the pulled arm is the
regime's best, else 0), and ``invalid_action`` (the arm is refused under the regime: no payoff).

Run it with the bundled config (LightningCLI)::

    python -m continual_eval.stream.bandit --config configs/bandit.yaml

It prints the table per regime at the end; the files (``stream_table.txt``,
``stream_metrics.json``, ``stream_trace.jsonl``) go to the logger's directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

__all__ = ["NonStationaryBandit", "main"]

DEFAULT_PAYOFFS = {"a": [0.8, 0.3, 0.1], "b": [0.1, 0.3, 0.9]}
DEFAULT_SCHEDULE = [["a", 200], ["b", 200], ["a_again", 200]]


class NonStationaryBandit(pl.LightningModule):
    """A ``len(payoffs[k])``-armed bandit whose mean payoffs follow a regime schedule.

    Args:
        payoffs: regime label -> mean payoff of each arm.
        schedule: ``[label, steps]`` pairs run in order; labels must be in ``payoffs`` or
            ``aliases``.
        aliases: alias label -> the regime label it revisits (same payoffs).
        refused: regime label -> arms the environment refuses there (reward 0, invalid action).
        noise: standard deviation of Gaussian reward noise.
        lr: learning rate of the policy's logits.
        seed: seeds the arm sampling and the noise.
    """

    def __init__(
        self,
        payoffs: dict[str, list[float]] | None = None,
        schedule: list[list[Any]] | None = None,
        aliases: dict[str, str] | None = None,
        refused: dict[str, list[int]] | None = None,
        noise: float = 0.1,
        lr: float = 0.2,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.payoffs = {k: list(map(float, v)) for k, v in (payoffs or DEFAULT_PAYOFFS).items()}
        self.aliases = dict({"a_again": "a"} if aliases is None else aliases)
        self.refused = {k: list(map(int, v)) for k, v in (refused or {}).items()}
        self.schedule = [(str(lb), int(n)) for lb, n in (schedule or DEFAULT_SCHEDULE)]
        n_arms = {len(v) for v in self.payoffs.values()}
        if len(n_arms) != 1:
            raise ValueError(f"every regime needs the same number of arms, got {sorted(n_arms)}")
        for alias, origin in self.aliases.items():
            if origin not in self.payoffs:
                raise ValueError(f"alias {alias!r} revisits {origin!r}, which has no payoffs")
        for label, n in self.schedule:
            if self._root(label) not in self.payoffs:
                raise ValueError(f"schedule label {label!r} has no payoffs and is no alias")
            if n < 1:
                raise ValueError(f"schedule entry {label!r} needs at least one step, got {n}")
        self.n_arms = n_arms.pop()
        self.logits = torch.nn.Parameter(torch.zeros(self.n_arms))
        self.noise = float(noise)
        self.lr = float(lr)
        self.generator = torch.Generator().manual_seed(int(seed))
        self.baseline = 0.0
        self.labels = [lb for lb, n in self.schedule for _ in range(n)]

    def _root(self, label: str) -> str:
        while label in self.aliases:
            label = self.aliases[label]
        return label

    @property
    def total_steps(self) -> int:
        return len(self.labels)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(list(range(self.total_steps)), batch_size=1, shuffle=False)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> dict[str, Any]:
        t = int(batch.reshape(-1)[0])
        label = self.labels[t]
        root = self._root(label)
        probs = torch.softmax(self.logits, dim=0)
        arm = int(torch.multinomial(probs.detach().cpu(), 1, generator=self.generator))
        means = self.payoffs[root]
        invalid = arm in self.refused.get(root, [])
        noise = float(torch.randn((), generator=self.generator)) * self.noise
        reward = 0.0 if invalid else means[arm] + noise
        advantage = reward - self.baseline
        self.baseline += 0.1 * advantage
        loss = -advantage * torch.log(probs[arm])
        self.log("reward", reward, on_step=True, prog_bar=False)
        return {
            "loss": loss,
            "reward": reward,
            "regime_id": label,
            "regime_origin": root if root != label else None,
            "components": {
                "payoff": 0.0 if invalid else means[arm],
                "best_arm": float(arm == max(range(self.n_arms), key=means.__getitem__)),
            },
            "invalid_action": invalid,
        }


def main(args: Sequence[str] | None = None) -> Any:
    """``python -m continual_eval.stream.bandit --config configs/bandit.yaml``: fit and score.

    At the end the fifteen-row table of every `RewardStreamCallback` of the Trainer is
    printed, with the directory its files went to. A configured ``TensorBoardLogger`` becomes a
    ``CSVLogger`` (same directory, one line says so) when tensorboard is not installed.
    """
    from lightning.pytorch.cli import LightningCLI

    from continual_eval.stream.callback import RewardStreamCallback
    from continual_eval.stream.table import format_table

    cli = LightningCLI(
        NonStationaryBandit,
        subclass_mode_model=True,
        run=False,
        args=None if args is None else list(args),
        save_config_callback=None,
    )
    _without_missing_tensorboard(cli.trainer)
    cli.trainer.fit(cli.model)
    for callback in cli.trainer.callbacks:
        if isinstance(callback, RewardStreamCallback) and callback.result is not None:
            where = [lg.log_dir for lg in cli.trainer.loggers if getattr(lg, "log_dir", None)]
            print(format_table(callback.result), flush=True)
            if where:
                print(f"stream_table.txt, stream_metrics.json: {', '.join(where)}", flush=True)
    return cli


def _without_missing_tensorboard(trainer: pl.Trainer) -> None:
    """Replace ``trainer``'s TensorBoard loggers by CSV loggers when tensorboard is missing."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from continual_eval.experiments.cli import EXPERIMENTS_EXTRA, tensorboard_available

    if not any(isinstance(lg, TensorBoardLogger) for lg in trainer.loggers):
        return
    if tensorboard_available():
        return
    print(
        f"tensorboard is not installed: logging to CSV only; for TensorBoard: {EXPERIMENTS_EXTRA}",
        flush=True,
    )
    trainer.loggers = [
        CSVLogger(lg.save_dir, name=lg.name, version=lg.version)
        if isinstance(lg, TensorBoardLogger)
        else lg
        for lg in trainer.loggers
    ]


if __name__ == "__main__":  # pragma: no cover
    # Import through the package so the config's class_path names the same class object.
    from continual_eval.stream.bandit import main as _main

    _main()

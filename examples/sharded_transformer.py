"""A small transformer trained task by task under ModelParallelStrategy (FSDP2), 2 CPU processes.

python examples/sharded_transformer.py   # writes sharded_logs/results/results.json

Every parameter is sharded across the two processes (``fully_shard`` in ``configure_model``), so
every forward pass is a collective: ContinualEvalCallback detects that and evaluates in lockstep
(both processes run equally many forward passes per task; the one with fewer test batches repeats
one and discards it), with test sets of any size (here 301, 1 and 7 sequences: the 1-sequence
set leaves the second process without a sample). R equals the single-process R exactly. Lightning
re-launches this script for the second process; the numbers are seeded.

Each task: sequences of 12 tokens from a vocabulary of 32, the first 4 of them task-specific
"marker" tokens; the label is whether the task's first marker fills more than 2 of them. One
Trainer per task (``fit_tasks`` with a factory).
"""

from datetime import timedelta

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks

VOCAB, LENGTH, WIDTH = 32, 12, 64


class TinyTransformer(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, nhead=4, dim_feedforward=128, batch_first=True)
            for _ in range(2)
        )
        self.head = nn.Linear(WIDTH, 2)

    def configure_model(self) -> None:  # called for every fit: shard once
        if isinstance(self.head, FSDPModule):
            return
        mesh = self.device_mesh["data_parallel"]
        for layer in self.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.embed, mesh=mesh)
        fully_shard(self.head, mesh=mesh)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h.mean(dim=1))

    def training_step(self, batch, batch_idx):
        tokens, y = batch
        return nn.functional.cross_entropy(self(tokens), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def task(t: int, n: int, seed: int) -> DataLoader:
    """Label: whether marker token ``2t`` fills more than 2 of the 4 marker positions (the
    others hold marker ``2t + 1``)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(8, VOCAB, (n, LENGTH), generator=g)
    marks = torch.randint(0, 2, (n, 4), generator=g) + 2 * t  # 4 marker positions
    tokens[:, :4] = marks
    y = ((marks == 2 * t).sum(1) > 2).long()
    return DataLoader(TensorDataset(tokens, y), batch_size=32)


def main() -> None:
    pl.seed_everything(0)
    train = [task(t, 512, seed=t) for t in range(3)]
    test = [task(t, n, seed=100 + t) for t, n in enumerate((301, 1, 7))]
    callback = ContinualEvalCallback(test, dirpath="sharded_logs/results", verbose=True)

    def trainer(task_id: int) -> pl.Trainer:
        return pl.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=ModelParallelStrategy(
                data_parallel_size=2, tensor_parallel_size=1, timeout=timedelta(minutes=2)
            ),
            max_epochs=2,
            callbacks=[callback],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )

    fit_tasks(trainer, TinyTransformer(), train, seed=0)
    if callback.results_dir is not None:  # rank 0
        print(callback.scores)  # R[i, j]: accuracy on task j after stage i
        print(callback.results()["metrics"])
    torch.distributed.destroy_process_group()  # both processes, before the interpreter exits


if __name__ == "__main__":
    main()

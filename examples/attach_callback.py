"""Attach ContinualEvalCallback to your own LightningModule: R, baseline and metrics, no eval loop.

python examples/attach_callback.py   # writes lightning_logs/version_*/results.json, scores.csv

Seeded (``pl.seed_everything``): every run prints the same numbers. Each task is one ``fit`` on
the same Trainer, so checkpointing is off here (a ModelCheckpoint would find its directory already
holding the previous task's checkpoint and warn at every stage); to keep checkpoints, give each
task its own ``ModelCheckpoint(dirpath=...)`` or one per run.
"""

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks


class Model(pl.LightningModule):  # any module whose forward(x) returns class logits
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def task(t, n, seed):  # a toy task t: 4 Gaussian classes whose means move from task to task
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    means = 2 * torch.randn(4, 8, generator=torch.Generator().manual_seed(t))
    return DataLoader(TensorDataset(means[y] + torch.randn(n, 8, generator=g), y), batch_size=64)


pl.seed_everything(0)  # the model's initial weights: same printed metrics every run
train = [task(t, 512, seed=t) for t in range(3)]
test = [task(t, 301, seed=100 + t) for t in range(3)]  # one test loader per task; index = task id

callback = ContinualEvalCallback(test, metadata={"method": "finetune"})
trainer = pl.Trainer(
    max_epochs=2,
    callbacks=[callback],
    enable_progress_bar=False,
    enable_checkpointing=False,
    log_every_n_steps=8,  # 8 batches per epoch
)
fit_tasks(trainer, Model(), train)  # one fit per task on this Trainer (max_epochs each)

print(callback.scores)  # R[i, j]: accuracy on task j after training stage i
print(callback.results()["metrics"])  # acc, bwt, fwt, forgetting

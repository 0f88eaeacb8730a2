"""A real Trainer run with T = 1000 tasks of 2 classes (C = 2000) and ``task_classes``: a tiny
linear model, 2 test samples per task, the first STAGES tasks trained (one fit each). Writes
``out.json``: the peak RSS, the section's stored cells, and what the parent test compares (the
confusion cells of every stage, the acc_task_agnostic rows, the section read back from
results.json and from a checkpoint state loaded with ``weights_only=True``).

    python class_incremental_scale_script.py OUT_DIR
"""

from __future__ import annotations

import io
import json
import resource
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.results import ContinualResults

T, PER_TASK, STAGES, FEATURES = 1000, 2, 3, 8
TASK_CLASSES = [[2 * t, 2 * t + 1] for t in range(T)]


class Linear(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(FEATURES, 2 * T)

    def forward(self, x):
        return self.lin(x)

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def loaders(seed: int) -> list[DataLoader]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, PER_TASK, FEATURES, generator=g)
    y = torch.arange(T)[:, None] * 2 + torch.randint(0, 2, (T, PER_TASK), generator=g)
    return [DataLoader(TensorDataset(x[t], y[t]), batch_size=PER_TASK) for t in range(T)]


def _peak_rss_kib() -> int:
    """This process's peak resident set: VmHWM of /proc/self/status (since the exec);
    ``ru_maxrss`` only where there is none, as on Linux it also counts the starting process's
    resident set at the fork (a pytest-xdist worker that had run other tests)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(out: Path) -> None:
    warnings.filterwarnings("ignore")
    test, train = loaders(0), loaders(1)
    cb = ContinualEvalCallback(
        test, task_classes=TASK_CLASSES, dirpath=out / "run", verbose=False, log_images=False
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb],
        default_root_dir=str(out),
    )
    fit_tasks(trainer, Linear(), train[:STAGES])
    results = cb.continual_results()
    section = results.class_incremental
    record = cb._record.sections["class_incremental"]
    buffer = io.BytesIO()
    torch.save(cb.state_dict(), buffer)
    buffer.seek(0)
    again = ContinualEvalCallback(test, task_classes=TASK_CLASSES, verbose=False)
    again.load_state_dict(torch.load(buffer, weights_only=True))
    loaded = ContinualResults.load(out / "run").class_incremental
    summary = {
        "peak_rss_mib": _peak_rss_kib() / 1024,
        "num_stages": section.num_stages,
        "num_classes": section.num_classes,
        "stored_cells": record.stored_cells,
        "cells": [record.stage_counts(i).tolist() for i in range(section.num_stages)],
        "agnostic": results["acc_task_agnostic"].scores[:, : STAGES + 1].tolist(),
        "labels": [ys.tolist() for _, ys in (loader.dataset.tensors for loader in test)],
        "test_samples": section.test_samples.tolist(),
        "file_equal": loaded.to_section() == section.to_section(),
        "checkpoint_equal": again.continual_results().class_incremental.to_section()
        == section.to_section(),
    }
    (out / "out.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Standalone DDP run for test_callback_step_items.py: 2 CPU processes (gloo), per-item records of
the per-step evaluations.

Usage: python step_items_ddp_script.py OUT_DIR. Test sets of 37, 29 and 41 items (odd shards),
an evaluation after every optimizer step. Rank 0 saves the weights after every step (by the run's
cumulative step) and the tasks; every rank saves the per-step items it recorded (test-set order)
and its intervals of the step-curve metrics.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval._item_record import _values
from ddp_teardown import destroy_process_group


class StepWeights(pl.Callback):
    def __init__(self) -> None:
        self.step, self.weights = 0, {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.step += 1
        self.weights[self.step] = {k: v.clone() for k, v in pl_module.state_dict().items()}


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tasks = make_tasks(3, test_sizes=(37, 29, 41))
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        eval_every_n_steps=1,
        dirpath=out / "acc",
        verbose=False,
        item_records={"resamples": 200},
    )
    steps = StepWeights()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        callbacks=[steps, cb],
        default_root_dir=str(out),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    fit_tasks(trainer, Classifier(make_net()), train_loaders(tasks))
    record = cb.record.sections["items"]
    saved = {
        "steps": [(step, stage) for step, stage, _ in record.steps],
        **{
            name: [
                [_values(entry[name][j]) for j in range(stage + 1)]
                for _, stage, entry in record.steps
            ]
            for name in ("acc", "loss")
        },
    }
    saved["intervals"] = {
        name: {k: [v["estimate"], v["low"], v["high"]] for k, v in m["step_metrics"].items()}
        for name, m in cb.results()["intervals"]["matrices"].items()
    }
    torch.save(saved, out / f"rank{trainer.global_rank}.pt")
    if trainer.is_global_zero:
        torch.save(tasks, out / "tasks.pt")
        torch.save(steps.weights, out / "weights.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    destroy_process_group()

"""Standalone run for test_predictions.py's kill -9 test: the example's character transformer on
three tasks, with a held-out set and the per-cell prediction files.

Usage: python lm_kill_script.py MODE OUT_DIR with MODE ``full`` (3 tasks, uninterrupted),
``killed`` (the process kills itself with SIGKILL at the 20th forward pass of stage 2's
evaluation, after task 2 trained: the files of the baseline and of stages 0 and 1 are written)
or ``resume`` (continue the killed run from ``OUT_DIR/ckpt/task_1.ckpt``). Shuffled train
loaders: every random draw must be reproduced for the resume to equal the full run.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.evaluation.generation import GenerationScorer
from continual_eval.experiments.language import (
    TOKENIZER,
    CharTransformer,
    SyntheticTextTasks,
    _test_collate,
    _TextItems,
    decode_text,
    make_items,
)

KILL_AT = 20  # the forward pass of stage 2's evaluation that kills the process
PREDICTIONS = 4


class KillDuringEvaluation(CharTransformer):
    """Kills its own process at the ``KILL_AT``-th evaluation forward after stage
    ``kill_stage`` (set with the callback after construction)."""

    kill_stage: int | None = None
    callback: ContinualEvalCallback | None = None
    eval_forwards = 0

    def forward(  # the signature of CharTransformer's (the batch step reads its names)
        self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=False
    ):
        cb = self.callback
        if not self.training and cb is not None and cb.stages_completed == self.kill_stage:
            self.eval_forwards += 1
            if self.eval_forwards == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(input_ids, attention_mask, position_ids, cache, use_cache)


def main(mode: str, out: Path) -> None:
    data = SyntheticTextTasks(train_size=64, test_size=11, batch_size=16, test_batch_size=4)
    general = _TextItems(make_items("add", 7, torch.Generator().manual_seed(3)))
    eos = TOKENIZER.EOS
    callback = ContinualEvalCallback(
        data.test_dataloader(),
        task_names=data.task_names,
        scorers={
            "em": GenerationScorer(decode_text, max_new_tokens=8, eos_token_id=eos),
            "ppl": "perplexity",
        },
        held_out_dataloaders={
            "general": DataLoader(general, batch_size=4, collate_fn=_test_collate)
        },
        predictions=PREDICTIONS,
        dirpath=out / "results",
        verbose=False,
    )
    torch.manual_seed(0)
    model = KillDuringEvaluation(width=32, layers=1, heads=2, lr=0.01)
    model.callback = callback
    model.kill_stage = 2 if mode == "killed" else None
    fit_tasks(
        lambda task: pl.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=2,
            callbacks=[callback],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            default_root_dir=str(out),
        ),
        model,
        [data.task_train_dataloader(j) for j in range(3)],
        checkpoint_dir=out / "ckpt",
        ckpt_path=out / "ckpt" / "task_1.ckpt" if mode == "resume" else None,
        seed=3,
    )
    torch.save({"weights": model.state_dict()}, out / f"{mode}.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))

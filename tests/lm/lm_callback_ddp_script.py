"""Standalone DDP run: ``ContinualEvalCallback`` with an exact-match generation scorer and
perplexity on the example's character transformer, 2 CPU processes (gloo), test sets of odd
sizes (unequal shards: synced decoding must catch the short rank up), a held-out set of odd size
(9 items: 2 batches on rank 0, 1 on rank 1) and the per-cell prediction files
(``predictions=PREDICTIONS``).

Usage: python lm_callback_ddp_script.py OUT_DIR. Lightning re-launches this script for rank 1.
Rank 0 saves the weights at the baseline and after every stage; the callback writes
``OUT_DIR/results/results.json``. The test imports :func:`test_loaders` and :func:`scorers` to
score the saved weights in one process.
"""

from __future__ import annotations

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
from ddp_teardown import destroy_process_group

TEST_SIZE = 21  # 11 + 10 items on two ranks; batches of 4: 3 and 3 batches, 11 vs 10 items
HELD_OUT_SIZE = 9  # 5 + 4 items: 2 batches of 4 on rank 0, 1 on rank 1
PREDICTIONS = 7  # items per cell written: rank 0 holds 0, 2, 4, 6 of them, rank 1 1, 3, 5


def data() -> SyntheticTextTasks:
    return SyntheticTextTasks(
        tasks=["copy", "reverse"],
        train_size=192,
        test_size=TEST_SIZE,
        batch_size=16,
        test_batch_size=4,
    )


def test_loaders() -> list:
    return data().test_dataloader()


def held_out_set() -> _TextItems:
    return _TextItems(make_items("add", HELD_OUT_SIZE, torch.Generator().manual_seed(11)))


def held_out_loaders() -> dict:
    return {"general": DataLoader(held_out_set(), batch_size=4, collate_fn=_test_collate)}


def scorers() -> dict:
    return {
        "em": GenerationScorer(
            decode_text, "exact_match", max_new_tokens=8, eos_token_id=TOKENIZER.EOS
        ),
        "ppl": "perplexity",
        "edit": GenerationScorer(
            decode_text, "edit_similarity", max_new_tokens=8, eos_token_id=TOKENIZER.EOS
        ),
    }


def model() -> CharTransformer:
    torch.manual_seed(0)
    return CharTransformer(width=32, layers=1, heads=2, lr=0.01)


class Snapshots(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out, self.stage = out, 0

    def on_fit_start(self, trainer, pl_module):
        if self.stage == 0 and trainer.is_global_zero:
            torch.save(pl_module.state_dict(), self.out / "weights_baseline.pt")

    def on_train_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            torch.save(pl_module.state_dict(), self.out / f"weights_{self.stage}.pt")
        self.stage += 1


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stream = data()
    callback = ContinualEvalCallback(
        stream.test_dataloader(),
        task_names=stream.task_names,
        scorers=scorers(),
        held_out_dataloaders=held_out_loaders(),
        predictions=PREDICTIONS,
        dirpath=out / "results",
        verbose=False,
        inference_mode=False,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=3,
        callbacks=[callback, Snapshots(out)],
        logger=False,
        default_root_dir=str(out),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    fit_tasks(trainer, model(), [stream.task_train_dataloader(j) for j in range(2)])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    destroy_process_group()

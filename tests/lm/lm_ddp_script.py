"""Standalone DDP run for the LM tests: token scorers on shards of other padding per rank, and
synced decoding with per-rank stop lengths, and the generation scorers' per-item records
(gathered by each prompt's position in its test set: odd shards, an unsharded task), on 2 CPU
processes (gloo).

Usage: python lm_ddp_script.py OUT_DIR. Lightning re-launches this script for rank 1. At
``on_fit_start`` a callback evaluates seeded models on its rank's shards (unpadded,
:func:`shard_dataloader`) with the loop's sum reduction (``strategy.reduce``); every rank saves
its scores and how many forwards each decoding model ran. The test imports :func:`token_loaders`,
:func:`generation_loaders`, :func:`generation_scorers` and the models to compute the
single-process reference.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import torch
from lm_helpers import (
    ALPHABET,
    VOCAB,
    CountingLM,
    TinyCausalLM,
    collate,
    decode_chars,
    left_pad,
    sequences,
)
from torch import Tensor, nn
from torch.utils.data import DataLoader

from continual_eval.evaluation import evaluate_tasks, shard_dataloader
from continual_eval.evaluation.generation import GenerationScorer
from ddp_teardown import destroy_process_group

EOS = VOCAB - 1
TOKEN_SIZES = (9, 14)  # odd: a padded shard would count a sequence twice
# per task: how many prompts; even items (rank 0's shard) end in 8 (1 new token before EOS),
# odd items (rank 1's) in 1 (8 new tokens): per-rank stop lengths, and unequal batch counts
GENERATION_SIZES = (5, 8, 3)
GENERATION_BATCH = 2


def token_loaders() -> list[DataLoader]:
    """Right-padded mapping batches of random lengths (each batch padded to its longest)."""
    return [
        DataLoader(sequences(10 + k, n), batch_size=3, collate_fn=collate)
        for k, n in enumerate(TOKEN_SIZES)
    ]


def _prompt(item: int) -> list[int]:
    last = 8 if item % 2 == 0 else 1
    return [1 + item % 5, last] if item % 3 else [last]


def _reference(item: int) -> str:
    """What CountingLM decodes after the prompt, except for every fourth item (a wrong one)."""
    text = "".join(ALPHABET[t] for t in range(_prompt(item)[-1] + 1, EOS))
    return text if item % 4 else text + "x"


def _generation_collate(items: list[int]) -> dict[str, object]:
    ids, mask = left_pad([torch.tensor(_prompt(i)) for i in items])
    return {
        "prompt_input_ids": ids,
        "prompt_attention_mask": mask,
        "references": [_reference(i) for i in items],
        "index": torch.tensor(items),
    }


def generation_loaders() -> list[DataLoader]:
    return [
        DataLoader(list(range(n)), batch_size=GENERATION_BATCH, collate_fn=_generation_collate)
        for n in GENERATION_SIZES
    ]


def generation_scorers() -> list[GenerationScorer]:
    return [
        GenerationScorer(decode_chars, "exact_match", max_new_tokens=12, eos_token_id=EOS),
        GenerationScorer(decode_chars, "edit_similarity", max_new_tokens=12, eos_token_id=EOS),
    ]


def gpt2():
    """A 1-layer GPT-2 with random weights from a tiny config (nothing downloaded), or None
    without transformers."""
    try:
        import transformers
    except ImportError:
        return None
    config = transformers.GPT2Config(
        n_layer=1,
        n_embd=16,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=64,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def count_forwards(model: nn.Module) -> list[int]:
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


class Probe(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        rank, world = trainer.global_rank, trainer.world_size
        reduce = partial(trainer.strategy.reduce, reduce_op="sum")
        saved: dict[str, object] = {"world_size": world}

        tokens = [shard_dataloader(dl, rank, world)[0] for dl in token_loaders()]
        result = evaluate_tasks(
            TinyCausalLM().double(),
            tokens,
            range(len(tokens)),
            scorers=["perplexity", "token_nll", "token_accuracy"],
            all_reduce=reduce,
            rank=rank,
            world_size=world,
        )
        saved["token_scores"] = result.scores_by_scorer
        saved["token_total"] = result.total
        saved["token_padding"] = [[b["input_ids"].shape[1] for b in dl] for dl in tokens]

        # tasks 0 and 1 sharded; task 2 unsharded: only rank 0 decodes it, rank 1 has no batch
        gen = [shard_dataloader(dl, rank, world)[0] for dl in generation_loaders()[:2]]
        gen.append(generation_loaders()[2])
        counting = CountingLM()
        forwards = []
        for task in range(3):
            before = counting.calls
            result = evaluate_tasks(
                counting,
                gen,
                [task],
                scorers=generation_scorers(),
                all_reduce=reduce,
                rank=rank,
                world_size=world,
                unsharded={2},
                item_scorers=[0, 1],
            )
            forwards.append(counting.calls - before)
            saved[f"counting_scores_{task}"] = result.scores_by_scorer
            saved[f"counting_items_{task}"] = result.items_by_scorer
        saved["counting_forwards"] = forwards
        saved["counting_batches"] = [len(dl) for dl in gen[:2]]

        model = gpt2()
        if model is not None:
            calls = count_forwards(model)
            result = evaluate_tasks(
                model,
                gen[:2],
                range(2),
                scorers=generation_scorers(),
                all_reduce=reduce,
                rank=rank,
                world_size=world,
                item_scorers=[0, 1],
            )
            saved["gpt2_scores"] = result.scores_by_scorer
            saved["gpt2_items"] = result.items_by_scorer
            saved["gpt2_forwards"] = calls[0]
        torch.save(saved, self.out / f"rank{rank}.pt")


class Idle(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        return (self.w * batch.sum()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        limit_train_batches=1,
        callbacks=[Probe(out)],
        default_root_dir=str(out),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(Idle(), DataLoader(torch.zeros(4, 1), batch_size=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    destroy_process_group()

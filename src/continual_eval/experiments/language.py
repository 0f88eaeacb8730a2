"""A language-model task stream: a small causal transformer (plain torch, random initial
weights, nothing downloaded) fine-tuned in turn on three synthetic text tasks over a character
vocabulary, scored by teacher-forced perplexity and free-running exact match.

Tasks (prompt -> answer, ``s`` a string of 3-6 letters from ``a``-``h``):

* ``copy``: ``">abc="`` -> ``"abc"``;
* ``reverse``: ``"<abc="`` -> ``"cba"``;
* ``add``: ``"3+4="`` -> ``"7"`` (two digits).

A sequence is ``BOS prompt answer EOS``; the loss and the perplexity are over the answer tokens
and the EOS (the prompt's labels are -100). Test batches also carry the left-padded prompt
(``prompt_input_ids``, ``prompt_attention_mask``) and the answer text (``references``) for
`GenerationScorer`; the model's ``forward`` takes a
KV cache (``use_cache``, ``cache``), so greedy decoding reads each token once.
``configs/lm_char_tasks.yaml`` runs it with ``continual-eval fit``; ``examples/language_model.md``
reads its numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from continual_eval.evaluation.language import IGNORE_INDEX
from continual_eval.experiments.stream import TaskStreamDataModule

__all__ = [
    "TASKS",
    "CharTokenizer",
    "CharTransformer",
    "SyntheticTextTasks",
    "decode_text",
    "make_items",
]

#: the tasks of the stream, in training order
TASKS = ("copy", "reverse", "add")


class CharTokenizer:
    """One token per character of `alphabet`, after three special tokens: ``PAD`` (0),
    ``BOS`` (1), ``EOS`` (2)."""

    PAD, BOS, EOS = 0, 1, 2
    alphabet = "abcdefgh0123456789+=<>"

    def __init__(self) -> None:
        self._ids = {ch: 3 + k for k, ch in enumerate(self.alphabet)}

    @property
    def vocab_size(self) -> int:
        return 3 + len(self.alphabet)

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``'s characters (``KeyError`` for a character outside the
        alphabet)."""
        return [self._ids[ch] for ch in text]

    def batch_decode(self, rows: Sequence[Sequence[int]]) -> list[str]:
        """Each row's text; special tokens are skipped (as ``skip_special_tokens=True``)."""
        return ["".join(self.alphabet[t - 3] for t in row if t >= 3) for row in rows]


TOKENIZER = CharTokenizer()


def decode_text(rows: Sequence[Sequence[int]]) -> list[str]:
    """`CharTokenizer.batch_decode` of the shared tokenizer: the ``decode`` of the
    config's generation scorer."""
    return TOKENIZER.batch_decode(rows)


def make_items(task: str, count: int, generator: torch.Generator) -> list[tuple[str, str]]:
    """``count`` ``(prompt, answer)`` pairs of ``task`` (one of `TASKS`)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known: {TASKS}")
    items = []
    if task == "add":
        numbers = torch.randint(0, 10, (count, 2), generator=generator).tolist()
        return [(f"{a}+{b}=", str(a + b)) for a, b in numbers]
    lengths = torch.randint(3, 7, (count,), generator=generator).tolist()
    letters = "abcdefgh"
    for n in lengths:
        s = "".join(letters[i] for i in torch.randint(0, 8, (n,), generator=generator).tolist())
        items.append((f">{s}=", s) if task == "copy" else (f"<{s}=", s[::-1]))
    return items


class _TextItems(Dataset[tuple[str, str]]):
    def __init__(self, items: list[tuple[str, str]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, k: int) -> tuple[str, str]:
        return self.items[k]


def collate(items: Sequence[tuple[str, str]], prompts: bool = False) -> dict[str, Any]:
    """Right-padded ``input_ids`` (``BOS prompt answer EOS``), ``attention_mask`` and ``labels``
    (-100 on the prompt and the padding); with ``prompts`` also the left-padded prompts
    (``prompt_input_ids`` = ``BOS prompt``, ``prompt_attention_mask``) and the answers
    (``references``)."""
    tok = TOKENIZER
    prompt_ids = [[tok.BOS, *tok.encode(p)] for p, _ in items]
    full = [[*ids, *tok.encode(a), tok.EOS] for ids, (_, a) in zip(prompt_ids, items, strict=True)]
    longest = max(len(f) for f in full)
    input_ids = torch.full((len(items), longest), tok.PAD, dtype=torch.long)
    labels = torch.full((len(items), longest), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(items), longest), dtype=torch.long)
    for row, (ids, p) in enumerate(zip(full, prompt_ids, strict=True)):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, len(p) : len(ids)] = torch.tensor(ids[len(p) :])
        mask[row, : len(ids)] = 1
    batch: dict[str, Any] = {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
    if prompts:
        width = max(len(p) for p in prompt_ids)
        left = torch.full((len(items), width), tok.PAD, dtype=torch.long)
        left_mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, p in enumerate(prompt_ids):
            left[row, width - len(p) :] = torch.tensor(p)
            left_mask[row, width - len(p) :] = 1
        batch.update(
            prompt_input_ids=left,
            prompt_attention_mask=left_mask,
            references=[a for _, a in items],
        )
    return batch


def _test_collate(items: Sequence[tuple[str, str]]) -> dict[str, Any]:
    return collate(items, prompts=True)


class SyntheticTextTasks(TaskStreamDataModule):
    """The three tasks of `TASKS` (or a subset, in the order given), ``train_size`` and
    ``test_size`` items each, drawn from ``data_seed`` (not the run's seed: every seed is scored
    on the same test items)."""

    def __init__(
        self,
        tasks: Sequence[str] = TASKS,
        train_size: int = 2000,
        test_size: int = 200,
        data_seed: int = 0,
        batch_size: int = 64,
        test_batch_size: int = 100,
        joint: bool = False,
    ):
        super().__init__(batch_size=batch_size, test_batch_size=test_batch_size, joint=joint)
        generator = torch.Generator().manual_seed(data_seed)
        self.task_names = list(tasks)
        for task in self.task_names:
            self.train_sets.append(_TextItems(make_items(task, train_size, generator)))
            self.test_sets.append(_TextItems(make_items(task, test_size, generator)))
        # phase 2 of issue 21: held-out sets scored at the baseline and after every stage but
        # never trained ("general" ability); filled by the held-out-set option when it lands
        self.held_out_sets: dict[str, Dataset[Any]] = {}

    def _train_loader(self, dataset: Dataset[Any]) -> DataLoader[Any]:
        return DataLoader(
            dataset, batch_size=self.batch_size, shuffle=self.shuffle, collate_fn=collate
        )

    def test_dataloader(self) -> list[DataLoader[Any]]:
        return [
            DataLoader(ds, batch_size=self.test_batch_size, collate_fn=_test_collate)
            for ds in self.test_sets
        ]


class _Block(nn.Module):
    """Pre-norm transformer block: causal self-attention (SDPA) and an MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(
        self, x: Tensor, allowed: Tensor, cache: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        n, t, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (z.reshape(n, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
        x = x + self.proj(attended.transpose(1, 2).reshape(n, t, width))
        return x + self.mlp(self.norm2(x)), (k, v)


class CharTransformer(pl.LightningModule):
    """A GPT-style causal transformer over `CharTokenizer`'s ids, trained with AdamW on
    the answer tokens (the batch's ``labels``, shifted: position ``t`` predicts ``t + 1``).

    ``forward(input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=False)``
    returns ``{"logits": [N, T, V], "cache": ...}`` (the cache: every block's keys and values
    and the attention mask so far, when ``use_cache``), the keyword protocol of Hugging Face
    causal LMs that `greedy_decode` reads. Positions
    count the attended tokens (left-padded prompts start at 0)."""

    def __init__(
        self,
        width: int = 64,
        layers: int = 2,
        heads: int = 4,
        max_length: int = 32,
        lr: float = 3e-3,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.lr = lr
        vocab = TOKENIZER.vocab_size
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(max_length, width)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    @property
    def method(self) -> str:
        """``"naive"`` (sequential fine-tuning)."""
        return "naive"

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: dict[str, Any] | None = None,
        use_cache: bool = False,
    ) -> dict[str, Any]:
        n, t = input_ids.shape
        past = 0 if cache is None else cache["mask"].shape[1]
        if attention_mask is None:
            attention_mask = torch.ones((n, past + t), dtype=torch.long, device=input_ids.device)
        if attention_mask.shape[1] == t and past:  # a mask of the new tokens only
            attention_mask = torch.cat([cache["mask"], attention_mask], dim=1)  # type: ignore[index]
        keys = attention_mask.bool()  # [N, past + T]
        if position_ids is None:
            position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)[:, past:]
        query_at = torch.arange(past, past + t, device=input_ids.device)
        key_at = torch.arange(past + t, device=input_ids.device)
        causal = key_at[None, :] <= query_at[:, None]  # [T, past + T]
        # a padded query attends to itself only, so no row of the softmax is empty
        itself = key_at[None, :] == query_at[:, None]
        allowed = (causal[None] & keys[:, None]) | itself[None]
        x = self.embed(input_ids) + self.position(position_ids)
        layers = [None] * len(self.blocks) if cache is None else cache["layers"]
        new_layers = []
        for block, layer in zip(self.blocks, layers, strict=True):
            x, kv = block(x, allowed, layer)
            new_layers.append(kv)
        logits = self.head(self.norm(x))
        out: dict[str, Any] = {"logits": logits, "cache": None}
        if use_cache:
            out["cache"] = {"layers": new_layers, "mask": attention_mask}
        return out

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        logits = self(batch["input_ids"], batch["attention_mask"])["logits"]
        loss = F.cross_entropy(
            logits[:, :-1].transpose(1, 2), batch["labels"][:, 1:], ignore_index=IGNORE_INDEX
        )
        self.log(
            "train/loss", loss, on_step=False, on_epoch=True, batch_size=len(logits), sync_dist=True
        )
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.0)

    def reference_model(self) -> CharTransformer:
        """A copy with the same weights (for reference training)."""
        import copy

        return copy.deepcopy(self)

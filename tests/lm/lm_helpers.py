"""Tiny seeded language models, padded token batches and the plain loops the LM tests compare
against (shared by the tests and their DDP scripts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

VOCAB = 11
PAD = 0


class TinyCausalLM(nn.Module):
    """A seeded causal LM in plain torch: embedding, a causal running mean of the embeddings of
    the attended positions (position ``t`` sees ``0..t``), a linear head;
    ``forward(input_ids, attention_mask=None)`` returns logits ``[N, T, V]``. ``output`` picks
    how: ``"tensor"``, ``"mapping"`` (a dict with ``"logits"``) or ``"attribute"`` (an object
    with ``.logits``)."""

    def __init__(self, vocab: int = VOCAB, width: int = 8, seed: int = 0, output: str = "tensor"):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab)
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(vocab, width, generator=g))
            self.head.weight.copy_(torch.randn(vocab, width, generator=g))
            self.head.bias.copy_(torch.randn(vocab, generator=g))
        self.output = output
        self.calls = 0

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Any:
        self.calls += 1
        h = self.embed(input_ids)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        weight = attention_mask.to(h.dtype)[..., None]  # masked (padding) positions not averaged
        seen = weight.cumsum(dim=1).clamp(min=1)
        logits = self.head((h * weight).cumsum(dim=1) / seen)
        if self.output == "mapping":
            return {"logits": logits, "loss": None}
        if self.output == "attribute":
            return _Output(logits)
        return logits


class _Output:
    def __init__(self, logits: Tensor) -> None:
        self.logits = logits


def sequences(seed: int, count: int, low: int = 2, high: int = 9) -> list[Tensor]:
    """``count`` token sequences of lengths in ``[low, high]`` (ids 1..VOCAB-1)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=g)
    return [torch.randint(1, VOCAB, (int(n),), generator=g) for n in lengths]


def collate(batch: Sequence[Tensor], prompt: int = 1) -> dict[str, Tensor]:
    """Right-padded ``input_ids`` / ``attention_mask`` / ``labels``: labels are the inputs with
    -100 on the padding and on the first ``prompt`` tokens (a prompt that is not scored)."""
    longest = max(len(s) for s in batch)
    ids = torch.full((len(batch), longest), PAD, dtype=torch.long)
    mask = torch.zeros((len(batch), longest), dtype=torch.long)
    for row, seq in enumerate(batch):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :prompt] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def plain_token_counts(
    model: nn.Module, seqs: Sequence[Tensor], prompt: int = 1, shift: bool = True
) -> tuple[float, int, int]:
    """``(NLL sum, scored tokens, correct argmax)`` of ``seqs`` one sequence and one position at
    a time, float64 log-softmax: the reference of the token scorers."""
    nll, tokens, correct = 0.0, 0, 0
    with torch.no_grad():
        for seq in seqs:
            out = model(seq[None])
            logits = (out if isinstance(out, Tensor) else out["logits"])[0].double()
            for t in range(len(seq)):
                if t < prompt:
                    continue
                source = t - 1 if shift else t
                if source < 0:
                    continue
                log_p = torch.log_softmax(logits[source], dim=0)
                nll -= float(log_p[seq[t]])
                tokens += 1
                correct += int(int(logits[source].argmax()) == int(seq[t]))
    return nll, tokens, correct


ALPHABET = "_abcdefghij"  # token t is ALPHABET[t]; 0 is the pad


def decode_chars(rows: list[list[int]]) -> list[str]:
    """Token-id rows to text, one character per token."""
    return ["".join(ALPHABET[t] for t in row) for row in rows]


def left_pad(prompts: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Left-padded ``(input_ids, attention_mask)`` of ``prompts``."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), PAD, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, longest - len(p) :] = p
        mask[row, longest - len(p) :] = 1
    return ids, mask


def plain_greedy(
    model: nn.Module, prompt: Tensor, max_new_tokens: int, eos: int | None
) -> list[int]:
    """One prompt, no padding, no cache: argmax of the last position, the whole sequence re-read
    each step, until ``eos`` (excluded) or ``max_new_tokens``."""
    seq, out = prompt[None], []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            output = model(seq)
            logits = output if isinstance(output, Tensor) else output["logits"]
            token = int(logits[0, -1].argmax())
            if token == eos:
                break
            out.append(token)
            seq = torch.cat([seq, torch.tensor([[token]])], dim=1)
    return out


class CountingLM(nn.Module):
    """Emits ``last + 1`` after each token (``EOS`` = ``VOCAB - 1`` once it reaches it), so a
    prompt ending in ``k`` stops after ``VOCAB - 1 - k`` tokens; counts its forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(10.0))
        self.calls = 0

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        self.calls += 1
        nxt = (input_ids + 1).clamp(max=VOCAB - 1)
        return nn.functional.one_hot(nxt, VOCAB).to(self.scale.dtype) * self.scale

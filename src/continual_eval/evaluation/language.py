r"""Token-level scores of language models: perplexity, mean token NLL and token accuracy.

Functional layer (pure tensor functions) and thin count-based scorers over it, registered in
[`make_scorer`][continual_eval.evaluation.make_scorer] as ``"perplexity"`` (``"ppl"``),
``"token_nll"`` and ``"token_accuracy"``.

Layout: ``preds`` are the logits with the vocabulary on dim 1, ``[N, V, T]``, the layout
``F.cross_entropy`` takes for sequences and the class-dimension convention of every scorer here;
the mapping-batch step hands a causal LM's ``[N, T, V]`` logits as ``logits.transpose(1, 2)`` (a
view, no copy; see `default_batch_step`). ``labels`` are token
ids ``[N, T]``; positions whose label is ``ignore_index`` (default ``-100``, padding and prompt
tokens by the Hugging Face convention) are not scored.

Causal shift (``shift=True``, the default): the labels are the inputs, as a Hugging Face causal
LM takes ``labels=input_ids``, so the logits at position `t` are scored against the label
at `t + 1` (the last position's logits and the first label are not scored).
``shift=False``: ``labels[:, t]`` is the target of ``preds[:, :, t]`` (sequence-to-sequence
decoder labels, or labels already shifted).

Scores, over the scored tokens `\mathcal{T}` of a task (every batch, every rank):

* ``token_nll`` `= \frac{1}{|\mathcal{T}|}\sum_{t \in \mathcal{T}} -\log p(y_t)` (nats);
* ``perplexity`` `= \exp(\text{token\_nll})`, lower is better, bounds ``(1, inf)``;
* ``token_accuracy`` `= \frac{1}{|\mathcal{T}|}\sum_{t} [\arg\max_v s_{t,v} = y_t]`.

Exact under DDP: every rank's NLL sum (float64) and token counts (int64, exact in the loop's
float64 reduction below 2**53) are summed, then divided once: the token-weighted mean, never a
mean of per-batch or per-rank means (the per-sample ``cross_entropy`` scorer weighs a padded
sequence as one sample whatever its length).

Memory: no full-vocabulary float copy of the logits. The cross-entropy is taken over chunks of
positions holding at most ``chunk_elements`` logits (default `chunk_size`: the larger of
`CHUNK_ELEMENTS` and 1/`MAX_CHUNKS` of the batch's logits, so the temporaries stay
below 4 MiB or 1/64 of the logits and a batch takes at most about 64 chunks); the only
full-vocabulary temporaries, the chunk's log-softmax and the float32 upcast of half-precision
logits, are chunk-sized; the per-position NLL lives one chunk at a time and each sequence's sum
is accumulated in float64 (``[N]``). Per-token NLL is computed in the logits' precision (float32
for float16/bfloat16 logits, float64 for float64 logits).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from continual_eval.evaluation.errors import EvaluationError

__all__ = [
    "CHUNK_ELEMENTS",
    "IGNORE_INDEX",
    "MAX_CHUNKS",
    "TOKEN_SCORERS",
    "PerplexityScorer",
    "TokenAccuracyScorer",
    "TokenNLLScorer",
    "chunk_size",
    "make_token_scorer",
    "out_of_vocabulary",
    "sequence_token_correct",
    "sequence_token_nll",
]

#: the label of positions that are not scored (PyTorch's and Hugging Face's convention)
IGNORE_INDEX = -100
#: the fewest logits per chunk of the default chunking (4 MiB of float32 temporaries)
CHUNK_ELEMENTS = 2**20
#: the most chunks per batch of the default chunking (beyond CHUNK_ELEMENTS logits a chunk)
MAX_CHUNKS = 64


def chunk_size(logits_numel: int) -> int:
    """The default logits per chunk: ``max(CHUNK_ELEMENTS, ceil(logits_numel / MAX_CHUNKS))``."""
    return max(CHUNK_ELEMENTS, -(-logits_numel // MAX_CHUNKS))


def _check_layout(preds: Tensor, labels: Tensor) -> None:
    """[`EvaluationError`][continual_eval.evaluation.EvaluationError] unless ``preds`` ``[N, V, T]``
    and ``labels`` ``[N, T]`` fit."""
    if labels.is_floating_point() or labels.dtype == torch.bool or labels.is_complex():
        raise EvaluationError(f"token labels must be integer token ids, got {labels.dtype}")
    if not preds.is_floating_point():
        raise EvaluationError(
            f"token scores need floating logits; the model returned {preds.dtype}"
        )
    if preds.ndim != 3 or labels.ndim != 2:
        raise EvaluationError(
            f"token scores need logits [N, V, T] and labels [N, T]; got logits of shape "
            f"{list(preds.shape)} and labels of shape {list(labels.shape)}"
        )
    if preds.shape[0] != labels.shape[0] or preds.shape[2] != labels.shape[1]:
        hint = ""
        if preds.shape[:2] == labels.shape:
            hint = (
                " (they look like [N, T, V], a causal LM's own layout: pass "
                "logits.transpose(1, 2), the vocabulary on dim 1)"
            )
        raise EvaluationError(
            f"logits of shape {list(preds.shape)} do not fit labels of shape "
            f"{list(labels.shape)}: expected [N, V, T] with labels [N, T]{hint}"
        )


def out_of_vocabulary(
    labels: Tensor, vocab_size: int, *, shift: bool = True, ignore_index: int = IGNORE_INDEX
) -> Tensor:
    """How many scored labels (not ``ignore_index``) lie outside ``[0, vocab_size)`` (int64
    scalar, on the labels' device)."""
    target = labels[:, 1:] if shift else labels
    return ((target != ignore_index) & ((target < 0) | (target >= vocab_size))).sum()


def _chunks(shape: tuple[int, int, int], chunk_elements: int) -> list[tuple[slice, slice]]:
    """``(sequences, positions)`` slices covering ``[N, T, V]`` with at most ``chunk_elements``
    logits each (at least one position): whole sequences when one fits, else pieces of one
    sequence, so that each block of a contiguous tensor is contiguous."""
    n, t, v = shape
    if t * v <= chunk_elements:
        rows = max(1, chunk_elements // max(t * v, 1))
        return [(slice(r, r + rows), slice(None)) for r in range(0, n, rows)]
    positions = max(1, chunk_elements // max(v, 1))
    return [
        (slice(r, r + 1), slice(p, p + positions)) for r in range(n) for p in range(0, t, positions)
    ]


def _targets(labels: Tensor, shift: bool, ignore_index: int) -> Tensor:
    """The label each position's logits are scored against, ``[N, T]``: ``labels[:, t + 1]``
    (``ignore_index`` at the last position) with ``shift``, else ``labels``."""
    if not shift:
        return labels
    return torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), ignore_index)], dim=1)


def sequence_token_nll(
    preds: Tensor,
    labels: Tensor,
    *,
    shift: bool = True,
    ignore_index: int = IGNORE_INDEX,
    chunk_elements: int | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Per sequence, the summed NLL of its scored tokens and their number.

    `\ell_{n,t} = \log\sum_v e^{s_{n,v,t}} - s_{n,y_{n,t},t}` (the cross-entropy of the
    softmax over the vocabulary, ``F.cross_entropy(..., reduction="none")`` one chunk at a time),
    summed over the positions whose label is not ``ignore_index`` (after the causal shift when
    ``shift``).

    Args:
        preds: logits ``[N, V, T]`` (vocabulary on dim 1).
        labels: token ids ``[N, T]``; labels outside ``[0, V)`` that are not ``ignore_index`` are
            not scored here (count them with `out_of_vocabulary`).
        shift: apply the causal shift (labels are the inputs).
        ignore_index: the label of unscored positions.
        chunk_elements: most logits per chunk (bounds the temporaries); ``None``:
            `chunk_size` of the logits.

    Returns:
        ``(nll [N] float64, tokens [N] int64)``.
    """
    _check_layout(preds, labels)
    logits = preds.transpose(1, 2)  # [N, T, V]: the model's own memory layout when it was that
    n, t, v = logits.shape
    target = _targets(labels, shift, ignore_index)
    mask = target != ignore_index
    # out-of-vocabulary labels are reported by the scorers; here they are not scored
    safe = torch.where(mask & ((target < 0) | (target >= v)), ignore_index, target)
    if chunk_elements is None:
        chunk_elements = chunk_size(preds.numel())
    compute = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    sum_dtype = torch.float32 if logits.device.type == "mps" else torch.float64
    nll = torch.zeros(n, dtype=sum_dtype, device=logits.device)
    if n and t and v:
        for rows, positions in _chunks((n, t, v), chunk_elements):
            block = logits[rows, positions]  # reshaped below: a view when logits are contiguous
            width = block.shape[1]
            losses = F.cross_entropy(
                block.reshape(-1, v).to(compute),  # half precision upcast one chunk at a time
                safe[rows, positions].reshape(-1),
                ignore_index=ignore_index,
                reduction="none",
            )
            nll[rows] += losses.view(-1, width).sum(dim=1, dtype=sum_dtype)
    return nll, mask.sum(dim=1)


def sequence_token_correct(
    preds: Tensor, labels: Tensor, *, shift: bool = True, ignore_index: int = IGNORE_INDEX
) -> tuple[Tensor, Tensor]:
    """Per sequence, how many scored tokens' argmax over the vocabulary is their label, and how
    many tokens are scored: ``(correct [N] int64, tokens [N] int64)``. Ties in the argmax go to
    the lowest token id (``torch.argmax``)."""
    _check_layout(preds, labels)
    target = _targets(labels, shift, ignore_index)
    mask = target != ignore_index
    if preds.shape[1] == 0:
        return torch.zeros_like(mask.sum(dim=1)), mask.sum(dim=1)
    hits = (preds.transpose(1, 2).argmax(dim=2) == target) & mask
    return hits.sum(dim=1), mask.sum(dim=1)


_OUT_OF_VOCABULARY = (
    "{n} scored labels lie outside the vocabulary [0, V) of the logits (dim 1) and are not the "
    "ignore index; does the tokenizer fit the model, and are padded labels set to the ignore "
    "index (-100 by default)?"
)
_NOT_FINITE_NLL = (
    "the token NLL sum is not finite on {n} rank(s): some logits are NaN or infinite (e.g. a "
    "-inf logit on a label)"
)


class _TokenScorer:
    """Shared state of the token scorers: per update, device scalars (value, tokens, labels out
    of the vocabulary), reduced once in `local_counts`; count-based (exact under DDP)."""

    count_based = True
    #: what results.json records of how the score was produced: the reference tokens are fed
    scoring = "teacher-forced"
    #: a batch of other padding needs its own call: batches are never concatenated (that would
    #: also copy the logits)
    batch_additive = False

    def __init__(
        self,
        *,
        shift: bool = True,
        ignore_index: int = IGNORE_INDEX,
        chunk_elements: int | None = None,
    ) -> None:
        if not isinstance(shift, bool):
            raise TypeError(f"shift must be a bool, got {shift!r}")
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
            raise TypeError(f"ignore_index must be an int, got {ignore_index!r}")
        if chunk_elements is not None and (
            isinstance(chunk_elements, bool) or not isinstance(chunk_elements, int)
        ):
            raise TypeError(
                f"chunk_elements must be None or a positive int, got {chunk_elements!r}"
            )
        if chunk_elements is not None and chunk_elements < 1:
            raise ValueError(f"chunk_elements must be a positive int, got {chunk_elements}")
        self.shift = shift
        self.ignore_index = ignore_index
        self.chunk_elements = chunk_elements

    def start(self, device: torch.device) -> None:
        self._device = device
        self._values: list[Tensor] = []
        self._tokens: list[Tensor] = []
        self._outside: list[Tensor] = []

    def _batch(self, preds: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """This batch's ``(value [N], tokens [N])`` per sequence."""
        raise NotImplementedError

    def update(self, preds: Tensor, target: Tensor) -> None:
        value, tokens = self._batch(preds, target)
        self._values.append(value.sum())
        self._tokens.append(tokens.sum())
        self._outside.append(
            out_of_vocabulary(
                target, preds.shape[1], shift=self.shift, ignore_index=self.ignore_index
            )
        )

    def _total(self, values: list[Tensor], dtype: torch.dtype) -> Tensor:
        if not values:
            return torch.zeros((), dtype=dtype, device=self._device)
        total = values[0] if len(values) == 1 else torch.stack(values).sum()
        return total.to(device=self._device, dtype=dtype)


class TokenNLLScorer(_TokenScorer):
    r"""Mean NLL per scored token, `\frac{1}{|\mathcal{T}|}\sum_t -\log p(y_t)` in nats,
    summed over every batch and rank before the one division (see the module docstring for the
    layout, the causal shift and the ignore index). Lower is better; ``bounds = (0, inf)``."""

    name = "token_nll"
    higher_is_better = False
    bounds: tuple[float, float] | None = (0.0, math.inf)
    target_problems = (_OUT_OF_VOCABULARY, _NOT_FINITE_NLL)

    def _batch(self, preds: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        return sequence_token_nll(
            preds,
            labels,
            shift=self.shift,
            ignore_index=self.ignore_index,
            chunk_elements=self.chunk_elements,
        )

    def local_counts(self) -> Tensor:
        """``[nll_sum, tokens, out_of_vocabulary, not_finite]``, float64 (float32 on MPS);
        ``not_finite`` is 1 when this rank's NLL sum is NaN or infinite."""
        dtype = torch.float32 if self._device.type == "mps" else torch.float64
        nll = self._total(self._values, dtype)
        not_finite = (nll - nll != 0).to(dtype)  # x - x is 0 exactly for a finite x
        return torch.stack(
            [nll, self._total(self._tokens, dtype), self._total(self._outside, dtype), not_finite]
        )

    def result(self, reduced_counts: Tensor) -> Tensor:
        return self._from_mean(_mean_per_token(self.name, reduced_counts))

    def _from_mean(self, mean: Tensor) -> Tensor:
        return mean


class PerplexityScorer(TokenNLLScorer):
    r"""Perplexity `\exp\big(\frac{1}{|\mathcal{T}|}\sum_t -\log p(y_t)\big)`: the
    exponential of the token-weighted mean NLL of the task (its total NLL over its total scored
    tokens, every batch and rank), not a mean of per-sequence perplexities. Lower is better;
    ``bounds = (1, inf)``."""

    name = "perplexity"
    bounds = (1.0, math.inf)

    def _from_mean(self, mean: Tensor) -> Tensor:
        return mean.exp()


class TokenAccuracyScorer(_TokenScorer):
    r"""Token accuracy `\frac{1}{|\mathcal{T}|}\sum_t [\arg\max_v s_{t,v} = y_t]` over the
    scored tokens of the task (integer counts, exact under DDP). Higher is better; bounds
    ``(0, 1)``."""

    name = "token_accuracy"
    higher_is_better = True
    bounds = (0.0, 1.0)
    target_problems = (_OUT_OF_VOCABULARY,)

    def _batch(self, preds: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        return sequence_token_correct(
            preds, labels, shift=self.shift, ignore_index=self.ignore_index
        )

    def local_counts(self) -> Tensor:
        """``[correct, tokens, out_of_vocabulary]`` (int64)."""
        return torch.stack(
            [
                self._total(self._values, torch.int64),
                self._total(self._tokens, torch.int64),
                self._total(self._outside, torch.int64),
            ]
        )

    def result(self, reduced_counts: Tensor) -> Tensor:
        return _mean_per_token(self.name, reduced_counts)


def _mean_per_token(name: str, reduced_counts: Tensor) -> Tensor:
    """``value / tokens`` per task (``[tasks, K]`` counts), float64; an
    [`EvaluationError`][continual_eval.evaluation.EvaluationError] with ``task_row`` for a task
    without a scored token."""
    value, tokens = reduced_counts[:, 0].double(), reduced_counts[:, 1].double()
    empty = tokens == 0
    if bool(empty.any()):
        err = EvaluationError(
            f"{name}: no token of this task is scored (every label is the ignore index, or every "
            "sequence has one token under the causal shift)"
        )
        err.task_row = int(empty.int().argmax())
        raise err
    return value / tokens


#: the ``make_scorer`` strings of the token scorers
TOKEN_SCORERS = {
    "perplexity": PerplexityScorer,
    "ppl": PerplexityScorer,
    "token_nll": TokenNLLScorer,
    "token_accuracy": TokenAccuracyScorer,
}


def make_token_scorer(key: str) -> _TokenScorer | None:
    """The token scorer named ``key`` (a `TOKEN_SCORERS` key, default options), else
    ``None``."""
    cls = TOKEN_SCORERS.get(key)
    return None if cls is None else cls()

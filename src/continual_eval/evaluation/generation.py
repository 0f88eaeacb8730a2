r"""Generation-based scoring: decode each prompt, turn the new tokens into text, score the text
against its reference, and average over the task's items.

A `GenerationScorer` is free-running (``scoring = "free-running"``): the model reads its
own previous tokens, as at inference. Teacher-forced scores (the token scorers of
`language`, ``scoring = "teacher-forced"``) feed the reference
tokens instead; the two are not comparable (teacher forcing inflates scores).

Decoding. ``decoder="auto"`` (default) calls the module's own ``generate`` when it has one (a
Hugging Face model: `generate_decode`), else `greedy_decode`, a plain loop that keeps
a KV cache when the module's ``forward`` takes ``use_cache`` and ``cache`` (or
``past_key_values``) and returns it as Hugging Face models do, and otherwise re-reads the whole
sequence each step. Greedy (argmax) by default, so a score is a deterministic function of the
weights; ``do_sample=True`` needs a ``seed``, and each cell (stage, task) then draws from its own
seed, `cell_seed` (recorded in `GenerationScorer.cell_seeds`).

Synced decoding (several processes: the loop passes its ``all_reduce``). Under data parallelism
each rank decodes its own items, and under sharded strategies (FSDP, DeepSpeed ZeRO-3) every
forward is a collective, so every rank must run the same number of forwards. Two rounds of
sum-reductions keep them in step, so decoding never deadlocks:

* per batch, a handshake ``all_reduce([1])`` before decoding; a rank out of batches posts ``[0]``
  from `GenerationScorer.end_task`, and while the sum is positive it decodes a replayed
  prompt (its last batch's first item, else one pad token) with the others and discards it; the
  task ends for every rank at the first round whose sum is 0;
* per decoding step, a done flag: `greedy_decode` reduces "this rank has unfinished
  sequences" after each step and stops only when no rank has (a finished rank keeps stepping);
  Hugging Face's ``generate`` runs its own done-flag all-reduce (``synced_gpus=True``) through
  ``torch.distributed`` on the default group, the group Lightning's strategies reduce over.

The handshakes and `greedy_decode`'s flags go through the loop's ``all_reduce`` (the
Trainer's ``strategy.reduce``), not through ``torch.distributed`` directly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from continual_eval.evaluation.errors import EvaluationError, _what
from continual_eval.evaluation.language import IGNORE_INDEX
from continual_eval.evaluation.step import forward_parameters, model_logits
from continual_eval.evaluation.text_metrics import TEXT_METRICS

__all__ = [
    "Decoder",
    "GenerationRecord",
    "GenerationScorer",
    "cell_seed",
    "generate_decode",
    "greedy_decode",
    "prompt_inputs",
]

#: ``decoder(module, inputs, *, max_new_tokens, eos_token_id, pad_token_id, sync, do_sample,
#: temperature, generator) -> new token ids [N, L]`` (see `greedy_decode`)
Decoder = Callable[..., Tensor]
#: ``sync(this_rank_active) -> any_rank_active``, one collective per call
Sync = Callable[[bool], bool]

_CACHE_KEYWORDS = ("cache", "past_key_values")  # transformers 5 / transformers 4


def _cache_keyword(module: nn.Module) -> str | None:
    """The keyword under which ``module.forward`` takes and returns a KV cache (with
    ``use_cache``), else ``None``."""
    named, _ = forward_parameters(module)
    if "use_cache" not in named:
        return None
    return next((name for name in _CACHE_KEYWORDS if name in named), None)


def _returned_cache(output: Any, keyword: str) -> Any:
    cache = getattr(output, keyword, None)
    if cache is None and isinstance(output, Mapping):
        cache = output.get(keyword)
    return cache


def greedy_decode(
    module: nn.Module,
    inputs: Mapping[str, Tensor],
    *,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    pad_token_id: int = 0,
    sync: Sync | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Decode up to ``max_new_tokens`` tokens after each prompt; the new tokens ``[N, L]``
    (``L <= max_new_tokens``; after a sequence's ``eos_token_id``: ``pad_token_id``).

    Each step takes the logits of the last position (a tensor, ``.logits`` or ``"logits"``) and
    picks their argmax (``do_sample``: a draw from ``softmax(logits / temperature)`` with
    ``generator``). ``inputs``: ``input_ids`` ``[N, T]`` (left-padded prompts) and optionally
    ``attention_mask``, passed when ``forward`` names it; ``position_ids`` (the running count
    of attended tokens, minus one, as Hugging Face's ``generate`` makes them) when ``forward``
    names it. A KV cache is kept when ``forward`` takes ``use_cache`` and ``cache`` /
    ``past_key_values`` and its output holds the cache under that name; else the whole sequence
    is re-read each step. A ``forward`` that does not name ``input_ids`` gets the ids as its one
    positional argument (and no mask).

    Stops when every sequence has produced ``eos_token_id`` or after ``max_new_tokens``. With
    ``sync`` (several processes), after each step ``sync(this rank has unfinished sequences)``
    says whether any rank has, and the loop goes on (finished sequences receive pads) until none
    has: every rank runs the same number of forwards.
    """
    if max_new_tokens < 1:
        return inputs["input_ids"].new_zeros((inputs["input_ids"].shape[0], 0))
    ids = inputs["input_ids"]
    mask = inputs.get("attention_mask")
    named, var_keyword = forward_parameters(module)
    by_name = "input_ids" in named or (var_keyword and not named)
    pass_mask = mask is not None and by_name and ("attention_mask" in named or not named)
    pass_positions = mask is not None and "position_ids" in named
    cache_keyword = _cache_keyword(module)
    if mask is None:
        mask = torch.ones_like(ids)
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    new_tokens: list[Tensor] = []
    sequence, step_input, cache = ids, ids, None
    for step in range(max_new_tokens):
        kwargs: dict[str, Any] = {}
        if pass_mask:
            kwargs["attention_mask"] = mask
        if pass_positions:
            positions = (mask.long().cumsum(dim=1) - 1).clamp_(min=0)
            kwargs["position_ids"] = positions[:, -step_input.shape[1] :]
        if cache_keyword is not None:
            kwargs["use_cache"] = True
            if cache is not None:
                kwargs[cache_keyword] = cache
        output = module(input_ids=step_input, **kwargs) if by_name else module(step_input)
        logits = model_logits(output)[:, -1]
        if cache_keyword is not None:
            cache = _returned_cache(output, cache_keyword)
            if cache is None:  # the module took the keyword but keeps no cache: re-read
                cache_keyword = None
        if do_sample:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            token = logits.argmax(dim=-1)
        token = torch.where(finished, pad_token_id, token)
        new_tokens.append(token)
        if eos_token_id is not None:
            finished |= token == eos_token_id
        sequence = torch.cat([sequence, token[:, None]], dim=1)
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        step_input = token[:, None] if cache_keyword is not None else sequence
        if step + 1 == max_new_tokens:
            break
        active = eos_token_id is None or not bool(finished.all())
        if sync is not None:
            active = sync(active)
        if not active:
            break
    return torch.stack(new_tokens, dim=1)


def generate_decode(
    module: nn.Module,
    inputs: Mapping[str, Tensor],
    *,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    pad_token_id: int = 0,
    sync: Sync | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """The new tokens ``[N, L]`` of the module's own Hugging Face ``generate(**inputs,
    max_new_tokens=..., do_sample=..., pad_token_id=..., eos_token_id=...)`` (the prompt, or an
    encoder-decoder model's decoder start token, cut off). With ``sync`` (several processes)
    ``synced_gpus=True``: ``generate`` then runs its own per-step done-flag all-reduce through
    ``torch.distributed``. Sampling draws from the global RNG, which
    `GenerationScorer` seeds per cell (``generator`` is not used)."""
    options: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "do_sample": do_sample,
        "pad_token_id": pad_token_id,
    }
    if eos_token_id is not None:
        options["eos_token_id"] = eos_token_id
    if do_sample:
        options["temperature"] = temperature
    if sync is not None:
        options["synced_gpus"] = True
    output = module.generate(**inputs, **options)  # type: ignore[operator]
    sequences = output if isinstance(output, Tensor) else output.sequences
    config = getattr(module, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return sequences[:, 1:]
    return sequences[:, inputs["input_ids"].shape[1] :]


def _auto_decoder(module: nn.Module) -> Decoder:
    return generate_decode if callable(getattr(module, "generate", None)) else greedy_decode


def prompt_inputs(batch: Any) -> dict[str, Tensor]:
    """The prompt of a batch: a mapping's ``prompt_*`` keys with the prefix removed
    (``prompt_input_ids`` -> ``input_ids``, ``prompt_attention_mask`` -> ``attention_mask``),
    else its ``input_ids`` and ``attention_mask``; a tuple batch's first element as
    ``input_ids``."""
    if isinstance(batch, Mapping):
        prompt = {k[len("prompt_") :]: v for k, v in batch.items() if str(k).startswith("prompt_")}
        if not prompt:
            prompt = {k: batch[k] for k in ("input_ids", "attention_mask") if k in batch}
        if "input_ids" not in prompt:
            raise EvaluationError(
                "a generation batch needs prompt token ids: 'prompt_input_ids' (with "
                "'prompt_attention_mask'), or 'input_ids' when the whole input is the prompt; "
                f"this batch has the keys {sorted(map(str, batch))}"
            )
        return prompt
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], Tensor):
        return {"input_ids": batch[0]}
    raise EvaluationError(
        f"cannot read a prompt from a batch of type {type(batch).__name__}; pass a mapping with "
        "'prompt_input_ids' or 'input_ids', or give the scorer `inputs=`"
    )


def cell_seed(seed: int, stage: int | None, task: int, rank: int = 0) -> int:
    """The sampling seed of one cell: the first 63 bits of ``blake2b("seed/stage/task/rank")``
    (stable across processes and Python versions; ``stage`` ``None`` is written ``none``)."""
    text = f"{seed}/{'none' if stage is None else stage}/{task}/{rank}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


@dataclass(frozen=True)
class GenerationRecord:
    """One scored item: its index (the batch's ``index`` entry when the batch has one, else its
    position among this rank's items of the task), the generated text, the reference, the
    score."""

    index: int
    prediction: str
    reference: str
    score: float


_NOT_FINITE_SCORE = "the text metric returned {n} non-finite scores"


class GenerationScorer:
    """The mean over a task's items of a text metric of the decoded continuation against the
    reference: `\\frac{1}{N}\\sum_n m(\\text{decode}(g_n), r_n)`, free-running.

    Per batch: the prompt (``inputs(batch)``, default `prompt_inputs`) is decoded
    (``decoder``, see the module docstring), each row's new tokens are cut at its first
    ``eos_token_id`` (exclusive) and passed, as a list of token-id lists, to ``decode`` (a
    tokenizer's ``batch_decode`` fits), which returns one text per row; the texts are scored
    against ``references(batch)`` (default: the batch's ``"references"``: a list of ``str``, or
    token ids ``[N, L]`` whose ``-100`` and ``pad_token_id`` entries are dropped before
    ``decode``) with ``metric``.

    Args:
        decode: ``list[list[int]] -> list[str]``.
        metric: ``"exact_match"``, ``"token_f1"``, ``"rouge_l"``, ``"edit_similarity"`` (see
            `text_metrics`) or a callable ``(predictions,
            references) -> per-item scores``.
        max_new_tokens: most tokens decoded per prompt.
        eos_token_id: the token that ends a continuation (``None``: always ``max_new_tokens``).
        pad_token_id: what finished rows receive, and the prompt of a rank with nothing to
            decode under synced decoding.
        decoder: ``"auto"``, ``"greedy"`` (`greedy_decode`), ``"generate"``
            (`generate_decode`) or a callable with `greedy_decode`'s signature (which
            must call ``sync`` once per step as it does, when given).
        do_sample, temperature, seed: sampling instead of argmax; needs ``seed``, and each
            cell draws from `cell_seed` ``(seed, stage, task, rank)``.
        name: the score's name (default: the metric's name).
        bounds: the score's range; default ``(0, 1)`` for the built-in metrics, ``None`` for a
            callable.
        inputs, references: read a batch's prompt and references.
        record_items: keep the first ``record_items`` items of each task on this rank as
            `GenerationRecord` in `records_by_task` (``-1``: all; ``0``: none).

    Count-based (exact under DDP: per-item score sums and item counts are summed). Under several
    processes decoding is synced (module docstring); the loop's ``all_reduce`` must be given.
    """

    higher_is_better = True
    count_based = True
    #: the loop hands this scorer the module and the raw batch (see the Scorer protocol)
    needs_batch = True
    #: what results.json records of how the score was produced
    scoring = "free-running"
    target_problems = (_NOT_FINITE_SCORE,)
    #: per-item records (``evaluate_tasks(item_scorers=...)``): set by the loop
    keep_items = False

    def __init__(
        self,
        decode: Callable[[list[list[int]]], Sequence[str]],
        metric: str | Callable[[Sequence[str], Sequence[str]], Any] = "exact_match",
        *,
        max_new_tokens: int = 32,
        eos_token_id: int | None = None,
        pad_token_id: int = 0,
        decoder: str | Decoder = "auto",
        do_sample: bool = False,
        temperature: float = 1.0,
        seed: int | None = None,
        name: str | None = None,
        bounds: tuple[float, float] | str | None = "auto",
        inputs: Callable[[Any], Mapping[str, Tensor]] = prompt_inputs,
        references: str | Callable[[Any], Sequence[str]] = "references",
        record_items: int = 0,
    ) -> None:
        if not callable(decode):
            raise TypeError(
                f"decode must be a callable list[list[int]] -> list[str], got {decode!r}"
            )
        if isinstance(metric, str):
            if metric not in TEXT_METRICS:
                raise ValueError(f"unknown text metric {metric!r}; known: {sorted(TEXT_METRICS)}")
            self._metric = TEXT_METRICS[metric]
            metric_name = metric
        elif callable(metric):
            self._metric = metric
            metric_name = getattr(metric, "__name__", "generation")
        else:
            raise TypeError(f"metric must be a name or a callable, got {metric!r}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if isinstance(decoder, str) and decoder not in ("auto", "greedy", "generate"):
            raise ValueError(
                f"decoder must be 'auto', 'greedy', 'generate' or a callable, got {decoder!r}"
            )
        if not isinstance(decoder, str) and not callable(decoder):
            raise TypeError(
                f"decoder must be 'auto', 'greedy', 'generate' or a callable, got {decoder!r}"
            )
        if do_sample and seed is None:
            raise ValueError(
                "do_sample=True needs a seed (each cell then draws from its own seed); greedy "
                "decoding (the default) is deterministic"
            )
        if isinstance(record_items, bool) or not isinstance(record_items, int) or record_items < -1:
            raise ValueError(
                f"record_items must be -1 (all), 0 or a positive int, got {record_items!r}"
            )
        self.decode = decode
        self.metric_name = metric_name
        #: exact match scores each item 0 or 1 (recorded as bits); the other metrics as floats
        self.items_binary = metric_name == "exact_match" and isinstance(metric, str)
        self.name = name if name is not None else metric_name
        if bounds == "auto":
            bounds = (0.0, 1.0) if isinstance(metric, str) else None
        self.bounds: tuple[float, float] | None = bounds  # type: ignore[assignment]
        self.max_new_tokens = max_new_tokens
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.decoder = decoder
        self.do_sample = do_sample
        self.temperature = temperature
        self.seed = seed
        self.inputs = inputs
        self.references = references
        self.record_items = record_items
        #: per task id: the items kept (``record_items``) at its last evaluation on this rank
        self.records_by_task: dict[int, list[GenerationRecord]] = {}
        #: per ``(stage, task)``: the sampling seed the cell drew from (``do_sample`` only)
        self.cell_seeds: dict[tuple[int | None, int], int] = {}
        self._task: int | None = None
        self._stage: int | None = None
        self._records: list[GenerationRecord] = []  # this task's, in records_by_task

    @property
    def decoding(self) -> dict[str, Any]:
        """How the scores were produced, for results.json: ``scoring``, the decoding strategy
        (``"greedy"``/``"sample"``), ``max_new_tokens``, the metric, and for sampling the
        ``seed`` and ``temperature`` (each cell's seed: `cell_seeds`)."""
        out: dict[str, Any] = {
            "scoring": self.scoring,
            "strategy": "sample" if self.do_sample else "greedy",
            "max_new_tokens": self.max_new_tokens,
            "metric": self.metric_name,
        }
        if self.do_sample:
            out.update(seed=self.seed, temperature=self.temperature)
        return out

    def set_task(self, task_id: int, stage: int | None = None) -> None:
        """The task (and stage: ``-1`` the baseline, ``None`` when not tied to one) about to be
        scored: which records to keep and which cell seed to draw from."""
        self._task, self._stage = task_id, stage
        self._records = []
        self.records_by_task[task_id] = self._records
        self._seeded = False

    def start(self, device: torch.device) -> None:
        self._device = device
        self._sums: list[Tensor] = []
        self._nonfinite: list[Tensor] = []
        self._items = 0
        self._item_scores: list[Tensor] = []
        self._records = []
        self._replay: dict[str, Tensor] | None = None
        self._generator: torch.Generator | None = None
        self._seeded = False

    def update(self, preds: Tensor, target: Tensor) -> None:
        raise EvaluationError(
            f"{self.name} decodes from the module and the raw batch (needs_batch); the loop "
            "calls update_batch, not update"
        )

    def _resolve_decoder(self, module: nn.Module) -> Decoder:
        if self.decoder == "auto":
            return _auto_decoder(module)
        if self.decoder == "greedy":
            return greedy_decode
        if self.decoder == "generate":
            if not callable(getattr(module, "generate", None)):
                raise EvaluationError(
                    f"{self.name}: decoder='generate' but {type(module).__name__} has no generate"
                )
            return generate_decode
        return self.decoder  # type: ignore[return-value]

    def _seed_cell(self, decoder: Decoder) -> None:
        """Before the task's first decoding: its cell seed, for the generator (greedy_decode)
        or the global RNG (generate, which the loop restores afterwards)."""
        if self._seeded or not self.do_sample:
            return
        self._seeded = True
        assert self.seed is not None
        rank = (
            torch.distributed.get_rank()
            if torch.distributed.is_available() and torch.distributed.is_initialized()
            else 0
        )
        task = -1 if self._task is None else self._task
        seed = cell_seed(self.seed, self._stage, task, rank)
        self.cell_seeds[(self._stage, task)] = seed
        if decoder is generate_decode:
            torch.manual_seed(seed)
        else:
            self._generator = torch.Generator(device=self._device).manual_seed(seed)

    def _run(self, module: nn.Module, inputs: Mapping[str, Tensor], all_reduce: Any) -> Tensor:
        decoder = self._resolve_decoder(module)
        self._seed_cell(decoder)
        sync = None if all_reduce is None else _flag_sync(all_reduce, self._device)
        ids = decoder(
            module,
            inputs,
            max_new_tokens=self.max_new_tokens,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            sync=sync,
            do_sample=self.do_sample,
            temperature=self.temperature,
            generator=self._generator,
        )
        if not isinstance(ids, Tensor) or ids.ndim != 2:
            raise EvaluationError(f"{self.name}: the decoder returned {_what(ids)}, not ids [N, L]")
        return ids

    def update_batch(self, module: nn.Module, batch: Any, all_reduce: Any = None) -> None:
        """Decode, score and count one batch (a handshake round first under several
        processes)."""
        inputs = dict(self.inputs(batch))
        references = self._references(batch)
        rows = inputs["input_ids"].shape[0]
        if len(references) != rows:
            raise EvaluationError(
                f"{self.name}: {len(references)} references for {rows} prompts in a batch"
            )
        if all_reduce is not None:
            _round(all_reduce, 1, self._device)
        self._replay = {k: v[:1] for k, v in inputs.items() if isinstance(v, Tensor)}
        ids = self._run(module, inputs, all_reduce)
        predictions = self._texts(ids, rows)
        scores = self._score(predictions, references)
        self._sums.append(scores.sum())
        if self.keep_items:
            self._item_scores.append(scores)
        self._nonfinite.append((~torch.isfinite(scores)).sum())
        self._keep(batch, predictions, references, scores)
        self._items += rows

    def end_task(self, module: nn.Module, all_reduce: Any = None) -> None:
        """Under several processes: post "no batch" rounds, decoding a replayed prompt (its
        result discarded) while another rank still decodes a batch, until no rank does."""
        if all_reduce is None:
            return
        while _round(all_reduce, 0, self._device) > 0:
            replay = self._replay
            if replay is None:
                pad = torch.full((1, 1), self.pad_token_id, dtype=torch.long, device=self._device)
                replay = {"input_ids": pad, "attention_mask": torch.ones_like(pad)}
            self._run(module, replay, all_reduce)

    def _references(self, batch: Any) -> list[str]:
        if callable(self.references):
            return list(self.references(batch))
        if not isinstance(batch, Mapping) or self.references not in batch:
            keys = sorted(map(str, batch)) if isinstance(batch, Mapping) else type(batch).__name__
            raise EvaluationError(
                f"{self.name}: the batch has no {self.references!r} (references); it has {keys}"
            )
        value = batch[self.references]
        if isinstance(value, Tensor):
            rows = [
                [t for t in row if t != IGNORE_INDEX and t != self.pad_token_id]
                for row in value.tolist()
            ]
            return self._decoded(rows)
        if isinstance(value, str) or not all(isinstance(v, str) for v in value):
            raise EvaluationError(
                f"{self.name}: references must be a list of str or token ids [N, L], got "
                f"{_what(value)}"
            )
        return list(value)

    def _texts(self, ids: Tensor, rows: int) -> list[str]:
        """Each row's tokens up to its first ``eos_token_id``, decoded."""
        if ids.shape[0] != rows:
            raise EvaluationError(
                f"{self.name}: the decoder returned {ids.shape[0]} rows for {rows} prompts"
            )
        token_rows = ids.tolist()
        if self.eos_token_id is not None:
            eos = self.eos_token_id
            token_rows = [row[: row.index(eos)] if eos in row else row for row in token_rows]
        return self._decoded(token_rows)

    def _decoded(self, rows: list[list[int]]) -> list[str]:
        texts = self.decode(rows)
        if isinstance(texts, str) or len(texts) != len(rows):
            raise EvaluationError(
                f"{self.name}: decode returned {_what(texts)} for {len(rows)} token rows; it "
                "must return one str per row"
            )
        return list(texts)

    def _score(self, predictions: list[str], references: list[str]) -> Tensor:
        scores = self._metric(predictions, references)
        scores = torch.as_tensor(scores, dtype=torch.float64).reshape(-1)
        if scores.numel() != len(predictions):
            raise EvaluationError(
                f"{self.name}: the text metric returned {scores.numel()} scores for "
                f"{len(predictions)} items; it must return one score per item"
            )
        return scores

    def _keep(
        self, batch: Any, predictions: list[str], references: list[str], scores: Tensor
    ) -> None:
        if self.record_items == 0:
            return
        room = len(predictions) if self.record_items < 0 else self.record_items - len(self._records)
        if room <= 0:
            return
        index = batch.get("index") if isinstance(batch, Mapping) else None
        indices = (
            [int(i) for i in index.tolist()]
            if isinstance(index, Tensor)
            else list(range(self._items, self._items + len(predictions)))
        )
        values = scores.tolist()
        for k in range(min(room, len(predictions))):
            self._records.append(
                GenerationRecord(indices[k], predictions[k], references[k], values[k])
            )

    def local_items(self) -> Tensor:
        """Each decoded item's score on this rank since `start`, in the order decoded (bool for
        exact match, else float64)."""
        values = (
            torch.cat(self._item_scores)
            if self._item_scores
            else torch.zeros(0, dtype=torch.float64)
        )
        return values != 0 if self.items_binary else values

    def local_counts(self) -> Tensor:
        """``[score_sum, items, non_finite_scores]`` (float64)."""
        dtype = torch.float32 if self._device.type == "mps" else torch.float64

        def total(values: list[Tensor]) -> Tensor:
            if not values:
                return torch.zeros((), dtype=dtype, device=self._device)
            return torch.stack(values).sum().to(device=self._device, dtype=dtype)

        items = torch.tensor(float(self._items), dtype=dtype, device=self._device)
        return torch.stack([total(self._sums), items, total(self._nonfinite)])

    def result(self, reduced_counts: Tensor) -> Tensor:
        sums, items = reduced_counts[:, 0].double(), reduced_counts[:, 1].double()
        empty = items == 0
        if bool(empty.any()):
            err = EvaluationError(f"{self.name}: no item of this task was decoded")
            err.task_row = int(empty.int().argmax())
            raise err
        return sums / items


def _round(all_reduce: Callable[[Tensor], Tensor], value: int, device: torch.device) -> int:
    """One handshake: the sum over ranks of ``value``."""
    return int(all_reduce(torch.tensor([value], dtype=torch.int64, device=device)).item())


def _flag_sync(all_reduce: Callable[[Tensor], Tensor], device: torch.device) -> Sync:
    """``sync(active) -> any rank active``: one sum-reduction of this rank's done flag."""

    def sync(active: bool) -> bool:
        return _round(all_reduce, int(active), device) > 0

    return sync

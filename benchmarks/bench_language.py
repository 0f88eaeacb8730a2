"""Benchmark: language-model scoring against plain loops over the same batches, in one run.

    PYTHONPATH=src python benchmarks/bench_language.py [--repeats 7]

Three parts, each printing medians of interleaved repeats and their ratio:

``perplexity``: ``evaluate_tasks(..., scorers=["perplexity"])`` over padded mapping batches
(-100 labels, other lengths per batch) against a plain loop of forward + ``F.cross_entropy(...,
ignore_index=-100, reduction="sum")`` on the logits' flat view + token count, both under
``inference_mode``; the two
perplexities must agree. Bar: ratio <= 1.1.

``generation``: ``evaluate_tasks`` with a :class:`GenerationScorer` (greedy, KV cache,
exact match) against the same decoding loop without the evaluation machinery
(:func:`greedy_decode`, ``decode``, :func:`exact_match` per batch); the scores must agree. Bar:
ratio <= 1.15.

``memory``: the peak of the bytes allocated (torch's CPU allocator, through the profiler's
memory events) while the perplexity scorer scores one batch's logits, beyond the logits
themselves, in units of one ``[batch, length]`` float32 tensor and of the logits, for the
default chunk and for ``chunk_elements = batch * length``; and the same for
``F.cross_entropy``. Bar: at most one extra ``[batch, length]`` float tensor beyond the logits.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile

from continual_eval.evaluation import evaluate_tasks
from continual_eval.evaluation.generation import GenerationScorer, greedy_decode
from continual_eval.evaluation.language import PerplexityScorer
from continual_eval.evaluation.text_metrics import exact_match
from continual_eval.experiments.language import CharTransformer, decode_text

VOCAB, WIDTH, BATCH, LENGTH, BATCHES = 4096, 128, 16, 64, 8


class CausalLM(nn.Module):
    """Embedding, two causal transformer layers, a vocabulary head: logits ``[N, T, V]``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, 4, 4 * WIDTH, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        t = input_ids.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(t)
        return self.head(self.body(self.embed(input_ids), mask=causal, is_causal=True))


def token_batches() -> list[dict[str, Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for k in range(BATCHES):
        length = LENGTH - 4 * k
        ids = torch.randint(0, VOCAB, (BATCH, length), generator=g)
        lengths = torch.randint(length // 2, length + 1, (BATCH,), generator=g)
        mask = torch.arange(length)[None] < lengths[:, None]
        labels = ids.masked_fill(~mask, -100)
        out.append({"input_ids": ids, "attention_mask": mask.long(), "labels": labels})
    return out


def median_ratio(
    candidate: Callable[[], float], baseline: Callable[[], float], repeats: int
) -> tuple[float, float, float, float, float]:
    """Interleaved timings: (candidate median s, baseline median s, ratio, values)."""
    times: dict[str, list[float]] = {"candidate": [], "baseline": []}
    values = {"candidate": math.nan, "baseline": math.nan}
    fns = {"candidate": candidate, "baseline": baseline}
    candidate(), baseline()  # warm-up
    for k in range(repeats):
        # ABBA order: neither side always runs first
        for key in ("baseline", "candidate") if k % 2 == 0 else ("candidate", "baseline"):
            t = time.perf_counter()
            values[key] = fns[key]()
            times[key].append(time.perf_counter() - t)
    cand, base = times["candidate"], times["baseline"]
    value_c, value_b = values["candidate"], values["baseline"]
    c, b = statistics.median(cand), statistics.median(base)
    return c, b, c / b, value_c, value_b


def perplexity_part(repeats: int) -> None:
    model = CausalLM().eval()
    batches = token_batches()

    def scorer() -> float:
        return float(evaluate_tasks(model, [batches], [0], scorers=["perplexity"]).scores[0])

    def plain() -> float:
        total = torch.zeros((), dtype=torch.float64)
        tokens = 0
        with torch.inference_mode():
            for b in batches:
                logits = model(b["input_ids"], b["attention_mask"])
                labels = b["labels"]
                # position t against label t + 1; the last position against -100 (a view of
                # the logits, no copy)
                target = torch.cat([labels[:, 1:], labels.new_full((len(labels), 1), -100)], 1)
                total += F.cross_entropy(
                    logits.reshape(-1, VOCAB),
                    target.reshape(-1),
                    ignore_index=-100,
                    reduction="sum",
                ).double()
                tokens += int((target != -100).sum())
        return math.exp(float(total) / tokens)

    c, b, ratio, vc, vb = median_ratio(scorer, plain, repeats)
    assert math.isclose(vc, vb, rel_tol=1e-5), (vc, vb)
    print(
        f"| perplexity of a stage ({BATCHES} batches [{BATCH}, <={LENGTH}], V={VOCAB}) "
        f"| {c * 1e3:.1f} ms | {b * 1e3:.1f} ms | {ratio:.3f} | <= 1.1 |"
    )


def generation_part(repeats: int) -> None:
    torch.manual_seed(0)
    model = CharTransformer(width=64, layers=2, heads=4, max_length=64).eval()
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(4):
        lengths = torch.randint(4, 9, (16,), generator=g)
        width = int(lengths.max())
        ids = torch.randint(3, 25, (16, width), generator=g)
        mask = torch.arange(width)[None] >= (width - lengths)[:, None]  # left padding
        ids = ids.masked_fill(~mask, 0)
        refs = decode_text(torch.randint(3, 25, (16, 5), generator=g).tolist())
        batches.append(
            {"prompt_input_ids": ids, "prompt_attention_mask": mask.long(), "references": refs}
        )
    options = {"max_new_tokens": 16, "eos_token_id": None, "pad_token_id": 0}
    gen = GenerationScorer(decode_text, "exact_match", **options)

    def scorer() -> float:
        return float(evaluate_tasks(model, [batches], [0], scorers=[gen]).scores[0])

    def plain() -> float:
        hits, n = 0.0, 0
        with torch.inference_mode():
            for b in batches:
                new = greedy_decode(
                    model,
                    {
                        "input_ids": b["prompt_input_ids"],
                        "attention_mask": b["prompt_attention_mask"],
                    },
                    **options,
                )
                texts = decode_text(new.tolist())
                hits += float(exact_match(texts, b["references"]).sum())
                n += len(texts)
        return hits / n

    c, b, ratio, vc, vb = median_ratio(scorer, plain, repeats)
    assert vc == vb, (vc, vb)
    print(
        f"| generation of a stage (4 batches of 16 prompts, 16 new tokens, KV cache) "
        f"| {c * 1e3:.1f} ms | {b * 1e3:.1f} ms | {ratio:.3f} | <= 1.15 |"
    )


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak of the bytes allocated (minus freed) by torch's CPU allocator while ``fn`` runs."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()  # type: ignore[union-attr]
        if e.name() == "[memory]"
    )
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


def memory_part() -> None:
    g = torch.Generator().manual_seed(0)
    b, t, v = BATCH, LENGTH, VOCAB
    logits = torch.randn(b, t, v, generator=g)  # what the model returned
    labels = torch.randint(0, v, (b, t), generator=g)
    labels[:, t // 2 :] = -100
    row = b * t * 4  # one [batch, length] float32 tensor
    print(
        f"\nlogits [{b}, {t}, {v}] float32: {logits.nbytes / 2**20:.1f} MiB; one [batch, "
        f"length] float32 tensor: {row / 2**10:.0f} KiB\n"
    )
    print("| peak allocation beyond the logits | bytes | x [batch, length] float32 | x logits |")
    print("|---|---|---|---|")
    cases = {
        "perplexity scorer, default chunk (max(2**20, logits / 64))": PerplexityScorer(),
        f"perplexity scorer, chunk_elements = batch * length = {b * t}": PerplexityScorer(
            chunk_elements=b * t
        ),
    }
    for label, scorer in cases.items():
        scorer.start(torch.device("cpu"))
        preds = logits.transpose(1, 2)

        def run(s: PerplexityScorer = scorer, p: Tensor = preds) -> None:
            s.update(p, labels)
            s.local_counts()

        run()  # warm-up
        scorer.start(torch.device("cpu"))
        peak = peak_bytes(run)
        print(f"| {label} | {peak} | {peak / row:.2f} | {peak / logits.nbytes:.3f} |")
    peak = peak_bytes(
        lambda: F.cross_entropy(
            logits[:, :-1].reshape(-1, v), labels[:, 1:].reshape(-1), reduction="sum"
        )
    )
    print(
        f"| plain F.cross_entropy (for comparison) | {peak} | {peak / row:.2f} | "
        f"{peak / logits.nbytes:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("| part | continual-eval (median) | plain loop (median) | ratio | bar |")
    print("|---|---|---|---|---|")
    perplexity_part(args.repeats)
    generation_part(args.repeats)
    memory_part()


if __name__ == "__main__":
    main()

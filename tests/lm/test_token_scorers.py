"""Token scorers (perplexity, token NLL, token accuracy) against a plain per-position loop, on
padded mapping batches with -100 labels and sequences of different lengths; the mapping-batch
step (tensor, mapping and attribute outputs, a real Hugging Face model); their errors."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from lm_helpers import PAD, VOCAB, TinyCausalLM, collate, plain_token_counts, sequences
from torch import Tensor
from torch.utils.data import DataLoader

from continual_eval.evaluation import EvaluationError, evaluate_tasks, make_scorer
from continual_eval.evaluation.language import (
    PerplexityScorer,
    TokenAccuracyScorer,
    TokenNLLScorer,
    sequence_token_correct,
    sequence_token_nll,
)
from continual_eval.evaluation.step import mapping_batch_step

TASK_SEEDS = (1, 2, 3)
TASK_SIZES = (13, 7, 10)


def task_sets() -> list[list[Tensor]]:
    return [sequences(seed, n) for seed, n in zip(TASK_SEEDS, TASK_SIZES, strict=True)]


def loaders(sets: list[list[Tensor]], batch_size: int = 4, prompt: int = 1) -> list[DataLoader]:
    return [
        DataLoader(s, batch_size=batch_size, collate_fn=partial(collate, prompt=prompt))
        for s in sets
    ]


@pytest.fixture
def model64() -> TinyCausalLM:
    return TinyCausalLM().double()


def test_perplexity_nll_accuracy_equal_a_plain_loop_token_by_token(model64):
    sets = task_sets()
    result = evaluate_tasks(
        model64,
        loaders(sets),
        range(len(sets)),
        scorers=["perplexity", "token_nll", "token_accuracy"],
    )
    assert result.scorer_names == ("perplexity", "token_nll", "token_accuracy")
    ppl, nll, acc = result.scores_by_scorer
    for k, seqs in enumerate(sets):
        ref_nll, ref_tokens, ref_correct = plain_token_counts(model64, seqs)
        assert int(result.total[k]) == ref_tokens  # exact token counts (the first scorer's)
        assert ref_tokens == sum(len(s) - 1 for s in seqs)
        assert float(nll[k]) == pytest.approx(ref_nll / ref_tokens, rel=1e-13, abs=0)
        assert float(ppl[k]) == pytest.approx(math.exp(ref_nll / ref_tokens), rel=1e-12)
        assert float(acc[k]) == ref_correct / ref_tokens


def test_prompt_tokens_and_batching_do_not_change_the_token_weighted_mean(model64):
    sets = task_sets()
    one = evaluate_tasks(
        model64, loaders(sets, batch_size=1, prompt=3), range(3), scorers=["token_nll"]
    )
    many = evaluate_tasks(
        model64, loaders(sets, batch_size=5, prompt=3), range(3), scorers=["token_nll"]
    )
    for k, seqs in enumerate(sets):
        ref_nll, ref_tokens, _ = plain_token_counts(model64, seqs, prompt=3)
        assert int(one.total[k]) == int(many.total[k]) == ref_tokens
        assert float(one.scores[k]) == pytest.approx(ref_nll / ref_tokens, rel=1e-13)
        assert float(many.scores[k]) == pytest.approx(ref_nll / ref_tokens, rel=1e-13)
    # a mean of per-sequence means would weigh the short sequences more: not what is computed
    per_seq = []
    for seq in sets[0]:
        n, t, _ = plain_token_counts(model64, [seq], prompt=3)
        if t:
            per_seq.append(n / t)
    assert float(many.scores[0]) != pytest.approx(sum(per_seq) / len(per_seq), rel=1e-6)


def test_unshifted_labels_score_each_position_against_its_own_label(model64):
    seqs = task_sets()[0]
    batch = collate(seqs)
    with torch.no_grad():
        logits = model64(batch["input_ids"]).transpose(1, 2)
    nll, tokens = sequence_token_nll(logits, batch["labels"], shift=False)
    correct, tokens2 = sequence_token_correct(logits, batch["labels"], shift=False)
    ref_nll, ref_tokens, ref_correct = plain_token_counts(model64, seqs, shift=False)
    assert int(tokens.sum()) == int(tokens2.sum()) == ref_tokens == sum(len(s) - 1 for s in seqs)
    assert float(nll.sum()) == pytest.approx(ref_nll, rel=1e-13)
    assert int(correct.sum()) == ref_correct
    scorer = TokenNLLScorer(shift=False)
    scorer.start(torch.device("cpu"))
    scorer.update(logits, batch["labels"])
    counts = scorer.local_counts()
    assert float(scorer.result(counts[None])[0]) == pytest.approx(ref_nll / ref_tokens, rel=1e-13)


@pytest.mark.parametrize("chunk", [1, 7, 11 * 3, 11 * 40, 10**6])
def test_chunks_of_any_size_give_the_same_sums(model64, chunk):
    batch = collate(task_sets()[2])
    logits = model64(batch["input_ids"]).transpose(1, 2)
    whole, tokens = sequence_token_nll(logits, batch["labels"], chunk_elements=10**9)
    chunked, tokens_c = sequence_token_nll(logits, batch["labels"], chunk_elements=chunk)
    assert torch.equal(tokens, tokens_c)
    torch.testing.assert_close(chunked, whole, rtol=1e-14, atol=0)


def peak_allocated(fn) -> int:
    """Peak bytes allocated (minus freed) by torch's CPU allocator while ``fn`` runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
    )
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_full_vocabulary_copy_of_the_logits(dtype):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 64, 1000, generator=g).to(dtype)  # [N, T, V] as a model returns
    labels = torch.randint(0, 1000, (4, 64), generator=g)
    labels[:, 40:] = -100
    full = logits.numel() * 4  # one float32 copy of the logits
    scorer = PerplexityScorer(chunk_elements=4000)
    scorer.start(torch.device("cpu"))
    scorer.update(logits.transpose(1, 2), labels)  # warm-up
    peak = peak_allocated(lambda: scorer.update(logits.transpose(1, 2), labels))
    # the chunk's float32 temporaries (and upcast) plus [N, T]-sized tensors
    assert peak <= 3 * 4000 * 4 + 16 * 4 * 64 * 8, (peak, full)
    assert peak < full / 10
    plain = peak_allocated(
        lambda: torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, 1000).float(), labels[:, 1:].reshape(-1)
        )
    )
    assert plain > full / 2  # what the plain call costs: the bar is not trivially met


def test_half_precision_logits_are_scored_in_float32(model64):
    seqs = task_sets()[0]
    batch = collate(seqs)
    logits = model64(batch["input_ids"]).transpose(1, 2)
    nll, _ = sequence_token_nll(logits.bfloat16(), batch["labels"], chunk_elements=20)
    ref = sequence_token_nll(logits.bfloat16().double(), batch["labels"])[0]
    assert nll.dtype == torch.float64
    # per token float32 arithmetic on the bf16 values: float32 rounding, not bf16's
    torch.testing.assert_close(nll, ref, rtol=1e-5, atol=1e-5)


def test_model_outputs_tensor_mapping_and_attribute_score_the_same():
    sets = task_sets()
    scores = []
    for output in ("tensor", "mapping", "attribute"):
        model = TinyCausalLM(output=output)
        result = evaluate_tasks(model, loaders(sets), range(3), scorers=["ppl", "token_accuracy"])
        scores.append(torch.stack(result.scores_by_scorer))
    assert torch.equal(scores[0], scores[1])
    assert torch.equal(scores[0], scores[2])


def test_mapping_batch_passes_the_keys_forward_names_and_never_the_labels():
    seen: list[set[str]] = []

    class Named(TinyCausalLM):
        def forward(self, input_ids, attention_mask=None, **kwargs):  # type: ignore[override]
            seen.append(
                {"input_ids", *(["attention_mask"] if attention_mask is not None else []), *kwargs}
            )
            return super().forward(input_ids)

    class OnlyKwargs(TinyCausalLM):
        def forward(self, **inputs):  # type: ignore[override]
            seen.append(set(inputs))
            return super().forward(inputs["input_ids"])

    batch = collate(task_sets()[0][:3])
    batch["references"] = ["x", "y", "z"]  # not a parameter: not passed
    batch["prompt_input_ids"] = batch["input_ids"][:, :1]
    logits, target = mapping_batch_step(Named(), batch)
    assert seen[-1] == {"input_ids", "attention_mask"}
    assert target is batch["labels"]
    assert logits.shape == (3, VOCAB, batch["input_ids"].shape[1])  # [N, V, T]
    mapping_batch_step(OnlyKwargs(), batch)
    assert seen[-1] == {"input_ids", "attention_mask", "references", "prompt_input_ids"}


def test_hugging_face_causal_lm_output_is_read_from_its_logits():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=32, pad_token_id=PAD
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    sets = task_sets()
    result = evaluate_tasks(model, loaders(sets), range(3), scorers=["token_nll", "perplexity"])
    for k, seqs in enumerate(sets):
        # reference: the model's own loss (labels passed, mean over the shifted non--100 labels),
        # one sequence at a time, weighted by its token count
        total, tokens = 0.0, 0
        with torch.no_grad():
            for seq in seqs:
                out = model(input_ids=seq[None], labels=seq[None])
                total += float(out.loss.double()) * (len(seq) - 1)
                tokens += len(seq) - 1
        assert int(result.total[k]) == tokens
        assert float(result.scores_by_scorer[0][k]) == pytest.approx(total / tokens, rel=1e-5)
        assert float(result.scores_by_scorer[1][k]) == pytest.approx(
            math.exp(total / tokens), rel=1e-5
        )


def test_make_scorer_strings_directions_and_bounds():
    assert isinstance(make_scorer("perplexity"), PerplexityScorer)
    assert isinstance(make_scorer("PPL"), PerplexityScorer)
    assert isinstance(make_scorer("token_nll"), TokenNLLScorer)
    assert isinstance(make_scorer("token_accuracy"), TokenAccuracyScorer)
    ppl, nll, acc = PerplexityScorer(), TokenNLLScorer(), TokenAccuracyScorer()
    assert (ppl.higher_is_better, ppl.bounds) == (False, (1.0, math.inf))
    assert (nll.higher_is_better, nll.bounds) == (False, (0.0, math.inf))
    assert (acc.higher_is_better, acc.bounds) == (True, (0.0, 1.0))
    with pytest.raises(ValueError, match="perplexity"):
        make_scorer("perplexty")
    with pytest.raises(TypeError, match="shift"):
        PerplexityScorer(shift="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunk_elements"):
        PerplexityScorer(chunk_elements=0)


def test_labels_outside_the_vocabulary_name_the_task():
    sets = task_sets()
    dls = loaders(sets)
    bad = DataLoader(sets[1], batch_size=4, collate_fn=lambda b: _with_label(collate(b), VOCAB))
    # one bad label in each of the task's two batches
    with pytest.raises(EvaluationError, match=r"task_1.*: 2 scored labels lie outside"):
        evaluate_tasks(TinyCausalLM(), [dls[0], bad], range(2), scorers=["ppl", "token_accuracy"])


def _with_label(batch: dict[str, Tensor], value: int) -> dict[str, Tensor]:
    batch["labels"][0, 1] = value
    return batch


def test_every_label_ignored_and_wrong_layouts_are_refused():
    seqs = task_sets()[0]
    ignored = DataLoader(seqs, batch_size=4, collate_fn=partial(collate, prompt=100))
    with pytest.raises(EvaluationError, match=r"task_1.*no token of this task is scored"):
        # a token scorer after the first (the loop itself reports an empty first scorer as a
        # loader without samples)
        evaluate_tasks(
            TinyCausalLM(),
            [*loaders([seqs]), ignored],
            range(2),
            scorers=[_SequenceCount(), "token_nll"],
        )
    batch = collate(seqs[:2])
    logits = TinyCausalLM()(batch["input_ids"])  # [N, T, V], not transposed
    with pytest.raises(EvaluationError, match=r"look like \[N, T, V\].*transpose\(1, 2\)"):
        sequence_token_nll(logits, batch["labels"])
    with pytest.raises(EvaluationError, match="integer token ids"):
        sequence_token_nll(logits.transpose(1, 2), batch["labels"].float())
    with pytest.raises(EvaluationError, match="'labels' key"):
        mapping_batch_step(TinyCausalLM(), {"input_ids": batch["input_ids"]})


class _SequenceCount:
    """A user's scorer counting the sequences (always non-empty here)."""

    name = "sequences"
    higher_is_better = True
    bounds = None
    count_based = True

    def start(self, device: torch.device) -> None:
        self.n = 0

    def update(self, preds: Tensor, target: Tensor) -> None:
        self.n += preds.shape[0]

    def local_counts(self) -> Tensor:
        return torch.tensor([self.n, self.n])

    def result(self, reduced_counts: Tensor) -> Tensor:
        return reduced_counts[:, 0].double()


def test_non_finite_logits_are_reported_after_the_task():
    class Broken(TinyCausalLM):
        def forward(self, input_ids, attention_mask=None):  # type: ignore[override]
            logits = super().forward(input_ids)
            return logits.index_fill(2, torch.tensor([3]), float("nan"))

    with pytest.raises(EvaluationError, match="task_0"):
        evaluate_tasks(Broken(), loaders(task_sets())[:1], [0], scorers=["ppl"])

"""Generation scorer: exact match, ROUGE-L, token F1 and edit similarity against a plain greedy
loop (one prompt at a time, no padding, no cache) and torchmetrics' text metrics; the decoders
(KV cache, Hugging Face generate) against each other; sampling seeds; records; the DDP run with
per-rank stop lengths equal to one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lm_ddp_script import (
    EOS,
    GENERATION_SIZES,
    generation_loaders,
    generation_scorers,
    gpt2,
    token_loaders,
)
from lm_helpers import (
    PAD,
    VOCAB,
    CountingLM,
    TinyCausalLM,
    collate,
    decode_chars,
    left_pad,
    plain_greedy,
    sequences,
)
from torch import Tensor
from torchmetrics.functional.text import edit_distance, rouge_score, squad

from continual_eval.evaluation import EvaluationError, evaluate_tasks
from continual_eval.evaluation.generation import (
    GenerationScorer,
    cell_seed,
    generate_decode,
    greedy_decode,
)
from continual_eval.evaluation.text_metrics import exact_match, normalize_squad
from script_runner import run_script

HERE = Path(__file__).parent
MAX_NEW = 6
STOP = 3  # the end-of-sequence token of the tiny random model's decoding


def prompts(seed: int, n: int) -> list[Tensor]:
    return sequences(seed, n, low=1, high=5)


def decode_words(rows: list[list[int]]) -> list[str]:
    """Token-id rows to text, one word (a letter) per token: ROUGE-L's words are the tokens."""
    return [" ".join(text) for text in decode_chars(rows)]


def generation_batches(
    model, prompt_sets: list[list[Tensor]], batch_size: int = 3, decode=decode_chars
) -> tuple[list[list[dict]], list[list[str]], list[list[str]]]:
    """Left-padded prompt batches whose references are the plain greedy loop's texts, every
    third one with its last token replaced by another letter and every fifth with a letter
    more; returns (loaders as lists of batches, predictions, refs)."""
    loaders, predicted, references = [], [], []
    for ps in prompt_sets:
        texts = [decode([plain_greedy(model, p, MAX_NEW, STOP)])[0] for p in ps]
        refs = [t if k % 3 else decode([[1 + (k % 9)] * 2])[0] + t[3:] for k, t in enumerate(texts)]
        refs = [r if k % 5 else r + decode([[10]])[0] for k, r in enumerate(refs)]
        batches = []
        for start in range(0, len(ps), batch_size):
            ids, mask = left_pad(ps[start : start + batch_size])
            batches.append(
                {
                    "prompt_input_ids": ids,
                    "prompt_attention_mask": mask,
                    "references": refs[start : start + batch_size],
                }
            )
        loaders.append(batches)
        predicted.append(texts)
        references.append(refs)
    return loaders, predicted, references


@pytest.fixture
def tiny():
    model = TinyCausalLM(seed=3)
    sets = [prompts(20, 10), prompts(21, 7)]
    return model, *generation_batches(model, sets)


def test_exact_match_and_rouge_l_equal_a_plain_greedy_loop_and_torchmetrics():
    model = TinyCausalLM(seed=3)
    sets = [prompts(20, 10), prompts(21, 7)]
    loaders, predicted, references = generation_batches(model, sets, decode=decode_words)
    scorers = [
        GenerationScorer(decode_words, metric, max_new_tokens=MAX_NEW, eos_token_id=STOP)
        for metric in ("exact_match", "rouge_l", "token_f1", "edit_similarity")
    ]
    result = evaluate_tasks(model, loaders, range(2), scorers=scorers)
    em, rouge, f1, edit = result.scores_by_scorer
    for k in range(2):
        preds, refs = predicted[k], references[k]
        n = len(preds)
        assert int(result.total[k]) == n
        assert float(em[k]) == sum(p == r for p, r in zip(preds, refs, strict=True)) / n
        ref_rouge = sum(
            float(rouge_score(p, r, rouge_keys="rougeL")["rougeL_fmeasure"])
            for p, r in zip(preds, refs, strict=True)
        )
        assert float(rouge[k]) == pytest.approx(ref_rouge / n, rel=1e-12)
        ref_f1 = sum(
            float(
                squad(
                    [{"prediction_text": p, "id": "q"}],
                    [{"answers": {"answer_start": [0], "text": [r]}, "id": "q"}],
                )["f1"]
            )
            / 100
            for p, r in zip(preds, refs, strict=True)
        )
        assert float(f1[k]) == pytest.approx(ref_f1 / n, rel=1e-12)
        distances = edit_distance(preds, refs, reduction="none").tolist()
        ref_edit = sum(
            1 - d / max(len(p), len(r)) if max(len(p), len(r)) else 1.0
            for d, p, r in zip(distances, preds, refs, strict=True)
        )
        assert float(edit[k]) == pytest.approx(ref_edit / n, rel=1e-12)
    for k in range(2):  # the data tell the metrics apart
        assert 0 < float(em[k]) < float(rouge[k]) < 1
        assert float(edit[k]) not in (float(em[k]), float(rouge[k]))
    assert all(s.scoring == "free-running" for s in scorers)
    assert scorers[0].decoding == {
        "scoring": "free-running",
        "strategy": "greedy",
        "max_new_tokens": MAX_NEW,
        "metric": "exact_match",
    }


def test_exact_match_normalisations():
    preds = [" The cat.", "a b", "x"]
    refs = ["the cat", "a  b ", "x "]
    assert exact_match(preds, refs, normalize="none").tolist() == [0.0, 0.0, 0.0]
    assert exact_match(preds, refs).tolist() == [0.0, 0.0, 1.0]  # strip
    squad_em = [
        float(
            squad(
                [{"prediction_text": p, "id": "q"}],
                [{"answers": {"answer_start": [0], "text": [r]}, "id": "q"}],
            )["exact_match"]
        )
        / 100
        for p, r in zip(preds, refs, strict=True)
    ]
    assert exact_match(preds, refs, normalize="squad").tolist() == squad_em == [1.0, 1.0, 1.0]
    assert normalize_squad(" An  Apple, the pear!") == "apple pear"
    assert exact_match(["AB"], ["ab"], normalize=str.lower).tolist() == [1.0]
    with pytest.raises(ValueError, match="normalize"):
        exact_match(["a"], ["a"], normalize="lower")


def test_kv_cache_loop_and_hugging_face_generate_decode_the_same_tokens():
    model = gpt2()
    if model is None:
        pytest.skip("transformers is not installed")
    ps = prompts(30, 9)
    ids, mask = left_pad(ps)
    inputs = {"input_ids": ids, "attention_mask": mask}
    options = {"max_new_tokens": 7, "eos_token_id": EOS, "pad_token_id": PAD}
    with torch.no_grad():
        cached = greedy_decode(model, inputs, **options)  # GPT-2 takes use_cache and cache
        generated = generate_decode(model, inputs, **options)
        reread = greedy_decode(_NoCache(model), inputs, **options)
    assert torch.equal(cached, generated)
    assert torch.equal(cached, reread)
    for row, p in enumerate(ps):  # and each row equals the prompt decoded alone, unpadded
        alone = plain_greedy(model, p, 7, EOS)
        tokens = cached[row].tolist()
        assert tokens[: len(alone)] == alone


class _NoCache(torch.nn.Module):
    """The model behind a forward without a cache argument (and with position ids)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        )


def test_hugging_face_model_scored_through_its_generate_matches_the_plain_loop():
    model = gpt2()
    if model is None:
        pytest.skip("transformers is not installed")
    sets = [prompts(40, 8), prompts(41, 5)]
    loaders, predicted, references = generation_batches(model, sets)
    scorer = GenerationScorer(
        decode_chars, "exact_match", max_new_tokens=MAX_NEW, eos_token_id=STOP
    )
    result = evaluate_tasks(model, loaders, range(2), scorers=[scorer])
    for k in range(2):
        n = len(predicted[k])
        expected = sum(p == r for p, r in zip(predicted[k], references[k], strict=True)) / n
        assert float(result.scores[k]) == expected


def test_perplexity_and_exact_match_from_one_batch_in_one_evaluation():
    model = TinyCausalLM(seed=3)
    seqs = sequences(50, 8)
    full = collate(seqs)
    ps = [s[:2] for s in seqs]
    ids, mask = left_pad(ps)
    texts = [decode_chars([plain_greedy(model, p, MAX_NEW, STOP)])[0] for p in ps]
    batch = {**full, "prompt_input_ids": ids, "prompt_attention_mask": mask, "references": texts}
    scorers = [
        "perplexity",
        GenerationScorer(decode_chars, max_new_tokens=MAX_NEW, eos_token_id=STOP),
    ]
    both = evaluate_tasks(model, [[batch]], [0], scorers=scorers)
    alone = evaluate_tasks(model, [[full]], [0], scorers=["perplexity"])
    assert torch.equal(both.scores_by_scorer[0], alone.scores)
    assert float(both.scores_by_scorer[1][0]) == 1.0


def test_only_generation_scorers_run_no_teacher_forced_forward():
    model = CountingLM()
    batch = {"prompt_input_ids": torch.tensor([[8], [7]]), "references": ["i", "hi"]}
    scorer = GenerationScorer(decode_chars, max_new_tokens=5, eos_token_id=VOCAB - 1)
    result = evaluate_tasks(model, [[batch]], [0], scorers=[scorer])
    assert float(result.scores[0]) == 1.0
    assert model.calls == 3  # decoding steps only: 2 new tokens, then EOS everywhere


def test_sampling_needs_a_seed_and_each_cell_draws_from_its_own():
    with pytest.raises(ValueError, match="needs a seed"):
        GenerationScorer(decode_chars, do_sample=True)
    model = TinyCausalLM(seed=3)
    loaders, _, _ = generation_batches(model, [prompts(60, 12), prompts(61, 12)])

    def run(seed: int) -> tuple[Tensor, dict]:
        scorer = GenerationScorer(
            decode_chars,
            "edit_similarity",
            max_new_tokens=MAX_NEW,
            do_sample=True,
            temperature=2.0,
            seed=seed,
            record_items=-1,
        )
        rng = torch.get_rng_state()
        result = evaluate_tasks(model, loaders, range(2), scorers=[scorer])
        assert torch.equal(torch.get_rng_state(), rng)  # the global RNG is left as it was
        texts = {t: [r.prediction for r in recs] for t, recs in scorer.records_by_task.items()}
        return result.scores, {"texts": texts, "seeds": dict(scorer.cell_seeds), "scorer": scorer}

    first, a = run(7)
    again, b = run(7)
    _, c = run(8)
    assert torch.equal(first, again) and a["texts"] == b["texts"]
    assert a["texts"] != c["texts"]
    assert a["seeds"] == {(None, 0): cell_seed(7, None, 0), (None, 1): cell_seed(7, None, 1)}
    assert len(set(a["seeds"].values())) == 2
    greedy = GenerationScorer(decode_chars, max_new_tokens=MAX_NEW, record_items=-1)
    evaluate_tasks(model, loaders, range(2), scorers=[greedy])
    assert a["texts"][0] != [r.prediction for r in greedy.records_by_task[0]]
    assert a["scorer"].decoding["strategy"] == "sample"
    assert a["scorer"].decoding["seed"] == 7


def test_records_keep_index_prediction_reference_score_up_to_the_bound(tiny):
    model, loaders, predicted, references = tiny
    scorer = GenerationScorer(
        decode_chars, max_new_tokens=MAX_NEW, eos_token_id=STOP, record_items=4
    )
    evaluate_tasks(model, loaders, range(2), scorers=[scorer])
    for task in range(2):
        records = scorer.records_by_task[task]
        assert [r.index for r in records] == [0, 1, 2, 3]
        assert [r.prediction for r in records] == predicted[task][:4]
        assert [r.reference for r in records] == references[task][:4]
        assert [r.score for r in records] == [
            float(p == r) for p, r in zip(predicted[task][:4], references[task][:4], strict=True)
        ]


def test_generation_scorer_errors_name_the_problem():
    model = CountingLM()
    batch = {"prompt_input_ids": torch.tensor([[8], [7]]), "references": ["i"]}
    with pytest.raises(EvaluationError, match=r"task_0.*1 references for 2 prompts"):
        evaluate_tasks(model, [[batch]], [0], scorers=[GenerationScorer(decode_chars)])
    batch = {"prompt_input_ids": torch.tensor([[8]]), "answers": ["i"]}
    with pytest.raises(EvaluationError, match=r"no 'references'.*answers"):
        evaluate_tasks(model, [[batch]], [0], scorers=[GenerationScorer(decode_chars)])
    batch = {"prompt_input_ids": torch.tensor([[8]]), "references": ["i"]}
    with pytest.raises(EvaluationError, match="one str per row"):
        evaluate_tasks(model, [[batch]], [0], scorers=[GenerationScorer(lambda rows: "i")])
    with pytest.raises(EvaluationError, match="returned 1 scores for 2 items"):
        two = {"prompt_input_ids": torch.tensor([[8], [7]]), "references": ["i", "hi"]}
        evaluate_tasks(
            model,
            [[two]],
            [0],
            scorers=[GenerationScorer(decode_chars, lambda p, r: [1.0], max_new_tokens=3)],
        )
    with pytest.raises(ValueError, match="unknown text metric"):
        GenerationScorer(decode_chars, "bleu")


def test_reference_token_ids_are_decoded_without_ignore_and_pad_entries():
    model = CountingLM()
    batch = {
        "prompt_input_ids": torch.tensor([[8], [7]]),
        "references": torch.tensor([[9, -100, 0], [8, 9, -100]]),
    }
    scorer = GenerationScorer(decode_chars, max_new_tokens=5, eos_token_id=VOCAB - 1)
    result = evaluate_tasks(model, [[batch]], [0], scorers=[scorer])
    assert float(result.scores[0]) == 1.0


@pytest.mark.slow
def test_ddp_synced_decoding_with_per_rank_stop_lengths_equals_one_process(tmp_path):
    proc = run_script(HERE / "lm_ddp_script.py", tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert all(r["world_size"] == 2 for r in ranks)

    # token scorers: other padding on each rank, the same numbers as one process
    assert ranks[0]["token_padding"] != ranks[1]["token_padding"]
    single = evaluate_tasks(
        TinyCausalLM().double(),
        token_loaders(),
        range(2),
        scorers=["perplexity", "token_nll", "token_accuracy"],
    )
    for r in ranks:
        assert torch.equal(r["token_total"], single.total)
        for got, want in zip(r["token_scores"], single.scores_by_scorer, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-14, atol=0)

    # synced decoding: per-rank stop lengths (1 vs 8 new tokens), unequal batch counts (task 0:
    # 2 vs 1 batches), an unsharded task only rank 0 decodes; equal forwards on both ranks
    assert ranks[0]["counting_batches"] == [2, 2] and ranks[1]["counting_batches"] == [1, 2]
    assert ranks[0]["counting_forwards"] == ranks[1]["counting_forwards"]
    loaders = generation_loaders()
    for task in range(3):
        alone = evaluate_tasks(
            CountingLM(), loaders, [task], scorers=generation_scorers(), item_scorers=[0, 1]
        )
        for r in ranks:
            assert r[f"counting_scores_{task}"] == tuple(alone.scores_by_scorer)
            # per-item records (exact match bits, edit similarity floats) in test-set order,
            # gathered across the odd shards (task 2: unsharded, rank 0 alone) as one process
            for got, want in zip(r[f"counting_items_{task}"], alone.items_by_scorer, strict=True):
                assert [t.dtype for t in got] == [t.dtype for t in want]
                assert [t.tolist() for t in got] == [t.tolist() for t in want]
        em = alone.items_by_scorer[0][0]
        assert len(em) == GENERATION_SIZES[task] and float(em.double().mean()) == pytest.approx(
            float(alone.scores_by_scorer[0][0])
        )
    if "gpt2_scores" in ranks[0]:  # Hugging Face generate with synced_gpus
        assert ranks[0]["gpt2_forwards"] == ranks[1]["gpt2_forwards"]
        alone = evaluate_tasks(
            gpt2(), loaders[:2], range(2), scorers=generation_scorers(), item_scorers=[0, 1]
        )
        for r in ranks:
            for got, want in zip(r["gpt2_scores"], alone.scores_by_scorer, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
            for got, want in zip(r["gpt2_items"], alone.items_by_scorer, strict=True):
                for g, w in zip(got, want, strict=True):
                    assert g.dtype == w.dtype
                    torch.testing.assert_close(g, w, rtol=1e-12, atol=0)


def test_single_process_decoding_stops_when_every_sequence_is_done():
    model = CountingLM()
    out = greedy_decode(
        model,
        {"input_ids": torch.tensor([[8], [5]])},
        max_new_tokens=20,
        eos_token_id=VOCAB - 1,
        pad_token_id=PAD,
    )
    assert out.tolist() == [[9, 10, 0, 0, 0], [6, 7, 8, 9, 10]]
    assert model.calls == 5
    flags: list[bool] = []

    def sync(active: bool) -> bool:  # another rank keeps going for 3 more steps
        flags.append(active)
        return len(flags) < 7

    model.calls = 0
    out = greedy_decode(
        model,
        {"input_ids": torch.tensor([[8]])},
        max_new_tokens=20,
        eos_token_id=VOCAB - 1,
        sync=sync,
    )
    assert out.tolist() == [[9, 10, 0, 0, 0, 0, 0]]
    assert flags == [True, False, False, False, False, False, False]
    assert model.calls == 7


@pytest.mark.slow
def test_callback_under_ddp_records_the_single_process_scores_of_its_weights(lm_callback_ddp_run):
    import json

    from lm_callback_ddp_script import model, scorers, test_loaders

    tmp_path = lm_callback_ddp_run
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    loaders = test_loaders()
    for row, weights in [(None, "weights_baseline.pt"), (0, "weights_0.pt"), (1, "weights_1.pt")]:
        net = model()
        net.load_state_dict(torch.load(tmp_path / weights))
        alone = evaluate_tasks(net, loaders, range(2), scorers=list(scorers().values()))
        for name, scores in zip(("em", "ppl", "edit"), alone.scores_by_scorer, strict=True):
            matrix = results["matrices"][name]
            recorded = matrix["baseline"] if row is None else matrix["scores"][row]
            if name == "em":  # a count of exact matches over the item count: exactly
                assert recorded == scores.tolist(), (name, row)
            elif name == "edit":  # float64 sums of per-item scores, in another order
                assert recorded == pytest.approx(scores.tolist(), rel=1e-12), (name, row)
            else:  # a float32 model's logits differ in rounding with the batch's other items
                assert recorded == pytest.approx(scores.tolist(), rel=1e-6), (name, row)
    edit = results["matrices"]["edit"]["scores"]
    # the scorers saw real decoding: partly right continuations, other on every cell
    assert all(0 < v < 1 for v in edit[0] + edit[1]) and len(set(edit[0] + edit[1])) == 4

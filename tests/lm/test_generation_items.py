"""Per-item records of the generation scorer (``evaluate_tasks(item_scorers=...)``): each
prompt's exact match (bits) and edit similarity (floats) in test-set order equal a plain greedy
loop's, one prompt at a time."""

from __future__ import annotations

import torch
from lm_helpers import TinyCausalLM, decode_chars
from test_generation import MAX_NEW, STOP, generation_batches, prompts
from torchmetrics.functional.text import edit_distance

from continual_eval.evaluation import evaluate_tasks
from continual_eval.evaluation.generation import GenerationScorer


def test_generation_items_equal_a_plain_greedy_loop():
    model = TinyCausalLM(seed=3)
    loaders, predicted, references = generation_batches(model, [prompts(20, 10), prompts(21, 7)])
    scorers = [
        GenerationScorer(decode_chars, metric, max_new_tokens=MAX_NEW, eos_token_id=STOP)
        for metric in ("exact_match", "edit_similarity")
    ]
    result = evaluate_tasks(model, loaders, range(2), scorers=scorers, item_scorers=[0, 1])
    em, edit = result.items_by_scorer
    for k in range(2):
        preds, refs = predicted[k], references[k]
        assert em[k].dtype == torch.bool
        assert em[k].tolist() == [p == r for p, r in zip(preds, refs, strict=True)]
        distances = edit_distance(preds, refs, reduction="none").tolist()
        expected = [
            1 - d / max(len(p), len(r)) if max(len(p), len(r)) else 1.0
            for d, p, r in zip(distances, preds, refs, strict=True)
        ]
        assert edit[k].dtype == torch.float64
        torch.testing.assert_close(edit[k], torch.tensor(expected, dtype=torch.float64))
        assert float(em[k].double().mean()) == float(result.scores_by_scorer[0][k])
    assert 0 < float(em[0].double().mean()) < 1  # the data have both kinds of items

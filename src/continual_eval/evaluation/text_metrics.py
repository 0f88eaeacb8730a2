r"""Per-item text metrics of generated text against references: each takes the predictions and the
references (two equally long sequences of ``str``) and returns one float64 score per item, in
``[0, 1]``, higher is better. `GenerationScorer`
takes their mean over a task's items.

* `exact_match`: 1 when the two texts are equal after a normalisation (default
  ``"strip"``: surrounding whitespace removed, nothing else changed);
* `token_f1`: SQuAD's token F1 (Rajpurkar et al., "SQuAD: 100,000+ Questions for Machine
  Comprehension of Text"), torchmetrics' ``squad``: texts lower-cased, punctuation and the
  articles a/an/the removed, split on whitespace; the F1 of the bag-of-tokens overlap;
* `rouge_l`: the ROUGE-L F-measure (Lin, "ROUGE: A Package for Automatic Evaluation of
  Summaries"), the longest common subsequence of words, torchmetrics' ``rouge_score``;
* `edit_similarity`: `1 - d(p, r) / \max(|p|, |r|)` with `d` the character
  Levenshtein distance (torchmetrics' ``edit_distance``), 1 for two empty texts (the "edit
  similarity" of code-completion benchmarks and TRACE, Wang et al., "TRACE: A Comprehensive
  Benchmark for Continual Learning in Large Language Models").

torchmetrics' text functions are called one item at a time where they only return a batch mean
(``squad``, ``rouge_score``), so that each item keeps its own score.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = [
    "TEXT_METRICS",
    "TextMetric",
    "edit_similarity",
    "exact_match",
    "normalize_squad",
    "rouge_l",
    "token_f1",
]

#: ``(predictions, references) -> [items] float64`` scores
TextMetric = Callable[[Sequence[str], Sequence[str]], Tensor]


def _check(preds: Sequence[str], refs: Sequence[str]) -> None:
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions for {len(refs)} references")
    for kind, texts in (("prediction", preds), ("reference", refs)):
        for k, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"{kind} {k} is a {type(text).__name__}, not a str")


def normalize_squad(text: str) -> str:
    """SQuAD's answer normalisation: lower case, punctuation removed, the articles ``a``,
    ``an``, ``the`` removed, whitespace collapsed to single spaces (the official evaluation
    script's ``normalize_answer``)."""
    import re
    import string

    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


_NORMALIZERS: dict[str, Callable[[str], str]] = {
    "none": lambda text: text,
    "strip": str.strip,
    "squad": normalize_squad,
}


def exact_match(
    preds: Sequence[str], refs: Sequence[str], normalize: str | Callable[[str], str] = "strip"
) -> Tensor:
    """1.0 where ``normalize(pred) == normalize(ref)``, else 0.0 (float64 ``[items]``).

    ``normalize``: ``"strip"`` (default; surrounding whitespace removed), ``"none"`` (the
    texts as they are), ``"squad"`` (`normalize_squad`) or a callable ``str -> str``.
    """
    _check(preds, refs)
    norm = _NORMALIZERS.get(normalize) if isinstance(normalize, str) else normalize
    if norm is None or not callable(norm):
        raise ValueError(
            f"normalize must be one of {sorted(_NORMALIZERS)} or a callable str -> str, got "
            f"{normalize!r}"
        )
    return torch.tensor(
        [float(norm(p) == norm(r)) for p, r in zip(preds, refs, strict=True)],
        dtype=torch.float64,
    )


def token_f1(preds: Sequence[str], refs: Sequence[str]) -> Tensor:
    """SQuAD token F1 per item (torchmetrics ``squad``'s ``f1`` / 100), float64 ``[items]``."""
    from torchmetrics.functional.text import squad

    _check(preds, refs)
    scores = [
        float(
            squad(
                [{"prediction_text": p, "id": "0"}],
                [{"answers": {"answer_start": [0], "text": [r]}, "id": "0"}],
            )["f1"]
        )
        / 100.0
        for p, r in zip(preds, refs, strict=True)
    ]
    return torch.tensor(scores, dtype=torch.float64)


def rouge_l(
    preds: Sequence[str],
    refs: Sequence[str],
    tokenizer: Callable[[str], Sequence[str]] | None = None,
) -> Tensor:
    """ROUGE-L F-measure per item (torchmetrics ``rouge_score(..., rouge_keys="rougeL")``),
    float64 ``[items]``. ``tokenizer``: torchmetrics' (default: lower case, non-alphanumeric
    characters to spaces, split on whitespace), or a callable ``str -> list[str]`` (e.g.
    ``list`` for characters)."""
    from torchmetrics.functional.text import rouge_score

    _check(preds, refs)
    scores = [
        float(rouge_score(p, r, rouge_keys="rougeL", tokenizer=tokenizer)["rougeL_fmeasure"])
        for p, r in zip(preds, refs, strict=True)
    ]
    return torch.tensor(scores, dtype=torch.float64)


def edit_similarity(preds: Sequence[str], refs: Sequence[str]) -> Tensor:
    """``1 - levenshtein(pred, ref) / max(len(pred), len(ref))`` per item (characters;
    torchmetrics ``edit_distance``), 1.0 when both are empty; float64 ``[items]``."""
    from torchmetrics.functional.text import edit_distance

    _check(preds, refs)
    if not preds:
        return torch.zeros(0, dtype=torch.float64)
    distance = edit_distance(list(preds), list(refs), reduction="none").double().reshape(-1)
    longest = torch.tensor(
        [max(len(p), len(r)) for p, r in zip(preds, refs, strict=True)], dtype=torch.float64
    )
    return torch.where(longest > 0, 1.0 - distance / longest.clamp(min=1), 1.0)


#: the names `GenerationScorer` accepts
TEXT_METRICS: dict[str, TextMetric] = {
    "exact_match": exact_match,
    "token_f1": token_f1,
    "rouge_l": rouge_l,
    "edit_similarity": edit_similarity,
}

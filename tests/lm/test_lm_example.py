"""The language-model example: its tokenizer and batches, its transformer's KV cache against
re-reading the sequence, and ``continual-eval fit --config configs/lm_char_tasks.yaml`` end to
end (forgetting visible in the exact-match and the perplexity matrices)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from continual_eval.cli import main as continual_eval
from continual_eval.evaluation.generation import greedy_decode
from continual_eval.experiments.language import (
    TOKENIZER,
    CharTransformer,
    SyntheticTextTasks,
    collate,
    make_items,
)
from continual_eval.report import write_report

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "lm_char_tasks.yaml"


def test_items_tokenizer_and_batches():
    g = torch.Generator().manual_seed(0)
    copy, reverse, add = (make_items(task, 50, g) for task in ("copy", "reverse", "add"))
    assert all(p == f">{a}=" for p, a in copy)
    assert all(p == f"<{a[::-1]}=" for p, a in reverse)
    assert all(int(p[0]) + int(p[2]) == int(a) for p, a in add)
    with pytest.raises(ValueError, match="unknown task"):
        make_items("sort", 1, g)
    text = ">abc=<hg12+9"
    assert TOKENIZER.batch_decode([[*TOKENIZER.encode(text), TOKENIZER.EOS]]) == [text]
    batch = collate([(">ab=", "ab"), ("3+4=", "7")], prompts=True)
    bos, eos = TOKENIZER.BOS, TOKENIZER.EOS
    assert batch["input_ids"][0].tolist() == [bos, *TOKENIZER.encode(">ab=ab"), eos]
    # labels: the answer and the EOS only (prompt and padding -100)
    assert batch["labels"][0].tolist() == [-100] * 5 + [*TOKENIZER.encode("ab"), eos]
    assert batch["labels"][1].tolist() == [-100] * 5 + [TOKENIZER.encode("7")[0], eos, -100]
    assert batch["attention_mask"][1].tolist() == [1] * 7 + [0]
    # prompts left-padded, answers as text
    assert batch["prompt_input_ids"][1].tolist() == [bos, *TOKENIZER.encode("3+4=")]
    assert batch["prompt_attention_mask"][0].tolist() == [1] * 5
    assert batch["references"] == ["ab", "7"]
    data = SyntheticTextTasks(train_size=10, test_size=6)
    assert data.task_names == ["copy", "reverse", "add"] and data.held_out_sets == {}


class _ReReading(torch.nn.Module):
    """The transformer without its cache argument: greedy_decode re-reads the sequence."""

    def __init__(self, model: CharTransformer):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None):
        return self.model(input_ids, attention_mask)


def test_kv_cache_decoding_equals_rereading_the_sequence():
    torch.manual_seed(0)
    model = CharTransformer(width=32, layers=2, heads=4).eval()
    g = torch.Generator().manual_seed(1)
    batch = collate(make_items("reverse", 7, g) + make_items("add", 5, g), prompts=True)
    inputs = {
        "input_ids": batch["prompt_input_ids"],
        "attention_mask": batch["prompt_attention_mask"],
    }
    with torch.no_grad():
        cached = greedy_decode(model, inputs, max_new_tokens=6)
        reread = greedy_decode(_ReReading(model), inputs, max_new_tokens=6)
        assert torch.equal(cached, reread)
        # and a left-padded prompt decodes as it does alone
        alone = greedy_decode(
            model, {"input_ids": batch["prompt_input_ids"][-1:, -5:]}, max_new_tokens=6
        )
    assert (
        batch["prompt_attention_mask"][-1, -5:].all()
        and batch["prompt_attention_mask"][-1].sum() == 5
    )
    assert torch.equal(cached[-1:], alone)


@pytest.mark.slow
def test_fit_language_model_config_end_to_end(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine's cores are shared; the run is the same
    try:
        assert continual_eval(["fit", "--config", str(CONFIG), "--stream.report=false"]) == 0
    finally:
        torch.set_num_threads(threads)
    run = tmp_path / "runs" / "lm_char_tasks" / "version_0"
    results = json.loads((run / "results.json").read_text())
    assert results["task_names"] == ["copy", "reverse", "add"]
    em = results["matrices"]["em"]
    ppl = results["matrices"]["ppl"]
    assert em["score"] == "exact_match" and ppl["score"] == "perplexity"
    assert ppl["higher_is_better"] is False
    # how each score was produced, recorded: the two kinds are not comparable
    assert ppl["scoring"] == "teacher-forced" and em["scoring"] == "free-running"
    em_scores, ppl_scores = em["scores"], ppl["scores"]
    for j in range(3):  # each task learned in its own stage
        assert em_scores[j][j] >= 0.9
        assert ppl_scores[j][j] < 1.2
    # forgetting in both matrices: copy after reverse and add
    assert em_scores[2][0] <= 0.1 and em_scores[1][0] <= 0.2
    assert ppl_scores[2][0] > 10 * ppl_scores[0][0]
    assert (run / "scores_ppl.csv").is_file()
    # the prediction files: 8 items of each task per file, named in results.json
    section = results["predictions"]
    assert section["max_items"] == 8 and section["scorers"] == ["em"]
    assert [f["lines"] for f in [section["baseline"], *section["stages"]]] == [24] * 4
    final = [
        json.loads(x) for x in (run / "predictions" / "stage_2.jsonl").read_text().split("\n")[:-1]
    ]
    assert {x["task"] for x in final} == {0, 1, 2}
    assert all(x["score"] == float(x["prediction"] == x["reference"]) for x in final)
    # copy is forgotten: the report lists items right after stage 0 and wrong after stage 2
    report = write_report([run], tmp_path / "report", html_report=False).read_text()
    section_text = report[report.index("### Forgotten items") :]
    assert "| em | copy | " in section_text

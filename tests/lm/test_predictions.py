"""Per-cell predictions (``ContinualEvalCallback(predictions=N)``): the prediction files against a
plain greedy loop over the weights of every stage (one prompt at a time, no padding, no cache),
the item bound, the ``predictions`` section of results.json (round trip, refusals naming the
field), atomic writes, and the report's forgotten items."""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import shutil
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lm_helpers import plain_greedy
from torch.utils.data import DataLoader

from continual_eval import ContinualEvalCallback, fit_tasks
from continual_eval.evaluation.generation import GenerationScorer
from continual_eval.experiments.language import (
    TOKENIZER,
    CharTransformer,
    SyntheticTextTasks,
    _test_collate,
    _TextItems,
    decode_text,
    make_items,
)
from continual_eval.report import write_report
from continual_eval.results import ContinualResults, InvalidResultsError
from continual_eval.results.files import ResultsWriteError

TASKS = ["copy", "reverse"]
N = 5  # items per cell and scorer: below every set's size
MAX_NEW = 8


def stream() -> SyntheticTextTasks:
    return SyntheticTextTasks(
        tasks=TASKS, train_size=96, test_size=13, batch_size=16, test_batch_size=4
    )


def general_set() -> _TextItems:
    return _TextItems(make_items("add", 9, torch.Generator().manual_seed(5)))


def model() -> CharTransformer:
    torch.manual_seed(0)
    return CharTransformer(width=32, layers=1, heads=2, lr=0.01)


def scorers() -> dict:
    eos = TOKENIZER.EOS
    return {
        "em": GenerationScorer(
            decode_text, "exact_match", max_new_tokens=MAX_NEW, eos_token_id=eos
        ),
        "ppl": "perplexity",
        # keeps 2 items per task by itself: predictions=N raises it to N
        "edit": GenerationScorer(
            decode_text, "edit_similarity", max_new_tokens=MAX_NEW, eos_token_id=eos, record_items=2
        ),
    }


class Snapshots(pl.Callback):
    def __init__(self) -> None:
        self.weights: list[dict] = []

    def on_fit_start(self, trainer, pl_module):
        if not self.weights:
            self.weights.append({k: v.clone() for k, v in pl_module.state_dict().items()})

    def on_train_end(self, trainer, pl_module):
        self.weights.append({k: v.clone() for k, v in pl_module.state_dict().items()})


def run_fit(out: Path, extra_callbacks=()) -> tuple[ContinualEvalCallback, Snapshots]:
    data = stream()
    # the held-out loader shuffles: its items are still written by position (= dataset index)
    general = DataLoader(general_set(), batch_size=4, shuffle=True, collate_fn=_test_collate)
    callback = ContinualEvalCallback(
        data.test_dataloader(),
        task_names=data.task_names,
        scorers=scorers(),
        held_out_dataloaders={"general": general},
        predictions=N,
        dirpath=out,
        verbose=False,
    )
    snapshots = Snapshots()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=3,
        callbacks=[callback, snapshots, *extra_callbacks],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(out),
    )
    fit_tasks(trainer, model(), [data.task_train_dataloader(j) for j in range(len(TASKS))])
    return callback, snapshots


def plain_lines(weights: dict, bound: int = N) -> list[dict]:
    """The expected lines of one file: every cell's first ``bound`` dataset items, decoded one
    prompt at a time by the plain greedy loop; exact match = the texts equal (stripped)."""
    net = model()
    net.load_state_dict(weights)
    net.eval()
    data = stream()
    cells = [({"task": j}, ds) for j, ds in enumerate(data.test_sets)]
    cells.append(({"held_out": "general"}, general_set()))
    lines = []
    for cell, dataset in cells:
        for scorer in ("em", "edit"):
            for item in range(min(bound, len(dataset))):
                prompt, answer = dataset[item]
                ids = torch.tensor([TOKENIZER.BOS, *TOKENIZER.encode(prompt)])
                text = decode_text([plain_greedy(net, ids, MAX_NEW, TOKENIZER.EOS)])[0]
                line = {**cell, "scorer": scorer, "item": item, "prediction": text}
                line["reference"] = answer
                line["score"] = float(text.strip() == answer) if scorer == "em" else None
                lines.append(line)
    return lines


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("predictions") / "run"
    callback, snapshots = run_fit(out)
    return callback, snapshots, out


def test_prediction_files_equal_a_plain_greedy_loop_at_the_baseline_and_every_stage(run):
    _, snapshots, out = run
    files = ["baseline.jsonl", *(f"stage_{i}.jsonl" for i in range(len(TASKS)))]
    assert sorted(p.name for p in (out / "predictions").iterdir()) == sorted(files)
    assert len(snapshots.weights) == 1 + len(TASKS)
    for name, weights in zip(files, snapshots.weights, strict=True):
        got = read_lines(out / "predictions" / name)
        want = plain_lines(weights)
        edit = [line.pop("score") for line in got if line["scorer"] == "edit"]
        assert all(0.0 <= v <= 1.0 for v in edit)
        for line in want:
            if line["scorer"] == "edit":
                del line["score"]
        assert got == want, name


def test_each_cell_keeps_the_first_n_items_of_its_set_by_position(run):
    _, _, out = run
    lines = read_lines(out / "predictions" / "stage_1.jsonl")
    for cell in ({"task": 0}, {"task": 1}, {"held_out": "general"}):
        key, value = next(iter(cell.items()))
        for scorer in ("em", "edit"):
            items = [x["item"] for x in lines if x.get(key) == value and x["scorer"] == scorer]
            assert items == list(range(N)), (cell, scorer)
    # the order of a file: tasks, then held-out sets; within a cell each scorer's items
    order = [(x.get("task", 99), x["scorer"]) for x in lines]
    assert order == sorted(order, key=lambda c: (c[0], c[1] != "em"))


def test_results_json_names_the_files_with_their_lines_and_sha256(run):
    callback, _, out = run
    on_disk = json.loads((out / "results.json").read_text())
    section = on_disk["predictions"]
    assert section == callback.results()["predictions"]
    assert section["max_items"] == N and section["scorers"] == ["em", "edit"]
    entries = [section["baseline"], *section["stages"]]
    assert [e["path"] for e in entries] == [
        "predictions/baseline.jsonl",
        *(f"predictions/stage_{i}.jsonl" for i in range(len(TASKS))),
    ]
    for entry in entries:
        data = (out / entry["path"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["lines"] == len(data.splitlines()) == 3 * 2 * N
    loaded = ContinualResults.load(out)
    assert loaded.predictions == callback.continual_results().predictions
    assert loaded.predictions.file(1).read(out) == read_lines(out / "predictions/stage_1.jsonl")


@pytest.mark.parametrize(
    "edit, field",
    [
        (
            lambda s: s["stages"][1].update(path="../stage_1.jsonl"),
            r"predictions\.stages\[1\]\.path",
        ),
        (lambda s: s["baseline"].update(lines=31), r"predictions\.baseline\.lines"),
        (lambda s: s["scorers"].append("bleu"), r"predictions\.scorers\[2\]"),
        (lambda s: s["stages"].pop(), r"predictions\.stages"),
        (lambda s: s["stages"][0].update(sha256="x"), r"predictions\.stages\[0\]\.sha256"),
        (lambda s: s.update(max_items=0), r"predictions\.max_items"),
    ],
)
def test_a_broken_predictions_section_is_refused_naming_the_field(run, edit, field):
    _, _, out = run
    document = json.loads((out / "results.json").read_text())
    edit(document["predictions"])
    with pytest.raises(InvalidResultsError, match=field):
        ContinualResults.from_dict(document)


def test_a_changed_file_is_refused_by_its_reader(run, tmp_path):
    _, _, out = run
    copied = tmp_path / "run"
    shutil.copytree(out, copied)
    (copied / "predictions" / "stage_0.jsonl").write_text("{}\n")
    files = ContinualResults.load(copied).predictions
    with pytest.raises(ValueError, match=r"stage_0\.jsonl.*SHA-256"):
        files.file(0).read(copied)


def test_predictions_argument_checks():
    data = stream()
    with pytest.raises(ValueError, match="none of the scorers"):
        ContinualEvalCallback(data.test_dataloader(), scorers={"ppl": "perplexity"}, predictions=4)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="predictions must be None"):
            ContinualEvalCallback(data.test_dataloader(), scorers=scorers(), predictions=bad)


class FailStageWrite(pl.Callback):
    """Makes the atomic write of ``predictions/stage_1.jsonl`` fail half-way (a full disk)."""

    def __init__(self, monkeypatch) -> None:
        import continual_eval._predictions as module

        original = module._write_to

        def failing(tmp: Path, *, data: bytes) -> None:
            if tmp.name.startswith(".stage_1.jsonl"):
                tmp.write_bytes(data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
            original(tmp, data=data)

        monkeypatch.setattr(module, "_write_to", failing)


def test_a_failed_write_leaves_the_previous_file_and_results_json(run, tmp_path, monkeypatch):
    out = tmp_path / "run"
    with pytest.raises(ResultsWriteError, match=r"stage_1\.jsonl.*No space left"):
        run_fit(out, [FailStageWrite(monkeypatch)])
    # no partial file, no temporary left; results.json (rebuilt as the fit raised) records
    # stage 1 with no file named for it (null), stage 0's file whole
    assert not (out / "predictions" / "stage_1.jsonl").exists()
    assert not list((out / "predictions").glob(".*.tmp"))
    results = ContinualResults.load(out)
    assert results.stages_completed == 2 and results.predictions.stages[1] is None
    assert json.loads((out / "results.json").read_text())["predictions"]["stages"][1] is None
    assert results.predictions.file(0).read(out)  # the stage-0 file is whole and recorded

    # a file rewritten in place (the section's own write): the failed write keeps the old one
    callback, _, _ = run
    section = copy.deepcopy(callback.record.sections["predictions"])
    path = out / "predictions" / "stage_0.jsonl"
    before = path.read_bytes()
    section.pending = {"predictions/stage_1.jsonl": b"x\n", "predictions/stage_0.jsonl": b"y\n"}
    monkeypatch.setattr(
        "continual_eval._predictions._write_to",
        lambda tmp, *, data: (tmp.write_bytes(data[:1]), _raise(OSError(errno.EIO, "I/O error"))),
    )
    with pytest.raises(ResultsWriteError, match="I/O error"):
        section.write_pending(out)
    assert path.read_bytes() == before
    assert not list((out / "predictions").glob(".*.tmp"))


def _raise(err: Exception) -> None:
    raise err


def _rewrite(out: Path, stage: int, lines: list[dict]) -> None:
    """Replace a prediction file and its entry in results.json (lines and SHA-256)."""
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    path = out / "predictions" / f"stage_{stage}.jsonl"
    path.write_bytes(data)
    document = json.loads((out / "results.json").read_text())
    entry = document["predictions"]["stages"][stage]
    entry.update(lines=len(lines), sha256=hashlib.sha256(data).hexdigest())
    (out / "results.json").write_text(json.dumps(document))


def test_the_report_shows_items_right_at_the_diagonal_and_wrong_at_the_final_stage(run, tmp_path):
    _, _, out = run
    copied = tmp_path / "run"
    shutil.copytree(out, copied)
    diagonal = read_lines(copied / "predictions" / "stage_0.jsonl")
    final = copy.deepcopy(read_lines(copied / "predictions" / "stage_1.jsonl"))
    # task 0: items 1 and 3 right after stage 0, item 3 still right and item 1 wrong at the end;
    # item 4 wrong, then right (not forgotten); the held-out set's lines are not task items
    for line in diagonal:
        if line.get("task") == 0 and line["scorer"] == "em":
            right = line["item"] in (1, 3)
            line.update(score=float(right), prediction=line["reference"] if right else "zz")
    for line in final:
        if line.get("task") == 0 and line["scorer"] == "em":
            right = line["item"] in (3, 4)
            line.update(score=float(right), prediction=line["reference"] if right else "<b>|x")
    _rewrite(copied, 0, diagonal)
    _rewrite(copied, 1, final)
    text = write_report([copied], tmp_path / "report", html_report=False).read_text()
    section = text[text.index("### Forgotten items") :]
    rows = [r for r in section.splitlines() if r.startswith("| em ") or r.startswith("| edit ")]
    reference = next(x["reference"] for x in diagonal if x.get("task") == 0 and x["item"] == 1)
    wrong = "&lt;b&gt;\\|x"  # escaped: renders as the text itself
    assert rows[0] == f"| em | copy | 1/{N} | 1 | {reference} | {reference} | {wrong} | 0.0000 |"
    # only task copy (trained before the final stage); edit: a row of its own scores
    assert [r.startswith("| em ") for r in rows].count(True) == 1
    assert rows[-1].startswith("| edit | copy | ") or rows[1].startswith("| edit | copy | ")

    # the HTML report holds the same row (escaped as HTML)
    pytest.importorskip("plotly")
    write_report([copied], tmp_path / "report_html")
    page = (tmp_path / "report_html" / "report.html").read_text()
    cells = ["em", "copy", f"1/{N}", "1", reference, reference, "&lt;b&gt;|x", "0.0000"]
    assert "<h3>Forgotten items</h3>" in page
    assert "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>" in page

    # a file changed after it was written is named, not read
    (copied / "predictions" / "stage_1.jsonl").write_text("{}\n")
    text = write_report([copied], tmp_path / "report2", html_report=False).read_text()
    section = text[text.index("### Forgotten items") :]
    assert "stage\\_1.jsonl" in section and "SHA-256" in section


# ---------------------------------------------------------------- 2 processes (gloo)
def _steps(tokens: list[int]) -> int:
    """The decoding steps one item needs: its tokens and the EOS, at most MAX_NEW."""
    return min(len(tokens) + 1, MAX_NEW)


@pytest.mark.slow
def test_ddp_held_out_scores_and_prediction_files_equal_one_process(lm_callback_ddp_run):
    """2 processes, odd set sizes (21 = 11 + 10 per task, held-out 9 = 5 + 4): the held-out
    section equals one process scoring the saved weights, and every prediction file equals a
    plain greedy loop over them (one process's items, with one process's scores)."""
    from lm_callback_ddp_script import PREDICTIONS, data, held_out_loaders, held_out_set
    from lm_callback_ddp_script import model as ddp_model
    from lm_callback_ddp_script import scorers as ddp_scorers

    from continual_eval.evaluation import evaluate_tasks

    out = lm_callback_ddp_run
    results = json.loads((out / "results" / "results.json").read_text())
    held_out = results["held_out"]
    assert held_out["names"] == ["general"]
    sets = [*data().test_sets, held_out_set()]
    cells = [{"task": 0}, {"task": 1}, {"held_out": "general"}]
    rank_steps_differ = False
    snapshots = [(None, "weights_baseline.pt"), (0, "weights_0.pt"), (1, "weights_1.pt")]
    for row, weights in snapshots:
        net = ddp_model()
        net.load_state_dict(torch.load(out / weights))
        net.eval()
        # the held-out set scored in one process with every scorer
        one = ddp_scorers()
        alone = evaluate_tasks(
            net, [held_out_loaders()["general"]], [0], scorers=list(one.values())
        )
        for name, scores in zip(one, alone.scores_by_scorer, strict=True):
            matrix = held_out["matrices"][name]
            recorded = matrix["baseline"] if row is None else matrix["scores"][row]
            if name == "em":  # exact-match counts over the item count: exactly
                assert recorded == scores.tolist(), (name, row)
            elif name == "edit":  # float64 sums of per-item scores, in another order
                assert recorded == pytest.approx(scores.tolist(), rel=1e-12), (name, row)
            else:  # float32 logits: other rounding with the batch's other items
                assert recorded == pytest.approx(scores.tolist(), rel=1e-6), (name, row)
        # one process's per-item edit scores (every item of every set, in dataset order)
        edit = GenerationScorer(
            decode_text,
            "edit_similarity",
            max_new_tokens=MAX_NEW,
            eos_token_id=TOKENIZER.EOS,
            record_items=-1,
        )
        loaders = [*data().test_dataloader(), held_out_loaders()["general"]]
        evaluate_tasks(net, loaders, range(3), scorers=[edit])
        name = "baseline.jsonl" if row is None else f"stage_{row}.jsonl"
        got = read_lines(out / "results" / "predictions" / name)
        want = []
        for k, (cell, dataset) in enumerate(zip(cells, sets, strict=True)):
            texts, steps = [], []
            for item in range(len(dataset)):
                prompt, _ = dataset[item]
                ids = torch.tensor([TOKENIZER.BOS, *TOKENIZER.encode(prompt)])
                tokens = plain_greedy(net, ids, MAX_NEW, TOKENIZER.EOS)
                texts.append(decode_text([tokens])[0])
                steps.append(_steps(tokens))
            # rank r's first batch of 4 holds items r, r + 2, r + 4, r + 6
            if max(steps[0:8:2]) != max(steps[1:8:2]):
                rank_steps_differ = True
            for scorer in ("em", "edit"):
                for item in range(PREDICTIONS):
                    answer = dataset[item][1]
                    score = (
                        float(texts[item] == answer)
                        if scorer == "em"
                        else edit.records_by_task[k][item].score
                    )
                    assert edit.records_by_task[k][item].prediction == texts[item]
                    want.append(
                        {
                            **cell,
                            "scorer": scorer,
                            "item": item,
                            "prediction": texts[item],
                            "reference": answer,
                            "score": score,
                        }
                    )
        assert got == want, name
    # the ranks' decoding stopped after different numbers of steps in some batch
    assert rank_steps_differ


# ---------------------------------------------------------------- kill -9, then resume
@pytest.mark.slow
def test_kill_inside_stage_evaluation_then_resume_equals_uninterrupted(tmp_path):
    """A run with a held-out set and prediction files, killed inside stage 2's evaluation and
    resumed from its stage-1 checkpoint: results.json (held-out section included) and every
    prediction file equal an uninterrupted run's; the files written before the checkpoint are
    not rewritten, and a stage file written after it (a run killed later) is replaced."""
    import signal

    from continual_eval.results.files import check_results_files
    from script_runner import run_script

    here = Path(__file__).parent

    def run(mode: str, out: Path):
        return run_script(here / "lm_kill_script.py", mode, out, timeout=300)

    full = run("full", tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]
    killed = run("killed", tmp_path / "cut")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    full_dir, cut_dir = tmp_path / "full" / "results", tmp_path / "cut" / "results"
    assert ContinualResults.load(cut_dir).stages_completed == 2
    written = ["baseline.jsonl", "stage_0.jsonl", "stage_1.jsonl"]
    assert sorted(p.name for p in (cut_dir / "predictions").iterdir()) == written
    stale = cut_dir / "predictions" / "stage_2.jsonl"
    stale.write_text('{"written after the checkpoint": true}\n')
    stamps = {}
    for name in written:
        st = (cut_dir / "predictions" / name).stat()
        stamps[name] = (st.st_ino, st.st_mtime_ns)
    resumed = run("resume", tmp_path / "cut")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "changed after it was written" not in resumed.stderr

    for name in written:  # not rewritten
        st = (cut_dir / "predictions" / name).stat()
        assert (st.st_ino, st.st_mtime_ns) == stamps[name], name
    names = sorted(p.name for p in (full_dir / "predictions").iterdir())
    assert names == [*written, "stage_2.jsonl"]
    assert sorted(p.name for p in (cut_dir / "predictions").iterdir()) == names
    for name in names:
        a = (full_dir / "predictions" / name).read_bytes()
        assert a == (cut_dir / "predictions" / name).read_bytes(), name
    a = torch.load(tmp_path / "full" / "full.pt")["weights"]
    b = torch.load(tmp_path / "cut" / "resume.pt")["weights"]
    for key, value in a.items():
        assert torch.equal(value, b[key]), key
    x, y = ContinualResults.load(full_dir).to_dict(), ContinualResults.load(cut_dir).to_dict()
    assert x.pop("run_id") != y.pop("run_id")  # two runs; everything else bitwise equal
    counted = ("stage", "samples", "optimizer_steps", "parameters", "replay_memory")
    costs = [[{k: c[k] for k in counted} for c in d.pop("cost")["per_stage"]] for d in (x, y)]
    assert costs[0] == costs[1]  # the clocks differ; what was trained does not
    assert x["held_out"] == y["held_out"] and len(x["held_out"]["matrices"]["em"]["scores"]) == 3
    assert x == y
    assert check_results_files(cut_dir) is None


def test_a_resume_names_recorded_files_that_changed_and_removes_later_stage_files(run, tmp_path):
    callback, _, out = run
    copied = tmp_path / "run"
    shutil.copytree(out, copied)
    section = copy.deepcopy(callback.record.sections["predictions"])
    assert section.check_on_disk(copied) is None
    (copied / "predictions" / "stage_0.jsonl").write_text("{}\n")
    (copied / "predictions" / "baseline.jsonl").unlink()
    (copied / "predictions" / "stage_7.jsonl").write_text("{}\n")
    note = section.check_on_disk(copied)
    assert "stage_0.jsonl" in note and "baseline.jsonl" in note and "stage_1" not in note
    assert section.remove_stale(copied) == [copied / "predictions" / "stage_7.jsonl"]
    assert (copied / "predictions" / "stage_1.jsonl").exists()


# ---------------------------------------------------------------- the stage journal
def test_the_journal_names_each_stage_file_and_load_replays_them(tmp_path):
    """40 tasks: results.json is rebuilt at spaced stages; the stage journal's line of every
    stage names its prediction file, and ContinualResults.load replays the newer ones."""
    from continual_eval._predictions import PredictionItem, PredictionsRecord, write_pending
    from continual_eval._run_directory import RunDirectory
    from continual_eval.record import MatrixSpec, RunRecord, Scored
    from continual_eval.results.files import JOURNAL_FILE, read_run_id

    T, stages = 40, 38
    names = [f"task {j}" for j in range(T)]
    section = PredictionsRecord(2, ["em"], names, [])
    record = RunRecord({"em": MatrixSpec("exact_match")}, names, sections=[section])
    directory = RunDirectory()
    directory.path = tmp_path

    def scored(stage: int) -> Scored:
        row = torch.full((T,), 0.5, dtype=torch.float64)
        items = tuple(
            PredictionItem(j, 0, k, f"p{stage}/{j}/{k}", "r", float(k))
            for j in range(T)
            for k in (0, 1)
        )
        return Scored({"em": row}, predictions=items)

    record.record_baseline(scored(-1))
    write_pending(record, tmp_path)
    directory.write(record, record.continual_results())
    for stage in range(stages):
        record.record_stage(stage, scored(stage))
        write_pending(record, tmp_path)
        directory.write(record, record.continual_results(), stage=stage)
    directory.wait()  # the last rebuild runs on its own thread: read its file once it is written
    assert read_run_id(tmp_path)[2] == 37  # results.json: the last rebuild, a stage behind
    last = json.loads((tmp_path / JOURNAL_FILE).read_bytes().splitlines()[-1])
    entry = last["sections"]["predictions"]
    assert entry["path"] == "predictions/stage_37.jsonl" and entry["lines"] == 2 * T
    data = (tmp_path / entry["path"]).read_bytes()
    assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    loaded = ContinualResults.load(tmp_path)
    assert loaded.to_dict() == record.continual_results().to_dict()
    assert len(loaded.predictions.stages) == stages
    assert loaded.predictions.file(37).read(tmp_path)[3] == {
        "task": 1,
        "scorer": "em",
        "item": 1,
        "prediction": "p37/1/1",
        "reference": "r",
        "score": 1.0,
    }


def test_predictions_and_item_records_index_the_same_items(tmp_path):
    """With ``item_records`` on too, the per-item values the item records keep at every
    evaluation are the scores of the prediction files' lines at the same positions (tasks
    only: held-out sets have no item records), task 0's test loader shuffling."""
    data = stream()
    loaders = data.test_dataloader()
    loaders[0] = DataLoader(data.test_sets[0], batch_size=4, shuffle=True, collate_fn=_test_collate)
    callback = ContinualEvalCallback(
        loaders,
        task_names=data.task_names,
        scorers=scorers(),
        held_out_dataloaders={
            "general": DataLoader(general_set(), batch_size=4, collate_fn=_test_collate)
        },
        predictions=N,
        item_records=["em", "edit"],
        dirpath=tmp_path / "run",
        verbose=False,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        callbacks=[callback],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path),
    )
    fit_tasks(trainer, model(), [data.task_train_dataloader(j) for j in range(len(TASKS))])
    items = callback.record.sections["items"]
    for stage, name in [(None, "baseline.jsonl"), (0, "stage_0.jsonl"), (1, "stage_1.jsonl")]:
        lines = read_lines(tmp_path / "run" / "predictions" / name)
        for scorer in ("em", "edit"):
            values = items.values(scorer, stage)
            for j in range(len(TASKS)):
                cell = [x for x in lines if x.get("task") == j and x["scorer"] == scorer]
                scores = [x["score"] for x in cell]
                assert scores == values[j][:N].double().tolist(), (stage, j, scorer)
    assert len({x["score"] for x in lines if x["scorer"] == "edit"}) > 2  # varied scores

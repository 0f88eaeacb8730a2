"""What the callback sends to each logger, read back with each tool's own reader."""

from __future__ import annotations

import csv
import glob
import json
import math
import struct
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from cl_helpers import (
    Classifier,
    by_step,
    eval_loaders,
    make_net,
    make_tasks,
    train_loaders,
    trainer_kwargs,
)
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger

from continual_eval.callback import ContinualEvalCallback
from continual_eval.results import ContinualResults


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


def run(tasks, tmp_path, loggers, **cb_kwargs):
    model = Classifier(make_net())
    cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False, **cb_kwargs)
    for dl in train_loaders(tasks):
        pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1, logger=loggers)).fit(
            model, dl
        )
    return cb


def test_csv_and_tensorboard_read_back(tasks, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    csv_logger = CSVLogger(tmp_path, name="csv")
    tb_logger = TensorBoardLogger(tmp_path, name="tb")
    cb = run(tasks, tmp_path, [csv_logger, tb_logger], metadata={"method": "finetune"})
    R, b = cb.scores, cb.baseline
    results = cb.results()

    # results.json and scores.csv land in the first logger's log_dir
    assert cb.results_dir is not None
    assert cb.results_dir.resolve() == (tmp_path / "csv" / "version_0").resolve()
    assert ContinualResults.load(cb.results_dir).to_dict() == json.loads(json.dumps(results))

    # metrics.csv: one row per stage at step = stage, with the metrics and the row of R
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("continual/acc")]
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    for stage, row in enumerate(rows):
        assert float(row["continual/acc"]) == pytest.approx(
            results["metrics_per_stage"]["acc"][stage]
        )
        for j in range(3):
            assert float(row[f"continual/accuracy/task_{j}"]) == pytest.approx(R[stage, j].item())
    assert float(rows[-1]["continual/bwt"]) == pytest.approx(results["metrics"]["bwt"])
    assert rows[0]["continual/bwt"] == "0.0"  # one stage: defined as zero by the functional layer

    # TensorBoard: scalars per stage, the heatmap and the markdown table
    acc = EventAccumulator(str(tb_logger.log_dir), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    events = by_step(acc.Scalars("continual/acc"))
    assert [e.step for e in events] == [0, 1, 2]
    assert [e.value for e in events] == pytest.approx(results["metrics_per_stage"]["acc"], abs=1e-6)
    fwt = by_step(acc.Scalars("continual/fwt"))[-1].value
    assert fwt == pytest.approx(results["metrics"]["fwt"], abs=1e-6)
    baseline_events = acc.Scalars("continual/baseline/task_1")
    assert baseline_events[0].value == pytest.approx(b[1].item(), abs=1e-6)
    images = by_step(acc.Images("continual/accuracy_matrix"))
    assert [im.step for im in images] == [0, 1, 2]
    assert images[-1].encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"
    text_tag = next(t for t in tags["tensors"] if t.startswith("continual/accuracy_matrix"))
    last_text = by_step(acc.Tensors(text_tag))[-1].tensor_proto.string_val[0].decode()
    assert "| baseline |" in last_text and f"{R[2, 0].item():.4f}" in last_text


def test_heatmap_draws_unevaluated_cells_empty(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tasks4 = make_tasks(4)
    tb_logger = TensorBoardLogger(tmp_path, name="tb")
    cb = run(tasks4, tmp_path, [tb_logger], evaluate="needed")
    acc = EventAccumulator(str(tb_logger.log_dir), size_guidance={"images": 0})
    acc.Reload()
    png = by_step(acc.Images("continual/accuracy_matrix"))[-1].encoded_image_string
    (tmp_path / "heatmap.png").write_bytes(png)

    import matplotlib.image as mpimg

    pixels = mpimg.imread(str(tmp_path / "heatmap.png"))
    assert pixels.ndim == 3 and pixels.shape[0] > 100
    assert torch.isnan(cb.scores[0, 2:]).all()
    # the CSV matrix of the results directory leaves those cells empty
    lines = (cb.results_dir / "scores.csv").read_text().splitlines()
    assert lines[2].split(",")[3:] == ["", ""]


def _wandb_history(run_dir: str, *, records: int = 1, wait: float = 60.0) -> list[dict[str, str]]:
    """History records of an offline W&B run, read from its .wandb file; the file is read again
    (up to ``wait`` seconds) until it holds at least ``records`` history records: on a busy
    machine W&B's writer process may still be flushing after ``wandb.finish()`` returned."""
    deadline = time.monotonic() + wait
    while True:
        history = _read_wandb_history(run_dir)
        if len(history) >= records or time.monotonic() > deadline:
            return history
        time.sleep(0.5)


def _read_wandb_records(run_dir: str) -> list[Any]:
    """Every record of an offline W&B run, read from its .wandb file (LevelDB log format)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(f"{run_dir}/run-*.wandb")
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, records, partial = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        chunk, pos = data[pos : pos + length], pos + length
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            partial = chunk
        elif kind == 3:
            partial += chunk
        elif kind == 4:
            records.append(partial + chunk)
    parsed = []
    from google.protobuf.message import DecodeError

    for raw in records:
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(raw)
        except DecodeError:  # a record of another kind this reader splits wrongly; not history
            continue
        parsed.append(record)
    return parsed


def _read_wandb_history(run_dir: str) -> list[dict[str, str]]:
    """History records of an offline W&B run, read from its .wandb file."""
    return [
        {"/".join(i.nested_key) or i.key: i.value_json for i in record.history.item}
        for record in _read_wandb_records(run_dir)
        if record.WhichOneof("record_type") == "history"
    ]


def _wandb_step_metrics(run_dir: str) -> dict[str, str]:
    """Metric name (or glob) -> the step metric it is plotted against (``define_metric``)."""
    metrics = {}
    for record in _read_wandb_records(run_dir):
        if record.WhichOneof("record_type") == "metric":
            metric = record.metric
            metrics[metric.name or metric.glob_name] = metric.step_metric
    return metrics


def test_wandb_offline_read_back(tasks, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(project="continual-eval-test", save_dir=str(tmp_path), offline=True)
    try:
        cb = run(tasks, tmp_path, [logger])
        run_dir = logger.experiment.dir.rsplit("/files", 1)[0]
    finally:
        wandb.finish()
    results = cb.results()
    history = [h for h in _wandb_history(run_dir, records=3) if "continual/acc" in h]
    assert [int(h["continual/stage"]) for h in history] == [0, 1, 2]  # the stage axis
    assert [float(h["continual/acc"]) for h in history] == pytest.approx(
        results["metrics_per_stage"]["acc"], abs=1e-12
    )
    last = history[-1]
    assert float(last["continual/accuracy/task_0"]) == cb.scores[2, 0].item()
    assert json.loads(last["continual/accuracy_matrix/_type"]) == "image-file"
    image_path = json.loads(last["continual/accuracy_matrix/path"])
    assert Path(f"{run_dir}/files/{image_path}").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table_path = json.loads(last["continual/accuracy_matrix_table/path"])
    table = json.loads(Path(f"{run_dir}/files/{table_path}").read_text())
    assert table["columns"] == ["stage", "task_0", "task_1", "task_2"]
    assert table["data"][0][0] == "baseline" and table["data"][3][1:] == cb.scores[2].tolist()


def test_mlflow_read_back(tasks, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a local store without a database
    from mlflow.tracking import MlflowClient

    uri = f"file:{tmp_path / 'mlruns'}"
    logger = MLFlowLogger(experiment_name="continual", tracking_uri=uri)
    cb = run(tasks, tmp_path, [logger], dirpath=tmp_path / "out")
    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(logger.run_id, "continual/acc")
    assert sorted(m.step for m in history) == [0, 1, 2]
    final = max(history, key=lambda m: m.step).value
    assert final == pytest.approx(cb.results()["metrics"]["acc"])
    artifacts = {a.path for a in client.list_artifacts(logger.run_id, "continual")}
    assert "continual/results.json" in artifacts and "continual/scores.csv" in artifacts
    assert "continual/accuracy_matrix_stage_002.png" in artifacts
    local = client.download_artifacts(logger.run_id, "continual/results.json", str(tmp_path))
    assert (
        json.loads(Path(local).read_text())["scores"]
        == ContinualResults.load(tmp_path / "out").to_dict()["scores"]
    )


def test_final_table_printed(tasks, tmp_path, caplog):
    import logging

    model = Classifier(make_net())
    cb = ContinualEvalCallback(eval_loaders(tasks), dirpath=tmp_path)
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        for dl in train_loaders(tasks):
            pl.Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1)).fit(model, dl)
    text = caplog.text
    assert "stage 3/3 (task_2; row 2 of R)" in text
    assert "baseline" in text and f"{cb.scores[2, 2].item():.4f}" in text
    assert not math.isnan(cb.results()["metrics"]["acc"])


def test_every_matrix_logged_read_back_and_tabled(tasks, tmp_path, caplog):
    """Two scorers: each matrix's metrics, rows, baseline, stability, heatmap and curves figure
    reach TensorBoard and metrics.csv under its own keys (read back with each tool's reader and
    compared with ContinualResults); a CSVLogger outside the results directory gets every CSV;
    the end-of-run table shows both matrices."""
    import logging

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    csv_logger = CSVLogger(tmp_path, name="csv")
    tb_logger = TensorBoardLogger(tmp_path, name="tb")
    model = Classifier(make_net())
    cb = ContinualEvalCallback(
        eval_loaders(tasks),
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
        dirpath=tmp_path / "out",
        eval_every_n_steps=2,
    )
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        for dl in train_loaders(tasks):
            kwargs = trainer_kwargs(tmp_path, max_epochs=1, logger=[csv_logger, tb_logger])
            pl.Trainer(callbacks=[cb], **kwargs).fit(model, dl)
    results = cb.continual_results()
    assert results.to_dict() == cb.results()
    loss, acc = results["loss"], results.primary
    assert loss.higher_is_better is False and torch.equal(loss.scores, cb.matrices["loss"])

    events = EventAccumulator(
        str(tb_logger.log_dir), size_guidance={"images": 0, "tensors": 0, "scalars": 0}
    )
    events.Reload()
    for key in ("acc", "bwt", "fwt", "forgetting"):
        for tag, matrix in ((f"continual/{key}", acc), (f"continual/loss/{key}", loss)):
            logged = by_step(events.Scalars(tag))
            assert [e.step for e in logged] == [0, 1, 2], tag
            expected = matrix.metrics_per_stage[key].tolist()
            assert [e.value for e in logged] == pytest.approx(expected, rel=1e-6, abs=1e-7), tag
    for j in range(3):
        rows = [e.value for e in by_step(events.Scalars(f"continual/loss/task_{j}"))]
        assert rows == pytest.approx(loss.scores[:, j].tolist(), rel=1e-6)  # every stage
        (base,) = events.Scalars(f"continual/loss/baseline/task_{j}")
        assert base.step == 0 and base.value == pytest.approx(loss.baseline[j].item(), rel=1e-6)
    wc = [e.value for e in by_step(events.Scalars("continual/loss/wc_acc"))]
    assert wc == pytest.approx(loss.stability.wc_acc.tolist(), rel=1e-6)
    steps = [e.step for e in by_step(events.Scalars("continual/loss/step/task_0"))]
    assert steps == results.steps.step.tolist()
    for tag in ("accuracy_matrix", "loss_matrix", "accuracy_curves", "loss_curves"):
        images = by_step(events.Images(f"continual/{tag}"))
        assert [im.step for im in images] == [0, 1, 2], tag
        assert images[-1].encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"
    text_tag = next(t for t in events.Tags()["tensors"] if t.startswith("continual/accuracy_mat"))
    text = by_step(events.Tensors(text_tag))[-1].tensor_proto.string_val[0].decode()
    assert "loss (cross_entropy, lower is better)" in text and "acc (accuracy)" in text
    assert f"{loss.scores[2, 1].item():.4f}" in text

    # metrics.csv (the CSV logger's) and its copies of both CSV files
    log_dir = tmp_path / "csv" / "version_0"
    with open(log_dir / "metrics.csv") as fh:
        staged = [r for r in csv.DictReader(fh) if r.get("continual/loss/forgetting")]
    assert float(staged[-1]["continual/loss/forgetting"]) == pytest.approx(
        loss.metrics["forgetting"]
    )
    for name in ("scores.csv", "scores_loss.csv"):
        assert (log_dir / name).read_text() == (tmp_path / "out" / name).read_text()

    # the end-of-run table: every matrix with its metrics
    final = [r.getMessage() for r in caplog.records if "R[i, j]" in r.getMessage()][-1]
    assert "acc (accuracy) R[i, j]" in final
    assert "loss (cross_entropy, lower is better) R[i, j]" in final
    assert f"forgetting={loss.metrics['forgetting']:.4f}" in final


@pytest.mark.parametrize(
    ("scorers", "task_names", "key"),
    [
        # a second scorer's per-task key next to its metric key: a task named "acc"
        ({"acc": "accuracy", "loss": "cross_entropy"}, ["acc", "b", "c"], "continual/loss/acc"),
        # a second scorer named like the primary's score: both per-task keys
        ({"acc": "accuracy", "accuracy": "top1"}, None, "continual/accuracy/task_0"),
    ],
)
def test_colliding_log_keys_are_refused_before_training(tasks, tmp_path, scorers, task_names, key):
    callback = ContinualEvalCallback(
        eval_loaders(tasks), scorers=scorers, task_names=task_names, verbose=False
    )
    model = Classifier(make_net())
    before = [p.detach().clone() for p in model.parameters()]
    trainer = pl.Trainer(
        callbacks=[callback],
        **trainer_kwargs(tmp_path, max_epochs=1, logger=[CSVLogger(tmp_path / "csv")]),
    )
    with pytest.raises(ValueError, match=f"'{key}'") as info:
        trainer.fit(model, train_loaders(tasks)[0])
    assert "Nothing was trained" in str(info.value)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_distinct_names_log_without_collisions(tasks, tmp_path):
    from continual_eval.loggers import stage_key_collisions

    cb = run(
        tasks,
        tmp_path,
        [CSVLogger(tmp_path / "csv")],
        scorers={"acc": "accuracy", "loss": "cross_entropy"},
    )
    assert cb.stages_completed == 3
    assert stage_key_collisions(cb.continual_results(), "continual/") == []

"""Where results.json and the other files go, per logger (issue 23.6): every row of the table in
docs/callback.md ("Where the results go") is checked against a real run; ``to_dict()`` is the
document results.json holds, ``files`` included."""

from __future__ import annotations

import json
import re
from pathlib import Path

import lightning.pytorch as pl
import pytest
from cl_helpers import Classifier, eval_loaders, make_net, make_tasks, train_loaders, trainer_kwargs

from continual_eval import ContinualEvalCallback
from continual_eval.results import ContinualResults, check_results_files

DOC = Path(__file__).resolve().parents[2] / "docs" / "callback.md"


@pytest.fixture(scope="module")
def tasks():
    return make_tasks()


def documented() -> dict[str, str]:
    """First cell -> results directory template, from the table of docs/callback.md."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Where the results go", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]  # no header
    table = {}
    for row in rows:
        first, where = (cell.strip() for cell in row.strip("|").split("|")[:2])
        table[first] = re.match(r"`([^`]+)`", where)[1]  # the path, before any explanation
    return table


def row(start: str) -> str:
    (template,) = [t for first, t in documented().items() if first.startswith(start)]
    return template


def pattern(template: str, **values: str) -> str:
    """The template as a regex: ``<N>`` any version number, the other placeholders ``values``
    (regexes)."""
    parts = re.split(r"(<[^>]+>)", template)
    out = []
    for part in parts:
        if part == "<N>":
            out.append(r"\d+")
        elif part.startswith("<"):
            out.append(values[part[1:-1].replace(" ", "_")])
        else:
            out.append(re.escape(part))
    return "".join(out)


def fit(tasks, tmp_path, logger, **cb_kwargs):
    cb = ContinualEvalCallback(eval_loaders(tasks), verbose=False, **cb_kwargs)
    kwargs = trainer_kwargs(tmp_path / "root", max_epochs=1, logger=logger)
    pl.Trainer(callbacks=[cb], **kwargs).fit(Classifier(make_net()), train_loaders(tasks)[0])
    return cb


def check(cb, template, **values):
    assert cb.results_dir is not None
    assert re.fullmatch(pattern(template, **values), str(cb.results_dir)), (
        cb.results_dir,
        template,
    )
    on_disk = json.loads((cb.results_dir / "results.json").read_text())
    assert (cb.results_dir / "scores.csv").is_file() and check_results_files(cb.results_dir) is None
    # to_dict() is the document results.json holds, the files entry included
    assert on_disk == cb.continual_results().to_dict() == cb.results()
    assert on_disk["files"]["scores.csv"]["stages"] == 1
    assert ContinualResults.from_dict(on_disk).to_dict() == on_disk


def test_the_table_has_a_row_per_logger():
    assert len(documented()) == 6


def test_no_logger(tasks, tmp_path):
    cb = fit(tasks, tmp_path, False)
    check(cb, row("none"), default_root_dir=re.escape(str(tmp_path / "root")))
    assert cb.results_dir.name == "version_0"
    assert fit(tasks, tmp_path, False).results_dir.name == "version_1"  # a new one per run


def test_lightning_default_logger(tasks, tmp_path):
    cb = fit(tasks, tmp_path, True)
    check(cb, row("Lightning's default"), default_root_dir=re.escape(str(tmp_path / "root")))


def test_tensorboard(tasks, tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger

    cb = fit(tasks, tmp_path, TensorBoardLogger(tmp_path / "save", name="tb"))
    check(cb, row("`TensorBoardLogger"), save_dir=re.escape(str(tmp_path / "save")), name="tb")


def test_csv(tasks, tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    cb = fit(tasks, tmp_path, CSVLogger(tmp_path / "save", name="csv"))
    check(cb, row("`CSVLogger"), save_dir=re.escape(str(tmp_path / "save")), name="csv")
    assert (cb.results_dir / "metrics.csv").is_file()  # beside the logger's own file


def test_wandb(tasks, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(
        project="continual-eval-test", save_dir=str(tmp_path / "save"), offline=True
    )
    try:
        cb = fit(tasks, tmp_path, logger)
        run_id = logger.experiment.id
    finally:
        wandb.finish()
    folder = rf"(offline-)?run-\d{{8}}_\d{{6}}-{re.escape(run_id)}"
    check(cb, row("`WandbLogger"), save_dir=re.escape(str(tmp_path / "save")), run_folder=folder)


def test_mlflow(tasks, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow.tracking import MlflowClient

    uri = f"file:{tmp_path / 'mlruns'}"
    logger = MLFlowLogger(experiment_name="continual", tracking_uri=uri)
    cb = fit(tasks, tmp_path, logger, log_images=False)
    check(
        cb,
        row("`MLFlowLogger"),
        default_root_dir=re.escape(str(tmp_path / "root")),
        run_id=re.escape(logger.run_id),
    )
    # the logger's copy of results.json is the same document
    client = MlflowClient(tracking_uri=uri)
    local = client.download_artifacts(logger.run_id, "continual/results.json", str(tmp_path))
    assert json.loads(Path(local).read_text()) == cb.results()


def test_dirpath_wins_over_every_logger(tasks, tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    csv_logger = CSVLogger(tmp_path / "save", name="csv")
    cb = fit(tasks, tmp_path, csv_logger, dirpath=tmp_path / "mine")
    assert cb.results_dir == tmp_path / "mine"
    # a CSVLogger elsewhere gets its own copy of the CSV files
    assert (Path(csv_logger.log_dir) / "scores.csv").read_text() == (
        tmp_path / "mine" / "scores.csv"
    ).read_text()

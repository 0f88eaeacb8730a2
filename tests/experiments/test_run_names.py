"""``continual-eval fit`` never writes outside ``stream.save_dir``: ``stream.experiment`` and
``stream.method`` that are not plain directory names (``../..``, separators, control characters,
empty) are refused before anything is created, and so is a run directory that a symbolic link
inside ``save_dir`` would send elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from continual_eval.cli import main as continual_eval
from continual_eval.experiments.cli import (
    MAX_RUN_NAME_LENGTH,
    RunNameError,
    StreamOptions,
    check_run_name,
)

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "logistic.yaml"


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    ("option", "value"),
    [("experiment", "../.."), ("method", "../.."), ("method", "x/../../.."), ("experiment", "..")],
)
def test_fit_refuses_escaping_names(
    tmp_path: Path, capsys, monkeypatch, option: str, value: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    save_dir = work / "runs"
    argv = ["fit", "--config", str(CONFIG), f"--stream.save_dir={save_dir}"]
    argv += ["--stream.report=false", f"--stream.{option}={value}"]
    before = tree(tmp_path)
    assert continual_eval(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"continual-eval fit: stream.{option}: {value!r} cannot be a directory name: "
        + (
            "it holds a path separator"
            if "/" in value
            else "it names the current or the parent directory"
        )
    ]
    assert tree(tmp_path) == before  # nothing created, inside or outside save_dir


def test_fit_refuses_symlink_out_of_save_dir(tmp_path: Path, capsys) -> None:
    save_dir, outside = tmp_path / "runs", tmp_path / "outside"
    save_dir.mkdir()
    outside.mkdir()
    (save_dir / "logistic").symlink_to(outside, target_is_directory=True)
    argv = ["fit", "--config", str(CONFIG), f"--stream.save_dir={save_dir}"]
    assert continual_eval([*argv, "--stream.report=false"]) == 2
    err = capsys.readouterr().err
    assert "outside stream.save_dir" in err and str(outside.resolve() / "version_0") in err
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "it is empty"),
        (".", "current or the parent directory"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        ("x\ny", "control, format or line-separator"),
        ("x\x00y", "control, format or line-separator"),
        ("abc\u202egpj.exe", "control, format or line-separator"),  # right-to-left override
        (" naive", "leading or trailing whitespace"),
        ("n" * (MAX_RUN_NAME_LENGTH + 1), f"at most {MAX_RUN_NAME_LENGTH}"),
        (3, "expected a string"),
    ],
)
def test_unsafe_names_refused(value: object, problem: str) -> None:
    with pytest.raises(RunNameError, match=f"^stream.method: .*{problem}"):
        StreamOptions(method=value)  # type: ignore[arg-type]
    with pytest.raises(RunNameError, match=f"^stream.experiment: .*{problem}"):
        StreamOptions(experiment=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["logistic", "split digits", "naive-sgd_v1.0", "réplay", "..a"])
def test_plain_names_accepted(tmp_path: Path, value: str) -> None:
    assert check_run_name(value, "stream.method") == value
    assert StreamOptions(experiment=value, method=value).method == value
    made = tmp_path / value / value
    made.mkdir(parents=True)  # a real directory, inside tmp_path
    assert os.path.commonpath([made.resolve(), tmp_path.resolve()]) == str(tmp_path.resolve())

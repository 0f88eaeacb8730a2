"""``continual-eval fit``: run a task stream from a LightningCLI config and write its report.

The config is an ordinary LightningCLI file (``trainer``, ``model``, ``data``, ``seed_everything``)
plus two sections of this command:

``continual``  arguments of [`ContinualEvalCallback`][continual_eval.ContinualEvalCallback] (its
test loaders and
               task names come from the datamodule, which must be a `TaskStreamDataModule`;
               ``task_classes: [[0, 1], [2, 3], ...]`` turns on class-incremental evaluation,
               as in ``configs/digits_class_incremental.yaml``);
``stream``     `StreamOptions`: experiment name, method label, seeds, reference model
               (``reference: none | isolated | joint | cumulative``), report.

``trainer.max_epochs`` is the training budget *per task*. Each task is one ``trainer.fit`` on the
same Trainer (``fit_loop.max_epochs`` is raised before each); one line per stage says how many
epochs it trained (Lightning's own "max_epochs=N reached" counts every stage so far and is not
shown). Without a logger in the config the run writes CSV and TensorBoard files to
``runs/<experiment>[/<method>]/version_N``; results.json, scores.csv and the report
(``report/``) go to the same directory, which is printed.

Optional packages (``pip install "continual-eval[experiments]"``): without tensorboard the default
loggers are CSV only (one line says so); without matplotlib the report's figures are skipped (one
line names the extra) and results.json / scores.csv are still written; a config that needs a
missing package (scikit-learn for the digits) stops with a one-line message naming the extra,
exit code 1.

``stream.experiment`` and ``stream.method`` become directory names, so they are checked, not
rewritten: a name is refused (exit code 2, a one-line message naming the option) when it is empty,
``.`` or ``..``, longer than `MAX_RUN_NAME_LENGTH` characters, has leading or trailing
whitespace, or holds a path separator (``/`` or ``\\``, on every platform) or a control, format
or line-separator character. The resolved run directory must also lie inside ``stream.save_dir``
(a symbolic link inside it that points elsewhere is refused too). A ``stream.reference`` other
than ``none``, ``isolated``, ``joint`` or ``cumulative`` is refused the same way (exit code 2,
one line).

With ``stream.reference: isolated``, ``joint`` or ``cumulative`` the reference (see
`continual_eval.references`) is trained before the stream, its per-task scores are stored in
results.json as ``metadata["reference"]`` with ``metadata["reference_kind"]``, and the end of the
run prints, from [`continual_eval.functional`][continual_eval.functional], the intransigence per
task and its mean (``intransigence_per_task``, ``intransigence``) and, for an isolated reference,
the forward transfer against it (``forward_transfer_per_task`` / ``forward_transfer`` with
``convention="isolated"``).
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import unicodedata
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from continual_eval.callback import ContinualEvalCallback
from continual_eval.experiments.stream import (
    REFERENCE_OPTIONS,
    TaskStreamDataModule,
    fit_stream,
    progress,
    run_dir_of,
)
from continual_eval.functional import (
    forward_transfer,
    forward_transfer_per_task,
    intransigence,
    intransigence_per_task,
)
from continual_eval.report import write_report

__all__ = [
    "MAX_RUN_NAME_LENGTH",
    "OptionError",
    "RunNameError",
    "StreamCLI",
    "StreamOptions",
    "check_run_name",
    "main",
    "tensorboard_available",
]

#: longest ``stream.experiment`` / ``stream.method`` (one directory name each)
MAX_RUN_NAME_LENGTH = 100
#: the extra that installs what ``fit`` can use beyond the base install
EXPERIMENTS_EXTRA = 'pip install "continual-eval[experiments]"'
#: top-level modules of that extra (and what Lightning may use in tensorboard's place)
OPTIONAL_MODULES = frozenset({"tensorboard", "tensorboardX", "matplotlib", "sklearn"})
#: Lightning's multi-line warning when ``logger=True`` finds no TensorBoard (this command replaces
#: the Trainer's default logger anyway, and says so in one line)
_NO_TENSORBOARD_WARNING = r"(?s)Starting from v1\.9\.0, `tensorboardX` has been removed"
_UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


class RunNameError(ValueError):
    """A run name that cannot be used as one directory of the run path, or a run directory that
    resolves outside ``save_dir``."""


class OptionError(ValueError):
    """A ``stream`` option with a value this command does not accept (exit code 2)."""


def check_run_name(value: object, option: str) -> str:
    """``value`` when it can be one directory name of a run path, else `RunNameError`
    naming ``option``: a non-empty string of at most `MAX_RUN_NAME_LENGTH` characters, not
    ``.`` or ``..``, without ``/``, ``\\``, control, format or line-separator characters and
    without leading or trailing whitespace."""
    shown = repr(value) if len(repr(value)) <= 60 else f"{repr(value)[:60]}..."
    if not isinstance(value, str):
        raise RunNameError(f"{option}: expected a string, found {shown}")
    problem = None
    if not value:
        problem = "it is empty"
    elif value in {".", ".."}:
        problem = "it names the current or the parent directory"
    elif len(value) > MAX_RUN_NAME_LENGTH:
        problem = f"it has {len(value)} characters (at most {MAX_RUN_NAME_LENGTH})"
    elif "/" in value or "\\" in value or (os.altsep and os.altsep in value):
        problem = "it holds a path separator"
    elif any(unicodedata.category(ch) in _UNSAFE_CATEGORIES for ch in value):
        problem = "it holds a control, format or line-separator character"
    elif value != value.strip():
        problem = "it has leading or trailing whitespace"
    if problem is not None:
        raise RunNameError(f"{option}: {shown} cannot be a directory name: {problem}")
    return value


def _check_inside(run_dir: Path, save_dir: Path) -> None:
    """`RunNameError` unless ``run_dir`` resolves (symbolic links followed) inside
    ``save_dir``."""
    root, resolved = save_dir.resolve(), run_dir.resolve()
    if not resolved.is_relative_to(root):
        raise RunNameError(
            f"stream: the run directory {run_dir} resolves to {resolved}, outside "
            f"stream.save_dir {root} (a symbolic link?)"
        )


@dataclass
class StreamOptions:
    """Options of ``continual-eval fit`` (the ``stream`` section of a config).

    Args:
        experiment: experiment name; runs go to ``<save_dir>/<experiment>/<method>/version_N``
            (``<save_dir>/<experiment>/version_N`` without a method) unless a logger is set.
            Must be a safe directory name (`check_run_name`).
        method: method label, stored in the metadata (default: the model's ``method``
            attribute, else its class name); a safe directory name when set.
        seeds: run the whole stream once per seed (each in its own run directory); empty = once,
            with ``seed_everything``.
        reference: ``none``; ``isolated``: before the stream, train a fresh copy of the untrained
            model on each task alone (``trainer.max_epochs`` epochs, the stream's budget per
            task); ``joint``: one fresh copy on all tasks' training data together
            (``trainer.max_epochs`` epochs over the union: every example seen as often as in the
            stream); ``cumulative``: copy ``k`` on the training data of tasks ``0..k``, the same
            epochs over that union (Chaudhry et al.'s reference of intransigence, ``T`` fits).
            Their per-task scores go to ``metadata["reference"]`` and the kind to
            ``metadata["reference_kind"]``; the fit prints intransigence (and, isolated, FWT
            against isolated training). See `continual_eval.references`.
        report: write the report (PNGs + report.md) into ``<run_dir>/report`` after the stream.
        save_dir: root of the default loggers.
    """

    experiment: str = "stream"
    method: str | None = None
    seeds: list[int] = field(default_factory=list)
    reference: str = "none"
    report: bool = True
    save_dir: str = "runs"

    def __post_init__(self) -> None:
        check_run_name(self.experiment, "stream.experiment")
        if self.method is not None:
            check_run_name(self.method, "stream.method")
        if not isinstance(self.reference, str) or self.reference not in REFERENCE_OPTIONS:
            raise OptionError(
                f"stream.reference: {self.reference!r} is not one of {', '.join(REFERENCE_OPTIONS)}"
            )


class StreamCLI(LightningCLI):
    """LightningCLI with the ``continual`` and ``stream`` sections; nothing runs on construction."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_class_arguments(
            ContinualEvalCallback,
            "continual",
            skip={"test_dataloaders", "task_names", "epochs_per_task"},
            instantiate=False,
        )
        parser.add_class_arguments(StreamOptions, "stream", instantiate=False)


def tensorboard_available() -> bool:
    """Whether `TensorBoardLogger` can write here: tensorboard
    (or tensorboardX) imports. Lightning itself only checks the installed-package metadata."""
    for module in ("tensorboard", "tensorboardX"):
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        return True
    return False


def _default_loggers(save_dir: str, name: str, *, tensorboard: bool = True) -> list[Any]:
    """CSV and TensorBoard loggers sharing ``save_dir/name/version_N`` (N resolved now); CSV only
    with ``tensorboard=False``."""
    csv_logger = CSVLogger(save_dir, name=name)
    version = csv_logger.version  # resolve before either logger creates its directory
    if not tensorboard:
        return [csv_logger]
    return [csv_logger, TensorBoardLogger(save_dir, name=name, version=version)]


def _missing_optional(err: BaseException) -> str | None:
    """The optional module (`OPTIONAL_MODULES`) whose failed import caused ``err``, if any:
    ``err`` itself or an error down its chain of causes (jsonargparse wraps what a class's
    ``__init__`` raised in its own errors)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ImportError):
            name = (current.name or "").split(".")[0]
            if name in OPTIONAL_MODULES:
                return name
        current = current.__cause__ or current.__context__
    return None


def _write_report(paths: list[Path], out_dir: Path) -> Path | None:
    """`write_report`, or ``None`` and one line naming the extra
    when matplotlib (the figures) is not installed."""
    try:
        return write_report(paths, out_dir)
    except ImportError as err:
        if _missing_optional(err) != "matplotlib":
            raise
        progress(
            f"report skipped: its figures need matplotlib ({EXPERIMENTS_EXTRA}, or "
            '"continual-eval[plot]"); results.json and scores.csv are written, draw the report '
            "later with: continual-eval report " + " ".join(str(p) for p in paths)
        )
        return None


def _print_reference_metrics(callback: ContinualEvalCallback, kind: str) -> None:
    """Intransigence (per task and mean) against the run's reference and, for an isolated one,
    the forward transfer against it (per task ``j >= 1`` and mean), from the functional layer."""
    scores = callback.scores
    ref = torch.tensor(
        [math.nan if v is None else v for v in callback.metadata["reference"]], dtype=torch.float64
    )
    if scores.shape[0] != scores.shape[1]:
        progress(f"reference metrics skipped: {scores.shape[0]} of {scores.shape[1]} stages ran")
        return
    options = {
        "higher_is_better": bool(callback.scorer.higher_is_better),
        "bounds": callback.scorer.bounds,
    }
    per_task = intransigence_per_task(scores, ref, **options)
    mean = intransigence(scores, ref, **options)
    progress(
        f"intransigence={float(mean):.4f} ({kind} reference; ref[j] - R[j, j] per task: "
        + _row(per_task)
        + ")"
    )
    if kind == "isolated" and scores.shape[0] > 1:
        fwt = forward_transfer(scores, ref, convention="isolated", **options)
        fwt_per_task = forward_transfer_per_task(scores, ref, convention="isolated", **options)
        progress(
            f"fwt_isolated={float(fwt):.4f} (R[j, j] - ref[j] per task j >= 1: "
            + _row(fwt_per_task)
            + ")"
        )


def _row(values: torch.Tensor) -> str:
    return "  ".join(f"{float(v):.4f}" for v in values)


def _method_name(model: pl.LightningModule, options: StreamOptions) -> str:
    if options.method:
        return options.method
    return str(getattr(model, "method", type(model).__name__))


def _build_cli(argv: list[str]) -> StreamCLI:
    with warnings.catch_warnings():
        # ``args=`` is how this command passes its argv; LightningCLI warns whenever sys.argv
        # also holds something (here: the ``continual-eval fit`` words themselves)
        warnings.filterwarnings("ignore", message=".*args parameter is intended to run.*")
        warnings.filterwarnings("ignore", message=_NO_TENSORBOARD_WARNING)
        return StreamCLI(
            args=argv,
            run=False,
            datamodule_class=TaskStreamDataModule,
            subclass_mode_data=True,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"prog": "continual-eval fit"},
        )


def _run(cli: StreamCLI, notices: set[str] | None = None) -> Path:
    """Run the stream configured in ``cli`` once and return its run directory. A notice is
    printed once per ``notices`` set (one set per command, shared by its seeds)."""
    notices = set() if notices is None else notices
    config = cli.config
    options = StreamOptions(**config["stream"].as_dict())
    # instantiated: a scorer given as class_path/init_args (e.g. a GenerationScorer) is an object
    callback_kwargs = cli.config_init["continual"].as_dict()
    trainer, model, datamodule = cli.trainer, cli.model, cli.datamodule
    if config["trainer"].get("logger") in (None, True):
        name = f"{options.experiment}/{options.method}" if options.method else options.experiment
        tensorboard = tensorboard_available()
        if not tensorboard and "tensorboard" not in notices:
            notices.add("tensorboard")
            progress(
                "tensorboard is not installed: logging to CSV only (metrics.csv); for "
                f"TensorBoard files: {EXPERIMENTS_EXTRA}"
            )
        trainer.loggers = _default_loggers(options.save_dir, name, tensorboard=tensorboard)
        _check_inside(Path(trainer.loggers[0].log_dir), Path(options.save_dir))
    run_dir = run_dir_of(trainer, callback_kwargs)
    progress(f"run directory: {run_dir}")
    seed = config.get("seed_everything")
    metadata = {
        "experiment": options.experiment,
        "method": _method_name(model, options),
        "seed": None if seed is None or seed is False else int(seed),
    }
    callback = fit_stream(
        trainer,
        model,
        datamodule,
        callback_kwargs=callback_kwargs,
        metadata=metadata,
        reference=options.reference,
    )
    if options.reference != "none":
        _print_reference_metrics(callback, options.reference)
    progress(f"results: {callback.results_dir}")
    if options.report:
        written = _write_report([run_dir], run_dir / "report")
        if written is not None:
            progress(f"report: {written}")
    return run_dir


def main(argv: Sequence[str] | None = None) -> int:
    """``continual-eval fit --config CONFIG.yaml [--key value ...]``; returns the exit code.

    With ``stream.seeds: [s0, s1, ...]`` the stream runs once per seed and a report over all of
    them is written beside the run directories, in ``report/``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    notices: set[str] = set()
    try:
        cli = _build_cli(args)
        StreamOptions(**cli.config["stream"].as_dict())
        seeds = [int(s) for s in cli.config["stream"]["seeds"] or []]
        if not seeds:
            _run(cli, notices)
            return 0
        run_dirs = [
            _run(_build_cli([*args, f"--seed_everything={seed}"]), notices) for seed in seeds
        ]
    except (RunNameError, OptionError) as err:
        print(f"continual-eval fit: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        missing = _missing_optional(err)
        if missing is None:
            raise
        package = {"sklearn": "scikit-learn"}.get(missing, missing)
        print(
            f"continual-eval fit: this run needs {package}, which is not installed: "
            f"{EXPERIMENTS_EXTRA}",
            file=sys.stderr,
        )
        return 1
    progress(f"runs: {' '.join(str(d) for d in run_dirs)}")
    if cli.config["stream"]["report"]:
        written = _write_report(run_dirs, run_dirs[0].parent / "report")
        if written is not None:
            progress(f"report over {len(run_dirs)} seeds: {written}")
    return 0

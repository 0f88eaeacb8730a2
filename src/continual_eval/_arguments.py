"""Checks of ``ContinualEvalCallback``'s arguments, done at construction (each names the argument
and what is wrong): the choices and flags, the task names, the scorers, the metadata (what a run
writes to ``results.json`` must be JSON), the per-step options, and at the first fit the number
of test loaders."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from continual_eval._class_incremental_recorder import (
    ClassIncrementalRecord,
    class_incremental_scorers,
)
from continual_eval._held_out_record import HeldOutRecord
from continual_eval._item_record import DEFAULT_MAX_BYTES, ItemRecord, ItemSettings
from continual_eval._loader_list import as_loader_list
from continual_eval._predictions import (
    PredictionsRecord,
    check_predictions,
    generation_scorers,
    keep_items,
)
from continual_eval._stage_budget import StageBudget, StageBudgetRecord
from continual_eval._stage_journal import replay
from continual_eval.evaluation.class_incremental import AGNOSTIC_NAME, TaskAgnosticAccuracyScorer
from continual_eval.evaluation.scorers import (
    AccuracyScorer,
    MetricScorer,
    Scorer,
    item_support,
    make_scorer,
)
from continual_eval.evaluation.task_loaders import TaskLoaders
from continual_eval.functional.intervals import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES
from continual_eval.options import StepEvaluation
from continual_eval.record import MatrixSpec, RecordSection, RunRecord
from continual_eval.results.files import JOURNAL_FILE, RESULTS_FILE, read_run_id
from continual_eval.results.reference import reference_items, resolve_reference
from continual_eval.results.schema import MAX_NAME_LENGTH, MAX_TASKS

__all__ = [
    "Scoring",
    "check_budget_with_classes",
    "check_cache",
    "check_choice",
    "check_epochs_per_task",
    "check_flags",
    "check_held_out",
    "check_item_records",
    "check_lca_beta",
    "check_loader_count",
    "check_metadata",
    "check_same_run",
    "check_task_names",
    "class_incremental_scorers",
    "item_matrices",
    "resolve_scorers",
    "resolve_scoring",
    "run_record",
    "step_settings",
    "subset_description",
]


def check_choice(name: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def check_flags(**flags: object) -> None:
    """Every flag is ``True`` or ``False``."""
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be True or False, got {flag!r}")


def check_epochs_per_task(epochs_per_task: object) -> int | None:
    if epochs_per_task is not None and (
        not isinstance(epochs_per_task, int)
        or isinstance(epochs_per_task, bool)
        or epochs_per_task < 1
    ):
        raise ValueError(f"epochs_per_task must be a positive int or None, got {epochs_per_task!r}")
    return epochs_per_task


def check_lca_beta(lca_beta: object, steps: StepEvaluation | None) -> int | None:
    """``LCA_beta`` reads the score after each of the first ``beta`` optimizer steps of every
    stage: it needs per-step evaluations every step."""
    if lca_beta is None:
        return None
    if not isinstance(lca_beta, int) or isinstance(lca_beta, bool) or lca_beta < 0:
        raise ValueError(f"lca_beta must be a non-negative int or None, got {lca_beta!r}")
    if steps is None or (lca_beta > 0 and steps.every_n_steps != 1):
        every = None if steps is None else steps.every_n_steps
        raise ValueError(
            f"lca_beta={lca_beta} reads the score of every stage's task after each of its "
            f"first {lca_beta} optimizer steps (from the per-step evaluations): set "
            f"eval_every_n_steps=1 (got {every})"
        )
    return lca_beta


def check_cache(cache_test_batches: object, cache_max_bytes: object) -> None:
    if cache_test_batches not in (None, True, False):
        raise ValueError(
            f"cache_test_batches must be None (auto), True or False, got {cache_test_batches!r}"
        )
    if (
        not isinstance(cache_max_bytes, int)
        or isinstance(cache_max_bytes, bool)
        or cache_max_bytes < 0
    ):
        raise ValueError(f"cache_max_bytes must be a non-negative int, got {cache_max_bytes!r}")


def check_task_names(task_names: object) -> list[str] | None:
    """The names as a list: strings of 1 to ``MAX_NAME_LENGTH`` characters."""
    if task_names is None:
        return None
    if (
        isinstance(task_names, str)
        or not isinstance(task_names, Sequence)
        or not all(isinstance(n, str) for n in task_names)
    ):
        raise TypeError(f"task_names must be a list of strings, got {task_names!r}")
    for j, name in enumerate(task_names):
        if not name or len(name) > MAX_NAME_LENGTH:
            raise ValueError(
                f"task_names[{j}] has {len(name)} characters; a task name must have 1 to "
                f"{MAX_NAME_LENGTH} (the results.json limit readers enforce)"
            )
    return list(task_names)


def check_loader_count(
    num_loaders: int, task_names: Sequence[str] | None, recorded: int | None = None
) -> None:
    """At least one and at most ``MAX_TASKS`` test loaders, one per given task name (and per
    task of a run ``recorded`` already)."""
    if recorded is not None and recorded != num_loaders:
        raise ValueError(
            f"ContinualEvalCallback recorded a run of {recorded} tasks but {num_loaders} test "
            "dataloaders were given"
        )
    if num_loaders > MAX_TASKS:
        raise ValueError(
            f"{num_loaders} test dataloaders; results.json holds at most {MAX_TASKS} tasks"
        )
    if num_loaders == 0:
        raise ValueError("ContinualEvalCallback needs at least one test dataloader (one per task)")
    if task_names is not None and len(task_names) != num_loaders:
        raise ValueError(
            f"task_names has {len(task_names)} names for {num_loaders} test dataloaders"
        )


_SCORER_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def resolve_scorers(
    scorers: Mapping[str, Any] | Sequence[Any] | None, metric: Any
) -> dict[str, Scorer]:
    """``name -> Scorer`` from the ``scorers`` argument (or the ``metric`` shorthand); the first
    is the primary scorer. Names become log keys and file names (``scores_<name>.csv``)."""
    if scorers is not None and metric is not None:
        raise ValueError("give either metric= (one scorer) or scorers=, not both")
    if scorers is None:
        if metric is None:
            return {"acc": AccuracyScorer()}
        only = MetricScorer(metric)
        return {only.name: only}
    if isinstance(scorers, Mapping):
        pairs = [(name, make_scorer(spec)) for name, spec in scorers.items()]
    elif isinstance(scorers, Sequence) and not isinstance(scorers, str):
        built = [make_scorer(spec) for spec in scorers]
        pairs = [(scorer.name, scorer) for scorer in built]
    else:
        raise TypeError(
            f"scorers must be a mapping name -> scorer or a list of scorers, got "
            f"{type(scorers).__name__}"
        )
    if not pairs:
        raise ValueError("scorers is empty: give at least one scorer (default: accuracy)")
    resolved: dict[str, Scorer] = {}
    for name, scorer in pairs:
        if not isinstance(name, str) or not _SCORER_KEY.match(name):
            raise ValueError(
                f"scorer name {name!r}: use 1 to 64 letters, digits, '_', '.' or '-' (it names "
                "log keys and files)"
            )
        if name in resolved:
            raise ValueError(f"two scorers are named {name!r}: give them distinct names")
        resolved[name] = scorer
    return resolved


def check_metadata(metadata: Mapping[str, Any] | None) -> None:
    """``metadata`` must be a mapping that ``json.dumps`` writes as is (no NaN/inf)."""
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")

    def walk(value: Any, path: str) -> None:
        if value is None or isinstance(value, (bool, int, str)):
            return
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(
                    f"metadata{path} = {value!r} cannot be written to results.json (JSON has no "
                    "NaN/inf); use None or a string"
                )
            return
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise TypeError(
                        f"metadata{path} has the key {key!r} ({type(key).__name__}); JSON object "
                        "keys must be strings"
                    )
                walk(item, f"{path}[{key!r}]")
            return
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]")
            return
        raise TypeError(
            f"metadata{path} is a {type(value).__name__} ({value!r:.80}), which results.json "
            "(JSON) cannot hold; give str, int, float, bool, None, lists or dicts of them"
        )

    walk(metadata, "")
    json.dumps(metadata, allow_nan=False)


def check_state_version(state: Mapping[str, Any], version: int) -> None:
    """Refuse a checkpoint state of another ``version`` than this callback writes."""
    if state.get("version") != version:
        raise ValueError(
            f"ContinualEvalCallback state has version {state.get('version')!r}; expected {version}"
        )


def check_same_run(
    state: Mapping[str, Any],
    record: RunRecord,
    *,
    epochs_per_task: int | None,
    step_evaluation: StepEvaluation | None,
    task_names: Sequence[str] | None,
) -> None:
    """Refuse a checkpoint's callback state recorded under settings that would relabel or mix
    its rows (the record's own settings, see `RunRecord.settings_differ`, the schedule,
    the per-step subset and the given task names)."""
    recorded = state["record"]
    if len(recorded["task_names"]) != record.num_tasks:
        raise ValueError(
            f"the checkpoint's ContinualEvalCallback state has {len(recorded['task_names'])} "
            f"tasks but {record.num_tasks} test dataloaders were given"
        )
    differ = record.settings_differ(recorded)
    for key, old, new in (
        ("epochs_per_task", state["epochs_per_task"], epochs_per_task),
        ("eval_every_n_steps", state["step_evaluation"], step_settings(step_evaluation)),
        ("task_names", recorded["task_names"], list(task_names or recorded["task_names"])),
    ):
        if old != new:
            differ.append((key, old, new))
    if differ:
        raise ValueError(
            "ContinualEvalCallback: the checkpoint's state was recorded with other settings; "
            "resuming would relabel or mix its rows: "
            + "; ".join(f"{key}: recorded {old!r}, now {new!r}" for key, old, new in differ)
            + ". Resume with the recorded settings, or start a new run (no checkpoint)"
        )


def step_settings(steps: StepEvaluation | None) -> dict[str, Any] | None:
    """What of the per-step settings a checkpoint's rows depend on (the subset)."""
    if steps is None:
        return None
    return {"subset": steps.subset, "subset_seed": steps.subset_seed}


def check_held_out(held_out: object, task_classes: object) -> dict[str, Any]:
    """``held_out_dataloaders``: a mapping of distinct non-empty names to loaders, not with
    ``task_classes`` (whose scorers score a task's own classes: a held-out set has none)."""
    if held_out is None:
        return {}
    if not isinstance(held_out, Mapping):
        raise TypeError(
            "held_out_dataloaders must be a mapping name -> test loader, got "
            f"{type(held_out).__name__}"
        )
    for name in held_out:
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
            raise ValueError(
                f"held_out_dataloaders: {name!r} is not a name (a non-empty string of at most "
                f"{MAX_NAME_LENGTH} characters)"
            )
    names = ", ".join(map(repr, held_out))
    as_loader_list(list(held_out.values()), f"held_out_dataloaders ({names}, in this order)")
    if held_out and task_classes is not None:
        raise ValueError(
            "held_out_dataloaders cannot be combined with task_classes: the class-incremental "
            "scorers score each task's own classes, and a held-out set belongs to no task"
        )
    return dict(held_out)


_ITEM_KEYS = ("scorers", "max_bytes", "confidence", "resamples", "seed")


def check_item_records(value: object, scorers: Mapping[str, Scorer]) -> ItemSettings | None:
    """``item_records=``: ``False``/``None`` (off), ``True`` (every matrix that is a mean over
    items), a list of matrix names (each must be one), or a mapping with the keys
    ``scorers`` (``None`` or names), ``max_bytes``, ``confidence``, ``resamples``, ``seed``."""
    if value is None or value is False:
        return None
    options: dict[str, Any] = {}
    if value is True:
        pass
    elif isinstance(value, Mapping):
        unknown = [k for k in value if k not in _ITEM_KEYS]
        if unknown:
            raise ValueError(
                f"item_records: unknown key {unknown[0]!r}; known keys: {', '.join(_ITEM_KEYS)}"
            )
        options = dict(value)
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        options = {"scorers": value}
    else:
        raise ValueError(
            "item_records must be True, False, a list of matrix names or a mapping "
            f"({', '.join(_ITEM_KEYS)}), got {value!r}"
        )
    names = options.pop("scorers", None)
    if names is not None:
        if isinstance(names, (str, bytes)) or not isinstance(names, Sequence) or not names:
            raise ValueError(
                f"item_records scorers must be a non-empty list of names, got {names!r}"
            )
        for name in names:
            if name not in scorers:
                raise ValueError(
                    f"item_records names {name!r}, which is no matrix of this run "
                    f"({', '.join(scorers)})"
                )
            problem = item_support(scorers[name])
            if problem is not None:
                raise ValueError(
                    f"item_records names {name!r}, whose score is not a mean over items the "
                    f"callback can record: {problem}"
                )
        names = tuple(dict.fromkeys(names))
    max_bytes = options.get("max_bytes", DEFAULT_MAX_BYTES)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"item_records max_bytes must be a positive int, got {max_bytes!r}")
    confidence = options.get("confidence", DEFAULT_CONFIDENCE)
    if (
        isinstance(confidence, bool)
        or not isinstance(confidence, (int, float))
        or not (0 < confidence < 1)
    ):
        raise ValueError(f"item_records confidence must be in (0, 1), got {confidence!r}")
    resamples, seed = options.get("resamples", DEFAULT_RESAMPLES), options.get("seed", 0)
    for key, number, low in (("resamples", resamples, 1), ("seed", seed, 0)):
        if isinstance(number, bool) or not isinstance(number, int) or number < low:
            raise ValueError(f"item_records {key} must be an int >= {low}, got {number!r}")
    return ItemSettings(names, max_bytes, float(confidence), resamples, seed)


def check_budget_with_classes(eval_old_tasks_every: object, task_classes: object) -> None:
    """``eval_old_tasks_every`` and ``task_classes`` exclude each other."""
    if eval_old_tasks_every is not None and task_classes is not None:
        raise ValueError(
            "eval_old_tasks_every cannot be combined with task_classes: the class-incremental "
            "confusion counts of a stage need every seen task scored (stage_eval_subset can)"
        )


class Scoring(NamedTuple):
    """What the callback scores with, resolved from its arguments: the scorers (the primary
    first, the class-incremental pair after the user's), ``predictions``, the item-record
    settings, the reference and the reference's per-item values (or why it has none)."""

    scorers: dict[str, Scorer]
    predictions: int | None
    item_settings: ItemSettings | None
    reference: Any
    reference_items: tuple[Sequence[Any] | None, str | None]


def resolve_scoring(
    scorers: Mapping[str, Any] | Sequence[Any] | None,
    metric: Any,
    task_classes: Sequence[Sequence[int]] | None,
    predictions: int | None,
    item_records: object,
    reference: Any,
) -> Scoring:
    """``scorers=``/``metric=``, ``task_classes=``, ``predictions=``, ``item_records=`` and
    ``reference=`` checked together (each error names its argument)."""
    resolved = resolve_scorers(scorers, metric)
    if task_classes is not None:  # the two class-incremental matrices, after the user's
        resolved.update(class_incremental_scorers(task_classes, resolved))
    kept = check_predictions(predictions, resolved)
    if kept is not None:
        keep_items(generation_scorers(resolved), kept)
    settings = check_item_records(item_records, resolved)
    if settings is not None:
        recorded, skipped = item_matrices(resolved, settings)
        if not recorded:
            raise ValueError(
                "item_records: no matrix of this run is a mean over items the callback can "
                "record: " + "; ".join(f"{name}: {why}" for name, why in skipped.items())
            )
    resolved_reference = resolve_reference(reference, next(iter(resolved.values())))
    items = (
        (None, None)
        if settings is None
        else reference_items(reference, resolved_reference, path_reference_items)
    )
    return Scoring(resolved, kept, settings, resolved_reference, items)


def item_matrices(
    scorers: Mapping[str, Scorer], settings: ItemSettings
) -> tuple[dict[str, bool], dict[str, str]]:
    """``(recorded matrix -> 0/1 items, skipped matrix -> why)``."""
    recorded, skipped = {}, {}
    for name, scorer in scorers.items():
        problem = item_support(scorer)
        if settings.matrices is not None and name not in settings.matrices:
            skipped[name] = "not named in item_records"
        elif problem is not None:
            skipped[name] = problem
        else:
            recorded[name] = bool(scorer.items_binary)  # type: ignore[attr-defined]
    return recorded, skipped


def run_record(
    scorers: Mapping[str, Scorer],
    task_names: Sequence[str],
    *,
    steps: StepEvaluation | None,
    held_out: Sequence[str] = (),
    predictions: int | None = None,
    budget: StageBudget | None = None,
    items: ItemSettings | None = None,
    reference_items: tuple[Sequence[Any] | None, str | None] = (None, None),
    **settings: Any,
) -> RunRecord:
    """The run record of the callback's scorers (a matrix each, the primary first) and settings
    (``forgetting``, ``metadata``, ``run_id``, ``reference``, ``lca_beta``), with the step curves
    when ``steps``, the class-incremental section when the scorers hold the task-agnostic one,
    the held-out section when ``held_out`` names sets and the predictions section with
    ``predictions`` (the item bound); ``reference_items``: the reference's per-item values of the
    primary matrix, or why it has none (`reference_items`)."""
    sections: list[RecordSection] = []
    specs = {name: MatrixSpec.of(scorer) for name, scorer in scorers.items()}
    agnostic = scorers.get(AGNOSTIC_NAME)
    if isinstance(agnostic, TaskAgnosticAccuracyScorer):
        sections.append(ClassIncrementalRecord(agnostic, task_names))
    if held_out:
        sections.append(HeldOutRecord(held_out, specs))
    if predictions is not None:
        names = list(generation_scorers(scorers))
        sections.append(PredictionsRecord(predictions, names, task_names, held_out))
    if budget is not None and budget.active:
        sections.append(StageBudgetRecord(budget, len(task_names)))
    if items is not None:
        recorded, skipped = item_matrices(scorers, items)
        if recorded:
            forgetting = settings.get("forgetting", "peak")
            sections.append(
                ItemRecord(
                    specs,
                    recorded,
                    skipped,
                    len(task_names),
                    items,
                    forgetting=forgetting,
                    primary=next(iter(specs)),
                    reference=reference_items[0],
                    reference_note=reference_items[1],
                    reference_kind=getattr(settings.get("reference"), "kind", None),
                    held_out=held_out,
                )
            )
    return RunRecord(
        specs,
        task_names,
        step_curves=steps is not None,
        sections=sections,
        **settings,
    )


def subset_description(
    steps: StepEvaluation | None, samples_per_task: Sequence[int]
) -> dict[str, Any] | None:
    """The fixed subset of the per-step evaluations as ``results.json`` describes it."""
    if steps is None or steps.subset is None:
        return None
    return {
        "size": steps.subset,
        "seed": steps.subset_seed,
        "samples_per_task": list(samples_per_task),
        "rule": "task j: sorted(randperm(len_j, generator=manual_seed(seed + j))[:size])",
    }


def describe_stage_subsets(record: RunRecord, loaders: TaskLoaders) -> None:
    """Give the record's ``stage_evaluation`` section each task's subset size and rule."""
    section = record.sections.get(StageBudgetRecord.key)
    if isinstance(section, StageBudgetRecord):
        section.set_subsets([len(i) for i in loaders.stage_indices], loaders.stage_rules)


def _journal_items(directory: Path, stage: int | None, task: int | None) -> list[Any] | None:
    """The primary matrix's items a run's stage journal holds (``stage=None``: its last stage;
    ``task``: that task's alone); ``None`` without a journal of this ``results.json``'s run or
    without items of the primary matrix."""
    if not (directory / JOURNAL_FILE).is_file():
        return None
    record = replay(directory / JOURNAL_FILE)
    if read_run_id(directory)[1] not in (None, record.run_id):
        return None  # another run's journal
    section = record.sections.get("items")
    primary = next(iter(record.specs))
    if not isinstance(section, ItemRecord) or primary not in section.binary or not section.stages:
        return None
    values = section.values(primary, len(section.stages) - 1 if stage is None else stage)
    tasks = sorted(values) if task is None else [task]
    if any(j not in values for j in tasks):
        return None
    return [values[j] for j in tasks]


def path_reference_items(path: Path) -> list[Any] | None:
    """The per-item values of the primary matrix behind a reference path's scores (what
    `continual_eval.results.reference.resolve_reference` reads): a run's last stage from the
    stage journal beside its ``results.json`` (``results.json`` itself holds no per-item values),
    or ``R[0, 0]``'s items of each ``task_j`` run of an isolated or cumulative directory;
    ``None`` where a journal or its items are missing."""
    directory = path.parent if path.is_file() else path
    if (directory / RESULTS_FILE).is_file():
        return _journal_items(directory, None, None)
    parts: list[Any] = []
    while (directory / f"task_{len(parts)}" / RESULTS_FILE).is_file():
        part = _journal_items(directory / f"task_{len(parts)}", 0, 0)
        if part is None:
            return None
        parts.extend(part)
    return parts or None

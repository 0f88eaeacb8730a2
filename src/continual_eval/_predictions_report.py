"""The predictions part of ``continual-eval report``: for a run with a ``predictions`` section, a
few items per task that went from right to wrong between the diagonal (after stage ``j``, the
task's own stage) and the final stage, read from the prediction files.

"Right" is the scorer's best score (the upper bound of its matrix: an exact match, a ROUGE-L of
1); for a scorer without an upper bound, any fall of the score counts (largest first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FORGOTTEN_PER_TASK", "Forgotten", "forgotten_items", "forgotten_lines"]

#: the items shown per task and scorer
FORGOTTEN_PER_TASK = 3
_TEXT_LIMIT = 80


@dataclass(frozen=True)
class Forgotten:
    """One task's forgotten items under one scorer: how many of the items kept in both files
    were right at the diagonal and are not at the final stage, and the first of them as
    ``(item, reference, diagonal prediction, final prediction, final score)``."""

    scorer: str
    task: int
    count: int
    compared: int
    items: tuple[tuple[int, str, str, str, float | None], ...]


def _cells(lines: list[dict[str, Any]], scorer: str) -> dict[int, dict[int, dict[str, Any]]]:
    """Task -> item -> line of ``scorer`` (the held-out sets' lines left out)."""
    out: dict[int, dict[int, dict[str, Any]]] = {}
    for line in lines:
        if line.get("scorer") == scorer and "task" in line:
            out.setdefault(int(line["task"]), {})[int(line["item"])] = line
    return out


def forgotten_items(
    results: Any, directory: Path, per_task: int = FORGOTTEN_PER_TASK
) -> tuple[list[Forgotten], list[str]]:
    """Per generation scorer and task ``j`` trained before the final stage: its forgotten items
    (see the module docstring), and notes on files that could not be read."""
    files = results.predictions
    s = results.stages_completed
    if files is None or s < 2:
        return [], []
    notes: list[str] = []
    read: dict[int, list[dict[str, Any]] | None] = {}

    def lines_of(stage: int) -> list[dict[str, Any]] | None:
        if stage not in read:
            entry = files.file(stage)
            try:
                read[stage] = None if entry is None else entry.read(directory)
            except ValueError as err:
                notes.append(str(err))
                read[stage] = None
        return read[stage]

    final = lines_of(s - 1)
    if final is None:
        return [], notes
    found: list[Forgotten] = []
    for scorer in files.scorers:
        matrix = results.matrices.get(scorer)
        upper = None if matrix is None or matrix.bounds is None else float(matrix.bounds[1])
        at_final = _cells(final, scorer)
        for j in range(min(s - 1, results.num_tasks)):
            diagonal_lines = lines_of(j)
            if diagonal_lines is None:
                continue
            diagonal = _cells(diagonal_lines, scorer).get(j, {})
            last = at_final.get(j, {})
            common = sorted(set(diagonal) & set(last))
            fallen = []
            for item in common:
                before, after = diagonal[item]["score"], last[item]["score"]
                if before is None or after is None:
                    continue
                if upper is not None:
                    if before >= upper and after < upper:
                        fallen.append((0.0, item))
                elif after < before:
                    fallen.append((after - before, item))
            fallen.sort()
            shown = tuple(
                (
                    item,
                    str(diagonal[item]["reference"]),
                    str(diagonal[item]["prediction"]),
                    str(last[item]["prediction"]),
                    last[item]["score"],
                )
                for _, item in fallen[:per_task]
            )
            found.append(Forgotten(scorer, j, len(fallen), len(common), shown))
    return found, notes


def _shown(text: str) -> str:
    from continual_eval._markdown import escape_markdown

    if not text:
        return "(empty)"
    cut = text if len(text) <= _TEXT_LIMIT else text[: _TEXT_LIMIT - 1] + "…"
    return escape_markdown(cut)


def _score(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.4f}"


def forgotten_lines(results: Any, directory: Path) -> list[str]:
    """``report.md`` lines of a run's forgotten items (none without a ``predictions`` section
    or before two stages)."""
    from continual_eval._markdown import escape_markdown

    found, notes = forgotten_items(results, directory)
    if not found and not notes:
        return []
    s = results.stages_completed
    names = results.task_names
    lines = ["### Forgotten items", ""]
    lines += [
        f"Items right after the task's own stage (the diagonal) and wrong after the final stage "
        f"({s - 1}), from the prediction files (at most {FORGOTTEN_PER_TASK} per task and "
        "scorer; right = the score's best value).",
        "",
    ]
    lines += [f"- {escape_markdown(note)}" for note in notes]
    if notes:
        lines.append("")
    if not found:
        return lines
    lines += [
        "| scorer | task | forgotten | item | reference | at the diagonal | at the final stage "
        "| final score |",
        "| --- | --- | ---: | ---: | --- | --- | --- | ---: |",
    ]
    for f in found:
        head = [
            escape_markdown(f.scorer),
            escape_markdown(names[f.task]),
            f"{f.count}/{f.compared}",
        ]
        if not f.items:
            lines.append("| " + " | ".join([*head, "", "", "", "", ""]) + " |")
        for k, (item, reference, before, after, score) in enumerate(f.items):
            cells = head if k == 0 else ["", "", ""]
            cells = [*cells, str(item), _shown(reference), _shown(before), _shown(after)]
            lines.append("| " + " | ".join([*cells, _score(score)]) + " |")
    return [*lines, ""]

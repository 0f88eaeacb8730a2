"""The ``continual-eval`` console command: one entry point, one sub-command per job.

``continual-eval fit --config configs/logistic.yaml``  run a task stream (LightningCLI)
``continual-eval report RUN_DIR [RUN_DIR ...]``       draw heatmaps, trajectories and tables
``continual-eval stream TRACE.jsonl [...]``           score reward-stream traces (continual RL)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

#: sub-command -> ("module:function", help); the function takes the remaining argv, returns a code.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "fit": ("continual_eval.experiments.cli:main", "train a task stream and write its report"),
    "report": ("continual_eval.report:main", "draw and tabulate what ContinualEvalCallback wrote"),
    "stream": ("continual_eval.stream.cli:main", "score reward-stream traces (JSON lines)"),
}


def _usage() -> str:
    lines = ["usage: continual-eval {" + ",".join(SUBCOMMANDS) + "} ...", "", "sub-commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``continual-eval SUBCOMMAND ...`` to the sub-command's own ``main(argv)``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"}:
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"continual-eval: unknown sub-command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name = SUBCOMMANDS[name][0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    result = func(rest)
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

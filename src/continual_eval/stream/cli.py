"""``continual-eval stream TRACE.jsonl [...]``: print the fifteen-row table per regime.

All trace files are traces of one run (aggregated per label, stage 1) unless ``--per-seed`` is
given, in which case each file is one seed and the table shows mean ± spread across seeds.
``--ceiling`` takes a number (explicit), ``data`` (data-relative bound from the traces), or a JSON
file holding either a reward specification (``{"components": [...]}``, analytic bound) or a bound
(``{"per_step": p, "final_step": f}``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from continual_eval.stream.aggregate import aggregate_seeds
from continual_eval.stream.metrics import compute_all_metrics
from continual_eval.stream.rewards import RewardSpec, UpperBound, data_relative_upper_bound
from continual_eval.stream.table import format_seed_table, format_table
from continual_eval.stream.trace import EpisodeTrace, read_jsonl

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="continual-eval stream",
        description="Score reward-stream traces (JSON lines, one step per line) per regime.",
    )
    p.add_argument("traces", nargs="+", type=Path, metavar="TRACE.jsonl")
    p.add_argument("--anchor", choices=("segment", "ceiling"), default="segment")
    p.add_argument("--alpha", type=float, default=None, help="default 0.9 segment, 0.5 ceiling")
    p.add_argument(
        "--eps",
        type=float,
        default=None,
        help="recovery tolerance: fraction (segment, default 0.30) or absolute (ceiling, "
        "default 0.5*|R_ub|)",
    )
    p.add_argument("--floor", type=float, default=0.005, help="recovery band floor")
    p.add_argument("--tail-fraction", type=float, default=0.2)
    p.add_argument("--zero-shot-window", type=int, default=10)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument(
        "--ceiling",
        default=None,
        help="a number, 'data', or a JSON file with a reward spec or {per_step, final_step}",
    )
    p.add_argument(
        "--reference",
        nargs="+",
        type=Path,
        default=None,
        metavar="REF.jsonl",
        help="reference trajectories for regret, one per trace",
    )
    p.add_argument(
        "--episode-end-components",
        default=None,
        help="comma-separated components paid at episode end (excluded from forgetting and "
        "the policy-only settled reward)",
    )
    p.add_argument("--solve-component", default=None, help="component counted for solve rate")
    p.add_argument("--per-seed", action="store_true", help="each trace file is one seed")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def _ceiling(value: str | None, traces: list[EpisodeTrace]) -> Any:
    if value is None:
        return None
    if value == "data":
        return data_relative_upper_bound(traces)
    try:
        return float(value)
    except ValueError:
        pass
    path = Path(value)
    if not path.is_file():
        raise ValueError(f"--ceiling {value!r} is neither a number, 'data', nor a JSON file")
    data = json.loads(path.read_text(encoding="utf-8"))
    if "components" in data:
        return RewardSpec.from_dict(data)
    if "per_step" in data:
        return UpperBound(
            per_step=float(data["per_step"]),
            final_step=float(data.get("final_step", data["per_step"])),
            derivation=str(data.get("derivation", "explicit")),
            details={"file": str(path)},
        )
    raise ValueError(f"{path}: expected a reward spec ('components') or a bound ('per_step')")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``continual-eval stream``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        traces = [read_jsonl(p) for p in args.traces]
        refs = None
        if args.reference is not None:
            if len(args.reference) != len(traces):
                raise ValueError(
                    f"{len(args.reference)} reference file(s) for {len(traces)} trace file(s)"
                )
            refs = [read_jsonl(p) for p in args.reference]
        ends = None
        if args.episode_end_components:
            ends = [s.strip() for s in args.episode_end_components.split(",") if s.strip()]
        kwargs: dict[str, Any] = {
            "anchor": args.anchor,
            "alpha": args.alpha,
            "eps": args.eps,
            "recovery_floor": args.floor,
            "tail_fraction": args.tail_fraction,
            "zero_shot_window": args.zero_shot_window,
            "gamma": args.gamma,
            "ceiling": _ceiling(args.ceiling, traces),
            "episode_end_components": ends,
            "solve_component": args.solve_component,
        }
        if args.per_seed:
            per_seed = [
                compute_all_metrics([tr], reference=None if refs is None else [refs[i]], **kwargs)
                for i, tr in enumerate(traces)
            ]
            agg = aggregate_seeds(per_seed)
            out: Any = {**agg, "per_seed": per_seed}
            text = format_seed_table(agg)
        else:
            out = compute_all_metrics(traces, reference=refs, **kwargs)
            text = format_table(out)
    except (OSError, ValueError) as err:
        print(f"continual-eval stream: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=2, allow_nan=False))
    else:
        print(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

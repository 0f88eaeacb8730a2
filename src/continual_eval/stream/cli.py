"""``continual-eval stream TRACE.jsonl [...]``: print the fifteen-row table per regime.

All trace files are traces of one run (aggregated per label, stage 1) unless ``--per-seed`` is
given, in which case each file is one seed and the table shows mean ± spread across seeds.
``--ceiling`` takes a number (explicit), ``data`` (data-relative bound from the traces), or a JSON
file holding either a reward specification (``{"components": [...]}``, analytic bound) or a bound
(``{"per_step": p, "final_step": f}``).

Every number is validated by argparse (finite, inside its documented range); a bad value, a
malformed trace line or ceiling file is a one-line error naming the option, or the file, line and
field, with exit code 2.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from continual_eval.stream.aggregate import aggregate_seeds
from continual_eval.stream.json_output import json_text
from continual_eval.stream.metrics import compute_all_metrics
from continual_eval.stream.rewards import data_relative_upper_bound, read_ceiling_file
from continual_eval.stream.table import (
    DEFAULT_LABEL_WIDTH,
    format_seed_table,
    format_table,
    shown_label,
)
from continual_eval.stream.trace import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_LINE_BYTES,
    EpisodeTrace,
    read_jsonl,
)

__all__ = ["build_parser", "main"]


def real_in(
    low: float, high: float, *, low_open: bool = False, high_open: bool = False
) -> Callable[[str], float]:
    """An argparse ``type=``: a finite float in ``[low, high]`` (``(`` / ``)`` where open)."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        if not (math.isfinite(value) and above and below):
            raise argparse.ArgumentTypeError(
                f"expected a finite number in {interval}, got {text!r}"
            )
        return value

    parse.__name__ = f"number in {interval}"
    return parse


def positive_int(text: str) -> int:
    """An argparse ``type=``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def ceiling_arg(text: str) -> float | str | Path:
    """An argparse ``type=`` for ``--ceiling``: a finite number, ``data``, or an existing file."""
    if text == "data":
        return text
    try:
        value = float(text)
    except ValueError:
        path = Path(text)
        if not path.is_file():
            raise argparse.ArgumentTypeError(
                f"expected a finite number, 'data' or a JSON file, got {text!r} (no such file)"
            ) from None
        return path
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(
            f"expected a finite number, 'data' or a JSON file, got {text!r}"
        )
    return value


TRACE_FORMAT_EPILOG = """\
trace format (JSON lines, one object per step, steps in increasing order):
  {"step": 0, "reward": 0.8, "regime_id": "a"}
  {"step": 1, "reward": 0.5, "regime_id": "a_again", "regime_origin": "a"}
required: step (integer, strictly increasing), reward (number), regime_id (string: the
configuration label the step ran under). optional: regime_origin (string: the label an alias
revisits), components (object of name -> number), invalid_action (true/false), effective_rank
(number), episode_end (true/false). Any other field, or a value of the wrong type, is an error
naming the file, line and field (exit status 2); blank lines are skipped. RewardStreamCallback
writes this format (stream_trace.jsonl). Full schema and metric definitions: docs/stream.md.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="continual-eval stream",
        description="Score reward-stream traces (JSON lines, one step per line) per regime:\n"
        "the fifteen-row table (per-configuration reward, adaptation speed, recovery time,\n"
        "forgetting, stability, performance gap, zero-shot reward, ...). A metric that\n"
        "cannot be measured prints -- (absent, never 0).",
        epilog=TRACE_FORMAT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "traces",
        nargs="+",
        type=Path,
        metavar="TRACE.jsonl",
        help="trace files (format below); several files are traces of one run, scored together "
        "(see --per-seed)",
    )
    _add_metric_options(p)
    _add_reference_options(p)
    _add_input_limits(p)
    _add_output_options(p)
    return p


def _add_metric_options(p: argparse.ArgumentParser) -> None:
    """The anchor and the parameters of the fifteen rows."""
    p.add_argument(
        "--anchor",
        choices=("segment", "ceiling"),
        default="segment",
        help="what adaptation speed and recovery time are measured against: 'segment' (default) "
        "= the interval's own peak running mean / settled tail; 'ceiling' = the reward's "
        "theoretical bound R_ub (needs --ceiling). Numbers under the two anchors are not "
        "comparable",
    )
    fraction = real_in(0.0, 1.0, low_open=True)
    non_negative = real_in(0.0, math.inf, high_open=True)
    p.add_argument(
        "--alpha",
        type=fraction,
        default=None,
        metavar="A",
        help="adapted fraction in (0, 1]: adaptation = first step whose running mean reaches "
        "A x the anchor; default 0.9 (segment), 0.5 (ceiling)",
    )
    p.add_argument(
        "--eps",
        type=non_negative,
        default=None,
        metavar="E",
        help="recovery tolerance >= 0: a fraction of the settled level (segment, default 0.30) "
        "or an absolute distance from R_ub (ceiling, default 0.5*|R_ub|)",
    )
    p.add_argument(
        "--floor",
        type=non_negative,
        default=0.005,
        metavar="F",
        help="smallest half-width of the recovery band, >= 0 (default 0.005), so a level at or "
        "near zero can still be reached",
    )
    p.add_argument(
        "--tail-fraction",
        type=fraction,
        default=0.2,
        metavar="Q",
        help="fraction in (0, 1] of each interval's final steps that counts as its settled "
        "level (recovery asymptote, settled reward, performance gap); default 0.2",
    )
    p.add_argument(
        "--zero-shot-window",
        type=positive_int,
        default=10,
        metavar="N",
        help="zero-shot reward = mean reward over the first N steps after a regime shift "
        "(integer >= 1, default 10)",
    )
    p.add_argument(
        "--gamma",
        type=fraction,
        default=0.99,
        metavar="G",
        help="discount in (0, 1] of the discounted return, sum of G**t * r_t over the whole "
        "trace (default 0.99; 1 = undiscounted)",
    )


def _add_reference_options(p: argparse.ArgumentParser) -> None:
    """What the traces are compared with, and which components mean what."""
    p.add_argument(
        "--ceiling",
        type=ceiling_arg,
        default=None,
        metavar="NUMBER|data|FILE.json",
        help="the reward's ceiling R_ub (performance gap, ceiling anchor): a finite number, "
        "'data' (the best observed in the traces: relative to the policy measured), or a JSON "
        'file holding a reward spec {"components": [...]} (analytic bound) or '
        '{"per_step": p, "final_step": f}; default none (gap prints --)',
    )
    p.add_argument(
        "--reference",
        nargs="+",
        type=Path,
        default=None,
        metavar="REF.jsonl",
        help="reference trajectories for regret (sum of reference minus own reward), one per "
        "trace file, same format; default none (regret prints --)",
    )
    p.add_argument(
        "--episode-end-components",
        default=None,
        metavar="NAME,...",
        help="comma-separated components paid at episode end: steps carrying them are excluded "
        "from forgetting and the policy-only settled reward",
    )
    p.add_argument(
        "--solve-component",
        default=None,
        metavar="NAME",
        help="component whose positive value counts a step as solved (solve rate); default none",
    )


def byte_count(text: str) -> int:
    """An argparse ``type=``: a number of bytes >= 1, optionally with a binary suffix
    (``K``/``KiB`` = 1024, ``M``/``MiB``, ``G``/``GiB``)."""
    match = _BYTES.fullmatch(text.strip())
    value = int(match["n"]) * 1024 ** _SUFFIXES[match["unit"].lower()] if match else 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"expected a number of bytes >= 1 (suffixes K, M, G: powers of 1024), got {text!r}"
        )
    return value


_BYTES = re.compile(r"(?P<n>[0-9]{1,15})\s*(?P<unit>|[kKmMgG](?:i?[bB])?|[bB])")
_SUFFIXES = {"": 0, "b": 0, "k": 1, "kb": 1, "kib": 1, "m": 2, "mb": 2, "mib": 2}
_SUFFIXES.update({"g": 3, "gb": 3, "gib": 3})


def _add_input_limits(p: argparse.ArgumentParser) -> None:
    """Caps on what a trace file may hold, so that no input makes the reader grow unbounded."""
    p.add_argument(
        "--max-line-bytes",
        type=byte_count,
        default=DEFAULT_MAX_LINE_BYTES,
        metavar="N",
        help="longest trace line read, in bytes (suffixes K, M, G); a longer line is an error "
        "naming the file and line (default 1M)",
    )
    p.add_argument(
        "--max-file-bytes",
        type=byte_count,
        default=DEFAULT_MAX_FILE_BYTES,
        metavar="N",
        help="most bytes read from one trace or reference file (suffixes K, M, G); reading stops "
        "with an error past it, so /dev/zero, a FIFO or an endless stream cannot exhaust memory "
        "(default 2G)",
    )


def _add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--per-seed",
        action="store_true",
        help="each trace file is one seed: cells show mean ± spread across the files",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the result as JSON instead of the table (full labels; a number that is not "
        'finite is null and listed in "nonfinite" by its JSON pointer)',
    )
    p.add_argument(
        "--label-width",
        type=positive_int,
        default=DEFAULT_LABEL_WIDTH,
        metavar="N",
        help="widest regime label in the table, in characters; longer labels are cut in the "
        f"middle, unprintable characters escaped (default {DEFAULT_LABEL_WIDTH})",
    )


def _ceiling(value: float | str | Path | None, traces: list[EpisodeTrace]) -> Any:
    if value == "data":
        return data_relative_upper_bound(traces)
    if isinstance(value, Path):
        return read_ceiling_file(value)
    return value


def _read_traces(
    args: argparse.Namespace,
) -> tuple[list[EpisodeTrace], list[EpisodeTrace] | None]:
    """The trace files and the reference files (one per trace), read under the caps."""
    caps = {"max_line_bytes": args.max_line_bytes, "max_file_bytes": args.max_file_bytes}
    traces = [read_jsonl(p, **caps) for p in args.traces]
    if args.reference is None:
        return traces, None
    if len(args.reference) != len(traces):
        raise ValueError(f"{len(args.reference)} reference file(s) for {len(traces)} trace file(s)")
    return traces, [read_jsonl(p, **caps) for p in args.reference]


def _score(args: argparse.Namespace) -> tuple[Any, str]:
    """The result (the JSON document) and its table."""
    traces, refs = _read_traces(args)
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
    if not args.per_seed:
        out = compute_all_metrics(traces, reference=refs, **kwargs)
        return out, format_table(out, label_width=args.label_width)
    per_seed = [
        compute_all_metrics([tr], reference=None if refs is None else [refs[i]], **kwargs)
        for i, tr in enumerate(traces)
    ]
    agg = aggregate_seeds(per_seed)
    return {**agg, "per_seed": per_seed}, format_seed_table(agg, label_width=args.label_width)


#: the longest error line printed (a message quoting a huge label is cut)
MAX_ERROR_CHARS = 2000


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``continual-eval stream``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        out, text = _score(args)
        if args.json:
            text = json_text(out)
    except (OSError, ValueError) as err:
        message = shown_label(str(err), MAX_ERROR_CHARS)
        print(f"continual-eval stream: error: {message}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

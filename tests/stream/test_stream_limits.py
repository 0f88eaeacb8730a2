"""Issue 19 item 4: the stream reader and CLI on unbounded or hostile input.

Line and file caps stop endless sources (``/dev/zero``, a FIFO that never closes, a file object
that never ends, a 300 MB line) with an error naming the limit, at bounded memory (measured with
``tracemalloc`` in-process, and under ``resource.setrlimit`` in a fresh interpreter); labels reach
the terminal escaped and cut, never raw; ``--json`` is strict JSON whatever the rewards, with
non-finite numbers as ``null`` listed under ``"nonfinite"``.
"""

from __future__ import annotations

import json
import math
import os
import threading
import tracemalloc
from fractions import Fraction
from pathlib import Path

import pytest

from continual_eval.stream import EpisodeTrace, compute_all_metrics, read_jsonl, write_jsonl
from continual_eval.stream.cli import main
from continual_eval.stream.rewards import RewardSpec, read_ceiling_file
from continual_eval.stream.table import format_markdown, format_table, shown_label
from script_runner import run_script

HERE = Path(__file__).parent
LINE = b'{"step": %d, "reward": 0.5, "regime_id": "a"}\n'
#: an endless source that has served this much without being stopped has failed the test
GUARD = 256 * 2**20


class EndlessSource:
    """A binary file object that never ends: ``pattern(offset)`` bytes forever, counting what it
    served; past :data:`GUARD` bytes it raises, so a reader without a cap fails instead of
    exhausting memory."""

    name = "<endless>"

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.served = 0
        self._step = 0
        self._buffer = b""

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            raise AssertionError("the reader asked for everything at once")
        if self.served > GUARD:
            raise RuntimeError(f"the reader did not stop after {self.served} bytes")
        if self.kind == "zeros":
            out = bytes(n)
        elif self.kind == "one_line":  # a line that never ends: no newline, ever
            out = b"x" * n
        else:  # valid trace lines, forever
            while len(self._buffer) < n:
                self._buffer += b"".join(LINE % (self._step + i) for i in range(4096))
                self._step += 4096
            out, self._buffer = self._buffer[:n], self._buffer[n:]
        self.served += len(out)
        return out


def peak_bytes(fn) -> tuple[BaseException | None, int]:
    """``fn()``'s exception (or ``None``) and the peak of Python allocations while it ran."""
    tracemalloc.start()
    try:
        fn()
        err = None
    except Exception as caught:
        err = caught
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return err, peak


@pytest.mark.parametrize("kind", ["zeros", "one_line"])
def test_an_endless_line_stops_at_the_line_cap_with_bounded_memory(kind):
    source = EndlessSource(kind)
    err, peak = peak_bytes(lambda: read_jsonl(source, block_size=1 << 16))
    assert isinstance(err, ValueError), err
    message = str(err)
    assert message.startswith("<endless>:1: line longer than 1048576 bytes")
    assert "max_line_bytes" in message and "--max-line-bytes" in message
    assert source.served <= (1 << 20) + (1 << 16)
    assert peak < 8 * 2**20  # the unfinished line (1 MiB) plus a block, a few copies at most


def test_an_endless_stream_of_valid_lines_stops_at_the_file_cap():
    source = EndlessSource("lines")
    cap = 3_000_000
    err, peak = peak_bytes(lambda: read_jsonl(source, block_size=1 << 16, max_file_bytes=cap))
    assert isinstance(err, ValueError), err
    assert str(err) == (
        "<endless>: more than 3000000 bytes, the limit max_file_bytes (--max-file-bytes); "
        "raise it to read a longer trace"
    )
    assert source.served == cap + 1  # never a byte more than needed to know
    assert peak < 16 * 2**20


def test_a_long_line_inside_a_block_is_named_by_its_line_number(tmp_path):
    path = tmp_path / "t.jsonl"
    long_line = b'{"step": 2, "reward": 0.5, "regime_id": "' + b"x" * 5000 + b'"}\n'
    path.write_bytes(LINE % 0 + LINE % 1 + long_line + LINE % 3)
    with pytest.raises(ValueError, match=r"t\.jsonl:3: line longer than 4096 bytes"):
        read_jsonl(path, max_line_bytes=4096)  # one 4 MiB block holds the whole file
    with pytest.raises(ValueError, match=r"t\.jsonl:3: line longer than 4096 bytes"):
        read_jsonl(path, max_line_bytes=4096, block_size=100)  # the line spans blocks
    trace = read_jsonl(path, max_line_bytes=len(long_line) - 1)  # newline not counted
    assert len(trace) == 4 and trace.regime_names == ("a", "x" * 5000)


def test_caps_are_checked(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(LINE % 0)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_line_bytes must be an integer >= 1 or None"):
            read_jsonl(path, max_line_bytes=bad)
    assert len(read_jsonl(path, max_line_bytes=None, max_file_bytes=None)) == 1
    assert len(read_jsonl(path, max_file_bytes=len(LINE % 0))) == 1  # exactly at the cap
    with pytest.raises(ValueError, match="more than 10 bytes"):
        read_jsonl(path, max_file_bytes=10)


def test_a_fifo_that_never_ends_stops_at_the_cli_file_cap(tmp_path, capsys):
    fifo = tmp_path / "endless.fifo"
    os.mkfifo(fifo)
    written = [0]

    def writer() -> None:
        source = EndlessSource("lines")
        try:
            with open(fifo, "wb") as fh:
                while written[0] < GUARD:
                    data = source.read(1 << 16)
                    fh.write(data)
                    written[0] += len(data)
        except BrokenPipeError:
            pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    assert main([str(fifo), "--max-file-bytes", "2M"]) == 2
    thread.join(timeout=30)
    assert not thread.is_alive()
    err = capsys.readouterr().err
    assert f"{fifo}: more than 2097152 bytes, the limit max_file_bytes (--max-file-bytes)" in err
    assert written[0] < 8 * 2**20  # the pipe buffer beyond the cap, not the guard


@pytest.mark.slow
def test_dev_zero_and_a_300mb_line_under_an_address_space_limit(tmp_path):
    """A fresh interpreter caps its address space at what it uses plus 256 MiB, then runs the
    command on /dev/zero and on a 300 MB line streamed through a FIFO: both stop at the line
    cap with exit status 2, where a reader without caps would hit the limit (MemoryError)."""
    proc = run_script(HERE / "stream_limits_script.py", tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines.count("rc=2 limit named") == 2, proc.stdout


# --------------------------------------------------------------------------- labels
def trace_with_labels(*labels: str) -> EpisodeTrace:
    rewards = [0.8, 0.8, 0.1, 0.6, 0.5, 0.5]
    ids = [labels[i // 2] for i in range(6)]
    return EpisodeTrace.from_arrays(rewards, ids)


def test_control_characters_in_labels_reach_the_terminal_escaped(tmp_path, capsys):
    evil = "\x1b[2J\x1b[31mred\x07\u202eevil\n"
    path = write_jsonl(trace_with_labels("a", evil, "c"), tmp_path / "t.jsonl")
    assert main([str(path), "--label-width", "64"]) == 0
    out = capsys.readouterr().out
    assert not any(ch in out for ch in "\x1b\x07\u202e")
    assert len(out.splitlines()) == 17  # the label's newline did not add a line
    assert "\\x1b[2J\\x1b[31mred\\x07\\u202eevil\\n" in out
    assert main([str(path), "--json"]) == 0
    assert evil in json.loads(capsys.readouterr().out)["per_regime"]  # the full name


def test_a_ten_million_character_label_prints_a_short_table(tmp_path, capsys):
    huge = "L" * 5_000_000 + "M" * 5_000_000
    path = write_jsonl(trace_with_labels("a", huge, "c"), tmp_path / "t.jsonl")
    assert main([str(path)]) == 2  # a 10 MB line is over the default line cap
    assert "--max-line-bytes" in capsys.readouterr().err
    assert main([str(path), "--max-line-bytes", "16M"]) == 0
    out = capsys.readouterr().out
    assert len(out) < 4000
    header = out.splitlines()[1].split()
    assert header == ["metric", "a", "L" * 16 + "\u2026" + "M" * 15, "c"]
    assert main([str(path), "--max-line-bytes", "16M", "--label-width", "8"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[2] == "LLLL\u2026MMM"
    assert main([str(path), "--max-line-bytes", "16M", "--json"]) == 0
    assert huge in json.loads(capsys.readouterr().out)["per_regime"]


def test_shown_label_escapes_then_cuts_at_escape_boundaries():
    assert shown_label("plain") == "plain"
    assert shown_label("a\x1bb") == "a\\x1bb"
    assert shown_label("\x1b" * 10, 9) == "\\x1b\u2026\\x1b"  # never half an escape
    assert shown_label("é€中 ok") == "é€中 ok"  # printable non-ASCII passes
    cut = shown_label("x" * 10**7, 32)
    assert len(cut) == 32 and cut.count("\u2026") == 1


def test_markdown_table_escapes_label_markup():
    result = compute_all_metrics(trace_with_labels("a|b", "<img src=x>", "c\x1b"))
    header = format_markdown(result).splitlines()[2]
    assert header == "| metric | a\\|b | \\<img src=x\\> | c\\\\x1b |"
    assert "\x1b" not in format_table(result)


def test_a_ceiling_derivation_from_a_file_is_shown_escaped(tmp_path, capsys):
    path = write_jsonl(trace_with_labels("a", "b", "c"), tmp_path / "t.jsonl")
    ceiling = tmp_path / "ceiling.json"
    ceiling.write_text(json.dumps({"per_step": 1.0, "derivation": "\x1b]0;title\x07"}))
    assert main([str(path), "--ceiling", str(ceiling)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "ceiling=\\x1b]0;title\\x07" in out


def test_ceiling_and_spec_files_are_read_under_a_cap(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (2**20 + 1))
    with pytest.raises(ValueError, match=r"big\.json: more than 1048576 bytes"):
        read_ceiling_file(big)
    with pytest.raises(ValueError, match=r"big\.json: more than 1048576 bytes"):
        RewardSpec.from_json(big)
    with pytest.raises(ValueError, match="more than 1048576 bytes"):
        read_ceiling_file("/dev/zero")


def test_an_error_message_is_escaped_and_cut(tmp_path, capsys):
    alias = "A\x1b" * 100_000
    steps = [
        '{"step": 0, "reward": 0.5, "regime_id": "a"}',
        json.dumps({"step": 1, "reward": 0.5, "regime_id": alias, "regime_origin": "nowhere"}),
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(steps) + "\n")
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and len(err) < 2100 and "never occurs" not in err[:100]


# --------------------------------------------------------------------------- non-finite JSON
HUGE = 1.7e308
REWARDS = [HUGE] * 4 + [-HUGE, HUGE, -HUGE, HUGE] + [1e308] * 4
LABELS = ["a"] * 4 + ["b"] * 4 + ["a_again"] * 4


def exact(value: Fraction) -> float:
    """``value`` rounded to float64 (``±inf`` beyond its range), as IEEE arithmetic would."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def exact_reference() -> dict[str, dict[str, float]]:
    """Per label, metrics computed in exact rational arithmetic from the definitions."""
    out: dict[str, dict[str, float]] = {}
    values = {
        lb: [Fraction(r) for r, z in zip(REWARDS, LABELS, strict=True) if z == lb] for lb in LABELS
    }
    for lb, xs in values.items():
        n = len(xs)
        mean = sum(xs) / n
        out[lb] = {
            "per_configuration_reward": exact(mean),
            "undiscounted_return": exact(sum(xs)),
            "stability_variance": exact(sum((x - mean) ** 2 for x in xs) / (n - 1)),
            "settled_reward": exact(xs[-1]),  # ceil(0.2 * 4) = 1 step
        }
    forgetting = exact(sum(values["a"]) / 4 - sum(values["a_again"]) / 4)
    out["a"]["forgetting"] = out["a_again"]["forgetting"] = forgetting
    return out


def huge_trace() -> EpisodeTrace:
    return EpisodeTrace.from_arrays(REWARDS, LABELS, origin_of={"a_again": "a"})


def test_huge_rewards_give_the_exact_values_and_inf_only_beyond_float64():
    result = compute_all_metrics(huge_trace())
    for lb, row in exact_reference().items():
        for metric, expected in row.items():
            got = result["per_regime"][lb][metric]
            assert got is not None, (lb, metric)  # never absent by overflow
            if math.isinf(expected):
                assert got == expected, (lb, metric, got)
            else:
                assert math.isclose(got, expected, rel_tol=1e-12), (lb, metric, got, expected)
    assert result["per_regime"]["a"]["per_configuration_reward"] == HUGE  # finite, exact
    assert result["per_regime"]["a"]["undiscounted_return"] == math.inf
    assert result["per_regime"]["b"]["stability_variance"] == math.inf


def test_huge_rewards_give_identical_results_to_the_same_trace_scaled_down():
    """Scoring divides by a power of two (exact) only when values are huge: the scaled-down
    trace's numbers times the same power equal the huge trace's."""
    k = 2.0**-600
    small = compute_all_metrics(EpisodeTrace.from_arrays([r * k for r in REWARDS], LABELS))
    big = compute_all_metrics(EpisodeTrace.from_arrays(REWARDS, LABELS))
    for lb in ("a", "b"):
        for metric in ("per_configuration_reward", "settled_reward", "zero_shot_reward"):
            s, b = small["per_regime"][lb][metric], big["per_regime"][lb][metric]
            assert (s is None and b is None) or b == s / k, (lb, metric)


def nonfinite_pointers(value, pointer=""):
    """Every non-finite float in ``value`` by JSON pointer (an independent walk)."""
    if isinstance(value, float) and not math.isfinite(value):
        yield pointer, str(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from nonfinite_pointers(
                v, f"{pointer}/{str(k).replace('~', '~0').replace('/', '~1')}"
            )
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from nonfinite_pointers(v, f"{pointer}/{i}")


def strict_loads(text: str):
    def refuse(literal: str):
        raise AssertionError(f"{literal} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("per_seed", [False, True])
def test_json_with_huge_rewards_is_strict_json_listing_every_nonfinite_value(
    tmp_path, capsys, per_seed
):
    trace = huge_trace()
    paths = [write_jsonl(trace, tmp_path / f"s{i}.jsonl") for i in range(2 if per_seed else 1)]
    argv = [str(p) for p in paths] + (["--per-seed"] if per_seed else [])
    assert main(argv) == 0  # the table: inf printed
    table = capsys.readouterr().out
    assert "inf" in table
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    doc = strict_loads(captured.out)
    if per_seed:
        from continual_eval.stream import aggregate_seeds

        seeds = [compute_all_metrics([trace]) for _ in paths]
        expected = {**aggregate_seeds(seeds), "per_seed": seeds}
    else:
        expected = compute_all_metrics([trace])
    flagged = dict(nonfinite_pointers(expected))
    assert flagged and doc["nonfinite"] == flagged
    assert "/per_regime/a/undiscounted_return" in flagged or per_seed
    for pointer in flagged:
        node = doc
        for token in pointer.split("/")[1:]:
            key = token.replace("~1", "/").replace("~0", "~")
            node = node[int(key)] if isinstance(node, list) else node[key]
        assert node is None


def test_json_of_ordinary_rewards_has_an_empty_nonfinite(tmp_path, capsys):
    path = write_jsonl(trace_with_labels("a", "b/c~d", "e"), tmp_path / "t.jsonl")
    assert main([str(path), "--json"]) == 0
    doc = strict_loads(capsys.readouterr().out)
    assert doc["nonfinite"] == {}
    assert doc["per_regime"]["b/c~d"]["per_configuration_reward"] == pytest.approx(0.35)


def test_huge_rewards_with_a_ceiling_for_one_label_only():
    """Per-regime ceilings leave NaN (absent) ceilings elsewhere; the gap of the bounded label
    is exact, the others' absent, never NaN from overflow."""
    result = compute_all_metrics(huge_trace(), ceiling={"a": HUGE})
    gap = result["per_regime"]["a"]["performance_gap"]
    # the tail of a's first interval is its last reward, HUGE: a gap of 0 up to the running
    # sums' rounding (tail means are differences of cumulative sums, ~1e-16 of their size)
    assert math.isclose(gap, 0.0, abs_tol=1e-15 * sum(map(abs, REWARDS)))
    assert result["per_regime"]["b"]["performance_gap"] is None
    first = result["per_trace"][0]["per_interval"][0]
    assert first["ceiling"] == HUGE and first["settled_ceiling"] == HUGE


@pytest.mark.parametrize("per_seed", [False, True], ids=["one", "seeds"])
def test_huge_finite_values_print_compactly_and_json_keeps_them_whole(tmp_path, capsys, per_seed):
    """A return of 8e306 prints as ``8.0000e+306`` (not a 309-digit number in a 656-character
    row); ``--json`` keeps the float itself."""
    rewards = [8e306] * 10 + [0.5] * 10
    trace = EpisodeTrace.from_arrays(rewards, ["a"] * 10 + ["b"] * 10)
    paths = [write_jsonl(trace, tmp_path / f"s{i}.jsonl") for i in range(2 if per_seed else 1)]
    argv = [str(p) for p in paths] + (["--per-seed"] if per_seed else [])
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert max(len(line) for line in table.splitlines()[1:]) < 80, table
    assert "8.0000e+306" in table and "0.5000" in table
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    if per_seed:
        doc = doc["per_seed"][0]
    assert doc["per_regime"]["a"]["per_configuration_reward"] == 8e306
    assert doc["per_regime"]["a"]["undiscounted_return"] == sum([8e306] * 10)

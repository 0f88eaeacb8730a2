"""Issue 9 item 15: ``read_jsonl`` decodes blocks of lines straight into columns.

The result must not depend on where block boundaries fall (checked against an independent
reference built with the standard-library ``json`` module), errors must name the right line
across boundaries, and the reader's peak memory must be the columns plus a block, not one
Python object per line. Timing lives in ``benchmarks/bench_stream.py``.
"""

from __future__ import annotations

import json
import math
import tracemalloc

import numpy as np
import pytest

from continual_eval.stream import read_jsonl


def mixed_lines(n: int, seed: int = 0) -> list[str]:
    """Records with every optional field appearing only sometimes (components only late)."""
    rng = np.random.default_rng(seed)
    out = []
    labels = ["a", "b", "a_again", "7"]
    for i in range(n):
        z = labels[(i // 37) % 4]
        rec: dict = {"step": 3 * i - 50, "reward": float(rng.normal()), "regime_id": z}
        if z == "a_again" and rng.uniform() < 0.5:
            rec["regime_origin"] = "a"
        if i > n // 2 and rng.uniform() < 0.3:
            rec["components"] = {"goal": float(rng.integers(0, 2))}
            if rng.uniform() < 0.5:
                rec["components"]["speed"] = float(rng.uniform())
        if rng.uniform() < 0.2:
            rec["invalid_action"] = bool(rng.uniform() < 0.5)
        if rng.uniform() < 0.1:
            rec["effective_rank"] = float(rng.uniform(1, 5))
        if rng.uniform() < 0.05:
            rec["episode_end"] = True
        out.append(json.dumps(rec))
    return out


def reference_columns(lines: list[str]) -> dict:
    """What the file holds, by the standard library: one dict per line, then columns."""
    recs = [json.loads(x) for x in lines if x.strip()]
    n = len(recs)
    comp_names = list(dict.fromkeys(k for r in recs for k in r.get("components", {})))

    def optional(key: str) -> np.ndarray | None:
        vals = [r.get(key) for r in recs]
        if all(v is None for v in vals):
            return None
        return np.array([math.nan if v is None else float(v) for v in vals])

    return {
        "step": np.array([r["step"] for r in recs]),
        "reward": np.array([r["reward"] for r in recs]),
        "regime_id": [r["regime_id"] for r in recs],
        "origin_of": {r["regime_id"]: r["regime_origin"] for r in recs if "regime_origin" in r},
        "components": {
            k: np.array([r.get("components", {}).get(k, math.nan) for r in recs])
            for k in comp_names
        },
        "invalid_action": optional("invalid_action"),
        "effective_rank": optional("effective_rank"),
        "episode_end": np.array([r.get("episode_end", False) for r in recs]),
        "n": n,
    }


@pytest.mark.parametrize("block_size", [1, 7, 100, 4096, 1 << 22])
@pytest.mark.parametrize("layout", ["lf", "crlf_blank_lines_no_final_newline"])
def test_columns_do_not_depend_on_block_boundaries(tmp_path, block_size, layout):
    lines = mixed_lines(600)
    if layout == "lf":
        text = "".join(x + "\n" for x in lines)
    else:
        with_blanks = [x if i % 50 else f"  \r\n{x}" for i, x in enumerate(lines)]
        text = "\r\n".join(with_blanks)
    path = tmp_path / "t.jsonl"
    path.write_bytes(text.encode())
    ref = reference_columns(text.splitlines())
    tr = read_jsonl(path, block_size=block_size)
    assert len(tr) == ref["n"] == 600
    np.testing.assert_array_equal(tr.step, ref["step"])
    np.testing.assert_array_equal(tr.reward, ref["reward"])
    assert tr.regime_id == ref["regime_id"]
    assert tr.origin_of == ref["origin_of"] == {"a_again": "a"}
    assert list(tr.components) == list(ref["components"]) == ["goal", "speed"]
    for name, col in ref["components"].items():
        np.testing.assert_array_equal(tr.components[name], col)
    np.testing.assert_array_equal(tr.invalid_action, ref["invalid_action"])
    np.testing.assert_array_equal(tr.effective_rank, ref["effective_rank"])
    np.testing.assert_array_equal(tr.episode_end, ref["episode_end"])


@pytest.mark.parametrize("block_size", [1, 50, 1 << 22])
def test_errors_name_the_line_across_block_boundaries(tmp_path, block_size):
    lines = mixed_lines(300)
    path = tmp_path / "t.jsonl"
    bad = [*lines[:236], '{"step": 10000, "reward": false, "regime_id": "a"}', *lines[236:]]
    path.write_text("\n".join(bad) + "\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:237: field `reward`: expected `float`"):
        read_jsonl(path, block_size=block_size)
    # a step that does not increase, found after a block boundary, behind blank lines
    back = [*lines[:200], "", "", json.dumps({"step": 0, "reward": 0.0, "regime_id": "a"})]
    path.write_text("\n".join(back) + "\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:203: step 0 follows step 547;"):
        read_jsonl(path, block_size=block_size)
    # two origins for one alias, the first declared on an earlier line
    alias = [
        '{"step": 0, "reward": 0.0, "regime_id": "a"}',
        '{"step": 1, "reward": 0.0, "regime_id": "b"}',
        '{"step": 2, "reward": 0.0, "regime_id": "x", "regime_origin": "a"}',
        '{"step": 3, "reward": 0.0, "regime_id": "x"}',
        '{"step": 4, "reward": 0.0, "regime_id": "x", "regime_origin": "b"}',
    ]
    path.write_text("\n".join(alias) + "\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:5: .*'x' has origin 'b', but line 3 gave 'a'"):
        read_jsonl(path, block_size=block_size)


def test_peak_memory_is_the_columns_plus_a_block(tmp_path):
    n, block = 100_000, 1 << 16
    path = tmp_path / "long.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            rec = {"step": i, "reward": i * 1e-5, "regime_id": "abc"[(i // 1000) % 3]}
            fh.write(json.dumps(rec) + "\n")
    tracemalloc.start()
    try:
        tr = read_jsonl(path, block_size=block)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    columns = tr.step.nbytes + tr.reward.nbytes + tr.regime_code.nbytes + tr.episode_end.nbytes
    assert columns == 25 * n
    # one block of text and its records, plus the columns twice (blocks, then concatenated);
    # one Python object per line (the previous reader) needs about ten times the columns
    assert peak < 2 * columns + 8 * block, (peak, columns)


@pytest.mark.parametrize("block_size", [1, 1 << 22])
def test_exactly_one_record_per_line(tmp_path, block_size):
    good = '{"step": 0, "reward": 0.0, "regime_id": "a"}'
    two = (
        '{"step": 1, "reward": 0.0, "regime_id": "a"} {"step": 2, "reward": 0.0, "regime_id": "a"}'
    )
    split = '{"step": 1, "reward": 0.0,\n "regime_id": "a"}'
    path = tmp_path / "t.jsonl"
    # a blank line and a line of two objects: the record count matches the line count
    path.write_text(f"{good}\n\n{two}\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:3: not valid JSON"):
        read_jsonl(path, block_size=block_size)
    path.write_text(f"{good}\n{split}\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:2: not valid JSON"):
        read_jsonl(path, block_size=block_size)

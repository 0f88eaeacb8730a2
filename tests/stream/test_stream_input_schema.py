"""Issue 9 item 12: trace lines are parsed with a strict typed schema.

Wrong types are errors naming ``file:line`` and the field, never silently coerced: the string
``"false"`` is not a boolean, a boolean or a string is not a reward, a float is not a step, an
integer is not a regime label and ``null`` is absence only for the optional fields whose absence
the format defines (``regime_origin``, ``components``, ``invalid_action``, ``effective_rank``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from continual_eval.stream import EpisodeStep, read_jsonl
from continual_eval.stream.cli import main

GOOD = '{"step": 0, "reward": 0.5, "regime_id": "a"}'


def write_lines(tmp_path: Path, *lines: str, name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


BAD_FIELDS = [
    # (second line of the file, the field the error must name)
    ('{"step": 1, "reward": 0.5, "regime_id": "a", "episode_end": "false"}', "episode_end"),
    ('{"step": 1, "reward": 0.5, "regime_id": "a", "episode_end": 0}', "episode_end"),
    ('{"step": 1, "reward": 0.5, "regime_id": "a", "episode_end": null}', "episode_end"),
    ('{"step": 1, "reward": true, "regime_id": "a"}', "reward"),
    ('{"step": 1, "reward": "0.5", "regime_id": "a"}', "reward"),
    ('{"step": 1, "reward": null, "regime_id": "a"}', "reward"),
    ('{"step": 1.7, "reward": 0.5, "regime_id": "a"}', "step"),
    ('{"step": 1.0, "reward": 0.5, "regime_id": "a"}', "step"),
    ('{"step": "1", "reward": 0.5, "regime_id": "a"}', "step"),
    ('{"step": true, "reward": 0.5, "regime_id": "a"}', "step"),
    ('{"step": 1, "reward": 0.5, "regime_id": 7}', "regime_id"),
    ('{"step": 1, "reward": 0.5, "regime_id": null}', "regime_id"),
    ('{"step": 1, "reward": 0.5, "regime_id": "a", "regime_origin": 7}', "regime_origin"),
    ('{"step": 1, "reward": 0.5, "regime_id": "a", "invalid_action": "true"}', "invalid_action"),
    ('{"step": 1, "reward": 0.5, "regime_id": "a", "invalid_action": 1}', "invalid_action"),
    ('{"step": 1, "reward": 0.5, "regime_id": "a", "effective_rank": "3"}', "effective_rank"),
    ('{"step": 1, "reward": 0.5, "regime_id": "a", "components": {"x": "1"}}', "components"),
    ('{"step": 1, "reward": 0.5, "regime_id": "a", "components": {"x": false}}', "components"),
    ('{"step": 1, "reward": 0.5, "regime_id": "a", "episode_ned": true}', "episode_ned"),
]


@pytest.mark.parametrize(("line", "field"), BAD_FIELDS)
def test_wrong_type_names_file_line_and_field(tmp_path, line, field):
    path = write_lines(tmp_path, GOOD, line)
    with pytest.raises(ValueError, match=rf"t\.jsonl:2: .*{field}"):
        read_jsonl(path)


@pytest.mark.parametrize(("line", "field"), BAD_FIELDS[:3])
def test_from_dict_is_as_strict_as_the_reader(line, field):
    with pytest.raises(ValueError, match=field):
        EpisodeStep.from_dict(json.loads(line))


def test_string_false_episode_end_no_longer_changes_the_gap(tmp_path, capsys):
    # Regime a ends an episode only at its last step; the gap against a ceiling of 1.0 is
    # 1 - mean(tail) = 0.5 with the flag read correctly.
    lines = [json.dumps({"step": i, "reward": 0.5, "regime_id": "a"}) for i in range(9)]
    good = write_lines(tmp_path, *lines, name="good.jsonl")
    assert main([str(good), "--ceiling", "1.0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["per_regime"]["a"]["performance_gap"] == 0.5
    quoted = json.dumps({"step": 9, "reward": 0.5, "regime_id": "a", "episode_end": "false"})
    bad = write_lines(tmp_path, *lines, quoted, name="bad.jsonl")
    assert main([str(bad), "--ceiling", "1.0", "--json"]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:10:" in err and "episode_end" in err and "Traceback" not in err


def test_float_steps_are_refused_not_truncated(tmp_path):
    path = write_lines(
        tmp_path,
        '{"step": 1.7, "reward": 0.5, "regime_id": "a"}',
        '{"step": 1.2, "reward": 0.5, "regime_id": "a"}',
    )
    with pytest.raises(ValueError, match=r"t\.jsonl:1: .*step") as info:
        read_jsonl(path)
    assert "follows" not in str(info.value)


def test_integer_and_string_labels_are_not_merged(tmp_path):
    path = write_lines(
        tmp_path,
        '{"step": 0, "reward": 1.0, "regime_id": "7"}',
        '{"step": 1, "reward": 0.0, "regime_id": 7}',
    )
    with pytest.raises(ValueError, match=r"t\.jsonl:2: .*regime_id.*str.*int"):
        read_jsonl(path)


def test_null_is_absence_only_where_the_format_allows_it(tmp_path):
    explicit_nulls = write_lines(
        tmp_path,
        '{"step": 0, "reward": 1.0, "regime_id": "a", "regime_origin": null, "components": null,'
        ' "invalid_action": null, "effective_rank": null}',
        '{"step": 1, "reward": 0.0, "regime_id": "b", "regime_origin": null}',
        name="nulls.jsonl",
    )
    omitted = write_lines(
        tmp_path,
        '{"step": 0, "reward": 1.0, "regime_id": "a"}',
        '{"step": 1, "reward": 0.0, "regime_id": "b"}',
        name="omitted.jsonl",
    )
    a, b = read_jsonl(explicit_nulls), read_jsonl(omitted)
    assert a.steps == b.steps
    assert a.regime_names == ("a", "b")  # not "None"
    assert a.origin_of == {} and a.invalid_action is None and a.effective_rank is None


def test_integer_rewards_are_numbers(tmp_path):
    path = write_lines(tmp_path, '{"step": 0, "reward": 1, "regime_id": "a"}')
    tr = read_jsonl(path)
    assert tr.reward.dtype.kind == "f" and tr.reward.tolist() == [1.0]

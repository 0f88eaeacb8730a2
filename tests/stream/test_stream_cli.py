"""`continual-eval stream` against the seed's worked example, in-process and as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from continual_eval.stream import EpisodeStep, write_jsonl
from continual_eval.stream.cli import main

ROOT = Path(__file__).resolve().parents[2]


def worked_example_file(tmp_path: Path, name: str = "trace.jsonl", scale: float = 1.0) -> Path:
    rewards = [0.8] * 10 + [0.1, 0.9, 0.9] + [0.6] * 7 + [0.5] * 10
    labels = ["a"] * 10 + ["b"] * 10 + ["a_again"] * 10
    steps = [
        EpisodeStep(
            step=i,
            reward=rewards[i] * scale,
            regime_id=labels[i],
            regime_origin="a" if labels[i] == "a_again" else None,
        )
        for i in range(30)
    ]
    return write_jsonl(steps, tmp_path / name)


def row(text: str, title: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith(title))
    return line[len(title) :].split()


def test_table_shows_seed_numbers_and_dashes(tmp_path, capsys):
    path = worked_example_file(tmp_path)
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "anchor=segment" in out
    assert row(out, "Per-configuration reward J") == ["0.8000", "0.6100", "0.5000"]
    assert row(out, "Adaptation speed") == ["--", "3", "1"]
    assert row(out, "Recovery time") == ["--", "2", "1"]
    assert row(out, "Forgetting") == ["+0.3000", "--", "+0.3000"]
    assert row(out, "Stability (variance)") == ["0.0000", "0.0477", "0.0000"]
    assert row(out, "Performance gap") == ["--", "--", "--"]


def test_json_and_ceiling_anchor(tmp_path, capsys):
    path = worked_example_file(tmp_path)
    assert main([str(path), "--anchor", "ceiling", "--ceiling", "1.0", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["params"]["anchor"] == "ceiling"
    assert res["bound"]["derivation"] == "explicit"
    # 0.5 * 1.0 = 0.5: b's running means 0.1, 0.5 -> 2; a_again constant 0.5 -> 1
    assert res["per_regime"]["b"]["adaptation_speed"] == 2
    assert res["per_regime"]["a_again"]["adaptation_speed"] == 1
    assert res["per_regime"]["a"]["adaptation_speed"] is None
    assert res["per_regime"]["b"]["performance_gap"] == pytest.approx(0.4)


def test_ceiling_from_spec_file_and_data(tmp_path, capsys):
    path = worked_example_file(tmp_path)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"name": "s", "components": [{"name": "x", "clip": [0, 2]}]}))
    assert main([str(path), "--ceiling", str(spec), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["bound"]["derivation"] == "analytic" and res["bound"]["per_step"] == 2.0
    assert main([str(path), "--ceiling", "data", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["bound"]["derivation"] == "data_relative" and res["bound"]["per_step"] == 0.9


def test_per_seed_aggregation(tmp_path, capsys):
    a = worked_example_file(tmp_path, "s1.jsonl")
    b = worked_example_file(tmp_path, "s2.jsonl", scale=0.5)
    assert main([str(a), str(b), "--per-seed"]) == 0
    out = capsys.readouterr().out
    assert "seeds=2" in out
    cells = row(out, "Per-configuration reward J")
    assert cells[0] == "0.6000"  # mean of 0.8 and 0.4
    assert main([str(a), "--per-seed", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["per_regime"]["a"]["per_configuration_reward"]["spread"] is None


def test_bad_trace_is_a_clear_error(tmp_path, capsys):
    p = tmp_path / "bad.jsonl"
    p.write_text(
        '{"step": 0, "reward": 1.0, "regime_id": "a"}\n'
        '{"step": 1, "reward": Infinity, "regime_id": "a"}\n'
    )
    assert main([str(p)]) == 2
    assert "step 1" in capsys.readouterr().err
    assert main([str(worked_example_file(tmp_path)), "--solve-component", "goal"]) == 2
    assert "unknown reward component 'goal'" in capsys.readouterr().err


@pytest.mark.slow
def test_subprocess_dispatch(tmp_path):
    path = worked_example_file(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "continual_eval.cli", "stream", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert row(proc.stdout, "Adaptation speed") == ["--", "3", "1"]


BANDIT_SHORT = "--model.init_args.schedule=[[a, 30], [b, 30], [a_again, 30]]"


def test_bandit_example_prints_its_table(tmp_path, capsys):
    from continual_eval.stream.bandit import main as bandit

    bandit(
        [
            "--config",
            str(ROOT / "configs" / "bandit.yaml"),
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            BANDIT_SHORT,
        ]
    )
    out = capsys.readouterr().out
    log_dir = next(tmp_path.rglob("stream_table.txt")).parent
    table = (log_dir / "stream_table.txt").read_text().strip()
    assert table in out  # the whole table, not only a file
    assert row(out, "Forgetting")[0] == row(out, "Forgetting")[2] != "--"
    assert f"stream_table.txt, stream_metrics.json: {log_dir}" in out


def test_bandit_example_without_tensorboard_logs_csv(tmp_path, capsys, monkeypatch):
    from lightning.pytorch.loggers import CSVLogger

    import continual_eval.experiments.cli as experiments_cli
    from continual_eval.stream.bandit import main as bandit

    monkeypatch.setattr(experiments_cli, "tensorboard_available", lambda: False)
    cli = bandit(
        [
            "--config",
            str(ROOT / "configs" / "bandit.yaml"),
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            BANDIT_SHORT,
        ]
    )
    assert [type(lg) for lg in cli.trainer.loggers] == [CSVLogger]
    log_dir = Path(cli.trainer.logger.log_dir)
    assert log_dir == tmp_path / "stream" / "version_0"
    assert (log_dir / "metrics.csv").is_file() and (log_dir / "stream_table.txt").is_file()
    assert not list(tmp_path.rglob("events.out.tfevents.*"))
    out = capsys.readouterr().out
    notice = "tensorboard is not installed: logging to CSV only; for TensorBoard: "
    assert notice + 'pip install "continual-eval[experiments]"' in out

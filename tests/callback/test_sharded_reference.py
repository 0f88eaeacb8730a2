"""``train_reference(kind="isolated")`` under ModelParallelStrategy (FSDP2) on 2 CPU processes.

The reference's scores and baseline equal the single-process reference's bit for bit: the
sharded training is the single-process one exactly (sharded_reference_script.py: both ranks train
on the whole set, so the averaged gradients are the single-process ones), an eval-mode forward of
the sharded model gives the unsharded logits bit for bit, and an accuracy is
``correct / total`` of integer counts summed across the ranks, the same float64 however the
counts were split. This holds for the untrained unsharded model (deep-copied, each copy sharded
when its fit starts) and for a model already sharded by a fit (copied through
``model_factory`` from its full state dict); without a factory the sharded model is refused on
both ranks, without a hang (a 90 s gloo timeout would fail the run otherwise).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sharded_reference_script import make_model, reference, trainer_factory

from script_runner import run_script

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sharded_reference")
    proc = run_script(HERE / "sharded_reference_script.py", out, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def same(got: dict, ref) -> None:
    assert torch.equal(got["scores"], ref.scores), (got["scores"], ref.scores)
    assert torch.equal(got["baseline"], ref.baseline), (got["baseline"], ref.baseline)
    assert got["steps"] == ref.steps_trained


@pytest.mark.slow
def test_sharded_reference_equals_the_single_process_one(sharded_run) -> None:
    rank0, rank1 = (torch.load(sharded_run / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    for key in ("unsharded", "sharded"):
        for part in ("scores", "baseline"):
            assert torch.equal(rank0[key][part], rank1[key][part]), (key, part)
    # the copies were sharded when they trained and evaluated; so was the fitted model
    assert rank0["copies_sharding"] == ["dtensor"] * 5  # 2 + the model's fit + 2
    assert rank0["model_sharding"] == rank1["model_sharding"] == "dtensor"

    single = trainer_factory(1)
    same(rank0["unsharded"], reference(make_model(), single))
    fitted = make_model()
    fitted.load_state_dict(torch.load(sharded_run / "weights_fitted.pt"))
    expected = reference(fitted, single)
    same(rank0["sharded"], expected)
    assert not torch.equal(expected.baseline, reference(make_model(), single).baseline)
    assert rank0["model_unchanged"] and rank1["model_unchanged"]

    for saved in (rank0, rank1):
        assert saved["no_factory"].startswith("train_reference: model's parameters are sharded")
        assert "pass model_factory=" in saved["no_factory"]
        assert saved["wrong_factory"].startswith(
            "model_factory built a model that cannot load model's state dict: 'net.2.weight'"
        )

"""GPU check of the evaluation under sharded strategies, on 1 CUDA device (about 2 minutes).

    python benchmarks/gpu_check.py --out gpu_check_out        # every variant
    python benchmarks/gpu_check.py --only fsdp1 --only fsdp2   # some

Each variant runs in its own process: three tasks trained one ``fit`` each with
``ContinualEvalCallback`` (accuracy, cross-entropy, a torchmetrics macro F1; test sets of 301, 37
and 7 samples, batch 16) on one CUDA device:

* ``plain``: no strategy wrapper, no cache;
* ``cached``: the same run with ``cache_test_batches=True`` and ``eval_every_n_steps=4`` (test
  batches copied to the GPU through pinned memory once, then read from the cache);
* ``fsdp1``: ``FSDPStrategy`` (FSDP1, one unit per ``nn.Linear``): the model is called through
  Lightning's forward redirection (the wrapper's forward gathers the flat parameters), cached;
* ``fsdp2``: ``ModelParallelStrategy(1, 1)`` with ``fully_shard`` in ``configure_model``
  (DTensor parameters; the LightningModule called directly), cached;
* ``deepspeed3``: ``DeepSpeedStrategy(stage=3)`` (partitioned parameters, the engine's forward),
  cached; skipped when ``import deepspeed`` fails.

Every variant saves the full weights at the baseline and after each stage (gathered the
strategy's way). The driver then scores those weights with plain torch on the same GPU, batch by
batch as the loaders cut them, and checks, per variant: accuracy and F1 rows and baseline equal
bit for bit, cross-entropy to 1e-5 relative; the strategy is detected as collective (``fsdp1``,
``fsdp2``, ``deepspeed3``); under ``fsdp1`` and ``deepspeed3`` every evaluation batch went through
the wrapper's forward; ``cached`` equals ``plain`` bit for bit. It also prints how far each
strategy's R is from ``plain`` (training differs with the strategy, e.g. Lightning puts a
shuffling DistributedSampler into the train loaders of a parallel strategy: information, not a
check).

Expected output (the numbers of the last column vary; each check line ends in "ok"):

    variant      lockstep  wrapper calls  R vs its weights  R - plain R
    plain        False     -              ok                -
    cached       False     -              ok                0
    fsdp1        True      N >= 92        ok                ...
    fsdp2        True      -              ok                ...
    deepspeed3   True      N >= 92        ok                ...   (or: skipped, no deepspeed)
    GPU CHECK PASSED

(92: the 23 test batches of the baseline and the three stage-end evaluations; the per-step
evaluations add more). ``--cpu`` runs ``plain``, ``cached`` and ``fsdp2`` on the CPU, a smoke
test of the script itself.

and exit status 0 (1 with the failed checks listed). On the GPU machine lent to this project the
package's dependencies are there except ``msgspec`` (only the reward-stream module needs it) and
``deepspeed``; from the repository root: ``PYTHONPATH=src python3 benchmarks/gpu_check.py``.
Until it has run on a GPU, only the CPU strategies (DDP, ``ModelParallelStrategy``/FSDP2 on 2
processes) are tested; FSDP1 and DeepSpeed are handled in code and checked on paper.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VARIANTS = ("plain", "cached", "fsdp1", "fsdp2", "deepspeed3")
FEATURES, CLASSES, TEST_SIZES, BATCH = 16, 5, (301, 37, 7), 16


def make_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES)
    )


def make_tasks() -> list[tuple[TensorDataset, TensorDataset]]:
    g = torch.Generator().manual_seed(0)
    tasks = []
    for size in TEST_SIZES:
        means = torch.randn(CLASSES, FEATURES, generator=g) * 2

        def sample(n: int, means: torch.Tensor = means) -> TensorDataset:
            y = torch.randint(0, CLASSES, (n,), generator=g)
            return TensorDataset(means[y] + torch.randn(n, FEATURES, generator=g), y)

        tasks.append((sample(256), sample(size)))
    return tasks


def run_variant(name: str, out: Path, accelerator: str = "gpu") -> None:
    """One training run under the variant's strategy; saves what the driver checks."""
    import lightning.pytorch as pl
    from torchmetrics.classification import MulticlassF1Score

    from continual_eval import ContinualEvalCallback, fit_tasks
    from continual_eval.evaluation import collective_forward

    out.mkdir(parents=True, exist_ok=True)
    tasks = make_tasks()

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_net()

        def configure_model(self) -> None:
            from torch.distributed.fsdp import FSDPModule, fully_shard

            if name != "fsdp2" or isinstance(self.net, FSDPModule):
                return
            mesh = self.device_mesh["data_parallel"]
            for layer in self.net:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            return nn.functional.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def full_weights(trainer, module) -> dict[str, torch.Tensor]:
        if name == "deepspeed3":
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(module.parameters())):
                return {k: v.detach().cpu().clone() for k, v in module.net.state_dict().items()}
        if name in ("plain", "cached"):
            state = module.net.state_dict()
        else:
            state = trainer.strategy.lightning_module_state_dict()
        # the strategies' full state dicts hold the LightningModule's keys ("net.0.weight")
        return {k.split("net.", 1)[-1]: v.detach().cpu().clone() for k, v in state.items()}

    class Watch(pl.Callback):
        """Full weights at the baseline and each stage end; evaluation calls of the wrapper."""

        def __init__(self) -> None:
            self.stage, self.wrapper_calls, self.flags = 0, 0, {}
            self.module: nn.Module | None = None
            self.hooked: nn.Module | None = None

        def on_fit_start(self, trainer, pl_module):
            self.module, wrapper = pl_module, trainer.strategy.model
            if wrapper is not pl_module and wrapper is not self.hooked:  # a new wrapper per fit
                wrapper.register_forward_pre_hook(self.count)
                self.hooked = wrapper
            self.flags = {
                "lockstep": collective_forward(trainer.strategy, pl_module),
                "wrapped": wrapper is not pl_module,
            }
            if self.stage == 0:
                torch.save(full_weights(trainer, pl_module), out / "weights_baseline.pt")

        def count(self, module, args):
            if self.module is not None and not self.module.training:  # an evaluation's call
                self.wrapper_calls += 1

        def on_train_end(self, trainer, pl_module):
            torch.save(full_weights(trainer, pl_module), out / f"weights_{self.stage}.pt")
            self.stage += 1

    strategy: object = "auto"
    if name == "fsdp1":
        from lightning.pytorch.strategies import FSDPStrategy

        strategy = FSDPStrategy(auto_wrap_policy={nn.Linear})
    elif name == "fsdp2":
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy = ModelParallelStrategy(1, 1, save_distributed_checkpoint=False)
    elif name == "deepspeed3":
        from lightning.pytorch.strategies import DeepSpeedStrategy

        strategy = DeepSpeedStrategy(stage=3)
    cached = name != "plain"
    callback = ContinualEvalCallback(
        [DataLoader(te, batch_size=BATCH) for _, te in tasks],
        scorers={
            "accuracy": "accuracy",
            "cross_entropy": "loss",
            "f1": MulticlassF1Score(num_classes=CLASSES, average="macro"),
        },
        cache_test_batches=cached,
        eval_every_n_steps=4 if cached else None,
        dirpath=out / "results",
        verbose=False,
        log_images=False,
    )
    watch = Watch()
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        strategy=strategy,
        precision="32-true",
        max_epochs=1,
        callbacks=[watch, callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    pl.seed_everything(0, verbose=False)
    fit_tasks(trainer, Net(), [DataLoader(tr, batch_size=32) for tr, _ in tasks], seed=0)
    results = callback.continual_results()
    torch.save(
        {
            "matrices": {
                k: {"scores": m.scores, "baseline": m.baseline} for k, m in results.matrices.items()
            },
            "flags": watch.flags,
            "wrapper_calls": watch.wrapper_calls,
            "steps": len(callback.curves()[0]),
        },
        out / "result.pt",
    )


def plain_row(weights: Path, tasks, device: torch.device) -> dict[str, torch.Tensor]:
    """Plain-torch scores of the saved weights on every test set, batch by batch on ``device``."""
    from torchmetrics.functional.classification import multiclass_f1_score

    net = make_net().to(device)
    net.load_state_dict(torch.load(weights))
    net.eval()
    row: dict[str, list[float]] = {"accuracy": [], "cross_entropy": [], "f1": []}
    with torch.no_grad():
        for _, test in tasks:
            logits = torch.cat([net(x.to(device)) for x, _ in DataLoader(test, batch_size=BATCH)])
            y = test.tensors[1].to(device)
            pred = logits.argmax(1)
            losses = torch.logsumexp(logits, 1) - logits.gather(1, y[:, None])[:, 0]
            row["accuracy"].append(int((pred == y).sum()) / len(y))
            row["cross_entropy"].append(float(losses.sum(dtype=torch.float64)) / len(y))
            row["f1"].append(float(multiclass_f1_score(pred, y, CLASSES, average="macro")))
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in row.items()}


def check_variant(name: str, out: Path, plain: dict | None) -> tuple[list[str], str]:
    """The failed checks of one variant's run, and its table line."""
    saved = torch.load(out / "result.pt", weights_only=False)
    tasks, device = make_tasks(), torch.device("cuda" if torch.cuda.is_available() else "cpu")
    failed = []
    expected = {"baseline": plain_row(out / "weights_baseline.pt", tasks, device)}
    rows = [plain_row(out / f"weights_{i}.pt", tasks, device) for i in range(len(TEST_SIZES))]
    for key in ("accuracy", "cross_entropy", "f1"):
        got = saved["matrices"][key]
        reference = {
            "baseline": expected["baseline"][key],
            "scores": torch.stack([r[key] for r in rows]),
        }
        for part, value in reference.items():
            if key == "cross_entropy":
                same = torch.allclose(got[part], value, rtol=1e-5, atol=0)
            else:
                same = torch.equal(got[part], value)
            if not same:
                failed.append(f"{name}: {key} {part} {got[part].tolist()} != {value.tolist()}")
    flags = saved["flags"]
    if flags["lockstep"] != (name in ("fsdp1", "fsdp2", "deepspeed3")):
        failed.append(f"{name}: collective forward detected = {flags['lockstep']}")
    batches = sum(-(-n // BATCH) for n in TEST_SIZES)
    evaluations = 1 + len(TEST_SIZES)  # baseline and stage ends, whole test sets
    calls = "-"
    if flags["wrapped"]:
        calls = f"{saved['wrapper_calls']}"
        if saved["wrapper_calls"] < evaluations * batches:
            failed.append(
                f"{name}: {calls} evaluation calls through the wrapper, fewer than "
                f"the {evaluations * batches} batches of the stage evaluations"
            )
    distance = "-"
    if plain is not None:
        diff = (saved["matrices"]["accuracy"]["scores"] - plain["accuracy"]["scores"]).abs()
        distance = f"{float(diff.max()):.3g}"
        if name == "cached" and not all(
            torch.equal(saved["matrices"][k]["scores"], plain[k]["scores"]) for k in plain
        ):
            failed.append("cached: R differs from the uncached run's")
    verdict = "ok" if not failed else "FAILED"
    line = f"{name:12s} {flags['lockstep']!s:9s} {calls:14s} {verdict:17s} {distance}"
    return failed, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check_out"))
    parser.add_argument("--only", action="append", choices=VARIANTS)
    parser.add_argument(
        "--cpu", action="store_true", help="a smoke test of this script on the CPU (no GPU check)"
    )
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # a child run
    args = parser.parse_args()
    accelerator = "cpu" if args.cpu else "gpu"
    if args.variant is not None:
        run_variant(args.variant, args.out, accelerator)
        return
    if not args.cpu and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device")
    failed: list[str] = []
    columns = ("variant", "lockstep", "wrapper calls", "R vs its weights")
    print(f"{columns[0]:12s} {columns[1]:9s} {columns[2]:14s} {columns[3]:17s} R - plain R")
    plain = None
    chosen = args.only or (("plain", "cached", "fsdp2") if args.cpu else VARIANTS)
    for name in chosen:
        if name == "deepspeed3":
            try:
                import deepspeed  # noqa: F401
            except ImportError:
                print(f"{name:12s} skipped, no deepspeed")
                continue
        start = time.perf_counter()
        shutil.rmtree(args.out / name, ignore_errors=True)  # a fresh run directory
        proc = subprocess.run(
            [sys.executable, __file__, "--variant", name, "--out", str(args.out / name)]
            + (["--cpu"] if args.cpu else []),
            capture_output=True,
            text=True,
            timeout=240,
        )
        if proc.returncode != 0:
            failed.append(f"{name}: the run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            print(f"{name:12s} run FAILED")
            continue
        problems, line = check_variant(name, args.out / name, plain)
        failed += problems
        print(f"{line}   ({time.perf_counter() - start:.0f} s)")
        if name == "plain":
            plain = torch.load(args.out / name / "result.pt", weights_only=False)["matrices"]
    print("GPU CHECK PASSED" if not failed else "GPU CHECK FAILED:\n" + "\n".join(failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

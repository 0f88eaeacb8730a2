"""Cost of class-incremental evaluation (``ContinualEvalCallback(task_classes=...)``) against plain
accuracy alone, on the same model and loaders.

C=100 classes in T=10 tasks of 10 classes, 2000 test samples per task, a small MLP with one
100-way head. Two callbacks sit on the same Trainer and record every stage on the same weights:
accuracy alone (``ContinualEvalCallback(test)``), and everything of the class-incremental
evaluation (``task_classes=``: the accuracy matrix, ``acc_task_aware`` and ``acc_task_agnostic``
from the same forward passes, the confusion counts of the seen tasks, the ``class_incremental``
section computed and written to results.json with the rest). Per stage, each callback's
``_record_stage`` (its evaluation of all T tasks, the reduction, the metrics, results.json and
scores CSVs) is timed; their order alternates between repeats so that neither side always runs
with warm caches. The ratio is the median of the paired per-stage ratios (target <= 1.3).

The state the callback keeps for class-incremental evaluation: the nonzero cells of each
recorded stage's confusion counts, ``[nnz, 3]`` int64 ``(true, predicted, count)`` (24 bytes per
cell, at most one cell per test sample of the seen tasks); the scorers' own state during an
evaluation is one ``[K, C]`` block per task, ``K`` the largest task.

``--scale`` times the record alone at T = 1000 tasks of 2 classes (C = 2000, refused before the
counts were sparse): ``ClassIncrementalRecord.check_stage`` + ``record_stage`` of every stage,
fed the task-agnostic scorer's reduced ``[T, K, C]`` blocks of ``--scale-samples`` test samples
per task predicted at random among the seen classes (about one cell per seen test sample: the
worst case for the storage), each stage recorded ``--repeats`` times (its fastest time; a stage
recorded again replaces its cells), the median of the first and of the last 10% of the stages
(target: ratio <= 1.5); then the section built from all stages (``add_to``'s work) and the peak
RSS.

    python benchmarks/bench_class_incremental.py                # C=100, T=10, 2000 per task
    python benchmarks/bench_class_incremental.py --repeats 2    # quicker
    python benchmarks/bench_class_incremental.py --scale        # the record at T = 1000 x 2
"""

from __future__ import annotations

import argparse
import io
import resource
import statistics
import tempfile
import time
import warnings

import lightning.pytorch as pl
import torch
from bench_callback import FEATURES, MLP  # the same model (run from benchmarks/)
from torch.utils.data import DataLoader, TensorDataset

from continual_eval import ContinualEvalCallback, fit_tasks


def make_data(classes: int, tasks: int, test_size: int, train_size: int, batch_size: int):
    """Task ``t``: Gaussian blobs of its ``classes / tasks`` classes (ids ``t*K .. t*K+K-1``)."""
    g = torch.Generator().manual_seed(0)
    per_task = classes // tasks
    means = torch.randn(classes, FEATURES, generator=g) * 1.5
    task_classes = [list(range(t * per_task, (t + 1) * per_task)) for t in range(tasks)]

    def sample(t: int, n: int):
        y = torch.randint(0, per_task, (n,), generator=g) + t * per_task
        return TensorDataset(means[y] + torch.randn(n, FEATURES, generator=g), y)

    train = [DataLoader(sample(t, train_size), batch_size=batch_size) for t in range(tasks)]
    test = [DataLoader(sample(t, test_size), batch_size=batch_size) for t in range(tasks)]
    return train, test, task_classes


class Timed(ContinualEvalCallback):
    """Times ``_record_stage``: the stage's evaluation and everything recorded after it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seconds: list[float] = []

    def _record_stage(self, trainer, pl_module, stage):
        start = time.perf_counter()
        super()._record_stage(trainer, pl_module, stage)
        self.seconds.append(time.perf_counter() - start)


def trainer(root: str, callbacks, train_batches: int) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        limit_train_batches=train_batches,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )


def scale(tasks: int, samples: int, repeats: int) -> None:
    """The record's per-stage cost at ``tasks`` tasks of 2 classes (see the module docstring)."""
    from continual_eval._class_incremental_recorder import ClassIncrementalRecord
    from continual_eval.evaluation import TaskAgnosticAccuracyScorer
    from continual_eval.record import Scored
    from continual_eval.results import ClassIncrementalResults

    T, K = tasks, 2
    C = K * T
    task_classes = [[K * t + k for k in range(K)] for t in range(T)]
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, K, (T, samples), generator=g)  # each sample's row in its block
    task = torch.arange(T)[:, None].expand(T, samples).reshape(-1)
    blocks = torch.zeros(T, K, C, dtype=torch.int64)
    ones = torch.ones(T * samples, dtype=torch.int64)
    fastest: list[float] = []
    record = ClassIncrementalRecord(
        TaskAgnosticAccuracyScorer(task_classes), [str(j) for j in range(T)]
    )
    for stage in range(T):
        pred = torch.randint(0, K * (stage + 1), (T * samples,), generator=g)
        blocks.zero_().index_put_((task, labels.reshape(-1), pred), ones, accumulate=True)
        scored = Scored({}, {"acc_task_agnostic": blocks}, tuple(range(T)))
        times = []
        for _ in range(repeats):  # the same stage recorded again replaces its cells
            start = time.perf_counter()
            record.check_stage(stage, scored)
            record.record_stage(stage, scored)
            times.append(time.perf_counter() - start)
        fastest.append(min(times))  # the least disturbed of the repeats
    tenth = max(T // 10, 1)
    first, last = statistics.median(fastest[:tenth]), statistics.median(fastest[-tenth:])
    start = time.perf_counter()
    section = ClassIncrementalResults.compute(
        task_classes,
        record.confusion(T),
        confusion_text=[record.stage_text(i) for i in range(T)],
    )
    built = time.perf_counter() - start
    cells = record.stored_cells
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    print(
        f"record at T={T} tasks x {K} classes (C={C}), {samples} test samples per task, each "
        f"stage recorded {repeats} times (its fastest), torch threads {torch.get_num_threads()}"
    )
    print("| record's per-stage cost (check_stage + record_stage) | median |")
    print("|---|---|")
    print(f"| first 10% of stages (0 .. {tenth - 1}) | {first * 1e3:.2f} ms |")
    print(f"| last 10% of stages ({T - tenth} .. {T - 1}) | {last * 1e3:.2f} ms |")
    print(f"| ratio last / first (target <= 1.5) | {last / first:.2f} |")
    print(
        f"stored cells {cells} ({cells * 24 / 2**20:.0f} MiB at 24 bytes; dense [C, C] int64 per "
        f"stage would be {T * C * C * 8 / 2**30:.0f} GiB); the section of all {T} stages built "
        f"in {built:.2f} s ({section.confusion._nnz()} cells in its sparse tensor, "
        f"{section.confusion._nnz() * 32 / 2**20:.0f} MiB); peak RSS {rss:.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--test-size", type=int, default=2000, help="test samples per task")
    parser.add_argument("--train-size", type=int, default=512)
    parser.add_argument("--train-batches", type=int, default=8, help="training batches per task")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--scale", action="store_true", help="the record at T = 1000 x 2 classes")
    parser.add_argument("--scale-tasks", type=int, default=1000)
    parser.add_argument("--scale-samples", type=int, default=8, help="test samples per task")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.scale:
        scale(args.scale_tasks, args.scale_samples, args.repeats)
        return
    C, T = args.classes, args.tasks
    train, test, task_classes = make_data(C, T, args.test_size, args.train_size, args.batch_size)
    print(
        f"C={C} classes, T={T} tasks, {args.test_size} test samples per task, batch "
        f"{args.batch_size}, {args.repeats} repeats, torch threads {torch.get_num_threads()}"
    )
    ratios: list[float] = []
    plain_all: list[float] = []
    class_il_all: list[float] = []
    state_bytes = cells = 0
    json_bytes = (0, 0)
    for rep in range(args.repeats):
        with tempfile.TemporaryDirectory() as root:
            common = dict(verbose=False, log_images=False)
            plain = Timed(test, dirpath=f"{root}/plain", prefix="plain/", **common)
            class_il = Timed(test, dirpath=f"{root}/class_il", task_classes=task_classes, **common)
            order = [plain, class_il] if rep % 2 == 0 else [class_il, plain]
            pl.seed_everything(rep, verbose=False)
            fit_tasks(trainer(root, order, args.train_batches), MLP(C), train)
            pairs = list(zip(class_il.seconds, plain.seconds, strict=True))
            ratios += [a / b for a, b in pairs]
            plain_all += plain.seconds
            class_il_all += class_il.seconds
            print(
                f"repeat {rep} ({'plain first' if rep % 2 == 0 else 'class-IL first'}): per stage "
                f"plain {statistics.median(plain.seconds) * 1e3:.1f} ms, class-IL "
                f"{statistics.median(class_il.seconds) * 1e3:.1f} ms, median paired ratio "
                f"{statistics.median(a / b for a, b in pairs):.3f}"
            )
            buffer = io.BytesIO()
            torch.save(class_il._record.sections["class_incremental"].state_dict(), buffer)
            state_bytes = buffer.getbuffer().nbytes
            sizes = []
            for cb in (plain, class_il):
                path = cb.results_dir / "results.json"  # type: ignore[operator]
                sizes.append(path.stat().st_size)
            json_bytes = (sizes[0], sizes[1])
            cells = class_il._record.sections["class_incremental"].stored_cells
    print(
        f"per-stage time: plain accuracy median {statistics.median(plain_all) * 1e3:.1f} ms, "
        f"class-incremental median {statistics.median(class_il_all) * 1e3:.1f} ms"
    )
    print(
        f"class-incremental / plain accuracy, median of {len(ratios)} paired per-stage ratios: "
        f"{statistics.median(ratios):.3f} (target <= 1.3)"
    )
    print(
        f"confusion state: {cells} nonzero cells in all stages x 24 bytes = "
        f"{cells * 24 / 2**10:.0f} KiB (dense [{C}, {C}] int64 per stage: "
        f"{T * C * C * 8 / 2**10:.0f} KiB); the callback's class-incremental checkpoint state "
        f"{state_bytes / 2**10:.0f} KiB; results.json {json_bytes[0] / 2**10:.0f} KiB (plain) vs "
        f"{json_bytes[1] / 2**10:.0f} KiB (class-incremental, nonzero confusion cells as text)"
    )


if __name__ == "__main__":
    main()

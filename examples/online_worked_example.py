"""The online worked example: one autocorrelated stream, three learning rates, one callback each.

    PYTHONPATH=src python examples/online_worked_example.py [--out runs/online_example]

The stream of ``configs/online_autocorrelated.yaml`` (12000 samples in runs of 150 of one class,
10 classes) is trained once by the same small MLP at learning rates 0.5, 0.05 and 0.005, each run
scored by an :class:`~continual_eval.online.OnlineEvalCallback` (online accuracy, near-future
accuracy 1 and 45 batches ahead, a label delay of 5 batches, the blind predictors, four held-out
segment sets). Prints one row per learning rate and writes each run's ``results.json`` (its
``online`` section) and ``online.png`` under ``--out``. The write-up:
examples/online_autocorrelated.md.
"""

from __future__ import annotations

import argparse
import logging
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch

from continual_eval.online import OnlineEvalCallback
from continual_eval.online.synthetic import AutocorrelatedStream, StreamClassifier

LEARNING_RATES = (0.5, 0.05, 0.005)


def fit(lr: float, out: Path, samples: int) -> OnlineEvalCallback:
    pl.seed_everything(0, verbose=False)
    data = AutocorrelatedStream(num_samples=samples, run_length=150, batch_size=10, seed=0)
    callback = OnlineEvalCallback(
        near_future_delays=[1, 45],
        label_delays=[5],
        window_batches=50,
        blind_window=50,
        held_out=data.held_out_loaders(),
        held_out_names=[f"segment_{s}" for s in range(len(data.segment_starts))],
        segment_starts=data.segment_starts,
        eval_every_n_windows=2,
        dirpath=out / f"lr_{lr}",
        overwrite=True,
        verbose=False,
    )
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(StreamClassifier(lr=lr), datamodule=data)
    return callback


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("runs/online_example"))
    parser.add_argument("--samples", type=int, default=12000, help="stream length")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*blind predictor.*")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    header = (
        f"{'lr':>6s} {'online':>7s} {'blind':>6s} {'NF 1':>6s} {'NF 45':>6s} {'blind':>6s} "
        f"{'LD 5':>6s} {'A_AUC':>6s} {'final':>6s} {'forget':>6s} {'train s':>8s} {'fwd':>5s}"
    )
    print(header)
    for lr in LEARNING_RATES:
        results = fit(lr, args.out, args.samples).results
        assert results is not None
        summary = results.summary()
        scores, held, cost = summary["scores"], summary["held_out"], summary["cost"]

        def best_blind(score: str, scores: dict = scores) -> float:
            return max(v for v in scores[score]["blind"].values() if v is not None)

        print(
            f"{lr:6g} {scores['online']['accuracy']:7.3f} {best_blind('online'):6.3f} "
            f"{scores['near_future/1']['accuracy']:6.3f} "
            f"{scores['near_future/45']['accuracy']:6.3f} {best_blind('near_future/45'):6.3f} "
            f"{scores['label_delay/5']['accuracy']:6.3f} {held['anytime_accuracy']:6.3f} "
            f"{held['final']['seen']:6.3f} {held['metrics']['forgetting']:6.3f} "
            f"{cost['train_seconds']:8.1f} {cost['scoring_forwards']:5d}"
        )
    print(f"files: {args.out}/lr_*/results.json, online.png")


if __name__ == "__main__":
    main()

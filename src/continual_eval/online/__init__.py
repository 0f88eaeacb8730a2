"""Online continual learning evaluation: prequential, near-future, label-delay and blind-baseline
accuracy over a stream, held-out curves over time, and the compute beside them.

* [`OnlineEvalCallback`][continual_eval.online.OnlineEvalCallback]
  (`continual_eval.online.callback`): the Lightning callback;
* [`OnlineResults`][continual_eval.results.OnlineResults],
  [`read_online`][continual_eval.online.read_online] (`continual_eval.online.record`): the record,
  the ``online`` section of the run's ``results.json``;
* [`plot_online`][continual_eval.plotting.plot_online] (`continual_eval.online.plot`): the picture;
* the pure tensor functions behind them: `continual_eval.functional.online`.

See docs/online.md.
"""

from continual_eval.online.callback import OnlineEvalCallback
from continual_eval.online.plot import ONLINE_PNG, plot_online
from continual_eval.online.record import (
    BLIND_PREDICTORS,
    HeldOut,
    HeldOutEvaluation,
    OnlineProtocol,
    OnlineResults,
    OnlineWindow,
    ScoreCounts,
    WindowCost,
    read_online,
    score_key,
)

# the promised API (docs/compatibility.md): other names here are importable, not promised
__all__ = [
    "OnlineEvalCallback",
    "read_online",
]

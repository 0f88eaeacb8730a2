"""Online continual learning evaluation: prequential, near-future, label-delay and blind-baseline
accuracy over a stream, held-out curves over time, and the compute beside them.

* :class:`OnlineEvalCallback` (:mod:`continual_eval.online.callback`): the Lightning callback;
* :class:`OnlineResults`, :func:`read_online` (:mod:`continual_eval.online.record`): the record,
  the ``online`` section of the run's ``results.json``;
* :func:`plot_online` (:mod:`continual_eval.online.plot`): the picture;
* the pure tensor functions behind them: :mod:`continual_eval.functional.online`.

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

__all__ = [
    "BLIND_PREDICTORS",
    "ONLINE_PNG",
    "HeldOut",
    "HeldOutEvaluation",
    "OnlineEvalCallback",
    "OnlineProtocol",
    "OnlineResults",
    "OnlineWindow",
    "ScoreCounts",
    "WindowCost",
    "plot_online",
    "read_online",
    "score_key",
]

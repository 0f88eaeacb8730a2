"""The picture of an online evaluation: [`plot_online`][continual_eval.plotting.plot_online]
([`continual_eval.plotting.plot_online`][continual_eval.plotting.plot_online], drawn by the callback
at the end of training into ``online.png`` beside the run's ``results.json`` and by
``continual-eval report``).

matplotlib is optional (``pip install continual-eval[plot]``); it is imported on first use, with
the Agg backend unless a display backend was chosen.
"""

from __future__ import annotations

from continual_eval.plotting import plot_online

__all__ = ["ONLINE_PNG", "plot_online"]

#: the picture's file name in the results directory
ONLINE_PNG = "online.png"

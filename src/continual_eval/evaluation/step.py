"""The batch step: one test batch to ``(preds, target)`` (``continual_eval_step``, ``(x, y)``,
``(x, y, t)``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn

from continual_eval.evaluation.errors import EvaluationError, _what

#: ``step(module, batch, task_id) -> (preds, target)``
BatchStep = Callable[[nn.Module, Any, int], tuple[Tensor, Tensor]]


def _model_scores(output: Any) -> Tensor:
    """``output`` if it is one tensor, else an :class:`EvaluationError` saying what it was."""
    if isinstance(output, Tensor):
        return output
    pick = "[0]"
    if isinstance(output, Mapping) and output:
        pick = f"[{next(iter(output))!r}]"
    raise EvaluationError(
        f"the model returned {_what(output)}, not one tensor of class scores; make forward return "
        "the class logits [N, C] (or integer labels [N]), or define "
        "`continual_eval_step(self, batch, task_id)` on the LightningModule returning "
        f"(preds, target), e.g. `x, y = batch; return self(x){pick}, y`"
    )


def _accepts(module: nn.Module, *args: Any) -> bool:
    """Whether ``module.forward`` can be called with ``args`` (its signature binds them)."""
    try:
        inspect.signature(module.forward).bind(*args)
    except TypeError:
        return False
    except ValueError:  # no signature to inspect
        return True
    return True


def default_batch_step(module: nn.Module, batch: Any, task_id: int) -> tuple[Tensor, Tensor]:
    """``(x, y)`` -> ``(module(x), y)``; ``(x, y, t)`` -> ``(module(x, t), y)``.

    A LightningModule may instead define ``continual_eval_step(batch, task_id) -> (preds, target)``.

    Raises:
        EvaluationError: the model returned something other than one tensor, ``continual_eval_step``
            returned something other than a ``(preds, target)`` pair of tensors, a 3-element batch
            met a ``forward`` that takes no task id, or the batch has another structure.
    """
    hook = getattr(module, "continual_eval_step", None)
    if callable(hook):
        output = hook(batch, task_id)
        if (
            not isinstance(output, (tuple, list))
            or len(output) != 2
            or not all(isinstance(v, Tensor) for v in output)
        ):
            raise EvaluationError(
                f"continual_eval_step returned {_what(output)}; it must "
                "return a pair (preds, target) of tensors, e.g. `x, y = batch; return self(x), y`"
            )
        return output[0], output[1]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        return _model_scores(module(x)), y
    if isinstance(batch, (tuple, list)) and len(batch) == 3:
        x, y, t = batch
        try:
            output = module(x, t)
        except TypeError as err:
            if _accepts(module, x, t):
                raise  # raised inside forward: not a signature mismatch
            raise EvaluationError(
                "the batch had 3 elements, so it was scored as module(x, t) (x, y, task_id), but "
                f"{type(module).__name__}.forward does not take a task id ({err}); yield (x, y) "
                "batches, let forward take (x, task_id), or define `continual_eval_step(self, "
                "batch, task_id)` on the LightningModule, e.g. `x, y, _ = batch; return self(x), y`"
            ) from err
        return _model_scores(output), y
    raise EvaluationError(
        f"cannot score a batch of type {type(batch).__name__}"
        + (f" with {len(batch)} elements" if isinstance(batch, (tuple, list)) else "")
        + "; expected (x, y) or (x, y, task_id), or define `continual_eval_step(batch, task_id)` "
        "on the LightningModule returning (preds, target)"
    )


def _step_pair(output: Any, step: BatchStep) -> tuple[Tensor, Tensor]:
    if (
        isinstance(output, (tuple, list))
        and len(output) == 2
        and all(isinstance(v, Tensor) for v in output)
    ):
        return output[0], output[1]
    name = getattr(step, "__qualname__", type(step).__name__)
    raise EvaluationError(
        f"the batch step {name} returned {_what(output)}; it must return a pair (preds, target) "
        "of tensors"
    )

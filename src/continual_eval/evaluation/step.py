"""The batch step: one test batch to ``(preds, target)`` (``continual_eval_step``, ``(x, y)``,
``(x, y, t)``, a mapping batch of a language model)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn

from continual_eval.evaluation.errors import EvaluationError, _what

#: ``step(module, batch, task_id) -> (preds, target)``
BatchStep = Callable[[nn.Module, Any, int], tuple[Tensor, Tensor]]


def _model_scores(output: Any) -> Tensor:
    """``output`` if it is one tensor, else an
    [`EvaluationError`][continual_eval.evaluation.EvaluationError] saying what it was."""
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


#: the mapping-batch key that holds the targets; it is never passed to the model
LABELS_KEY = "labels"


def model_logits(output: Any) -> Tensor:
    """The logits of a model output: the output itself when it is a tensor, else its ``logits``
    attribute (a Hugging Face ``ModelOutput``), else its ``"logits"`` key (a mapping); an
    [`EvaluationError`][continual_eval.evaluation.EvaluationError] saying what it was otherwise."""
    if isinstance(output, Tensor):
        return output
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, Mapping):
        logits = output.get("logits")
    if isinstance(logits, Tensor):
        return logits
    raise EvaluationError(
        f"the model returned {_what(output)}; a mapping batch is scored from a tensor, an "
        "output with a `logits` tensor attribute (a Hugging Face ModelOutput: keep "
        "return_dict=True) or a mapping with a 'logits' tensor; or define "
        "`continual_eval_step(self, batch, task_id)` returning (preds, target)"
    )


@functools.lru_cache(maxsize=128)
def _parameters_of(function: Callable[..., Any]) -> tuple[frozenset[str], bool]:
    """``(names a call can pass by keyword, takes **kwargs)`` of ``function``."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # no signature to inspect: pass every key
        return frozenset(), True
    named = frozenset(
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    )
    return named, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def forward_parameters(module: nn.Module) -> tuple[frozenset[str], bool]:
    """``(parameter names of module.forward, whether it takes **kwargs)`` (cached per forward
    function)."""
    forward = module.forward
    return _parameters_of(getattr(forward, "__func__", forward))


def model_inputs(module: nn.Module, batch: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``module`` for a mapping batch: every key that ``forward``
    names as a parameter, except ``labels``; when ``forward`` names none of them but takes
    ``**kwargs`` (e.g. ``forward(self, **inputs)``), every key except ``labels``."""
    named, var_keyword = forward_parameters(module)
    inputs = {k: v for k, v in batch.items() if k in named and k != LABELS_KEY}
    if not inputs and var_keyword:
        inputs = {k: v for k, v in batch.items() if k != LABELS_KEY}
    return inputs


def mapping_batch_step(module: nn.Module, batch: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """``(logits, batch["labels"])`` of a mapping batch, the model called as
    ``module(**model_inputs(module, batch))``: ``labels`` is never passed (a Hugging Face model
    given labels computes its own loss, a second full-vocabulary pass with a float32 copy of the
    logits); 3-D logits, ``[N, T, V]`` as a causal LM returns them, are handed as
    ``logits.transpose(1, 2)`` (``[N, V, T]``, a view: the vocabulary on dim 1, the class
    dimension of every scorer); any other shape as the model returned it (``[N, C]`` of a
    sequence classifier)."""
    if LABELS_KEY not in batch:
        raise EvaluationError(
            f"a mapping batch is scored against its {LABELS_KEY!r} key, and this batch has the "
            f"keys {sorted(map(str, batch))}; add the labels (token ids, -100 where unscored) or "
            "define `continual_eval_step(self, batch, task_id)` returning (preds, target)"
        )
    target = batch[LABELS_KEY]
    if not isinstance(target, Tensor):
        raise EvaluationError(f"the batch's {LABELS_KEY!r} is {_what(target)}, not a tensor")
    inputs = model_inputs(module, batch)
    if not inputs:
        raise EvaluationError(
            f"{type(module).__name__}.forward names none of the batch's keys "
            f"{sorted(map(str, batch))} (labels are not passed); name them as its parameters "
            "(e.g. forward(self, input_ids, attention_mask=None)) or define "
            "`continual_eval_step(self, batch, task_id)`"
        )
    logits = model_logits(module(**inputs))
    if logits.ndim == 3:
        logits = logits.transpose(1, 2)
    return logits, target


def default_batch_step(module: nn.Module, batch: Any, task_id: int) -> tuple[Tensor, Tensor]:
    """``(x, y)`` -> ``(module(x), y)``; ``(x, y, t)`` -> ``(module(x, t), y)``; a mapping batch
    (``input_ids``, ``attention_mask``, ``labels``, ...) -> `mapping_batch_step`.

    Mapping batches, the exact rule: the model is called as ``module(**inputs)`` with ``inputs``
    every key of the batch that ``module.forward`` names as a parameter, except ``labels`` (when
    ``forward`` names none of the keys but takes ``**kwargs``: every key except ``labels``).
    ``labels`` is the target and is never passed, so a Hugging Face model computes no loss of its
    own (an encoder-decoder model then needs ``decoder_input_ids`` in the batch, as
    ``DataCollatorForSeq2Seq(model=...)`` makes them). The logits are the output itself (a
    tensor), its ``logits`` attribute (a ``ModelOutput``) or its ``"logits"`` key; 3-D logits
    ``[N, T, V]`` become ``[N, V, T]`` (``transpose(1, 2)``, a view) for the token scorers of
    `language`.

    A LightningModule may instead define ``continual_eval_step(batch, task_id) -> (preds, target)``
    (it wins over every rule here).

    Raises:
        EvaluationError: the model returned something other than one tensor (a tuple batch) or
            other than logits (a mapping batch), ``continual_eval_step`` returned something other
            than a ``(preds, target)`` pair of tensors, a 3-element batch met a ``forward`` that
            takes no task id, a mapping batch has no ``labels`` or no key ``forward`` takes, or
            the batch has another structure.
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
    if isinstance(batch, Mapping):
        return mapping_batch_step(module, batch)
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
        + "; expected (x, y), (x, y, task_id) or a mapping with 'labels', or define "
        "`continual_eval_step(batch, task_id)` on the LightningModule returning (preds, target)"
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

"""The engine's two speed switches, read at call time: set them on this module
(``continual_eval.evaluation.switches.FAST_PATH = False``, or a ``monkeypatch.setattr``) and the
next evaluation follows. The batches, and so the scores, are identical either way."""

from __future__ import annotations

__all__ = ["FAST_PATH", "POOLED_LOADERS"]

#: Read tensor-backed test sets without the DataLoader
#: (`fast_loader`). ``False``: every test set goes through its
#: DataLoader.
FAST_PATH = True

#: Evaluate test loaders with worker processes through one persistent worker pool per group of
#: equal DataLoader settings. ``False``: each loader starts its own workers, as a plain
#: ``for batch in loader`` does.
POOLED_LOADERS = True

"""Per-item values of one evaluation gathered across ranks by each item's position in its test set.

Item ``k`` of a task is the ``k``-th sample of its test set in the order its loader's sampler
reads the dataset (`continual_eval.evaluation.loaders`: the dataset's indices in order for a
sequential loader; a shuffling loader is read in index order when per-item records are on). A
sharded task's rank ``r`` of ``W`` reads the strided shard ``r, r + W, ...`` of those positions
(`shard_dataloader`), without padding, so its ``m``-th value is item ``r + m W``; an unsharded
task (counted by rank 0 alone) holds item ``m`` at its ``m``-th value on rank 0.

Two sum-reductions per evaluation, on every rank whatever its samples: the ``[tasks, W]`` value
counts (each rank fills its column), then one float64 buffer of every recorded scorer's items of
every task, each rank writing its own positions (zero elsewhere), so the sum is exact (one
nonzero term per entry). A rank whose count is not its shard's length (a loader that reads
another order) is refused on every rank together, naming the task.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import torch
from torch import Tensor

from continual_eval.evaluation.errors import EvaluationError

__all__ = ["gather_items"]


def gather_items(
    local: Sequence[Sequence[Tensor]],
    binary: Sequence[bool],
    task_ids: Sequence[int],
    *,
    unsharded: Collection[int],
    all_reduce: Callable[[Tensor], Tensor] | None,
    rank: int,
    world_size: int,
    device: torch.device,
    label: Callable[[int], str],
) -> list[list[Tensor]]:
    """Every task's items of every recorded scorer, in test-set order, the same on every rank.

    Args:
        local: ``local[s][k]``: scorer ``s``'s values on this rank of task ``task_ids[k]``, in the
            order read.
        binary: per scorer, whether its values are 0/1 (returned as ``bool``, else float64).

    Returns:
        ``[s][k]`` CPU tensors ``[n_k]``.
    """
    W = max(world_size, 1)
    K = len(task_ids)
    if not local or not K:
        return [[] for _ in local]
    lengths = torch.tensor([len(v) for v in local[0]], dtype=torch.int64)
    for values in local[1:]:
        other = torch.tensor([len(v) for v in values], dtype=torch.int64)
        if not torch.equal(other, lengths):
            k = int((other != lengths).int().argmax())
            raise EvaluationError(
                f"{label(task_ids[k])}: per-item records: the scorers kept {int(lengths[k])} "
                f"and {int(other[k])} values of the same samples"
            )
    counts = torch.zeros(K, W, dtype=torch.int64)
    counts[:, rank] = lengths
    counts = counts.to(device)
    if all_reduce is not None and world_size > 1:
        counts = all_reduce(counts)
    counts = counts.cpu()
    shared = torch.tensor([j not in unsharded or W == 1 for j in task_ids])
    n = torch.where(shared, counts.sum(dim=1), counts[:, 0])
    # a strided shard r of n items holds ceil((n - r) / W) of them
    expected = torch.where(
        shared.unsqueeze(1),
        (n.unsqueeze(1) - torch.arange(W) + W - 1).clamp(min=0) // W,
        torch.nn.functional.one_hot(torch.zeros(K, dtype=torch.int64), W) * n.unsqueeze(1),
    )
    wrong = (counts != expected).any(dim=1)
    if bool(wrong.any()):
        k = int(wrong.int().argmax())
        r = int((counts[k] != expected[k]).int().argmax())
        raise EvaluationError(
            f"{label(task_ids[k])}: per-item records: rank {r} scored {int(counts[k, r])} "
            f"samples, its unpadded shard of the {int(n[k])} items holds "
            f"{int(expected[k, r])}; the positions of its items are unknown"
        )
    # this rank's m-th value of task k is item offset_k + start + m * step
    offsets = torch.cumsum(n, 0) - n
    start = torch.where(shared, torch.full((K,), rank), torch.zeros(K, dtype=torch.int64))
    step = torch.where(shared, torch.full((K,), W), torch.ones(K, dtype=torch.int64))
    task = torch.repeat_interleave(torch.arange(K), lengths)
    first = torch.cumsum(lengths, 0) - lengths
    m = torch.arange(int(lengths.sum())) - first[task]
    positions = (offsets[task] + start[task] + m * step[task]).to(device)
    total = int(n.sum())
    # float64 (float32 on MPS, which has none: 0/1 items stay exact)
    dtype = torch.float32 if torch.device(device).type == "mps" else torch.float64
    buffer = torch.zeros(len(local), total, dtype=dtype, device=device)
    for s, values in enumerate(local):  # one write per scorer (a few scorers)
        if positions.numel():
            buffer[s, positions] = torch.cat([v.to(device, dtype) for v in values])
    if all_reduce is not None and world_size > 1:
        buffer = all_reduce(buffer)
    buffer = buffer.cpu()
    sizes = n.tolist()
    out = []
    for s, is_binary in enumerate(binary):
        row = buffer[s] != 0 if is_binary else buffer[s].double()
        out.append(list(torch.split(row, sizes)))
    return out

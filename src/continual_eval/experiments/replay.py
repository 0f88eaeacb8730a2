"""Experience replay: a reservoir-sampled memory of past training examples."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ReservoirBuffer(nn.Module):
    """Fixed-capacity memory holding a uniform sample of every example offered so far.

    Reservoir sampling (Vitter's algorithm R): the ``n``-th example offered (0-based) fills slot
    ``n`` while the memory is not full, and afterwards replaces a uniformly drawn slot with
    probability ``capacity / (n + 1)``. Uses the global torch RNG (seeded by ``seed_everything``).
    The storage is lazily shaped by the first batch and is part of the module's ``state_dict``.
    """

    def __init__(self, capacity: int):
        super().__init__()
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.register_buffer("inputs", torch.empty(0))
        self.register_buffer("labels", torch.empty(0, dtype=torch.long))
        self.register_buffer("num_seen", torch.zeros((), dtype=torch.long))

    def __len__(self) -> int:
        return min(int(self.num_seen), self.capacity)

    def add(self, inputs: Tensor, labels: Tensor) -> None:
        """Offer a batch of examples to the memory."""
        inputs, labels = inputs.detach(), labels.detach()
        if self.inputs.numel() == 0:
            self.inputs = inputs.new_zeros((self.capacity, *inputs.shape[1:]))
            self.labels = labels.new_zeros((self.capacity, *labels.shape[1:]))
        seen = int(self.num_seen)
        for offset in range(len(labels)):
            position = seen + offset
            if position < self.capacity:
                slot = position
            else:
                slot = int(torch.randint(position + 1, ()))
                if slot >= self.capacity:
                    continue
            self.inputs[slot] = inputs[offset]
            self.labels[slot] = labels[offset]
        self.num_seen += len(labels)

    def sample(self, batch_size: int) -> tuple[Tensor, Tensor]:
        """Up to ``batch_size`` stored examples drawn uniformly without replacement."""
        picked = torch.randperm(len(self), device=self.labels.device)[:batch_size]
        return self.inputs[picked], self.labels[picked]

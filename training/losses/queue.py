"""A first-in-first-out memory bank of teacher embeddings.

Shared by DistilCSE-CKD (Wu et al. 2021, section 3.1, eq. 5-6: a queue of the teacher's
embeddings from the preceding mini-batches, size Q = 65536, serves as extra negatives) and ConGen
(Limkonchotiwat et al. 2022, section 3.2: the instance queue D of K teacher embeddings over which
the similarity distributions of eq. 1 are computed). Both follow MoCo (He et al. 2020): when a
batch is enqueued the oldest entries leave first.

The bank is a ring buffer held in module buffers, so it follows ``.to(device)`` and round-trips
through ``state_dict()`` / ``load_state_dict()`` for ``--resume``. Stored vectors are detached:
no gradient ever flows into the bank.
"""

from __future__ import annotations

import torch
from torch import nn


class MemoryBank(nn.Module):
    """Fixed-capacity FIFO of ``dim``-wide vectors; :meth:`contents` returns them oldest first."""

    data: torch.Tensor
    head: torch.Tensor
    size: torch.Tensor

    def __init__(self, capacity: int, dim: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if capacity < 1 or dim < 1:
            raise ValueError(f"capacity and dim must be positive, got {capacity} and {dim}")
        self.capacity, self.dim = capacity, dim
        self.register_buffer("data", torch.zeros(capacity, dim, dtype=dtype))
        self.register_buffer("head", torch.zeros((), dtype=torch.long))  # next row to overwrite
        self.register_buffer("size", torch.zeros((), dtype=torch.long))  # rows filled so far

    def __len__(self) -> int:
        return int(self.size)

    @torch.no_grad()
    def enqueue(self, vectors: torch.Tensor) -> None:
        """Append a (n, dim) batch; when full, the oldest rows are dropped first.

        A batch larger than the capacity keeps only its last ``capacity`` rows (the newest).
        """
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"expected (n, {self.dim}) vectors, got {tuple(vectors.shape)}")
        vectors = vectors.detach().to(device=self.data.device, dtype=self.data.dtype)
        n = vectors.shape[0]
        if n == 0:
            return
        if n >= self.capacity:
            self.data.copy_(vectors[n - self.capacity :])
            self.head.zero_()
            self.size.fill_(self.capacity)
            return
        rows = (int(self.head) + torch.arange(n, device=self.data.device)) % self.capacity
        self.data[rows] = vectors
        self.head.fill_((int(self.head) + n) % self.capacity)
        self.size.fill_(min(int(self.size) + n, self.capacity))

    def contents(self) -> torch.Tensor:
        """The stored (len, dim) vectors, oldest first, newest last (a detached copy)."""
        size, head = int(self.size), int(self.head)
        if size < self.capacity:  # never wrapped: rows 0..size-1 in arrival order
            return self.data[:size].clone()
        return torch.cat([self.data[head:], self.data[:head]])

    def vectors(self) -> torch.Tensor:
        """The stored rows in storage order, without a copy: for order-free uses (softmax columns).

        A view of the buffer: read it before the next :meth:`enqueue`.
        """
        return self.data[: int(self.size)]

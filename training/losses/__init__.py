"""One module per distillation method, each keeping its tensor maths in a pure function; here, what they
share."""

from __future__ import annotations

import torch
from torch import nn


def check_shapes(*tensors: torch.Tensor) -> None:
    if any(t.shape != tensors[0].shape for t in tensors[1:]):
        raise ValueError("shapes differ: " + ", ".join(str(tuple(t.shape)) for t in tensors))


class MemoryBank(nn.Module):
    """A first-in-first-out memory bank of ``capacity`` teacher embeddings, ``dim`` wide: DistilCSE-CKD's
    queue of the teacher's embeddings from the preceding mini-batches (Wu et al. 2021, section 3.1, eq. 5-6:
    Q = 65536 extra negatives) and ConGen's instance queue D, over which the similarity distributions of eq.
    1 are computed (Limkonchotiwat et al. 2022, section 3.2). Both follow MoCo (He et al. 2020): when a batch
    is enqueued the oldest entries leave first.

    A ring buffer (once full, ``head`` is the oldest row) held in module buffers, so it follows
    ``.to(device)`` and round-trips through ``state_dict()`` for ``--resume``. Stored vectors are detached:
    no gradient ever flows into the bank.
    """

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
        """Append a (n, dim) batch; when full, the oldest rows are dropped first. A batch larger than the
        capacity keeps only its last ``capacity`` rows (the newest)."""
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

    def vectors(self) -> torch.Tensor:
        """The stored rows in storage order, without a copy: for order-free uses (softmax columns). A view of
        the buffer: read it before the next :meth:`enqueue`."""
        return self.data[: int(self.size)]

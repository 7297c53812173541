"""DistilCSE: knowledge distillation for contrastive sentence embeddings, then contrastive fine-tuning.

Wu, Gao, Wang, Zang, Wang, Hu. *DistilCSE: Effective Knowledge Distillation For Contrastive
Sentence Embeddings.* arXiv 2112.05638 (first titled *DisCo*), 2021.

Stage 1 (section 3.1) distils on unlabelled text by KD (eq. 3, :func:`kd_loss`) or CKD (eq. 6,
:func:`ckd_loss`) through M, a learnable linear map from the student's width to the teacher's.
Stage 2 (section 3.2, eq. 7, :func:`contrastive_finetune_loss`) fine-tunes the student alone,
SimCSE-style, on NLI triplets (anchor, entailment as positive, contradiction as hard negative).

The paper does not state tau; it follows SimCSE (Gao et al. 2021) for stage 2, whose supervised
temperature is 0.05, and we use 0.05 for CKD as well.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from training.losses import MemoryBank, check_shapes
from training.losses.matryoshka import Widths, matryoshka_loss, prefix_linear

TAU = 0.05
QUEUE_SIZE = 65536


def kd_loss(projected: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Eq. 3, ``L_KD = sum_i MSE(M h_i^S, h_i^T)``, averaged over the batch instead of summed (a
    constant factor): the mean over dimensions and the batch."""
    check_shapes(projected, teacher)
    return F.mse_loss(projected, teacher)


def ckd_loss(
    projected: torch.Tensor, teacher: torch.Tensor, queue: torch.Tensor | None = None, tau: float = TAU
) -> torch.Tensor:
    """Eq. 6 (eq. 4-5 without M), f the cosine: the teacher embedding of the same sentence is the positive;
    the other in-batch ones and a memory bank of Q earlier ones (section 4.2: 65536) the negatives::

        L_CKD = -log( e^{f(M h_i^S, h_i^T)/tau} /
                      (sum_j^N e^{f(M h_i^S, h_j^T)/tau} + sum_q^Q e^{f(M h_i^S, h_q^T)/tau}) )

    projected (``M h^S``), teacher: (N, D); queue: (Q, D), constant, or None / empty.
    """
    check_shapes(projected, teacher)
    keys = teacher if queue is None or len(queue) == 0 else torch.cat([teacher, queue.to(teacher)])
    logits = F.normalize(projected, dim=-1) @ F.normalize(keys, dim=-1).T / tau
    return F.cross_entropy(logits, torch.arange(projected.shape[0], device=projected.device))


def contrastive_finetune_loss(
    anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, tau: float = TAU
) -> torch.Tensor:
    """Eq. 7, supervised SimCSE: every in-batch positive and hard negative is in the denominator::

        L_CL = -log( e^{f(h_i, h_i^+)/tau} / sum_j^N (e^{f(h_i, h_j^+)/tau} + e^{f(h_i, h_j^-)/tau}) )

    anchor, positive, negative: (N, d) student embeddings of the NLI triplets.
    """
    check_shapes(anchor, positive, negative)
    a = F.normalize(anchor, dim=-1)
    keys = F.normalize(torch.cat([positive, negative]), dim=-1)
    logits = a @ keys.T / tau  # (N, 2N): columns 0..N-1 positives, N..2N-1 hard negatives
    return F.cross_entropy(logits, torch.arange(anchor.shape[0], device=anchor.device))


class DistilCSELoss(nn.Module):
    """Stage 1: holds M (student width -> teacher width) and, for CKD, the teacher memory bank.
    ``forward(student, teacher)``: student (N, d) the projected, not yet normalised student output; teacher
    (N, D) the teacher's embeddings of the same sentences. CKD enqueues the batch's teacher embeddings after
    the loss, so a batch is never its own queued negative."""

    def __init__(
        self,
        student_dim: int,
        teacher_dim: int,
        *,
        contrastive: bool = True,
        tau: float = TAU,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        super().__init__()
        self.project = nn.Linear(student_dim, teacher_dim)
        self.contrastive, self.tau = contrastive, tau
        self.bank = MemoryBank(queue_size, teacher_dim) if contrastive and queue_size > 0 else None

    def forward(
        self, student: torch.Tensor, teacher: torch.Tensor, widths: Widths | None = None
    ) -> torch.Tensor:
        """Eq. 3 / eq. 6, or with nested ``widths`` their Matryoshka sum: M takes each cut student
        vector through its first m columns; the teacher side stays full width."""
        student = student.float()
        teacher = teacher.to(student.dtype)
        queue = self.bank.vectors() if self.bank is not None else None  # order-free

        def at(m: int) -> torch.Tensor:
            projected = prefix_linear(student, self.project, m)
            if self.contrastive:
                return ckd_loss(projected, teacher, queue, self.tau)
            return kd_loss(projected, teacher)

        loss = matryoshka_loss(at, widths or Widths.full(student.shape[-1]))
        if self.bank is not None and self.training:
            self.bank.enqueue(teacher)  # after the loss: a batch is never its own queued negative
        return loss


class ContrastiveFinetuneLoss(nn.Module):
    """Stage 2 (eq. 7), no parameters: supervised SimCSE on (anchor, positive, hard negative)."""

    def __init__(self, tau: float = TAU) -> None:
        super().__init__()
        self.tau = tau

    def forward(self, anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        return contrastive_finetune_loss(anchor.float(), positive.float(), negative.float(), self.tau)

"""ConGen: unsupervised control and generalisation distillation.

Limkonchotiwat, Ponwitayarat, Lowphansirikul, Udomcharoenchaikit, Chuangsuwanich, Nutanong. *ConGen:
Unsupervised Control and Generalization Distillation For Sentence Representation.* Findings of EMNLP 2022.
Reference code: github.com/KornWtp/ConGen.

Each sentence x gives two augmented views x_1 = T(x), x_2 = T'(x) (section 3.1). The teacher sees x_1 only
(z_ref^T), the student both (z_con^S from x_1, z_gen^S from x_2); each becomes a similarity distribution over
an instance queue D of K teacher embeddings (eq. 1), compared by eq. 2 (:func:`congen_loss`). The queue is
FIFO (section 3.2): each mini-batch dequeues its size m of the oldest entries and enqueues its own z_ref^T, so
D already holds the current batch when the distributions are taken (the reference code concatenates the batch
to the full queue and trims afterwards: K + m columns instead of K). D starts as teacher embeddings of random
training sentences (section 4.1).

Defaults (appendix A.1, Table 7, MiniLM-L6 row): tau_T 0.05, tau_S 0.07, K 65536; alpha 0.5 (section 3.3 /
Table 5). The student's output passes a linear layer with Tanh to the teacher's width (section 4.1) when the
widths differ.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from training.losses import MemoryBank, check_shapes
from training.losses.matryoshka import Widths, matryoshka_loss, prefix

TEACHER_TAU = 0.05
STUDENT_TAU = 0.07
ALPHA = 0.5
QUEUE_SIZE = 65536


def similarity_logits(
    z: torch.Tensor, queue: torch.Tensor, tau: float, unit_queue: bool = False
) -> torch.Tensor:
    """Eq. 1 before the softmax, ``p(z, D, tau)_j = e^{cos(z, d_j)/tau} / sum_{d in D} e^{cos(z, d)/tau}``:
    cos(z_i, d_j) / tau, shape (n, K). ``unit_queue`` skips normalising a queue of unit rows."""
    keys = queue.to(z) if unit_queue else F.normalize(queue.to(z), dim=-1)
    return F.normalize(z, dim=-1) @ keys.T / tau


def soft_cross_entropy(target: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """CE(p, softmax(logits)) = -sum_j p_j log q_j, averaged over rows; ``target`` rows sum to 1."""
    return -(target * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


def congen_loss(
    student_control: torch.Tensor,
    student_general: torch.Tensor,
    teacher_reference: torch.Tensor,
    queue: torch.Tensor,
    *,
    teacher_tau: float = TEACHER_TAU,
    student_tau: float = STUDENT_TAU,
    alpha: float = ALPHA,
    student_queue: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eq. 2::

        L = alpha * CE(P_ref^T, P_con^S) + (1 - alpha) * CE(P_ref^T, P_gen^S),   CE(p, q) = -sum_j p_j log q_j

    with P_ref^T = p(z_ref^T, D, tau_T), P_con^S = p(z_con^S, D, tau_S), P_gen^S = p(z_gen^S, D, tau_S).
    student_control / student_general: (n, d) views x_1 / x_2; teacher_reference: (n, D); queue:
    (K, D) instance queue D (constant), which the student also sees unless ``student_queue`` (K, d)
    gives the same K instances in the student's coordinates (a Matryoshka prefix: d < D)."""
    student_queue = queue if student_queue is None else student_queue
    check_shapes(student_control, student_general)
    if len(teacher_reference) != len(student_control):
        raise ValueError(f"{len(teacher_reference)} teacher rows for {len(student_control)} student rows")
    widths = [x.shape[-1] for x in (student_control, student_queue, teacher_reference, queue)]
    if widths[0] != widths[1] or widths[2] != widths[3]:
        raise ValueError(
            f"widths differ: student and its queue {widths[:2]}, teacher and its queue {widths[2:]}"
        )
    if len(queue) == 0:
        raise ValueError("the instance queue is empty: fill it before the first step")
    if len(student_queue) != len(queue):
        raise ValueError(f"the queues differ in length: {len(student_queue)} against {len(queue)}")
    with torch.no_grad():
        unit = F.normalize(queue.to(student_control), dim=-1)  # once: K may be 65536 rows
        p_ref = F.softmax(similarity_logits(teacher_reference.to(unit), unit, teacher_tau, True), dim=-1)
        seen = unit if student_queue is queue else F.normalize(student_queue.to(unit), dim=-1)
    control = soft_cross_entropy(p_ref, similarity_logits(student_control, seen, student_tau, True))
    general = soft_cross_entropy(p_ref, similarity_logits(student_general, seen, student_tau, True))
    return alpha * control + (1 - alpha) * general


class ConGenLoss(nn.Module):
    """Holds the instance queue and, when the widths differ, the student head Linear + Tanh.
    ``forward(student_control, student_general, teacher_reference)``: the two student views (n, d), projected
    but not yet normalised, and the teacher's embeddings of view x_1 (n, D). In training mode the teacher
    batch is enqueued first (FIFO), then the loss is taken over the queue. Fill the queue with :meth:`prefill`
    before training (section 4.1)."""

    def __init__(
        self,
        student_dim: int,
        teacher_dim: int,
        *,
        teacher_tau: float = TEACHER_TAU,
        student_tau: float = STUDENT_TAU,
        alpha: float = ALPHA,
        queue_size: int = QUEUE_SIZE,
        space_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.head: nn.Module = (
            nn.Identity()
            if student_dim == teacher_dim
            else nn.Sequential(nn.Linear(student_dim, teacher_dim), nn.Tanh())
        )
        self.teacher_tau, self.student_tau, self.alpha = teacher_tau, student_tau, alpha
        self.bank = MemoryBank(queue_size, teacher_dim)
        # The same instances in the teacher's own space (its full width, before PCA): the teacher's
        # distribution is taken there; the student still compares with ``bank``.
        self.space_bank = MemoryBank(queue_size, space_dim) if space_dim is not None else None

    def prefill(self, teacher_embeddings: torch.Tensor, teacher_space: torch.Tensor | None = None) -> None:
        """Enqueue teacher embeddings (oldest first) and, with ``space_dim``, the same sentences'
        embeddings in the teacher's own space: the initial D of random training sentences."""
        self.bank.enqueue(teacher_embeddings)
        if self.space_bank is not None:
            self.space_bank.enqueue(self._checked_space(teacher_space))

    def _checked_space(self, teacher_space: torch.Tensor | None) -> torch.Tensor:
        if teacher_space is None:
            raise ValueError("this ConGen loss keeps the teacher's own space: pass teacher_space")
        return teacher_space.float()

    def forward(
        self,
        student_control: torch.Tensor,
        student_general: torch.Tensor,
        teacher_reference: torch.Tensor,
        widths: Widths | None = None,
        teacher_space: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Eq. 2, or with nested ``widths`` its Matryoshka sum. The student's views and the queue it
        sees are cut to each width; so is the teacher's distribution (PCA coordinates, ordered by
        variance), unless ``space_dim`` takes it in the teacher's own space (``teacher_space``,
        (n, space_dim)) for every width, as in the paper; the student then compares with the same
        instances' PCA coordinates instead of passing a head."""
        teacher_reference = teacher_reference.float()
        if self.training:
            self.prefill(teacher_reference, teacher_space)  # once per batch, whatever the widths
        control, general = self.head(student_control.float()), self.head(student_general.float())
        queue = self.bank.vectors()  # column order does not matter to eq. 1-2, but both banks share it
        teacher_queue = queue
        if self.space_bank is not None:
            teacher_reference, teacher_queue = self._checked_space(teacher_space), self.space_bank.vectors()
        widths = widths or Widths.full(control.shape[-1])
        if widths.nested and not isinstance(self.head, nn.Identity):
            raise ValueError("Matryoshka ConGen needs the student and teacher widths equal (no head)")

        def at(m: int) -> torch.Tensor:
            own_space = self.space_bank is None  # the teacher's distribution cut to m, as the student's
            return congen_loss(
                prefix(control, m),
                prefix(general, m),
                prefix(teacher_reference, m) if own_space else teacher_reference,
                prefix(teacher_queue, m) if own_space else teacher_queue,
                teacher_tau=self.teacher_tau,
                student_tau=self.student_tau,
                alpha=self.alpha,
                student_queue=None if own_space else prefix(queue, m),
            )

        return matryoshka_loss(at, widths)

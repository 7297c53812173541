"""Information Bottleneck Knowledge Distillation (IBKD).

Zhang, Long, Li, Xie. *Text Representation Distillation via Information Bottleneck Principle.* 2023.
Reference code: github.com/Alibaba-NLP/IBKD.

Section 3, eq. 1: maximise I(S, T) and minimise I(X, S): the first term is bounded from below by
InfoNCE (:func:`info_nce`), the second replaced by HSIC (:func:`hsic`). Stage 1 distils (eq. 8,
:func:`ibkd_distill_loss`); stage 2 fine-tunes on NLI triplets (eq. 9-10, :class:`IBKDFinetuneLoss`):
with every hard negative of the batch in every row's denominator, as the reference code and SimCSE
have it, eq. 10 is DistilCSE's eq. 7. Defaults are the paper's (section 4.3 and Table 1): gamma 0.5,
beta1 1.0, beta2 0.5, tau 0.1 (stage 1) and 0.05 (stage 2).

X is left open by the paper. As in the reference code (``--lambdas2 0``: hidden state 0), X is the
student's own input token embeddings mean-pooled over the attention mask (:func:`input_representation`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from training.losses.distilcse import ckd_loss, contrastive_finetune_loss
from training.losses.matryoshka import Widths, matryoshka_loss, prefix, prefix_linear

STAGE1_TAU = 0.1
STAGE2_TAU = 0.05
GAMMA = 0.5
BETA1 = 1.0
BETA2 = 0.5


def info_nce(student: torch.Tensor, teacher: torch.Tensor, tau: float = STAGE1_TAU) -> torch.Tensor:
    """Eq. 2-5 as a loss, in-batch negatives::

        L_nce = -1/n sum_i log( exp(f(s_i, t_i)/tau) / sum_j exp(f(s_i, t_j)/tau) )

    The paper's ``f(s, t) = s^T W t``; like the reference code, f is the cosine of ``W s`` and t:
    ``student`` (n, D) is already ``W s``, row j of ``teacher`` (n, D) the positive of student row j.
    """
    return ckd_loss(student, teacher, None, tau)  # DistilCSE's eq. 6 without a queue


def rbf_kernel(x: torch.Tensor, gamma: float = GAMMA) -> torch.Tensor:
    """Gram matrix ``exp(-gamma ||x_i - x_j||^2)``."""
    norms = x.pow(2).sum(dim=-1)
    sq = (norms[:, None] + norms[None, :] - 2 * x @ x.T).clamp(min=0)  # no sqrt: smooth at 0
    return torch.exp(-gamma * sq)


def hsic(x: torch.Tensor, y: torch.Tensor, gamma: float = GAMMA, normalize: bool = True) -> torch.Tensor:
    """Eq. 6-7: the biased empirical HSIC of paired rows of x (m, p) and y (m, q)::

        HSIC(X, S) = tr(K_X H K_S H) / (m - 1)^2,   H = I - 1/m 11^T,   K(a, b) = exp(-gamma ||a - b||^2)

    Eq. 6 prints 1/l^2; the reference code, after Gretton et al. 2005, divides by (m-1)^2. Eq. 7
    prints ``exp(gamma ||a - b||)``, not a kernel; the reference code's RBF is used. ``normalize``
    L2-normalises rows first, so gamma acts on squared distances in [0, 4] whatever the encoder's
    scale. Zero when either side is constant over the batch; needs m >= 2.
    """
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows, y has {y.shape[0]}")
    m = x.shape[0]
    if m < 2:
        raise ValueError("HSIC needs at least two samples")
    x, y = x.float(), y.float()
    if normalize:
        x, y = F.normalize(x, dim=-1), F.normalize(y, dim=-1)
    k, l_ = rbf_kernel(x, gamma), rbf_kernel(y, gamma)
    # tr(K H L H) = sum((H K H) * L) for symmetric L; H K H is K double-centred: O(m^2), no matmul.
    k_centred = k - k.mean(dim=0, keepdim=True) - k.mean(dim=1, keepdim=True) + k.mean()
    return (k_centred * l_).sum() / (m - 1) ** 2


def ibkd_distill_loss(
    aligned: torch.Tensor,
    teacher: torch.Tensor,
    inputs: torch.Tensor,
    student: torch.Tensor,
    *,
    tau: float = STAGE1_TAU,
    beta: float = BETA1,
    gamma: float = GAMMA,
) -> torch.Tensor:
    """Stage 1, eq. 8: ``L_IB = -(score_nce - beta1 HSIC)``, as a loss ``InfoNCE(W s, t) + beta1 *
    HSIC(X, S)``. aligned (n, D): ``W s``; teacher (n, D); inputs (n, p): X; student (n, d): S."""
    return info_nce(aligned, teacher, tau) + beta * hsic(inputs, student, gamma)


def input_representation(auto_model: nn.Module, features: dict[str, torch.Tensor]) -> torch.Tensor:
    """X for HSIC: the embedding block's output (hidden state 0), mean-pooled over the mask. ``auto_model`` is
    the student's Hugging Face encoder (``student[0].auto_model``); ``features`` the tokenised batch. Returns
    (n, hidden), detached: X is the input of the information bottleneck, so the student may not lower HSIC by
    degrading its own embedding table (the reference code does not detach). Costs one pass of the embedding
    block only; a pipeline that already runs the encoder with ``output_hidden_states=True`` can pool
    ``hidden_states[0]`` instead."""
    kwargs = {k: features[k] for k in ("input_ids", "token_type_ids") if k in features}
    with torch.no_grad():
        hidden = auto_model.embeddings(**kwargs)
        mask = features["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


class IBKDLoss(nn.Module):
    """Stage-1 IBKD: holds the training-only W (student width -> teacher width). ``forward(student, teacher,
    inputs)``: student (n, d) is S (the projected, not yet normalised, student output), teacher (n, D) the
    teacher's embeddings, inputs (n, p) is X."""

    def __init__(
        self,
        student_dim: int,
        teacher_dim: int,
        *,
        tau: float = STAGE1_TAU,
        beta: float = BETA1,
        gamma: float = GAMMA,
    ) -> None:
        super().__init__()
        self.align = nn.Linear(student_dim, teacher_dim, bias=False)
        self.tau, self.beta, self.gamma = tau, beta, gamma

    def forward(
        self, student: torch.Tensor, teacher: torch.Tensor, inputs: torch.Tensor, widths: Widths | None = None
    ) -> torch.Tensor:
        """Eq. 8, or with nested ``widths`` its Matryoshka sum: ``InfoNCE(W_{:,1:m} s_{1:m}, t) +
        beta1 * HSIC(X, S_{1:m})`` at each width m."""
        student = student.float()
        teacher = teacher.to(student.dtype)

        def at(m: int) -> torch.Tensor:
            return ibkd_distill_loss(
                prefix_linear(student, self.align, m),
                teacher,
                inputs,
                prefix(student, m),
                tau=self.tau,
                beta=self.beta,
                gamma=self.gamma,
            )

        return matryoshka_loss(at, widths or Widths.full(student.shape[-1]))


class IBKDFinetuneLoss(nn.Module):
    """Stage-2 IBKD (no parameters), eq. 9: supervised InfoNCE with hard negatives (eq. 10, see the
    module docstring) + ``beta2 * HSIC(X, S)``, X and S of every sentence of the batch (anchors,
    positives, negatives stacked), as the reference code computes HSIC over all of them."""

    def __init__(self, *, tau: float = STAGE2_TAU, beta: float = BETA2, gamma: float = GAMMA) -> None:
        super().__init__()
        self.tau, self.beta, self.gamma = tau, beta, gamma

    def forward(
        self,
        anchor: torch.Tensor,
        positive: torch.Tensor,
        negative: torch.Tensor,
        inputs: torch.Tensor,
        student: torch.Tensor,
    ) -> torch.Tensor:
        nce = contrastive_finetune_loss(anchor.float(), positive.float(), negative.float(), self.tau)
        return nce + self.beta * hsic(inputs, student, self.gamma)

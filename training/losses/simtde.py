"""SimTDE: simple transformer distillation for sentence embeddings.

Xie, He, Wang, Qiu, Kebarighotbi, Ghassemi. *SimTDE: Simple Transformer Distillation for Sentence Embeddings.*
SIGIR 2023.

Section 3, eq. 1-5: the student's compact token embeddings, projected to the teacher's width, are matched to
the teacher's token embeddings, and its sentence embedding to the teacher's::

    TokenEmb_T = Emb_T(I),  TokenEmb_S^proj = Proj(Emb_S(I))                  (eq. 1-2)
    L_TE = MSE(TokenEmb_S^proj, TokenEmb_T)                                      (eq. 3)
    L_SE = MSE(SentenceEmb_S, SentenceEmb_T)                                     (eq. 4)
    L_KD = alpha * L_TE + (1 - alpha) * L_SE,   alpha = 0.5                      (eq. 5)

"Token embeddings" are the output of the token embedding block (what enters the first encoder layer), not the
final hidden states: the paper distils no hidden states, and its Table 2 ablation ("+ hidden states
distillation") loses 0.8 points. MSE is the mean over elements; L_TE averages over the real tokens only
(padding masked out). The student architecture is in ``training/simtde_student.py``.

``sentence_weight`` (default 1, the paper) multiplies L_SE. Our sentence targets are the teacher's PCA-d
coordinates, whose per-element MSE is about 1/d of HPD's summed squared error, so the token term would
dominate; the training pipeline passes ``sentence_weight = d`` (L_SE summed over the d dimensions, HPD's eq. 2
scale) unless told otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from training.losses import check_shapes
from training.losses.matryoshka import Widths, matryoshka_loss, prefix

ALPHA = 0.5


def masked_token_mse(
    student_tokens: torch.Tensor, teacher_tokens: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Eq. 3 over real tokens: sum of squared errors on unmasked positions / (tokens * width).

    student_tokens, teacher_tokens: (B, L, H); attention_mask: (B, L), 1 for real tokens.
    """
    check_shapes(student_tokens, teacher_tokens)
    if attention_mask.shape != student_tokens.shape[:2]:
        raise ValueError(f"mask {tuple(attention_mask.shape)} does not match {tuple(student_tokens.shape)}")
    mask = attention_mask.unsqueeze(-1).to(student_tokens.dtype)
    squared = (student_tokens - teacher_tokens).pow(2) * mask
    return squared.sum() / (mask.sum() * student_tokens.shape[-1]).clamp(min=1.0)


def simtde_loss(
    student_tokens: torch.Tensor,
    teacher_tokens: torch.Tensor,
    attention_mask: torch.Tensor,
    student_sentence: torch.Tensor,
    teacher_sentence: torch.Tensor,
    *,
    alpha: float = ALPHA,
    sentence_weight: float = 1.0,
    widths: Widths | None = None,
) -> torch.Tensor:
    """Eq. 5: ``alpha * L_TE + (1 - alpha) * sentence_weight * L_SE``, sentences (B, d); with nested
    ``widths`` L_SE is the Matryoshka sum over the cut sentence vectors (the PCA targets cut alike)."""
    check_shapes(student_sentence, teacher_sentence)
    token_term = masked_token_mse(student_tokens, teacher_tokens, attention_mask)
    sentence_term = matryoshka_loss(
        lambda m: F.mse_loss(prefix(student_sentence, m), prefix(teacher_sentence, m)),
        widths or Widths.full(student_sentence.shape[-1]),
    )
    return alpha * token_term + (1 - alpha) * sentence_weight * sentence_term


class SimTDELoss(nn.Module):
    """Eq. 5 with a fixed alpha and sentence weight; inputs as :func:`simtde_loss`, cast to float32."""

    def __init__(self, alpha: float = ALPHA, sentence_weight: float = 1.0) -> None:
        super().__init__()
        self.alpha, self.sentence_weight = alpha, sentence_weight

    def forward(
        self,
        student_tokens: torch.Tensor,
        teacher_tokens: torch.Tensor,
        attention_mask: torch.Tensor,
        student_sentence: torch.Tensor,
        teacher_sentence: torch.Tensor,
        *,
        widths: Widths | None = None,
    ) -> torch.Tensor:
        tokens = (student_tokens.float(), teacher_tokens.float(), attention_mask)
        weights = {"alpha": self.alpha, "sentence_weight": self.sentence_weight}
        return simtde_loss(
            *tokens, student_sentence.float(), teacher_sentence.float(), **weights, widths=widths
        )

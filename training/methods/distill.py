"""Stage 1 of HPD, IBKD and DistilCSE: the student's d-dim output against the teacher's targets.

- HPD (Zhao et al., Findings of ACL 2022), eq. 2: ``L = 1/M sum_i ||h_s_i - h_t_i||^2`` with
  ``h_t`` the teacher's fixed PCA-d embedding (:mod:`training.losses.hpd`).
- IBKD (Zhang et al. 2023), eq. 8: ``InfoNCE(W s, t) + beta1 * HSIC(X, S)``, S the student's d-dim
  output, W a training-only map to the teacher's full width D, X the student's own mean-pooled
  input token embeddings (:mod:`training.losses.ibkd`).
- DistilCSE (Wu et al. 2021), eq. 3 (KD: ``MSE(M h^S, h^T)``) or eq. 6 (CKD: InfoNCE of ``M h^S``
  against the teacher batch plus a memory bank of earlier teacher batches), M a training-only map
  from d to D (:mod:`training.losses.distilcse`).

With ``--matryoshka`` each loss is summed over the nested widths (:mod:`training.losses.matryoshka`).
Only the d-dim student (Transformer -> Pooling -> Dense -> Normalize) is saved: W and M exist for
the loss only, as in the papers' students, whose own output is what is evaluated.
"""

from __future__ import annotations

import torch

from training.losses.distilcse import TAU as DISTILCSE_TAU
from training.losses.distilcse import DistilCSELoss
from training.losses.hpd import hpd_loss
from training.losses.ibkd import STAGE1_TAU, IBKDLoss, info_nce, input_representation
from training.losses.matryoshka import matryoshka_loss, prefix, prefix_linear
from training.methods.base import MethodInputs, Stage, distill_stage, encode_features, pick
from training.student import projected_embeddings


def hpd_stage(inp: MethodInputs) -> Stage:
    """HPD eq. 2 against the PCA-d targets (the pipeline's original path, unchanged)."""
    student, texts, targets, widths = inp.student, inp.texts, inp.pca_targets, inp.cfg.widths()

    def batch_loss(indices: list[int]) -> torch.Tensor:
        emb = projected_embeddings(student, [texts[i] for i in indices]).float()
        target = targets[indices].to(emb.device)
        return matryoshka_loss(lambda m: hpd_loss(prefix(emb, m), prefix(target, m)), widths)

    return distill_stage(inp, batch_loss, {"targets": "pca"})


def ibkd_stage(inp: MethodInputs) -> Stage:
    """IBKD eq. 8 against the full-dim teacher targets."""
    cfg, student, texts = inp.cfg, inp.student, inp.texts
    full = inp.full_targets()
    tau = pick(cfg.temperature, STAGE1_TAU)
    loss = IBKDLoss(cfg.dim, full.shape[1], tau=tau).to(inp.device)
    encoder, widths = student[0].auto_model, cfg.widths()

    def batch_loss(indices: list[int]) -> torch.Tensor:
        features, emb = encode_features(student, [texts[i] for i in indices])
        teacher = full[indices].to(emb.device)
        if len(indices) < 2:  # HSIC needs two samples; a lone tail batch gets InfoNCE only
            student_out, target = emb.float(), teacher.float()
            return matryoshka_loss(
                lambda m: info_nce(prefix_linear(student_out, loss.align, m), target, tau), widths
            )
        return loss(emb, teacher, input_representation(encoder, features), widths)

    return distill_stage(
        inp, batch_loss, {"targets": "full", "tau": tau, "beta1": loss.beta, "gamma": loss.gamma}, loss
    )


def distilcse_stage(inp: MethodInputs, contrastive: bool) -> Stage:
    """DistilCSE eq. 3 (KD) or eq. 6 (CKD, with the memory bank) against the full-dim targets."""
    cfg, student, texts = inp.cfg, inp.student, inp.texts
    full = inp.full_targets()
    tau = pick(cfg.temperature, DISTILCSE_TAU)
    loss = DistilCSELoss(
        cfg.dim, full.shape[1], contrastive=contrastive, tau=tau, queue_size=cfg.queue_size
    ).to(inp.device)

    widths = cfg.widths()

    def batch_loss(indices: list[int]) -> torch.Tensor:
        _, emb = encode_features(student, [texts[i] for i in indices])
        return loss(emb, full[indices].to(emb.device), widths)

    info = {"targets": "full", "loss": "ckd" if contrastive else "kd"}
    if contrastive:
        info |= {"tau": tau, "queue_size": cfg.queue_size}
    return distill_stage(inp, batch_loss, info, loss)

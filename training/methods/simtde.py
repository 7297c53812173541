"""SimTDE (Xie et al., SIGIR 2023): compact token embeddings + the last K layers, single stage.

Student (:mod:`training.simtde_student`): an ELECTRA encoder whose ``token_dim``-wide embedding
tables are an SVD factorisation of the source's (``--student``, BERT family) and whose K encoder
layers are copies of the source's last K, then mean pooling and Dense to d. Loss, eq. 5
(:mod:`training.losses.simtde`)::

    L_KD = alpha * MSE(Proj(Emb_S(I)), Emb_T(I)) + (1 - alpha) * w * MSE(SentenceEmb_S, SentenceEmb_T)

Deviations: the token target ``Emb_T`` is the frozen embedding block of the layer source (the
student must share its tokenizer), while the sentence target is the big teacher's PCA-d embedding
(HPD's target), so a 768-d teacher can teach a 128-d output; the paper's teacher is the layer source
itself. ``w`` (``sentence_weight``, default d) rescales the per-element MSE of the PCA-d targets to
HPD's summed squared error, without which the token term dominates.
"""

from __future__ import annotations

import torch
from sentence_transformers import SentenceTransformer

from training.config import TrainConfig
from training.losses.simtde import SimTDELoss
from training.methods.base import MethodInputs, Stage, distill_stage
from training.simtde_student import (
    build_simtde_student,
    simtde_forward,
    teacher_token_embedder,
    teacher_token_embeddings,
)
from training.student import tokenize

DEFAULT_LAYERS = 3
SAMPLE_TEXTS = 20_000


def simtde_layers(cfg: TrainConfig) -> int:
    return cfg.layers or DEFAULT_LAYERS


def build_simtde(cfg: TrainConfig, texts: list[str], device: str) -> SentenceTransformer:
    return build_simtde_student(
        cfg.student,
        layers=simtde_layers(cfg),
        token_dim=cfg.token_dim,
        dim=cfg.dim,
        max_seq_len=cfg.max_seq_len,
        device=device,
        sample_texts=texts[:SAMPLE_TEXTS],
    )


def simtde_stage(inp: MethodInputs) -> Stage:
    cfg, student, texts, targets = inp.cfg, inp.student, inp.texts, inp.pca_targets
    embedder = teacher_token_embedder(cfg.student, device=inp.device)
    weight = float(cfg.dim) if cfg.sentence_weight is None else cfg.sentence_weight
    loss, widths = SimTDELoss(sentence_weight=weight), cfg.widths()

    def batch_loss(indices: list[int]) -> torch.Tensor:
        features = tokenize(student, [texts[i] for i in indices])
        tokens, sentence = simtde_forward(student, features)
        teacher_tokens = teacher_token_embeddings(embedder, features)
        target = targets[indices].to(sentence.device)
        return loss(tokens, teacher_tokens, features["attention_mask"], sentence, target, widths=widths)

    return distill_stage(
        inp,
        batch_loss,
        {
            "targets": "pca",
            "alpha": loss.alpha,
            "sentence_weight": weight,
            "token_dim": cfg.token_dim,
            "layers": simtde_layers(cfg),
        },
    )

"""Stage 2 of IBKD and DistilCSE: supervised contrastive fine-tuning of the student on NLI triplets
(anchor, entailment as positive, contradiction as hard negative); the teacher is no longer used.

- DistilCSE (Wu et al. 2021), section 3.2, eq. 7 (supervised SimCSE)::

      L_CL = -log( e^{f(h_i, h_i^+)/tau} / sum_j (e^{f(h_i, h_j^+)/tau} + e^{f(h_i, h_j^-)/tau}) )

- IBKD (Zhang et al. 2023), eq. 9-10: the same InfoNCE with hard negatives plus
  ``beta2 * HSIC(X, S)`` over every sentence of the batch (anchors, positives, negatives).

The student starts from the best stage-1 checkpoint (STS-B dev) and keeps its d-dim projection
(IBKD's "dimension reduction" variant: the projection exists from stage 1 on, not only in stage 2).
Deviation: one hard negative per anchor (the triplet file has one); IBKD used 8 for retrieval.
"""

from __future__ import annotations

import torch
from sentence_transformers import SentenceTransformer

from distilembed.errors import UserError
from training.config import TrainConfig
from training.data.extra_text import drop_excluded_triplets, excluded_keys
from training.data.pairs import Triplet, load_triplets
from training.losses.distilcse import ContrastiveFinetuneLoss
from training.losses.ibkd import IBKDFinetuneLoss, input_representation
from training.losses.matryoshka import matryoshka_loss, prefix
from training.methods.base import Stage, encode_features, stage_loop, text_lengths


def load_finetune_triplets(cfg: TrainConfig, data_dir: str | None) -> tuple[list[Triplet], int]:
    """The ``--finetune-data`` triplets less every one with an ``--exclude-text`` sentence in it
    (decision 34's rule, applied to the supervised stage too), and how many were dropped."""
    found = load_triplets(cfg.finetune_data, data_dir)
    triplets, dropped = drop_excluded_triplets(found, excluded_keys(cfg.exclude_text, data_dir))
    if not triplets:
        what = "no triplets" if not found else f"no triplets left after --exclude-text ({dropped} dropped)"
        raise UserError(f"{what} in --finetune-data {cfg.finetune_data}")
    return triplets, dropped


def nli_finetune_stage(
    cfg: TrainConfig, student: SentenceTransformer, data_dir: str | None, with_hsic: bool
) -> Stage:
    """Eq. 7 (DistilCSE) or eq. 9 (IBKD, ``with_hsic``) over batches of triplets."""
    triplets, dropped = load_finetune_triplets(cfg, data_dir)
    tau = cfg.finetune_temperature
    ibkd = IBKDFinetuneLoss(tau=tau)
    simcse = ContrastiveFinetuneLoss(tau=tau)
    encoder, widths = student[0].auto_model, cfg.widths()

    def batch_loss(indices: list[int]) -> torch.Tensor:
        rows = [triplets[i] for i in indices]
        texts = [r.anchor for r in rows] + [r.positive for r in rows] + [r.negative for r in rows]
        features, emb = encode_features(student, texts)  # one pass over all 3n sentences
        inputs = input_representation(encoder, features) if with_hsic else None

        def at(m: int) -> torch.Tensor:  # the cut embeddings (the losses normalise them)
            anchor, positive, negative = prefix(emb, m).split(len(rows))
            if inputs is not None:
                return ibkd(anchor, positive, negative, inputs, prefix(emb, m))
            return simcse(anchor, positive, negative)

        return matryoshka_loss(at, widths)

    info = {
        "data": cfg.finetune_data,
        "triplets": len(triplets),
        "triplets_excluded": dropped,
        "loss": "ibkd-eq9" if with_hsic else "simcse-eq7",
        "tau": tau,
    }
    if with_hsic:
        info["beta2"] = ibkd.beta
    return Stage(
        "finetune",
        batch_loss,
        text_lengths([t.anchor for t in triplets]),
        stage_loop(cfg, finetune=True),
        info=info,
    )

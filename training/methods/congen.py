"""ConGen (Limkonchotiwat et al., Findings of EMNLP 2022): control and generalisation distillation.

Each training sentence x gives two augmented views x_1 = T(x), x_2 = T'(x); the teacher embeds x_1
(z_ref^T, through the target cache), the student both (z_con^S, z_gen^S). With the instance queue D
of teacher embeddings and ``p(z, D, tau)_j = softmax_j(cos(z, d_j) / tau)`` (eq. 1), eq. 2::

    L = alpha * CE(P_ref^T, P_con^S) + (1 - alpha) * CE(P_ref^T, P_gen^S)

What we implement (:mod:`training.losses.congen`): the teacher side is the teacher's fixed PCA-d
embedding (HPD's targets), so the student's saved d-dim output is compared with the queue directly
and no Linear+Tanh head is needed; D is prefilled with the PCA-d targets of random training
sentences (section 4.1) and is FIFO. Deviation: the views are word deletion / crop (``congen_views``;
the paper back-translates, and its Table 6 finds deletion and synonym replacement nearly as good).
A view may also be ``none`` (the sentence itself): with ``none`` as the teacher's view its targets
are the training targets already cached, which saves a whole teacher pass over the corpus.

Combined objective (``--hpd-weight w``): ``L + w * HPD(z_con^S, z_ref^T)``, HPD's eq. 2 (squared L2
to the teacher's PCA-d coordinates, :func:`training.losses.hpd.hpd_loss`) on the control view's
un-normalised output. ConGen matches similarity distributions, which leaves the scale and position
of the student's cloud free; HPD's term pins the coordinates themselves.
"""

from __future__ import annotations

import numpy as np
import torch

from training.augment import augmented_views
from training.losses.congen import STUDENT_TAU, TEACHER_TAU, ConGenLoss
from training.losses.hpd import hpd_loss
from training.losses.matryoshka import matryoshka_loss, prefix
from training.methods.base import MethodInputs, Stage, distill_stage, encode_features, pick


def congen_stage(inp: MethodInputs) -> Stage:
    cfg, student = inp.cfg, inp.student
    first, second = cfg.congen_views
    rates = {"deletion_p": cfg.deletion_p, "synonym_p": cfg.synonym_p}
    view1 = augmented_views(inp.texts, first, cfg.seed, **rates)
    view2 = augmented_views(inp.texts, second, cfg.seed + 1, **rates)
    # The training sentences' full-width targets, when ConGen's distribution is taken in the teacher's
    # own space (--congen-teacher-space full): the prefill reads them, and the "none" view reuses them.
    full = inp.full_targets() if cfg.congen_teacher_space == "full" else None
    if first == "none":  # the teacher's view is the sentence itself: its targets are the training ones
        reference, view1_info, space = inp.pca_targets, {"reused": "training targets"}, full
    else:
        view1_full, view1_info = inp.teacher.targets(view1)
        reference = torch.from_numpy(inp.pca.transform(view1_full))  # z_ref^T, PCA-d
        space = None if full is None else torch.from_numpy(np.asarray(view1_full, dtype=np.float16))
    widths = cfg.widths()
    loss = ConGenLoss(
        cfg.dim,
        cfg.dim,
        teacher_tau=pick(cfg.teacher_temperature, TEACHER_TAU),
        student_tau=pick(cfg.temperature, STUDENT_TAU),
        queue_size=cfg.queue_size,
        space_dim=space.shape[1] if space is not None else None,
    ).to(inp.device)
    rng = np.random.default_rng(cfg.seed)
    sample = torch.from_numpy(np.sort(rng.choice(len(inp.texts), min(cfg.queue_size, len(inp.texts)), False)))
    prefill_space = None if full is None else full[sample].float().to(inp.device)
    loss.prefill(inp.pca_targets[sample].to(inp.device), prefill_space)

    def batch_loss(indices: list[int]) -> torch.Tensor:
        texts = [view1[i] for i in indices] + [view2[i] for i in indices]
        _, emb = encode_features(student, texts)  # both views in one pass
        control, general = emb.split(len(indices))
        target = reference[indices].to(emb.device)
        total = loss(
            control, general, target, widths, None if space is None else space[indices].to(emb.device)
        )
        if cfg.hpd_weight:
            mse = matryoshka_loss(lambda m: hpd_loss(prefix(control, m), prefix(target, m)), widths)
            total = total + cfg.hpd_weight * mse
        return total

    return distill_stage(
        inp,
        batch_loss,
        {
            "targets": "pca",
            "views": list(cfg.congen_views),
            "teacher_tau": loss.teacher_tau,
            "student_tau": loss.student_tau,
            "queue_size": cfg.queue_size,
            "hpd_weight": cfg.hpd_weight,
            "teacher_space": cfg.congen_teacher_space,
            "prefill": len(sample),
            "view1_cache": view1_info,
        },
        loss,
    )

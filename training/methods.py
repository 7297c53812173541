"""Per-method training setup (docs/methods.md): which student to build and which stages to train. The
pipeline prepares what the methods share (training sentences, the teacher's cached full-dim targets, the
fitted PCA and the PCA-d targets) in a :class:`MethodInputs`; a method turns it into stages, each a
``batch_loss(indices)`` over its own examples with its loop settings.

Stage 1 distils on the unlabelled corpus: HPD (:mod:`training.losses.hpd`, eq. 2), ConGen
(:mod:`training.losses.congen`, eq. 2) and SimTDE (:mod:`training.losses.simtde`, eq. 5) against the
teacher's PCA-d targets; IBKD (:mod:`training.losses.ibkd`, eq. 8) and DistilCSE
(:mod:`training.losses.distilcse`, eq. 3 / 6) against the full-width targets through a training-only map
W / M from d to D. Only the d-dim student is saved: W and M exist for the loss only, as in the papers.

Stage 2 of IBKD and DistilCSE fine-tunes the best stage-1 student alone on NLI triplets (anchor,
entailment, contradiction): DistilCSE's eq. 7 (supervised SimCSE) or IBKD's eq. 9 (the same plus
``beta2 * HSIC(X, S)`` over every sentence of the batch), keeping its d-dim projection (IBKD's "dimension
reduction" variant). Deviation: one hard negative per anchor (the triplet file has one); IBKD used 8.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from torch import nn

from distilembed.errors import UserError
from training import simtde_student
from training.augment import augmented_views
from training.config import TWO_STAGE, TrainConfig
from training.data.extra_text import drop_excluded, excluded_keys
from training.data.pairs import Triplet, load_triplets
from training.losses.congen import STUDENT_TAU, TEACHER_TAU, ConGenLoss
from training.losses.distilcse import TAU as DISTILCSE_TAU
from training.losses.distilcse import ContrastiveFinetuneLoss, DistilCSELoss
from training.losses.hpd import PCATargets, hpd_loss
from training.losses.ibkd import STAGE1_TAU, IBKDFinetuneLoss, IBKDLoss, info_nce, input_representation
from training.losses.matryoshka import matryoshka_loss, prefix, prefix_linear
from training.losses.simtde import SimTDELoss
from training.student import build_student, encoder_inputs, load_trained_weights, projected, tokenize
from training.teacher_targets import AnyTeacher
from training.trainer import BatchLoss, LoopConfig

SIMTDE_LAYERS = 3  # SimTDE's student keeps the source's last 3 layers unless --layers says otherwise
SIMTDE_SAMPLE_TEXTS = 20_000  # training sentences whose token counts weight SimTDE's embedding factorisation


@dataclass
class MethodInputs:
    """``texts[i]`` has the full-dim teacher target row i of ``np.concatenate(full_parts)`` and the
    PCA-d target ``pca_targets[i]``."""

    cfg: TrainConfig
    student: SentenceTransformer
    teacher: AnyTeacher
    texts: list[str]
    full_parts: list[np.ndarray]
    pca: PCATargets
    pca_targets: torch.Tensor
    device: str
    data_dir: str | None

    def full_targets(self) -> torch.Tensor:
        """(len(texts), D) float16 teacher targets, kept on the CPU; rows are moved per batch."""
        parts = [np.asarray(p, dtype=np.float16) for p in self.full_parts]
        return torch.from_numpy(np.concatenate(parts) if len(parts) > 1 else parts[0].copy())


@dataclass
class Stage:
    """One training loop. ``extra_params`` (training-only maps) train beside the student;
    ``extra_state`` (queues) is snapshotted for ``--resume``; ``info`` goes in the manifest."""

    name: str
    batch_loss: BatchLoss
    lengths: np.ndarray
    loop: LoopConfig
    extra_params: list[nn.Parameter] = field(default_factory=list)
    extra_state: nn.Module | None = None
    info: dict[str, Any] = field(default_factory=dict)


def stage_loop(cfg: TrainConfig, finetune: bool = False) -> LoopConfig:
    """Loop settings of stage 1 (the same for every method, so budgets compare) or, ``finetune``, of
    the NLI stage: its ``finetune_*`` fields, a snapshot at every evaluation and the next seed."""
    names = ("batch_size", "lr", "epochs", "max_steps", "eval_every", "patience")
    loop = {name: getattr(cfg, f"finetune_{name}" if finetune else name) for name in names}
    save_every = loop["eval_every"] if finetune else cfg.save_every
    seed = cfg.seed + 1 if finetune else cfg.seed
    return LoopConfig(**loop, save_every=save_every, warmup_ratio=cfg.warmup_ratio, seed=seed, amp=cfg.amp)


def distill_stage(
    inp: MethodInputs, batch_loss: BatchLoss, info: dict[str, Any], loss: nn.Module | None = None
) -> Stage:
    """Stage 1 over the training sentences, with ``loss``'s parameters and state."""
    extra = list(loss.parameters()) if loss is not None else []
    lengths = np.array([len(t) for t in inp.texts])
    return Stage("train", batch_loss, lengths, stage_loop(inp.cfg), extra, extra_state=loss, info=info)


def encode_features(student: SentenceTransformer, texts: list[str]) -> tuple[dict[str, Any], torch.Tensor]:
    """(tokenised encoder inputs, the d-dim output before Normalize) in one pass; the inputs serve
    losses that need them (IBKD's X)."""
    features = tokenize(student, texts)
    return encoder_inputs(features), projected(student, features)


def pick(value: float | None, default: float) -> float:
    return default if value is None else value


def simtde_layers(cfg: TrainConfig) -> int:
    return cfg.layers or SIMTDE_LAYERS


def hpd_stage(inp: MethodInputs) -> Stage:
    student, texts, targets, widths = inp.student, inp.texts, inp.pca_targets, inp.cfg.widths()

    def batch_loss(indices: list[int]) -> torch.Tensor:
        _, emb = encode_features(student, [texts[i] for i in indices])
        emb = emb.float()
        target = targets[indices].to(emb.device)
        return matryoshka_loss(lambda m: hpd_loss(prefix(emb, m), prefix(target, m)), widths)

    return distill_stage(inp, batch_loss, {"targets": "pca"})


def ibkd_stage(inp: MethodInputs) -> Stage:
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

    info = {"targets": "full", "tau": tau, "beta1": loss.beta, "gamma": loss.gamma}
    return distill_stage(inp, batch_loss, info, loss)


def distilcse_stage(inp: MethodInputs, contrastive: bool) -> Stage:
    """KD (eq. 3) or, ``contrastive``, CKD (eq. 6, with the memory bank)."""
    cfg, student, texts, widths = inp.cfg, inp.student, inp.texts, inp.cfg.widths()
    full = inp.full_targets()
    tau = pick(cfg.temperature, DISTILCSE_TAU)
    loss = DistilCSELoss(
        cfg.dim, full.shape[1], contrastive=contrastive, tau=tau, queue_size=cfg.queue_size
    ).to(inp.device)

    def batch_loss(indices: list[int]) -> torch.Tensor:
        _, emb = encode_features(student, [texts[i] for i in indices])
        return loss(emb, full[indices].to(emb.device), widths)

    info = {"targets": "full", "loss": "ckd" if contrastive else "kd"}
    if contrastive:
        info |= {"tau": tau, "queue_size": cfg.queue_size}
    return distill_stage(inp, batch_loss, info, loss)


def congen_stage(inp: MethodInputs) -> Stage:
    """The teacher side is the teacher's fixed PCA-d embedding (HPD's targets), so the student's saved d-dim
    output is compared with the queue directly and no Linear+Tanh head is needed; D is prefilled with the
    PCA-d targets of random training sentences (section 4.1). Deviation: the views are word deletion / crop
    (``congen_views``; the paper back-translates, its Table 6 finds deletion and synonym replacement nearly as
    good). A view may be ``none`` (the sentence itself): as the teacher's view its targets are the training
    targets already cached, which saves a teacher pass over the corpus. ``--hpd-weight w`` adds
    ``w * HPD(z_con^S, z_ref^T)`` on the control view's un-normalised output: ConGen matches similarity
    distributions, which leaves the scale and position of the student's cloud free; HPD's term pins the
    coordinates themselves."""
    cfg, student = inp.cfg, inp.student
    first, second = cfg.congen_views
    rates = {"deletion_p": cfg.deletion_p, "synonym_p": cfg.synonym_p}
    view1 = augmented_views(inp.texts, first, cfg.seed, **rates)
    view2 = augmented_views(inp.texts, second, cfg.seed + 1, **rates)
    # --congen-teacher-space full: the training sentences' full-width targets fill the prefill and
    # serve the "none" view.
    full = inp.full_targets() if cfg.congen_teacher_space == "full" else None
    if first == "none":
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
        teacher_space = None if space is None else space[indices].to(emb.device)
        total = loss(control, general, target, widths, teacher_space)
        if cfg.hpd_weight:
            mse = matryoshka_loss(lambda m: hpd_loss(prefix(control, m), prefix(target, m)), widths)
            total = total + cfg.hpd_weight * mse
        return total

    info = {
        "targets": "pca",
        "views": list(cfg.congen_views),
        "teacher_tau": loss.teacher_tau,
        "student_tau": loss.student_tau,
        "queue_size": cfg.queue_size,
        "hpd_weight": cfg.hpd_weight,
        "teacher_space": cfg.congen_teacher_space,
        "prefill": len(sample),
        "view1_cache": view1_info,
    }
    return distill_stage(inp, batch_loss, info, loss)


def simtde_stage(inp: MethodInputs) -> Stage:
    """Deviations: the token target ``Emb_T`` is the frozen embedding block of the layer source (the student
    shares its tokenizer), while the sentence target is the big teacher's PCA-d embedding (HPD's target), so a
    768-d teacher can teach a 128-d output; the paper's teacher is the layer source itself."""
    cfg, student, texts, targets = inp.cfg, inp.student, inp.texts, inp.pca_targets
    embedder = simtde_student.teacher_token_embedder(cfg.student, device=inp.device)
    weight = float(cfg.dim) if cfg.sentence_weight is None else cfg.sentence_weight
    loss, widths = SimTDELoss(sentence_weight=weight), cfg.widths()

    def batch_loss(indices: list[int]) -> torch.Tensor:
        features = tokenize(student, [texts[i] for i in indices])
        tokens, sentence = simtde_student.simtde_forward(student, features)
        teacher_tokens = simtde_student.teacher_token_embeddings(embedder, features)
        target = targets[indices].to(sentence.device)
        return loss(tokens, teacher_tokens, features["attention_mask"], sentence, target, widths=widths)

    info = {
        "targets": "pca",
        "alpha": loss.alpha,
        "sentence_weight": weight,
        "token_dim": cfg.token_dim,
        "layers": simtde_layers(cfg),
    }
    return distill_stage(inp, batch_loss, info)


def load_finetune_triplets(cfg: TrainConfig, data_dir: str | None) -> tuple[list[Triplet], int]:
    """The ``--finetune-data`` triplets less every one with an ``--exclude-text`` sentence in it
    (decision 34), and how many were dropped."""
    found = load_triplets(cfg.finetune_data, data_dir)
    triplets, dropped = drop_excluded(found, excluded_keys(cfg.exclude_text, data_dir), Triplet.texts)
    if not triplets:
        what = "no triplets" if not found else f"no triplets left after --exclude-text ({dropped} dropped)"
        raise UserError(f"{what} in --finetune-data {cfg.finetune_data}")
    return triplets, dropped


def nli_finetune_stage(
    cfg: TrainConfig, student: SentenceTransformer, data_dir: str | None, with_hsic: bool
) -> Stage:
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
    lengths = np.array([len(t.anchor) for t in triplets])
    return Stage("finetune", batch_loss, lengths, stage_loop(cfg, finetune=True), info=info)


FIRST_STAGE: dict[str, Callable[[MethodInputs], Stage]] = {
    "hpd": hpd_stage,
    "ibkd": ibkd_stage,
    "distilcse-kd": partial(distilcse_stage, contrastive=False),
    "distilcse-ckd": partial(distilcse_stage, contrastive=True),
    "simtde": simtde_stage,
    "congen": congen_stage,
}


def uses_simtde_student(cfg: TrainConfig) -> bool:
    return cfg.method == "simtde" or cfg.student_arch == "simtde"


def build_method_student(cfg: TrainConfig, texts: list[str], device: str) -> SentenceTransformer:
    """The SimTDE ELECTRA student or a (layer-cut) copy of ``--student``; with ``--init-from``, the
    weights of that finished checkpoint."""
    if uses_simtde_student(cfg):
        student = simtde_student.build_simtde_student(
            cfg.student,
            layers=simtde_layers(cfg),
            token_dim=cfg.token_dim,
            dim=cfg.dim,
            max_seq_len=cfg.max_seq_len,
            device=device,
            sample_texts=texts[:SIMTDE_SAMPLE_TEXTS],
        )
    else:
        student = build_student(
            cfg.student,
            cfg.dim,
            cfg.layers,
            max_seq_len=cfg.max_seq_len,
            device=device,
            freeze_embeddings=cfg.freeze_embeddings,
        )
    if cfg.init_from is not None:
        load_trained_weights(student, cfg.init_from)
    return student


def student_layers(cfg: TrainConfig) -> int | None:
    return simtde_layers(cfg) if uses_simtde_student(cfg) else cfg.layers


def method_stages(inp: MethodInputs) -> list[Stage]:
    method = inp.cfg.method
    stages = [FIRST_STAGE[method](inp)]
    if method in TWO_STAGE:
        stages.append(nli_finetune_stage(inp.cfg, inp.student, inp.data_dir, with_hsic=method == "ibkd"))
    return stages

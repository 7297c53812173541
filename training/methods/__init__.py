"""Per-method training setup: which student to build and which stages to train (docs/methods.md).

``hpd``, ``simtde`` and ``congen`` have one distillation stage on the unlabelled corpus; ``ibkd``,
``distilcse-kd`` and ``distilcse-ckd`` add a second, supervised stage on NLI triplets that starts
from the best stage-1 student.
"""

from __future__ import annotations

from sentence_transformers import SentenceTransformer

from training.config import TrainConfig
from training.methods.base import MethodInputs, Stage
from training.student import build_student, load_trained_weights

__all__ = ["MethodInputs", "Stage", "build_method_student", "method_stages", "student_layers"]


def build_method_student(cfg: TrainConfig, texts: list[str], device: str) -> SentenceTransformer:
    """The method's student: the SimTDE ELECTRA student, or a (layer-cut) copy of ``--student``;
    with ``--init-from``, the weights of that finished checkpoint."""
    if uses_simtde_student(cfg):
        from training.methods.simtde import build_simtde

        student = build_simtde(cfg, texts, device)
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


def uses_simtde_student(cfg: TrainConfig) -> bool:
    return cfg.method == "simtde" or cfg.student_arch == "simtde"


def student_layers(cfg: TrainConfig) -> int | None:
    if uses_simtde_student(cfg):
        from training.methods.simtde import simtde_layers

        return simtde_layers(cfg)
    return cfg.layers


def method_stages(inp: MethodInputs) -> list[Stage]:
    """The stages of ``inp.cfg.method``, in order."""
    method = inp.cfg.method
    if method == "hpd":
        from training.methods.distill import hpd_stage

        return [hpd_stage(inp)]
    if method == "simtde":
        from training.methods.simtde import simtde_stage

        return [simtde_stage(inp)]
    if method == "congen":
        from training.methods.congen import congen_stage

        return [congen_stage(inp)]
    from training.methods.distill import distilcse_stage, ibkd_stage
    from training.methods.finetune import nli_finetune_stage

    if method == "ibkd":
        first = ibkd_stage(inp)
    elif method in {"distilcse-kd", "distilcse-ckd"}:
        first = distilcse_stage(inp, contrastive=method == "distilcse-ckd")
    else:
        raise ValueError(f"no stages for method {method!r}")  # config validation rules this out
    return [first, nli_finetune_stage(inp.cfg, inp.student, inp.data_dir, with_hsic=method == "ibkd")]

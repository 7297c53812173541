"""The SimTDE student: compact token embeddings, a projection, and the teacher's last K layers.

Xie et al., *SimTDE*, SIGIR 2023, section 3 and Table 1 (SimTDE-128-L3(384): MiniLM-L6 cut to its last 3
layers behind 128-d token embeddings, 9.5M parameters).

Architecture. A standard Hugging Face **ELECTRA** encoder hosts it: ELECTRA's embedding block has its own
``embedding_size`` (word, position and token-type tables plus LayerNorm at that width) and a Linear
``embeddings_project`` up to ``hidden_size``, and its encoder layers are BERT layers with the same parameter
names (``encoder.layer.i.attention.self.query``, ...). So the student is a plain ``ElectraModel`` inside a
sentence-transformers pipeline (Transformer -> mean Pooling -> Dense(hidden, d) -> Normalize): it reloads with
``SentenceTransformer(path)`` and exports with ``export/onnx_graph.py`` unchanged (ALBERT could host BERT
layers too, but needs renamed keys and has layer sharing to get wrong).

Initialisation (:func:`factorise_embeddings`). The teacher's embedding block computes ``LN_D(w + p + t)``;
LayerNorm discards the component along the all-ones vector, so only the centred rows matter. They are
factorised by one SVD (shared basis V of r = k - 1 directions, k the compact width) and the compact tables
hold their coordinates, rotated into the (k-1)-dim subspace of R^k orthogonal to the ones vector and scaled so
that the student's ``LN_k`` sees the same variance. The projection maps back through V and carries the
teacher's LayerNorm gain and bias. When the teacher's centred sums lie in span(V) (always when k = D) the
student's projected token embeddings equal the teacher's, LayerNorm epsilon included; below that rank it is
the best shared rank-(k-1) approximation. The encoder layers are copies of the teacher's last K layers
(section 3: "reuse the selected last K teacher encoder layers' weights").
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from typing import Any

import torch
from sentence_transformers import SentenceTransformer
from torch import nn

from distilembed.errors import UserError, first_line
from training.student import encoder_inputs, linear_head, models
from training.teachers import resolve_model


@dataclass(frozen=True)
class FactorisedEmbeddings:
    """Compact tables (rows x k) and the projection ``Linear(k, D)`` (weight D x k, bias D)."""

    word: torch.Tensor
    position: torch.Tensor
    token_type: torch.Tensor
    project_weight: torch.Tensor
    project_bias: torch.Tensor


def _zero_mean_basis(k: int) -> torch.Tensor:
    """(k-1, k) orthonormal rows spanning the subspace of R^k orthogonal to the ones vector."""
    seed = torch.cat(
        [torch.ones(k, 1, dtype=torch.float64), torch.eye(k, dtype=torch.float64)[:, : k - 1]], 1
    )
    q, _ = torch.linalg.qr(seed)
    return q[:, 1:].T.contiguous()


def factorise_embeddings(
    word: torch.Tensor,
    position: torch.Tensor,
    token_type: torch.Tensor,
    ln_weight: torch.Tensor,
    ln_bias: torch.Tensor,
    *,
    token_dim: int,
    weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> FactorisedEmbeddings:
    """Factorise a BERT embedding block ``LN_D(word + position + token_type)`` to width ``token_dim``. The
    student computes ``Linear(LN_k(word' + position' + token_type'))`` with LN_k's gain 1 and bias 0 and the
    same epsilon; see the module docstring for why this is exact at full rank. ``weights`` (one non-negative
    weight per row of each table, e.g. occurrence counts in a text sample) weight the SVD, so frequent tokens
    are approximated best; None weighs rows equally."""
    width = word.shape[1]
    k = token_dim
    if not 2 <= k <= width:
        raise ValueError(f"token_dim must be in [2, {width}], got {k}")
    tables = [t.detach().double().cpu() for t in (word, position, token_type)]
    centred = [t - t.mean(dim=1, keepdim=True) for t in tables]
    if weights is None:
        weights = tuple(torch.ones(len(t), dtype=torch.float64) for t in tables)
    if [len(w) for w in weights] != [len(t) for t in tables]:
        raise ValueError("one weight per table row is needed")
    # Right singular vectors of the (weighted) stacked rows, from the D x D Gram matrix.
    gram = sum((c * w.double().cpu()[:, None]).T @ c for c, w in zip(centred, weights, strict=True))
    _, vectors = torch.linalg.eigh(gram)
    basis = vectors[:, -(k - 1) :].flip(1).T  # (k-1, D), strongest direction first, rows sum to ~0
    rotate = _zero_mean_basis(k)  # (k-1, k)
    scale = math.sqrt(k / width)  # matches LN_k's variance to LN_D's: ||z||^2 / k = ||x_c||^2 / D
    compact = [scale * (c @ basis.T) @ rotate for c in centred]
    gain, bias = ln_weight.detach().double().cpu(), ln_bias.detach().double().cpu()
    project = (rotate.T @ basis) * gain[None, :] / scale  # (k, D): z -> x_c, then the teacher's gain
    return FactorisedEmbeddings(*(c.float() for c in compact), project.T.contiguous().float(), bias.float())


def token_weights(
    tokenizer: Any, config: Any, texts: list[str], max_seq_len: int = 128, batch: int = 1000
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Occurrence counts + 1 of every word, position and token-type row over tokenised ``texts``:
    weighting the factorisation by them approximates the tokens a corpus uses best."""
    sizes = (config.vocab_size, config.max_position_embeddings, config.type_vocab_size)
    words, positions, types = (torch.ones(size, dtype=torch.float64) for size in sizes)
    for lo in range(0, len(texts), batch):
        enc = tokenizer(texts[lo : lo + batch], truncation=True, max_length=max_seq_len)
        ids = [torch.tensor(row) for row in enc["input_ids"]]
        words += torch.bincount(torch.cat(ids), minlength=len(words)).double()
        positions += torch.bincount(torch.cat([torch.arange(len(r)) for r in ids]), minlength=len(positions))
        if "token_type_ids" in enc:
            flat = torch.tensor([t for row in enc["token_type_ids"] for t in row])
            types += torch.bincount(flat, minlength=len(types)).double()
    return words, positions, types


# What the ELECTRA host copies of the source's BERT config (the rest: the compact width and depth).
COPIED_CONFIG = (
    "vocab_size", "hidden_size", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
    "layer_norm_eps", "pad_token_id",
)  # fmt: skip


def simtde_encoder(
    teacher: nn.Module,
    layers: int,
    token_dim: int,
    weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> nn.Module:
    """An ``ElectraModel``: factorised teacher embeddings + copies of the teacher's last ``layers``.
    ``teacher`` is a Hugging Face ``BertModel`` (e.g. ``SentenceTransformer(...)[0].auto_model``); ``weights``
    as in :func:`factorise_embeddings`."""
    from transformers import ElectraConfig, ElectraModel

    if getattr(teacher.config, "model_type", None) != "bert":
        raise UserError(
            f"SimTDE needs a BERT-family source to copy layers from, got {teacher.config.model_type!r}"
        )
    total, width = teacher.config.num_hidden_layers, teacher.config.hidden_size
    if not 1 <= layers <= total:
        raise UserError(f"--layers {layers} out of range for a {total}-layer teacher")
    if not 2 <= token_dim < width:
        raise UserError(f"token embedding width {token_dim} must be below the hidden size {width}")
    emb = teacher.embeddings
    tables = (emb.word_embeddings.weight, emb.position_embeddings.weight, emb.token_type_embeddings.weight)
    factors = factorise_embeddings(
        *tables, emb.LayerNorm.weight, emb.LayerNorm.bias, token_dim=token_dim, weights=weights
    )
    copied = {name: getattr(teacher.config, name) for name in COPIED_CONFIG}
    position = getattr(teacher.config, "position_embedding_type", "absolute")
    config = ElectraConfig(
        **copied, embedding_size=token_dim, num_hidden_layers=layers, position_embedding_type=position
    )
    student = ElectraModel(config)
    state = student.state_dict()
    state["embeddings.word_embeddings.weight"] = factors.word
    state["embeddings.position_embeddings.weight"] = factors.position
    state["embeddings.token_type_embeddings.weight"] = factors.token_type
    state["embeddings.LayerNorm.weight"] = torch.ones(token_dim)
    state["embeddings.LayerNorm.bias"] = torch.zeros(token_dim)
    state["embeddings_project.weight"] = factors.project_weight
    state["embeddings_project.bias"] = factors.project_bias
    first = total - layers
    for name, value in teacher.state_dict().items():
        if name.startswith("encoder.layer."):
            index = int(name.split(".")[2])
            if index >= first:
                target = name.replace(f"encoder.layer.{index}.", f"encoder.layer.{index - first}.", 1)
                if target not in state:
                    raise UserError(f"teacher parameter {name} has no place in the student")
                state[target] = value.detach().clone()
    student.load_state_dict(state)
    return student


def _load_source(source: str, **options: Any) -> Any:
    try:
        return models.Transformer(resolve_model(source), **options)
    except OSError as exc:
        raise UserError(f"cannot load SimTDE source {source!r}: {first_line(exc)}") from exc


def build_simtde_student(
    source: str = "all-MiniLM-L6-v2",
    *,
    layers: int = 3,
    token_dim: int = 128,
    dim: int = 128,
    max_seq_len: int = 128,
    device: str = "cpu",
    sample_texts: list[str] | None = None,
) -> SentenceTransformer:
    """Transformer(ELECTRA: token_dim embeddings, last ``layers`` of ``source``) -> mean Pooling ->
    Dense(hidden, dim) -> Normalize. ``source`` is a BERT sentence-transformers or HF folder/name, whose
    tokenizer the student reuses unchanged (so student and source tokenise identically). ``sample_texts`` (say
    20k training sentences) weight the embedding factorisation by token frequency (:func:`token_weights`)."""
    source_module = _load_source(source, max_seq_length=max_seq_len)
    auto_model = source_module.auto_model
    weights = None
    if sample_texts:
        weights = token_weights(source_module.tokenizer, auto_model.config, sample_texts, max_seq_len)
    encoder = simtde_encoder(auto_model, layers, token_dim, weights)
    hidden = encoder.config.hidden_size
    if not 1 <= dim < hidden:
        raise UserError(f"projection dim {dim} must be in [1, {hidden})")
    with tempfile.TemporaryDirectory(prefix="simtde-") as tmp:
        encoder.save_pretrained(tmp)
        source_module.tokenizer.save_pretrained(tmp)
        transformer = models.Transformer(tmp, max_seq_length=max_seq_len)
    modules = [
        transformer,
        models.Pooling(hidden, pooling_mode="mean"),
        linear_head(hidden, dim),
        models.Normalize(),
    ]
    return SentenceTransformer(modules=modules, device=device)


def simtde_forward(
    student: SentenceTransformer, features: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One encoder pass of the student on tokenised ``features``. Returns ``(token_embeddings, sentence)``:
    token_embeddings (B, L, hidden) is eq. 2's ``Proj(Emb_S(I))``, the projected embedding block that
    enters the first layer; sentence (B, dim) is the pipeline's output before Normalize (mean pooling, then
    Dense)."""
    modules = list(student)
    out = modules[0].auto_model(**encoder_inputs(features), output_hidden_states=True, return_dict=True)
    pipeline = {"token_embeddings": out.last_hidden_state, "attention_mask": features["attention_mask"]}
    for module in modules[1:]:
        if type(module).__name__ == "Normalize":
            break
        pipeline = module(pipeline)
    return out.hidden_states[0], pipeline["sentence_embedding"]


def teacher_token_embedder(source: str = "all-MiniLM-L6-v2", device: str = "cpu") -> nn.Module:
    """The frozen embedding block of ``source`` (eval mode, no gradients): eq. 1's ``Emb_T``. Only the tables
    and LayerNorm are kept (about 12M numbers for MiniLM), so computing the teacher's token embeddings on the
    fly costs a lookup per token and no encoder pass."""
    embeddings = _load_source(source).auto_model.embeddings.to(device).eval()
    embeddings.requires_grad_(False)
    return embeddings


def teacher_token_embeddings(embedder: nn.Module, features: dict[str, torch.Tensor]) -> torch.Tensor:
    """Eq. 1's ``TokenEmb_T``: (B, L, hidden) for the same tokenised batch the student saw. Student and source
    share the tokenizer, so positions align token for token; the width already equals the student's encoder
    width (no mapping needed)."""
    kwargs = {k: features[k] for k in ("input_ids", "token_type_ids") if k in features}
    with torch.no_grad():
        return embedder(**kwargs)

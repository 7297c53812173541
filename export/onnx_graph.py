"""Export a whole sentence-transformers pipeline as one ONNX graph.

Transformer -> Pooling (mean or cls) -> Dense* -> Normalize? run inside the graph, with dynamic
batch and sequence axes and one output, ``sentence_embedding``. sentence-transformers' own ONNX
export stops at the token embeddings (its issue #3258); serving then re-implements pooling.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import torch
from torch import Tensor, nn

from distilembed.errors import UserError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from transformers import PreTrainedModel, PreTrainedTokenizerFast


class TransformerModule(Protocol):
    """What the export reads of sentence-transformers' ``Transformer`` module, found by its class
    name (the class moved between 5.x releases): the bundle needs a fast tokenizer and a length."""

    auto_model: PreTrainedModel
    tokenizer: PreTrainedTokenizerFast
    max_seq_length: int


class DenseModule(Protocol):
    """sentence-transformers' ``Dense`` (torch types a submodule attribute as Tensor | Module)."""

    linear: nn.Linear
    activation_function: Callable[[Tensor], Tensor]


log = logging.getLogger(__name__)
OPSET = 17
OUTPUT = "sentence_embedding"


@dataclass(frozen=True)
class PipelineInfo:
    dim: int
    max_seq_len: int
    pooling: str
    normalized: bool
    input_names: tuple[str, ...]


class SentenceEmbeddingGraph(nn.Module):
    """Token ids -> pooled, projected, optionally normalised sentence embedding."""

    def __init__(self, auto_model: nn.Module, pooling: str, dense: list[nn.Module], normalize: bool) -> None:
        super().__init__()
        self.auto_model, self.pooling, self.normalize = auto_model, pooling, normalize
        self.dense = nn.ModuleList(dense)
        self.uses_token_types = "token_type_ids" in inspect.signature(auto_model.forward).parameters

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> Tensor:
        use_types = self.uses_token_types and token_type_ids is not None
        extra = {"token_type_ids": token_type_ids} if use_types else {}
        tokens = self.auto_model(input_ids=input_ids, attention_mask=attention_mask, **extra)[0]
        if self.pooling == "cls":
            pooled = tokens[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        for module in self.dense:
            layer = cast("DenseModule", module)
            pooled = layer.activation_function(layer.linear(pooled))
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
        return pooled


def _pooling_mode(pooling: object) -> str:
    """The pooling mode across sentence-transformers versions (5.7 keeps it in ``pooling_mode``)."""
    mode = getattr(pooling, "pooling_mode", None)
    if mode is None and hasattr(pooling, "get_pooling_mode_str"):
        mode = pooling.get_pooling_mode_str()
    if not isinstance(mode, str):
        raise UserError(f"cannot read the pooling mode of {type(pooling).__name__}")
    return mode


def build_graph(model: SentenceTransformer) -> tuple[SentenceEmbeddingGraph, PipelineInfo]:
    """Map a SentenceTransformer's modules onto one exportable module."""
    modules = list(model)
    kinds = [type(m).__name__ for m in modules]
    if not kinds or kinds[0] != "Transformer" or "Pooling" not in kinds:
        raise UserError(f"cannot export pipeline {kinds}: need Transformer, Pooling, [Dense], [Normalize]")
    transformer, pooling = cast("TransformerModule", modules[0]), modules[kinds.index("Pooling")]
    mode = _pooling_mode(pooling)
    if mode not in {"mean", "cls"}:
        raise UserError(f"pooling mode {mode!r} is not supported for export (mean or cls)")
    if extra := [k for k in kinds[2:] if k not in {"Dense", "Normalize"}]:
        raise UserError(f"cannot export modules {extra} after pooling")
    if getattr(transformer.tokenizer, "backend_tokenizer", None) is None:
        raise UserError("cannot export a model without a fast tokenizer (the bundle stores tokenizer.json)")
    if not transformer.max_seq_length:
        raise UserError("cannot export a model without max_seq_length: set it on the Transformer module")
    dense = [m for m in modules if type(m).__name__ == "Dense"]
    auto_model = transformer.auto_model
    if hasattr(auto_model, "set_attn_implementation"):
        auto_model.set_attn_implementation("eager")  # sdpa traces shape constants into the graph
    else:
        auto_model.config._attn_implementation = "eager"
    graph = SentenceEmbeddingGraph(auto_model, mode, dense, normalize="Normalize" in kinds).eval()
    dim = cast("DenseModule", dense[-1]).linear.out_features if dense else auto_model.config.hidden_size
    names = ("input_ids", "attention_mask", "token_type_ids")[: 3 if graph.uses_token_types else 2]
    info = PipelineInfo(int(dim), int(transformer.max_seq_length), mode, "Normalize" in kinds, names)
    return graph, info


def export_onnx(model: SentenceTransformer, path: Path) -> PipelineInfo:
    """Write the fp32 graph of a SentenceTransformer to ``path``."""
    graph, info = build_graph(model)
    example = model.tokenize(["a short example sentence .", "and a second one , longer than the first ."])
    args = tuple(example[name] for name in info.input_names)
    axes = {name: {0: "batch", 1: "sequence"} for name in info.input_names} | {OUTPUT: {0: "batch"}}
    with torch.no_grad():
        torch.onnx.export(
            graph.cpu(),
            args,
            str(path),
            input_names=list(info.input_names),
            output_names=[OUTPUT],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )
    log.info("exported %s (%s, dim %d)", path, info.pooling, info.dim)
    return info

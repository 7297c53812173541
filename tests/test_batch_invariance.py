"""Static int8 activations: a text's vector is a function of its text, not of its batch."""

from pathlib import Path

import numpy as np
import onnx
import pytest

from export.runtime import MODEL_FILES, Encoder
from export.static_int8 import DYNAMIC_OP, scale_and_zero_point
from index.build import BuildConfig, build
from index.corpus import CorpusSpec
from index.live import LiveIndex
from tests.tiny_models import tiny_sentences

DEFAULT = Path("models/default")
needs_default = pytest.mark.skipif(
    not (DEFAULT / "manifest.json").is_file(), reason="models/default not present"
)


def mixed_lengths(n: int = 32) -> list[str]:
    """``n`` texts from one word to past the bundle's 128 tokens, shuffled."""
    words = ("the quick brown fox jumps over a lazy dog near river banks at dawn " * 12).split(" ")[:-1]
    texts = [" ".join(words[: 1 + (i * 37) % 160]) for i in range(n)]
    return [texts[i] for i in np.random.default_rng(3).permutation(n)]


def test_scale_and_zero_point_by_hand() -> None:
    scale, zero = scale_and_zero_point(-1.0, 3.0)  # 4 / 255 = 0.0156863; 1 / 0.0156863 = 63.75 -> 64
    assert scale == np.float32(4.0 / 255.0) and zero == 64
    scale, zero = scale_and_zero_point(-2.0, -1.0)  # widened to [-2, 0]: zero at the top of the range
    assert scale == np.float32(2.0 / 255.0) and zero == 255
    scale, zero = scale_and_zero_point(0.5, 2.0)  # widened to [0, 2]
    assert scale == np.float32(2.0 / 255.0) and zero == 0
    assert scale_and_zero_point(0.0, 0.0) == (np.float32(1.0), 0)  # a tensor that is always 0


def assert_batch_invariant(encoder: Encoder, texts: list[str]) -> None:
    alone = np.stack([encoder.encode([text])[0] for text in texts])
    for batched in (
        encoder.encode(texts),
        encoder.encode(texts[::-1])[::-1],
        encoder.encode(texts, batch_size=5),
    ):
        assert np.array_equal(alone, batched)


def test_exported_int8_graph_has_static_scales(tiny_bundle: Path) -> None:
    model = onnx.load(str(tiny_bundle / MODEL_FILES["int8"]))
    ops = {node.op_type for node in model.graph.node}
    assert DYNAMIC_OP not in ops and {"QuantizeLinear", "MatMulIntegerToFloat"} <= ops
    encoder = Encoder(tiny_bundle)
    assert encoder.manifest["int8_activations"]["scheme"] == "static"
    assert_batch_invariant(encoder, tiny_sentences(24, seed=8))


@needs_default
def test_default_bundle_vector_is_the_same_alone_and_in_a_batch_of_32() -> None:
    encoder = Encoder(DEFAULT)
    texts = mixed_lengths(32)
    assert len({len(ids) for ids in encoder.tokenize(texts)}) > 20  # really mixed lengths, some truncated
    assert_batch_invariant(encoder, texts)


@needs_default
def test_index_builds_with_other_splits_hold_identical_vectors(tmp_path: Path) -> None:
    texts = mixed_lengths(40)
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("id\ttext\n" + "".join(f"d{i}\t{t}\n" for i, t in enumerate(texts)))
    results = []
    for lines in (3, 40):
        out = tmp_path / f"idx-{lines}"
        build(BuildConfig(bundle=str(DEFAULT), out=str(out), shard_size=lines), CorpusSpec(corpus))
        index = LiveIndex(out)
        queries = Encoder(DEFAULT).encode(texts[:4])
        results.append([[(hit.id, hit.score) for hit in row] for row in index.search(queries, k=40)])
        index.close()
    assert results[0] == results[1]

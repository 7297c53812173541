"""bench/encode.py batch-invariance on the tiny exported bundle: the shipped dynamic int8 graph's
move with their batch-mates, the calibrated static graph's and fp32's do not (decision 47)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from encode import alone_vs_batched, static_int8

from export.runtime import Encoder
from tests.tiny_models import tiny_sentences


def test_static_int8_is_batch_invariant_where_dynamic_is_not(tiny_bundle: Path, tmp_path: Path) -> None:
    texts = tiny_sentences(24, seed=5)
    dynamic = Encoder(tiny_bundle, "int8")
    static_int8(tiny_bundle, tmp_path, tiny_sentences(64, seed=6), dynamic)
    static = Encoder(tmp_path, "int8", verify=False)
    fp32 = Encoder(tiny_bundle, "fp32")
    assert 1 - alone_vs_batched(dynamic, texts).min() > 1e-5  # 5e-5 on this tiny model, 1.4e-2 on a real one
    np.testing.assert_allclose(alone_vs_batched(static, texts), 1.0, atol=1e-6)
    np.testing.assert_allclose(alone_vs_batched(fp32, texts), 1.0, atol=1e-6)
    assert static.encode(texts).shape == (24, dynamic.dim)

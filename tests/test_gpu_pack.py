"""scripts/gpu_pack.py's int8-per-row weights: what travels to a lent GPU machine instead of the
float32 teacher (decision 38)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

_SPEC = importlib.util.spec_from_file_location(
    "gpu_pack", Path(__file__).resolve().parents[1] / "scripts" / "gpu_pack.py"
)
assert _SPEC is not None and _SPEC.loader is not None
gpu_pack = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gpu_pack)


def test_matrices_travel_as_int8_with_a_scale_per_row() -> None:
    rows = np.tile(np.array([[127.0], [-2.54], [0.0]], dtype=np.float32), (1, 2048))
    rows[0, 1] = 63.5  # half of the row's absmax
    packed = gpu_pack.quantize_rows({"w": rows, "bias": np.ones(3, dtype=np.float32)})
    assert packed["w"].dtype == np.int8
    assert packed["w"][:, 0].tolist() == [127, -127, 0]
    assert packed["w"][0, 1] == 64  # np.rint rounds half to even: 63.5 -> 64
    assert packed["w" + gpu_pack.SCALE][:, 0].tolist() == [1.0, np.float32(2.54 / 127), 1.0]
    assert packed["bias"].dtype == np.float32  # small and 1-D: unchanged


def test_dequantised_weights_are_within_half_a_step_of_the_original() -> None:
    weights = np.random.default_rng(0).normal(size=(64, 128)).astype(np.float32)
    packed = gpu_pack.quantize_rows({"w": weights})
    restored = gpu_pack.dequantize_rows(packed)
    assert set(restored) == {"w"}
    step = np.abs(weights).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(restored["w"] - weights) <= step / 2 + 1e-6)

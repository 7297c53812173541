from pathlib import Path

import numpy as np
import pytest

from distilembed.errors import UserError
from tests.tiny_models import tiny_sentences
from training.teacher_targets import Teacher


def test_onnx_backend_matches_torch_and_is_exported_once(tiny_teacher: Path) -> None:
    texts = tiny_sentences(40, seed=7)
    onnx = Teacher(str(tiny_teacher), backend="onnx", chunk=16)
    fast, info = onnx.targets(texts)
    assert info["backend"] == "onnx"
    slow, torch_info = Teacher(str(tiny_teacher), backend="torch", chunk=16).targets(list(reversed(texts)))
    assert torch_info["backend"] == "torch"
    cos = np.sum(fast.astype(np.float32) * slow[::-1].astype(np.float32), axis=1)
    assert cos.min() > 0.999  # float16 storage bounds the agreement
    exported = list((Path(info["cache_dir"]).parents[1] / "teachers-onnx").iterdir())
    assert len(exported) == 1
    again = Teacher(str(tiny_teacher), backend="auto", chunk=16)
    assert again.targets(texts)[1]["backend"] == "cached"
    assert again.use_onnx(texts)
    assert again._onnx is not None and again._onnx.bundle == exported[0]


def test_unknown_backend_is_a_user_error(tiny_teacher: Path) -> None:
    with pytest.raises(UserError, match="unknown teacher backend"):
        Teacher(str(tiny_teacher), backend="tensorrt")

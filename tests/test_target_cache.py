import numpy as np
import pytest

from training.teacher_targets import CacheKey, TargetCache


class KilledError(Exception):
    pass


def _encoder(calls: list[int], die_after: int | None = None):
    def encode(rows: list[str]) -> np.ndarray:
        if die_after is not None and len(calls) == die_after:
            raise KilledError
        calls.append(len(rows))
        return np.array([[len(r), r.count("a"), 1.0] for r in rows], dtype=np.float32)

    return encode


def test_interrupted_fill_resumes_without_reencoding(tmp_path) -> None:
    texts = [f"sentence {'a' * (i % 7)} {i}" for i in range(10)]
    key = CacheKey("teacher", "corpus", 64)
    first: list[int] = []
    with pytest.raises(KilledError):
        TargetCache(key, n=10, dim=3, chunk=4, root=tmp_path).fill(texts, _encoder(first, die_after=2))
    assert first == [4, 4]  # two chunks done before the "kill"

    second: list[int] = []
    cache = TargetCache(key, n=10, dim=3, chunk=4, root=tmp_path)
    assert cache.done_rows() == 8
    out = cache.fill(texts, _encoder(second))
    assert second == [2]  # only the last chunk is encoded again
    expected = np.array([[len(t), t.count("a"), 1.0] for t in texts], dtype=np.float16)
    np.testing.assert_array_equal(out, expected)
    assert cache.complete


def test_settings_mismatch_is_refused(tmp_path) -> None:
    key = CacheKey("teacher", "corpus", 64)
    TargetCache(key, n=10, dim=3, chunk=4, root=tmp_path)
    with pytest.raises(RuntimeError, match="other settings"):
        TargetCache(key, n=10, dim=5, chunk=4, root=tmp_path)


def test_key_depends_on_every_part() -> None:
    base = CacheKey("t", "c", 128).digest()
    assert base != CacheKey("t2", "c", 128).digest()
    assert base != CacheKey("t", "c2", 128).digest()
    assert base != CacheKey("t", "c", 256).digest()

"""``encoding_format`` (float, base64, int8, uint8, binary, ubinary) on ``/v1/embeddings`` and ``/embed``,
the quantisation functions of export/quantize.py, and ``distilembed export calibrate``."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import typing
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from export.quantize import (
    CALIBRATED,
    ENCODINGS,
    calibration_ranges,
    int8_ranges,
    pack_base64,
    prefix,
    quantize,
    unpack_base64,
)
from service.app import create_app
from service.schemas import EncodingFormat
from service.settings import Settings
from service.testing import FakeEncoder
from tests.tiny_models import tiny_sentences

ROOT = Path(__file__).resolve().parents[1]
DIM, WIDTHS = 16, [16, 8]  # the fake bundle's width and its calibrated (trained) widths
TEXTS = ["a cat sat on the mat", "dogs bark loudly at night", "the stock market fell"]
CALIBRATION_TEXTS = tiny_sentences(200, seed=7)
PLAIN = ["float", "base64", "binary", "ubinary"]  # served without calibration ranges

pytestmark = pytest.mark.usefixtures("clean_service_env")


def calibrated_encoder(widths: list[int] = WIDTHS) -> FakeEncoder:
    encoder = FakeEncoder(dim=DIM)
    encoder.manifest["trained_widths"] = widths
    encoder.manifest["quantization"] = {
        "int8_ranges": calibration_ranges(FakeEncoder(dim=DIM).encode(CALIBRATION_TEXTS), widths),
        "calibration": {"source": "tiny sentences", "texts": len(CALIBRATION_TEXTS)},
    }
    return encoder


@pytest.fixture
def client(make_client) -> TestClient:
    return make_client(calibrated_encoder())


def openai(client: TestClient, encoding: str, dimensions: int | None = None, texts=TEXTS) -> list:
    body = {"input": texts, "encoding_format": encoding}
    if dimensions is not None:
        body["dimensions"] = dimensions
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code == 200, r.text
    return [d["embedding"] for d in r.json()["data"]]


def tei(client: TestClient, encoding: str, texts=TEXTS) -> list:
    r = client.post("/embed", json={"inputs": texts, "encoding_format": encoding})
    assert r.status_code == 200, r.text
    return r.json()


def unprocessable(response, *fragments: str) -> str:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["type"] == "validation_error" and "\n" not in body["error"]
    for fragment in fragments:
        assert fragment in body["error"]
    return body["error"]


# ---- the functions, by hand


def test_schema_literal_lists_every_encoding():
    assert typing.get_args(EncodingFormat) == ENCODINGS
    assert [e for e in ENCODINGS if e not in CALIBRATED] == PLAIN


def test_int8_and_uint8_by_hand():
    # starts (0, -255), steps ((255 - 0) / 255, (255 + 255) / 255) = (1, 2): exact in binary
    ranges = np.array([[0.0, -255.0], [255.0, 255.0]])
    x = np.array([[0.0, -255.0], [255.0, 255.0], [100.7, 0.0], [300.0, -300.0], [-5.0, 1.0]])
    uint8 = quantize(x, "uint8", ranges)
    int8 = quantize(x, "int8", ranges)
    assert uint8.dtype == np.uint8 and int8.dtype == np.int8
    # 100.7 -> 100 (truncated as astype does); (0 + 255) / 2 = 127.5 -> 127, int8 -0.5 -> 0;
    # 300 and -300 are outside the ranges: they saturate instead of wrapping
    assert uint8.tolist() == [[0, 0], [255, 255], [100, 127], [255, 0], [0, 128]]
    assert int8.tolist() == [[-128, -128], [127, 127], [-27, 0], [127, -128], [-128, 0]]
    # in range, exactly sentence-transformers' formula
    inside = x[:3]
    starts, steps = ranges[0], (ranges[1] - ranges[0]) / 255
    scaled = (inside - starts) / steps
    np.testing.assert_array_equal(quantize(inside, "int8", ranges), (scaled - 128).astype(np.int8))
    np.testing.assert_array_equal(quantize(inside, "uint8", ranges), scaled.astype(np.uint8))


def test_binary_by_hand():
    x = np.array([[0.5, -0.5], [-1.0, 2.0], [0.0, 0.0]])
    # sign bits, most significant first: 10000000 = 128, 01000000 = 64, 0 (zero is not > 0)
    assert quantize(x, "ubinary").tolist() == [[128], [64], [0]]
    assert quantize(x, "binary").tolist() == [[0], [-64], [-128]]
    wide = np.array([[1.0] * 9, [-1.0] * 8 + [1.0]])
    assert quantize(wide, "ubinary").tolist() == [[255, 128], [0, 128]]  # ceil(9 / 8) = 2 bytes
    assert quantize(wide, "binary").dtype == np.int8
    vector = np.array([0.25, -1.5, 3.0], dtype=np.float32)
    np.testing.assert_array_equal(unpack_base64(pack_base64(vector)), vector)


def test_quantize_refuses_bad_input():
    x = np.ones((2, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="unknown encoding"):
        quantize(x, "float16")
    with pytest.raises(ValueError, match="needs calibration ranges"):
        quantize(x, "int8")
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        quantize(x, "int8", np.zeros((2, 4)))
    constant = quantize(x, "uint8", np.ones((2, 3)))  # a zero-width range: no 0/0
    assert constant.tolist() == [[0, 0, 0], [0, 0, 0]]


def test_calibration_ranges_per_width():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((50, 6)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ranges = calibration_ranges(vectors, [6, 3])
    assert list(ranges) == ["6", "3"]
    np.testing.assert_array_equal(np.float32(ranges["6"][0]), vectors.min(axis=0))
    np.testing.assert_array_equal(np.float32(ranges["6"][1]), vectors.max(axis=0))
    cut = vectors[:, :3] / np.linalg.norm(vectors[:, :3], axis=1, keepdims=True)
    np.testing.assert_allclose(ranges["3"], [cut.min(axis=0), cut.max(axis=0)], atol=1e-7)
    np.testing.assert_array_equal(prefix(vectors, 6), vectors)
    manifest = {"quantization": {"int8_ranges": json.loads(json.dumps(ranges))}}  # as a manifest holds them
    assert int8_ranges(manifest, 3).shape == (2, 3) and int8_ranges(manifest, 4) is None
    with pytest.raises(ValueError, match="at least one"):
        calibration_ranges(vectors[:0], [6])


# ---- the routes


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_encoding_on_both_routes(client, encoding):
    floats = np.array(openai(client, "float"), dtype=np.float32)
    ranges = int8_ranges(client.app.state.service.encoder.manifest, DIM)
    for rows in (openai(client, encoding), tei(client, encoding)):
        assert len(rows) == len(TEXTS)
        if encoding == "float":
            np.testing.assert_array_equal(np.array(rows, dtype=np.float32), floats)
        elif encoding == "base64":
            assert all(isinstance(r, str) for r in rows)
            np.testing.assert_array_equal(np.stack([unpack_base64(r) for r in rows]), floats)
        else:
            codes = np.array(rows)
            assert codes.dtype.kind == "i" and all(isinstance(v, int) for v in rows[0])
            low, high = (-128, 127) if encoding in ("int8", "binary") else (0, 255)
            assert codes.min() >= low and codes.max() <= high
            width = math.ceil(DIM / 8) if encoding.endswith("binary") else DIM
            assert codes.shape == (len(TEXTS), width)
            np.testing.assert_array_equal(codes, quantize(floats, encoding, ranges))


def test_binary_unpacks_to_the_sign_bits(client):
    floats = np.array(openai(client, "float"))
    binary = np.array(openai(client, "binary"))
    bits = np.unpackbits((binary + 128).astype(np.uint8), axis=-1)[:, :DIM]
    np.testing.assert_array_equal(bits, (floats > 0).astype(np.uint8))
    ubinary = np.array(tei(client, "ubinary"), dtype=np.uint8)
    np.testing.assert_array_equal(np.unpackbits(ubinary, axis=-1)[:, :DIM], bits)


@pytest.mark.parametrize("width", [8, 12, 3, 1])
def test_dimensions_with_every_encoding(client, width):
    floats = np.array(openai(client, "float", width), dtype=np.float32)
    full = np.array(openai(client, "float"), dtype=np.float32)
    np.testing.assert_allclose(floats, prefix(full, width), atol=1e-6)
    packed = np.array(openai(client, "ubinary", width), dtype=np.uint8)
    assert packed.shape == (len(TEXTS), math.ceil(width / 8))
    np.testing.assert_array_equal(np.unpackbits(packed, axis=-1)[:, :width], floats > 0)
    raw = np.stack([unpack_base64(r) for r in openai(client, "base64", width)])
    np.testing.assert_array_equal(raw, floats)
    for encoding in ("int8", "uint8"):
        body = {"input": TEXTS, "encoding_format": encoding, "dimensions": width}
        if width in WIDTHS:  # calibrated: quantise the cut, re-normalised vector with that width's ranges
            ranges = int8_ranges(client.app.state.service.encoder.manifest, width)
            np.testing.assert_array_equal(
                np.array(openai(client, encoding, width)), quantize(floats, encoding, ranges)
            )
        else:
            unprocessable(
                client.post("/v1/embeddings", json=body),
                f"calibrated at {width} dimensions",
                "widths: 16, 8",
                "distilembed export calibrate --bundle",
            )


def test_a_bundle_without_ranges(make_client):
    client = make_client(FakeEncoder(dim=DIM))
    for route, key in (("/v1/embeddings", "input"), ("/embed", "inputs")):
        for encoding in CALIBRATED:
            message = unprocessable(
                client.post(route, json={key: "a cat", "encoding_format": encoding}), "widths: none"
            )
            assert "distilembed export calibrate" in message
        assert client.post(route, json={key: "a cat", "encoding_format": "binary"}).status_code == 200
    info = client.get("/info").json()
    assert info["int8_widths"] == [] and info["encodings"] == PLAIN


def test_ranges_only_at_a_narrower_width(make_client):
    """Ranges at 8 only: int8 at 8 dimensions is served, at the full width (and on /embed) it is not."""
    encoder = calibrated_encoder([8])
    client = make_client(encoder)
    assert len(openai(client, "int8", 8)[0]) == 8
    unprocessable(client.post("/v1/embeddings", json={"input": "a", "encoding_format": "uint8"}), "widths: 8")
    unprocessable(client.post("/embed", json={"inputs": "a", "encoding_format": "int8"}), "at 16 dimensions")
    info = client.get("/info").json()
    assert info["int8_widths"] == [8] and info["encodings"] == list(ENCODINGS)


def test_bad_values(client):
    for route, key in (("/v1/embeddings", "input"), ("/embed", "inputs")):
        for encoding in ("float16", "INT8", "", None, 8):
            unprocessable(client.post(route, json={key: "a", "encoding_format": encoding}))
    for dimensions in (0, -1, DIM + 1):
        body = {"input": "a", "encoding_format": "binary", "dimensions": dimensions}
        unprocessable(client.post("/v1/embeddings", json=body))


def test_info_and_openapi_describe_the_encodings(make_client, client):
    info = client.get("/info").json()
    assert info["encodings"] == list(ENCODINGS) and info["int8_widths"] == [16, 8]
    models = client.get("/openapi.json").json()["components"]["schemas"]
    openai_request = models["EmbeddingRequest"]
    assert openai_request["properties"]["encoding_format"]["enum"] == list(ENCODINGS)
    assert models["EmbedRequest"]["properties"]["encoding_format"]["enum"] == list(ENCODINGS)
    # int8/uint8 only at the calibrated widths (16 is also the default: no `dimensions`, or null)
    (rule,) = openai_request["allOf"]
    assert rule["if"]["properties"]["encoding_format"]["enum"] == ["int8", "uint8"]
    assert rule["then"] == {"properties": {"dimensions": {"enum": [16, 8, None]}}}
    embedding = models["EmbeddingItem"]["properties"]["embedding"]["anyOf"]
    assert {"type": "string"} in embedding and {"type": "array", "items": {"type": "integer"}} in embedding

    plain = make_client(FakeEncoder(dim=DIM)).get("/openapi.json").json()["components"]["schemas"]
    for name in ("EmbeddingRequest", "EmbedRequest"):
        assert plain[name]["properties"]["encoding_format"]["enum"] == PLAIN
    assert "allOf" not in plain["EmbeddingRequest"]

    narrow = make_client(calibrated_encoder([8])).get("/openapi.json").json()["components"]["schemas"]
    assert narrow["EmbeddingRequest"]["allOf"][0]["then"] == {
        "properties": {"dimensions": {"enum": [8]}},
        "required": ["dimensions"],
    }
    assert "int8" not in narrow["EmbedRequest"]["properties"]["encoding_format"]["enum"]


# ---- the contract on a calibrated bundle (tests/test_contract.py runs one without ranges)

try:
    import schemathesis
except ImportError:  # pragma: no cover - the dev extra has it
    schemathesis = None

if schemathesis is not None:

    def _calibrated_schema(widths: list[int]) -> object:
        settings = Settings(bundle=Path("fake-bundle"), warmup=False, max_items=16, max_chars=200)
        app = create_app(settings, calibrated_encoder(widths))
        loaded = schemathesis.openapi.from_asgi("/openapi.json", app)
        loaded.config.seed = 20261125
        loaded.config.generation.update(max_examples=15)
        for check in ("positive_data_acceptance", "negative_data_rejection"):
            config = getattr(loaded.config.checks, check)
            config.expected_statuses = [*config.expected_statuses, "413"]
        return loaded.include(path_regex="^/(v1/embeddings|embed)$")

    full_schema = _calibrated_schema(WIDTHS)
    narrow_schema = _calibrated_schema([8])

    SENT: Counter[tuple[str, int]] = Counter()

    def _call(case) -> None:
        response = case.call_and_validate()
        body = case.body if isinstance(case.body, dict) else {}
        if body.get("encoding_format") in CALIBRATED:
            SENT[(case.path, response.status_code)] += 1

    @full_schema.parametrize()
    def test_contract_with_ranges(case) -> None:
        _call(case)

    @narrow_schema.parametrize()
    def test_contract_with_ranges_at_a_narrower_width(case) -> None:
        _call(case)

    def test_the_contract_sent_calibrated_encodings() -> None:
        """Runs after the two above (file order): int8/uint8 were served, and refused where not allowed."""
        print(f"\nint8/uint8 requests (path, status): {dict(SENT)}")
        assert SENT[("/v1/embeddings", 200)] >= 3 and SENT[("/embed", 200)] >= 1
        assert SENT[("/v1/embeddings", 422)] >= 1


# ---- calibration of a real (tiny) bundle


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command, environ = [sys.executable, "-m", "distilembed.cli", *args], {**os.environ, **(env or {})}
    return subprocess.run(command, capture_output=True, text=True, env=environ, check=False, timeout=300)


def test_export_calibrate_command(tiny_bundle, tiny_data, tmp_path, make_client):
    from export.runtime import MODEL_FILES, TOKENIZER_FILE, Encoder, verify_bundle
    from training.data.text import read_sentences

    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    result = _cli(
        "export", "calibrate", "--bundle", str(bundle), "--corpus", "corpus.txt",
        "--data-dir", str(tiny_data), "--sentences", "50",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "int8 ranges for widths 8 from 50 texts" in result.stdout
    manifest = json.loads((bundle / "manifest.json").read_text())
    record = manifest["quantization"]
    assert record["calibration"]["source"] == "corpus.txt" and record["calibration"]["texts"] == 50
    assert list(record["int8_ranges"]) == ["8"]
    verify_bundle(bundle, [MODEL_FILES["int8"], MODEL_FILES["fp32"], TOKENIZER_FILE])  # still verifies

    encoder = Encoder(bundle, "int8", threads=1)
    expected = calibration_ranges(encoder.encode(read_sentences(tiny_data / "corpus.txt", limit=50)), [8])
    np.testing.assert_allclose(record["int8_ranges"]["8"], expected["8"], atol=1e-6)
    client = make_client(encoder)
    codes = np.array(tei(client, "int8"))
    assert codes.shape == (len(TEXTS), 8) and codes.min() >= -128 and codes.max() <= 127
    assert client.get("/info").json()["int8_widths"] == [8]

    missing = _cli("export", "calibrate", "--bundle", str(bundle), "--corpus", str(tmp_path / "none.txt"))
    assert missing.returncode == 2 and "corpus not found" in missing.stderr
    assert "Traceback" not in missing.stderr

    args = (
        "export",
        "calibrate",
        "--bundle",
        str(bundle),
        "--corpus",
        "corpus.txt",
        "--data-dir",
        str(tiny_data),
    )
    more = _cli(*args, "--sentences", "50", "--widths", "3,6")  # beside the trained width, never instead
    assert more.returncode == 0, more.stderr
    assert client.get("/info").json()["int8_widths"] == [8]  # this client's encoder read the old manifest
    ranges = json.loads((bundle / "manifest.json").read_text())["quantization"]["int8_ranges"]
    assert list(ranges) == ["8", "6", "3"] and ranges["6"] == expected_at(encoder, tiny_data, 6)
    for bad, message in (("9", "within 1..8"), ("x", "--widths takes comma-separated ints")):
        refused = _cli(*args, "--widths", bad)
        assert refused.returncode == 2 and message in refused.stderr and "Traceback" not in refused.stderr


def expected_at(encoder: object, data: Path, width: int) -> list[list[float]]:
    from training.data.text import read_sentences

    vectors = encoder.encode(read_sentences(data / "corpus.txt", limit=50))  # type: ignore[attr-defined]
    return calibration_ranges(vectors, [width])[str(width)]


def test_export_records_ranges_with_a_calibration_corpus(tiny_bert, tiny_data, tmp_path):
    from training.student import build_student

    checkpoint = tmp_path / "student"
    build_student(str(tiny_bert), dim=8, max_seq_len=16).save(str(checkpoint))
    out = tmp_path / "bundle"
    result = _cli(
        "export", "--model", str(checkpoint), "--out", str(out), "--int8-mean-cosine", "0",
        "--int8-max-sts-drop", "100", "--calibration-corpus", "corpus.txt", "--calibration-sentences", "40",
        env={"DISTILEMBED_DATA_DIR": str(tiny_data)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["quantization"]["calibration"]["texts"] == 40
    assert manifest["int8_weights"]["smoothing"]["texts"] == 40  # SmoothQuant reads the same corpus
    assert list(manifest["quantization"]["int8_ranges"]) == [str(w) for w in manifest["trained_widths"]]
    usage = _cli("export")  # no arguments: one line, no traceback
    assert usage.returncode == 2 and "needs --model and --out" in usage.stderr
    assert "Traceback" not in usage.stderr
    shown = _cli("export", "--help", env={"COLUMNS": "200"}).stdout
    assert "--calibration-corpus" in shown and "calibrate" in shown


def test_default_model_is_calibrated_on_wikipedia(make_client):
    from export.runtime import Encoder

    bundle = ROOT / "models" / "default"
    manifest = json.loads((bundle / "manifest.json").read_text())
    if "quantization" not in manifest:
        pytest.skip("models/default has no int8 ranges")
    calibration = manifest["quantization"]["calibration"]
    assert "enwiki" in calibration["source"] and calibration["texts"] == 10_000
    client = make_client(Encoder(bundle, "int8", threads=1))
    codes = np.array(openai(client, "int8"))
    assert codes.shape == (len(TEXTS), 128)
    widths = manifest["trained_widths"]
    assert list(manifest["quantization"]["int8_ranges"]) == [str(w) for w in widths]
    untrained = next(w for w in range(widths[0] - 1, 0, -1) if w not in widths)
    unprocessable(
        client.post(
            "/v1/embeddings", json={"input": "a", "encoding_format": "int8", "dimensions": untrained}
        ),
        "widths: " + ", ".join(map(str, widths)),
    )

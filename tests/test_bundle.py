"""export -> bundle -> runtime encoder, on a tiny randomly initialised model."""

import json
import subprocess
import sys

import numpy as np
import pytest

from export.bundle import ParityGate, build_bundle
from export.runtime import BundleError, Encoder
from tests.tiny_models import tiny_sentences
from training.student import build_student

LOOSE = ParityGate(fp32_min_cosine=0.9999, int8_mean_cosine=0.0)  # a random tiny model quantises badly


@pytest.fixture(scope="module")
def checkpoint(tiny_bert, tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "student"
    build_student(str(tiny_bert), dim=8, max_seq_len=16).save(str(path))
    return path


@pytest.fixture(scope="module")
def bundle(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundles") / "tiny"
    build_bundle(checkpoint, out, parity_texts=tiny_sentences(20), gate=LOOSE)
    return out


def test_bundle_contents_and_manifest(bundle) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["kind"] == "bundle" and manifest["dim"] == 8 and manifest["max_seq_len"] == 16
    assert set(manifest["files"]) == {"model.onnx", "model.int8.onnx", "tokenizer.json"}
    assert manifest["parity"]["fp32_min_cosine"] >= 0.9999
    assert manifest["pooling"] == "mean" and manifest["normalized"] is True
    assert manifest["int8_weights"] == {"per_channel": True, "bits": 8, "smoothing": None}


def test_encoder_matches_pytorch_on_mixed_lengths(bundle, checkpoint) -> None:
    from sentence_transformers import SentenceTransformer

    texts = [*tiny_sentences(9, seed=7), "a", "the man is playing the guitar in the park with a dog ."]
    model = SentenceTransformer(str(checkpoint))
    expected = model.encode(texts, convert_to_numpy=True)
    got = Encoder(bundle, variant="fp32", batch_size=4).encode(texts)
    assert got.dtype == np.float32 and got.shape == (len(texts), 8)
    np.testing.assert_allclose(got, expected, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_progress_bar_counts_every_text_and_changes_nothing(bundle, capsys) -> None:
    texts = tiny_sentences(11, seed=3)
    encoder = Encoder(bundle, variant="fp32", batch_size=4)
    quiet = encoder.encode(texts)
    assert "encode" not in capsys.readouterr().err
    shown = encoder.encode(texts, progress="encode")
    err = capsys.readouterr().err
    assert "encode: 100%" in err and f"{len(texts)}/{len(texts)}" in err
    np.testing.assert_array_equal(shown, quiet)


def test_empty_input_gives_empty_array(bundle) -> None:
    out = Encoder(bundle).encode([])
    assert out.shape == (0, 8) and out.dtype == np.float32


def test_overlong_text_is_truncated(bundle) -> None:
    encoder = Encoder(bundle, variant="fp32")
    long_text = " ".join(["guitar"] * 500)
    assert len(encoder.tokenize([long_text])[0]) == 16
    head = " ".join(["guitar"] * 14)  # 14 words + [CLS] + [SEP] = 16 tokens, the truncated form
    np.testing.assert_allclose(encoder.encode([long_text]), encoder.encode([head]), atol=1e-6)


def test_tampered_file_is_refused(bundle, tmp_path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    with open(copy / "model.int8.onnx", "r+b") as handle:
        handle.seek(200)
        byte = handle.read(1)
        handle.seek(200)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(BundleError, match="does not match its manifest hash"):
        Encoder(copy, variant="int8")
    Encoder(copy, variant="fp32")  # the untouched variant still loads
    (copy / "manifest.json").unlink()
    with pytest.raises(BundleError, match="no manifest"):
        Encoder(copy)


def test_failed_gate_writes_nothing(checkpoint, tmp_path) -> None:
    out = tmp_path / "strict"
    with pytest.raises(BundleError, match="parity gate failed: int8 mean cosine"):
        build_bundle(checkpoint, out, parity_texts=tiny_sentences(10), gate=ParityGate(int8_mean_cosine=1.01))
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".strict")]


def test_runtime_encoder_imports_no_torch(bundle) -> None:
    code = (
        "import sys; from export.runtime import Encoder; "
        f"e = Encoder({str(bundle)!r}); print(e.encode(['a dog .']).shape); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "(1, 8)" in result.stdout


def test_export_cli_writes_bundle_and_refuses_existing(checkpoint, tiny_data, tmp_path, run_cli) -> None:
    import os

    out = tmp_path / "cli-bundle"
    env = {**os.environ, "DISTILEMBED_DATA_DIR": str(tiny_data)}
    args = [
        sys.executable,
        "-m",
        "distilembed.cli",
        "export",
        "--model",
        str(checkpoint),
        "--out",
        str(out),
        "--int8-mean-cosine",
        "0",
        "--int8-max-sts-drop",
        "100",
    ]
    first = subprocess.run(args, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert first.returncode == 0, first.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert {"stsb_test_pytorch", "stsb_test_fp32", "stsb_test_int8"} <= set(manifest["parity"])
    smoothing = manifest["int8_weights"]["smoothing"]  # calibrated on STS-B train's 80 sentences
    assert smoothing["texts"] == 80 and smoothing["alpha"] == 0.9
    assert manifest["parity"]["stsb_test_fp32"] == pytest.approx(
        manifest["parity"]["stsb_test_pytorch"], abs=0.05
    )
    again = run_cli(*args[3:], env={"DISTILEMBED_DATA_DIR": str(tiny_data)})  # the refusal, in-process
    assert again.returncode == 2 and "output exists" in again.stderr and "Traceback" not in again.stderr


def test_split_runs_cuts_where_padding_costs_more_than_a_run() -> None:
    from export.runtime import split_runs

    # one run: 16 + 4 x 40 = 176 padded-token units; two runs: (16 + 3 x 3) + (16 + 40) = 81
    assert split_runs(np.array([3, 3, 3, 40]), 32, 16.0) == [(0, 3), (3, 4)]
    assert split_runs(np.array([5, 5, 6, 6]), 32, 16.0) == [(0, 4)]  # too little padding to save
    assert split_runs(np.array([7] * 10), 4, 16.0) == [(0, 2), (2, 6), (6, 10)]  # at most 4 rows
    assert split_runs(np.array([], dtype=np.int64), 4, 16.0) == []


def test_trained_widths_come_from_the_checkpoint_manifest(tmp_path) -> None:
    from export.bundle import trained_widths

    assert trained_widths(tmp_path, 128) == [128]  # no training manifest: the full width only
    (tmp_path / "manifest.json").write_text(json.dumps({"matryoshka": {"widths": [128, 64, 32]}}))
    assert trained_widths(tmp_path, 128) == [128, 64, 32]


def test_calibrating_a_bundle_keeps_its_identity(tmp_path) -> None:
    """An index records the bundle it was built with; adding int8 ranges changes no vector, so it
    must not change that identity (or every index built before would be refused)."""
    from distilembed.artifacts import atomic_write_json, sha256_file
    from export.runtime import bundle_identity

    manifest = {"kind": "bundle", "dim": 4, "files": {"model.onnx": "ab"}}
    atomic_write_json(tmp_path / "manifest.json", manifest)
    before = bundle_identity(tmp_path)
    assert before == sha256_file(tmp_path / "manifest.json")
    atomic_write_json(tmp_path / "manifest.json", manifest | {"quantization": {"int8_ranges": {}}})
    assert bundle_identity(tmp_path) == before
    atomic_write_json(tmp_path / "manifest.json", manifest | {"dim": 8})
    assert bundle_identity(tmp_path) != before
    assert bundle_identity(tmp_path / "missing") is None


@pytest.mark.parametrize(("reduce_range", "bound"), [(False, 127), (True, 64)])
def test_reduce_range_quantises_weights_to_7_bits(bundle, tmp_path, reduce_range, bound) -> None:
    import onnx
    from onnx import numpy_helper

    from export.bundle import quantize_graph

    out = tmp_path / "model.int8.onnx"
    quantize_graph(bundle / "model.onnx", out, reduce_range=reduce_range)
    graph = onnx.load(str(out)).graph
    weights = [numpy_helper.to_array(t) for t in graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert weights and max(int(abs(w.astype(int)).max()) for w in weights) == bound

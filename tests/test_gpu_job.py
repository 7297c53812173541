"""scripts/gpu_job.py: the int8-per-row weights that travel instead of the float32 teacher, and a
pack carried in two folders, staged, unpacked and run detached, its results collected."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_job.py"
_SPEC = importlib.util.spec_from_file_location("gpu_job", SCRIPT)
assert _SPEC is not None and _SPEC.loader is not None
gpu_job = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gpu_job)


def test_matrices_travel_as_int8_with_a_scale_per_row() -> None:
    rows = np.tile(np.array([[127.0], [-2.54], [0.0]], dtype=np.float32), (1, 2048))
    rows[0, 1] = 63.5  # half of the row's absmax
    packed = gpu_job.quantize_rows({"w": rows, "bias": np.ones(3, dtype=np.float32)})
    assert packed["w"].dtype == np.int8
    assert packed["w"][:, 0].tolist() == [127, -127, 0]
    assert packed["w"][0, 1] == 64  # np.rint rounds half to even: 63.5 -> 64
    assert packed["w" + gpu_job.SCALE][:, 0].tolist() == [1.0, np.float32(2.54 / 127), 1.0]
    assert packed["bias"].dtype == np.float32  # small and 1-D: unchanged


def test_dequantised_weights_are_within_half_a_step_of_the_original() -> None:
    weights = np.random.default_rng(0).normal(size=(64, 128)).astype(np.float32)
    restored = gpu_job.dequantize_rows(gpu_job.quantize_rows({"w": weights}))
    assert set(restored) == {"w"}
    step = np.abs(weights).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(restored["w"] - weights) <= step / 2 + 1e-6)


def _job(work: Path, *args: str, out: Path | None = None) -> str:
    env = {**os.environ, "OUT": str(out)} if out else {k: v for k, v in os.environ.items() if k != "OUT"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--work", str(work), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def _data(root: Path) -> Path:
    for folder in ("sts/stsbenchmark", "nli", "quora", "unlabeled"):
        (root / folder).mkdir(parents=True)
    (root / "unlabeled" / "c.txt").write_text("one\n\ntwo\nthree\nfour\n")
    (root / "nli" / "t.csv").write_text("sent0,sent1,hard_neg\na,b,c\n")
    (root / "quora" / "noise.bin").write_bytes(np.random.default_rng(0).bytes(1_500_000))  # two parts
    return root


def test_a_pack_in_two_calls_runs_detached_and_comes_back(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    model = tmp_path / "ckpt"
    model.mkdir()
    weights = np.random.default_rng(1).normal(size=(16, 8)).astype(np.float32)
    save_file({"w": weights}, model / "model.safetensors")
    (model / "config.json").write_text("{}")
    pack, work, out = tmp_path / ".gpu", tmp_path / "w", tmp_path / "out"
    _job(work, "pack", "--out", str(pack), "--teacher", "none", "--student", "none", "--model", f"m={model}",
         "--data-dir", str(_data(tmp_path / "data")), "--corpus", "unlabeled/c.txt", "--n-sentences", "3",
         "--no-wheels", "--piece-mib", "1", "--call-mib", "1")  # fmt: skip
    assert sorted(p.name for p in pack.iterdir()) == ["p1", "p2"]
    assert "1 parts" in _job(work, "stage", str(pack / "p1"))
    command = (
        'mkdir -p "$W/runs/a" && cp "$DISTILEMBED_DATA_DIR/unlabeled/c.txt" "$W/runs/a/manifest.json"'
        " && command -v distilembed && echo finished"
    )
    said = _job(work, "run", "--parts", str(pack / "p2"), "--wait", "60", command, out=out)
    assert "exit 0" in said and "finished" in said
    with tarfile.open(out / "collected.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["job.log", "runs/a/manifest.json"]
        manifest = tar.extractfile("runs/a/manifest.json")
        assert manifest is not None and manifest.read() == b"one\ntwo\nthree\n"
    restored = load_file(work / "models" / "m" / "model.safetensors")["w"]
    assert restored.dtype == np.float32 and np.allclose(restored, weights, atol=1e-2)


def test_a_failing_command_ends_the_wait(tmp_path: Path) -> None:
    work, out = tmp_path / "w", tmp_path / "out"
    (work / "data").mkdir(parents=True)  # already unpacked
    said = _job(work, "run", "--wait", "60", "echo 'no such flag' >&2; exit 3", out=out)
    assert "exit 3" in said and "no such flag" in said
    assert "not started" not in _job(work, "collect", out=out)

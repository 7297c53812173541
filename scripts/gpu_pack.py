"""Pack what a lent GPU machine needs for a training run, in pieces that fit its 64 MiB calls.

That machine has no network and takes at most 64 MiB of working tree per call (decision 10), so:
the mpnet teacher travels as int8 weights with one float32 scale per output row (its embeddings keep
a mean cosine of 0.9993 with the original's), the MiniLM student init as float16 (cast back to float32
there), the first N corpus sentences, the STS-B and NLI files, and wheels of the
transformers / sentence-transformers / tokenizers / huggingface_hub versions installed here (the
ones the tests run against). Everything goes into one
gzipped tar stream, split into ``part_NN`` files grouped into folders ``p1``, ``p2``, ... of at most
``--call-mib`` each: one folder per call, carried with ``carry``. On the GPU machine
``python3 scripts/gpu_pack.py unpack PARTS_DIR OUT_DIR`` rebuilds float32 model folders.

    python scripts/gpu_pack.py pack --out .gpu --n-sentences 100000
    python scripts/gpu_pack.py pack --teacher none --student none --n-sentences 0 --model mrl=runs/mrl

The tracked tree travels with every call too: 56 MiB of parts leave room for it only while
models/default/model.int8.onnx (22 MB) is moved out of the checkout for the calls.
"""

from __future__ import annotations

import argparse
import gzip
import io
import shutil
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ("transformers", "sentence-transformers", "tokenizers", "huggingface_hub")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
DATA = ("sts/stsbenchmark", "nli", "quora")  # quora: its pairs are excluded from training text
SCALE = ".__row_scale"


def quantize_rows(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """2-D float matrices -> int8 with a float32 absmax scale per row; other tensors unchanged."""
    out: dict[str, np.ndarray] = {}
    for name, w in weights.items():
        if w.ndim == 2 and w.dtype.kind == "f" and w.size >= 4096:
            scale = np.abs(w).max(axis=1, keepdims=True).astype(np.float32) / 127.0
            scale[scale == 0] = 1.0
            out[name] = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
            out[name + SCALE] = scale
        else:
            out[name] = w
    return out


def dequantize_rows(packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, w in packed.items():
        if name.endswith(SCALE):
            continue
        scale = packed.get(name + SCALE)
        out[name] = (w.astype(np.float32) * scale) if scale is not None else w.astype(np.float32)
    return out


def _add_model(tar: tarfile.TarFile, folder: Path, arcname: str, int8: bool) -> None:
    from safetensors.numpy import load_file, save

    for path in sorted(folder.rglob("*")):
        if path.is_dir() or path.name == "README.md":
            continue
        rel = path.relative_to(folder).as_posix()
        if path.suffix == ".safetensors":
            weights = load_file(path)
            packed = quantize_rows(weights) if int8 else {k: v.astype(np.float16) for k, v in weights.items()}
            _add_bytes(tar, f"{arcname}/{rel}", save(packed))
        elif path.suffix in {".bin", ".onnx", ".h5", ".msgpack", ".ot"}:
            continue
        else:
            tar.add(path, arcname=f"{arcname}/{rel}")


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _first_sentences(path: Path, n: int) -> bytes:
    """The first n sentences as the trainer reads them (blank lines skipped), so ``--n-sentences n``
    there takes the same sample, with the same target-cache key, as here."""
    from training.data.text import read_sentences

    return gzip.compress(("\n".join(read_sentences(path, n)) + "\n").encode(), compresslevel=6)


def _wheels(dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "-d",
        str(dest),
    ]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run([*cmd, *(f"{name}=={metadata.version(name)}" for name in WHEELS)], check=True)
    return sorted(dest.glob("*.whl"))


def pack(args: argparse.Namespace) -> None:
    from training.teachers import resolve_model

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    data = Path(args.data_dir)
    stream = out / "stream.tar.gz"
    with tarfile.open(stream, "w:gz", compresslevel=6) as tar:
        if args.teacher != "none":
            _add_model(tar, Path(resolve_model(args.teacher)), "teacher", int8=True)
        if args.student != "none":
            _add_model(tar, Path(resolve_model(args.student)), "student", int8=False)
        for name, folder in (spec.split("=", 1) for spec in args.model):
            _add_model(tar, Path(folder), f"models/{name}", int8=False)
        if args.n_sentences:
            corpus = data / args.corpus
            _add_bytes(tar, f"data/{args.corpus}", _first_sentences(corpus, args.n_sentences))
        for rel in DATA:
            tar.add(data / rel, arcname=f"data/{rel}")
        for wheel in _wheels(out / "wheels"):
            tar.add(wheel, arcname=f"wheels/{wheel.name}")
    shutil.rmtree(out / "wheels")
    piece = args.piece_mib << 20
    per_call = max(1, args.call_mib // args.piece_mib)
    with stream.open("rb") as handle:
        index = 0
        while chunk := handle.read(piece):
            folder = out / f"p{index // per_call + 1}"
            folder.mkdir(exist_ok=True)
            (folder / f"part_{index:02d}").write_bytes(chunk)
            index += 1
    stream.unlink()
    for folder in sorted(out.iterdir()):
        size = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
        print(f"{folder}: {size:.1f} MiB")


def unpack(args: argparse.Namespace) -> None:
    from safetensors.numpy import load_file, save_file

    parts = sorted(Path(args.parts).glob("part_*"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reader = _Concat(parts)
    with tarfile.open(fileobj=reader, mode="r|gz") as tar:
        tar.extractall(out, filter="data")
    for model in ("teacher", "student", "models"):
        for path in (out / model).rglob("*.safetensors"):
            save_file(dequantize_rows(load_file(path)), path)
    print("unpacked", sorted(p.name for p in out.iterdir()))


class _Concat(io.RawIOBase):
    """The parts read back as one stream, without a second copy on disk."""

    def __init__(self, parts: list[Path]) -> None:
        self._parts = list(parts)
        self._handle: io.BufferedReader | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while True:
            if self._handle is None:
                if not self._parts:
                    return 0
                self._handle = self._parts.pop(0).open("rb")
            n = self._handle.readinto(buffer)
            if n:
                return n
            self._handle.close()
            self._handle = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--out", default=".gpu")
    p.add_argument("--teacher", default="all-mpnet-base-v2", help="none: no teacher")
    p.add_argument("--student", default="all-MiniLM-L6-v2", help="none: no student init")
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a checkpoint, as float16, into models/NAME",
    )
    p.add_argument("--data-dir", default="../shared/data")
    p.add_argument("--corpus", default="unlabeled/enwiki2015_1m_sentences.txt.gz")
    p.add_argument("--n-sentences", type=int, default=100_000, help="0: no corpus")
    p.add_argument("--piece-mib", type=int, default=14)
    p.add_argument("--call-mib", type=int, default=56, help="MiB per folder (one call's carry)")
    u = sub.add_parser("unpack")
    u.add_argument("parts")
    u.add_argument("out")
    args = parser.parse_args()
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    (pack if args.command == "pack" else unpack)(args)


if __name__ == "__main__":
    main()

"""Run any training command on a lent GPU machine: no network there, at most 64 MiB carried per call.

Here, where the data, the models and the network are, pack what the command needs (``.gpu/`` must
be ignored by git, e.g. listed in .git/info/exclude, so that it travels only when carried)::

    python scripts/gpu_job.py pack --out .gpu --n-sentences 500000

The teacher travels as int8 weights with a float32 scale per row (its embeddings keep a mean cosine
of 0.9993 with the original's), the student init and any ``--model NAME=DIR`` checkpoint as
float16, with the first N corpus sentences, the STS-B, NLI and Quora files and wheels of the
transformers / sentence-transformers / tokenizers / huggingface_hub versions installed here: one
gzipped tar stream cut into folders ``p1``, ``p2``, ... of at most ``--call-mib`` (56) MiB, one
folder per call, named in the call's ``carry``. Every call but the last stages its folder there::

    python3 scripts/gpu_job.py stage .gpu/p1

The last one stages its own, unpacks everything once into $W (/tmp/w) as float32, installs the
wheels into $W/site and starts the command detached, so that it may outlive the call: in bash in the
repository's root, with ``distilembed`` on PATH, ``DISTILEMBED_DATA_DIR=$W/data``, the models at
``$W/teacher``, ``$W/student`` and ``$W/models/NAME``, and its output in $W/job.log::

    python3 scripts/gpu_job.py run --parts .gpu/p3 --wait 540 'distilembed train --preset hpd-mpnet \\
        --teacher "$W/teacher" --student "$W/student" --device cuda --teacher-batch-size 256 \\
        --out "$W/runs/hpd"'

``run`` waits until the command ends or ``--wait`` seconds have passed, then packs the job's log and
what ``--collect`` globs under $W match (by default every run's manifest, training curve and log under
$W/runs) into $OUT/collected.tar.gz (15 MiB pieces when larger). A later call collects a command that
outlived its call while the machine is still warm::

    python3 scripts/gpu_job.py collect --collect 'runs/hpd/*'
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ("transformers", "sentence-transformers", "tokenizers", "huggingface_hub")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
DATA = ("sts/stsbenchmark", "nli", "quora")  # quora: its pairs are excluded from training text
SCALE = ".__row_scale"
COUNT = "PARTS"  # in the last folder: how many parts the stream has
COLLECT = ("runs/*/manifest.json", "runs/*/training_curve.json", "runs/*/eval.json", "runs/*.log")
PIECE = 15 << 20  # what comes back from $OUT, per file


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
    """float32 tensors back from :func:`quantize_rows`'s or from float16 ones."""
    out: dict[str, np.ndarray] = {}
    for name, w in packed.items():
        if not name.endswith(SCALE):
            scale = packed.get(name + SCALE)
            out[name] = w.astype(np.float32) * scale if scale is not None else w.astype(np.float32)
    return out


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _add_model(tar: tarfile.TarFile, folder: Path, arcname: str, int8: bool) -> None:
    from safetensors.numpy import load_file, save

    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "README.md"):
        rel = f"{arcname}/{path.relative_to(folder).as_posix()}"
        if path.suffix == ".safetensors":
            weights = load_file(path)
            packed = quantize_rows(weights) if int8 else {k: v.astype(np.float16) for k, v in weights.items()}
            _add_bytes(tar, rel, save(packed))
        elif path.suffix not in {".bin", ".onnx", ".h5", ".msgpack", ".ot"}:  # other weight formats stay
            tar.add(path, arcname=rel)


def _wheels(dest: Path) -> list[Path]:
    """Wheels of this environment's versions of WHEELS, for the machine's Python 3.12 on x86-64."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    cmd += [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    subprocess.run([*cmd, *(f"{name}=={metadata.version(name)}" for name in WHEELS)], check=True)
    return sorted(dest.glob("*.whl"))


def pack(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from training.data.text import read_sentences
    from training.teachers import resolve_model

    out, data = Path(args.out), Path(args.data_dir)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    stream = out / "stream.tar.gz"
    with tarfile.open(stream, "w:gz", compresslevel=6) as tar:
        for name, arcname, int8 in ((args.teacher, "teacher", True), (args.student, "student", False)):
            if name != "none":
                _add_model(tar, Path(resolve_model(name)), arcname, int8)
        for name, folder in (spec.split("=", 1) for spec in args.model):
            _add_model(tar, Path(folder), f"models/{name}", int8=False)
        if args.n_sentences:  # the trainer's own reading, so --n-sentences takes the same sample there
            text = ("\n".join(read_sentences(data / args.corpus, args.n_sentences)) + "\n").encode()
            gz = args.corpus.endswith(".gz")
            _add_bytes(tar, f"data/{args.corpus}", gzip.compress(text, compresslevel=6) if gz else text)
        for rel in DATA:
            tar.add(data / rel, arcname=f"data/{rel}")
        if args.wheels:
            for wheel in _wheels(out / "wheels"):
                tar.add(wheel, arcname=f"wheels/{wheel.name}")
    shutil.rmtree(out / "wheels", ignore_errors=True)
    per_call, index = max(1, args.call_mib // args.piece_mib), 0
    with stream.open("rb") as handle:
        while chunk := handle.read(args.piece_mib << 20):
            folder = out / f"p{index // per_call + 1}"
            folder.mkdir(exist_ok=True)
            (folder / f"part_{index:02d}").write_bytes(chunk)
            index += 1
    stream.unlink()
    (folder / COUNT).write_text(f"{index}\n")
    for folder in sorted(out.iterdir()):
        print(f"{folder}: {sum(p.stat().st_size for p in folder.iterdir()) / 2**20:.1f} MiB")


def stage(parts: list[str], work: Path) -> None:
    """Copy carried part folders into ``work/parts``, where they stay between calls."""
    store = work / "parts"
    store.mkdir(parents=True, exist_ok=True)
    for folder in parts:
        for path in Path(folder).iterdir():
            shutil.copy2(path, store / path.name)
    print(f"{store}: {len(list(store.glob('part_*')))} parts")


def unpack(work: Path) -> None:
    """Unpack the staged parts into ``work`` once, as float32 models, and install the wheels."""
    from safetensors.numpy import load_file, save_file

    store = work / "parts"
    if (work / "data").is_dir():
        return
    if not (store / COUNT).is_file():
        raise SystemExit(f"error: no {COUNT} in {store}: stage every folder of the pack first")
    expected = [store / f"part_{i:02d}" for i in range(int((store / COUNT).read_text()))]
    if missing := [p.name for p in expected if not p.is_file()]:
        raise SystemExit(f"error: parts missing from {store}: {', '.join(missing)}")
    cat = subprocess.Popen(["cat", *map(str, expected)], stdout=subprocess.PIPE)  # no second copy on disk
    with cat, tarfile.open(fileobj=cat.stdout, mode="r|gz") as tar:
        tar.extractall(work, filter="data")
    for model in ("teacher", "student", "models"):
        for path in (work / model).rglob("*.safetensors"):
            save_file(dequantize_rows(load_file(path)), path)
    if wheels := sorted((work / "wheels").glob("*.whl")):
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        subprocess.run([*pip, "--target", str(work / "site"), *map(str, wheels)], check=True)


def job_env(work: Path) -> dict[str, str]:
    """The command's environment: the packed wheels and this checkout importable, ``distilembed``
    on PATH, the packed data as DISTILEMBED_DATA_DIR, no hub, and OUT unset (it may outlive the call)."""
    bin_dir = work / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    launcher = bin_dir / "distilembed"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m distilembed.cli "$@"\n')
    launcher.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    path = os.pathsep.join(p for p in (str(work / "site"), str(ROOT), env.get("PYTHONPATH")) if p)
    return env | {
        "W": str(work),
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": path,
        "DISTILEMBED_DATA_DIR": str(work / "data"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def job_state(work: Path) -> str:
    """``exit N`` once the command has ended, else ``running`` (or ``not started``)."""
    if (work / "job.rc").is_file():
        return f"exit {(work / 'job.rc').read_text().strip()}"
    return "running" if (work / "job.log").is_file() else "not started"


def run(args: argparse.Namespace, work: Path) -> None:
    if args.parts:
        stage(args.parts, work)
    unpack(work)
    (work / "job.rc").unlink(missing_ok=True)
    script = f'( {args.command}\n)\necho $? > "$W/job.rc"\n'
    with (work / "job.log").open("wb") as log:  # a session of its own: the call's end does not stop it
        detached = {"stdout": log, "stderr": subprocess.STDOUT, "start_new_session": True}
        subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=job_env(work), **detached)
    start = time.monotonic()
    while job_state(work) == "running" and time.monotonic() - start < args.wait:
        time.sleep(2)
    print(f"after {time.monotonic() - start:.0f} s: {job_state(work)}")
    collect(args.collect, work)


def collect(patterns: list[str] | None, work: Path) -> None:
    """The job's log and what ``patterns`` match under ``work``, as $OUT/collected.tar.gz[.NN]."""
    out = Path(os.environ.get("OUT") or work / "result")
    out.mkdir(parents=True, exist_ok=True)
    log = work / "job.log"
    found = {p for pattern in (*COLLECT, *(patterns or ())) for p in work.glob(pattern) if p.is_file()}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(found | ({log} if log.is_file() else set())):
            tar.add(path, arcname=path.relative_to(work).as_posix())
    blob = buffer.getvalue()
    pieces = [blob[i : i + PIECE] for i in range(0, len(blob), PIECE)] or [b""]
    for i, piece in enumerate(pieces):
        (out / ("collected.tar.gz" + (f".{i:02d}" if len(pieces) > 1 else ""))).write_bytes(piece)
    print(f"{job_state(work)}; {len(found)} files into {out} ({len(blob) / 2**20:.1f} MiB)")
    if log.is_file():
        print("".join(log.read_text(errors="replace").splitlines(keepends=True)[-5:]), end="")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default=os.environ.get("W", "/tmp/w"), help="the job's folder there")
    sub = parser.add_subparsers(dest="command_name", required=True)
    p = sub.add_parser("pack", help="here: the parts, one folder per call")
    p.add_argument("--out", default=".gpu")
    p.add_argument("--teacher", default="all-mpnet-base-v2", help="none: no teacher")
    p.add_argument("--student", default="all-MiniLM-L6-v2", help="none: no student init")
    p.add_argument("--model", action="append", default=[], metavar="NAME=DIR", help="a checkpoint, float16")
    p.add_argument("--data-dir", default=os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data"))
    p.add_argument("--corpus", default="unlabeled/enwiki2015_1m_sentences.txt.gz")
    p.add_argument("--n-sentences", type=int, default=100_000, help="0: no corpus")
    p.add_argument("--no-wheels", dest="wheels", action="store_false", help="the machine has the pins")
    p.add_argument("--piece-mib", type=int, default=14)
    p.add_argument("--call-mib", type=int, default=56, help="MiB per folder (one call's carry)")
    s = sub.add_parser("stage", help="there: keep a carried folder of parts")
    s.add_argument("parts", nargs="+")
    r = sub.add_parser("run", help="there: unpack once, start the command detached, wait, collect")
    r.add_argument("command", help="a bash command line, run in the repository's root")
    r.add_argument("--parts", action="append", default=[], help="a carried folder to stage first")
    r.add_argument("--wait", type=float, default=540, help="seconds to wait for the command")
    r.add_argument("--collect", action="append", help="a glob under $W to bring back (repeatable)")
    c = sub.add_parser("collect", help="there: bring back what a job wrote so far")
    c.add_argument("--collect", action="append", help="a glob under $W to bring back (repeatable)")
    args = parser.parse_args()
    work = Path(args.work)
    if args.command_name == "pack":
        pack(args)
    elif args.command_name == "stage":
        stage(args.parts, work)
    elif args.command_name == "run":
        run(args, work)
    else:
        collect(args.collect, work)


if __name__ == "__main__":
    main()

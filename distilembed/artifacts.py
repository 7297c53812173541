"""Artifact directories shared by every stage: manifest, hashing, atomic writes.

Torch-free on purpose: the serving image imports this module.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from distilembed.errors import UserError

MANIFEST = "manifest.json"


# mkstemp/mkdtemp create 0600/0700 entries; artifacts are shared (a bundle mounted into a container
# runs as another uid), so they get the modes an ordinary open()/mkdir() would give.
_UMASK = os.umask(0)
os.umask(_UMASK)
FILE_MODE, DIR_MODE = 0o666 & ~_UMASK, 0o777 & ~_UMASK


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sha256_tree(root: str | Path, exclude: frozenset[str] = frozenset({MANIFEST})) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative posix path -> hex digest)."""
    root = Path(root)
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in exclude
    }


def git_commit(cwd: Path | None = None) -> str | None:
    """HEAD's sha, with ``-dirty`` when tracked files differ from it (the artifact may not be
    reproducible from the commit alone); None outside a git checkout."""
    command = ["git", "describe", "--always", "--dirty", "--abbrev=40", "--exclude=*"]
    here = cwd or Path(__file__).resolve().parent
    try:
        sha = subprocess.check_output(command, text=True, stderr=subprocess.DEVNULL, cwd=here).strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return sha or None


def tool_versions(*packages: str) -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in packages:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return versions


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Write to a temp file in the same directory, fsync, rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write((json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())
            handle.flush()
            os.fsync(handle.fileno())
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_manifest(directory: str | Path) -> dict[str, Any]:
    return json.loads((Path(directory) / MANIFEST).read_text(encoding="utf-8"))


def require_checkpoint(folder: str | Path) -> Path:
    """``folder`` if it is a training checkpoint (a sentence-transformers folder), else a UserError
    that says what it is instead (an exported bundle, an index, nothing)."""
    path = Path(folder)
    if not path.is_dir():
        raise UserError(f"checkpoint not found: {path}")
    if not (path / "modules.json").is_file():
        kind = None
        if (path / MANIFEST).is_file():
            with contextlib.suppress(OSError, ValueError, AttributeError):
                kind = read_manifest(path).get("kind")
        what = f"a {kind!r} directory" if kind else "not a sentence-transformers checkpoint (no modules.json)"
        raise UserError(f"{path} is {what}; this needs a training checkpoint (`distilembed train --out`)")
    return path


@contextmanager
def atomic_directory(final: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temp dir beside ``final``; on success rename it into place.

    A crash leaves only a hidden ``.name.tmp-*`` dir, never a half-written ``final``.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    tmp.chmod(DIR_MODE)
    try:
        yield tmp
        if final.exists():
            if not overwrite:
                raise FileExistsError(f"{final} exists")
            old = final.with_name(f".{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            final.replace(old)
            tmp.replace(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.replace(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

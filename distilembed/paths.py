"""Where distilembed keeps caches and finds data, each overridable by environment variable."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Root of on-disk caches (reassembled teachers, teacher targets): ``DISTILEMBED_CACHE_DIR``."""
    path = Path(os.environ.get("DISTILEMBED_CACHE_DIR") or Path.home() / ".cache" / "distilembed")
    path.mkdir(parents=True, exist_ok=True)
    return path


def resolve_data_path(value: str | Path, data_root: str | Path | None = None) -> Path:
    """A path as given if it exists, else relative to the data root when one is set."""
    path = Path(value).expanduser()
    if path.exists() or path.is_absolute():
        return path
    root = data_root or os.environ.get("DISTILEMBED_DATA_DIR")
    if root and (Path(root) / path).exists():
        return Path(root) / path
    return path

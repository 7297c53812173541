"""What the ``distilembed index`` commands share (index/cli.py, index/cli_search.py): opening an index
with its bundle's encoder, or without one, and the --filter option."""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path
from typing import Any

import typer

from distilembed.errors import UserError

Opt = typer.Option
FILTER_HELP = 'A metadata filter as JSON, e.g. \'{"lang": "en", "year": {"$gte": 2020}}\' (docs/serving.md).'


def encoder_for(
    index_dir: Path, bundle: Path | None, writable: bool, rescore_k: int | None = None
) -> tuple[Any, Any]:
    """The index, opened for writing or only to search, and the encoder of its bundle."""
    from distilembed.artifacts import read_manifest
    from export.runtime import Encoder, bundle_identity
    from index.integrity import read_index_manifest
    from index.shards import SHARDS_KIND, open_index

    manifest = read_index_manifest(index_dir, kinds=("index", SHARDS_KIND))
    sharded = manifest["kind"] == SHARDS_KIND
    if sharded and writable:
        raise UserError(f"{index_dir} is a sharded index, read-only: write to its source and shard it again")
    built = index_dir / manifest["shards"][0] if sharded else index_dir
    meta = read_manifest(built).get("bundle", {}) if (built / "manifest.json").is_file() else {}
    if bundle is None and not meta.get("path"):
        raise UserError(f"{index_dir} does not record the bundle it was built with: pass --bundle")
    bundle_dir = bundle or Path(meta["path"])
    encoder = Encoder(bundle_dir, variant=meta.get("variant", "int8"))
    bundle_sha = bundle_identity(bundle_dir)
    return open_index(index_dir, encoder.dim, bundle_sha, writable=writable, rescore_k=rescore_k), encoder


def opened(index: Path, writable: bool = True) -> closing[Any]:
    """The ``LiveIndex`` at ``index``, closed (a writer checkpointed) after the block."""
    from index.live import LiveIndex

    return closing(LiveIndex(index, writable=writable))


def readable(index: Path) -> Any:
    """The index at ``index``, whole or sharded, to read without an encoder (close it after)."""
    from index.integrity import read_index_manifest
    from index.live import LiveIndex
    from index.shards import SHARDS_KIND, open_sharded

    manifest = read_index_manifest(index, kinds=("index", SHARDS_KIND))
    if manifest["kind"] == SHARDS_KIND:
        return open_sharded(index, int(manifest["dim"]))
    return LiveIndex(index, writable=False)


def filter_json(text: str | None) -> dict[str, Any] | None:
    """The --filter JSON, checked here so that a mistake is one line before anything loads."""
    if text is None:
        return None
    from index.filters import parse

    try:
        where = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"--filter is not valid JSON: {exc.msg} at character {exc.pos}") from None
    parse(where)
    return where

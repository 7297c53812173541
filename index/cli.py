"""``distilembed index build | search | info | verify | snapshot | restore | ...``. No torch is imported
on this path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from index import cli_search
from index.cli_common import FILTER_HELP, Opt, encoder_for, filter_json, opened

app = typer.Typer(help="Build and query a Faiss index of a corpus.", no_args_is_help=True)


@app.command("build")
def build_command(
    bundle: Annotated[Path, Opt(help="Exported bundle directory.")],
    corpus: Annotated[
        Path,
        Opt(
            help="Corpus: a file, a directory or a glob of .txt, .jsonl, .csv, .tsv (optionally .gz) "
            "or .parquet files."
        ),
    ],
    out: Annotated[Path, Opt(help="Index directory to write.")],
    id_column: Annotated[str, Opt(help="Id column (jsonl/csv/tsv/parquet).")] = "id",
    text_column: Annotated[str, Opt(help="Text column (jsonl/csv/tsv/parquet).")] = "text",
    metadata_column: Annotated[list[str] | None, Opt(help="Metadata column to keep (repeatable).")] = None,
    variant: Annotated[str, Opt(help="int8 | fp32")] = "int8",
    nlist: Annotated[int, Opt(help="IVF lists wanted (lowered for a small index).", min=1)] = 1024,
    nprobe: Annotated[
        int | None, Opt(help="Lists searched per query (default: 5; pq and binary storage: 8).", min=1)
    ] = None,
    storage: Annotated[
        str,
        Opt(
            help="How IVF lists hold vectors: float32; sq8 (a byte per dimension); pq (--pq-m codes of "
            "--pq-bits bits) or binary (a bit per dimension), both rescored from float32 vectors on disk."
        ),
    ] = "float32",
    pq_m: Annotated[
        int | None, Opt(help="pq: codes per vector, dividing the dimension (default: one per 8).", min=1)
    ] = None,
    pq_bits: Annotated[int, Opt(help="pq: bits per code.", min=1, max=16)] = 8,
    rescore_k: Annotated[
        int, Opt(help="pq, binary: candidates taken from the lists and rescored exactly.", min=1)
    ] = 20,  # index.rescore.DEFAULT_RESCORE_K, not imported here: it would load Faiss for --help
    on_disk: Annotated[
        bool, Opt(help="Keep the IVF lists in a memory-mapped file (indexes bigger than RAM).")
    ] = False,
    engine: Annotated[  # escaped: the help is rich markup, where a bare [ray] is a style tag and vanishes
        str, Opt(help=f"local (this process) or ray (a Ray cluster; the {escape('[ray]')} extra).")
    ] = "local",
    ray_address: Annotated[
        str | None,
        Opt(
            envvar="RAY_ADDRESS",
            help="Ray cluster as HOST:PORT (GCS) or auto; not ray:// (default: start one here).",
        ),
    ] = None,
    actors: Annotated[
        int | None, Opt(help="Ray encoder actors (default: cluster CPUs / --threads).", min=1)
    ] = None,
    threads: Annotated[
        int | None, Opt(help="onnxruntime threads (local: all cores; ray: per actor, default 1).", min=1)
    ] = None,
    batch_size: Annotated[int, Opt(help="Texts per model run.", min=1)] = 64,
    lines_per_split: Annotated[
        int, Opt(help="Corpus lines per split: the unit encoded in one call and checkpointed.", min=1)
    ] = 8192,
    index_field: Annotated[
        list[str] | None, Opt(help="Metadata field to index for fast filters (repeatable).")
    ] = None,
    lexical: Annotated[bool, Opt(help="Keep a lexical (BM25) index for --mode lexical/hybrid.")] = True,
    overwrite: Annotated[bool, Opt()] = False,
) -> None:
    """Embed a corpus with a bundle into a Faiss IVF index with a SQLite document store (resumable)."""
    from index.build import BuildConfig, build
    from index.corpus import CorpusSpec

    spec = CorpusSpec(corpus, id_column, text_column, tuple(metadata_column or ()))
    cfg = BuildConfig(
        bundle=str(bundle),
        out=str(out),
        variant=variant,
        nlist=nlist,
        nprobe=nprobe,
        storage=storage,
        pq_m=pq_m,
        pq_bits=pq_bits,
        rescore_k=rescore_k,
        threads=threads,
        engine=engine,
        on_disk=on_disk,
        ray_address=ray_address,
        actors=actors,
        batch_size=batch_size,
        shard_size=lines_per_split,
    )
    manifest = build(cfg, spec, overwrite=overwrite, lexical=lexical)
    if index_field:
        _add_field_indexes(out, index_field)
    keys = ("ntotal", "dim", "index_type", "nlist", "nprobe", "plan", "engine", "build_seconds", "docs_per_s")
    more = {"lexical": manifest["lexical"], "skipped": manifest["corpus"]["skipped"]}
    typer.echo(json.dumps({k: manifest[k] for k in keys} | more))


@app.command("init")
def init_command(
    bundle: Annotated[Path, Opt(help="Exported bundle directory.")],
    out: Annotated[Path, Opt(help="Index directory to create.")],
    lexical: Annotated[bool, Opt(help="Keep a lexical (BM25) index for --mode lexical/hybrid.")] = True,
    overwrite: Annotated[bool, Opt()] = False,
) -> None:
    """Create an empty index for a bundle (exact search), to fill with 'index add' or the service."""
    from index.build import BuildConfig, create_empty

    cfg = BuildConfig(bundle=str(bundle), out=str(out))
    manifest = create_empty(cfg, overwrite=overwrite, lexical=lexical)
    typer.echo(json.dumps({k: manifest[k] for k in ("ntotal", "dim", "index_type", "plan", "lexical")}))


app.command("search")(cli_search.search_command)
app.command("list")(cli_search.list_command)


@app.command("count")
def count_command(
    index: Annotated[Path, typer.Argument(help="Index directory.")],
    filter_: Annotated[str | None, Opt("--filter", help=FILTER_HELP)] = None,
) -> None:
    """How many documents pass a filter (all of them without one)."""
    where = filter_json(filter_)
    with opened(index, writable=False) as live:
        typer.echo(json.dumps({"count": live.count(where)}))


@app.command("field")
def field_command(
    index: Annotated[Path, typer.Argument(help="Index directory to update in place.")],
    fields: Annotated[list[str], typer.Argument(help="Metadata field paths (as filters name them).")],
) -> None:
    """Keep a payload index of metadata fields, so that filters on them cost what their matches cost."""
    typer.echo(json.dumps({"indexed_fields": _add_field_indexes(index, fields)}))


@app.command("lexical")
def lexical_command(
    index: Annotated[Path, typer.Argument(help="Index directory to update in place.")],
) -> None:
    """Add a lexical (BM25) index of the documents' text, for 'index search --mode lexical|hybrid'
    (rebuilt if it exists). One transaction; refused while a writer (e.g. the service) holds the index."""
    with opened(index) as live:
        added = live.enable_lexical()
        typer.echo(json.dumps({"lexical": "added" if added else "rebuilt", "documents": live.count()}))


def _add_field_indexes(index: Path, fields: list[str]) -> list[str]:
    with opened(index) as live:
        for field in fields:
            live.add_field_index(field)
        return list(live.indexed_fields)


@app.command("add")
def add_command(
    index: Annotated[Path, Opt(help="Index directory to update in place.")],
    corpus: Annotated[Path, Opt(help="Documents to add or replace: .txt, .jsonl, .csv or .tsv.")],
    id_column: Annotated[str, Opt(help="Id column (jsonl/csv/tsv).")] = "id",
    text_column: Annotated[str, Opt(help="Text column (jsonl/csv/tsv).")] = "text",
    metadata_column: Annotated[list[str] | None, Opt(help="Metadata column to keep (repeatable).")] = None,
    bundle: Annotated[Path | None, Opt(help="Bundle (default: the one the index was built with).")] = None,
    batch: Annotated[int, Opt(help="Documents per durable write.")] = 4096,
) -> None:
    """Add or replace documents in an existing index without retraining it (durable per batch)."""
    from tqdm.auto import tqdm

    from index.build import read_corpus
    from index.corpus import CorpusSpec

    docs, _, _ = read_corpus(CorpusSpec(corpus, id_column, text_column, tuple(metadata_column or ())))
    live, encoder = encoder_for(index, bundle, writable=True)
    added = replaced = 0
    with tqdm(total=len(docs), desc="add", unit="doc") as bar:
        for lo in range(0, len(docs), batch):
            chunk = docs[lo : lo + batch]
            a, r = live.upsert(chunk, encoder.encode([d.text for d in chunk]))
            added, replaced = added + a, replaced + r
            bar.update(len(chunk))
    live.close()
    typer.echo(json.dumps({"added": added, "replaced": replaced, "ntotal": live.ntotal}))


@app.command("delete")
def delete_command(
    index: Annotated[Path, Opt(help="Index directory to update in place.")],
    ids: Annotated[list[str], typer.Argument(help="Document ids to delete.")],
) -> None:
    """Delete documents by id (durable on return)."""
    with opened(index) as live:
        gone = live.delete(ids)
    typer.echo(json.dumps({"deleted": gone, "missing": sorted(set(ids) - set(gone)), "ntotal": live.ntotal}))


@app.command("retrain")
def retrain_command(
    index: Annotated[Path, Opt(help="Index directory to retrain in place (not open in a service).")],
    nlist: Annotated[int, Opt(help="Lists wanted (lowered for a small index).", min=1)] = 1024,
    storage: Annotated[
        str | None, Opt(help="float32 | sq8 | pq | binary (default: keep the current one).")
    ] = None,
    pq_m: Annotated[int | None, Opt(help="pq: codes per vector (default: keep).", min=1)] = None,
    pq_bits: Annotated[int | None, Opt(help="pq: bits per code (default: keep).", min=1, max=16)] = None,
    flat_below: Annotated[int, Opt(help="Fewer vectors than this: exact search.")] = 10_000,
) -> None:
    """Retrain the IVF on the vectors the index holds (no re-encoding).

    For an index grown from empty or moved to another domain. In a running service: POST /index/retrain
    """
    from index.vectors import pq_shape

    with opened(index) as live:
        m, bits = pq_shape(live.index)
        manifest = live.retrain(
            nlist=nlist, storage=storage, flat_below=flat_below, pq=(pq_m or m, pq_bits or bits)
        )
    keys = ("ntotal", "index_type", "nlist", "plan", "retrained")
    typer.echo(json.dumps({k: manifest[k] for k in keys}))


@app.command("shard")
def shard_command(
    index: Annotated[Path, Opt(help="Index directory to cut into shards (left as it is).")],
    shards: Annotated[int, Opt(help="Number of shards (>= 2).")],
    out: Annotated[Path, Opt(help="Directory to write the shards into.")],
    overwrite: Annotated[bool, Opt()] = False,
) -> None:
    """Cut an index into N shards by crc32(id) % N, each searched by its own replica (read-only).

    Serve the directory as any index: searches ask every shard and merge their top-k.
    """
    from index.shards import shard_index

    manifest = shard_index(index, shards, out, overwrite=overwrite)
    typer.echo(json.dumps({k: manifest[k] for k in ("count", "ntotal", "shards")}))


@app.command("info")
def info_command(index: Annotated[Path, typer.Argument(help="Index directory.")]) -> None:
    """Print an index's manifest, with the memory its lists take per document."""
    with opened(index, writable=False) as live:
        typer.echo(json.dumps(live.manifest | {"ntotal": live.ntotal} | live.footprint(), indent=2))


@app.command("verify")
def verify_command(
    index: Annotated[Path, typer.Argument(help="Index directory (or sharded index, or snapshot).")],
) -> None:
    """Check an index in full: every file's checksum, SQLite's integrity_check, and that the Faiss
    index holds exactly the stored documents (exit 2 and one line if not). Safe while it serves."""
    from index.verify import verify_index

    typer.echo(json.dumps(verify_index(index)))


@app.command("snapshot")
def snapshot_command(
    index: Annotated[Path, Opt(help="Index directory (may be open in a service meanwhile).")],
    out: Annotated[Path, Opt(help="Snapshot directory to write.")],
    copy: Annotated[
        bool, Opt(help="Copy the Faiss file even where a hard link could share its disk blocks.")
    ] = False,
    overwrite: Annotated[bool, Opt()] = False,
) -> None:
    """Copy an index consistently while it serves and takes writes (every write acknowledged before
    the command started is in it), with every file's checksum."""
    from index.snapshot import take_snapshot

    manifest = take_snapshot(index, out, overwrite=overwrite, link=not copy)
    keys = ("ntotal", "created", "faiss_file", "seconds")
    bytes_ = sum(entry["bytes"] for entry in manifest["files"].values())
    typer.echo(json.dumps({"snapshot": str(out)} | {k: manifest[k] for k in keys} | {"bytes": bytes_}))


@app.command("restore")
def restore_command(
    snapshot: Annotated[Path, typer.Argument(help="Snapshot directory ('index snapshot').")],
    out: Annotated[Path, Opt(help="Index directory to write.")],
    overwrite: Annotated[bool, Opt(help="Replace OUT (refused while a writer has it open).")] = False,
) -> None:
    """Restore a snapshot into an index directory, after checking every file's checksum."""
    from index.snapshot import restore_snapshot

    typer.echo(json.dumps(restore_snapshot(snapshot, out, overwrite=overwrite)))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="index")

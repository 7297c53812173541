"""``distilembed index build | search | info``. No torch is imported on this path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

Opt = typer.Option
app = typer.Typer(help="Build and query a Faiss index of a corpus.", no_args_is_help=True)


@app.command("build")
def build_command(
    bundle: Annotated[Path, Opt(help="Exported bundle directory.")],
    corpus: Annotated[Path, Opt(help="Corpus: .txt, .jsonl, .csv or .tsv (optionally .gz).")],
    out: Annotated[Path, Opt(help="Index directory to write.")],
    id_column: Annotated[str, Opt(help="Id column (jsonl/csv/tsv).")] = "id",
    text_column: Annotated[str, Opt(help="Text column (jsonl/csv/tsv).")] = "text",
    metadata_column: Annotated[list[str] | None, Opt(help="Metadata column to keep (repeatable).")] = None,
    variant: Annotated[str, Opt(help="int8 | fp32")] = "int8",
    nlist: Annotated[int, Opt()] = 1024,
    nprobe: Annotated[int, Opt()] = 5,
    threads: Annotated[int | None, Opt()] = None,
    overwrite: Annotated[bool, Opt()] = False,
) -> None:
    """Embed a corpus with a bundle into a Faiss IVF index with a SQLite document store (resumable)."""
    from index.build import BuildConfig, build
    from index.corpus import CorpusSpec

    spec = CorpusSpec(corpus, id_column, text_column, tuple(metadata_column or ()))
    cfg = BuildConfig(
        bundle=str(bundle), out=str(out), variant=variant, nlist=nlist, nprobe=nprobe, threads=threads
    )
    manifest = build(cfg, spec, overwrite=overwrite)
    keys = ("ntotal", "dim", "index_type", "nlist", "nprobe", "plan", "build_seconds", "docs_per_s")
    typer.echo(json.dumps({k: manifest[k] for k in keys} | {"skipped": manifest["corpus"]["skipped"]}))


@app.command("search")
def search_command(
    index: Annotated[Path, Opt(help="Index directory.")],
    query: Annotated[str, Opt(help="Query text.")],
    k: Annotated[int, Opt("-k", "--top-k")] = 10,
    nprobe: Annotated[int | None, Opt()] = None,
    bundle: Annotated[
        Path | None, Opt(help="Bundle to embed the query (default: the one it was built with).")
    ] = None,
) -> None:
    """Top-k documents for a query."""
    from export.runtime import Encoder
    from index.reader import IndexReader

    reader = IndexReader(index, nprobe)
    meta = reader.manifest["bundle"]
    encoder = Encoder(bundle or meta["path"], variant=meta.get("variant", "int8"))
    if encoder.dim != reader.dim:
        from distilembed.errors import UserError

        raise UserError(f"bundle gives {encoder.dim}-d vectors, the index holds {reader.dim}-d")
    for rank, hit in enumerate(reader.search(encoder.encode([query]), k)[0], 1):
        typer.echo(f"{rank:>3}  {hit.score:.4f}  {hit.id}  {hit.text}")


@app.command("info")
def info_command(index: Annotated[Path, typer.Argument(help="Index directory.")]) -> None:
    """Print an index's manifest."""
    from index.reader import IndexReader

    typer.echo(json.dumps(IndexReader(index).manifest, indent=2))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="index")

"""``distilembed index search`` (one query or several, dense, lexical or hybrid, pages, thresholds and
the fields printed) and ``distilembed index list`` (every document, a page at a time)."""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path
from typing import Annotated, Any

import typer

from distilembed.errors import UserError
from index.cli_common import FILTER_HELP, Opt, encoder_for, filter_json, readable

MODES, FIELDS = ("dense", "lexical", "hybrid"), ("text", "metadata", "vector")


def _queries(query: list[str] | None, queries_file: Path | None) -> list[str]:
    texts = list(query or [])
    if queries_file is not None:
        try:
            texts += [line for line in queries_file.read_text(encoding="utf-8").splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"--queries-file {queries_file}: {exc}") from None
    if not texts:
        raise UserError("give a query: --query TEXT (repeatable) or --queries-file FILE (one a line)")
    if any(not text.strip() for text in texts):
        raise UserError("--query is empty: give the text to search for")
    return texts


def _fields(fields: str) -> list[str]:
    names = [name.strip() for name in fields.split(",") if name.strip()]
    if unknown := [name for name in names if name not in FIELDS]:
        raise UserError(f"--fields takes {', '.join(FIELDS)} (comma-separated), not {unknown[0]!r}")
    return names


def _shown(hit: Any, field: str, vectors: dict[str, Any]) -> str:
    if field == "text":
        return str(hit.text)
    if field == "metadata":
        return json.dumps(hit.metadata, ensure_ascii=False, separators=(",", ":"))
    vector = vectors.get(hit.id)
    return "-" if vector is None else "[" + ",".join(f"{x:.4f}" for x in vector) + "]"


def search_command(  # noqa: PLR0917 (Typer: a parameter per option)
    index: Annotated[Path, Opt(help="Index directory.")],
    query: Annotated[list[str] | None, Opt(help="Query text (repeatable: hits for each).")] = None,
    queries_file: Annotated[Path | None, Opt(help="Queries, one a line (after any --query).")] = None,
    k: Annotated[int, Opt("-k", "--top-k", min=1, help="Hits to print.")] = 10,
    offset: Annotated[int, Opt(min=0, help="Skip the first N hits (the next page).")] = 0,
    threshold: Annotated[float | None, Opt(help="Drop hits scoring below this (the mode's score).")] = None,
    fields: Annotated[str, Opt(help="After each id: any of text,metadata,vector.")] = "text",
    nprobe: Annotated[int | None, Opt()] = None,
    rescore_k: Annotated[
        int | None, Opt(help="pq, binary: candidates rescored (default: the index's).", min=1)
    ] = None,
    bundle: Annotated[
        Path | None, Opt(help="Bundle to embed the query (default: the one it was built with).")
    ] = None,
    filter_: Annotated[str | None, Opt("--filter", help=FILTER_HELP)] = None,
    mode: Annotated[str, Opt(help="dense | lexical (BM25) | hybrid (both, fused).")] = "dense",
    fusion: Annotated[str, Opt(help="hybrid: weighted (min-max scores) | rrf (ranks).")] = "weighted",
) -> None:
    """Top-k documents for each query (hybrid: each hit's sides in brackets; several queries: a
    '# query' line before each one's hits)."""
    texts, shown = _queries(query, queries_file), _fields(fields)
    if mode not in MODES:
        raise UserError(f"--mode must be dense, lexical or hybrid, not {mode!r}")
    where, window = filter_json(filter_), offset + k
    if mode == "lexical":  # no encoder needed
        live, vectors = readable(index), None
    else:
        live, encoder = encoder_for(index, bundle, writable=False, rescore_k=rescore_k)
        vectors = encoder.encode(texts)  # one batch for every query
    with closing(live):
        if vectors is None:
            found = [live.search_lexical(text, window, where) for text in texts]
        elif mode == "dense":
            found = live.search(vectors, window, nprobe, where)
        else:
            found = [
                live.search_hybrid(v, t, window, where, fusion=fusion, nprobe=nprobe)
                for v, t in zip(vectors, texts, strict=True)
            ]
        pages = [[h for h in hits[offset:] if threshold is None or h.score >= threshold] for hits in found]
        held = live.vectors([h.id for hits in pages for h in hits]) if "vector" in shown else {}
    for text, hits in zip(texts, pages, strict=True):
        if len(texts) > 1:
            typer.echo(f"# {text}")
        for rank, hit in enumerate(hits, offset + 1):
            sides = f"  [{'+'.join(hit.matched)}]" if mode == "hybrid" else ""
            rest = "".join(f"  {_shown(hit, field, held)}" for field in shown)
            typer.echo(f"{rank:>3}  {hit.score:.4f}{sides}  {hit.id}{rest}")


def list_command(
    index: Annotated[Path, typer.Argument(help="Index directory (or sharded index).")],
    cursor: Annotated[str | None, Opt(help="Where the page starts: the next_cursor a page printed.")] = None,
    limit: Annotated[int, Opt(min=1, help="Documents in the page.")] = 100,
) -> None:
    """Print a page of documents, in a stable order, as JSON with the cursor of the next page (null
    after the last): a walk by cursors prints every document once, even while it is written."""
    from index.browse import after_cursor, documents_page

    after_cursor(cursor)  # a bad cursor: one line before the index opens
    with closing(readable(index)) as live:
        docs, after = documents_page(live.list_documents, cursor, limit)
    listed = [{"id": d.id, "text": d.text, "metadata": d.metadata} for d in docs]
    typer.echo(json.dumps({"documents": listed, "next_cursor": after}, ensure_ascii=False))

r"""Index a folder of text files and search it, in this process (no service): one document per
paragraph (blank-line separated), id ``relative/path.txt#n``, the file's path as metadata. --pattern
chooses the files (default ``**/*.txt``); this repository's guides are markdown:

    python examples/index_folder.py --folder docs --pattern '*.md' --out runs/docs-index \
        --query "how do I shard an index"

A second run with the same --out searches the index it built; pass --rebuild after the files change.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from export.runtime import Encoder
from index.build import BuildConfig, build
from index.corpus import CorpusSpec
from index.live import Hit, LiveIndex


def paragraphs(folder: Path, pattern: str = "**/*.txt") -> list[dict[str, str]]:
    """Every non-empty paragraph of every matching file under ``folder``."""
    rows = []
    for path in sorted(folder.glob(pattern)):
        parts = [p.strip() for p in path.read_text(encoding="utf-8", errors="replace").split("\n\n")]
        name = str(path.relative_to(folder))
        rows += [{"id": f"{name}#{n}", "text": text, "file": name} for n, text in enumerate(parts) if text]
    return rows


def index_folder(folder: Path, out: Path, bundle: Path, pattern: str = "**/*.txt") -> int:
    """Build the index at ``out`` (replacing it); returns the number of paragraphs indexed."""
    rows = paragraphs(folder, pattern)
    if not rows:
        raise SystemExit(f"error: no non-empty {pattern} under {folder} (--pattern chooses the files)")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "paragraphs.jsonl"
        corpus.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        build(
            BuildConfig(bundle=str(bundle), out=str(out)),
            CorpusSpec(corpus, metadata_columns=("file",)),
            overwrite=True,
        )
    return len(rows)


def search(out: Path, query: str, k: int = 5) -> list[Hit]:
    index = LiveIndex(out, writable=False)
    try:
        encoder = Encoder(index.manifest["bundle"]["path"], variant=index.manifest["bundle"]["variant"])
        return index.search(encoder.encode([query]), k)[0]
    finally:
        index.close(checkpoint=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--query", required=True)
    parser.add_argument("--bundle", type=Path, default=Path("models/default"))
    parser.add_argument("--pattern", default="**/*.txt", help="which files (a glob under --folder)")
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("-k", type=int, default=5)
    args = parser.parse_args()
    if args.rebuild or not (args.out / "manifest.json").is_file():
        print(f"indexed {index_folder(args.folder, args.out, args.bundle, args.pattern)} paragraphs")
    for hit in search(args.out, args.query, args.k):
        print(f"{hit.score:.3f}  {hit.id}  {hit.text[:100]}")


if __name__ == "__main__":
    main()

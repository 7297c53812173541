"""Each training sentence's nearest Wikipedia neighbour: near pairs for ``--extra-text``.

The default student keeps about 60% of its target's ten nearest neighbours (bench/target_fidelity.py),
and IVF loses Quora duplicates where near pairs stray. Random training text holds few near pairs, so
ConGen's queue rarely asks the student to resolve one. This finds, for every sentence of a preset's
training text, its nearest sentence (all-MiniLM-L6-v2's cosine) in a slice of Wikipedia that
training, the distractors and the other benches do not use, and writes the ``--n`` closest pairs'
neighbours, one per line. Quora and STS-B test text are read only to be excluded, as training does.
Measured in docs/results.md ("More tries at the Quora target", stop 59): Quora and STS-B dev tie
with the default's recipe, so no preset uses it.

    python scripts/neighbour_text.py --preset congen-ens-hpd-cpu --n 4096 --out runs/ntext/neighbours4k.txt
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distilembed.paths import resolve_data_path
from training.config import make_config
from training.data.text import read_sentences
from training.teacher_targets import Teacher
from training.training_text import training_text


def unit(rows: np.ndarray) -> np.ndarray:
    """A unit-length float32 copy of ``rows`` (Faiss's ``normalize_L2``)."""
    rows = np.array(rows, dtype=np.float32, order="C")
    faiss.normalize_L2(rows)
    return rows


def closest_neighbours(anchors: np.ndarray, pool: np.ndarray, texts: list[str], n: int) -> dict[str, float]:
    """Each anchor's nearest pool row by cosine; the ``n`` distinct ones of the closest pairs, with
    their cosine, closest first (``texts`` names the pool rows)."""
    index = faiss.IndexFlatIP(pool.shape[1])
    index.add(unit(pool))
    scores, ids = index.search(unit(anchors), 1)
    chosen: dict[str, float] = {}
    for row in np.argsort(-scores[:, 0], kind="stable"):
        chosen.setdefault(texts[int(ids[row, 0])], float(scores[row, 0]))
        if len(chosen) == n:
            break
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="congen-ens-hpd-cpu")
    parser.add_argument("--pool-skip", type=int, default=200_000)
    parser.add_argument("--pool-size", type=int, default=200_000)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    data_dir = os.environ.get("DISTILEMBED_DATA_DIR")
    cfg = make_config(args.preset, {})
    text = training_text(cfg, data_dir)
    anchors = list(dict.fromkeys([*text.corpus, *text.pca_train]))
    corpus = resolve_data_path(cfg.corpus, data_dir)
    pool = list(dict.fromkeys(read_sentences(corpus, limit=args.pool_size, skip=args.pool_skip)))
    known = set(anchors)
    pool = [s for s in pool if s not in known]
    encoder = Teacher("all-MiniLM-L6-v2", batch_size=64)
    chosen = closest_neighbours(encoder.targets(anchors)[0], encoder.targets(pool)[0], pool, args.n)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(chosen) + "\n", encoding="utf-8")
    values = np.asarray(list(chosen.values()))
    print(
        f"{len(anchors):,} anchors, {len(pool):,} pool sentences: wrote {len(chosen):,} neighbours "
        f"(cosine {values.min():.3f}-{values.max():.3f}, median {np.median(values):.3f}) to {out}"
    )


if __name__ == "__main__":
    main()

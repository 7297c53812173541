"""Can a fixed linear map of a student's output make its short prefixes better? STS-B at 128/64/32-d.

    python bench/prefix_rotation.py --model CHECKPOINT --out docs/results/prefix_rotation_NAME.json

An orthogonal map leaves every 128-d cosine as it is, so if some rotation put more of what the
student knows into its first 32 or 64 coordinates, a Matryoshka student's shares (issue 23) would
rise for free. Fitted on --fit-sentences Wikipedia sentences after the first --skip-sentences (text
no preset trains on), on the final Dense layer's output before normalisation (what ``distilembed
whiten`` folds into that layer). Candidates: the identity; centring; the PCA basis (coordinates in
order of variance) at whitening powers p; the symmetric (ZCA) whitening ``whiten`` uses; the PCA
basis inside the first 64 coordinates only (64-d and 128-d unchanged); and whitening within each
trained prefix (``nested_whitening``: a lower block-triangular map, so each prefix stays a function
of the same prefix and a client may still cut the vector). Selection is on STS-B dev;
test is reported beside it. PyTorch, not int8. Prints a table and writes JSON; no doc block (the
result is a paragraph of docs/methods.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness import markdown_table, run_info  # noqa: E402

WIDTHS = (128, 64, 32)


def _symmetric_power(cov: np.ndarray, exponent: float) -> np.ndarray:
    values, vectors = np.linalg.eigh(cov)
    values = np.maximum(values, values.max() * 1e-6)
    return (vectors * values**exponent) @ vectors.T


def nested_whitening(cov: np.ndarray, power: float, widths: tuple[int, ...] = WIDTHS) -> np.ndarray:
    """A map ``x -> x @ M`` whose first w outputs depend only on the first w inputs, for every w.

    With ``L = M.T`` lower block-triangular over the widths (narrowest first), the metric a w-prefix
    sees is ``L_w.T L_w``. The narrowest block is the prefix's own symmetric whitening
    ``S_w^(-p/2)``; each wider block [B, A] matches the wider prefix's whitened metric
    ``G = S_w^(-p)`` on its new rows and columns (``A.T A = G_bb``, ``A.T B = G_ba``). For p = 1
    this is block-Cholesky whitening, exact at every width; below 1 the narrower block keeps its
    own metric and the wider one is matched where it can be."""
    order = sorted(widths)
    lower = np.zeros_like(cov)
    lower[: order[0], : order[0]] = _symmetric_power(cov[: order[0], : order[0]], -power / 2)
    for before, width in itertools.pairwise(order):
        metric = _symmetric_power(cov[:width, :width], -power)
        new = _symmetric_power(metric[before:, before:], 0.5)
        lower[before:width, before:width] = new
        lower[before:width, :before] = np.linalg.solve(new.T, metric[before:, :before])
    return lower.T


def candidates(fit: np.ndarray, powers: list[float]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name: (mean, map) with the output's row x becoming (x - mean) @ map."""
    dim = fit.shape[1]
    mean = fit.mean(axis=0)
    cov = np.cov(fit - mean, rowvar=False)
    values, vectors = np.linalg.eigh(cov)
    order = np.argsort(values)[::-1]
    values, vectors = values[order], vectors[:, order]
    out = {"identity": (np.zeros(dim), np.eye(dim)), "centred": (mean, np.eye(dim))}
    for p in powers:
        scaled = vectors * values ** (-p / 2)
        out[f"PCA basis, whitening {p:g}"] = (mean, scaled)
        if p:
            out[f"ZCA whitening {p:g} (distilembed whiten)"] = (mean, scaled @ vectors.T)
            if dim == max(WIDTHS):
                out[f"whitening {p:g} within each prefix"] = (mean, nested_whitening(cov, p))
    head = min(64, dim)
    inner_values, inner = np.linalg.eigh(cov[:head, :head])
    block = np.eye(dim)
    block[:head, :head] = inner[:, np.argsort(inner_values)[::-1]]
    out[f"PCA basis inside the first {head} coordinates"] = (mean, block)
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a student checkpoint (PyTorch)")
    parser.add_argument("--corpus", default=f"{data}/unlabeled/enwiki2015_1m_sentences.txt.gz")
    parser.add_argument("--skip-sentences", type=int, default=900_000)
    parser.add_argument("--fit-sentences", type=int, default=20_000)
    parser.add_argument("--powers", default="0,0.25,0.5")
    parser.add_argument("--sts-dir", default=f"{data}/sts")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    from sentence_transformers import SentenceTransformer

    from training.data.sts import distinct_sentences, load_stsb_split
    from training.data.text import read_sentences
    from training.evaluation import evaluate_vectors
    from training.whitening import dense_outputs

    splits = {split: load_stsb_split(args.sts_dir, split) for split in ("dev", "test")}
    sentences = distinct_sentences([p for pairs in splits.values() for p in pairs])
    model = SentenceTransformer(args.model, device="cpu")
    wiki = read_sentences(args.corpus, limit=args.fit_sentences, skip=args.skip_sentences)
    fit = dense_outputs(model, wiki, progress=True)
    sts = dense_outputs(model, sentences, progress=True)
    scores: dict[str, dict[str, list[float]]] = {}
    for name, (mean, mapping) in candidates(fit, [float(p) for p in args.powers.split(",")]).items():
        mapped = (sts - mean) @ mapping
        scores[name] = {}
        for split, pairs in splits.items():
            row = []
            for width in WIDTHS:
                cut = mapped[:, :width]
                row.append(
                    round(
                        evaluate_vectors(sentences, cut / np.linalg.norm(cut, axis=1, keepdims=True), pairs),
                        2,
                    )
                )
            scores[name][split] = row
    header = ["map", *(f"{s} {w}" for s in ("dev", "test") for w in WIDTHS), "test 64/128", "test 32/128"]
    rows = [
        [
            name,
            *s["dev"],
            *s["test"],
            f"{100 * s['test'][1] / s['test'][0]:.1f}%",
            f"{100 * s['test'][2] / s['test'][0]:.1f}%",
        ]
        for name, s in scores.items()
    ]
    print(markdown_table(header, rows))
    result = {
        "model": args.model,
        "spearman": scores,
        "widths": list(WIDTHS),
        "run": run_info("bench/prefix_rotation.py", argv),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Embedding quality: STS-B test at each Matryoshka width, and the out-of-domain proxies.

``dimensions``: what the API's ``dimensions: N`` costs: STS-B test of a bundle's vectors cut to their
first N dimensions and re-normalised. Block ``dimensions-<bundle folder name>``:

    python bench/quality.py dimensions --bundle models/default

``transfer``: proxies for the held-out STS suite from the data we have, one row per model: STS-B test
overall and per genre, SNLI graded (entailment 2, neutral 1, contradiction 0), Quora duplicate AP,
their mean and its difference to the first row's with a 95% paired bootstrap interval, and Quora
AP's alone (the fair one for a student fine-tuned on SNLI: --snli-trained NAME marks it). A move here
says a move there is likely, not its size; nothing is selected on them. Block ``transfer``:

    python bench/quality.py transfer --bundle default=models/default --snli-trained default \
        --teacher all-mpnet-base-v2

An earlier default: ``git worktree add /tmp/old REV``, then ``--bundle old=/tmp/old/models/default``.
Each writes its JSON under docs/results/ (--out) and rewrites its block of docs/results.md (--no-doc:
not); ``SUBCOMMAND --render-from JSON`` rewrites the block from an earlier run's JSON.
"""

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import harness as h
import numpy as np
from sklearn.metrics import average_precision_score

from training.data.pairs import read_quora_pairs, read_senteval_snli
from training.data.sts import STSPair, distinct_sentences, read_stsb_by_genre
from training.evaluation import evaluate_sts, pair_cosines, spearman_x100, vector_lookup

GRADES = {"entailment": 2.0, "neutral": 1.0, "contradiction": 0.0}
GENRES = ("main-captions", "main-news", "main-forums")  # the table's order; any other genre follows
Embed = Callable[[list[str], str], np.ndarray]  # (distinct sentences, set name) -> one row each
Cosines = dict[str, np.ndarray]  # a model's cosines of the SNLI and the Quora pairs


def dimensions_block(result: h.Result) -> str:
    return f"dimensions-{Path(result['bundle']).name}"


def render_dimensions(result: h.Result) -> str:
    """One row: STS-B test at each width, and the narrower widths as a share of the widest."""
    scores = {int(dim): value for dim, value in result["spearman"].items()}
    widest = max(scores)
    shares = [d for d in (64, 32) if d in scores and d < widest]
    header = ["bundle", "variant", *(str(d) for d in scores), *(f"{d} / {widest}" for d in shares)]
    row = [f"`{result['bundle']}`", result["variant"], *(f"{v:.2f}" for v in scores.values())]
    row += [f"{100 * scores[d] / scores[widest]:.1f}%" for d in shares]
    return h.markdown_table(header, [row], "ll" + "r" * (len(header) - 2))


def dimensions(args: argparse.Namespace, argv: list[str]) -> None:
    from export.runtime import Encoder

    pairs, encoder = h.stsb_test(args.data_dir), Encoder(args.bundle, args.variant)
    left, right = (encoder.encode([getattr(p, s) for p in pairs]) for s in ("sentence1", "sentence2"))
    gold, spearman = [p.score for p in pairs], {}
    for d in map(int, args.dims.split(",")):
        cosines = (h.unit_rows(left[:, :d]) * h.unit_rows(right[:, :d])).sum(axis=1)
        spearman[d] = round(spearman_x100(cosines, gold), 2)
    result = {"bundle": args.bundle, "variant": args.variant, "pairs": len(pairs), "spearman": spearman}
    result["run"] = h.run_info("bench/quality.py", argv)
    args.out = args.out or h.RESULTS / f"{dimensions_block(result)}.json"
    h.finish(args, result, dimensions_block(result), render_dimensions)


@dataclass(frozen=True)
class Sets:
    stsb: dict[str, list[STSPair]]  # by genre
    snli: list[STSPair]  # score: the grade
    quora: list[STSPair]  # score: 1 duplicate, 0 not

    def sizes(self) -> h.Result:
        sizes = {"stsb_test": {genre: len(pairs) for genre, pairs in self.stsb.items()}}
        sizes |= {"snli": len(self.snli), "quora": len(self.quora)}
        return sizes | {"quora_duplicates": int(sum(p.score for p in self.quora))}


def load_sets(data: str | Path) -> Sets:
    """STS-B test by genre, SNLI dev + test graded, Quora dev + test labelled."""
    stsb = read_stsb_by_genre(Path(data) / "sts" / "stsbenchmark" / "sts-test.csv")
    order = sorted(stsb, key=lambda genre: GENRES.index(genre) if genre in GENRES else len(GENRES))
    nli = Path(data) / "nli" / "snli_senteval"
    snli = [p for split in ("dev", "test") for p in read_senteval_snli(nli, split)]
    quora = [p for name in h.QUORA_FILES for p in read_quora_pairs(Path(data) / "quora" / name)]
    graded = [STSPair(p.premise, p.hypothesis, GRADES[p.label]) for p in snli]
    labelled = [STSPair(p.text1, p.text2, p.label) for p in quora]
    return Sets({genre: stsb[genre] for genre in order}, graded, labelled)


def cosine_ap(cosines: Sequence[float] | np.ndarray, labels: Sequence[float] | np.ndarray) -> float:
    """Average precision x 100 of ranking the pairs by cosine, the positives being label 1."""
    return 100 * float(average_precision_score(np.asarray(labels, dtype=int), np.asarray(cosines)))


def paired_delta(
    ref: Cosines, other: Cosines, sets: Sets, rounds: int, quora_only: bool = False
) -> tuple[float, float]:
    """95% interval of ``other``'s proxy mean (``quora_only``: Quora AP) minus ``ref``'s: a paired
    bootstrap, each round resampling the SNLI and the Quora pairs, the same pairs for both models."""
    grades, labels = np.array([p.score for p in sets.snli]), np.array([p.score for p in sets.quora])
    rng, deltas = np.random.default_rng(0), []
    for _ in range(rounds):
        i, j = rng.integers(0, len(grades), len(grades)), rng.integers(0, len(labels), len(labels))
        means = [cosine_ap(m["quora"][j], labels[j]) for m in (other, ref)]
        if not quora_only:
            snli = [spearman_x100(m["snli"][i], grades[i]) for m in (other, ref)]
            means = [(ap + rho) / 2 for ap, rho in zip(means, snli, strict=True)]
        deltas.append(means[0] - means[1])
    low, high = np.percentile(deltas, [2.5, 97.5])
    return round(float(low), 2), round(float(high), 2)


def score(embed: Embed, sets: Sets) -> h.Result:
    """One row of the table (and the SNLI and Quora cosines, for the bootstrap); each set's distinct
    sentences embedded once."""

    def lookup(pairs: Sequence[STSPair], name: str) -> Callable[[list[str]], np.ndarray]:
        sentences = distinct_sentences(pairs)
        return vector_lookup(sentences, embed(sentences, name))

    sts = evaluate_sts(lookup([p for g in sets.stsb.values() for p in g], "STS-B"), {"STS-B": sets.stsb})
    snli_cosines = pair_cosines(lookup(sets.snli, "SNLI"), sets.snli)
    quora_cosines = pair_cosines(lookup(sets.quora, "Quora"), sets.quora)
    snli = spearman_x100(snli_cosines, [p.score for p in sets.snli])
    quora = cosine_ap(quora_cosines, [p.score for p in sets.quora])
    genres = {genre: round(value, 2) for genre, value in sts["subsets"]["STS-B"].items()}
    row = {"cosines": {"snli": snli_cosines, "quora": quora_cosines}}
    row["stsb_test"] = round(sts["scores"]["STS-B"], 2)
    row |= {"genres": genres, "snli_graded": round(snli, 2), "quora_ap": round(quora, 2)}
    return row | {"proxy_mean": round((snli + quora) / 2, 2)}


def delta_cell(row: h.Result, key: str = "delta") -> str:
    interval = row.get(f"{key}_ci95")
    return "" if interval is None else f"{row[key]:+.2f} [{interval[0]:+.2f}, {interval[1]:+.2f}]"


def render_transfer(result: h.Result) -> str:
    genres, first = list(result["sets"]["stsb_test"]), result["rows"][0]["model"]
    header = ["model", "dim", "STS-B test", *(g.removeprefix("main-") for g in genres), "SNLI graded"]
    deltas = any(r.get("delta_ci95") for r in result["rows"])  # a one-model run has none
    header += ["Quora AP", "mean (SNLI, Quora AP)"]
    header += [f"mean - {first}'s [95% CI]", f"Quora AP - {first}'s [95% CI]"] if deltas else []
    rows = []
    for r in result["rows"]:
        name = f"{r['model']} (`{r['path']}`)" if r["kind"] == "bundle" else f"{r['model']} (teacher)"
        row = [name, r["dim"], f"{r['stsb_test']:.2f}", *(f"{r['genres'][g]:.2f}" for g in genres)]
        row += [f"{r['snli_graded']:.2f}" + (" (trained on)" if r.get("snli_trained") else "")]
        row += [f"{r['quora_ap']:.2f}", f"**{r['proxy_mean']:.2f}**"]
        rows.append([*row, delta_cell(r), delta_cell(r, "quora_delta")] if deltas else row)
    sets = result["sets"]
    sizes = ", ".join(f"{g.removeprefix('main-')} {n:,}" for g, n in sets["stsb_test"].items())
    note = (
        f"Pairs: STS-B test {sum(sets['stsb_test'].values()):,} ({sizes}); SNLI dev + test "
        f"{sets['snli']:,}; Quora dev + test {sets['quora']:,} ({sets['quora_duplicates']:,} duplicates). "
        f"Bundles {result['variant']}."
    )
    if deltas:
        note += (
            f" The intervals: a paired bootstrap over the SNLI and Quora pairs ({result['bootstrap']:,} "
            "rounds); the Quora one over the Quora pairs alone, the comparison that holds for a student "
            'fine-tuned on the SNLI triplets ("trained on").'
        )
    return f"{h.markdown_table(header, rows)}\n\n{note}"


def embedder(kind: str, name: str, path: str, args: argparse.Namespace) -> tuple[Embed, int]:
    if kind == "teacher":
        from training.teacher_targets import Teacher

        teacher = Teacher(path, device="cpu", batch_size=16)  # mpnet's fastest on a CPU
        return lambda sentences, _: teacher.targets(sentences)[0].astype(np.float32), teacher.dim
    from export.runtime import Encoder

    encoder = Encoder(path, args.variant)  # every core
    return lambda sentences, set_name: encoder.encode(sentences, progress=f"{name} {set_name}"), encoder.dim


def transfer(args: argparse.Namespace, argv: list[str]) -> None:
    models = [("bundle", name, path) for name, path in h.named_bundles(args.bundle).items()]
    models += [("teacher", name, name) for name in args.teacher]
    if not models or len({name for _, name, _ in models}) != len(models):
        raise SystemExit("error: name at least one --bundle NAME=DIR or --teacher NAME, each name once")
    sets = load_sets(args.data_dir)
    result = {"sets": sets.sizes(), "variant": args.variant, "bootstrap": args.bootstrap, "rows": []}
    result["run"] = h.run_info("bench/quality.py", argv)
    cosines: dict[str, dict[str, np.ndarray]] = {}
    for kind, name, path in models:
        embed, dim = embedder(kind, name, path, args)
        row = {"model": name, "kind": kind, "path": path, "dim": dim, **score(embed, sets)}
        row["snli_trained"] = name in args.snli_trained
        cosines[name] = row.pop("cosines")
        first = result["rows"][0] if result["rows"] else row
        row |= {"delta_vs": first["model"], "delta": round(row["proxy_mean"] - first["proxy_mean"], 2)}
        row["quora_delta"] = round(row["quora_ap"] - first["quora_ap"], 2)
        for key, quora_only in (("delta", False), ("quora_delta", True)):
            row[f"{key}_ci95"] = None
            if args.bootstrap and first is not row:
                ref = cosines[first["model"]]
                row[f"{key}_ci95"] = list(paired_delta(ref, cosines[name], sets, args.bootstrap, quora_only))
        result["rows"].append(row)
        h.write_json(args.out, result)  # after each model: a crash keeps the rest
    h.finish(args, result, "transfer", render_transfer)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cut = commands.add_parser("dimensions", help="STS-B test at each width of one bundle")
    cut.add_argument("--bundle", default="models/default")
    cut.add_argument("--dims", default="128,96,64,48,32,16")
    cut.add_argument("--out", type=Path, help="default: docs/results/dimensions-<bundle folder name>.json")
    proxies = commands.add_parser("transfer", help="out-of-domain proxies, one row per model")
    proxies.add_argument("--bundle", type=h.named_path, action="append", default=[], metavar="NAME=DIR")
    proxies.add_argument("--teacher", action="append", default=[], metavar="NAME")
    proxies.add_argument("--snli-trained", action="append", default=[], metavar="NAME", help="SNLI-tuned")
    proxies.add_argument("--bootstrap", type=int, default=1000, help="paired bootstrap rounds (0: none)")
    proxies.add_argument("--out", type=Path, default=h.RESULTS / "transfer.json")
    for sub in (cut, proxies):
        sub.add_argument("--variant", default="int8", choices=("int8", "fp32"), help="of the bundles")
        sub.add_argument("--data-dir", default=h.data_root())
        h.add_doc_args(sub)
    args = parser.parse_args(argv)
    if args.command == "dimensions" and not h.publish_saved(args, dimensions_block, render_dimensions):
        dimensions(args, argv)
    if args.command == "transfer" and not h.publish_saved(args, "transfer", render_transfer):
        transfer(args, argv)


if __name__ == "__main__":
    main()

"""Out-of-domain proxies, one row per model: STS-B test by genre, SNLI graded and Quora pair AP.

    python bench/transfer.py --bundle default=models/default --teacher all-mpnet-base-v2 \
        --out docs/results/transfer.json

These are proxies for the reviewers' held-out 7-set STS suite (STS12-16, STS-B, SICK-R), built only
from the data we have (DISTILEMBED_DATA_DIR). They are not that suite: a move here says a move there
is likely, not its size. Nothing should be selected or tuned on them. The columns (Spearman x 100 of
the cosine unless stated):

- STS-B test, overall and per genre (column 1 of sts-test.csv: captions, news, forums);
- SNLI graded: the label read as a grade (entailment 2, neutral 1, contradiction 0), the dev and test
  splits pooled; SICK-R's relatedness tracks entailment, and SICK is not here;
- Quora AP: average precision x 100 of the cosine for the duplicate label, the dev and test files
  pooled (MTEB's PairClassification cosine AP);
- mean (SNLI, Quora AP): the two proxies that are not STS-B;
- that mean minus the first row's, with a 95% paired bootstrap interval over the SNLI and Quora pairs
  (``--bootstrap`` rounds; the same resampled pairs for both models).

``--bundle NAME=git:REV`` measures ``models/default`` as committed at REV (earlier defaults).

Bundles (``--bundle NAME=DIR``) encode through ``export.runtime.Encoder``; teachers (``--teacher
NAME``, resolved as training resolves them, no Hub) through the training target cache
(training/teacher_targets.py), so a teacher encodes each set's sentences once per machine. Each
model encodes each distinct sentence of a set once. Rewrites the block ``transfer`` of
docs/results.md (``--no-doc``: not); ``--render-from JSON`` rewrites it from an earlier run's JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from sklearn.metrics import average_precision_score

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness import add_doc_args, markdown_table, named_path, publish, publish_saved, run_info  # noqa: E402

from training.data.pairs import NLIPair, Pair, read_quora_pairs, read_senteval_snli  # noqa: E402
from training.data.sts import STSPair, distinct_sentences, read_stsb_by_genre  # noqa: E402
from training.evaluation import (  # noqa: E402
    EncodeFn,
    evaluate_sts,
    pair_cosines,
    spearman_x100,
    vector_lookup,
)

BLOCK = "transfer"
GRADES = {"entailment": 2.0, "neutral": 1.0, "contradiction": 0.0}
GENRES = ("main-captions", "main-news", "main-forums")  # the table's order; any other genre follows
QUORA_FILES = ("quora_pairs_dev.tsv", "quora_pairs_test.tsv")
SNLI_SPLITS = ("dev", "test")
Embed = Callable[[list[str], str], np.ndarray]  # (distinct sentences, set name) -> one row each


@dataclass(frozen=True)
class Sets:
    stsb: dict[str, list[STSPair]]  # by genre
    snli: list[STSPair]  # score: the grade
    quora: list[STSPair]  # score: 1 duplicate, 0 not

    def sizes(self) -> dict[str, Any]:
        return {
            "stsb_test": {genre: len(pairs) for genre, pairs in self.stsb.items()},
            "snli": len(self.snli),
            "quora": len(self.quora),
            "quora_duplicates": int(sum(p.score for p in self.quora)),
        }


def snli_graded(pairs: Sequence[NLIPair]) -> list[STSPair]:
    """SNLI pairs with the label as a grade: entailment 2, neutral 1, contradiction 0."""
    return [STSPair(p.premise, p.hypothesis, GRADES[p.label]) for p in pairs]


def quora_scored(pairs: Sequence[Pair]) -> list[STSPair]:
    return [STSPair(p.text1, p.text2, p.label) for p in pairs]


def cosine_ap(cosines: Sequence[float] | np.ndarray, labels: Sequence[float]) -> float:
    """Average precision x 100 of ranking the pairs by cosine, the positives being label 1."""
    return 100 * float(average_precision_score(np.asarray(labels, dtype=int), np.asarray(cosines)))


def proxy_mean(
    snli_cosines: np.ndarray, grades: np.ndarray, quora_cosines: np.ndarray, labels: np.ndarray
) -> float:
    return (spearman_x100(snli_cosines, grades) + cosine_ap(quora_cosines, labels)) / 2


def paired_delta(
    ref: dict[str, np.ndarray],
    other: dict[str, np.ndarray],
    sets: Sets,
    rounds: int,
    seed: int = 0,
    quora_only: bool = False,
) -> tuple[float, float]:
    """95% interval of ``other``'s proxy mean (or, ``quora_only``, Quora AP) minus ``ref``'s: a
    paired bootstrap, each round resampling the SNLI and the Quora pairs with replacement, the same
    pairs for both models."""
    grades = np.array([p.score for p in sets.snli])
    labels = np.array([p.score for p in sets.quora])
    rng = np.random.default_rng(seed)
    deltas = []
    for _ in range(rounds):
        i = rng.integers(0, len(grades), len(grades))
        j = rng.integers(0, len(labels), len(labels))
        if quora_only:
            mean = [cosine_ap(m["quora"][j], labels[j]) for m in (other, ref)]
        else:
            mean = [proxy_mean(m["snli"][i], grades[i], m["quora"][j], labels[j]) for m in (other, ref)]
        deltas.append(mean[0] - mean[1])
    low, high = np.percentile(deltas, [2.5, 97.5])
    return round(float(low), 2), round(float(high), 2)


def load_sets(data_root: str, limit: int | None = None) -> Sets:
    """The three sets; ``limit``: the first N pairs of each (of each genre for STS-B), a smoke."""
    stsb = read_stsb_by_genre(f"{data_root}/sts/stsbenchmark/sts-test.csv")
    snli = [p for split in SNLI_SPLITS for p in read_senteval_snli(f"{data_root}/nli/snli_senteval", split)]
    quora = [p for name in QUORA_FILES for p in read_quora_pairs(f"{data_root}/quora/{name}")]
    order = sorted(stsb, key=lambda g: GENRES.index(g) if g in GENRES else len(GENRES))
    return Sets(
        {genre: stsb[genre][:limit] for genre in order},
        snli_graded(snli)[:limit],
        quora_scored(quora)[:limit],
    )


def lookup(embed: Embed, pairs: Sequence[STSPair], name: str) -> EncodeFn:
    """An encode function over the vectors of ``pairs``' distinct sentences, embedded once."""
    sentences = distinct_sentences(pairs)
    return vector_lookup(sentences, embed(sentences, name))


def score(embed: Embed, sets: Sets) -> dict[str, Any]:
    """One row of the table, through the repo's STS evaluation (training/evaluation.py)."""
    sts = evaluate_sts(
        lookup(embed, [p for g in sets.stsb.values() for p in g], "STS-B"), {"STS-B": sets.stsb}
    )
    snli_cosines = pair_cosines(lookup(embed, sets.snli, "SNLI"), sets.snli)
    snli = spearman_x100(snli_cosines, [p.score for p in sets.snli])
    cosines = pair_cosines(lookup(embed, sets.quora, "Quora"), sets.quora)
    quora = cosine_ap(cosines, [p.score for p in sets.quora])
    return {
        "cosines": {"snli": snli_cosines, "quora": cosines},
        "stsb_test": round(sts["scores"]["STS-B"], 2),
        "genres": {genre: round(value, 2) for genre, value in sts["subsets"]["STS-B"].items()},
        "snli_graded": round(snli, 2),
        "quora_ap": round(quora, 2),
        "proxy_mean": round((snli + quora) / 2, 2),
    }


def committed_default(rev: str) -> str:
    """``models/default`` as committed at git revision ``rev``, extracted once under runs/defaults/REV
    (a temp folder, then a rename)."""
    out = ROOT / "runs" / "defaults" / rev
    if not (out / "models" / "default" / "manifest.json").exists():
        tmp = out.with_name(f"{rev}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        git = ["git", "-C", str(ROOT), "archive", rev, "models/default"]
        archive = subprocess.run(git, capture_output=True, check=False)
        if archive.returncode:
            raise SystemExit(f"git:{rev}: {archive.stderr.decode().strip().splitlines()[0]}")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return str(out / "models" / "default")


def bundle_embed(name: str, path: str, variant: str, threads: int | None) -> tuple[Embed, int]:
    from export.runtime import Encoder

    if path.startswith("git:"):
        path = committed_default(path.removeprefix("git:"))
    encoder = Encoder(path, variant, threads=threads)  # type: ignore[arg-type]  # "int8" | "fp32"
    return lambda sentences, set_name: encoder.encode(sentences, progress=f"{name} {set_name}"), encoder.dim


def teacher_embed(name: str, batch_size: int) -> tuple[Embed, int]:
    from training.teacher_targets import Teacher

    teacher = Teacher(name, device="cpu", batch_size=batch_size)
    return lambda sentences, _: teacher.targets(sentences)[0].astype(np.float32), teacher.dim


def finetune_data(record: dict[str, Any]) -> list[str]:
    """The data of the fine-tunings a provenance.json or checkpoint manifest records: its own, and
    a model soup's ingredients' (listed in a provenance, or read from the soup's chosen checkpoints)."""
    data = [str((record.get("finetune") or {}).get("data", ""))]
    soup = record.get("average") or {}
    data += [str(part.get("data", "")) for part in soup.get("ingredients", [])]
    for chosen in soup.get("chosen", []):
        with contextlib.suppress(OSError, ValueError):
            data += finetune_data(json.loads((Path(chosen) / "manifest.json").read_text()))
    return data


def snli_trained(path: str) -> bool:
    """Whether a bundle's student was fine-tuned on SNLI triplets (``distilembed finetune``, alone or
    in a soup), which puts the SNLI column in its training domain: read from ``models/default``'s
    provenance.json, or from the manifest of the checkpoint a bundle was exported from, where either
    is at hand."""
    folder = Path(path)
    sources = [folder / "provenance.json"]
    with contextlib.suppress(OSError, ValueError):
        checkpoint = json.loads((folder / "manifest.json").read_text())["source"]["checkpoint"]
        sources.append(Path(checkpoint) / "manifest.json")
    for source in sources:
        with contextlib.suppress(OSError, ValueError):
            if any("snli" in data.lower() for data in finetune_data(json.loads(source.read_text()))):
                return True
    return False


def short_genre(genre: str) -> str:
    return genre.removeprefix("main-")


def delta_cell(row: dict[str, Any], key: str = "delta") -> str:
    if row.get(f"{key}_ci95") is None:
        return ""
    low, high = row[f"{key}_ci95"]
    return f"{row[key]:+.2f} [{low:+.2f}, {high:+.2f}]"


def snli_cell(row: dict[str, Any]) -> str:
    return f"{row['snli_graded']:.2f}" + (" (trained on)" if row.get("snli_trained") else "")


def render(result: dict[str, Any]) -> str:
    genres = list(result["sets"]["stsb_test"])
    header = ["model", "dim", "STS-B test", *(short_genre(g) for g in genres)]
    first = result["rows"][0]["model"]
    header += ["SNLI graded", "Quora AP", "mean (SNLI, Quora AP)", f"mean - {first}'s [95% CI]"]
    header += [f"Quora AP - {first}'s [95% CI]"]
    rows = [
        [
            f"{r['model']} (`{r['path']}`)" if r["kind"] == "bundle" else f"{r['model']} (teacher)",
            r["dim"],
            f"{r['stsb_test']:.2f}",
            *(f"{r['genres'][g]:.2f}" for g in genres),
            snli_cell(r),
            f"{r['quora_ap']:.2f}",
            f"**{r['proxy_mean']:.2f}**",
            delta_cell(r),
            delta_cell(r, "quora_delta"),
        ]
        for r in result["rows"]
    ]
    sets = result["sets"]
    sizes = ", ".join(f"{short_genre(g)} {n:,}" for g, n in sets["stsb_test"].items())
    note = (
        f"Pairs: STS-B test {sum(sets['stsb_test'].values()):,} ({sizes}); SNLI dev + test "
        f"{sets['snli']:,}; Quora dev + test {sets['quora']:,} ({sets['quora_duplicates']:,} duplicates). "
        f"Bundles {result['variant']}. The last column: a paired bootstrap over the SNLI and Quora "
        f"pairs ({result.get('bootstrap', 0):,} rounds); the Quora one over the Quora pairs alone, "
        'the comparison that holds for a student fine-tuned on the SNLI triplets ("trained on").'
    )
    return f"{markdown_table(header, rows)}\n\n{note}"


def console_table(result: dict[str, Any]) -> Table:
    genres = list(result["sets"]["stsb_test"])
    columns = [
        "model",
        "dim",
        "STS-B",
        *map(short_genre, genres),
        "SNLI",
        "Quora AP",
        "mean",
        "delta [95% CI]",
        "Quora AP delta",
    ]
    columns.append("seconds")
    table = Table(title="Out-of-domain proxies (Spearman x 100; Quora: AP x 100)")
    for column in columns:
        table.add_column(column, justify="left" if column == "model" else "right", no_wrap=True)
    for r in result["rows"]:
        cells = [r["stsb_test"], *(r["genres"][g] for g in genres)]
        table.add_row(
            r["model"],
            str(r["dim"]),
            *(f"{c:.2f}" for c in cells),
            snli_cell(r),
            f"{r['quora_ap']:.2f}",
            f"{r['proxy_mean']:.2f}",
            delta_cell(r),
            delta_cell(r, "quora_delta"),
            f"{r['seconds']:.0f}",
        )
    return table


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    data = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bundle",
        type=named_path,
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a bundle directory, or git:REV for models/default as committed at REV",
    )
    parser.add_argument("--teacher", action="append", default=[], metavar="NAME")
    parser.add_argument("--variant", default="int8", choices=("int8", "fp32"), help="of every bundle")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="of each bundle's encoder")
    parser.add_argument("--teacher-batch-size", type=int, default=16, help="16 is fastest for mpnet on CPU")
    parser.add_argument("--data-dir", default=data)
    parser.add_argument("--limit", type=int, help="the first N pairs of each set (a smoke run)")
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        help="paired bootstrap rounds for each row's difference (0: none)",
    )
    parser.add_argument("--out", default="docs/results/transfer.json")
    add_doc_args(parser)
    args = parser.parse_args(argv)
    if publish_saved(args, BLOCK, render):
        return
    names = [name for name, _ in args.bundle] + args.teacher
    if not names:
        parser.error("name at least one --bundle NAME=DIR or --teacher NAME")
    if len(set(names)) != len(names):
        parser.error(f"model names repeat: {names}")

    sets = load_sets(args.data_dir, args.limit)
    result: dict[str, Any] = {"sets": sets.sizes(), "variant": args.variant, "limit": args.limit}
    result.update(bootstrap=args.bootstrap, rows=[])
    result["run"] = run_info("bench/transfer.py", argv)
    models = [("bundle", name, path) for name, path in args.bundle] + [
        ("teacher", n, n) for n in args.teacher
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cosines: dict[str, dict[str, np.ndarray]] = {}
    for kind, name, path in models:
        start = time.perf_counter()
        if kind == "bundle":
            embed, dim = bundle_embed(name, path, args.variant, args.threads)
        else:
            embed, dim = teacher_embed(path, args.teacher_batch_size)
        row = {"model": name, "kind": kind, "path": path, "dim": dim, **score(embed, sets)}
        row["snli_trained"] = kind == "bundle" and snli_trained(path)
        cosines[name] = row.pop("cosines")
        first = result["rows"][0] if result["rows"] else row
        row["delta_vs"] = first["model"]
        row["delta"] = round(row["proxy_mean"] - first["proxy_mean"], 2)
        row["quora_delta"] = round(row["quora_ap"] - first["quora_ap"], 2)
        ref, compared = cosines[first["model"]], bool(args.bootstrap) and first is not row
        for key, quora_only in (("delta", False), ("quora_delta", True)):
            interval = (
                paired_delta(ref, cosines[name], sets, args.bootstrap, quora_only=quora_only)
                if compared
                else None
            )
            row[f"{key}_ci95"] = None if interval is None else list(interval)
        row["seconds"] = round(time.perf_counter() - start, 1)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps(result, indent=2) + "\n")  # after each model: a crash keeps the rest
    Console(width=None if sys.stdout.isatty() else 160).print(console_table(result))
    print(f"wrote {out}")
    publish(args, result, out, BLOCK, render)


if __name__ == "__main__":
    main()

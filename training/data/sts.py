"""Readers for the STS benchmarks (STS12-16, STS-B, SICK-R) in SentEval's on-disk layouts."""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from distilembed.errors import UserError
from training.data.text import RowLog

log = logging.getLogger(__name__)

STSB_FIELDS = 7
SEARCH_DEPTH = 3

# SentEval's subsets per year (STS13 has no SMT: its licence kept it out of SentEval).
SENTEVAL_SUBSETS: dict[str, tuple[str, ...]] = {
    "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "STS13": ("FNWN", "headlines", "OnWN"),
    "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
# The papers' table order.
STS_SET_ORDER = ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R")
SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class STSPair:
    sentence1: str
    sentence2: str
    score: float


# A set is its pairs, or (STS12-16) its subsets' pairs by subset name.
STSSets = dict[str, list[STSPair] | dict[str, list[STSPair]]]


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline); a missing file is a UserError."""
    if not path.is_file():
        raise UserError(f"STS file not found: {path}")
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        for lineno, line in enumerate(handle, 1):
            yield lineno, line.rstrip("\r\n")


def _score(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def _nonempty(pairs: list[STSPair], path: Path) -> list[STSPair]:
    if not pairs:
        raise UserError(f"no usable STS pairs in {path}")
    return pairs


def _tab_pairs(
    path: Path,
    lines: Iterable[tuple[int, str]],
    want: int,
    columns: tuple[int, int, int],
    exact: bool = False,
) -> list[tuple[list[str], STSPair]]:
    """(fields, pair) per usable tab-separated line, ``columns`` the two sentences' and the score's;
    a line with fewer than ``want`` fields (with ``exact``, other than ``want``) or a bad score is
    skipped with a warning."""
    skips, rows = RowLog(path), []
    first, second, gold = columns
    for lineno, line in lines:
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < want or (exact and len(fields) != want):
            skips.skip(lineno, f"{len(fields)} fields, want {want}")
            continue
        score = _score(fields[gold])
        if score is None:
            skips.skip(lineno, f"bad score {fields[gold]!r}")
            continue
        rows.append((fields, STSPair(fields[first].strip(), fields[second].strip(), score)))
    skips.finish()
    _nonempty([pair for _, pair in rows], path)
    return rows


def _stsb_rows(path: str | Path) -> list[tuple[str, STSPair]]:
    """(genre, pair) per usable line of an STS Benchmark csv, in file order."""
    rows = _tab_pairs(Path(path), _lines(Path(path)), STSB_FIELDS, (5, 6, 4))
    return [(fields[0].strip(), pair) for fields, pair in rows]


def read_stsb(path: str | Path) -> list[STSPair]:
    """STS Benchmark csv, SentEval-processed or original release (extra trailing columns ignored)."""
    return [pair for _, pair in _stsb_rows(path)]


SCORED_COLUMNS = ("sentence1", "sentence2", "score")


def read_scored_pairs(path: str | Path) -> list[STSPair]:
    """Labelled pairs of any scale: an STS Benchmark csv, or a csv / tsv whose header names the
    columns ``sentence1``, ``sentence2`` and ``score`` (sentence-transformers' STS datasets' names;
    other columns are ignored). Rows without a numeric score are skipped with a warning."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"STS file not found: {path}")
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        first = handle.readline().rstrip("\r\n")
        if first.count("\t") >= STSB_FIELDS - 1 and not set(SCORED_COLUMNS) <= set(first.split("\t")):
            return read_stsb(path)
        handle.seek(0)
        reader = csv.DictReader(handle, delimiter="\t" if "\t" in first else ",")
        missing = [c for c in SCORED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise UserError(
                f"{path}: want an STS Benchmark csv or a header with {', '.join(SCORED_COLUMNS)} "
                f"(missing: {', '.join(missing)})"
            )
        skips, pairs = RowLog(path), []
        for lineno, row in enumerate(reader, 2):
            score = _score(row["score"] or "")
            if score is None or not row["sentence1"] or not row["sentence2"]:
                skips.skip(lineno, "no score or an empty sentence")
                continue
            pairs.append(STSPair(row["sentence1"].strip(), row["sentence2"].strip(), score))
    skips.finish()
    return _nonempty(pairs, path)


def read_stsb_by_genre(path: str | Path) -> dict[str, list[STSPair]]:
    """:func:`read_stsb`'s pairs split by the genre column (main-captions, main-news, main-forums),
    genres in order of first appearance, pairs in file order."""
    genres: dict[str, list[STSPair]] = {}
    for genre, pair in _stsb_rows(path):
        genres.setdefault(genre, []).append(pair)
    return genres


def _read_senteval_subset(directory: Path, subset: str) -> list[STSPair]:
    inputs, gold_path = directory / f"STS.input.{subset}.txt", directory / f"STS.gs.{subset}.txt"
    sentences, gold = list(_lines(inputs)), list(_lines(gold_path))
    if len(sentences) != len(gold):
        raise UserError(f"{inputs} has {len(sentences)} lines but {gold_path} has {len(gold)}")
    # An unrated pair (blank gold) is dropped, as SentEval does. Each line gets its gold score in front;
    # raw STS16 lines carry two source columns after the sentences.
    rated = [
        (n, f"{score}\t{line}")
        for (n, line), (_, score) in zip(sentences, gold, strict=True)
        if score.strip()
    ]
    return [pair for _, pair in _tab_pairs(inputs, rated, 3, (1, 2, 0))]


def read_senteval_sts(
    directory: str | Path, subsets: Sequence[str] | None = None
) -> dict[str, list[STSPair]]:
    """One SentEval STS year folder: ``STS.input.<subset>.txt`` + ``STS.gs.<subset>.txt``. ``subsets``
    defaults to every ``STS.input.*.txt`` in the folder, in name order."""
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"STS folder not found: {directory}")
    if subsets is None:
        prefix, suffix = "STS.input.", ".txt"
        subsets = sorted(p.name[len(prefix) : -len(suffix)] for p in directory.glob(f"{prefix}*{suffix}"))
    if not subsets:
        raise UserError(f"no STS.input.*.txt files in {directory}")
    return {subset: _read_senteval_subset(directory, subset) for subset in subsets}


def read_sick(path: str | Path) -> list[STSPair]:
    """SICK with a header row (``SICK_test_annotated.txt`` or ``SICK.txt``): relatedness 1-5."""
    path = Path(path)
    lines = _lines(path)
    header = next(lines, (0, ""))[1].split("\t")
    wanted = ("sentence_A", "sentence_B", "relatedness_score")
    if not all(name in header for name in wanted):
        raise UserError(f"not a SICK file (header lacks {', '.join(wanted)}): {path}")
    columns = (header.index(wanted[0]), header.index(wanted[1]), header.index(wanted[2]))
    return [pair for _, pair in _tab_pairs(path, lines, len(header), columns, exact=True)]


def _walk(root: Path, depth: int) -> Iterator[Path]:
    """``root`` and its sub-folders down to ``depth`` levels, breadth first, names sorted."""
    level = [root]
    for _ in range(depth + 1):
        following: list[Path] = []
        for folder in level:
            yield folder
            try:
                children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
            except OSError:
                continue
            following.extend(children)
        level = following


def _stsb_rank(path: Path) -> tuple[int, int]:
    # SentEval's processed file first; the original release only when it is all there is.
    return (path.parent.name.lower() == "original", len(path.parts))


def locate_sts_sets(sts_dir: str | Path) -> dict[str, Path]:
    """Find the known STS sets under ``sts_dir`` (a few levels deep), in table order. Values are the STS12-16
    year folders, the STS-B test csv and the SICK test file."""
    root = Path(sts_dir).expanduser()
    if not root.is_dir():
        raise UserError(f"STS directory not found: {root}")
    years = {f"{name}-en-test".lower(): name for name in SENTEVAL_SUBSETS}
    found: dict[str, Path] = {}
    stsb: list[Path] = []
    for folder in _walk(root, SEARCH_DEPTH):
        name = years.get(folder.name.lower())
        if name and name not in found and any(folder.glob("STS.input.*.txt")):
            found[name] = folder
        if (folder / "sts-test.csv").is_file():
            stsb.append(folder / "sts-test.csv")
        if "SICK-R" not in found and (folder / "SICK_test_annotated.txt").is_file():
            found["SICK-R"] = folder / "SICK_test_annotated.txt"
    if stsb:
        found["STS-B"] = min(stsb, key=_stsb_rank)
    if not found:
        names = [f"{n}-en-test/" for n in SENTEVAL_SUBSETS] + ["sts-test.csv", "SICK_test_annotated.txt"]
        looked = ", ".join(names)
        raise UserError(f"no known STS set in {root} (looked for {looked})")
    return {name: found[name] for name in STS_SET_ORDER if name in found}


def load_sts_set(name: str, path: Path) -> list[STSPair] | dict[str, list[STSPair]]:
    """Read one set found by :func:`locate_sts_sets`; a year folder keeps SentEval's subsets."""
    if name in SENTEVAL_SUBSETS:
        present = [s for s in SENTEVAL_SUBSETS[name] if (path / f"STS.input.{s}.txt").is_file()]
        missing = sorted(set(SENTEVAL_SUBSETS[name]) - set(present))
        if missing:
            log.warning("%s: subsets missing from %s, not comparable to SentEval: %s", name, path, missing)
        if not present:
            raise UserError(f"{path} holds none of SentEval's {name} subsets")
        return read_senteval_sts(path, present)
    if name == "STS-B":
        return read_stsb(path)
    if name == "SICK-R":
        return read_sick(path)
    raise UserError(f"unknown STS set {name!r} (known: {', '.join(STS_SET_ORDER)})")


def find_sts_sets(sts_dir: str | Path) -> STSSets:
    """Every known STS set under ``sts_dir``, read, in the papers' order (STS12 .. SICK-R)."""
    return {name: load_sts_set(name, path) for name, path in locate_sts_sets(sts_dir).items()}


def load_stsb_split(sts_dir_or_file: str | Path, split: str) -> list[STSPair]:
    """STS-B ``split`` given the csv itself, the stsbenchmark folder or a parent of it."""
    if split not in SPLITS:
        raise UserError(f"unknown STS-B split {split!r} (want one of {', '.join(SPLITS)})")
    given = Path(sts_dir_or_file).expanduser()
    if given.is_file():
        return read_stsb(given)
    if not given.is_dir():
        hint = "pass --sts-dir or set DISTILEMBED_DATA_DIR"
        raise UserError(f"STS-B file or folder not found: {given} ({hint})")
    name = f"sts-{split}.csv"
    candidates = [folder / name for folder in _walk(given, SEARCH_DEPTH) if (folder / name).is_file()]
    if not candidates:
        raise UserError(f"no {name} under {given}")
    return read_stsb(min(candidates, key=_stsb_rank))


def distinct_sentences(pairs: Sequence[STSPair]) -> list[str]:
    """Every sentence of ``pairs`` once, sorted (what a teacher or an encoder has to embed)."""
    return sorted({p.sentence1 for p in pairs} | {p.sentence2 for p in pairs})

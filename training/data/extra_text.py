"""More unlabeled text for distillation, and the evaluation text kept out of it.

``--extra-text SOURCE`` adds every distinct sentence of a source to the training sentences (a
distillation only needs the teacher's vectors, so any sentence is a training example):

* a plain-text corpus (``.txt`` / ``.txt.gz``, one sentence per line),
* an STS Benchmark csv (both sentences of every pair; the scores are not used),
* an NLI triplets csv with a header (``sent0,sent1,hard_neg``: every column),
* a SentEval SNLI directory (every line of its ``s1.*`` and ``s2.*`` files).

``--exclude-text SOURCE`` (the same formats, plus a Quora pairs ``.tsv``) removes from all the
training text every sentence that equals, after :func:`normalise`, a sentence of the source: STS-B
test shares 256 such sentences with STS-B train and 32 with SNLI ("a man is driving a car"), and a
student must not see the text it is scored on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from distilembed.errors import UserError
from distilembed.paths import resolve_data_path
from training.data.pairs import Triplet, read_nli_triplets, read_quora_pairs, read_senteval_snli
from training.data.sts import distinct_sentences, read_stsb
from training.data.text import iter_sentences

_WORD = re.compile(r"\w+")


def normalise(text: str) -> str:
    """Lowercased words joined by one space: what makes two copies of a sentence the same across
    tokenisations (STS-B's SentEval copy is Moses-tokenised and lowercased, SNLI's is tokenised)."""
    return " ".join(_WORD.findall(text.lower()))


def _senteval_sentences(directory: Path) -> list[str]:
    """Premises and hypotheses of every split (``s1.SPLIT``) of a SentEval SNLI directory."""
    splits = sorted(p.name.split(".", 1)[1] for p in directory.glob("s1.*"))
    if not splits:
        raise UserError(f"no SentEval s1.* / s2.* files in {directory}")
    pairs = [pair for split in splits for pair in read_senteval_snli(directory, split)]
    return [text for pair in pairs for text in (pair.premise, pair.hypothesis)]


def _csv_sentences(path: Path) -> list[str]:
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        first = handle.readline()
    if first.count("\t") >= 6:  # STS Benchmark: 7 tab-separated fields, no header
        return distinct_sentences(read_stsb(path))
    if not first.startswith("sent0"):
        raise UserError(f"unknown csv (want STS Benchmark, or NLI triplets with a sent0 header): {path}")
    return [text for t in read_nli_triplets(path) for text in (t.anchor, t.positive, t.negative)]


def source_sentences(source: str, data_dir: str | None = None) -> list[str]:
    """Every distinct sentence of one source, sorted (so a run's text does not depend on file order)."""
    path = resolve_data_path(source, data_dir)
    if path.is_dir():
        found = _senteval_sentences(path)
    elif not path.is_file():
        raise UserError(f"text source not found: {path}")
    elif path.suffix == ".csv":
        found = _csv_sentences(path)
    elif path.suffix == ".tsv":
        found = [text for pair in read_quora_pairs(path) for text in (pair.text1, pair.text2)]
    else:
        found = list(iter_sentences(path))
    out = sorted(set(found))
    if not out:
        raise UserError(f"no sentences in {path}")
    return out


def excluded_keys(sources: Sequence[str], data_dir: str | None = None) -> set[str]:
    """The normalised sentences of every ``--exclude-text`` source."""
    return {normalise(text) for source in sources for text in source_sentences(source, data_dir)}


def drop_excluded(texts: Sequence[str], excluded: set[str]) -> tuple[list[str], int]:
    """``texts`` without the excluded sentences, and how many were dropped."""
    if not excluded:  # no --exclude-text: nothing to normalise
        return list(texts), 0
    kept = [text for text in texts if normalise(text) not in excluded]
    return kept, len(texts) - len(kept)


def drop_excluded_triplets(triplets: Sequence[Triplet], excluded: set[str]) -> tuple[list[Triplet], int]:
    """``triplets`` without any that has an excluded sentence in any of its three places."""
    if not excluded:
        return list(triplets), 0
    kept = [
        t
        for t in triplets
        if not {normalise(t.anchor), normalise(t.positive), normalise(t.negative)} & excluded
    ]
    return kept, len(triplets) - len(kept)

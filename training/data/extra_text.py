"""Which text a training run distils on: the corpus slice, the PCA-fit sentences, augmented copies
and ``--extra-text`` sources, less every ``--exclude-text`` sentence.

``--extra-text SOURCE`` adds every distinct sentence of a source (a distillation only needs the
teacher's vectors, so any sentence is a training example): a plain-text corpus (``.txt(.gz)``), an
STS Benchmark csv (both sentences of every pair), an NLI triplets csv with a ``sent0,sent1,hard_neg``
header (every column) or a SentEval SNLI directory (its ``s1.*`` and ``s2.*`` files).

``--exclude-text SOURCE`` (the same formats, plus a Quora pairs ``.tsv``) removes from all the
training text every sentence that equals, after :func:`normalise`, a sentence of the source: STS-B
test shares 256 such sentences with STS-B train and 32 with SNLI ("a man is driving a car"), and a
student must not see the text it is scored on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from distilembed.errors import UserError
from distilembed.paths import resolve_data_path
from training.augment import augment_corpus
from training.config import TrainConfig
from training.data.pairs import read_nli_triplets, read_quora_pairs, read_senteval_snli
from training.data.sts import distinct_sentences, read_stsb
from training.data.text import iter_sentences, read_sentences

_WORD = re.compile(r"\w+")
Row = TypeVar("Row")


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
    return [text for triplet in read_nli_triplets(path) for text in triplet.texts()]


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


def drop_excluded(
    rows: Sequence[Row], excluded: set[str], texts: Callable[[Row], Iterable[str]] | None = None
) -> tuple[list[Row], int]:
    """``rows`` (sentences, or records whose ``texts`` are sentences) without any that holds an excluded
    sentence, and how many were dropped."""
    if not excluded:  # no --exclude-text: nothing to normalise
        return list(rows), 0
    sentences = texts or (lambda row: (row,))
    kept = [row for row in rows if not any(normalise(text) in excluded for text in sentences(row))]
    return kept, len(rows) - len(kept)


def augmented_sets(texts: list[str], cfg: TrainConfig) -> list[list[str]]:
    """One augmented copy of ``texts`` per ``--augment`` method, in the order given."""
    return [
        augment_corpus(texts, [method], seed=cfg.seed, synonym_p=cfg.synonym_p, deletion_p=cfg.deletion_p)
        for method in cfg.augment
    ]


@dataclass
class TrainingText:
    """The text a run distils on, less the ``--exclude-text`` sentences."""

    corpus: list[str]  # ``n_sentences`` of the corpus after its first ``skip_sentences``
    corpus_dropped: int
    pca_fit: list[str]  # what the PCA fits on (all of it: fitting is not training)
    extra: dict[str, list[str]]  # each ``--extra-text`` source
    pca_train: list[str]  # the PCA-fit sentences trained on (``--train-on-pca-texts``)
    excluded: int  # distinct normalised sentences kept out

    def more_sets(self) -> list[list[str]]:
        """The sets trained on besides the corpus and its augmentations, in training order."""
        return [*self.extra.values(), *([self.pca_train] if self.pca_train else [])]


def training_text(cfg: TrainConfig, data_dir: str | None) -> TrainingText:
    excluded = excluded_keys(cfg.exclude_text, data_dir)
    corpus = read_sentences(
        resolve_data_path(cfg.corpus, data_dir), limit=cfg.n_sentences, skip=cfg.skip_sentences
    )
    kept, dropped = drop_excluded(corpus, excluded)
    pca_fit = pca_fit_texts(cfg, data_dir)
    return TrainingText(
        corpus=kept,
        corpus_dropped=dropped,
        pca_fit=pca_fit,
        extra={s: drop_excluded(source_sentences(s, data_dir), excluded)[0] for s in cfg.extra_text},
        pca_train=drop_excluded(pca_fit, excluded)[0] if cfg.train_on_pca_texts else [],
        excluded=len(excluded),
    )


def pca_fit_texts(cfg: TrainConfig, data_dir: str | None) -> list[str]:
    """The unique sentences (sorted) of ``cfg.pca_fit``; empty when the PCA fits on the corpus."""
    if cfg.pca_fit == "corpus":
        return []
    path = resolve_data_path(cfg.pca_fit, data_dir)
    if not path.exists():
        raise UserError(f"--pca-fit file not found: {path}")
    return source_sentences(str(path))

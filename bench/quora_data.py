"""The Quora semantic-retrieval set of HPD section 4.2, shared by bench/quora_sr.py and GPU jobs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from training.data.pairs import read_quora_pairs
from training.data.text import content_hash

QUORA_FILES = ("quora_pairs_dev.tsv", "quora_pairs_test.tsv")


@dataclass(frozen=True)
class QuoraRetrieval:
    corpus: list[str]  # every distinct question of both files, sorted
    queries: list[int]  # corpus index of question1 of each duplicate pair
    relevant: list[int]  # corpus index of its question2

    @property
    def corpus_sha256(self) -> str:
        return content_hash(self.corpus)


def add_distractors(data: QuoraRetrieval, distractors: list[str]) -> tuple[QuoraRetrieval, list[int]]:
    """The corpus grown by ``distractors`` (after the questions, so query ids stay), skipping any that
    is a question or repeats an earlier one; also the positions in ``distractors`` that were kept."""
    seen = set(data.corpus)
    kept: list[int] = []
    for i, text in enumerate(distractors):
        if text not in seen:
            seen.add(text)
            kept.append(i)
    corpus = data.corpus + [distractors[i] for i in kept]
    return QuoraRetrieval(corpus, data.queries, data.relevant), kept


def load_quora_retrieval(quora_dir: str | Path) -> QuoraRetrieval:
    pairs = [p for name in QUORA_FILES for p in read_quora_pairs(Path(quora_dir) / name)]
    corpus = sorted({p.text1 for p in pairs} | {p.text2 for p in pairs})
    row = {text: i for i, text in enumerate(corpus)}
    dups = [p for p in pairs if p.label == 1.0 and p.text1 != p.text2]
    return QuoraRetrieval(corpus, [row[p.text1] for p in dups], [row[p.text2] for p in dups])

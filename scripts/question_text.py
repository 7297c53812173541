"""Wikipedia sentences rewritten as questions: question-shaped text for ``--extra-text``.

Issue 24's Quora queries are questions, a form almost absent from the training text (680 of the 1M
Wikipedia sentences end in "?"). A distillation needs only the teacher's vectors, so any question is
a training example. This turns declarative sentences with a short subject before a copula ("The
castle was built in 1200.") into one question each, picked at random among: the yes/no inversion
("Was the castle built in 1200?"), "Why ...?", "What was the castle?" and, for subjects of up to
four words, a topic template ("How does the castle work?"). No Quora text is read. The sentences
come from past the corpus slices that training (the first 4,096) and the distractors (the first
100,000) use. Measured in docs/results.md ("Wikipedia sentences as questions"): it lifted STS-B
dev and lowered Quora, so no preset uses it.

    python scripts/question_text.py --n 4096 --skip 500000 --out runs/qtext/questions4k.txt
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

COPULAS = frozenset({"is", "was", "are", "were"})
# Word lists as strings: one line each.
_DETERMINERS = "The A An This That Its His Her Their These Those It They He She Some Many Most Both Each"
DETERMINERS = frozenset(f"{_DETERMINERS} Several Our My".split())
PRONOUNS = frozenset({"it", "they", "he", "she", "this", "that", "these", "those", "there"})
_OPENERS = "In On At During After Before When If Although While As Since For By From With However Also"
OPENERS = frozenset(f"{_OPENERS} Then But And So Because Under Of To Unlike Like Today Here Thus".split())
TOPICS = (
    "How does {s} work?",
    "What are some interesting facts about {s}?",
    "What is the history of {s}?",
    "Where can I learn more about {s}?",
    "Why is {s} important?",
    "What do people think of {s}?",
)
VOCABULARY_SENTENCES = 200_000


def lines(path: Path) -> Iterator[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        yield from handle


def common_lowercase(path: Path, limit: int = VOCABULARY_SENTENCES) -> frozenset[str]:
    """Words seen lowercase mid-sentence at least 5 times and 3x as often as capitalised: a
    sentence-initial "Observations" is lowercased inside a question, "Portland" is not."""
    lower: Counter[str] = Counter()
    capital: Counter[str] = Counter()
    for i, line in enumerate(lines(path)):
        if i >= limit:
            break
        for word in line.split()[1:]:
            if not word.isalpha():
                continue
            if word.islower():
                lower[word] += 1
            elif word[0].isupper():
                capital[word.lower()] += 1
    return frozenset(w for w, c in lower.items() if c >= 5 and c > 3 * capital[w])


def subject_text(words: list[str], lowercase: frozenset[str]) -> str:
    first = words[0]
    if first in DETERMINERS or first.lower() in lowercase:
        first = first.lower()
    return " ".join([first, *words[1:]])


def split_at_copula(sentence: str) -> tuple[list[str], str, str] | None:
    """(subject words, copula, predicate) of a declarative sentence with a short plain subject."""
    text = sentence.strip()
    words = text[:-1].split()
    plain = text.endswith(".") and "?" not in text and 5 <= len(words) <= 20
    if not plain or words[0] in OPENERS or any(ch.isdigit() for ch in " ".join(words[:3])):
        return None
    at = next((i for i, w in enumerate(words[:9]) if w in COPULAS and i > 0), None)
    if at is None or at + 1 == len(words) or any(c in " ".join(words[:at]) for c in ',;:()"'):
        return None
    return words[:at], words[at], " ".join(words[at + 1 :])


def question(sentence: str, rng: random.Random, lowercase: frozenset[str]) -> str | None:
    """One question made from ``sentence``, or None when it has no short subject before a copula."""
    parts = split_at_copula(sentence)
    if parts is None:
        return None
    subject, copula, predicate = parts
    if subject == ["There"]:
        return f"{copula.capitalize()} there {predicate}?"
    said = subject_text(subject, lowercase)
    forms = [f"{copula.capitalize()} {said} {predicate}?", f"Why {copula} {said} {predicate}?"]
    if said.split()[0].lower() not in PRONOUNS:
        forms.append(f"What {copula} {said}?")
        if len(subject) <= 4:
            forms.append(rng.choice(TOPICS).format(s=said))
    return rng.choice(forms)


def questions(path: Path, n: int, skip: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lowercase = common_lowercase(path)
    out: list[str] = []
    for i, line in enumerate(lines(path)):
        if i < skip:
            continue
        made = question(line, rng, lowercase)
        if made:
            out.append(made)
        if len(out) >= n:
            break
    return out


def main() -> None:
    root = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    corpus = Path(root) / "unlabeled/enwiki2015_1m_sentences.txt.gz"
    parser.add_argument("--corpus", type=Path, default=corpus)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--skip", type=int, default=500_000, help="corpus sentences passed over first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not args.corpus.is_file():
        raise SystemExit(f"error: corpus not found: {args.corpus}")
    made = questions(args.corpus, args.n, args.skip, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(args.out.name + ".partial")
    partial.write_text("\n".join(made) + "\n", encoding="utf-8")
    partial.replace(args.out)
    print(f"wrote {len(made)} questions to {args.out}")


if __name__ == "__main__":
    main()

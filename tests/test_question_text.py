"""scripts/question_text.py: declarative Wikipedia sentences rewritten as questions (the
question-shaped ``--extra-text`` of stop 55's Quora try)."""

from __future__ import annotations

import gzip
import importlib.util
import random
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "question_text", Path(__file__).resolve().parents[1] / "scripts" / "question_text.py"
)
assert _SPEC is not None and _SPEC.loader is not None
question_text = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(question_text)

CASTLE = "The castle was built in 1200 by the king."


def test_a_sentence_splits_at_its_first_copula_after_a_short_plain_subject() -> None:
    assert question_text.split_at_copula(CASTLE) == (["The", "castle"], "was", "built in 1200 by the king")
    assert question_text.split_at_copula("In 1200 the castle was built by the king.") is None  # opener
    assert question_text.split_at_copula("Was the castle built by the king?") is None  # a question
    assert question_text.split_at_copula("The castle, built by the king, was sold.") is None  # a comma
    assert question_text.split_at_copula("The castle stood on a hill above the river.") is None  # no copula


def test_every_form_of_one_sentence_is_a_question_about_it() -> None:
    made = {question_text.question(CASTLE, random.Random(seed), frozenset()) for seed in range(40)}
    assert made == {
        "Was the castle built in 1200 by the king?",
        "Why was the castle built in 1200 by the king?",
        "What was the castle?",
        *(template.format(s="the castle") for template in question_text.TOPICS),
    }


def test_pronoun_subjects_get_no_what_question_and_there_is_inverted() -> None:
    made = {
        question_text.question("It was built in 1200 by the king.", random.Random(s), frozenset())
        for s in range(20)
    }
    assert made == {"Was it built in 1200 by the king?", "Why was it built in 1200 by the king?"}
    there = question_text.question("There are many castles in the region.", random.Random(0), frozenset())
    assert there == "Are there many castles in the region?"


def test_a_capitalised_common_word_is_lowercased_inside_the_question(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt.gz"
    lines = ["Most observations are made at night."] * 6 + ["Portland is a city in Oregon."]
    with gzip.open(corpus, "wt", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    lowercase = question_text.common_lowercase(corpus)
    assert "observations" in lowercase and "portland" not in lowercase
    made = question_text.question("Observations were made at night.", random.Random(0), lowercase)
    assert made is not None and "observations" in made and "Observations" not in made

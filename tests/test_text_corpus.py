"""Plain-text corpus reading: blank lines, limits and the --skip-sentences slice."""

from __future__ import annotations

from pathlib import Path

import pytest

from distilembed.errors import UserError
from training.data.text import content_hash, read_sentences


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("s0\n\n  s1  \ns2\ns3\n\ns4\n", encoding="utf-8")
    return path


def test_limit_takes_the_first_sentences_and_drops_blank_lines(corpus: Path) -> None:
    assert read_sentences(corpus) == ["s0", "s1", "s2", "s3", "s4"]
    assert read_sentences(corpus, limit=2) == ["s0", "s1"]


def test_skip_counts_sentences_not_lines_and_gives_a_disjoint_slice(corpus: Path) -> None:
    first = read_sentences(corpus, limit=2)
    second = read_sentences(corpus, limit=2, skip=2)
    assert second == ["s2", "s3"]
    assert not set(first) & set(second)
    assert read_sentences(corpus, skip=4) == ["s4"]
    # A different slice is a different corpus identity, so it gets its own teacher-target cache.
    assert content_hash(first) != content_hash(second)


def test_skipping_past_the_end_or_backwards_is_a_user_error(corpus: Path) -> None:
    with pytest.raises(UserError, match="no sentences after skipping the first 5"):
        read_sentences(corpus, skip=5)
    with pytest.raises(UserError, match="must not be negative"):
        read_sentences(corpus, skip=-1)

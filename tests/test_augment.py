from __future__ import annotations

import gzip
import random
import re
from pathlib import Path

import pytest

from distilembed.errors import UserError
from training import augment
from training.augment import (
    DEBIAN_WORDNET_DIR,
    LEXNAMES,
    STOPWORDS,
    augment_corpus,
    crop,
    ensure_wordnet,
    install_wordnet,
    lexnames_text,
    synonym_substitute,
    word_deletion,
)

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Released on bail, Hall rose to the secretariat of the party (in 1931).",
    "Vocational training includes electronics, brickwork and carpentry courses!",
    "Why, then, have so many people never heard of Armstrong?",
    "Agnes suffered terrible injuries from the attack but survived; she lived for another 23 years.",
    "A small village church stands near the old bridge across the river.",
    "Scientists measured the temperature of the ocean every morning for three months.",
    "He bought a car, sold his house and moved to a quiet town in the mountains.",
]
HAS_WORDNET = (DEBIAN_WORDNET_DIR / "data.noun").is_file()
needs_wordnet = pytest.mark.skipif(not HAS_WORDNET, reason="Debian wordnet-base not installed")


@pytest.fixture(scope="session")
def wn(tmp_path_factory: pytest.TempPathFactory):
    """The Debian WordNet through ensure_wordnet, copied into a throwaway cache."""
    if not HAS_WORDNET:
        pytest.skip("Debian wordnet-base not installed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DISTILEMBED_CACHE_DIR", str(tmp_path_factory.mktemp("wordnet-cache")))
        mp.delenv(augment.WORDNET_ENV, raising=False)
        return ensure_wordnet(DEBIAN_WORDNET_DIR)


def real_synonyms(wn, word: str, lower: bool = True) -> set[str]:
    """Ground truth from nltk's own synset objects."""
    names = {name.replace("_", " ") for s in wn.synsets(word) for name in s.lemma_names()}
    return {name.lower() for name in names} if lower else names


# -- lexnames and ensure_wordnet ---------------------------------------------------------------


def test_lexnames_has_45_well_formed_lines() -> None:
    lines = lexnames_text().splitlines()
    assert len(lines) == len(LEXNAMES) == 45
    pos_of = {"noun": "1", "verb": "2", "adj": "3", "adv": "4"}
    for i, line in enumerate(lines):
        number, name, pos = line.split("\t")
        assert re.fullmatch(r"\d\d", number) and int(number) == i
        assert re.fullmatch(r"(noun|verb|adj|adv)\.[A-Za-z]+", name)
        assert pos == pos_of[name.split(".")[0]]
    assert lines[0] == "00\tadj.all\t3" and lines[3] == "03\tnoun.Tops\t1" and lines[44] == "44\tadj.ppl\t3"


def test_lexnames_match_the_man_page() -> None:
    page = Path("/usr/share/man/man5/lexnames.5WN.gz")
    if not page.is_file():
        pytest.skip("lexnames(5WN) man page not installed")
    with gzip.open(page, "rt") as f:
        page_text = f.read()
    rows = re.findall(r"^(\d\d)\t(\S+)", page_text, flags=re.MULTILINE)
    assert [(int(n), name) for n, name in rows] == list(enumerate(LEXNAMES))


@needs_wordnet
def test_lexnames_agree_with_data_files() -> None:
    """Every synset's lex_filenum names a lexicographer file of the synset's own part of speech."""
    prefix = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}
    used: set[int] = set()
    for name in ("noun", "verb", "adj", "adv"):
        for line in (DEBIAN_WORDNET_DIR / f"data.{name}").read_text(encoding="utf-8").splitlines():
            if line.startswith("  "):
                continue
            _, filenum, ss_type, _ = line.split(" ", 3)
            used.add(int(filenum))
            assert LEXNAMES[int(filenum)].split(".")[0] == prefix[ss_type], line[:40]
    assert used == set(range(45))


@needs_wordnet
def test_reader_works_and_copy_is_complete(wn) -> None:
    root = Path(str(wn.root))
    assert root.parts[-3:] == ("nltk_data", "corpora", "wordnet") and not root.is_symlink()
    assert (root / "lexnames").read_text() == lexnames_text()
    assert wn.synset("dog.n.01").lexname() == "noun.animal"
    assert wn.synset("run.v.01").lexname() == "verb.motion"
    assert "domestic dog" in real_synonyms(wn, "dogs")
    assert not list(root.parent.glob(".wordnet-*"))


def _fake_dict(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for kind in ("index", "data"):
        for pos in ("noun", "verb", "adj", "adv"):
            (folder / f"{kind}.{pos}").write_text(f"{kind} {pos}\n")
    (folder / "bin").mkdir()
    return folder


def test_install_copies_once_and_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _fake_dict(tmp_path / "dict")
    target = install_wordnet(source, tmp_path / "nltk_data")
    assert target == tmp_path / "nltk_data" / "corpora" / "wordnet"
    assert (target / "data.noun").read_text() == "data noun\n" and not (target / "bin").exists()
    assert (target / "lexnames").read_text() == lexnames_text()
    stamp = (target / "data.noun").stat().st_mtime_ns
    assert install_wordnet(source, tmp_path / "nltk_data") == target
    assert (target / "data.noun").stat().st_mtime_ns == stamp  # not copied again

    (source / "index.sense").write_text("sense\n")  # a changed source replaces the copy
    install_wordnet(source, tmp_path / "nltk_data")
    assert (target / "index.sense").is_file()

    calls = []

    def failing_copy(src: Path, dst: Path) -> None:
        calls.append(src)
        if len(calls) > 2:
            raise OSError("disk full")
        dst.write_bytes(Path(src).read_bytes())

    monkeypatch.setattr(augment.shutil, "copy2", failing_copy)
    with pytest.raises(OSError, match="disk full"):
        install_wordnet(source, tmp_path / "fresh")
    corpora = tmp_path / "fresh" / "corpora"
    assert not (corpora / "wordnet").exists() and not list(corpora.iterdir())


def test_ensure_wordnet_rejects_an_empty_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ensure_wordnet.cache_clear()
    with pytest.raises(UserError, match="not a WordNet dict folder"):
        ensure_wordnet(tmp_path)
    monkeypatch.setenv(augment.WORDNET_ENV, str(tmp_path))
    with pytest.raises(UserError, match="not a WordNet dict folder"):
        ensure_wordnet()
    ensure_wordnet.cache_clear()


def test_ensure_wordnet_without_any_wordnet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(augment.WORDNET_ENV, raising=False)
    monkeypatch.setattr(augment, "DEBIAN_WORDNET_DIR", tmp_path / "missing")
    monkeypatch.setattr(augment, "_nltk_default_wordnet", lambda: None)
    ensure_wordnet.cache_clear()
    with pytest.raises(UserError, match="wordnet-base") as info:
        ensure_wordnet()
    assert "\n" not in str(info.value) and "nltk.download('wordnet')" in str(info.value)
    ensure_wordnet.cache_clear()


# -- synonym substitution ----------------------------------------------------------------------


def _substitution_pattern(wn, text: str) -> re.Pattern[str]:
    """Matches ``text`` with any eligible word kept or swapped for a real synonym, all else verbatim."""
    parts = []
    for token in augment._TOKEN.findall(text):
        options = [re.escape(token)]
        if token.isalpha() and len(token) > 1 and token.lower() not in STOPWORDS:
            synonyms = {
                s for s in real_synonyms(wn, token.lower(), lower=False) if s.lower() != token.lower()
            }
            if token[0].isupper():
                synonyms = {s[0].upper() + s[1:] for s in synonyms}
            options += [re.escape(s) for s in sorted(synonyms, key=len, reverse=True)]
        parts.append("(?:" + "|".join(options) + ")")
    return re.compile("".join(parts), flags=0)


@needs_wordnet
def test_synonyms_are_real_wordnet_synonyms_and_punctuation_stays(wn) -> None:
    changed = 0
    for seed in range(5):
        rng = random.Random(seed)
        for text in SENTENCES:
            out = synonym_substitute(text, rng, p=0.5, wordnet=wn)
            assert _substitution_pattern(wn, text).fullmatch(out), (text, out)
            changed += out != text
    assert changed >= 0.9 * 5 * len(SENTENCES)


@needs_wordnet
def test_synonym_table_is_a_subset_of_nltk_synsets(wn) -> None:
    words = {t.lower() for s in SENTENCES for t in augment._TOKEN.findall(s) if t.isalpha()}
    words |= {"dogs", "ran", "better", "leaves", "quickly", "geese", "churches"}
    for word in sorted(words):
        found = {s.lower() for s in augment._synonyms(wn, word)}
        assert found <= real_synonyms(wn, word), word
        assert word not in found
    assert augment._synonyms(wn, "dog")


@needs_wordnet
def test_synonym_substitution_is_deterministic_and_bounded(wn) -> None:
    text = SENTENCES[5]
    first = synonym_substitute(text, random.Random(7), wordnet=wn)
    assert first == synonym_substitute(text, random.Random(7), wordnet=wn)
    others = {synonym_substitute(text, random.Random(seed), wordnet=wn) for seed in range(8, 16)}
    assert others - {first}
    assert synonym_substitute(text, random.Random(1), p=0.0, wordnet=wn) == text
    one = synonym_substitute(text, random.Random(1), p=1.0, max_words=1, wordnet=wn)
    assert one != text and len(set(text.split()) - set(one.split())) == 1
    # Capitalised words get capitalised synonyms.
    for seed in range(10):
        out = synonym_substitute("Church", random.Random(seed), p=1.0, wordnet=wn)
        assert out != "Church" and out[0].isupper()
    assert synonym_substitute("of the, and!", random.Random(0), wordnet=wn) == "of the, and!"


# -- deletion and crop -------------------------------------------------------------------------


def _is_subsequence(small: list[str], big: list[str]) -> bool:
    it = iter(big)
    return all(word in it for word in small)


def test_deletion_never_empties_and_removes_about_p() -> None:
    for seed in range(50):
        rng = random.Random(seed)
        assert word_deletion("two words", rng, p=1.0) in {"two", "words"}
        assert word_deletion("alone", rng, p=1.0) == "alone"
        out = word_deletion(SENTENCES[0], rng, p=0.9)
        assert out and _is_subsequence(out.split(), SENTENCES[0].split())
    words = [f"w{i}" for i in range(5000)]
    kept = word_deletion(" ".join(words), random.Random(3), p=0.1).split()
    assert _is_subsequence(kept, words)
    assert 0.08 < 1 - len(kept) / len(words) < 0.12
    assert word_deletion(SENTENCES[1], random.Random(0), p=0.0) == SENTENCES[1]
    with pytest.raises(UserError):
        word_deletion("a b", random.Random(0), p=1.5)


def test_crop_removes_one_contiguous_span() -> None:
    words = [f"w{i}" for i in range(50)]
    starts = set()
    for seed in range(40):
        out = crop(" ".join(words), random.Random(seed), ratio=0.1).split()
        assert len(out) == 45
        start = next(i for i, (a, b) in enumerate(zip([*out, None], words, strict=False)) if a != b)
        assert out == words[:start] + words[start + 5 :]
        starts.add(start)
    assert len(starts) > 10  # the span moves
    assert crop("alone", random.Random(0)) == "alone"
    assert crop("two words", random.Random(0), ratio=1.0) in {"two", "words"}
    assert crop("a b c d", random.Random(0), ratio=0.0) == "a b c d"


# -- augment_corpus ----------------------------------------------------------------------------


def test_augment_corpus_deterministic_per_seed() -> None:
    methods = ["deletion", "crop"]
    first = augment_corpus(SENTENCES, methods, seed=1, deletion_p=0.3, progress=False)
    assert first == augment_corpus(SENTENCES, methods, seed=1, deletion_p=0.3, progress=False)
    assert first != augment_corpus(SENTENCES, methods, seed=2, deletion_p=0.3, progress=False)
    assert len(first) <= len(SENTENCES) * len(methods) and not set(first) & set(SENTENCES)
    # Per-sentence rngs: a sentence's views do not depend on the sentences after it.
    assert (
        augment_corpus(SENTENCES[:1], ["crop"], seed=1, progress=False)
        == augment_corpus(SENTENCES, ["crop"], seed=1, progress=False)[:1]
    )


def test_augment_corpus_skips_unchanged_and_rejects_unknown_methods() -> None:
    assert augment_corpus(["alone"], ["deletion", "crop"], seed=0, progress=False) == []
    with pytest.raises(UserError, match="unknown augmentation 'backtranslate'"):
        augment_corpus(SENTENCES, ["crop", "backtranslate"], seed=0, progress=False)
    with pytest.raises(UserError, match="crop_ratio"):
        augment_corpus(SENTENCES, ["crop"], seed=0, crop_ratio=-0.1, progress=False)


@needs_wordnet
def test_augment_corpus_with_synonyms(wn) -> None:
    out = augment_corpus(SENTENCES, ["synonym", "deletion", "crop"], seed=0, wordnet=wn, progress=False)
    assert out == augment_corpus(
        SENTENCES, ["synonym", "deletion", "crop"], seed=0, wordnet=wn, progress=False
    )
    assert len(out) >= 2.5 * len(SENTENCES)
    synonyms = augment_corpus(SENTENCES, ["synonym"], seed=0, wordnet=wn, progress=False)
    assert len(synonyms) == len(SENTENCES)
    for text, new in zip(SENTENCES, synonyms, strict=True):
        assert _substitution_pattern(wn, text).fullmatch(new)

"""Cheap, deterministic text augmentations: WordNet synonyms, word deletion and crop.

HPD (section 4.3) enlarges its training set with WordNet substitution (nlpaug ``SynonymAug`` style);
ConGen (Table 6) shows deletion, crop and synonym replacement as cheap views. WordNet comes from
``nltk.download('wordnet')`` or Debian's ``wordnet-base``, which needs a copy into an nltk data folder
plus the ``lexnames`` file it lacks (see ``ensure_wordnet``)."""

from __future__ import annotations

import functools
import os
import random
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from distilembed.errors import UserError
from distilembed.paths import cache_dir

if TYPE_CHECKING:
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

DEBIAN_WORDNET_DIR = Path("/usr/share/wordnet")
WORDNET_ENV = "DISTILEMBED_WORDNET_DIR"
METHODS = ("synonym", "deletion", "crop")

# The lexnames(5WN) table: file number = line number; pos 1 noun, 2 verb, 3 adjective, 4 adverb.
LEXNAMES: tuple[str, ...] = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact",
    "noun.attribute", "noun.body", "noun.cognition", "noun.communication", "noun.event",
    "noun.feeling", "noun.food", "noun.group", "noun.location", "noun.motive", "noun.object",
    "noun.person", "noun.phenomenon", "noun.plant", "noun.possession", "noun.process",
    "noun.quantity", "noun.relation", "noun.shape", "noun.state", "noun.substance", "noun.time",
    "verb.body", "verb.change", "verb.cognition", "verb.communication", "verb.competition",
    "verb.consumption", "verb.contact", "verb.creation", "verb.emotion", "verb.motion",
    "verb.perception", "verb.possession", "verb.social", "verb.stative", "verb.weather",
    "adj.ppl",
)  # fmt: skip
_POS_NUMBER = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}
_REQUIRED = tuple(f"{kind}.{pos}" for kind in ("index", "data") for pos in ("noun", "verb", "adj", "adv"))

# A compact English stopword list (function words, pronouns, auxiliaries): never substituted.
STOPWORDS = frozenset(
    (
        "a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are", "as",
        "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can",
        "could", "did", "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further",
        "had", "has", "have", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his",
        "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my",
        "myself", "no", "nor", "not", "now", "of", "off", "on", "once", "only", "or", "other", "our",
        "ours", "ourselves", "out", "over", "own", "same", "she", "should", "so", "some", "such", "than",
        "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these", "they", "this",
        "those", "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what",
        "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your",
        "yours", "yourself", "yourselves", "also", "may", "might", "must", "shall", "us"
    )
)  # fmt: skip
# Words (letters, digits, inner ' or -), whitespace runs, single other characters: joins back exactly.
_TOKEN = re.compile(r"\w+(?:['’-]\w+)*|\s+|[^\w\s]")


def lexnames_text() -> str:
    """The 45-line ``lexnames`` file: ``NN<TAB>name<TAB>pos``."""
    return "".join(f"{i:02d}\t{name}\t{_POS_NUMBER[name.split('.')[0]]}\n" for i, name in enumerate(LEXNAMES))


def _is_wordnet_dict(folder: Path) -> bool:
    return all((folder / name).is_file() for name in _REQUIRED)


def _signature(folder: Path) -> str:
    """Names and sizes of a dict folder's files: tells a stale copy from a current one."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name not in {"lexnames", ".source"})
    return "\n".join(f"{p.name}\t{p.stat().st_size}" for p in files) + "\n"


def install_wordnet(source: Path, nltk_data: Path) -> Path:
    """Copy a WordNet 3.0 dict folder to ``nltk_data/corpora/wordnet`` once; return that folder.
    nltk >= 3.9 refuses symlinks out of its data roots, hence a copy, built in a temporary sibling
    and renamed into place so that a crash never leaves a half-written folder."""
    source = Path(source)
    if not _is_wordnet_dict(source):
        raise UserError(f"not a WordNet dict folder (no data.noun, index.noun, ...): {source}")
    target = nltk_data / "corpora" / "wordnet"
    signature = _signature(source)
    if _is_copy_of(target, signature):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".wordnet-", dir=target.parent))
    try:
        for path in source.iterdir():
            if path.is_file():  # Debian's folder also holds bin/, pixmaps/ and wnres/
                shutil.copy2(path, tmp / path.name)
        if not (tmp / "lexnames").is_file():
            (tmp / "lexnames").write_text(lexnames_text())
        (tmp / ".source").write_text(signature)
        if _is_copy_of(target, signature):  # another process finished first
            return target
        if target.exists():  # a copy of another source: move it aside, then swap
            old = Path(tempfile.mkdtemp(prefix=".wordnet-old-", dir=target.parent))
            target.rename(old / "wordnet")
            shutil.rmtree(old, ignore_errors=True)
        try:
            tmp.rename(target)
        except OSError:
            if not _is_copy_of(target, signature):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _is_copy_of(target: Path, signature: str) -> bool:
    marker = target / ".source"
    return (target / "lexnames").is_file() and marker.is_file() and marker.read_text() == signature


def _reader(folder: Path) -> WordNetCorpusReader:
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    class LocalWordNetReader(WordNetCorpusReader):
        """A WordNet 3.0 dict folder read as the base version: nltk maps every loaded WordNet onto
        3.0 for its multilingual data through ``index.sense``, which Debian's wordnet-base lacks;
        this corpus is 3.0 and no multilingual data is loaded, so the mapping is skipped."""

        def map_wn(self, version: str = "wordnet") -> None:  # noqa: ARG002 - nltk's signature
            return None

    # nltk only opens files under its data roots (nltk.pathsec). Registering the corpus folder
    # itself, not nltk_data, keeps nltk's own `wordnet` loader from finding this copy: without
    # index.sense (Debian's wordnet-sense-index) the stock reader would fail on it.
    if str(folder) not in map(str, nltk.data.path):
        nltk.data.path.append(str(folder))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*multilingual functions are not available.*")
        return LocalWordNetReader(str(folder), None)


def _nltk_default_wordnet() -> WordNetCorpusReader | None:
    """``nltk.corpus.wordnet`` if a user installed it (``nltk.download``), else None."""
    try:
        from nltk.corpus import wordnet

        wordnet.ensure_loaded()
    except (LookupError, OSError, ImportError):
        return None
    return wordnet  # the lazy loader has turned itself into the reader


@functools.lru_cache(maxsize=4)
def ensure_wordnet(source_dir: str | Path | None = None) -> WordNetCorpusReader:
    """A working nltk WordNet reader, loaded once per source: ``source_dir``, then
    ``$DISTILEMBED_WORDNET_DIR`` (both explicit: an invalid one is an error), then nltk's own
    ``wordnet`` corpus, then Debian's ``/usr/share/wordnet`` copied into ``cache_dir()/nltk_data``."""
    explicit = source_dir or os.environ.get(WORDNET_ENV)
    if not explicit:
        default = _nltk_default_wordnet()
        if default is not None:
            return default
    source = Path(explicit) if explicit else DEBIAN_WORDNET_DIR
    if not explicit and not _is_wordnet_dict(source):
        raise UserError(
            "WordNet not found: install Debian's wordnet-base (apt-get install wordnet-base), "
            f"run nltk.download('wordnet'), or set {WORDNET_ENV}"
        )
    return _reader(install_wordnet(source, cache_dir() / "nltk_data"))


_Synsets = dict[tuple[str, str], list[tuple[str, ...]]]
_MARKER = re.compile(r"\(\w+\)$")  # adjective syntactic markers in data.adj: "galore(ip)"


@functools.lru_cache(maxsize=4)
def _lemma_table(wordnet: WordNetCorpusReader) -> _Synsets:
    """(lowercase lemma, pos) -> lemma names of each synset it is in, parsed from the data files:
    nltk ``Synset`` objects cost ~0.2 ms each (pointers, glosses); reading only the lemma names of
    all 117k synsets once (~0.7 s) made a cold pass over 5k sentences ~10x faster."""
    table: _Synsets = {}
    for pos, name in (("n", "noun"), ("v", "verb"), ("a", "adj"), ("r", "adv")):
        with wordnet.abspath(f"data.{name}").open() as stream:
            lines = stream.read().decode("utf-8").splitlines()
        for line in lines:
            if line.startswith("  "):  # the licence header
                continue
            # offset lex_filenum ss_type w_cnt(hex) word lex_id word lex_id ... pointers | gloss
            _, _, _, hex_count, rest = line.split(" ", 4)
            count = int(hex_count, 16)
            lemmas = tuple(_MARKER.sub("", word) for word in rest.split(" ", 2 * count)[: 2 * count : 2])
            for lemma in lemmas:
                table.setdefault((lemma.lower(), pos), []).append(lemmas)
    return table


@functools.lru_cache(maxsize=200_000)
def _synonyms(wordnet: WordNetCorpusReader, word: str) -> tuple[str, ...]:
    """Lemma names of all synsets of ``word`` (lowercase), minus the word and its base forms: a
    subset of ``wordnet.synsets(word)``'s lemma names, one base form per part of speech."""
    forms = [(pos, wordnet.morphy(word, pos)) for pos in "nvar"]
    stems = {word} | {form for _, form in forms if form}
    table = _lemma_table(wordnet)
    seen: dict[str, None] = {}
    for pos, form in forms:
        for lemmas in table.get((form, pos), ()) if form else ():
            for name in lemmas:
                phrase = name.replace("_", " ")
                if phrase.lower() not in stems:
                    seen.setdefault(phrase)
    return tuple(seen)


def synonym_substitute(
    text: str,
    rng: random.Random,
    p: float = 0.3,
    max_words: int | None = None,
    wordnet: WordNetCorpusReader | None = None,
) -> str:
    """Replace up to a fraction ``p`` (at least one) of eligible words (alphabetic, two or more
    letters, not a stopword) with WordNet synonyms; a capitalised word gets a capitalised synonym."""
    _check_fraction("p", p)
    tokens = _TOKEN.findall(text)
    eligible = [
        i for i, tok in enumerate(tokens)
        if len(tok) > 1 and tok.isascii() and tok.isalpha() and tok.lower() not in STOPWORDS
    ]  # fmt: skip
    budget = max(1, int(p * len(eligible))) if p > 0 and eligible else 0
    if max_words is not None:
        budget = min(budget, max_words)
    if budget == 0:
        return text
    reader = wordnet if wordnet is not None else ensure_wordnet()
    rng.shuffle(eligible)
    for i in eligible:
        candidates = _synonyms(reader, tokens[i].lower())
        if not candidates:
            continue
        choice = rng.choice(candidates)
        tokens[i] = choice[0].upper() + choice[1:] if tokens[i][0].isupper() else choice
        budget -= 1
        if budget == 0:
            break
    return "".join(tokens)


def word_deletion(text: str, rng: random.Random, p: float = 0.1) -> str:
    """Delete each whitespace-separated word with probability ``p``; at least one word stays. The
    kept words are joined by single spaces (as are crop's)."""
    _check_fraction("p", p)
    words = text.split()
    if len(words) <= 1:
        return text
    return " ".join([w for w in words if rng.random() >= p] or [rng.choice(words)])


def crop(text: str, rng: random.Random, ratio: float = 0.1) -> str:
    """Drop one contiguous span of ``round(ratio * n)`` words (at least one, never all)."""
    _check_fraction("ratio", ratio)
    words = text.split()
    if len(words) <= 1 or ratio == 0:
        return text
    span = min(max(1, round(ratio * len(words))), len(words) - 1)
    start = rng.randrange(len(words) - span + 1)
    return " ".join(words[:start] + words[start + span :])


def augmented_views(
    texts: Sequence[str],
    method: str,
    seed: int,
    *,
    synonym_p: float = 0.3,
    deletion_p: float = 0.1,
    crop_ratio: float = 0.1,
    wordnet: WordNetCorpusReader | None = None,
    progress: bool = False,
) -> list[str]:
    """One view of each sentence by ``method`` (or ``none``: the sentence itself), in order. Each
    sentence has its own rng seeded from ``seed``, the index and the method, so a view does not
    depend on which other sentences or methods were asked for."""
    if method == "none":
        return list(texts)
    if method not in METHODS:
        raise UserError(f"unknown augmentation {method!r}: choose from {', '.join(METHODS)}")
    if method == "synonym" and wordnet is None:
        wordnet = ensure_wordnet()
    views: dict[str, Callable[[str, random.Random], str]] = {
        "synonym": lambda text, rng: synonym_substitute(text, rng, p=synonym_p, wordnet=wordnet),
        "deletion": lambda text, rng: word_deletion(text, rng, p=deletion_p),
        "crop": lambda text, rng: crop(text, rng, ratio=crop_ratio),
    }
    rows = enumerate(tqdm(texts, desc=f"augment {method}", unit="sent", disable=not progress))
    return [views[method](text, random.Random(f"{seed}/{method}/{index}")) for index, text in rows]


def augment_corpus(
    texts: Sequence[str],
    methods: Sequence[str],
    seed: int,
    *,
    synonym_p: float = 0.3,
    deletion_p: float = 0.1,
    crop_ratio: float = 0.1,
    wordnet: WordNetCorpusReader | None = None,
    progress: bool = True,
) -> list[str]:
    """Augmented copies, one per method per sentence (:func:`augmented_views`), in corpus order then
    method order; outputs equal to their source (or to an earlier view of it) are skipped."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UserError(f"unknown augmentation {unknown[0]!r}: choose from {', '.join(METHODS)}")
    rates = {"synonym_p": synonym_p, "deletion_p": deletion_p, "crop_ratio": crop_ratio}
    for name, value in rates.items():
        _check_fraction(name, value)
    views = [augmented_views(texts, m, seed, **rates, wordnet=wordnet, progress=progress) for m in methods]
    out: list[str] = []
    for index, text in enumerate(texts):
        seen = {text}
        for view in (by_method[index] for by_method in views):
            if view not in seen:
                seen.add(view)
                out.append(view)
    return out


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise UserError(f"{name} must be in [0, 1], got {value}")

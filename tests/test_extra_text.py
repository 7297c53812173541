"""``--extra-text`` and ``--exclude-text``: more unlabeled text, and the evaluation text kept out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distilembed.errors import UserError
from training.config import make_config
from training.data.extra_text import drop_excluded, excluded_keys, normalise, source_sentences
from training.pipeline import run_training

STSB = [
    "main-captions\tMSRvid\t2012test\t0001\t2.5\ta man is driving a car .\ta first .",
    "main-captions\tMSRvid\t2012test\t0002\t4.0\ta first .\tc third .",
]


def test_normalise_ignores_case_punctuation_and_tokenisation() -> None:
    assert normalise("A man is driving a car.") == "a man is driving a car"
    assert normalise("a man is driving a car . ") == "a man is driving a car"
    assert normalise("Don't stop") == "don t stop"


def test_each_format_gives_its_distinct_sentences_sorted(tmp_path: Path) -> None:
    (tmp_path / "sts.csv").write_text("\n".join(STSB) + "\n", encoding="utf-8")
    (tmp_path / "nli.csv").write_text(
        'sent0,sent1,hard_neg\n"Two dogs , running .",Dogs run .,Cats sleep .\nA b .,Dogs run .,C d .\n'
    )
    snli = tmp_path / "snli"
    snli.mkdir()
    (snli / "s1.dev").write_text("Premise one .\nPremise one .\n")
    (snli / "s2.dev").write_text("Hypothesis .\n\n")
    (snli / "labels.dev").write_text("neutral\nentailment\n")
    (tmp_path / "quora.tsv").write_text("1\tHow do I learn?\tWhat is learning?\t7\n")
    (tmp_path / "more.txt").write_text("zeta\nalpha\nzeta\n")

    sts = ["a first .", "a man is driving a car .", "c third ."]
    assert source_sentences(str(tmp_path / "sts.csv")) == sts
    nli = ["A b .", "C d .", "Cats sleep .", "Dogs run .", "Two dogs , running ."]
    assert source_sentences(str(tmp_path / "nli.csv")) == nli
    assert source_sentences(str(snli)) == ["Hypothesis .", "Premise one ."]  # labels are not text
    assert source_sentences(str(tmp_path / "quora.tsv")) == ["How do I learn?", "What is learning?"]
    assert source_sentences("more.txt", str(tmp_path)) == ["alpha", "zeta"]  # relative to the data root


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.txt", None, "text source not found"),
        ("bad.csv", "a,b\n1,2\n", "unknown csv"),
        ("empty.txt", "\n\n", "corpus is empty|no sentences"),
    ],
)
def test_bad_sources_are_user_errors(tmp_path: Path, name: str, content: str | None, message: str) -> None:
    if content is not None:
        (tmp_path / name).write_text(content)
    with pytest.raises(UserError, match=message):
        source_sentences(str(tmp_path / name))


def test_drop_excluded_counts_what_it_drops(tmp_path: Path) -> None:
    (tmp_path / "test.csv").write_text("\n".join(STSB) + "\n", encoding="utf-8")
    excluded = excluded_keys([str(tmp_path / "test.csv")])
    texts = ["A man is driving a car.", "A woman is driving a car.", "C third"]
    assert drop_excluded(texts, excluded) == (["A woman is driving a car."], 2)
    assert drop_excluded(texts, set()) == (texts, 0)


def test_training_adds_extra_text_and_drops_excluded(tiny_teacher, tiny_bert, tiny_data, tmp_path) -> None:
    corpus = (tiny_data / "corpus.txt").read_text().splitlines()
    extra = tmp_path / "extra.txt"
    extra.write_text("\n".join(["one more sentence .", "and another one .", corpus[0]]) + "\n")
    exclude = tmp_path / "exclude.txt"
    exclude.write_text(f"{corpus[1].upper()}\nand another one\n")  # matched after normalise
    cfg = make_config(
        None,
        {
            "teacher": str(tiny_teacher),
            "student": str(tiny_bert),
            "dim": 8,
            "n_sentences": 20,
            "corpus": "corpus.txt",
            "batch_size": 8,
            "max_steps": 2,
            "eval_every": 2,
            "save_every": 2,
            "max_seq_len": 32,
            "device": "cpu",
            "extra_text": [str(extra)],
            "exclude_text": [str(exclude)],
        },
    )
    run_training(cfg, tmp_path / "ckpt", data_dir=str(tiny_data))
    data = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())["data"]
    assert data["corpus_sentences_dropped"] == len([t for t in corpus[:20] if t == corpus[1]])
    assert data["sentences"] == 20 - data["corpus_sentences_dropped"]
    assert data["extra_text"] == {str(extra): 2}  # "and another one ." is excluded
    assert data["train_examples"] == data["sentences"] + 2
    assert data["excluded_sentences"] == 2

"""Readers for triplet, SNLI and Quora pair files, and the hub loader's failure path."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest

from distilembed.errors import UserError
from training.data.pairs import (
    NLIPair,
    Pair,
    Triplet,
    load_triplets,
    read_nli_triplets,
    read_quora_pairs,
    read_senteval_snli,
    snli_to_triplets,
)

SHARED_DATA = Path(os.environ.get("DISTILEMBED_DATA_DIR") or "/work/shared/data")


def _write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", newline="")
    return path


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]


def _write_snli(directory: Path, split: str, rows: list[tuple[str, str, str]]) -> Path:
    directory.mkdir(exist_ok=True)
    for index, name in enumerate(("s1", "s2", "labels")):
        # SentEval's text files end each line in a space; the reader strips it.
        lines = "".join(f"{row[index]} \n" if index < 2 else f"{row[index]}\n" for row in rows)
        _write(directory / f"{name}.{split}", lines)
    return directory


# --- SimCSE triplet csv -------------------------------------------------------------------------------


def test_triplets_quoted_fields_with_commas_quotes_and_newlines(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "t.csv",
        "sent0,sent1,hard_neg\r\n"
        "A man plays.,A man is playing.,A woman sleeps.\r\n"
        '"Two dogs, one brown, run .","He said ""hi"" .","Line one\nline two"\r\n',
    )
    assert read_nli_triplets(path) == [
        Triplet("A man plays.", "A man is playing.", "A woman sleeps."),
        Triplet("Two dogs, one brown, run .", 'He said "hi" .', "Line one\nline two"),
    ]


def test_triplets_malformed_rows_skipped_with_file_and_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write(
        tmp_path / "t.csv",
        'sent0,sent1,hard_neg\n"multi\nline",b,c\nonly,two\nx, ,z\ngood,row,here\n',
    )
    with caplog.at_level(logging.WARNING):
        triplets = read_nli_triplets(path)
    assert triplets == [Triplet("multi\nline", "b", "c"), Triplet("good", "row", "here")]
    messages = _warnings(caplog)
    # Records start on lines 2 and 4: the quoted newline takes line 3.
    assert f"{path}:4: skipped malformed row: expected 3 fields, got 2" in messages
    assert f"{path}:5: skipped malformed row: empty text" in messages
    assert f"{path}: skipped 2 malformed rows" in messages


def test_triplets_per_line_warnings_are_capped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path / "t.csv", "sent0,sent1,hard_neg\n" + "bad\n" * 12 + "a,b,c\n")
    with caplog.at_level(logging.WARNING):
        assert len(read_nli_triplets(path)) == 1
    messages = _warnings(caplog)
    assert sum("skipped malformed row" in message for message in messages) == 5
    assert messages[-1] == f"{path}: skipped 12 malformed rows"


def test_triplets_wrong_header_names_expected_columns(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv", "anchor,positive,negative\na,b,c\n")
    with pytest.raises(UserError, match="sent0,sent1,hard_neg"):
        read_nli_triplets(path)


def test_triplets_header_with_bom_is_accepted(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv", b"\xef\xbb\xbfsent0,sent1,hard_neg\na,b,c\n")
    assert read_nli_triplets(path) == [Triplet("a", "b", "c")]


@pytest.mark.parametrize("text", ["", "sent0,sent1,hard_neg\n", "sent0,sent1,hard_neg\nonly,two\n"])
def test_triplets_empty_is_an_error(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path / "t.csv", text)
    with pytest.raises(UserError, match=r"empty|no triplets"):
        read_nli_triplets(path)


def test_missing_files_are_user_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(UserError, match=re.escape(f"not found: {missing}")):
        read_nli_triplets(missing)
    with pytest.raises(UserError, match="not found"):
        read_quora_pairs(tmp_path / "nope.tsv")
    with pytest.raises(UserError, match="not found"):
        read_senteval_snli(tmp_path / "nodir", "dev")
    with pytest.raises(UserError, match="not found"):
        load_triplets(str(missing))


def test_unknown_extensions_are_user_errors(tmp_path: Path) -> None:
    text = _write(tmp_path / "t.txt", "sent0,sent1,hard_neg\na,b,c\n")
    with pytest.raises(UserError, match="unknown triplet file format"):
        read_nli_triplets(text)
    with pytest.raises(UserError, match="unknown Quora file format"):
        read_quora_pairs(text)
    with pytest.raises(UserError, match="unknown triplet source format"):
        load_triplets(str(text))


# --- SentEval SNLI ------------------------------------------------------------------------------------

SNLI_ROWS = [
    ("P1 .", "h-neu .", "neutral"),
    ("P1 .", "h-ent1 .", "entailment"),
    ("P1 .", "h-con1 .", "contradiction"),
    ("P1 .", "h-ent2 .", "entailment"),
    ("P2 .", "h-con2 .", "contradiction"),
    ("P2 .", "h-ent3 .", "entailment"),
    ("P2 .", "h-con3 .", "contradiction"),
    ("P3 .", "h-ent4 .", "entailment"),
    ("P1 .", "h-con4 .", "contradiction"),
]


def test_senteval_snli_strips_trailing_space(tmp_path: Path) -> None:
    directory = _write_snli(tmp_path / "snli", "dev", SNLI_ROWS[:2])
    assert read_senteval_snli(directory, "dev") == [
        NLIPair("P1 .", "h-neu .", "neutral"),
        NLIPair("P1 .", "h-ent1 .", "entailment"),
    ]


def test_snli_to_triplets_groups_consecutive_premises() -> None:
    pairs = [NLIPair(*row) for row in SNLI_ROWS]
    # P1 run: ent1+con1 (ent2 has no partner); P2: ent3+con2; P3: no contradiction; a later P1 is a new run.
    assert snli_to_triplets(pairs) == [
        Triplet("P1 .", "h-ent1 .", "h-con1 ."),
        Triplet("P2 .", "h-ent3 .", "h-con2 ."),
    ]


def test_senteval_snli_bad_label_and_empty_text_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = [
        ("P .", "a .", "entailment"),
        ("P .", "b .", "-"),
        ("P .", "", "neutral"),
        ("P .", "c .", "neutral"),
    ]
    directory = _write_snli(tmp_path / "snli", "dev", rows)
    with caplog.at_level(logging.WARNING):
        pairs = read_senteval_snli(directory, "dev")
    assert [pair.hypothesis for pair in pairs] == ["a .", "c ."]
    messages = _warnings(caplog)
    assert f"{directory / 'labels.dev'}:2: skipped malformed row: bad label '-'" in messages
    assert f"{directory / 's2.dev'}:3: skipped malformed row: empty text" in messages


def test_senteval_snli_unequal_line_counts(tmp_path: Path) -> None:
    directory = _write_snli(tmp_path / "snli", "dev", SNLI_ROWS[:3])
    _write(directory / "s2.dev", "only one \n")
    with pytest.raises(UserError, match=r"differ in line count .*s2\.dev: 1"):
        read_senteval_snli(directory, "dev")


def test_load_triplets_dispatches_on_source(tmp_path: Path) -> None:
    directory = _write_snli(tmp_path / "snli", "dev", SNLI_ROWS[:3])
    _write_snli(directory, "test", SNLI_ROWS[4:7])
    _write(tmp_path / "t.csv", "sent0,sent1,hard_neg\na,b,c\n")
    dev = Triplet("P1 .", "h-ent1 .", "h-con1 .")
    test = Triplet("P2 .", "h-ent3 .", "h-con2 .")
    assert load_triplets(str(directory)) == [dev, test]
    assert load_triplets(f"{directory}:test") == [test]
    assert load_triplets("snli:test+dev", data_root=tmp_path) == [test, dev]
    assert load_triplets("t.csv", data_root=tmp_path) == [Triplet("a", "b", "c")]
    with pytest.raises(UserError, match="no SNLI"):
        load_triplets(str(tmp_path))


# --- Quora --------------------------------------------------------------------------------------------


def test_quora_pairs_keep_ids_and_quoted_fields(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "q.tsv",
        '1\tWhy is the sky blue?\tWhat makes the sky blue?\t18\n0\t"What is ""foo""?"\tIs it bar?\t7\n',
    )
    assert read_quora_pairs(path) == [
        Pair("Why is the sky blue?", "What makes the sky blue?", 1.0, "18"),
        Pair('What is "foo"?', "Is it bar?", 0.0, "7"),
    ]


def test_quora_invalid_utf8_kept_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A curly quote that lost its last byte, as in the shared Quora files.
    data = b"1\ta?\tb?\t1\n0\tHow to ask \xe2\x80?\tc?\t2\n1\td?\te \xff\t3\n"
    path = _write(tmp_path / "q.tsv", data)
    with caplog.at_level(logging.WARNING):
        pairs = read_quora_pairs(path)
    assert [pair.id for pair in pairs] == ["1", "2", "3"]
    assert pairs[1].text1 == "How to ask \ufffd?"
    messages = _warnings(caplog)
    assert f"{path}:2: invalid UTF-8 replaced" in messages
    assert f"{path}:3: invalid UTF-8 replaced" in messages
    assert f"{path}: 2 lines had invalid UTF-8" in messages


def test_quora_malformed_rows_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = "1\ta?\tb?\t1\nx\ta?\tb?\t2\n0\ta?\t\t3\n1\tonly three\t4\n0\tc?\td?\t5\n"
    path = _write(tmp_path / "q.tsv", data)
    with caplog.at_level(logging.WARNING):
        pairs = read_quora_pairs(path)
    assert [pair.id for pair in pairs] == ["1", "5"]
    messages = _warnings(caplog)
    assert f"{path}:2: skipped malformed row: bad label 'x'" in messages
    assert f"{path}:3: skipped malformed row: empty text" in messages
    assert f"{path}:4: skipped malformed row: expected 4 fields, got 3" in messages
    assert f"{path}: skipped 3 malformed rows" in messages


def test_quora_empty_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no Quora pairs"):
        read_quora_pairs(_write(tmp_path / "q.tsv", "\n"))


# --- Hugging Face Hub ---------------------------------------------------------------------------------


def test_hub_failure_is_a_one_line_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")

    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach 'nobody/nothing' on the Hub\nsecond line")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError) as caught:
        load_triplets("hf:nobody/nothing")
    message = str(caught.value)
    assert "\n" not in message
    assert "nobody/nothing" in message
    assert "unreachable or the id is unknown" in message
    assert "local file" in message


def test_hub_rows_map_to_records(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    from training.data.pairs import load_hf_triplets

    tables = {"triplet": {"anchor": ["a", "b", "c"], "positive": ["p", "", "q"], "negative": ["n", "m", "o"]}}
    tables["pair"] = {"anchor": ["a"], "positive": ["p"]}
    monkeypatch.setattr(
        datasets, "load_dataset", lambda _id, subset, split: datasets.Dataset.from_dict(tables[subset])
    )
    # The row with an empty positive is dropped.
    assert load_hf_triplets("x/y") == [Triplet("a", "p", "n"), Triplet("c", "q", "o")]
    with pytest.raises(UserError, match="no column negative"):
        load_hf_triplets("x/y", subset="pair")


# --- the shared data ----------------------------------------------------------------------------------


@pytest.mark.integration
def test_shared_data_counts() -> None:
    if not (SHARED_DATA / "nli" / "snli_devtest_triplets.csv").is_file():
        pytest.skip(f"shared data not found under {SHARED_DATA}")
    triplets = load_triplets("nli/snli_devtest_triplets.csv", data_root=SHARED_DATA)
    assert len(triplets) == 5883
    # The csv was built from the SNLI files with the same recipe.
    assert load_triplets("nli/snli_senteval", data_root=SHARED_DATA) == triplets
    dev = read_senteval_snli(SHARED_DATA / "nli" / "snli_senteval", "dev")
    assert len(dev) == 9842
    assert sum(pair.label == "entailment" for pair in dev) == 3329
    for split in ("dev", "test"):
        pairs = read_quora_pairs(SHARED_DATA / "quora" / f"quora_pairs_{split}.tsv")
        assert len(pairs) == 10000
        assert sum(pair.label for pair in pairs) == 5000
        assert len({pair.id for pair in pairs}) == 10000

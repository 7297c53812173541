"""STS readers and discovery, on tiny files written here."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from distilembed.errors import UserError
from training.data.sts import (
    STSPair,
    find_sts_sets,
    load_stsb_split,
    locate_sts_sets,
    read_scored_pairs,
    read_senteval_sts,
    read_sick,
    read_stsb,
    read_stsb_by_genre,
)
from training.data.text import MAX_WARNINGS

PROCESSED = [
    "main-captions\tMSRvid\t2012test\t0024\t2.500\ta girl is styling her hair ."
    "\ta girl is brushing her hair .",
    "main-news\theadlines\t2013\t0001\t4.0\ta man rides .\ta man is riding .",
]
ORIGINAL = [
    "main-captions\tMSRvid\t2012test\t0024\t2.500\tA girl is styling her hair.\tA girl is brushing her hair.",
    'main-forum\tdeft-forum\t2014\t0003\t1.2\tHe said "no".\tShe said "yes".\tdeft-forum\tdeft-forum',
]


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_read_stsb_processed(tmp_path):
    pairs = read_stsb(write(tmp_path / "sts-test.csv", PROCESSED))
    assert pairs == [
        STSPair("a girl is styling her hair .", "a girl is brushing her hair .", 2.5),
        STSPair("a man rides .", "a man is riding .", 4.0),
    ]


def test_read_stsb_original_keeps_first_seven_fields_and_literal_quotes(tmp_path):
    pairs = read_stsb(write(tmp_path / "sts-test.csv", ORIGINAL))
    assert len(pairs) == 2
    assert pairs[1] == STSPair('He said "no".', 'She said "yes".', 1.2)


def test_read_stsb_skips_and_counts_malformed_rows(tmp_path, caplog):
    lines = [
        PROCESSED[0],
        "too\tfew\tfields",
        "g\tf\ty\t1\tnot-a-number\ts1\ts2",
        "",
        "g\tf\ty\t2\tnan\ts1\ts2",
        PROCESSED[1],
    ]
    path = write(tmp_path / "sts-dev.csv", lines)
    with caplog.at_level(logging.WARNING, logger="training.data.sts"):
        pairs = read_stsb(path)
    assert [p.score for p in pairs] == [2.5, 4.0]
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"{path}:2:" in m for m in messages)
    assert any(f"{path}:3:" in m and "not-a-number" in m for m in messages)
    assert messages[-1] == f"{path}: skipped 3 malformed rows"


def test_per_line_warnings_are_capped(tmp_path, caplog):
    path = write(tmp_path / "sts-test.csv", ["bad"] * 20 + [PROCESSED[0]])
    with caplog.at_level(logging.WARNING, logger="training.data.sts"):
        assert len(read_stsb(path)) == 1
    assert len(caplog.records) == MAX_WARNINGS + 1
    assert "skipped 20 malformed" in caplog.records[-1].getMessage()


def test_read_stsb_invalid_utf8_is_replaced_not_fatal(tmp_path):
    path = tmp_path / "sts-test.csv"
    path.write_bytes(b"g\tf\ty\t1\t3.0\tcaf\xe9 .\tcafe .\n")
    assert read_stsb(path) == [STSPair("caf\ufffd .", "cafe .", 3.0)]


def test_read_stsb_missing_or_empty_is_user_error(tmp_path):
    with pytest.raises(UserError, match=r"not found: .*nope\.csv"):
        read_stsb(tmp_path / "nope.csv")
    empty = write(tmp_path / "empty.csv", ["only\tjunk"])
    with pytest.raises(UserError, match=r"no usable STS pairs in .*empty\.csv"):
        read_stsb(empty)


def make_year(folder: Path, subsets: dict[str, list[tuple[str, str, str]]]) -> Path:
    for subset, rows in subsets.items():
        write(folder / f"STS.input.{subset}.txt", [f"{a}\t{b}" for a, b, _ in rows])
        write(folder / f"STS.gs.{subset}.txt", [gold for _, _, gold in rows])
    return folder


def test_read_senteval_sts_drops_blank_gold_and_skips_bad_lines(tmp_path, caplog):
    folder = make_year(
        tmp_path / "STS16-en-test",
        {
            "headlines": [("a", "b", "4.2"), ("c", "d", ""), ("e", "f", "0")],
            "plagiarism": [("g", "h", "x"), ("i", "j", "3")],
        },
    )
    # A raw STS16 line with two source columns keeps its two sentences.
    write(folder / "STS.input.plagiarism.txt", ["g\th", "i\tj\tsrc1\tsrc2"])
    write(folder / "STS.input.odd.txt", ["no tab here", "k\tl"])
    write(folder / "STS.gs.odd.txt", ["1", "2"])
    with caplog.at_level(logging.WARNING, logger="training.data.sts"):
        data = read_senteval_sts(folder)
    assert list(data) == ["headlines", "odd", "plagiarism"]
    assert data["headlines"] == [STSPair("a", "b", 4.2), STSPair("e", "f", 0.0)]
    assert data["plagiarism"] == [STSPair("i", "j", 3.0)]
    assert data["odd"] == [STSPair("k", "l", 2.0)]
    assert any("STS.input.plagiarism.txt:1:" in r.getMessage() for r in caplog.records)
    assert read_senteval_sts(folder, ["headlines"]).keys() == {"headlines"}


def test_read_senteval_sts_errors(tmp_path):
    with pytest.raises(UserError, match="STS folder not found"):
        read_senteval_sts(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"no STS\.input"):
        read_senteval_sts(tmp_path / "empty")
    folder = make_year(tmp_path / "y", {"a": [("s", "t", "1")]})
    write(folder / "STS.gs.a.txt", ["1", "2"])
    with pytest.raises(UserError, match="has 1 lines but"):
        read_senteval_sts(folder)
    write(folder / "STS.gs.a.txt", [""])
    with pytest.raises(UserError, match=r"no usable STS pairs in .*STS\.input\.a\.txt"):
        read_senteval_sts(folder)
    with pytest.raises(UserError, match=r"STS file not found: .*STS\.input\.zzz\.txt"):
        read_senteval_sts(folder, ["zzz"])


SICK_HEADER = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"


def test_read_sick(tmp_path, caplog):
    path = write(
        tmp_path / "SICK_test_annotated.txt",
        [
            SICK_HEADER,
            "6\tThere is no boy playing\tA boy is playing\t3.3\tCONTRADICTION",
            "7\tshort row\t4.0",
            "8\tA dog runs\tA dog is running\t4.9\tENTAILMENT",
        ],
    )
    with caplog.at_level(logging.WARNING, logger="training.data.sts"):
        pairs = read_sick(path)
    assert pairs == [
        STSPair("There is no boy playing", "A boy is playing", 3.3),
        STSPair("A dog runs", "A dog is running", 4.9),
    ]
    assert any(f"{path}:3:" in r.getMessage() for r in caplog.records)


def test_read_sick_rejects_file_without_header(tmp_path):
    path = write(tmp_path / "SICK_test_annotated.txt", ["6\ta\tb\t3.3\tNEUTRAL"])
    with pytest.raises(UserError, match="not a SICK file"):
        read_sick(path)
    with pytest.raises(UserError, match="not found"):
        read_sick(tmp_path / "SICK.txt")


def make_senteval_tree(root: Path) -> Path:
    """SentEval's data/downstream layout, with the original STS-B release beside the processed one."""
    sts = root / "STS"
    for year, subset in [("STS16", "headlines"), ("STS12", "MSRvid"), ("STS14", "images")]:
        make_year(sts / f"{year}-en-test", {subset: [("a", "b", "1"), ("c", "d", "2")]})
    write(sts / "STSBenchmark" / "original" / "sts-test.csv", ORIGINAL)
    write(sts / "STSBenchmark" / "sts-test.csv", PROCESSED)
    write(root / "SICK" / "SICK_test_annotated.txt", [SICK_HEADER, "1\ta\tb\t3\tNEUTRAL"])
    (sts / "STS13-en-test").mkdir()  # no files: not a set
    return root


def test_find_sts_sets_order_and_processed_stsb_preferred(tmp_path, caplog):
    root = make_senteval_tree(tmp_path / "downstream")
    located = locate_sts_sets(root)
    assert list(located) == ["STS12", "STS14", "STS16", "STS-B", "SICK-R"]
    assert located["STS-B"] == root / "STS" / "STSBenchmark" / "sts-test.csv"
    with caplog.at_level(logging.WARNING, logger="training.data.sts"):
        sets = find_sts_sets(root)
    assert list(sets) == list(located)
    assert sets["STS12"] == {"MSRvid": [STSPair("a", "b", 1.0), STSPair("c", "d", 2.0)]}
    assert sets["STS-B"][0].sentence1 == "a girl is styling her hair ."
    assert sets["SICK-R"] == [STSPair("a", "b", 3.0)]
    # Only one of SentEval's five STS12 subsets is there: the score would not be comparable.
    assert any("STS12: subsets missing" in r.getMessage() for r in caplog.records)


def test_find_sts_sets_falls_back_to_original_and_ignores_unknown_subsets(tmp_path):
    write(tmp_path / "stsbenchmark" / "original" / "sts-test.csv", ORIGINAL)
    folder = make_year(tmp_path / "STS13-en-test", {"FNWN": [("a", "b", "1")], "SMT": [("c", "d", "2")]})
    sets = find_sts_sets(tmp_path)
    assert list(sets) == ["STS13", "STS-B"]
    assert sets["STS-B"][0].sentence1 == "A girl is styling her hair."
    assert list(sets["STS13"]) == ["FNWN"]
    assert (folder / "STS.input.SMT.txt").is_file()


def test_find_sts_sets_errors(tmp_path):
    with pytest.raises(UserError, match="STS directory not found"):
        find_sts_sets(tmp_path / "absent")
    write(tmp_path / "a" / "b" / "c" / "d" / "sts-test.csv", PROCESSED)  # deeper than searched
    write(tmp_path / "notes.txt", ["hello"])
    with pytest.raises(UserError, match=r"no known STS set in .*looked for STS12-en-test/.*SICK_test"):
        find_sts_sets(tmp_path)


def test_load_stsb_split_from_file_folder_or_parent(tmp_path):
    bench = tmp_path / "sts" / "stsbenchmark"
    write(bench / "sts-dev.csv", PROCESSED[:1])
    write(bench / "original" / "sts-dev.csv", ORIGINAL[:1])
    write(bench / "original" / "sts-train.csv", ORIGINAL)
    assert load_stsb_split(bench / "sts-dev.csv", "dev")[0].sentence1.startswith("a girl")
    assert load_stsb_split(bench, "dev")[0].sentence1.startswith("a girl")
    assert load_stsb_split(tmp_path, "dev")[0].sentence1.startswith("a girl")
    assert load_stsb_split(bench / "original", "dev")[0].sentence1.startswith("A girl")
    assert len(load_stsb_split(tmp_path, "train")) == 2
    with pytest.raises(UserError, match=r"no sts-test\.csv under"):
        load_stsb_split(tmp_path, "test")
    with pytest.raises(UserError, match="unknown STS-B split 'validation'"):
        load_stsb_split(tmp_path, "validation")
    with pytest.raises(UserError, match=r"nowhere \(pass --sts-dir or set DISTILEMBED_DATA_DIR\)"):
        load_stsb_split(tmp_path / "nowhere", "dev")


def test_read_stsb_by_genre_splits_read_stsb_by_column_one(tmp_path):
    lines = [ORIGINAL[1], PROCESSED[0], "too\tfew", PROCESSED[1], PROCESSED[0]]
    path = write(tmp_path / "sts-test.csv", lines)
    genres = read_stsb_by_genre(path)
    assert list(genres) == ["main-forum", "main-captions", "main-news"]  # first appearance
    assert [len(pairs) for pairs in genres.values()] == [1, 2, 1]
    assert genres["main-captions"] == [read_stsb(path)[1], read_stsb(path)[3]]
    assert [p.score for p in read_stsb(path)] == [1.2, 2.5, 4.0, 2.5]  # read_stsb keeps file order


def test_read_scored_pairs_takes_stsb_or_a_named_header(tmp_path, caplog):
    stsb = tmp_path / "sts-train.csv"
    stsb.write_text("\n".join(PROCESSED) + "\n")
    assert read_scored_pairs(stsb) == read_stsb(stsb)
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text(
        "id\tsentence1\tsentence2\tscore\n1\ta cat\ta kitten\t0.9\n2\ta cat\t\t0.1\n3\tx\ty\tn/a\n"
    )
    with caplog.at_level(logging.WARNING):
        assert read_scored_pairs(tsv) == [STSPair("a cat", "a kitten", 0.9)]
    assert "skipped 2 malformed rows" in caplog.text
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text('sentence1,sentence2,score\n"a dog, barking",a dog,4\n')
    assert read_scored_pairs(csv_file) == [STSPair("a dog, barking", "a dog", 4.0)]
    bad = tmp_path / "bad.csv"
    bad.write_text("text_a,text_b,label\na,b,1\n")
    with pytest.raises(UserError, match="missing: sentence1, sentence2, score"):
        read_scored_pairs(bad)

"""bench/quality.py transfer's pure parts on hand-made vectors and tiny files: the SNLI grades, the graded
Spearman, the Quora AP, the STS-B genres, the block it renders. No teacher, no real data."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from harness import named_path
from quality import Sets, cosine_ap, load_sets, main, paired_delta, score

from training.data.sts import STSPair


def test_cosine_ap_by_hand() -> None:
    # ranked by cosine: +, -, +, -: precision 1 at the first positive, 2/3 at the second
    assert cosine_ap([0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0]) == pytest.approx(100 * (1 + 2 / 3) / 2)
    assert cosine_ap([0.1, 0.9], [1.0, 0.0]) == pytest.approx(50.0)


def unit_at(cosine: float) -> np.ndarray:
    """A unit vector whose cosine with (1, 0) is ``cosine``."""
    return np.array([cosine, math.sqrt(1 - cosine**2)])


def anchored(prefix: str, cosines: list[float], gold: list[float]) -> tuple[list[STSPair], dict]:
    """Pairs (anchor, prefix-i) whose cosine is cosines[i]; the anchor is shared, as SNLI premises are."""
    vectors = {f"{prefix}-anchor": np.array([1.0, 0.0])}
    pairs = []
    for i, (c, g) in enumerate(zip(cosines, gold, strict=True)):
        vectors[f"{prefix}-{i}"] = unit_at(c)
        pairs.append(STSPair(f"{prefix}-anchor", f"{prefix}-{i}", g))
    return pairs, vectors


def test_score_by_hand() -> None:
    captions, v1 = anchored("cap", [0.1, 0.2, 0.3], [1, 2, 3])  # genre: +100
    news, v2 = anchored("news", [0.6, 0.5, 0.4], [1, 2, 3])  # genre: -100; pooled with captions: 0
    # grades 2, 1, 0, 0 against cosine ranks 4, 2, 3, 1: Spearman 3 / sqrt(4.5 * 5)
    snli, v3 = anchored("snli", [0.9, 0.2, 0.5, 0.1], [2, 1, 0, 0])
    quora, v4 = anchored("q", [0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0])
    vectors = v1 | v2 | v3 | v4
    calls: list[tuple[str, list[str]]] = []

    def embed(sentences: list[str], name: str) -> np.ndarray:
        calls.append((name, sentences))
        return np.stack([vectors[s] for s in sentences])

    row = score(embed, Sets({"main-captions": captions, "main-news": news}, snli, quora))
    snli_rho = 100 * 3 / math.sqrt(22.5)
    cosines = row.pop("cosines")
    np.testing.assert_allclose(cosines["snli"], [0.9, 0.2, 0.5, 0.1], atol=1e-6)
    np.testing.assert_allclose(cosines["quora"], [0.9, 0.8, 0.7, 0.1], atol=1e-6)
    assert row == {
        "stsb_test": 0.0,
        "genres": {"main-captions": 100.0, "main-news": -100.0},
        "snli_graded": round(snli_rho, 2),
        "quora_ap": 83.33,
        "proxy_mean": round((snli_rho + 250 / 3) / 2, 2),
    }
    assert [name for name, _ in calls] == ["STS-B", "SNLI", "Quora"]  # each set embedded once
    assert all(len(set(sentences)) == len(sentences) for _, sentences in calls)
    assert len(calls[1][1]) == 5  # the shared premise once


def bootstrap_sets(n: int) -> tuple[Sets, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    grades = rng.integers(0, 3, n).astype(float)
    labels = rng.integers(0, 2, n).astype(float)
    sets = Sets(
        {},
        [STSPair(f"a{i}", f"b{i}", g) for i, g in enumerate(grades)],
        [STSPair(f"q{i}", f"r{i}", y) for i, y in enumerate(labels)],
    )
    return sets, grades, labels


def test_paired_bootstrap_of_one_model_against_itself_is_zero() -> None:
    sets, grades, labels = bootstrap_sets(200)
    rng = np.random.default_rng(2)
    model = {"snli": grades + rng.normal(0, 1, 200), "quora": labels + rng.normal(0, 1, 200)}
    assert paired_delta(model, model, sets, rounds=50) == (0.0, 0.0)
    assert paired_delta(model, model, sets, rounds=50, quora_only=True) == (0.0, 0.0)


def test_quora_only_bootstrap_ignores_the_snli_cosines() -> None:
    sets, grades, labels = bootstrap_sets(400)
    rng = np.random.default_rng(4)
    quora = labels + rng.normal(0, 1, 400)
    snli_good, snli_bad = grades + rng.normal(0, 0.1, 400), rng.normal(0, 1, 400)
    ref, other = {"snli": snli_bad, "quora": quora}, {"snli": snli_good, "quora": quora}
    assert paired_delta(ref, other, sets, rounds=100, quora_only=True) == (0.0, 0.0)
    assert paired_delta(ref, other, sets, rounds=100)[0] > 0


def test_paired_bootstrap_separates_a_better_model() -> None:
    sets, grades, labels = bootstrap_sets(400)
    rng = np.random.default_rng(3)
    noise = {"snli": rng.normal(0, 1, 400), "quora": rng.normal(0, 1, 400)}
    worse = {"snli": grades + 2 * noise["snli"], "quora": labels + 2 * noise["quora"]}
    better = {"snli": grades + 0.5 * noise["snli"], "quora": labels + 0.5 * noise["quora"]}
    low, high = paired_delta(worse, better, sets, rounds=200)
    assert 0 < low < high
    low, high = paired_delta(better, worse, sets, rounds=200)
    assert low < high < 0


def write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def tiny_root(root: Path) -> Path:
    rows = [("main-forums", "f"), ("main-captions", "c1"), ("main-news", "n"), ("main-captions", "c2")]
    write(root / "sts/stsbenchmark/sts-test.csv", [f"{g}\tx\t2012\t{i}\t{i}.0\t{s} a\t{s} b" for i, (g, s) in
                                                   enumerate(rows)])  # fmt: skip
    for split, label in (("dev", "entailment"), ("test", "contradiction")):
        write(root / f"nli/snli_senteval/s1.{split}", [f"premise {split}"])
        write(root / f"nli/snli_senteval/s2.{split}", [f"hypothesis {split}"])
        write(root / f"nli/snli_senteval/labels.{split}", [label])
    write(root / "quora/quora_pairs_dev.tsv", ["1\tq1?\tq2?\t7", "0\tq3?\tq4?\t8"])
    write(root / "quora/quora_pairs_test.tsv", ["0\tq5?\tq6?\t9"])
    return root


def test_sets_pool_the_splits_and_order_the_genres(tmp_path: Path) -> None:
    sets = load_sets(str(tiny_root(tmp_path)))
    assert list(sets.stsb) == ["main-captions", "main-news", "main-forums"]
    assert [p.sentence1 for p in sets.stsb["main-captions"]] == ["c1 a", "c2 a"]
    assert [(p.sentence1, p.score) for p in sets.snli] == [("premise dev", 2.0), ("premise test", 0.0)]
    assert [(p.sentence1, p.score) for p in sets.quora] == [("q1?", 1.0), ("q3?", 0.0), ("q5?", 0.0)]
    assert sets.sizes() == {
        "stsb_test": {"main-captions": 2, "main-news": 1, "main-forums": 1},
        "snli": 2,
        "quora": 3,
        "quora_duplicates": 1,
    }


def test_bundle_names_are_name_equals_dir() -> None:
    assert named_path("default=models/default") == ("default", "models/default")
    for bad in ("models/default", "=models/default", "default="):
        with pytest.raises(argparse.ArgumentTypeError):
            named_path(bad)


def test_render_from_writes_the_transfer_block(tmp_path: Path) -> None:
    doc = tmp_path / "results.md"
    doc.write_text("<!-- results:transfer:start -->\n<!-- results:transfer:end -->\n")
    row = {"stsb_test": 83.06, "genres": {"main-captions": 90.0, "main-news": 80.0}, "snli_graded": 60.5,
           "quora_ap": 70.25, "proxy_mean": 65.38, "dim": 128, "seconds": 1.0}  # fmt: skip
    result = {
        "sets": {
            "stsb_test": {"main-captions": 2, "main-news": 1},
            "snli": 4,
            "quora": 5,
            "quora_duplicates": 2,
        },
        "variant": "int8",
        "bootstrap": 1000,
        "rows": [
            row
            | {"model": "default", "kind": "bundle", "path": "models/default", "delta_ci95": None}
            | {"snli_trained": True},
            row
            | {"model": "all-mpnet-base-v2", "kind": "teacher", "path": "all-mpnet-base-v2", "dim": 768}
            | {
                "delta": 0.5,
                "delta_ci95": [-0.25, 1.0],
                "quora_delta": -0.1,
                "quora_delta_ci95": [-0.3, 0.1],
            },
        ],
        "run": {"command": "python bench/transfer.py", "machine": "m", "date": "2026-11-27"},
    }
    saved = tmp_path / "transfer.json"
    saved.write_text(json.dumps(result))
    main(["transfer", "--render-from", str(saved), "--doc", str(doc)])
    lines = doc.read_text().splitlines()
    assert (
        "| model | dim | STS-B test | captions | news | SNLI graded | Quora AP | mean (SNLI, Quora AP) "
        "| mean - default's [95% CI] | Quora AP - default's [95% CI] |" in lines
    )
    first = (
        "| default (`models/default`) | 128 | 83.06 | 90.00 | 80.00 | 60.50 (trained on) | 70.25 "
        "| **65.38** |  |  |"
    )
    assert first in lines
    assert (
        "| all-mpnet-base-v2 (teacher) | 768 | 83.06 | 90.00 | 80.00 | 60.50 | 70.25 | **65.38** "
        "| +0.50 [-0.25, +1.00] | -0.10 [-0.30, +0.10] |" in lines
    )
    assert any(
        line.startswith("Pairs: STS-B test 3 (captions 2, news 1); SNLI dev + test 4;") for line in lines
    )

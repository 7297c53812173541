"""``distilembed rotate``: Pearson's loss on a hand-computed case, the rotation fitted on synthetic
vectors whose signal sits outside the prefix, then a tiny student through the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from export.bundle import trained_widths
from tests.tiny_models import tiny_sentences
from training.data.sts import STSPair
from training.losses.matryoshka import Widths
from training.rotation import (
    LabelledVectors,
    RotationSettings,
    fit_rotation,
    orthogonalise,
    pearson_loss,
    width_scorer,
)


def test_pearson_loss_by_hand() -> None:
    # x = [1, 2, 4] centred: [-4/3, -1/3, 5/3]; y = [1, 2, 3] centred: [-1, 0, 1].
    # sum xy = 3, ||x|| = sqrt(42) / 3, ||y|| = sqrt(2): r = 9 / sqrt(84).
    loss = pearson_loss(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 2.0, 3.0]))
    assert float(loss) == pytest.approx(-9 / math.sqrt(84))
    assert float(pearson_loss(torch.tensor([3.0, 2.0, 1.0]), torch.tensor([1.0, 2.0, 3.0]))) == pytest.approx(
        1.0
    )
    # Scale and offset of the predictions do not matter.
    assert float(
        pearson_loss(torch.tensor([5.0, 7.0, 11.0]), torch.tensor([1.0, 2.0, 3.0]))
    ) == pytest.approx(-9 / math.sqrt(84))
    with pytest.raises(ValueError, match="1-d tensors"):
        pearson_loss(torch.tensor([1.0]), torch.tensor([1.0]))


def test_orthogonalise_returns_the_polar_factor() -> None:
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    assert orthogonalise(q) == pytest.approx(q)
    r = orthogonalise(q + 1e-3 * rng.normal(size=(5, 5)))
    assert r @ r.T == pytest.approx(np.eye(5), abs=1e-12)


def synthetic_pairs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """4-d vectors: coordinates 0-1 noise, 2-3 the signal; gold is the signal's cosine."""
    rng = np.random.default_rng(seed)
    left, right = rng.normal(size=(n, 4)), rng.normal(size=(n, 4))
    right[:, 2:] = left[:, 2:] + rng.normal(scale=rng.uniform(0.1, 2.0, size=(n, 1)), size=(n, 2))
    signal = (
        (left[:, 2:] * right[:, 2:]).sum(1)
        / np.linalg.norm(left[:, 2:], axis=1)
        / np.linalg.norm(right[:, 2:], axis=1)
    )
    left[:, 2:] *= 3  # the signal also dominates the full-width cosine
    right[:, 2:] *= 3
    return left.astype(np.float32), right.astype(np.float32), signal.astype(np.float32)


def as_sts(
    left: np.ndarray, right: np.ndarray, gold: np.ndarray
) -> tuple[list[str], np.ndarray, list[STSPair]]:
    names = [f"l{i}" for i in range(len(left))] + [f"r{i}" for i in range(len(right))]
    pairs = [STSPair(f"l{i}", f"r{i}", float(g)) for i, g in enumerate(gold)]
    return names, np.concatenate([left, right]), pairs


def test_fit_moves_the_signal_into_the_prefix_and_keeps_full_width_cosines() -> None:
    widths = Widths((4, 2), (1.0, 1.0))
    left, right, gold = synthetic_pairs(400, seed=1)
    empty = np.zeros((0, 4), dtype=np.float32)
    data = LabelledVectors(left, right, gold, empty, empty, empty)
    score = width_scorer(*as_sts(*synthetic_pairs(300, seed=2)), widths)
    fit = fit_rotation(data, widths, score, RotationSettings(steps=150, lr=0.05, eval_every=10))
    assert fit.start_dev[2] < 20  # the identity's prefix holds only noise
    assert fit.dev[2] > 80 and fit.best_step > 0
    assert fit.dev[4] == pytest.approx(fit.start_dev[4], abs=1e-9)  # full width: the same cosines
    assert fit.rotation @ fit.rotation.T == pytest.approx(np.eye(4), abs=1e-12)
    assert [p["step"] for p in fit.curve if "dev_spearman" in p] == list(range(0, 151, 10))


def test_no_step_better_than_the_identity_keeps_the_identity() -> None:
    widths = Widths((4, 2), (1.0, 1.0))
    left, right, gold = synthetic_pairs(200, seed=3)
    empty = np.zeros((0, 4), dtype=np.float32)
    data = LabelledVectors(left, right, gold, empty, empty, empty)
    fit = fit_rotation(
        data,
        widths,
        lambda r: {4: 1.0, 2: -float(np.abs(r - np.eye(4)).sum())},
        RotationSettings(steps=5, lr=0.05, eval_every=1),
    )
    assert fit.best_step == 0
    assert fit.rotation == pytest.approx(np.eye(4))


def test_cli_rotates_a_student_into_a_matryoshka_checkpoint(
    tiny_dense_student: Path, nli_data: Path, tmp_path: Path, run_cli
) -> None:
    from sentence_transformers import SentenceTransformer

    from training.whitening import dense_outputs

    out = tmp_path / "rotated"
    result = run_cli(
        "rotate", str(tiny_dense_student), "--out", str(out), "--matryoshka", "8,4,2",
        "--triplets", "nli/triplets.csv", "--steps", "20", "--eval-every", "5", "--lr", "0.05",
        env={"DISTILEMBED_DATA_DIR": str(nli_data)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "STS-B dev by width" in result.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["matryoshka"]["widths"] == [8, 4, 2] and manifest["matryoshka"]["fitted_by"] == "rotate"
    assert set(manifest["matryoshka"]["scores"]) == {"4", "2"}
    record = manifest["rotate"]
    assert record["pairs_used"] + record["pairs_excluded"] == 40 and record["pairs_used"] > 0
    assert record["triplets_used"] > 0 and record["settings"]["triplet_weight"] == 0.1
    assert trained_widths(out, 8) == [8, 4, 2]  # what export records as the bundle's widths

    probe = tiny_sentences(30, seed=99)
    source, rotated = (SentenceTransformer(str(p), device="cpu") for p in (tiny_dense_student, out))
    before, after = dense_outputs(source, probe), dense_outputs(rotated, probe)
    rotation, *_ = np.linalg.lstsq(before.astype(np.float64), after.astype(np.float64), rcond=None)
    assert after == pytest.approx(before @ rotation, abs=1e-4)  # the Dense output, rotated
    assert rotation @ rotation.T == pytest.approx(np.eye(8), abs=1e-4)
    a, b = source.encode(probe), rotated.encode(probe)
    assert a @ a.T == pytest.approx(b @ b.T, abs=1e-5)  # full-width cosines unchanged


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--matryoshka", "6,3"), "must start at the student's width 8"),
        (("--matryoshka", "8"), "needs a width below the student's 8"),
        (("--matryoshka", "8,x"), "--matryoshka takes comma-separated ints"),
        (("--matryoshka", "8,4", "--matryoshka-weights", "1,0"), "nothing to fit"),
        (("--pairs", "none", "--triplets", "none"), "needs labelled pairs"),
        (("--pairs", "missing.csv"), "--pairs: no such file"),
    ],
)
def test_cli_bad_input_is_one_line(
    tiny_dense_student: Path, tiny_data: Path, tmp_path: Path, run_cli, extra: tuple[str, ...], message: str
) -> None:
    out = tmp_path / "o"
    result = run_cli(
        "rotate", str(tiny_dense_student), "--out", str(out), "--triplets", "none", "--steps", "2", *extra,
        env={"DISTILEMBED_DATA_DIR": str(tiny_data)},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_cli_reads_the_users_own_scored_pairs(
    tiny_dense_student: Path, tiny_data: Path, tmp_path: Path, run_cli
) -> None:
    from training.data.sts import load_stsb_split

    rows = [(p.sentence1, p.sentence2, p.score) for p in load_stsb_split(tiny_data / "sts", "train")]
    own = tmp_path / "own.tsv"
    own.write_text("score\tsentence1\tsentence2\n" + "".join(f"{s}\t{a}\t{b}\n" for a, b, s in rows))
    args = ("rotate", str(tiny_dense_student), "--triplets", "none", "--steps", "3", "--eval-every", "1")
    env = {"DISTILEMBED_DATA_DIR": str(tiny_data)}
    result = run_cli(*args, "--out", str(tmp_path / "a"), "--pairs", str(own), env=env)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["rotate"]["pairs"] == str(own) and manifest["rotate"]["pairs_used"] > 0
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("a,b,label\nx,y,1\n")
    refused = run_cli(*args, "--out", str(tmp_path / "b"), "--pairs", str(wrong), env=env)
    assert refused.returncode == 2 and "missing: sentence1, sentence2, score" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "b").exists()

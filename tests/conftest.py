from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.tiny_models import make_tiny_bert, make_tiny_sentence_model, tiny_sentences

pytest_plugins = ["tests.service_client"]  # make_client, clean_service_env

SHARED_DATA = Path(
    os.environ.get("DISTILEMBED_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data")
)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own cache dir; the reassembled mpnet teacher is shared read-only."""
    monkeypatch.setenv("DISTILEMBED_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-bert")


@pytest.fixture(scope="session")
def tiny_dense_student(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny student checkpoint ending in an affine Dense layer (8-d), for whiten and rotate."""
    from training.student import build_student

    path = tmp_path_factory.mktemp("ckpt") / "student"
    build_student(str(tiny_bert), dim=8, max_seq_len=16).save(str(path))
    return path


@pytest.fixture(scope="session")
def tiny_teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_sentence_model(tmp_path_factory.mktemp("models") / "tiny-teacher")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root: a small corpus and an STS-B layout with dev and test."""
    root = tmp_path_factory.mktemp("data")
    (root / "corpus.txt").write_text("\n".join(tiny_sentences(300)) + "\n")
    sts = root / "sts" / "stsbenchmark"
    sts.mkdir(parents=True)
    for split, seed in (("train", 3), ("dev", 4), ("test", 5)):
        left, right = tiny_sentences(40, seed), tiny_sentences(40, seed + 10)
        rows = [
            f"main-captions\tMSRvid\t2012test\t{i:04d}\t{(i * 7) % 6 * 0.9:.1f}\t{a}\t{b}"
            for i, (a, b) in enumerate(zip(left, right, strict=True))
        ]
        (sts / f"sts-{split}.csv").write_text("\n".join(rows) + "\n")
    return root


@pytest.fixture(scope="session")
def nli_data(tiny_data):
    """The tiny data root plus a SimCSE-style triplet csv under nli/."""
    anchors, positives, negatives = tiny_sentences(40, 21), tiny_sentences(40, 22), tiny_sentences(40, 23)
    rows = ["sent0,sent1,hard_neg"] + [
        f"{a},{p},{n}" for a, p, n in zip(anchors, positives, negatives, strict=True)
    ]
    (tiny_data / "nli").mkdir(exist_ok=True)
    (tiny_data / "nli" / "triplets.csv").write_text("\n".join(rows) + "\n")
    return tiny_data


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "sts" / "stsbenchmark" / "sts-test.csv").is_file():
        pytest.skip("shared data not available")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_bundle(tiny_bert, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An exported bundle of a tiny random student (int8 gate relaxed: random weights quantise badly)."""
    from export.bundle import ParityGate, build_bundle
    from training.student import build_student

    checkpoint = tmp_path_factory.mktemp("ckpt") / "student"
    build_student(str(tiny_bert), dim=8, max_seq_len=16).save(str(checkpoint))
    out = tmp_path_factory.mktemp("bundles") / "tiny"
    build_bundle(
        checkpoint,
        out,
        parity_texts=tiny_sentences(20),
        gate=ParityGate(int8_mean_cosine=0.0),
        static_texts=tiny_sentences(64, seed=5),
    )
    return out


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """``distilembed ARGS`` through the real entry point (its error handling and exit codes), in this
    process: a new interpreter would spend ~9 s importing torch for each bad-input case. An error the
    entry point does not turn into a message propagates and fails the test. ``env`` adds variables."""
    from distilembed import cli

    def run(*args: str, env: dict[str, str] | None = None) -> CliResult:
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(sys, "argv", ["distilembed", *args])
        capsys.readouterr()
        try:
            cli.main()
            code = 0
        except SystemExit as exited:
            code = exited.code if isinstance(exited.code, int) else 1
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run

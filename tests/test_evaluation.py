"""STS scoring, SentEval 'all' aggregation, the results table and the eval command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from distilembed.errors import UserError
from training import eval_cli
from training.data.sts import STSPair
from training.eval_cli import eval_command
from training.evaluation import (
    cosine_rows,
    evaluate_pairs,
    evaluate_sts,
    format_table,
    sentence_transformer_encoder,
    spearman_x100,
)
from training.teachers import resolve_model


def spearman_cosine(emb1: np.ndarray, emb2: np.ndarray, gold: list[float]) -> float:
    return spearman_x100(cosine_rows(emb1, emb2), gold)


def test_spearman_cosine_hand_computed():
    emb1 = np.array([[1.0, 0.0]] * 4)
    emb2 = np.array([[2.0, 0.0], [1.0, 1.0], [0.0, 3.0], [-1.0, 0.0]])  # cosines 1, .71, 0, -1
    gold = [5.0, 3.0, 4.0, 0.0]
    # Ranks 4,3,2,1 vs 4,2,3,1: sum d^2 = 2, rho = 1 - 6*2 / (4*15) = 0.8.
    assert spearman_cosine(emb1, emb2, gold) == pytest.approx(80.0)


def test_spearman_cosine_zero_vector_and_degenerate_inputs():
    emb1 = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    emb2 = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])  # cosines 0, .71, 1
    assert spearman_cosine(emb1, emb2, [1.0, 2.0, 3.0]) == pytest.approx(100.0)
    assert math.isnan(spearman_cosine(emb1, emb1 + 1, [1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="one shape"):
        spearman_cosine(emb1, emb2[:2], [1.0, 2.0])
    with pytest.raises(ValueError, match="one length"):
        spearman_cosine(emb1, emb2, [1.0, 2.0])


class AngleEncoder:
    """Sentence 'x=<c>' embeds at cosine c to sentence 'ref'; records every call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, sentences: list[str]) -> np.ndarray:
        self.calls.append(list(sentences))
        out = []
        for text in sentences:
            c = 1.0 if text == "ref" else float(text.removeprefix("x="))
            out.append([c, math.sqrt(1 - c * c)])
        return np.array(out)


def pairs_at(cosines: list[float], gold: list[float]) -> list[STSPair]:
    return [STSPair("ref", f"x={c}", g) for c, g in zip(cosines, gold, strict=True)]


def test_evaluate_pairs_encodes_each_distinct_sentence_once():
    encode = AngleEncoder()
    pairs = [*pairs_at([0.1, 0.5, 0.9], [1.0, 2.0, 3.0]), STSPair("x=0.5", "ref", 2.5)]
    # Tied ranks 1, 2.5, 4, 2.5 vs 1, 2, 4, 3: Pearson of ranks = 4.5 / sqrt(4.5 * 5) = sqrt(0.9).
    assert evaluate_pairs(encode, pairs) == pytest.approx(100 * math.sqrt(0.9))
    assert len(encode.calls) == 1
    assert sorted(encode.calls[0]) == ["ref", "x=0.1", "x=0.5", "x=0.9"]


def test_all_aggregation_concatenates_subsets():
    # Each subset ranks perfectly on its own; across subsets the ranking is reversed.
    year = {"a": pairs_at([0.1, 0.2], [4.0, 5.0]), "b": pairs_at([0.8, 0.9], [0.0, 1.0])}
    stsb = pairs_at([0.1, 0.2, 0.3], [1.0, 3.0, 2.0])
    seen: list[str] = []
    results = evaluate_sts(AngleEncoder(), {"STS12": year, "STS-B": stsb}, progress=seen.append)
    assert results["subsets"] == {"STS12": {"a": pytest.approx(100.0), "b": pytest.approx(100.0)}}
    # Concatenated ranks 1,2,3,4 vs gold 3,4,1,2: sum d^2 = 16, rho = 1 - 96/60 = -0.6.
    assert results["scores"]["STS12"] == pytest.approx(-60.0)
    assert results["scores"]["STS-B"] == pytest.approx(50.0)
    assert results["scores"]["Avg."] == pytest.approx(-5.0)
    assert list(results["scores"]) == ["STS12", "STS-B", "Avg."]
    assert results["pairs"] == {"STS12": 4, "STS-B": 3}
    assert seen == ["STS12", "STS-B"]


def test_sentence_transformer_encoder_passes_options():
    class Model:
        def encode(self, sentences, **kwargs):
            self.kwargs = kwargs
            return [[float(len(s)), 1.0] for s in sentences]

    model = Model()
    out = sentence_transformer_encoder(model, batch_size=7)(["ab", "c"])
    assert isinstance(out, np.ndarray)
    assert out.shape == (2, 2)
    assert model.kwargs == {"batch_size": 7, "convert_to_numpy": True, "show_progress_bar": False}


def render(table) -> str:
    console = Console(record=True, width=200)
    console.print(table)
    return console.export_text()


def test_format_table_columns_in_paper_order():
    results = {"scores": {"SICK-R": 70.0, "STS-B": 82.034, "STS13": 60.0, "Avg.": 70.678}}
    text = render(format_table(results, "mini", 128, 22_713_216))
    header = next(line for line in text.splitlines() if "STS13" in line)
    names = ["Model", "STS13", "STS-B", "SICK-R", "Avg.", "Dim", "Params"]
    positions = [header.index(name) for name in names]
    assert positions == sorted(positions)
    assert "STS12" not in header
    row = next(line for line in text.splitlines() if "mini" in line)
    for cell in ["60.00", "82.03", "70.00", "70.68", "128", "22.7M"]:
        assert cell in row


class FakeModel:
    """What the eval command needs of a SentenceTransformer: encode and a dimension."""

    def get_embedding_dimension(self) -> int:
        return 26

    def encode(self, sentences, batch_size, convert_to_numpy, show_progress_bar):
        assert convert_to_numpy and not show_progress_bar and batch_size == 3
        return np.array([[s.count(chr(97 + i)) for i in range(26)] for s in sentences], dtype=float)


def make_data(root: Path) -> Path:
    sts = root / "sts"
    rows = [("a cat sat", "a cat sits", "4.5"), ("a dog ran", "the sky", "0.5"), ("big red", "red big", "5")]
    year = sts / "STS13-en-test"
    year.mkdir(parents=True)
    for subset in ("FNWN", "headlines", "OnWN"):
        (year / f"STS.input.{subset}.txt").write_text("".join(f"{a}\t{b}\n" for a, b, _ in rows))
        (year / f"STS.gs.{subset}.txt").write_text("".join(f"{g}\n" for *_, g in rows))
    bench = sts / "stsbenchmark"
    bench.mkdir()
    lines = [f"g\tf\ty\t{i}\t{g}\t{a}\t{b}\n" for i, (a, b, g) in enumerate(rows)]
    (bench / "sts-test.csv").write_text("".join(lines))
    return sts


@pytest.fixture
def cli(monkeypatch):
    loaded: list[tuple[str, str]] = []

    def fake_loader(name: str, device: str = "cpu") -> FakeModel:
        loaded.append((name, device))
        return FakeModel()

    monkeypatch.setattr(eval_cli, "load_sentence_encoder", fake_loader)
    app = typer.Typer()
    app.command("eval")(eval_command)
    app.command("other")(lambda: None)  # two commands, so "eval" stays a subcommand
    return app, loaded


def test_eval_command_end_to_end(cli, tmp_path, monkeypatch):
    app, loaded = cli
    sts = make_data(tmp_path / "data")
    monkeypatch.setenv("DISTILEMBED_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "out" / "sts.json"
    args = ["eval", "--model", "fake", "--json", str(out), "--batch-size", "3", "--device", "cpu"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert loaded == [("fake", "cpu")]
    assert "STS13" in result.output and "STS-B" in result.output and "fake" in result.output
    report = json.loads(out.read_text())
    assert report["model"] == "fake" and report["dim"] == 26 and report["params"] is None
    assert list(report["scores"]) == ["STS13", "STS-B", "Avg."]
    assert report["pairs"] == {"STS13": 9, "STS-B": 3}
    assert set(report["subsets"]["STS13"]) == {"FNWN", "headlines", "OnWN"}
    assert report["sources"]["STS-B"] == str(sts / "stsbenchmark" / "sts-test.csv")
    direct = evaluate_pairs(sentence_transformer_encoder(FakeModel(), 3), _stsb_pairs())
    assert report["scores"]["STS-B"] == pytest.approx(direct)
    assert report["scores"]["Avg."] == pytest.approx(np.mean([report["scores"]["STS13"], direct]))


def test_eval_command_scores_a_bundle_through_the_runtime(cli, tmp_path, tiny_bundle):
    """A bundle is scored as the service encodes (onnxruntime, the chosen graph), no PyTorch model."""
    from export.runtime import Encoder

    app, loaded = cli
    sts = make_data(tmp_path / "data")
    out = tmp_path / "sts.json"
    args = ["eval", "--model", str(tiny_bundle), "--sts-dir", str(sts)]
    result = CliRunner().invoke(app, [*args, "--json", str(out), "--variant", "fp32"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert loaded == [] and report["device"] == "onnx fp32" and report["params"] is None
    runtime = Encoder(tiny_bundle, variant="fp32")
    assert report["dim"] == runtime.dim
    assert report["scores"]["STS-B"] == pytest.approx(evaluate_pairs(runtime.encode, _stsb_pairs()), abs=1e-6)
    bad = CliRunner().invoke(app, [*args, "--variant", "x"])
    assert isinstance(bad.exception, UserError) and "--variant must be int8 or fp32" in str(bad.exception)


def _stsb_pairs() -> list[STSPair]:
    return [
        STSPair("a cat sat", "a cat sits", 4.5),
        STSPair("a dog ran", "the sky", 0.5),
        STSPair("big red", "red big", 5.0),
    ]


def test_eval_command_json_to_stdout(cli, tmp_path):
    app, _ = cli
    sts = make_data(tmp_path)
    runner = CliRunner()
    args = ["eval", "--model", "fake", "--sts-dir", str(sts), "--json", "-", "--batch-size", "3"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["sources"]["STS13"] == str(sts / "STS13-en-test")
    assert "Params" in result.stderr


def test_eval_command_bad_input_is_user_error(cli, tmp_path, monkeypatch):
    app, loaded = cli
    runner = CliRunner()
    result = runner.invoke(app, ["eval", "--model", "fake", "--sts-dir", str(tmp_path / "absent")])
    assert isinstance(result.exception, UserError)
    assert "STS directory not found" in str(result.exception)
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["eval", "--model", "fake", "--sts-dir", str(tmp_path / "empty")])
    assert isinstance(result.exception, UserError)
    assert str(result.exception).startswith("no known STS set in")
    monkeypatch.delenv("DISTILEMBED_DATA_DIR", raising=False)
    result = runner.invoke(app, ["eval", "--model", "fake"])
    assert isinstance(result.exception, UserError)
    assert "--sts-dir" in str(result.exception)
    assert loaded == []  # data problems are found before any model is loaded


@pytest.mark.integration
def test_minilm_on_stsb_test(tmp_path, shared_data):
    sts = shared_data / "sts"
    if not Path(resolve_model("all-MiniLM-L6-v2")).is_dir():
        pytest.skip("packaged all-MiniLM-L6-v2 not installed")
    app = typer.Typer()
    app.command("eval")(eval_command)
    out = tmp_path / "minilm.json"
    args = ["--model", "all-MiniLM-L6-v2", "--sts-dir", str(sts), "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["sources"]["STS-B"].endswith("stsbenchmark/sts-test.csv")  # SentEval-processed
    assert report["pairs"]["STS-B"] == 1379
    assert report["dim"] == 384
    assert 22_000_000 < report["params"] < 23_500_000
    # Measured 82.03 on the processed file (models.md: 82.03).
    assert 81.5 < report["scores"]["STS-B"] < 82.5

    with pytest.raises(UserError, match="model not found"):
        eval_cli.load_sentence_encoder("no-such-model")


def test_vector_lookup_scores_each_pair_s_sentences() -> None:
    from training.data.sts import STSPair
    from training.evaluation import vector_lookup

    sentences = ["a", "b", "c"]
    vectors = np.array([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]])
    # cosines: (a, b) 0.995, (a, c) 0, (b, c) 0.0995: the same order as the gold scores
    pairs = [STSPair("a", "b", 5.0), STSPair("a", "c", 0.0), STSPair("b", "c", 1.0)]
    assert evaluate_pairs(vector_lookup(sentences, vectors), pairs) == pytest.approx(100.0)
    reversed_gold = [STSPair(p.sentence1, p.sentence2, 5.0 - p.score) for p in pairs]
    assert evaluate_pairs(vector_lookup(sentences, vectors), reversed_gold) == pytest.approx(-100.0)

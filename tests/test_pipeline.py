"""End to end on tiny in-process models: train -> checkpoint -> reload; and the CLI's errors."""

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from distilembed.errors import UserError
from training.config import PRESETS, make_config
from training.pipeline import run_training, started_run

ROOT = Path(__file__).resolve().parents[1]


def _cfg(tiny_teacher, tiny_bert, **kw):
    base = {
        "teacher": str(tiny_teacher),
        "student": str(tiny_bert),
        "dim": 8,
        "n_sentences": 120,
        "pca_sample": 120,
        "corpus": "corpus.txt",
        "batch_size": 16,
        "max_steps": 6,
        "eval_every": 3,
        "save_every": 3,
        "max_seq_len": 32,
        "device": "cpu",
        "lr": 1e-3,
    }
    base.update(kw)
    return make_config(None, base)


def test_train_writes_loadable_checkpoint(tiny_teacher, tiny_bert, tiny_data, tmp_path) -> None:
    out = tmp_path / "ckpt"
    manifest = run_training(_cfg(tiny_teacher, tiny_bert), out, data_dir=str(tiny_data))
    model = SentenceTransformer(str(out))
    emb = model.encode(["a man is playing a guitar ."])
    assert emb.shape == (1, 8)
    assert np.linalg.norm(emb) == pytest.approx(1.0, abs=1e-5)
    saved = json.loads((out / "manifest.json").read_text())
    assert saved["kind"] == "checkpoint" and saved["method"] == "hpd"
    assert saved["training"]["steps"] == 6 and saved["training"]["best_step"] in {0, 3, 6}
    assert set(saved["seconds"]) >= {"data", "teacher_targets", "pca", "train", "evaluate"}
    assert saved["data"]["sentences"] == 120 and len(saved["data"]["sentences_sha256"]) == 64
    assert "STS-B" in saved["scores"] and "stsb_test_pca8" in saved["teacher"]["reference"]
    assert (out / "training_curve.png").stat().st_size > 1000
    assert saved["files"]["modules.json"]
    assert not out.with_name("ckpt.partial").exists()
    assert manifest["student"]["dim"] == 8


def test_save_load_round_trip_is_exact(tiny_teacher, tiny_bert, tiny_data, tmp_path) -> None:
    out = tmp_path / "ckpt"
    run_training(_cfg(tiny_teacher, tiny_bert, max_steps=3), out, data_dir=str(tiny_data))
    best = SentenceTransformer(str(out))
    again = SentenceTransformer(str(out))
    texts = ["a dog is running in the park .", "the cat sits ."]
    np.testing.assert_allclose(best.encode(texts), again.encode(texts), atol=1e-6)
    assert [type(m).__name__ for m in best] == ["Transformer", "Pooling", "Dense", "Normalize"]


def test_teacher_cache_reused(tiny_teacher, tiny_bert, tiny_data, tmp_path) -> None:
    run_training(_cfg(tiny_teacher, tiny_bert, max_steps=1), tmp_path / "one", data_dir=str(tiny_data))
    manifest = run_training(
        _cfg(tiny_teacher, tiny_bert, max_steps=1), tmp_path / "two", data_dir=str(tiny_data)
    )
    assert manifest["teacher_cache"]["reused_rows"] == 120


def test_unfinished_run_needs_resume(tiny_teacher, tiny_bert, tiny_data, tmp_path) -> None:
    out = tmp_path / "ckpt"
    out.with_name("ckpt.partial").mkdir()
    with pytest.raises(UserError, match="--resume"):
        run_training(_cfg(tiny_teacher, tiny_bert), out, data_dir=str(tiny_data))
    manifest = run_training(
        _cfg(tiny_teacher, tiny_bert, max_steps=2), out, data_dir=str(tiny_data), resume=True
    )
    assert manifest["training"]["steps"] == 2


def test_only_a_run_with_a_snapshot_leaves_its_partial(tmp_path) -> None:
    """A failure before the first snapshot removes the work directory the run made (the corrected
    command then needs no --resume); one after it keeps it to resume; a resumed run keeps its own."""
    cfg, out = make_config(None, {}), tmp_path / "run"
    partial = out.with_name("run.partial")
    with pytest.raises(UserError), started_run(cfg, out, resume=False, overwrite=False):
        raise UserError("corpus is empty")
    assert not partial.exists()
    with pytest.raises(KeyboardInterrupt), started_run(cfg, out, resume=False, overwrite=False) as work:
        (work / "finetune" / "state").mkdir(parents=True)  # a later stage's snapshot counts too
        (work / "finetune" / "state" / "loop.json").write_text("{}")
        raise KeyboardInterrupt
    assert (partial / "finetune" / "state" / "loop.json").is_file()
    (partial / "finetune" / "state" / "loop.json").unlink()
    with pytest.raises(UserError), started_run(cfg, out, resume=True, overwrite=False):
        raise UserError("a resumed run failing")
    assert partial.is_dir()


def test_too_few_sentences_for_the_pca_is_a_user_error(tiny_teacher, tiny_bert, tiny_data, tmp_path) -> None:
    cfg = _cfg(tiny_teacher, tiny_bert, n_sentences=8, pca_sample=8)
    with pytest.raises(UserError, match="more than --dim 8 sentences"):
        run_training(cfg, tmp_path / "ckpt", data_dir=str(tiny_data))


def _cli(*args, env_data=None):
    import os

    env = dict(os.environ)
    if env_data:
        env["DISTILEMBED_DATA_DIR"] = str(env_data)
    return subprocess.run(
        [sys.executable, "-m", "distilembed.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


BAD_TRAIN_INPUT = [
    (["--corpus", "missing.txt"], "corpus not found"),
    (["--corpus", "empty.txt"], "corpus is empty"),
    (["--skip-sentences", "100000000"], "no sentences after skipping the first 100000000"),
    (["--skip-sentences", "-1"], "must not be negative"),
    (["--corpus", "data.parquet"], "unknown corpus format"),
    (["--teacher", "no-such-teacher"], "model not found"),
    (["--dim", "64"], "at most the student's hidden size 32"),
    (["--sts-dir", "nowhere"], "STS"),
]


def _train_args(tiny_teacher: Path, tiny_bert: Path, tiny_data: Path, out: Path) -> list[str]:
    (tiny_data / "empty.txt").write_text("\n\n")
    (tiny_data / "data.parquet").write_bytes(b"PAR1")
    return [
        *("train", "--out", str(out), "--teacher", str(tiny_teacher), "--student", str(tiny_bert)),
        *("--corpus", "corpus.txt", "--dim", "8", "--max-steps", "1"),
    ]


def _one_error_line(stderr: str, message: str) -> None:
    lines = [line for line in stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], stderr
    assert "Traceback" not in stderr


def test_cli_bad_input_is_one_line_in_a_real_process(tiny_teacher, tiny_bert, tiny_data, tmp_path) -> None:
    args, message = BAD_TRAIN_INPUT[0]
    result = _cli(*_train_args(tiny_teacher, tiny_bert, tiny_data, tmp_path / "o"), *args, env_data=tiny_data)
    assert result.returncode == 2, result.stderr
    _one_error_line(result.stderr, message)


@pytest.mark.parametrize(("args", "message"), BAD_TRAIN_INPUT)
def test_cli_bad_input_is_one_line(
    args, message, tiny_teacher, tiny_bert, tiny_data, tmp_path, run_cli
) -> None:
    base = _train_args(tiny_teacher, tiny_bert, tiny_data, tmp_path / "o")
    result = run_cli(*base, *args, env={"DISTILEMBED_DATA_DIR": str(tiny_data)})
    assert result.returncode == 2, result.stderr
    _one_error_line(result.stderr, message)
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()


def test_congen_ens_hpd_preset_whiten_and_finetune_are_the_default_models_recipe() -> None:
    """`--preset congen-ens-hpd-cpu` reproduces models/default's training config, field by field
    (device and stage-2 settings aside: the preset leaves device to auto, and its stage-2 fields are
    the `finetune` command's flags), `distilembed whiten` at its default fit settings made the
    checkpoint, and, where the provenance says so, `distilembed finetune` then ran on it (a model
    soup: on each ingredient, which `distilembed average --greedy` then mixed)."""
    provenance = json.loads((ROOT / "models" / "default" / "provenance.json").read_text())
    shipped = dict(provenance["train_config"])
    preset = asdict(make_config("congen-ens-hpd-cpu", {}))
    soup = provenance.get("average")
    tunes = soup["ingredients"] if soup else [provenance["finetune"]] if "finetune" in provenance else []
    if tunes:  # finetune adds its --exclude-text to the source run's, which come first
        excluded = shipped.pop("exclude_text")
        assert excluded[: len(preset["exclude_text"])] == list(preset["exclude_text"])
    whitened_dev = max(c["dev_spearman"] for c in provenance["whiten"]["candidates"])
    for tune in tunes:
        assert (tune["data"], tune["loss"]) == ("nli/snli_devtest_triplets.csv", "simcse-eq7")
        assert tune["best_dev_spearman"] >= whitened_dev
    if soup:  # a greedy soup keeps an ingredient only if dev does not drop
        assert soup["recipe"] == "greedy soup"
        assert soup["dev_spearman"] >= max(t["best_dev_spearman"] for t in tunes)
    ignored = {"device", "extra"} | {key for key in preset if key.startswith("finetune_")}
    differing = {
        key: (preset[key], value)
        for key, value in shipped.items()
        if key not in ignored and key in preset and _plain(preset[key]) != value
    }
    assert differing == {}
    white = provenance["whiten"]
    assert (white["corpus"], white["sentences"]) == ("unlabeled/enwiki2015_1m_sentences.txt.gz", 20000)
    assert [c["power"] for c in white["candidates"]] == [0.125, 0.25, 0.375, 0.5]
    assert white["power"] == max(white["candidates"], key=lambda c: c["dev_spearman"])["power"]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_a_valid_configuration(name: str) -> None:
    """Each preset passes the same validation as a command line (no contradictory fields)."""
    config = make_config(name, {})
    assert config.widths().widths[0] == config.dim


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value

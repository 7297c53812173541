"""``distilembed finetune``: NLI fine-tuning of a finished checkpoint, on tiny in-process models."""

import json
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from distilembed.errors import UserError
from tests.test_methods import _cfg as method_cfg
from training.finetune import finetune_checkpoint
from training.pipeline import run_training

SETTINGS = {
    "finetune_data": "nli/triplets.csv",
    "finetune_batch_size": 8,
    "finetune_max_steps": 4,
    "finetune_eval_every": 2,
    "finetune_lr": 1e-3,
    "device": "cpu",
}


def _train(tiny_teacher: Path, tiny_bert: Path, data: Path, out: Path, **kw: object) -> Path:
    """A tiny ConGen run, configured as the methods' tests configure theirs."""
    run_training(
        method_cfg(tiny_teacher, tiny_bert, "congen", max_steps=2, eval_every=2, **kw),
        out,
        data_dir=str(data),
    )
    return out


@pytest.fixture(scope="module")
def source(
    tiny_teacher: Path, tiny_bert: Path, nli_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return _train(tiny_teacher, tiny_bert, nli_data, tmp_path_factory.mktemp("src") / "congen")


def test_finetune_writes_a_checkpoint_with_the_sources_provenance(
    source: Path, nli_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "nli"
    manifest = finetune_checkpoint(source, out, SETTINGS, data_dir=str(nli_data))
    first = json.loads((source / "manifest.json").read_text())
    info = manifest["finetune"]
    assert info["source"]["files"] == first["files"]  # the source as it was, by hash
    assert info["steps"] == 4 and info["best_step"] in {0, 2, 4} and info["loss"] == "simcse-eq7"
    assert info["stopped_early"] is False  # no --patience: the run goes to its last step
    assert info["triplets"] == 40 and info["triplets_excluded"] == 0 and info["lr"] == pytest.approx(1e-3)
    # Step 0 is a candidate, so the result never scores below its source on dev.
    assert info["best_dev_spearman"] >= info["source_dev_spearman"]
    assert [s["name"] for s in manifest["stages"]] == ["train", "finetune"]
    assert manifest["teacher"] == first["teacher"] and manifest["method"] == "congen"
    assert "STS-B" in manifest["scores"] and "finetune_finetune" in manifest["seconds"]
    assert manifest["matryoshka"]["widths"] == [8]  # what export reads the trained widths from
    assert not out.with_name("nli.partial").exists()
    emb = SentenceTransformer(str(out), device="cpu").encode(["a man is playing a guitar ."])
    assert emb.shape == (1, 8) and np.linalg.norm(emb) == pytest.approx(1.0, abs=1e-5)


def test_finetune_moves_the_weights_and_keeps_the_best_dev_step(
    source: Path, nli_data: Path, tmp_path: Path
) -> None:
    manifest = finetune_checkpoint(source, tmp_path / "nli", SETTINGS, data_dir=str(nli_data))
    curve = json.loads((tmp_path / "nli" / "training_curve.json").read_text())
    scores = {point["step"]: point["dev_spearman"] for point in curve if "dev_spearman" in point}
    assert set(scores) == {0, 2, 4}
    best = manifest["finetune"]["best_step"]
    assert scores[best] == max(scores.values())
    before = SentenceTransformer(str(source), device="cpu").state_dict()
    after = SentenceTransformer(str(tmp_path / "nli"), device="cpu").state_dict()
    moved = any(not np.allclose(before[k].numpy(), after[k].numpy()) for k in before)
    assert moved == (best != 0)


def test_one_command_twice_is_the_same_run(source: Path, nli_data: Path, tmp_path: Path) -> None:
    """``--seed`` seeds dropout as well as the data order, so a recipe repeats itself exactly."""
    curves = []
    for name in ("a", "b"):
        finetune_checkpoint(source, tmp_path / name, SETTINGS, data_dir=str(nli_data))
        curves.append(json.loads((tmp_path / name / "training_curve.json").read_text()))
    losses = [[p["loss"] for p in curve if "loss" in p and p.get("stage") == "finetune"] for curve in curves]
    assert losses[0] and losses[0] == losses[1]
    assert curves[0] == curves[1]


def test_a_matryoshka_student_is_fine_tuned_at_its_widths(
    tiny_teacher: Path, tiny_bert: Path, nli_data: Path, tmp_path: Path
) -> None:
    mrl = _train(
        tiny_teacher, tiny_bert, nli_data, tmp_path / "mrl", matryoshka=[8, 4], matryoshka_weights=[1, 2]
    )
    manifest = finetune_checkpoint(mrl, tmp_path / "nli", SETTINGS, data_dir=str(nli_data))
    assert manifest["matryoshka"]["widths"] == [8, 4] and manifest["matryoshka"]["weights"] == [1.0, 2.0]
    assert manifest["matryoshka"]["selection"] == "mean STS-B dev over the widths"
    assert set(manifest["matryoshka"]["scores"]) == {"4"}
    heavier = {**SETTINGS, "matryoshka_weights": [1, 8]}
    manifest = finetune_checkpoint(mrl, tmp_path / "nli8", heavier, data_dir=str(nli_data))
    assert manifest["matryoshka"]["weights"] == [1.0, 8.0] and manifest["config"]["matryoshka_weights"] == [
        1,
        8,
    ]
    with pytest.raises(UserError, match="needs 2 values"):
        finetune_checkpoint(
            mrl, tmp_path / "x", {**SETTINGS, "matryoshka_weights": [1]}, data_dir=str(nli_data)
        )


def test_an_interrupted_run_needs_resume_and_finishes_with_it(
    source: Path, nli_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "nli"
    (tmp_path / "nli.partial").mkdir()
    with pytest.raises(UserError, match="pass --resume"):
        finetune_checkpoint(source, out, SETTINGS, data_dir=str(nli_data))
    manifest = finetune_checkpoint(source, out, SETTINGS, data_dir=str(nli_data), resume=True)
    assert manifest["finetune"]["steps"] == 4


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"finetune_lr": 0.0}, "--finetune-lr must be positive"),
        ({"finetune_temperature": -1.0}, "--finetune-temperature must be positive"),
        ({"finetune_data": "nli/missing.csv"}, "missing.csv"),
        ({"matryoshka_weights": [1, 2]}, "needs a Matryoshka student"),
        ({"finetune_patience": -1}, "--finetune-patience must be >= 0"),
    ],
)
def test_bad_settings_are_user_errors(
    source: Path, nli_data: Path, tmp_path: Path, settings: dict, message: str
) -> None:
    with pytest.raises(UserError, match=message):
        finetune_checkpoint(source, tmp_path / "x", {**SETTINGS, **settings}, data_dir=str(nli_data))
    assert not (tmp_path / "x.partial").exists()  # nothing to resume: the corrected command just runs


def test_cli_names_a_bundle_in_one_line(tiny_bundle: Path, tmp_path: Path, run_cli) -> None:
    result = run_cli("finetune", str(tiny_bundle), "--out", str(tmp_path / "x"))
    assert result.returncode == 2 and "needs a training checkpoint" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_whitened_source_keeps_its_whitening_record(source: Path, nli_data: Path, tmp_path: Path) -> None:
    from tests.tiny_models import tiny_sentences
    from training.whitening import whiten_checkpoint

    white = tmp_path / "white"
    whiten_checkpoint(source, white, tiny_sentences(60, seed=3), [0.5], corpus="tiny")
    manifest = finetune_checkpoint(white, tmp_path / "nli", SETTINGS, data_dir=str(nli_data))
    assert manifest["whiten"]["power"] == 0.5
    assert manifest["finetune"]["source"]["path"] == str(white)


def test_triplets_with_excluded_text_are_dropped_besides_the_sources_exclusions(
    source: Path, nli_data: Path, tmp_path: Path
) -> None:
    from training.data.pairs import load_triplets

    triplets = load_triplets("nli/triplets.csv", str(nli_data))
    held_out = tmp_path / "held_out.txt"
    held_out.write_text("\n".join(t.anchor.upper() for t in triplets[:3]) + "\n")  # matched as normalised
    settings = {**SETTINGS, "exclude_text": [str(held_out)]}
    manifest = finetune_checkpoint(source, tmp_path / "nli", settings, data_dir=str(nli_data))
    first = json.loads((source / "manifest.json").read_text())
    assert manifest["config"]["exclude_text"] == [*first["config"]["exclude_text"], str(held_out)]
    assert manifest["finetune"]["triplets_excluded"] == 3 and manifest["finetune"]["triplets"] == 37

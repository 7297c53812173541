"""``--init-from``: a run that starts from a finished checkpoint's weights (more epochs on a run)."""

import json

import pytest

from distilembed.errors import UserError
from tests.test_pipeline import _cfg
from training.pipeline import run_training
from training.student import build_student, load_trained_weights


def _dev_curve(ckpt) -> list[dict]:
    curve = json.loads((ckpt / "training_curve.json").read_text())
    return [p for p in curve if "dev_spearman" in p]


def test_continued_run_starts_where_the_checkpoint_ended(
    tiny_teacher, tiny_bert, tiny_data, tmp_path
) -> None:
    first = tmp_path / "first"
    manifest = run_training(_cfg(tiny_teacher, tiny_bert, max_steps=4), first, data_dir=str(tiny_data))
    second = tmp_path / "second"
    cfg = _cfg(tiny_teacher, tiny_bert, max_steps=3, init_from=str(first), seed=43)
    run_training(cfg, second, data_dir=str(tiny_data))
    step0 = _dev_curve(second)[0]
    # Same weights, same PCA, same dev set: the continued run's starting score is the first run's best.
    assert step0["step"] == 0
    assert step0["dev_spearman"] == pytest.approx(manifest["training"]["best_dev_spearman"], abs=0.01)
    saved = json.loads((second / "manifest.json").read_text())
    assert saved["config"]["init_from"] == str(first)


def test_init_from_rejects_another_shape(tiny_teacher, tiny_bert, tiny_data, tmp_path) -> None:
    first = tmp_path / "first"
    run_training(_cfg(tiny_teacher, tiny_bert, max_steps=2), first, data_dir=str(tiny_data))
    student = build_student(str(tiny_bert), dim=4, max_seq_len=32)
    with pytest.raises(UserError, match="another shape"):
        load_trained_weights(student, str(first))


def test_init_from_rejects_a_folder_that_is_no_checkpoint(tiny_bert, tmp_path) -> None:
    student = build_student(str(tiny_bert), dim=4, max_seq_len=32)
    with pytest.raises(UserError, match="not a sentence-transformers checkpoint"):
        load_trained_weights(student, str(tmp_path))


def test_init_from_excludes_a_projection_warm_start(tiny_teacher, tiny_bert) -> None:
    with pytest.raises(UserError, match="drop --init-projection"):
        _cfg(tiny_teacher, tiny_bert, init_from="x", init_projection="ridge")

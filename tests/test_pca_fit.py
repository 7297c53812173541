"""``--pca-fit``: which sentences fit the HPD PCA, and resuming runs saved before a field existed."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from distilembed.errors import UserError
from training.config import TrainConfig
from training.data.extra_text import pca_fit_texts
from training.pipeline import prepare_dirs

STSB = [
    "main-captions\tMSRvid\t2012test\t0001\t2.5\tb second .\ta first .",
    "main-captions\tMSRvid\t2012test\t0002\t4.0\ta first .\tc third .",
]


def test_corpus_fit_needs_no_extra_sentences() -> None:
    assert pca_fit_texts(TrainConfig(), None) == []


def test_stsb_csv_gives_its_unique_sentences_sorted(tmp_path: Path) -> None:
    (tmp_path / "sts-train.csv").write_text("\n".join(STSB) + "\n", encoding="utf-8")
    cfg = TrainConfig(pca_fit="sts-train.csv")
    assert pca_fit_texts(cfg, str(tmp_path)) == ["a first .", "b second .", "c third ."]


def test_text_file_gives_its_unique_lines_sorted(tmp_path: Path) -> None:
    (tmp_path / "fit.txt").write_text("zeta\nalpha\nzeta\n", encoding="utf-8")
    assert pca_fit_texts(TrainConfig(pca_fit=str(tmp_path / "fit.txt")), None) == ["alpha", "zeta"]


def test_missing_fit_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--pca-fit file not found"):
        pca_fit_texts(TrainConfig(pca_fit=str(tmp_path / "nope.csv")), None)


def test_resume_accepts_a_config_saved_before_new_fields(tmp_path: Path) -> None:
    cfg = TrainConfig(n_sentences=10)
    out = tmp_path / "run"
    work = out.with_name("run.partial")
    work.mkdir()
    old = asdict(cfg)
    del old["pca_fit"], old["train_on_pca_texts"]  # a run started before these fields existed
    (work / "config.json").write_text(json.dumps(old))
    assert prepare_dirs(cfg, out, resume=True, overwrite=False) == work
    with pytest.raises(UserError, match="different configuration"):
        prepare_dirs(replace(cfg, pca_fit="x.csv"), out, resume=True, overwrite=False)

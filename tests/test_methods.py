"""Every distillation method end to end on tiny in-process models: train -> checkpoint -> reload."""

import json

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from distilembed.errors import UserError
from tests.tiny_models import tiny_sentences
from training.config import METHODS, TWO_STAGE, make_config
from training.pipeline import run_training


def _cfg(tiny_teacher, tiny_bert, method, **kw):
    base = {
        "method": method,
        "teacher": str(tiny_teacher),
        "student": str(tiny_bert),
        "dim": 8,
        "n_sentences": 64,
        "pca_sample": 64,
        "corpus": "corpus.txt",
        "batch_size": 16,
        "max_steps": 3,
        "eval_every": 3,
        "save_every": 2,
        "max_seq_len": 32,
        "device": "cpu",
        "lr": 1e-3,
        "queue_size": 40,
        "token_dim": 8,
        "layers": 1 if method == "simtde" else None,
        "finetune_data": "nli/triplets.csv",
        "finetune_batch_size": 8,
        "finetune_max_steps": 2,
        "finetune_eval_every": 2,
    }
    base.update(kw)
    return make_config(None, base)


@pytest.mark.parametrize("method", METHODS)
def test_method_trains_a_loadable_checkpoint(method, tiny_teacher, tiny_bert, nli_data, tmp_path) -> None:
    out = tmp_path / method
    manifest = run_training(_cfg(tiny_teacher, tiny_bert, method), out, data_dir=str(nli_data))
    model = SentenceTransformer(str(out))
    emb = model.encode(["a man is playing a guitar ."])
    assert emb.shape == (1, 8)
    assert np.linalg.norm(emb) == pytest.approx(1.0, abs=1e-5)
    saved = json.loads((out / "manifest.json").read_text())
    assert saved["method"] == method
    names = [s["name"] for s in saved["stages"]]
    assert names == (["train", "finetune"] if method in TWO_STAGE else ["train"])
    assert saved["stages"][0]["steps"] == 3
    assert set(saved["seconds"]) >= {"teacher_targets", "method_setup", *names, "evaluate"}
    assert "STS-B" in saved["scores"] and saved["student"]["params"] == manifest["student"]["params"] > 0
    assert saved["training"]["best_dev_spearman"] == saved["stages"][-1]["best_dev_spearman"]
    assert not out.with_name(f"{method}.partial").exists()
    if method == "simtde":
        assert saved["student"]["encoder"] == "electra" and saved["student"]["layers"] == 1


def test_interrupted_second_stage_resumes(tiny_teacher, tiny_bert, nli_data, tmp_path, monkeypatch) -> None:
    """A crash in stage 2 keeps stage 1 (and its memory bank) and resumes stage 2 from its snapshot."""
    from training.losses import distilcse

    cfg = _cfg(tiny_teacher, tiny_bert, "distilcse-ckd", finetune_max_steps=4)
    out = tmp_path / "ckd"
    forward = distilcse.ContrastiveFinetuneLoss.forward
    calls = {"n": 0}

    def flaky(self, *args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return forward(self, *args)

    monkeypatch.setattr(distilcse.ContrastiveFinetuneLoss, "forward", flaky)
    with pytest.raises(KeyboardInterrupt):
        run_training(cfg, out, data_dir=str(nli_data))
    partial = out.with_name("ckd.partial")
    assert (partial / "state" / "loop.json").exists() and (partial / "finetune" / "state").exists()
    import torch

    bank = torch.load(partial / "state" / "optim.pt", weights_only=False)["extra_state"]
    assert int(bank["bank.size"]) == 40  # 3 batches of 16 enqueued into a 40-row queue
    manifest = run_training(cfg, out, data_dir=str(nli_data), resume=True)
    assert [s["steps"] for s in manifest["stages"]] == [3, 4]
    assert calls["n"] == 5  # steps 1-2, the crash, then only steps 3-4 again
    assert SentenceTransformer(str(out)).encode(["the dog ."]).shape == (1, 8)


def test_congen_trains_a_simtde_shaped_student(tiny_teacher, tiny_bert, nli_data, tmp_path) -> None:
    cfg = _cfg(tiny_teacher, tiny_bert, "congen", student_arch="simtde", layers=1)
    saved = run_training(cfg, tmp_path / "congen-simtde", data_dir=str(nli_data))
    assert saved["student"]["encoder"] == "electra" and saved["student"]["layers"] == 1
    assert SentenceTransformer(str(tmp_path / "congen-simtde")).encode(["a dog runs ."]).shape == (1, 8)


def test_congen_identity_view_reuses_training_targets(tiny_teacher, tiny_bert, nli_data, tmp_path) -> None:
    cfg = _cfg(tiny_teacher, tiny_bert, "congen", congen_views=["none", "deletion"])
    saved = run_training(cfg, tmp_path / "congen", data_dir=str(nli_data))
    stage = saved["stages"][0]
    assert stage["views"] == ["none", "deletion"]
    assert stage["view1_cache"] == {"reused": "training targets"}  # no second teacher pass


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"method": "mse"}, "unknown method 'mse'"),
        ({"method": "congen", "congen_views": ["deletion"]}, "exactly two"),
        ({"method": "congen", "congen_views": ["deletion", "shuffle"]}, "unknown --congen-view"),
        ({"queue_size": 0}, "--queue-size must be positive"),
        ({"temperature": 0.0}, "--temperature must be positive"),
        ({"token_dim": 1}, "--token-dim"),
        ({"init_projection": "pca"}, "unknown --init-projection"),
        ({"student_arch": "lstm"}, "unknown --student-arch"),
    ],
)
def test_config_rejects_bad_method_settings(overrides, message) -> None:
    with pytest.raises(UserError, match=message):
        make_config(None, overrides)


def test_missing_finetune_data_is_a_user_error(tiny_teacher, tiny_bert, nli_data, tmp_path) -> None:
    cfg = _cfg(tiny_teacher, tiny_bert, "ibkd", finetune_data="nli/missing.csv")
    with pytest.raises(UserError, match="triplet source not found"):
        run_training(cfg, tmp_path / "o", data_dir=str(nli_data))


def test_simtde_checkpoint_exports(tiny_teacher, tiny_bert, nli_data, tmp_path) -> None:
    """The ELECTRA-hosted SimTDE student goes through ``distilembed export`` like the others."""
    from export.bundle import ParityGate, build_bundle
    from export.runtime import Encoder

    out = tmp_path / "simtde"
    run_training(_cfg(tiny_teacher, tiny_bert, "simtde", max_steps=1), out, data_dir=str(nli_data))
    bundle = tmp_path / "bundle"
    texts = tiny_sentences(12, 7)
    build_bundle(out, bundle, parity_texts=texts, gate=ParityGate(int8_mean_cosine=0.0))
    got = Encoder(bundle, variant="fp32", threads=1).encode(texts[:3])
    want = SentenceTransformer(str(out)).encode(texts[:3])
    np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("method", METHODS)
def test_matryoshka_training_records_its_widths(method, tiny_teacher, tiny_bert, nli_data, tmp_path) -> None:
    """``--matryoshka 8,4,2`` trains every method (each stage's loss summed over the widths) and the
    manifest records the widths, the weights, the selection rule and STS scores at each narrower width."""
    out = tmp_path / method
    cfg = _cfg(tiny_teacher, tiny_bert, method, matryoshka=[8, 4, 2], matryoshka_weights=[1, 1, 0.5])
    run_training(cfg, out, data_dir=str(nli_data))
    saved = json.loads((out / "manifest.json").read_text())["matryoshka"]
    assert saved["widths"] == [8, 4, 2] and saved["weights"] == [1.0, 1.0, 0.5]
    assert saved["selection"] == "mean STS-B dev over the widths"
    assert set(saved["scores"]) == {"4", "2"} and all("STS-B" in s for s in saved["scores"].values())


@pytest.mark.parametrize(
    ("widths", "weights", "message"),
    [
        ([4, 2], [], "must start at the student's width 8"),
        ([8, 8, 2], [], "must decrease"),
        ([8, 4, 0], [], "must decrease and stay >= 1"),
        ([8, 4], [1.0], "needs 2 values, got 1"),
        ([8, 4], [1.0, -1.0], "must be >= 0"),
    ],
)
def test_bad_matryoshka_flags_are_one_line_errors(tiny_teacher, tiny_bert, widths, weights, message) -> None:
    with pytest.raises(UserError, match=message):
        _cfg(tiny_teacher, tiny_bert, "hpd", matryoshka=widths, matryoshka_weights=weights)

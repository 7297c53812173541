import numpy as np
import pytest
import torch

from tests.tiny_models import tiny_sentences
from training.config import TrainConfig
from training.losses.hpd import hpd_loss
from training.methods import stage_loop
from training.student import build_student, projected, tokenize
from training.trainer import LoopConfig, Trainer, autocast_dtype, length_grouped_batches


class InterruptedRunError(Exception):
    pass


def _setup(tiny_bert, workdir, fail_at: int | None = None, patience: int = 0, dev_sign: float = -1.0):
    torch.manual_seed(0)
    student = build_student(str(tiny_bert), dim=4, max_seq_len=24)
    texts = tiny_sentences(48)
    targets = torch.from_numpy(np.random.default_rng(0).normal(size=(48, 4)).astype(np.float32))
    calls = {"n": 0}

    def batch_loss(idx):
        calls["n"] += 1
        if fail_at is not None and calls["n"] == fail_at:
            raise InterruptedRunError
        return hpd_loss(projected(student, tokenize(student, [texts[i] for i in idx])), targets[idx])

    dev_calls = []

    def dev_score(model):
        dev_calls.append(1)
        return dev_sign * float(len(dev_calls))  # -1: the first evaluation is best; +1: each beats the last

    lengths = np.array([len(t) for t in texts])
    cfg = LoopConfig(
        batch_size=8, lr=1e-3, epochs=2, eval_every=4, save_every=2, log_every=1, seed=3, patience=patience
    )
    return student, Trainer(
        student, batch_loss, lengths=lengths, cfg=cfg, workdir=workdir, dev_score=dev_score
    )


def test_resume_matches_uninterrupted_run(tiny_bert, tmp_path) -> None:
    student_a, trainer_a = _setup(tiny_bert, tmp_path / "a")
    state_a = trainer_a.run()
    assert state_a.step == 12  # 48 / 8 * 2 epochs

    _, trainer_b = _setup(tiny_bert, tmp_path / "b", fail_at=8)  # dies during step 8
    with pytest.raises(InterruptedRunError):
        trainer_b.run()
    student_c, trainer_c = _setup(tiny_bert, tmp_path / "b")
    state_c = trainer_c.run(resume=True)
    assert state_c.step == 12
    losses_a = [p["loss"] for p in state_a.curve if "loss" in p]
    losses_c = [p["loss"] for p in state_c.curve if "loss" in p]
    assert losses_c == pytest.approx(losses_a, rel=1e-5)
    for (name, pa), (_, pc) in zip(
        student_a.state_dict().items(), student_c.state_dict().items(), strict=True
    ):
        assert torch.allclose(pa, pc, atol=1e-6), name


def test_best_checkpoint_kept(tiny_bert, tmp_path) -> None:
    _, trainer = _setup(tiny_bert, tmp_path / "w")
    state = trainer.run()
    # Step 0 (the init) is evaluated too, and here it scores best, so it is what the run keeps.
    assert state.best_step == 0 and state.best_dev == -1.0
    assert (trainer.best_dir / "modules.json").is_file()
    assert [p["step"] for p in state.curve if "dev_spearman" in p] == [0, 4, 8, 12]


def test_patience_stops_after_evaluations_without_a_new_best(tiny_bert, tmp_path) -> None:
    _, trainer = _setup(tiny_bert, tmp_path / "w", patience=2)
    state = trainer.run()
    # Dev falls at every evaluation: steps 4 and 8 are the two without a new best, so step 8 ends it.
    assert state.stopped_early and state.step == 8 and state.best_step == 0
    assert [p["step"] for p in state.curve if "dev_spearman" in p] == [0, 4, 8]
    # The stop is saved: resuming the stopped run trains no further.
    _, again = _setup(tiny_bert, tmp_path / "w", patience=2)
    resumed = again.run(resume=True)
    assert resumed.stopped_early and resumed.step == 8 and resumed.curve == state.curve


def test_patience_never_stops_a_run_that_keeps_improving(tiny_bert, tmp_path) -> None:
    _, trainer = _setup(tiny_bert, tmp_path / "w", patience=1, dev_sign=1.0)
    state = trainer.run()
    assert not state.stopped_early and state.step == 12 and state.best_step == 12


def test_length_grouped_batches_cover_everything_once() -> None:
    lengths = np.random.default_rng(1).integers(1, 100, size=1003)
    batches = length_grouped_batches(lengths, 16, seed=5)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(1003))
    assert batches == length_grouped_batches(lengths, 16, seed=5)
    assert batches != length_grouped_batches(lengths, 16, seed=6)
    spread = np.mean([np.ptp(lengths[b]) for b in batches if len(b) == 16])
    assert spread < 20  # sorted within mega-batches: little padding


def test_frozen_embeddings_do_not_move(tiny_bert, tmp_path) -> None:
    torch.manual_seed(0)
    student = build_student(str(tiny_bert), dim=4, max_seq_len=24, freeze_embeddings=True)
    words = student[0].auto_model.get_input_embeddings().weight
    before = words.detach().clone()
    dense_before = student[2].linear.weight.detach().clone()
    texts = tiny_sentences(16)
    targets = torch.randn(16, 4)

    def batch_loss(idx):
        return hpd_loss(projected(student, tokenize(student, [texts[i] for i in idx])), targets[idx])

    cfg = LoopConfig(batch_size=8, lr=1e-2, epochs=1, eval_every=100, save_every=100, seed=0)
    Trainer(student, batch_loss, lengths=np.array([len(t) for t in texts]), cfg=cfg, workdir=tmp_path).run()
    assert torch.equal(words, before)
    assert not torch.equal(student[2].linear.weight, dense_before)


def test_amp_autocasts_only_on_a_gpu_and_no_amp_reaches_both_stages() -> None:
    assert autocast_dtype("cpu", amp=True) is None
    assert autocast_dtype("cuda", amp=False) is None
    assert autocast_dtype("cuda:0", amp=False) is None
    cfg = TrainConfig(amp=False)
    assert stage_loop(cfg).amp is False and stage_loop(cfg, finetune=True).amp is False
    assert stage_loop(TrainConfig()).amp is True

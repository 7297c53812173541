"""A small, resumable training loop shared by every distillation method. A method supplies
``batch_loss(indices) -> loss``; the loop owns batching (length-grouped to cut padding), AdamW with
warmup, AMP on CUDA, periodic STS-B dev evaluation that keeps the best student, and atomic state
snapshots for ``--resume``."""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from distilembed.artifacts import atomic_directory, atomic_write_json
from distilembed.errors import UserError, first_line
from training.student import load_trained_weights

log = logging.getLogger(__name__)

BatchLoss = Callable[[list[int]], torch.Tensor]
DevScore = Callable[[SentenceTransformer], float]


@dataclass
class LoopConfig:
    batch_size: int = 64
    lr: float = 1e-4
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    epochs: float = 1.0
    max_steps: int | None = None
    eval_every: int = 500
    save_every: int = 500
    log_every: int = 20
    grad_clip: float = 1.0
    seed: int = 42
    patience: int = 0  # stop after this many dev evaluations without a new best; 0: never
    amp: bool = True  # bf16 autocast on a GPU; never on a CPU


@dataclass
class LoopState:
    step: int = 0
    best_dev: float = float("-inf")
    best_step: int = -1
    curve: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    stopped_early: bool = False


def autocast_dtype(device: str, amp: bool) -> torch.dtype | None:
    """The autocast dtype of a training step: bf16 (fp16 without bf16) on a GPU with amp, else float32."""
    if not amp or not device.startswith("cuda"):
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def length_grouped_batches(lengths: np.ndarray, batch_size: int, seed: int) -> list[list[int]]:
    """Shuffle, sort within mega-batches of 50 batches by length, then shuffle the batches."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lengths))
    mega = batch_size * 50
    batches: list[list[int]] = []
    for lo in range(0, len(order), mega):
        block = order[lo : lo + mega]
        block = block[np.argsort(lengths[block], kind="stable")]
        batches += [block[i : i + batch_size].tolist() for i in range(0, len(block), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def resolve_device(device: str) -> str:
    """``auto`` is CUDA when there is one; a named device must exist (a one-line error, not torch's
    assertion deep in the first forward pass)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError as exc:
        raise UserError(f"--device {device!r}: {first_line(exc)}") from exc
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {device}: no CUDA GPU here (torch {torch.__version__}); use cpu or auto")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"--device {device}: no Apple GPU here; use cpu or auto")
    return device


class Trainer:
    def __init__(
        self,
        student: SentenceTransformer,
        batch_loss: BatchLoss,
        *,
        lengths: np.ndarray,
        cfg: LoopConfig,
        workdir: Path,
        dev_score: DevScore | None = None,
        extra_params: list[torch.nn.Parameter] | None = None,
        extra_state: torch.nn.Module | None = None,
        snapshot_dir: Path | None = None,
    ) -> None:
        """``extra_params``: trained beside the student (loss heads); ``extra_state``: a module whose
        whole state_dict (e.g. a loss's memory-bank buffers) is snapshotted and restored on resume;
        ``snapshot_dir``: also keep the student of every dev evaluation there (``step-NNNNNN``)."""
        self.student, self.batch_loss, self.lengths, self.cfg = student, batch_loss, lengths, cfg
        self.workdir, self.dev_score, self.snapshot_dir = workdir, dev_score, snapshot_dir
        self.extra, self.extra_state = extra_params or [], extra_state
        self.batches_per_epoch = math.ceil(len(lengths) / cfg.batch_size)
        self.total_steps = cfg.max_steps or max(1, round(self.batches_per_epoch * cfg.epochs))
        trainable = [p for p in student.parameters() if p.requires_grad] + self.extra
        self.optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.scheduler = get_linear_schedule_with_warmup(
            self.optimizer, round(cfg.warmup_ratio * self.total_steps), self.total_steps
        )
        self.device = str(student.device)
        self.amp_dtype = autocast_dtype(self.device, cfg.amp)
        self.scaler = torch.amp.GradScaler(enabled=self.amp_dtype == torch.float16)
        self.state = LoopState()
        self.best_dir, self.state_dir = workdir / "best", workdir / "state"

    def _save_student(self, folder: Path) -> None:
        """Save the student into ``folder`` atomically, still in train mode (save() calls eval())."""
        was_training = self.student.training
        with atomic_directory(folder, overwrite=True) as tmp:
            self.student.save(str(tmp))
        self.student.train(was_training)

    def save_state(self) -> None:
        with atomic_directory(self.state_dir, overwrite=True) as tmp:
            self.student.save(str(tmp / "model"))
            self.student.train()  # the loop trains between evaluations; save() left it in eval mode
            torch.save(
                {
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "scaler": self.scaler.state_dict(),
                    "extra": [p.detach().cpu() for p in self.extra],
                    "extra_state": None if self.extra_state is None else self.extra_state.state_dict(),
                    "torch_rng": torch.get_rng_state(),
                    "py_rng": random.getstate(),
                },
                tmp / "optim.pt",
            )
            atomic_write_json(tmp / "loop.json", asdict(self.state))

    def load_state(self) -> None:
        load_trained_weights(self.student, str(self.state_dir / "model"))
        blob = torch.load(self.state_dir / "optim.pt", weights_only=False)
        self.optimizer.load_state_dict(blob["optimizer"])
        self.scheduler.load_state_dict(blob["scheduler"])
        self.scaler.load_state_dict(blob["scaler"])
        with torch.no_grad():
            for param, saved in zip(self.extra, blob["extra"], strict=True):
                param.copy_(saved.to(param.device))
        if self.extra_state is not None and blob.get("extra_state") is not None:
            self.extra_state.load_state_dict(blob["extra_state"])
        torch.set_rng_state(blob["torch_rng"])
        random.setstate(blob["py_rng"])
        self.state = LoopState(**json.loads((self.state_dir / "loop.json").read_text()))
        log.info(
            "resumed at step %d/%d (best dev %.2f)", self.state.step, self.total_steps, self.state.best_dev
        )

    def out_of_patience(self) -> bool:
        """``patience`` dev evaluations in a row have not beaten the best (early stopping)."""
        if self.cfg.patience <= 0:
            return False
        curve, best = self.state.curve, self.state.best_step
        return sum("dev_spearman" in p and p["step"] > best for p in curve) >= self.cfg.patience

    def _evaluate(self) -> None:
        if self.dev_score is None:
            return
        self.student.eval()
        with torch.no_grad():
            score = float(self.dev_score(self.student))
        self.student.train()
        self.state.curve.append({"step": self.state.step, "dev_spearman": round(score, 4)})
        if self.snapshot_dir is not None:
            self._save_student(self.snapshot_dir / f"step-{self.state.step:06d}")
        if score > self.state.best_dev:
            self.state.best_dev, self.state.best_step = score, self.state.step
            self._save_student(self.best_dir)
        best = f"{self.state.best_dev:.2f} @ {self.state.best_step}"
        log.info("step %d: STS-B dev %.2f (best %s)", self.state.step, score, best)

    def _train_step(self, batch: list[int]) -> float:
        device_type = "cuda" if self.device.startswith("cuda") else "cpu"
        with torch.autocast(device_type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            loss = self.batch_loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        return float(loss.detach())

    def run(self, resume: bool = False) -> LoopState:
        if resume and (self.state_dir / "loop.json").exists():
            self.load_state()
        self.student.train()
        if self.state.step == 0 and not self.state.curve:
            self._evaluate()  # the starting point: the init (or the previous stage's best) competes too
        start, window = time.perf_counter() - self.state.seconds, []
        bar = tqdm(
            total=self.total_steps, initial=self.state.step, desc="train", unit="step", dynamic_ncols=True
        )
        while self.state.step < self.total_steps and not self.state.stopped_early:
            epoch, offset = divmod(self.state.step, self.batches_per_epoch)
            batches = length_grouped_batches(self.lengths, self.cfg.batch_size, self.cfg.seed + epoch)
            for batch in batches[offset:]:
                window.append(self._train_step(batch))
                self.state.step += 1
                bar.update(1)
                if self.state.step % self.cfg.log_every == 0 or self.state.step == self.total_steps:
                    mean, lr = float(np.mean(window)), self.scheduler.get_last_lr()[0]
                    self.state.curve.append({"step": self.state.step, "loss": round(mean, 6), "lr": lr})
                    bar.set_postfix(loss=f"{mean:.4f}")
                    window = []
                done = self.state.step == self.total_steps
                if self.state.step % self.cfg.eval_every == 0 or done:
                    self._evaluate()
                    if not done and self.out_of_patience():
                        log.info("no better STS-B dev in %d evaluations: stopping early", self.cfg.patience)
                        self.state.stopped_early = done = True
                if self.state.step % self.cfg.save_every == 0 or done:
                    self.state.seconds = time.perf_counter() - start
                    self.save_state()
                if done:
                    break
        bar.close()
        self.state.seconds = time.perf_counter() - start
        if self.dev_score is None or not self.best_dir.exists():  # no dev set: the last student is the result
            self._save_student(self.best_dir)
        return self.state

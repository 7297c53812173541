"""``distilembed train``: corpus -> teacher targets -> distilled student -> evaluated checkpoint."""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from distilembed.artifacts import atomic_write_json, require_checkpoint, sha256_file
from distilembed.errors import UserError
from distilembed.paths import resolve_data_path
from training.checkpoint import write_checkpoint
from training.config import TrainConfig
from training.data.extra_text import augmented_sets, training_text
from training.data.sts import distinct_sentences, load_stsb_split
from training.data.text import content_hash
from training.evaluation import dev_scorer, evaluate_pairs, final_scores, vector_lookup
from training.losses.hpd import PCATargets
from training.methods import MethodInputs, Stage, build_method_student, method_stages, student_layers
from training.student import init_projection
from training.teacher_targets import AnyTeacher, build_teacher, ensemble_weights
from training.teachers import resolve_model
from training.trainer import LoopState, Trainer, resolve_device

log = logging.getLogger(__name__)


class StageClock:
    """Wall-clock seconds per named stage, for the manifest."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        log.info("stage %s ...", name)
        start = time.perf_counter()
        yield
        self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 2)
        log.info("stage %s done in %.1f s", name, self.seconds[name])


def _check_models(cfg: TrainConfig) -> None:
    """Every model named resolves (a folder, a packaged teacher or a hub id) before the run's folder is
    made: a typo is one line, not an unfinished run that wants ``--resume``."""
    student = resolve_model(cfg.student)
    for name in (cfg.teacher, *(n for n, _ in ensemble_weights(cfg.ensemble_teachers))):
        resolve_model(name)
    config = Path(student) / "config.json"  # a local student: its depth is known before it loads
    if cfg.layers is not None and config.is_file():
        total = json.loads(config.read_text()).get("num_hidden_layers")
        if isinstance(total, int) and cfg.layers > total:
            raise UserError(f"--layers {cfg.layers}: the student {cfg.student!r} has {total} layers")
    if cfg.init_from is not None:
        require_checkpoint(cfg.init_from)


def prepare_dirs(cfg: TrainConfig, out: Path, resume: bool, overwrite: bool) -> Path:
    workdir = out.with_name(out.name + ".partial")
    if out.exists() and not overwrite:
        raise UserError(f"output exists: {out} (pass --overwrite to replace it)")
    saved = workdir / "config.json"
    if workdir.exists() and not resume:
        raise UserError(f"unfinished run in {workdir}: pass --resume to continue it, or delete it")
    if resume and saved.exists():
        # Fields added since the run started count as their defaults.
        before = {**json.loads(json.dumps(asdict(TrainConfig()))), **json.loads(saved.read_text())}
        if before != json.loads(json.dumps(asdict(cfg))):
            raise UserError(f"--resume with a different configuration than {saved}")
    workdir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(saved, asdict(cfg))
    return workdir


@contextmanager
def started_run(cfg: TrainConfig, out: Path, resume: bool, overwrite: bool) -> Iterator[Path]:
    """The run's work directory (:func:`prepare_dirs`), with torch seeded by ``cfg.seed``: the student's new
    layers and dropout then repeat from one run of a command to the next. A failure inside the block before
    the first snapshot (``state/loop.json``, what ``--resume`` continues from) removes a work directory this
    call made: the corrected command then needs no ``--resume`` or manual delete, and loses nothing (teacher
    targets are cached outside it)."""
    made = not out.with_name(out.name + ".partial").exists()
    workdir = prepare_dirs(cfg, out, resume, overwrite)
    torch.manual_seed(cfg.seed)
    try:
        yield workdir
    except BaseException:
        if made and not any(workdir.rglob("state/loop.json")):
            shutil.rmtree(workdir, ignore_errors=True)
        raise


def _teacher_reference(teacher: AnyTeacher, pca: PCATargets, sts_dir: Path) -> dict[str, float]:
    """The ceiling: the teacher's own STS-B dev/test Spearman, full-dim and after the PCA."""
    out: dict[str, float] = {}
    for split in ("dev", "test"):
        pairs = load_stsb_split(sts_dir, split)
        sentences = distinct_sentences(pairs)
        full = np.asarray(teacher.targets(sentences)[0], dtype=np.float32)
        for name, vectors in (("full", full), (f"pca{len(pca.components)}", pca.transform(full))):
            out[f"stsb_{split}_{name}"] = round(evaluate_pairs(vector_lookup(sentences, vectors), pairs), 2)
    return out


def _warm_start_projection(
    cfg: TrainConfig, student: Any, texts: list[str], targets: torch.Tensor, *, workdir: Path, resume: bool
) -> dict[str, Any] | None:
    """``--init-projection ridge``: fit the student's projection before training (skipped when a
    resumed run has a snapshot, whose weights replace it anyway). The report goes in the manifest."""
    report_path = workdir / "projection_init.json"
    if cfg.init_projection != "ridge":
        return None
    if resume and (workdir / "state" / "loop.json").exists() and report_path.exists():
        return json.loads(report_path.read_text())
    rng = np.random.default_rng(cfg.seed)
    sample = np.sort(rng.choice(len(texts), size=min(cfg.projection_sample, len(texts)), replace=False))
    report = init_projection(student, [texts[i] for i in sample], targets[torch.from_numpy(sample)].numpy())
    atomic_write_json(report_path, report)
    return report


def _snapshot_dir(cfg: TrainConfig, out: Path, resume: bool) -> Path | None:
    """``--keep-snapshots``: the student at every dev evaluation, beside OUT, for ``distilembed average``."""
    if not cfg.keep_snapshots:
        return None
    snapshots = out.with_name(f"{out.name}.snapshots")
    if not resume:  # a fresh run: an earlier run's snapshots must not join its soup
        shutil.rmtree(snapshots, ignore_errors=True)
    return snapshots


def run_stages(
    stages: list[Stage],
    student: Any,
    *,
    workdir: Path,
    dev_score: Any,
    clock: StageClock,
    resume: bool,
    snapshot_dir: Path | None = None,
) -> list[tuple[Stage, Trainer, LoopState]]:
    """Train the stages in order; stage k > 0 starts from stage k-1's best (STS-B dev) student and
    keeps its own snapshots in ``workdir/<name>`` (stage 0 uses ``workdir`` itself), so ``--resume``
    continues whichever stage was interrupted."""
    done: list[tuple[Stage, Trainer, LoopState]] = []
    for index, stage in enumerate(stages):
        if done:
            previous = SentenceTransformer(str(done[-1][1].best_dir), device=str(student.device))
            student.load_state_dict(previous.state_dict())
        trainer = Trainer(
            student,
            stage.batch_loss,
            lengths=stage.lengths,
            cfg=stage.loop,
            workdir=workdir if index == 0 else workdir / stage.name,
            dev_score=dev_score,
            extra_params=stage.extra_params,
            extra_state=stage.extra_state,
            snapshot_dir=None if snapshot_dir is None else snapshot_dir / stage.name,
        )
        with clock.stage(stage.name):
            state = trainer.run(resume=resume)
        done.append((stage, trainer, state))
    return done


def stage_report(stage: Stage, state: LoopState) -> dict[str, Any]:
    return {
        "name": stage.name,
        "steps": state.step,
        "best_step": state.best_step,
        "best_dev_spearman": round(state.best_dev, 2),
        "stopped_early": state.stopped_early,
        "train_seconds": round(state.seconds, 2),
        "examples": len(stage.lengths),
        "batch_size": stage.loop.batch_size,
        "lr": stage.loop.lr,
        **stage.info,
    }


def run_training(
    cfg: TrainConfig, out: Path, data_dir: str | None = None, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    clock = StageClock()
    device = resolve_device(cfg.device)
    corpus_path = resolve_data_path(cfg.corpus, data_dir)
    sts_dir = resolve_data_path(cfg.sts_dir, data_dir)
    _check_models(cfg)
    if not corpus_path.is_file():
        raise UserError(
            f"corpus not found: {corpus_path} (pass --corpus or --data-dir, or set DISTILEMBED_DATA_DIR)"
        )
    dev_pairs = load_stsb_split(sts_dir, "dev")
    with started_run(cfg, out, resume, overwrite) as workdir:
        with clock.stage("data"):
            text = training_text(cfg, data_dir)
            texts, pca_texts = text.corpus, text.pca_fit
        with clock.stage("student"):
            student = build_method_student(cfg, texts, device)
            batch, backend = cfg.teacher_batch_size, cfg.teacher_backend
            teacher = build_teacher(
                cfg.teacher, cfg.ensemble_teachers, device=device, batch_size=batch, backend=backend
            )
        with clock.stage("augment"):
            extra_sets = augmented_sets(texts, cfg) + text.more_sets()
        with clock.stage("teacher_targets"):
            base, base_info = teacher.targets(texts)
            pca_fit_targets = teacher.targets(pca_texts)[0] if pca_texts else base[: cfg.pca_sample]
            aug_targets = [pca_fit_targets if s == pca_texts else teacher.targets(s)[0] for s in extra_sets]
        if len(pca_fit_targets) <= cfg.dim:
            raise UserError(
                f"the PCA needs more than --dim {cfg.dim} sentences to fit on; it has {len(pca_fit_targets)} "
                "(raise --n-sentences or --pca-sample, or fit it on --pca-fit sts/stsbenchmark/sts-train.csv)"
            )
        with clock.stage("pca"):
            pca = PCATargets.fit(np.asarray(pca_fit_targets, dtype=np.float32), cfg.dim, cfg.seed)
            all_texts = texts + [t for s in extra_sets for t in s]
            targets = torch.from_numpy(
                np.concatenate([pca.transform(base)] + [pca.transform(a) for a in aug_targets])
            )
        with clock.stage("teacher_reference"):
            reference = _teacher_reference(teacher, pca, sts_dir)
            log.info("teacher reference: %s", reference)
        with clock.stage("projection_init"):
            projection = _warm_start_projection(
                cfg, student, all_texts, targets, workdir=workdir, resume=resume
            )
        with clock.stage("method_setup"):
            parts = [base, *aug_targets]
            stages = method_stages(
                MethodInputs(cfg, student, teacher, all_texts, parts, pca, targets, device, data_dir)
            )
        widths = cfg.widths()
        dev_score, snapshots = dev_scorer(dev_pairs, widths), _snapshot_dir(cfg, out, resume)
        done = run_stages(
            stages,
            student,
            workdir=workdir,
            dev_score=dev_score,
            clock=clock,
            resume=resume,
            snapshot_dir=snapshots,
        )
    _, trainer, state = done[-1]
    with clock.stage("evaluate"):
        best, scores = final_scores(trainer.best_dir, device, sts_dir, widths)
    manifest = {
        "method": cfg.method,
        "config": asdict(cfg),
        "teacher": {
            "name": teacher.name,
            "path": teacher.path,
            "fingerprint": teacher.fingerprint,
            "dim": int(base.shape[1]),
            "reference": reference,
        },
        "student": {
            "init": cfg.student,
            "encoder": best[0].auto_model.config.model_type,
            "layers": student_layers(cfg),
            "params": sum(p.numel() for p in best.parameters()),
            "dim": cfg.dim,
            "max_seq_len": cfg.max_seq_len,
        },
        "data": {
            "corpus": str(corpus_path),
            "corpus_file_sha256": sha256_file(corpus_path),
            "sentences": len(texts),
            "sentences_sha256": content_hash(texts),
            "augmented": {m: len(s) for m, s in zip(cfg.augment, extra_sets, strict=False)},
            "pca_fit_sentences": len(pca_texts),
            "extra_text": {source: len(extra) for source, extra in text.extra.items()},
            "excluded_sentences": text.excluded,
            "corpus_sentences_dropped": text.corpus_dropped,
            "train_examples": len(all_texts),
            "sts_dir": str(sts_dir),
        },
        "projection_init": projection,
        "pca": {
            "fit": cfg.pca_fit,
            "sample": len(pca_fit_targets),
            "explained_variance": round(float(pca.explained_variance_ratio.sum()), 4),
        },
        "teacher_cache": base_info,
        "training": {
            "steps": state.step,
            "best_step": state.best_step,
            "device": device,
            "best_dev_spearman": round(state.best_dev, 2),
        },
        "stages": [stage_report(stage, st) for stage, _, st in done],
        **scores,
        "seconds": clock.seconds,
    }
    curve, offset = [], 0
    for stage, _, st in done:  # one curve, steps counted across the stages
        curve += [{**point, "step": point["step"] + offset, "stage": stage.name} for point in st.curve]
        offset += st.step
    with clock.stage("save"):
        write_checkpoint(trainer.best_dir, out, manifest, curve, overwrite=overwrite)
    shutil.rmtree(workdir, ignore_errors=True)
    manifest["seconds"] = clock.seconds
    return manifest

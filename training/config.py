"""Training configuration: one dataclass, named presets, and CLI overrides."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from distilembed.errors import UserError

if TYPE_CHECKING:  # it imports torch; every command line reads this module (train's help shows its defaults)
    from training.losses.matryoshka import Widths

STUDENT_ARCHS = ("transformer", "simtde")
HEADS = ("linear", "mlp")
METHODS = ("hpd", "ibkd", "distilcse-kd", "distilcse-ckd", "simtde", "congen")
TWO_STAGE = frozenset({"ibkd", "distilcse-kd", "distilcse-ckd"})
AUGMENTATIONS = ("synonym", "deletion", "crop")
# ConGen's views may also be the sentence itself ("none"), whose teacher targets are already cached.
CONGEN_VIEWS = ("none", *AUGMENTATIONS)
PROJECTION_INITS = ("random", "ridge")


@dataclass(frozen=True)
class TrainConfig:
    method: str = "hpd"
    teacher: str = "all-mpnet-base-v2"
    # More teachers, "NAME[:WEIGHT]" (default 0.3); --teacher keeps 1 minus their sum
    # (training/teacher_ensemble.py: cosines averaged by weight).
    ensemble_teachers: tuple[str, ...] = ()
    student: str = "all-MiniLM-L6-v2"
    layers: int | None = None
    freeze_embeddings: bool = False
    dim: int = 128
    # "random" (the papers) or "ridge": fit the projection onto the PCA targets before training
    # (training/projection_init.py), on a sample of projection_sample training sentences.
    init_projection: str = "random"
    projection_sample: int = 10_000
    # A finished checkpoint of the same student shape whose weights (encoder and projection) the
    # run starts from, with a fresh optimiser and schedule: more epochs on top of an earlier run.
    init_from: str | None = None
    corpus: str = "unlabeled/enwiki2015_1m_sentences.txt.gz"
    n_sentences: int = 200_000
    # Skip this many corpus sentences first: a fresh slice for a continued run (--init-from).
    skip_sentences: int = 0
    pca_sample: int = 100_000
    # "corpus" fits the PCA on the first pca_sample training sentences; a data path (STS-B csv or
    # text file) fits it on that file's unique sentences instead (see docs/decisions.md).
    pca_fit: str = "corpus"
    train_on_pca_texts: bool = False
    # More unlabeled text (files or a SentEval directory), and the text no training sentence may equal.
    extra_text: tuple[str, ...] = ()
    exclude_text: tuple[str, ...] = ()
    augment: tuple[str, ...] = ()
    synonym_p: float = 0.3
    deletion_p: float = 0.1
    max_seq_len: int = 128
    teacher_batch_size: int = 64
    # auto: an ONNX Runtime copy of the teacher on a CPU (1.3x faster, parity-checked), torch on a GPU.
    teacher_backend: str = "auto"
    batch_size: int = 64
    lr: float = 1e-4
    # Layer-wise learning-rate decay of stage 1 (training/layer_decay.py): each encoder layer trains at
    # this times the rate of the one above it; 1: one rate for all.
    layer_lr_decay: float = 1.0
    warmup_ratio: float = 0.05
    epochs: float = 1.0
    max_steps: int | None = None
    eval_every: int = 500
    save_every: int = 500
    patience: int = 0  # early stopping: dev evaluations without a new best; 0: never
    # Keep the student of every dev evaluation in OUT.snapshots/<stage>/step-N (distilembed average).
    keep_snapshots: bool = False
    seed: int = 42
    device: str = "auto"
    # Mixed precision on a GPU (bf16 autocast); False trains in float32 there, as on a CPU.
    amp: bool = True
    sts_dir: str = "sts"
    extra: dict[str, Any] = field(default_factory=dict)
    # Matryoshka (training/losses/matryoshka.py): the method's loss at each prefix width, widest
    # first and starting at dim (e.g. 128, 64, 32); empty: dim only. One weight per width (default 1).
    matryoshka: tuple[int, ...] = ()
    matryoshka_weights: tuple[float, ...] = ()
    # Partial whitening of the PCA targets: component variances v become v^(1 - p) (0: plain PCA).
    pca_whiten: float = 0.0
    # How the teacher's targets are cut to dim: "pca", or "neighbourhood" (the PCA refitted to keep
    # each training sentence's neighbours, training/target_reduction.py; decision 58).
    target_reduction: str = "pca"
    # What each narrower width of a ConGen student learns: "prefix" (the teacher's PCA coordinates
    # cut to the same width) or "full" (the teacher's full-width similarity distribution).
    matryoshka_targets: str = "prefix"
    # Where ConGen's teacher distribution is taken: "pca" (the d-dim PCA coordinates the student is
    # compared with) or "full" (the teacher's own space; for every Matryoshka width).
    congen_teacher_space: str = "pca"
    # --- methods other than HPD (docs/methods.md); None means the paper's value for the method ---
    # Teacher memory bank (distilcse-ckd) / instance queue (congen), rows.
    queue_size: int = 16_384
    # Stage-1 temperature: ibkd 0.1, distilcse-ckd 0.05, congen student 0.07.
    temperature: float | None = None
    # ConGen's teacher temperature (0.05).
    teacher_temperature: float | None = None
    # ConGen at each --matryoshka width: its own student / teacher temperature (empty: the one above).
    matryoshka_temperatures: tuple[float, ...] = ()
    matryoshka_teacher_temperatures: tuple[float, ...] = ()
    # ConGen's two augmented views of every sentence; the teacher sees the first.
    congen_views: tuple[str, ...] = ("deletion", "crop")
    # ConGen plus this weight times HPD's MSE to the PCA targets (a combined objective; 0: off).
    hpd_weight: float = 0.0
    # SimTDE: compact token-embedding width, and the weight of the sentence term (None: dim).
    token_dim: int = 128
    # The student's shape for any method: "transformer" (a layer-cut copy of --student) or "simtde"
    # (SimTDE's compact token embeddings + the last K layers); --method simtde always uses the latter.
    student_arch: str = "transformer"
    # The projection to d after pooling: "linear" (one Dense) or "mlp" (Dense to 2h with GELU, then
    # Dense to d; it starts as the linear head, training/student.py).
    head: str = "linear"
    sentence_weight: float | None = None
    # Stage 2 of ibkd / distilcse-*: contrastive fine-tuning on NLI triplets (csv, SNLI dir or hf:ID).
    finetune_data: str = "nli/snli_devtest_triplets.csv"
    finetune_epochs: float = 3.0
    finetune_lr: float = 3e-5
    finetune_batch_size: int = 128
    finetune_max_steps: int | None = None
    finetune_eval_every: int = 25
    finetune_patience: int = 0
    finetune_temperature: float = 0.05

    def validate(self) -> TrainConfig:
        if self.method not in METHODS:
            raise UserError(f"unknown method {self.method!r} (known: {', '.join(METHODS)})")
        unknown = set(self.augment) - set(AUGMENTATIONS)
        if unknown:
            raise UserError(f"unknown augmentation {sorted(unknown)} (known: {', '.join(AUGMENTATIONS)})")
        positive = ("dim", "n_sentences", "batch_size", "max_seq_len", "eval_every", "save_every")
        least = {**dict.fromkeys((*positive, "teacher_batch_size"), 1), "patience": 0, "finetune_patience": 0}
        for name, floor in least.items():
            if getattr(self, name) < floor:
                must = "be positive" if floor else "be >= 0 (0: no early stopping)"
                raise UserError(f"--{name.replace('_', '-')} must {must}")
        for name in ("max_steps", "finetune_max_steps"):  # None: as many as the epochs take
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be positive (leave it out for no cap)")
        if not 0 <= self.seed < 2**32:
            raise UserError(f"--seed must be in [0, 2**32), got {self.seed}")
        if self.layers is not None and self.layers < 1:
            raise UserError("--layers must be positive")
        if self.epochs <= 0 and not self.max_steps:
            raise UserError("--epochs must be positive")
        if self.init_projection not in PROJECTION_INITS:
            raise UserError(
                f"unknown --init-projection {self.init_projection!r} (known: {', '.join(PROJECTION_INITS)})"
            )
        if self.init_from is not None and self.init_projection != "random":
            raise UserError("--init-from starts from a trained projection; drop --init-projection")
        if self.projection_sample < 2:
            raise UserError("--projection-sample must be at least 2")
        self._validate_method_fields()
        from training.teacher_ensemble import ensemble_weights

        ensemble_weights(self.ensemble_teachers)
        self.widths()
        return self

    def widths(self) -> Widths:
        """The trained widths and their weights (just ``dim`` without ``--matryoshka``)."""
        from training.losses.matryoshka import Widths

        try:
            return Widths.parse(self.matryoshka, self.matryoshka_weights, self.dim)
        except ValueError as error:
            raise UserError(str(error)) from None

    def _validate_method_fields(self) -> None:
        for name in ("queue_size", "finetune_batch_size", "finetune_eval_every"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be positive")
        for name in (
            "temperature",
            "teacher_temperature",
            "sentence_weight",
            "finetune_lr",
            "finetune_temperature",
            "lr",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise UserError(f"--{name.replace('_', '-')} must be positive")
        if self.finetune_epochs <= 0 and not self.finetune_max_steps:
            raise UserError("--finetune-epochs must be positive")
        if self.token_dim < 2:
            raise UserError("--token-dim must be at least 2")
        if self.student_arch not in STUDENT_ARCHS:
            known = ", ".join(STUDENT_ARCHS)
            raise UserError(f"unknown --student-arch {self.student_arch!r} (known: {known})")
        if self.head not in HEADS:
            raise UserError(f"unknown --head {self.head!r} (known: {', '.join(HEADS)})")
        if self.head != "linear" and (self.method == "simtde" or self.student_arch == "simtde"):
            raise UserError("--head mlp is for the transformer student; SimTDE's keeps its linear head")
        if not 0 < self.layer_lr_decay <= 1:
            raise UserError(f"--layer-lr-decay must be in (0, 1], got {self.layer_lr_decay}")
        if self.layer_lr_decay != 1 and (self.method == "simtde" or self.student_arch == "simtde"):
            raise UserError("--layer-lr-decay is for the transformer student, not SimTDE's")
        self._validate_congen_fields()

    def _validate_width_temperatures(self) -> None:
        for name in ("matryoshka_temperatures", "matryoshka_teacher_temperatures"):
            values, flag = getattr(self, name), "--" + name.replace("_", "-")
            if not values:
                continue
            if self.method != "congen":
                raise UserError(f"{flag} is ConGen's; not for --method {self.method}")
            if len(values) != len(self.widths().widths) or min(values) <= 0:
                raise UserError(f"{flag} needs one positive value per --matryoshka width, got {list(values)}")

    def _validate_target_reduction(self) -> None:
        if self.target_reduction not in TARGET_REDUCTIONS:
            known = ", ".join(TARGET_REDUCTIONS)
            raise UserError(f"unknown --target-reduction {self.target_reduction!r} (known: {known})")
        if self.target_reduction == "pca":
            return
        if self.pca_whiten:
            raise UserError("--target-reduction neighbourhood refits a plain PCA; drop --pca-whiten")
        if self.matryoshka:
            raise UserError("--target-reduction neighbourhood has no ordered prefixes; not with --matryoshka")

    def _validate_congen_fields(self) -> None:
        if self.matryoshka_targets not in MATRYOSHKA_TARGETS:
            known = ", ".join(MATRYOSHKA_TARGETS)
            raise UserError(f"unknown --matryoshka-targets {self.matryoshka_targets!r} (known: {known})")
        if self.matryoshka_targets != "prefix" and self.method != "congen":
            raise UserError(f"--matryoshka-targets full is ConGen's; not for --method {self.method}")
        if self.congen_teacher_space not in CONGEN_TEACHER_SPACES:
            known = ", ".join(CONGEN_TEACHER_SPACES)
            raise UserError(f"unknown --congen-teacher-space {self.congen_teacher_space!r} (known: {known})")
        if self.congen_teacher_space != "pca" and self.method != "congen":
            raise UserError(f"--congen-teacher-space is ConGen's; not for --method {self.method}")
        if not 0.0 <= self.pca_whiten <= 1.0:
            raise UserError(f"--pca-whiten must be in [0, 1], got {self.pca_whiten}")
        self._validate_target_reduction()
        self._validate_width_temperatures()
        if self.hpd_weight < 0:
            raise UserError("--hpd-weight must not be negative")
        if self.hpd_weight and self.method != "congen":
            raise UserError(f"--hpd-weight adds HPD's MSE to ConGen's loss; not for --method {self.method}")
        if self.method == "congen":
            if len(self.congen_views) != 2:
                raise UserError(f"congen needs exactly two --congen-view, got {len(self.congen_views)}")
            unknown = set(self.congen_views) - set(CONGEN_VIEWS)
            if unknown:
                raise UserError(f"unknown --congen-view {sorted(unknown)} (known: {', '.join(CONGEN_VIEWS)})")


MATRYOSHKA_TARGETS = ("prefix", "full")
CONGEN_TEACHER_SPACES = ("pca", "full")
TARGET_REDUCTIONS = ("pca", "neighbourhood")

PRESETS: dict[str, TrainConfig] = {
    # End-to-end check of the whole path in a few minutes on 2 CPU cores.
    "smoke": TrainConfig(
        teacher="all-MiniLM-L6-v2",
        student="all-MiniLM-L6-v2",
        layers=3,
        n_sentences=20_000,
        pca_sample=20_000,
        max_seq_len=48,
        batch_size=64,
        lr=2e-4,
        epochs=1.0,
        eval_every=160,
        save_every=80,
    ),
    # The HPD target: mpnet teacher, MiniLM-L6 student, 128-d, 500k Wikipedia sentences plus the
    # (unlabelled) STS-B train sentences, which also fit the PCA. Sized for a GPU (bf16 AMP).
    "hpd-mpnet": TrainConfig(
        teacher="all-mpnet-base-v2",
        student="all-MiniLM-L6-v2",
        n_sentences=500_000,
        pca_sample=100_000,
        pca_fit="sts/stsbenchmark/sts-train.csv",
        train_on_pca_texts=True,
        batch_size=128,
        lr=2e-4,
        epochs=2.0,
        eval_every=500,
        save_every=500,
    ),
    # The same recipe sized for the 2-core CPU: the minimum of 200k Wikipedia sentences plus
    # the STS-B train sentences, one epoch of 64: 50 min of teacher targets and 77 min of training
    # here, STS-B test 81.07; 1.5 more epochs with --init-from reach 82.20, and epochs on the next
    # 200k-sentence slices (--skip-sentences) with greedy soups 82.73 (docs/results.md, "Training
    # runs"); scripts/cpu_hpd_job.sh runs the chain.
    # The projection starts at random as in the paper: the ridge warm start scored worse on STS-B
    # test in a short mpnet run (docs/decisions.md, decision 11).
    "hpd-mpnet-cpu": TrainConfig(
        teacher="all-mpnet-base-v2",
        student="all-MiniLM-L6-v2",
        n_sentences=200_000,
        pca_fit="sts/stsbenchmark/sts-train.csv",
        train_on_pca_texts=True,
        teacher_batch_size=16,
        batch_size=64,
        lr=1.5e-4,
        epochs=1.0,
        eval_every=250,
        save_every=250,
    ),
}
# The previous default's recipe (until stop 34): hpd-mpnet-cpu's data and batches (as bench/methods.py
# ran it), with ConGen on the first 4,096 Wikipedia sentences plus the STS-B train sentences, 2 epochs
# (458 steps), projection warm-started by ridge regression: 5 min of teacher targets and 16 min of
# training on 2 cores, STS-B test 83.01 (docs/training.md).
PRESETS["congen-mpnet-cpu"] = replace(
    PRESETS["hpd-mpnet-cpu"],
    method="congen",
    n_sentences=4096,
    init_projection="ridge",
    lr=5e-5,
    epochs=2.0,
    eval_every=50,
    save_every=50,
)
# models/default's recipe since stop 34: congen-mpnet-cpu taught by mpnet 0.7 + all-MiniLM-L6-v2 0.3
# (concatenated, PCA to 128-d; decision 35) and trained on no text of STS-B test or of the Quora pairs
# the retrieval benchmark uses. About 20 min of teacher targets on a cold cache, 13-21 min of training.
PRESETS["congen-ens-mpnet-cpu"] = replace(
    PRESETS["congen-mpnet-cpu"],
    ensemble_teachers=("all-MiniLM-L6-v2:0.3",),
    exclude_text=("sts/stsbenchmark/sts-test.csv", "quora/quora_pairs_dev.tsv", "quora/quora_pairs_test.tsv"),
)
# models/default's first stage since stop 51 (decision 53): the ensemble recipe plus HPD's MSE on the
# PCA targets, at lr 1e-4 with all-MiniLM-L6-v2 at 0.4 of the teacher (best STS-B dev 87.23); then
# `distilembed whiten`, `finetune` and `average` (docs/training.md). Stops 39-50 trained it at lr 5e-5
# with MiniLM at 0.3 (`ens-hpd1`, dev 87.07).
PRESETS["congen-ens-hpd-cpu"] = replace(
    PRESETS["congen-ens-mpnet-cpu"],
    hpd_weight=1.0,
    lr=1e-4,
    ensemble_teachers=("all-MiniLM-L6-v2:0.4",),
)
# The Matryoshka recipe (decision 31, methods.md): the default's, at widths 128, 64, 32 weighted
# 1, 2, 4, with ConGen's teacher distribution from the ensemble's own 1,152-d space (not its PCA cut to
# each width) and lr 1e-4. 450 steps, 23 min of training on 2 cores: int8 STS-B test 82.95 / 82.03 /
# 79.46 at 128 / 64 / 32.
PRESETS["congen-ens-mrl-cpu"] = replace(
    PRESETS["congen-ens-mpnet-cpu"],
    matryoshka=(128, 64, 32),
    matryoshka_weights=(1.0, 2.0, 4.0),
    congen_teacher_space="full",
    lr=1e-4,
)


def make_config(preset: str | None, overrides: dict[str, Any]) -> TrainConfig:
    """A preset (or the defaults) with every non-None override applied, validated."""
    if preset is not None and preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r} (known: {', '.join(PRESETS)})")
    base = PRESETS[preset] if preset else TrainConfig()
    names = {f.name for f in fields(TrainConfig)}
    changes = {k: v for k, v in overrides.items() if v is not None and k in names}
    listed = (
        "augment",
        "ensemble_teachers",
        "congen_views",
        "matryoshka",
        "matryoshka_weights",
        "matryoshka_temperatures",
        "matryoshka_teacher_temperatures",
    )
    for name in (*listed, "extra_text", "exclude_text"):
        if name in changes:
            changes[name] = tuple(changes[name])
    return replace(base, **changes).validate()

"""Training configuration: one dataclass, named presets, and CLI overrides.

Each field that ``distilembed train`` takes as a flag carries its help (:func:`option`), from which
``training/cli.py`` builds the command's options: a field, its default and its flag live here once."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from distilembed.errors import UserError

if TYPE_CHECKING:  # it imports torch; every command line reads this module (train's help shows its defaults)
    from training.losses.matryoshka import Widths

STUDENT_ARCHS = ("transformer", "simtde")
METHODS = ("hpd", "ibkd", "distilcse-kd", "distilcse-ckd", "simtde", "congen")
TWO_STAGE = frozenset({"ibkd", "distilcse-kd", "distilcse-ckd"})
AUGMENTATIONS = ("synonym", "deletion", "crop")
# ConGen's views may also be the sentence itself ("none"), whose teacher targets are already cached.
CONGEN_VIEWS = ("none", *AUGMENTATIONS)
PROJECTION_INITS = ("random", "ridge")
CONGEN_TEACHER_SPACES = ("pca", "full")
BACKEND_HELP = "Teacher runtime: auto (onnx on a CPU, torch on a GPU) | torch | onnx."
PATIENCE_HELP = "Stop after this many STS-B dev evaluations without a new best (0: never)."
AMP_HELP = "Mixed precision (bf16 autocast) on a GPU; --no-amp trains in float32 there, as on a CPU."


def option(default: Any, text: str, flag: str | None = None) -> Any:
    """A field that ``train`` takes as ``flag`` (default: ``--field-name``), with ``text`` as its help."""
    return field(default=default, metadata={"help": text, "flag": flag})


@dataclass(frozen=True)
class TrainConfig:
    method: str = option("hpd", "Distillation method: " + " | ".join(METHODS) + ".")
    teacher: str = option("all-mpnet-base-v2", "Teacher folder, packaged name or hub id.")
    ensemble_teachers: tuple[str, ...] = option(
        (),
        "Another teacher, NAME[:WEIGHT] (default 0.3); --teacher keeps 1 minus their sum, cosines "
        "averaged by weight (repeatable).",
        "--ensemble-teacher",
    )
    student: str = option("all-MiniLM-L6-v2", "Student init folder, packaged name or hub id.")
    layers: int | None = option(None, "Keep only K encoder layers of the student.")
    freeze_embeddings: bool = option(
        False, "Keep word embeddings fixed.", "--freeze-embeddings/--train-embeddings"
    )
    dim: int = option(128, "Output dimension of the learnable projection.")
    init_projection: str = option(
        "random", "random (the papers) | ridge: fit the projection onto the PCA targets before training."
    )
    projection_sample: int = option(10_000, "Training sentences the ridge warm start is fitted on.")
    init_from: str | None = option(
        None, "Start from this finished checkpoint's weights (fresh optimiser): more epochs on a run."
    )
    corpus: str = option("unlabeled/enwiki2015_1m_sentences.txt.gz", "Unlabeled corpus (.txt / .txt.gz).")
    n_sentences: int = option(200_000, "Use the first N sentences of the corpus.")
    skip_sentences: int = option(0, "Skip the corpus's first N sentences (a fresh slice for --init-from).")
    pca_sample: int = option(100_000, "Sentences the teacher PCA is fitted on.")
    pca_fit: str = option(
        "corpus", "'corpus' or a data file (STS-B csv / text) whose sentences fit the PCA (decision 3)."
    )
    train_on_pca_texts: bool = option(False, "Also distil on the PCA-fit sentences.")
    extra_text: tuple[str, ...] = option(
        (), "More unlabeled text: .txt(.gz), STS-B or NLI-triplet csv, SentEval SNLI dir (repeatable)."
    )
    exclude_text: tuple[str, ...] = option(
        (), "Drop every training sentence found in this source, e.g. STS-B test (repeatable)."
    )
    augment: tuple[str, ...] = option((), "synonym, deletion and/or crop (repeatable).")
    synonym_p: float = 0.3
    deletion_p: float = 0.1
    max_seq_len: int = option(128, "Longest input, in tokens.")
    teacher_batch_size: int = option(64, "Batch size for teacher targets.")
    teacher_backend: str = option("auto", BACKEND_HELP)
    batch_size: int = option(64, "Training sentences per step.")
    lr: float = option(1e-4, "Peak learning rate (linear warmup and decay).")
    warmup_ratio: float = 0.05
    epochs: float = option(1.0, "Passes over the training text.")
    max_steps: int | None = option(None, "Step cap (default: as many as --epochs take).")
    eval_every: int = option(500, "Steps between STS-B dev evaluations.")
    save_every: int = option(500, "Steps between resumable snapshots.")
    patience: int = option(0, PATIENCE_HELP)
    keep_snapshots: bool = option(
        False, "Keep the student of every dev evaluation in OUT.snapshots/<stage>/ (for `average`)."
    )
    seed: int = option(42, "Seed of the data order, the new layers and dropout.")
    device: str = option("auto", "auto | cpu | cuda")
    amp: bool = option(True, AMP_HELP)
    sts_dir: str = option("sts", "STS data, relative to the data dir.")
    extra: dict[str, Any] = field(default_factory=dict)
    matryoshka: tuple[int, ...] = option(
        (), "Matryoshka widths, widest first from --dim, e.g. 128,64,32: the method's loss at each."
    )
    matryoshka_weights: tuple[float, ...] = option((), "One weight per --matryoshka width (default 1 each).")
    congen_teacher_space: str = option(
        "pca",
        "ConGen: the teacher's similarity distribution from its PCA coordinates (pca) or from its own "
        "full-width embeddings (full, for every Matryoshka width).",
    )
    # --- methods other than HPD (docs/methods.md); None means the paper's value for the method ---
    queue_size: int = option(16_384, "Teacher memory bank (distilcse-ckd) / instance queue (congen) rows.")
    temperature: float | None = option(
        None, "Stage-1 temperature (default: ibkd 0.1, distilcse-ckd 0.05, congen student 0.07)."
    )
    teacher_temperature: float | None = option(None, "ConGen teacher temperature (0.05).")
    congen_views: tuple[str, ...] = option(
        ("deletion", "crop"),
        "ConGen's two views, the teacher sees the first: none, deletion, crop, synonym (x2).",
        "--congen-view",
    )
    hpd_weight: float = option(
        0.0, "ConGen only: add this weight times HPD's MSE to the PCA targets (0: off)."
    )
    token_dim: int = option(128, "SimTDE token-embedding width.")
    student_arch: str = option(
        "transformer", "transformer | simtde (compact token embeddings, last K layers) for any method."
    )
    sentence_weight: float | None = option(None, "SimTDE sentence-term weight (default: --dim).")
    finetune_data: str = option(
        "nli/snli_devtest_triplets.csv",
        "Stage-2 NLI triplets of ibkd / distilcse-* (csv, SNLI dir or hf:ID).",
    )
    finetune_epochs: float = option(3.0, "Stage-2 epochs.")
    finetune_lr: float = option(3e-5, "Stage-2 learning rate.")
    finetune_batch_size: int = option(128, "Stage-2 batch size (triplets).")
    finetune_max_steps: int | None = option(None, "Stage-2 step cap.")
    finetune_eval_every: int = option(25, "Stage-2 steps between dev evaluations.")
    finetune_patience: int = option(0, "Stage-2 --patience.")
    finetune_temperature: float = option(0.05, "Stage-2 temperature (0.05).")

    def validate(self) -> TrainConfig:
        for name, floor in FLOORS.items():
            value = getattr(self, name)
            if value is not None and value < floor:  # None: no cap, or the student's own depth
                must = {0: "be >= 0", 1: "be positive", 2: "be at least 2"}[floor]
                raise UserError(f"--{name.replace('_', '-')} must {_FLOOR_HINTS.get(name, must)}")
        for name in ("lr", "finetune_lr", "finetune_temperature", *NONE_OR_POSITIVE):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise UserError(f"--{name.replace('_', '-')} must be positive")
        if not 0 <= self.seed < 2**32:
            raise UserError(f"--seed must be in [0, 2**32), got {self.seed}")
        for name in ("epochs", "finetune_epochs"):
            if getattr(self, name) <= 0 and not getattr(self, name.replace("epochs", "max_steps")):
                raise UserError(f"--{name.replace('_', '-')} must be positive")
        self._validate_choices()
        from training.teacher_targets import ensemble_weights

        ensemble_weights(self.ensemble_teachers)
        self.widths()
        return self

    def _validate_choices(self) -> None:
        for name, known in CHOICES.items():
            if getattr(self, name) not in known:
                flag = "method" if name == "method" else f"--{name.replace('_', '-')}"
                raise UserError(f"unknown {flag} {getattr(self, name)!r} (known: {', '.join(known)})")
        unknown = set(self.augment) - set(AUGMENTATIONS)
        if unknown:
            raise UserError(f"unknown augmentation {sorted(unknown)} (known: {', '.join(AUGMENTATIONS)})")
        if self.init_from is not None and self.init_projection != "random":
            raise UserError("--init-from starts from a trained projection; drop --init-projection")
        if self.method != "congen" and self.congen_teacher_space != "pca":
            raise UserError(f"--congen-teacher-space is ConGen's; not for --method {self.method}")
        if self.method != "congen" and self.hpd_weight:
            raise UserError(f"--hpd-weight adds HPD's MSE to ConGen's loss; not for --method {self.method}")
        if self.method == "congen":
            if len(self.congen_views) != 2:
                raise UserError(f"congen needs exactly two --congen-view, got {len(self.congen_views)}")
            unknown = set(self.congen_views) - set(CONGEN_VIEWS)
            if unknown:
                raise UserError(f"unknown --congen-view {sorted(unknown)} (known: {', '.join(CONGEN_VIEWS)})")

    def widths(self) -> Widths:
        """The trained widths and their weights (just ``dim`` without ``--matryoshka``)."""
        from training.losses.matryoshka import Widths

        return Widths.parse(self.matryoshka, self.matryoshka_weights, self.dim)


CHOICES = {
    "method": METHODS,
    "init_projection": PROJECTION_INITS,
    "student_arch": STUDENT_ARCHS,
    "congen_teacher_space": CONGEN_TEACHER_SPACES,
}
# The least value of each numeric setting that has one, and what a message says instead of "be
# positive" / "be >= 0".
FLOORS = dict.fromkeys(("dim", "n_sentences", "batch_size", "max_seq_len", "eval_every", "save_every"), 1)
FLOORS |= dict.fromkeys(("teacher_batch_size", "queue_size", "finetune_batch_size", "finetune_eval_every"), 1)
FLOORS |= {"layers": 1, "max_steps": 1, "finetune_max_steps": 1, "projection_sample": 2, "token_dim": 2}
FLOORS |= {"patience": 0, "finetune_patience": 0, "hpd_weight": 0}
NONE_OR_POSITIVE = ("temperature", "teacher_temperature", "sentence_weight")  # None: the paper's value
_FLOOR_HINTS = dict.fromkeys(("patience", "finetune_patience"), "be >= 0 (0: no early stopping)")
_FLOOR_HINTS |= dict.fromkeys(("max_steps", "finetune_max_steps"), "be positive (leave it out for no cap)")
_FLOOR_HINTS["hpd_weight"] = "not be negative"

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
    # HPD at full size: mpnet teacher, MiniLM-L6 student, 128-d, 500k Wikipedia sentences plus the
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
    # The same recipe sized for a 2-core CPU: 200k Wikipedia sentences plus the STS-B train sentences,
    # one epoch of 64; more epochs with --init-from, fresh slices with --skip-sentences (docs/training.md).
    # The projection starts at random, as in the paper (decision 11).
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
# hpd-mpnet-cpu's data and batches with ConGen on the first 4,096 Wikipedia sentences plus the STS-B
# train sentences, 2 epochs, the projection warm-started by ridge regression (docs/training.md).
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
# congen-mpnet-cpu taught by mpnet 0.7 + all-MiniLM-L6-v2 0.3 (concatenated, PCA to 128-d; decision
# 35) and trained on no text of STS-B test or of the Quora pairs the retrieval benchmark uses.
PRESETS["congen-ens-mpnet-cpu"] = replace(
    PRESETS["congen-mpnet-cpu"],
    ensemble_teachers=("all-MiniLM-L6-v2:0.3",),
    exclude_text=("sts/stsbenchmark/sts-test.csv", "quora/quora_pairs_dev.tsv", "quora/quora_pairs_test.tsv"),
)
# models/default's first stage (decision 53): the ensemble recipe plus HPD's MSE on the PCA targets,
# at lr 1e-4 with all-MiniLM-L6-v2 at 0.4 of the teacher; then `distilembed whiten`, `finetune`,
# `average` and `rotate` (docs/training.md).
PRESETS["congen-ens-hpd-cpu"] = replace(
    PRESETS["congen-ens-mpnet-cpu"],
    hpd_weight=1.0,
    lr=1e-4,
    ensemble_teachers=("all-MiniLM-L6-v2:0.4",),
)
# The Matryoshka recipe (decision 31): the ensemble recipe at widths 128, 64, 32 weighted 1, 2, 4,
# with ConGen's teacher distribution from the ensemble's own 1,152-d space (not its PCA cut to each
# width) and lr 1e-4.
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
    kinds = {f.name: f.default for f in fields(TrainConfig)}
    given = {k: v for k, v in overrides.items() if v is not None and k in kinds}
    # Lists from a command line or JSON become the tuples the fields hold.
    changes = {k: tuple(v) if isinstance(kinds[k], tuple) else v for k, v in given.items()}
    return replace(base, **changes).validate()

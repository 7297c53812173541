"""Training-stage subcommands: ``train``, ``eval``, ``targets``, ``average``, ``whiten``, ``finetune``
and ``rotate``.

Heavy imports happen inside commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distilembed.artifacts import require_checkpoint
from distilembed.errors import UserError
from training.cli_options import DataDir, Opt, comma_list

BACKEND_HELP = "Teacher runtime: auto (onnx on a CPU, torch on a GPU) | torch | onnx."
PATIENCE_HELP = "Stop after this many STS-B dev evaluations without a new best (0: never)."
AMP_HELP = "Mixed precision (bf16 autocast) on a GPU; --no-amp trains in float32 there, as on a CPU."
NOT_CONFIG = frozenset({"out", "preset", "data_dir", "resume", "overwrite"})


def train_command(
    out: Annotated[Path, Opt("--out", help="Checkpoint directory to write.")],
    preset: Annotated[
        str | None,
        Opt(
            help="smoke | hpd-mpnet | hpd-mpnet-cpu | congen-mpnet-cpu | congen-ens-mpnet-cpu | "
            "congen-ens-hpd-cpu | congen-ens-mrl-cpu | ... (docs/training.md); flags override it."
        ),
    ] = None,
    method: Annotated[
        str | None,
        Opt(help="Distillation method: hpd | ibkd | distilcse-kd | distilcse-ckd | simtde | congen."),
    ] = None,
    teacher: Annotated[str | None, Opt(help="Teacher folder, packaged name or hub id.")] = None,
    ensemble_teacher: Annotated[
        list[str] | None,
        Opt(help="Another teacher, NAME[:WEIGHT] (default 0.3), cosines averaged by weight (repeatable)."),
    ] = None,
    student: Annotated[str | None, Opt(help="Student init folder, packaged name or hub id.")] = None,
    layers: Annotated[int | None, Opt(help="Keep only K encoder layers of the student.")] = None,
    dim: Annotated[int | None, Opt(help="Output dimension of the learnable projection.")] = None,
    freeze_embeddings: Annotated[
        bool | None, Opt("--freeze-embeddings/--train-embeddings", help="Keep word embeddings fixed.")
    ] = None,
    init_projection: Annotated[
        str | None, Opt(help="random | ridge: fit the projection onto the targets before training.")
    ] = None,
    projection_sample: Annotated[
        int | None, Opt(help="Training sentences the ridge warm start is fitted on.")
    ] = None,
    init_from: Annotated[
        str | None,
        Opt(help="Start from this finished checkpoint's weights (fresh optimiser): more epochs on a run."),
    ] = None,
    corpus: Annotated[str | None, Opt(help="Unlabeled corpus (.txt / .txt.gz).")] = None,
    n_sentences: Annotated[int | None, Opt(help="Use the first N sentences of the corpus.")] = None,
    skip_sentences: Annotated[
        int | None, Opt(help="Skip the corpus's first N sentences (a fresh slice for --init-from).")
    ] = None,
    pca_sample: Annotated[int | None, Opt(help="Sentences the teacher PCA is fitted on.")] = None,
    pca_fit: Annotated[
        str | None, Opt(help="'corpus' or a data file (STS-B csv / text) whose sentences fit the PCA.")
    ] = None,
    train_on_pca_texts: Annotated[
        bool | None,
        Opt("--train-on-pca-texts/--no-train-on-pca-texts", help="Also distil on the PCA-fit sentences."),
    ] = None,
    extra_text: Annotated[
        list[str] | None,
        Opt(help="More unlabeled text: .txt(.gz), STS-B or NLI-triplet csv, SentEval SNLI dir (repeatable)."),
    ] = None,
    exclude_text: Annotated[
        list[str] | None,
        Opt(help="Drop every training sentence found in this source, e.g. STS-B test (repeatable)."),
    ] = None,
    augment: Annotated[list[str] | None, Opt(help="synonym, deletion and/or crop (repeatable).")] = None,
    max_seq_len: Annotated[int | None, Opt()] = None,
    teacher_batch_size: Annotated[int | None, Opt(help="Batch size for teacher targets.")] = None,
    teacher_backend: Annotated[str | None, Opt(help=BACKEND_HELP)] = None,
    batch_size: Annotated[int | None, Opt()] = None,
    lr: Annotated[float | None, Opt()] = None,
    layer_lr_decay: Annotated[
        float | None, Opt(help="Each encoder layer trains at this times the rate of the one above (1: off).")
    ] = None,
    epochs: Annotated[float | None, Opt()] = None,
    max_steps: Annotated[int | None, Opt()] = None,
    eval_every: Annotated[int | None, Opt(help="Steps between STS-B dev evaluations.")] = None,
    save_every: Annotated[int | None, Opt(help="Steps between resumable snapshots.")] = None,
    patience: Annotated[int | None, Opt(help=PATIENCE_HELP)] = None,
    keep_snapshots: Annotated[
        bool | None,
        Opt(
            "--keep-snapshots/--no-keep-snapshots",
            help="Keep the student of every dev evaluation in OUT.snapshots/<stage>/ (for `average`).",
        ),
    ] = None,
    seed: Annotated[int | None, Opt()] = None,
    device: Annotated[str | None, Opt(help="auto | cpu | cuda")] = None,
    amp: Annotated[bool | None, Opt("--amp/--no-amp", help=AMP_HELP)] = None,
    sts_dir: Annotated[str | None, Opt(help="STS data (default: <data-dir>/sts).")] = None,
    queue_size: Annotated[
        int | None, Opt(help="Teacher memory bank (distilcse-ckd) / instance queue (congen) rows.")
    ] = None,
    temperature: Annotated[
        float | None, Opt(help="Stage-1 temperature (default: ibkd 0.1, distilcse-ckd 0.05, congen 0.07).")
    ] = None,
    teacher_temperature: Annotated[float | None, Opt(help="ConGen teacher temperature (0.05).")] = None,
    hpd_weight: Annotated[
        float | None, Opt(help="ConGen only: add this weight times HPD's MSE to the PCA targets (0: off).")
    ] = None,
    congen_views: Annotated[
        list[str] | None, Opt("--congen-view", help="ConGen's two views: none, deletion, crop, synonym (x2).")
    ] = None,
    matryoshka: Annotated[
        str | None,
        Opt(help="Matryoshka widths, widest first from --dim, e.g. 128,64,32: the method's loss at each."),
    ] = None,
    matryoshka_weights: Annotated[
        str | None, Opt(help="One weight per --matryoshka width, e.g. 1,1,1 (the default).")
    ] = None,
    matryoshka_temperatures: Annotated[
        str | None,
        Opt(help="ConGen: one student temperature per --matryoshka width (default: --temperature)."),
    ] = None,
    matryoshka_teacher_temperatures: Annotated[
        str | None,
        Opt(help="ConGen: one teacher temperature per --matryoshka width (default: --teacher-temperature)."),
    ] = None,
    matryoshka_targets: Annotated[
        str | None,
        Opt(
            help="ConGen: each narrower width learns the teacher's PCA cut to it (prefix, the default) "
            "or the teacher's full-width similarities (full)."
        ),
    ] = None,
    pca_whiten: Annotated[
        float | None,
        Opt(
            help="Partially whiten the PCA targets: component variances v become v^(1 - P); 0 keeps the PCA."
        ),
    ] = None,
    target_reduction: Annotated[
        str | None,
        Opt(
            help="Cut the teacher's targets to --dim by PCA (pca, the default) or by the PCA refitted "
            "to keep each training sentence's neighbours (neighbourhood)."
        ),
    ] = None,
    congen_teacher_space: Annotated[
        str | None,
        Opt(
            help="ConGen: the teacher's similarity distribution from its PCA coordinates (pca, the "
            "default) or from its own full-width embeddings (full)."
        ),
    ] = None,
    token_dim: Annotated[int | None, Opt(help="SimTDE token-embedding width.")] = None,
    student_arch: Annotated[
        str | None, Opt(help="transformer | simtde (compact token embeddings, last K layers) for any method.")
    ] = None,
    head: Annotated[
        str | None,
        Opt(help="linear | mlp: the projection to --dim (mlp: a GELU layer, starting as the linear map)."),
    ] = None,
    sentence_weight: Annotated[
        float | None, Opt(help="SimTDE sentence-term weight (default: --dim).")
    ] = None,
    finetune_data: Annotated[
        str | None, Opt(help="Stage-2 NLI triplets of ibkd / distilcse-* (csv, SNLI dir or hf:ID).")
    ] = None,
    finetune_epochs: Annotated[float | None, Opt(help="Stage-2 epochs.")] = None,
    finetune_lr: Annotated[float | None, Opt(help="Stage-2 learning rate.")] = None,
    finetune_batch_size: Annotated[int | None, Opt(help="Stage-2 batch size (triplets).")] = None,
    finetune_max_steps: Annotated[int | None, Opt(help="Stage-2 step cap.")] = None,
    finetune_eval_every: Annotated[int | None, Opt(help="Stage-2 steps between dev evaluations.")] = None,
    finetune_patience: Annotated[int | None, Opt(help="Stage-2 --patience.")] = None,
    finetune_temperature: Annotated[float | None, Opt(help="Stage-2 temperature (0.05).")] = None,
    data_dir: DataDir = None,
    resume: Annotated[bool, Opt(help="Continue an interrupted run from its last snapshot.")] = False,
    overwrite: Annotated[bool, Opt(help="Replace an existing --out.")] = False,
) -> None:
    """Distil a teacher into a compact student and write an evaluated checkpoint."""
    from training.config import make_config
    from training.pipeline import run_training
    from training.report import print_training_summary

    overrides = {k: v for k, v in locals().items() if k not in NOT_CONFIG}
    overrides["ensemble_teachers"] = ensemble_teacher
    overrides["matryoshka"] = comma_list(matryoshka, int, "--matryoshka")
    overrides["matryoshka_weights"] = comma_list(matryoshka_weights, float, "--matryoshka-weights")
    overrides["matryoshka_temperatures"] = comma_list(
        matryoshka_temperatures, float, "--matryoshka-temperatures"
    )
    overrides["matryoshka_teacher_temperatures"] = comma_list(
        matryoshka_teacher_temperatures, float, "--matryoshka-teacher-temperatures"
    )
    cfg = make_config(preset, overrides)
    manifest = run_training(cfg, out, data_dir=data_dir, resume=resume, overwrite=overwrite)
    print_training_summary(manifest, out)


def targets_command(
    teacher: Annotated[str, Opt(help="Teacher folder, packaged name or hub id.")],
    corpus: Annotated[str, Opt(help="Unlabeled corpus (.txt / .txt.gz).")],
    n_sentences: Annotated[int | None, Opt(help="Use the first N sentences.", min=1)] = None,
    skip_sentences: Annotated[int, Opt(help="Skip the corpus's first N sentences.", min=0)] = 0,
    batch_size: Annotated[int, Opt(help="Sentences per teacher call.", min=1)] = 64,
    device: Annotated[str, Opt(help="auto | cpu | cuda")] = "auto",
    teacher_backend: Annotated[str, Opt(help=BACKEND_HELP)] = "auto",
    data_dir: DataDir = None,
) -> None:
    """Encode a corpus with a teacher into the resumable on-disk target cache (no training)."""
    from distilembed.paths import resolve_data_path
    from training.data.text import read_sentences
    from training.teacher_targets import Teacher
    from training.trainer import resolve_device

    texts = read_sentences(resolve_data_path(corpus, data_dir), limit=n_sentences, skip=skip_sentences)
    encoder = Teacher(teacher, device=resolve_device(device), batch_size=batch_size, backend=teacher_backend)
    _, info = encoder.targets(texts)
    typer.echo(info)


def average_command(
    checkpoints: Annotated[list[Path], typer.Argument(help="Two or more checkpoints of one student.")],
    out: Annotated[Path, Opt("--out", help="Checkpoint directory to write.")],
    greedy: Annotated[
        bool, Opt(help="Greedy soup: add checkpoints best-first, each only if STS-B dev does not drop.")
    ] = False,
    weights: Annotated[
        str | None,
        Opt(help="One weight per checkpoint, comma-separated, scaled to sum 1 (WiSE-FT: 0.4,0.6)."),
    ] = None,
    dev: Annotated[bool, Opt("--dev/--no-dev", help="Score STS-B dev (needed by --greedy).")] = True,
    sts_dir: Annotated[str | None, Opt(help="STS data (default: <data-dir>/sts).")] = None,
    data_dir: DataDir = None,
    overwrite: Annotated[bool, Opt(help="Replace an existing --out.")] = False,
) -> None:
    """Average the weights of checkpoints of one student (a uniform, weighted or greedy model soup)."""
    from distilembed.paths import resolve_data_path
    from training.average import average_checkpoints
    from training.data.sts import load_stsb_split
    from training.evaluation import evaluate_model_pairs

    score = None
    if dev or greedy:
        from sentence_transformers import SentenceTransformer

        pairs = load_stsb_split(resolve_data_path(sts_dir or "sts", data_dir), "dev")

        def score(path: Path) -> float:
            return evaluate_model_pairs(SentenceTransformer(str(path), device="cpu"), pairs)

    mix = comma_list(weights, float, "--weights")
    manifest = average_checkpoints(
        checkpoints, out, score=score, greedy=greedy, overwrite=overwrite, weights=mix
    )
    summary = manifest["average"]
    typer.echo(
        f"{out}: {summary['recipe']} of {len(summary['chosen'])} of {len(checkpoints)} checkpoints, "
        f"STS-B dev {summary['dev_spearman']}"
    )


def whiten_command(
    model: Annotated[Path, typer.Argument(help="Checkpoint whose final Dense layer takes the whitening.")],
    out: Annotated[Path, Opt("--out", help="Checkpoint directory to write.")],
    power: Annotated[
        str,
        Opt(help="Whitening power(s) in [0, 1], comma-separated; with several, STS-B dev picks one."),
    ] = "0.125,0.25,0.375,0.5",
    corpus: Annotated[str, Opt(help="Unlabeled text the mean and covariance are fitted on.")] = (
        "unlabeled/enwiki2015_1m_sentences.txt.gz"
    ),
    n_sentences: Annotated[int, Opt(help="Sentences of --corpus to fit on.", min=2)] = 20000,
    skip_sentences: Annotated[int, Opt(help="Start after this many sentences of --corpus.", min=0)] = 500000,
    sts_dir: Annotated[str | None, Opt(help="STS data (default: <data-dir>/sts).")] = None,
    data_dir: DataDir = None,
    overwrite: Annotated[bool, Opt(help="Replace an existing --out.")] = False,
) -> None:
    """Whiten a student's output (BERT-whitening at a power), folded into its last Dense layer."""
    from distilembed.paths import resolve_data_path
    from training.data.sts import find_sts_sets, load_stsb_split
    from training.data.text import read_sentences
    from training.evaluation import evaluate_model_pairs, evaluate_sts, sentence_transformer_encoder
    from training.whitening import whiten_checkpoint

    powers = comma_list(power, float, "--power") or []
    if not powers:
        raise UserError("--power needs at least one value")
    require_checkpoint(model)  # before reading the corpus
    texts = read_sentences(resolve_data_path(corpus, data_dir), limit=n_sentences, skip=skip_sentences)
    sts_root = resolve_data_path(sts_dir or "sts", data_dir)
    dev_pairs, sets = load_stsb_split(sts_root, "dev"), find_sts_sets(sts_root)
    manifest = whiten_checkpoint(
        model,
        out,
        texts,
        powers,
        score=lambda m: evaluate_model_pairs(m, dev_pairs),
        final_scores=lambda m: {
            k: round(v, 2) for k, v in evaluate_sts(sentence_transformer_encoder(m), sets)["scores"].items()
        },
        corpus=corpus,
        overwrite=overwrite,
        progress=True,
    )
    info = manifest["whiten"]
    tried = ", ".join(f"{c['power']}: {c['dev_spearman']}" for c in info["candidates"])
    typer.echo(
        f"{out}: whitening power {info['power']} (STS-B dev {info['source_dev_spearman']} -> "
        f"{info['dev_spearman']}; tried {tried}); scores {manifest['scores']}"
    )
    source_dev = info["source_dev_spearman"]
    if source_dev is not None and info["dev_spearman"] < source_dev:
        warning = f"warning: every power scored below the source's STS-B dev ({source_dev}); keep {model}"
        typer.echo(warning, err=True)


def finetune_command(
    model: Annotated[Path, typer.Argument(help="Finished checkpoint to fine-tune.")],
    out: Annotated[Path, Opt("--out", help="Checkpoint directory to write.")],
    data: Annotated[
        str, Opt(help="NLI triplets: csv sent0,sent1,hard_neg, a SentEval SNLI dir or hf:<dataset id>.")
    ] = "nli/snli_devtest_triplets.csv",
    loss: Annotated[str, Opt(help="simcse (DistilCSE eq. 7) | ibkd (eq. 9: plus HSIC).")] = "simcse",
    exclude_text: Annotated[
        list[str] | None,
        Opt(help="Drop every triplet with a sentence of this source, besides the source run's (repeatable)."),
    ] = None,
    matryoshka_weights: Annotated[
        str | None,
        Opt(help="A Matryoshka student's loss weights over its trained widths (default: its own)."),
    ] = None,
    epochs: Annotated[float, Opt(help="Passes over the triplets.")] = 1.0,
    lr: Annotated[float, Opt(help="Peak learning rate (linear warmup and decay).")] = 1e-5,
    batch_size: Annotated[int, Opt(help="Triplets per step.")] = 64,
    max_steps: Annotated[int | None, Opt(help="Step cap.")] = None,
    eval_every: Annotated[int, Opt(help="Steps between STS-B dev evaluations (and snapshots).")] = 10,
    patience: Annotated[int, Opt(help=PATIENCE_HELP)] = 0,
    temperature: Annotated[float, Opt(help="Contrastive temperature.")] = 0.05,
    seed: Annotated[int, Opt(help="Seed of dropout and the data order (as in train).")] = 42,
    device: Annotated[str, Opt(help="auto | cpu | cuda")] = "auto",
    amp: Annotated[bool, Opt("--amp/--no-amp", help=AMP_HELP)] = True,
    sts_dir: Annotated[str, Opt(help="STS data (default: <data-dir>/sts).")] = "sts",
    data_dir: DataDir = None,
    resume: Annotated[bool, Opt(help="Continue an interrupted run from its last snapshot.")] = False,
    overwrite: Annotated[bool, Opt(help="Replace an existing --out.")] = False,
) -> None:
    """Fine-tune a finished student on NLI triplets (the two-stage methods' stage 2), STS-B dev selects."""
    from training.finetune import finetune_checkpoint

    overrides = {
        "finetune_data": data,
        "finetune_epochs": epochs,
        "finetune_lr": lr,
        "finetune_batch_size": batch_size,
        "finetune_max_steps": max_steps,
        "finetune_eval_every": eval_every,
        "finetune_patience": patience,
        "finetune_temperature": temperature,
        "seed": seed,
        "device": device,
        "amp": amp,
        "sts_dir": sts_dir,
        "exclude_text": exclude_text or [],
        "matryoshka_weights": comma_list(matryoshka_weights, float, "--matryoshka-weights"),
    }
    manifest = finetune_checkpoint(
        model, out, overrides, loss=loss, data_dir=data_dir, resume=resume, overwrite=overwrite
    )
    info = manifest["finetune"]
    typer.echo(
        f"{out}: STS-B dev {info['source_dev_spearman']} -> {info['best_dev_spearman']} "
        f"(step {info['best_step']} of {info['steps']}); scores {manifest['scores']}"
    )


def register(app: typer.Typer) -> None:
    from training.eval_cli import eval_command
    from training.rotate_cli import rotate_command
    from training.train_help import PresetDefaultsCommand

    app.command("train", cls=PresetDefaultsCommand)(train_command)
    app.command("eval")(eval_command)
    app.command("targets")(targets_command)
    app.command("average")(average_command)
    app.command("whiten")(whiten_command)
    app.command("finetune")(finetune_command)
    app.command("rotate")(rotate_command)

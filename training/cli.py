"""Training-stage subcommands: ``train``, ``eval`` (training/eval_cli.py), ``targets``, ``average``,
``whiten``, ``finetune`` and ``rotate``. ``train``'s options other than ``--out`` and ``--preset`` are
``TrainConfig``'s fields (training/config.py holds each one's help).

Heavy imports happen inside commands: every command line (``serve`` too) reads this module, and
training/config.py imports no torch."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import Field, fields
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin, get_type_hints

import typer

from distilembed.artifacts import read_manifest, require_checkpoint
from distilembed.errors import UserError
from training.config import AMP_HELP, BACKEND_HELP, PATIENCE_HELP, PRESETS, TrainConfig, make_config

Opt, Arg = typer.Option, typer.Argument
DataDir = Annotated[
    str | None,
    Opt("--data-dir", envvar="DISTILEMBED_DATA_DIR", help="Root that relative data paths are read from."),
]
Out = Annotated[Path, Opt("--out", help="Checkpoint directory to write.")]
Overwrite = Annotated[bool, Opt(help="Replace an existing --out.")]
Resume = Annotated[bool, Opt(help="Continue an interrupted run from its last snapshot.")]
StsDir = Annotated[str | None, Opt(help="STS data (default: <data-dir>/sts).")]
NONE = "none"


def comma_list(text: str | None, kind: type[int] | type[float], flag: str) -> list[Any] | None:
    """``"128,64,32"`` -> ``[128, 64, 32]``; a bad item is a one-line error naming the flag."""
    if text is None:
        return None
    try:
        return [kind(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise UserError(f"{flag} takes comma-separated {kind.__name__}s, got {text!r}") from None


def config_option(spec: Field[Any], kind: Any) -> inspect.Parameter:
    """``train``'s option for a ``TrainConfig`` field: its flag, help and type, default None so that a
    flag left out keeps the preset's value, and TrainConfig's default shown (what a run gets
    without ``--preset``). A tuple of strings is a repeatable flag, one of numbers a comma list."""
    flag = spec.metadata["flag"] or "--" + spec.name.replace("_", "-")
    if kind is bool and "/" not in flag:
        flag = f"{flag}/--no-{flag[2:]}"
    if get_origin(kind) is tuple:
        kind = list[str] if get_args(kind)[0] is str else str
    value = spec.default
    if isinstance(value, bool):  # the flag that gives the default
        shown = flag.split("/")[0 if value else 1].lstrip("-")
    elif isinstance(value, tuple):
        shown = ", ".join(map(str, value))
    else:
        shown = "" if value is None else str(value)
    info = Opt(flag, help=spec.metadata["help"], show_default=shown or False)
    return inspect.Parameter(
        spec.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[kind | None, info]
    )


def with_config_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with one keyword option per ``TrainConfig`` field that has help, after ``--preset``
    (its ``**settings``)."""
    own = list(inspect.signature(command, eval_str=True).parameters.values())
    hints = get_type_hints(TrainConfig)
    options = [
        config_option(spec, hints[spec.name]) for spec in fields(TrainConfig) if "help" in spec.metadata
    ]
    fixed = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own if p.kind != p.VAR_KEYWORD]
    parameters = [*fixed[:2], *options, *fixed[2:]]
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    return command


@with_config_options
def train_command(
    out: Out,
    preset: Annotated[
        str | None, Opt(help=f"{' | '.join(PRESETS)} (docs/training.md); flags override it.")
    ] = None,
    data_dir: DataDir = None,
    resume: Resume = False,
    overwrite: Overwrite = False,
    **settings: Any,
) -> None:
    """Distil a teacher into a compact student and write an evaluated checkpoint."""
    from training.pipeline import run_training

    hints = get_type_hints(TrainConfig)
    for name, value in settings.items():  # comma-separated numbers: --matryoshka 128,64,32
        if isinstance(value, str) and get_origin(hints[name]) is tuple:
            settings[name] = comma_list(value, get_args(hints[name])[0], f"--{name.replace('_', '-')}")
    cfg = make_config(preset, settings)
    manifest = run_training(cfg, out, data_dir=data_dir, resume=resume, overwrite=overwrite)
    _print_training_summary(manifest, out)


def _print_training_summary(manifest: dict[str, Any], out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{manifest['method']} student -> {out}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [(k, f"{v:.2f}") for k, v in manifest.get("scores", {}).items() if isinstance(v, int | float)]
    rows.append(("best STS-B dev", f"{manifest['training']['best_dev_spearman']:.2f}"))
    rows += [(f"teacher {k}", f"{v:.2f}") for k, v in manifest["teacher"].get("reference", {}).items()]
    rows.append(("params", f"{manifest['student']['params']:,}"))
    rows += [(f"wall-clock {stage}", f"{seconds:.1f} s") for stage, seconds in manifest["seconds"].items()]
    for row in rows:
        table.add_row(*row)
    Console().print(table)


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
    typer.echo(encoder.targets(texts)[1])


def average_command(
    checkpoints: Annotated[list[Path], Arg(help="Two or more checkpoints of one student.")],
    out: Out,
    greedy: Annotated[
        bool, Opt(help="Greedy soup: add checkpoints best-first, each only if STS-B dev does not drop.")
    ] = False,
    weights: Annotated[
        str | None,
        Opt(help="One weight per checkpoint, comma-separated, scaled to sum 1 (WiSE-FT: 0.4,0.6)."),
    ] = None,
    dev: Annotated[bool, Opt("--dev/--no-dev", help="Score STS-B dev (needed by --greedy).")] = True,
    sts_dir: StsDir = None,
    data_dir: DataDir = None,
    overwrite: Overwrite = False,
) -> None:
    """Average the weights of checkpoints of one student (a uniform, weighted or greedy model soup)."""
    from distilembed.paths import resolve_data_path
    from training.checkpoint import average_checkpoints
    from training.data.sts import load_stsb_split
    from training.evaluation import evaluate_pairs, sentence_transformer_encoder

    score = None
    if dev or greedy:
        from sentence_transformers import SentenceTransformer

        pairs = load_stsb_split(resolve_data_path(sts_dir or "sts", data_dir), "dev")

        def score(path: Path) -> float:
            model = SentenceTransformer(str(path), device="cpu")
            return evaluate_pairs(sentence_transformer_encoder(model, batch_size=128), pairs)

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
    model: Annotated[Path, Arg(help="Checkpoint whose final Dense layer takes the whitening.")],
    out: Out,
    power: Annotated[
        str, Opt(help="Whitening power(s) in [0, 1], comma-separated; with several, STS-B dev picks one.")
    ] = "0.125,0.25,0.375,0.5",
    corpus: Annotated[str, Opt(help="Unlabeled text the mean and covariance are fitted on.")] = (
        "unlabeled/enwiki2015_1m_sentences.txt.gz"
    ),
    n_sentences: Annotated[int, Opt(help="Sentences of --corpus to fit on.", min=2)] = 20000,
    skip_sentences: Annotated[int, Opt(help="Start after this many sentences of --corpus.", min=0)] = 500000,
    sts_dir: StsDir = None,
    data_dir: DataDir = None,
    overwrite: Overwrite = False,
) -> None:
    """Whiten a student's output (BERT-whitening at a power), folded into its last Dense layer."""
    from distilembed.paths import resolve_data_path
    from training.data.sts import find_sts_sets, load_stsb_split
    from training.data.text import read_sentences
    from training.evaluation import evaluate_pairs, evaluate_sts, rounded, sentence_transformer_encoder
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
        score=lambda m: evaluate_pairs(sentence_transformer_encoder(m, batch_size=128), dev_pairs),
        final_scores=lambda m: rounded(evaluate_sts(sentence_transformer_encoder(m), sets)["scores"]),
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
    model: Annotated[Path, Arg(help="Finished checkpoint to fine-tune.")],
    out: Out,
    data: Annotated[
        str, Opt(help="NLI triplets: csv sent0,sent1,hard_neg, a SentEval SNLI dir or hf:<dataset id>.")
    ] = "nli/snli_devtest_triplets.csv",
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
    sts_dir: StsDir = None,
    data_dir: DataDir = None,
    resume: Resume = False,
    overwrite: Overwrite = False,
) -> None:
    """Fine-tune a finished student on NLI triplets (the two-stage methods' stage 2), STS-B dev selects."""
    from training.finetune import finetune_checkpoint

    stage = (data, epochs, lr, batch_size, max_steps, eval_every, patience, temperature)
    names = ("data", "epochs", "lr", "batch_size", "max_steps", "eval_every", "patience", "temperature")
    overrides = {f"finetune_{name}": value for name, value in zip(names, stage, strict=True)}
    overrides |= {"seed": seed, "device": device, "amp": amp, "sts_dir": sts_dir or "sts"}
    overrides["exclude_text"] = exclude_text or []
    overrides["matryoshka_weights"] = comma_list(matryoshka_weights, float, "--matryoshka-weights")
    manifest = finetune_checkpoint(
        model, out, overrides, data_dir=data_dir, resume=resume, overwrite=overwrite
    )
    info = manifest["finetune"]
    typer.echo(
        f"{out}: STS-B dev {info['source_dev_spearman']} -> {info['best_dev_spearman']} "
        f"(step {info['best_step']} of {info['steps']}); scores {manifest['scores']}"
    )


def rotate_command(
    model: Annotated[
        Path, Arg(help="Checkpoint (its final Dense layer takes the rotation) or bundle (its graphs do).")
    ],
    out: Out,
    matryoshka: Annotated[
        str | None, Opt(help="Widths, the student's first then decreasing (default: d, d/2, d/4).")
    ] = None,
    matryoshka_weights: Annotated[
        str | None, Opt(help="Loss weight per width (the full width's is unused: its cosines do not change).")
    ] = None,
    pairs: Annotated[
        str,
        Opt(
            help="Labelled pairs whose correlation is fitted: an STS Benchmark csv, or a csv/tsv with "
            "columns sentence1, sentence2, score; none to skip."
        ),
    ] = "sts/stsbenchmark/sts-train.csv",
    triplets: Annotated[
        str, Opt(help="NLI triplets (as finetune reads them) for the contrastive term; none to skip.")
    ] = "nli/snli_devtest_triplets.csv",
    triplet_weight: Annotated[
        float, Opt(help="Weight of the triplets' InfoNCE against the pairs' term.", min=0)
    ] = 0.1,
    exclude_text: Annotated[
        list[str] | None,
        Opt(help="Drop every pair or triplet with a sentence of this source, besides STS-B dev and test."),
    ] = None,
    steps: Annotated[int, Opt(help="Optimiser steps.", min=1)] = 800,
    lr: Annotated[float, Opt(help="Adam learning rate.")] = 3e-4,
    batch_size: Annotated[int, Opt(help="Triplets per step (the pairs are used whole).", min=2)] = 512,
    eval_every: Annotated[int, Opt(help="Steps between STS-B dev evaluations.", min=1)] = 50,
    seed: Annotated[int, Opt(help="Seed of the triplet batches.")] = 42,
    sts_dir: StsDir = None,
    data_dir: DataDir = None,
    overwrite: Overwrite = False,
) -> None:
    """Rotate a student's output so its prefixes serve as smaller embeddings; full-width cosines stay."""
    from distilembed.paths import resolve_data_path
    from training.data.extra_text import drop_excluded, excluded_keys, normalise
    from training.data.pairs import Triplet, load_triplets
    from training.data.sts import find_sts_sets, load_stsb_split, read_scored_pairs
    from training.rotation import RotationRequest, RotationSettings, rotate_checkpoint

    is_bundle = (model / "manifest.json").is_file() and read_manifest(model).get("kind") == "bundle"
    if not is_bundle:
        require_checkpoint(model)
    widths = comma_list(matryoshka, int, "--matryoshka") or []
    weights = comma_list(matryoshka_weights, float, "--matryoshka-weights") or []
    sts_root = resolve_data_path(sts_dir or "sts", data_dir)
    dev, test = load_stsb_split(sts_root, "dev"), load_stsb_split(sts_root, "test")
    held_out = {normalise(s) for p in dev + test for s in (p.sentence1, p.sentence2)}
    held_out |= excluded_keys(exclude_text or [], data_dir)
    info: dict[str, object] = {"pairs": pairs, "triplets": triplets}
    pairs_file = resolve_data_path(pairs, data_dir)
    if pairs != NONE and not pairs_file.is_file():
        raise UserError(f"--pairs: no such file: {pairs_file}")
    found_pairs = [] if pairs == NONE else read_scored_pairs(pairs_file)
    kept_pairs, dropped = drop_excluded(found_pairs, held_out, lambda p: (p.sentence1, p.sentence2))
    info.update(pairs_used=len(kept_pairs), pairs_excluded=dropped)
    found_triplets = [] if triplets == NONE else load_triplets(triplets, data_dir)
    kept_triplets, dropped = drop_excluded(found_triplets, held_out, Triplet.texts)
    info.update(triplets_used=len(kept_triplets), triplets_excluded=dropped)
    weight = triplet_weight if kept_triplets else 0.0
    settings = RotationSettings(
        steps=steps, lr=lr, triplet_weight=weight, batch_size=batch_size, eval_every=eval_every, seed=seed
    )
    request = RotationRequest(
        pairs=kept_pairs,
        triplets=kept_triplets,
        dev_pairs=dev,
        widths=widths,
        weights=weights,
        settings=settings,
        data_info=info,
    )
    if is_bundle:
        from export.rotate import rotate_bundle

        manifest = rotate_bundle(model, out, request, data_dir=data_dir, overwrite=overwrite)
    else:
        manifest = rotate_checkpoint(model, out, request, find_sts_sets(sts_root), overwrite=overwrite)
    record = manifest["rotate"]
    before, after = record["source_dev_by_width"], record["dev_by_width"]
    change = ", ".join(f"{m}: {before[m]} -> {after[m]}" for m in after)
    typer.echo(f"{out}: STS-B dev by width ({change}), step {record['best_step']} of {steps}")
    if record["best_step"] == 0:
        typer.echo(f"warning: no step beat the identity on STS-B dev; {out} is {model} unrotated", err=True)


def register(app: typer.Typer) -> None:
    from training.eval_cli import eval_command

    app.command("train")(train_command)
    app.command("eval")(eval_command)
    app.command("targets")(targets_command)
    app.command("average")(average_command)
    app.command("whiten")(whiten_command)
    app.command("finetune")(finetune_command)
    app.command("rotate")(rotate_command)

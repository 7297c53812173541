"""Train, export and compare every distillation method under one budget, in one command.

For each method: ``distilembed train --method M`` (skipped when RUNS/M/manifest.json exists, resumed
when RUNS/M.partial does), then ``distilembed export`` (skipped when the bundle exists). Writes a JSON
file and the "Results" table of docs/methods.md (between its markers) and prints the table.

    python bench/methods.py --preset hpd-mpnet --teacher /models/all-mpnet-base-v2 \\
        --student /models/all-MiniLM-L6-v2 --corpus unlabeled/wiki500k.txt.gz \\
        --n-sentences 500000 --epochs 2 --batch-size 128 --lr 2e-4 --device cuda --jobs 3

``--variant NAME=METHOD [FLAGS]`` adds a row that trains METHOD with extra flags after the shared
ones, e.g. ``--variant "congen-simtde=congen --student-arch simtde --lr 1.5e-4"`` (SimTDE's student
trained with ConGen's loss).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from methods_report import add_comparisons, doc_note, merge_reports, publish, render_only  # noqa: E402

from training.config import METHODS  # noqa: E402

CLI = (sys.executable, "-m", "distilembed.cli")
# Flags passed to every ``distilembed train`` unchanged: (flag, type, help).
PASS_THROUGH: tuple[tuple[str, type, str], ...] = (
    ("--preset", str, "training preset the flags override (e.g. hpd-mpnet)"),
    ("--teacher", str, "teacher folder, packaged name or hub id"),
    ("--student", str, "student init folder, packaged name or hub id"),
    ("--corpus", str, "unlabelled corpus, relative to --data-dir"),
    ("--n-sentences", int, "first N corpus sentences"),
    ("--epochs", float, "stage-1 epochs"),
    ("--max-steps", int, "stage-1 step cap"),
    ("--batch-size", int, "stage-1 batch size"),
    ("--lr", float, "stage-1 learning rate"),
    ("--eval-every", int, "steps between STS-B dev evaluations"),
    ("--save-every", int, "steps between resumable snapshots"),
    ("--max-seq-len", int, "student max sequence length"),
    ("--teacher-batch-size", int, "teacher encoding batch size"),
    ("--device", str, "auto | cpu | cuda"),
    ("--finetune-max-steps", int, "stage-2 step cap (ibkd, distilcse-*)"),
    ("--finetune-epochs", float, "stage-2 epochs (ibkd, distilcse-*)"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), help="default: all six")
    for flag, kind, text in PASS_THROUGH:
        parser.add_argument(flag, type=kind, help=text)
    parser.add_argument("--train-arg", action="append", default=[], help="extra train flag (repeatable)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=METHOD [FLAGS]",
        help="an extra row: METHOD with extra train flags, e.g. 'congen-simtde=congen --student-arch simtde'",
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        help="only these rows (methods or variant names), merged into an existing --out and its table",
    )
    parser.add_argument("--jobs", type=int, default=1, help="methods trained at the same time")
    parser.add_argument("--runs-dir", default="runs/methods", help="checkpoints, bundles and logs")
    parser.add_argument("--data-dir", default=os.environ.get("DISTILEMBED_DATA_DIR"))
    parser.add_argument("--no-export", action="store_true", help="skip the ONNX bundles")
    parser.add_argument("--export-arg", action="append", default=[], help="extra export flag (repeatable)")
    parser.add_argument(
        "--reference-bundle",
        default="runs/bundles/minilm",
        help="int8 bundle of all-MiniLM-L6-v2 the speeds are compared with (exported here if missing)",
    )
    parser.add_argument(
        "--reference-model",
        default="all-MiniLM-L6-v2",
        help="folder or packaged name the reference bundle is exported from when missing",
    )
    parser.add_argument("--speed-repeats", type=int, default=5, help="timed rounds per bundle (median)")
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime threads (0: all cores)")
    parser.add_argument("--out", default="docs/results/methods.json")
    parser.add_argument("--doc", default="docs/methods.md", help="markdown file whose Results it rewrites")
    parser.add_argument(
        "--render-from",
        nargs="+",
        metavar="JSON",
        help="measure nothing: merge these runs' JSON (a later file's row replaces an earlier one of the "
        "same name) into --out and the doc's table, e.g. the results of scripts/gpu_methods_job.sh",
    )
    parser.add_argument("--note", help="the sentence above the table (default: the command and date)")
    args = parser.parse_args(argv)
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown method {unknown[0]!r} (known: {', '.join(METHODS)})")
    try:
        args.variants = parse_variants(args.variant)
    except ValueError as exc:
        parser.error(str(exc))
    rows = [*args.methods, *args.variants]
    if args.rows:
        unknown = [r for r in args.rows if r not in rows]
        if unknown:
            parser.error(f"unknown row {unknown[0]!r} (known: {', '.join(rows)})")
        rows = [r for r in rows if r in args.rows]
    args.subset = bool(args.rows)
    args.rows = rows
    if args.jobs < 1:
        parser.error("--jobs must be positive")
    return args


def parse_variants(specs: list[str]) -> dict[str, tuple[str, list[str]]]:
    """``NAME=METHOD [FLAGS]`` -> {NAME: (METHOD, FLAGS)}; the flags come after the shared ones."""
    variants: dict[str, tuple[str, list[str]]] = {}
    for spec in specs:
        name, sep, rest = spec.partition("=")
        words = rest.split()
        if not sep or not name or not words:
            raise ValueError(f"--variant {spec!r}: expected NAME=METHOD [FLAGS]")
        if words[0] not in METHODS:
            raise ValueError(f"--variant {spec!r}: unknown method {words[0]!r}")
        if name in METHODS or name in variants:
            raise ValueError(f"--variant {spec!r}: the name {name!r} is taken")
        variants[name] = (words[0], words[1:])
    return variants


def train_command(row: str, args: argparse.Namespace, out: Path) -> list[str]:
    """The ``distilembed train`` command of one row: a method, or a variant of one."""
    method, extra = args.variants.get(row, (row, []))
    return [*CLI, "train", "--method", method, "--out", str(out), *train_flags(args), *extra]


def train_flags(args: argparse.Namespace) -> list[str]:
    flags: list[str] = []
    for flag, _, _ in PASS_THROUGH:
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if value is not None:
            flags += [flag, str(value)]
    return flags + [a for arg in args.train_arg for a in arg.split()]


def _run(cmd: list[str], log: Path, env: dict[str, str]) -> tuple[int, float]:
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(cmd)}\n")
        handle.flush()
        rc = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, check=False).returncode
    return rc, round(time.perf_counter() - start, 1)


def run_method(method: str, args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """Train (or resume, or skip) then export one method; returns what happened."""
    runs = Path(args.runs_dir)
    ckpt, bundle, logs = runs / method, runs / "bundles" / method, runs / "logs"
    env = dict(os.environ)
    if args.data_dir:
        env["DISTILEMBED_DATA_DIR"] = str(args.data_dir)
    status: dict[str, Any] = {"checkpoint": str(ckpt), "bundle": None}
    if (ckpt / "manifest.json").exists():
        status["train"] = "existing"
    else:
        cmd = train_command(method, args, ckpt)
        if ckpt.with_name(ckpt.name + ".partial").exists():
            cmd.append("--resume")
        console.print(f"[bold]{method}[/]: training, log {logs / f'{method}.train.log'}")
        rc, seconds = _run(cmd, logs / f"{method}.train.log", env)
        status["train"] = "ok" if rc == 0 else f"failed (rc {rc})"
        status["train_command_seconds"] = seconds
        if rc != 0:
            console.print(f"[red]{method}: training failed (rc {rc}), see {logs / f'{method}.train.log'}[/]")
            return status
    if args.no_export:
        return status
    if not (bundle / "manifest.json").exists():
        extra = [a for arg in args.export_arg for a in arg.split()]
        cmd = [*CLI, "export", "--model", str(ckpt), "--out", str(bundle), "--overwrite", *extra]
        console.print(f"[bold]{method}[/]: exporting")
        rc, _ = _run(cmd, logs / f"{method}.export.log", env)
        if rc != 0:
            status["export"] = f"failed (rc {rc}), see {logs / f'{method}.export.log'}"
            console.print(f"[red]{method}: export {status['export']}[/]")
            return status
    status["export"] = "ok"
    status["bundle"] = str(bundle)
    return status


def warm_cache(args: argparse.Namespace) -> None:
    """Parallel runs would fill the same (unlocked) teacher-target cache; fill it once first."""
    from training.config import make_config
    from training.pipeline import warm_teacher_targets

    overrides = {
        flag.removeprefix("--").replace("-", "_"): getattr(args, flag.removeprefix("--").replace("-", "_"))
        for flag, _, _ in PASS_THROUGH
        if flag != "--preset"
    }
    cfg = make_config(args.preset, overrides)
    print("warming the teacher-target cache:", warm_teacher_targets(cfg, args.data_dir), flush=True)


def collect(method: str, status: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"method": method, **status}
    ckpt = Path(status["checkpoint"]) / "manifest.json"
    if not ckpt.exists():
        return row
    manifest = json.loads(ckpt.read_text())
    seconds = manifest.get("seconds", {})
    stage_names = [s["name"] for s in manifest.get("stages", [{"name": "train"}])]
    row |= {
        "stsb_test": manifest["scores"].get("STS-B"),
        "sts_avg": manifest["scores"].get("Avg."),
        "scores": manifest["scores"],
        "best_dev": manifest["training"]["best_dev_spearman"],
        "params": manifest["student"]["params"],
        "dim": manifest["student"]["dim"],
        "train_seconds": round(sum(seconds.get(n, 0.0) for n in stage_names), 1),
        "total_seconds": round(sum(seconds.values()), 1),
        "stages": manifest.get("stages", []),
        "device": manifest["training"].get("device"),
        "teacher_reference": manifest["teacher"].get("reference", {}),
    }
    row |= stage1_dev(Path(status["checkpoint"]))
    if status.get("bundle"):
        parity = json.loads((Path(status["bundle"]) / "manifest.json").read_text()).get("parity", {})
        row |= {"bundle_stsb_test_int8": parity.get("stsb_test_int8"), "bundle_parity": parity}
    return row


def stage1_dev(checkpoint: Path) -> dict[str, Any]:
    """Stage 1's STS-B dev at step 0 and at its best evaluation: whether the method made progress
    from its start at this budget (the trainer keeps step 0 when nothing beats it)."""
    curve_path = checkpoint / "training_curve.json"
    if not curve_path.exists():
        return {}
    points = [
        (p["step"], p["dev_spearman"])
        for p in json.loads(curve_path.read_text())
        if p.get("stage", "train") == "train" and "dev_spearman" in p
    ]
    if not points or points[0][0] != 0:
        return {}
    best_step, best = max(points, key=lambda point: (point[1], -point[0]))
    return {
        "stage1_dev_step0": round(points[0][1], 2),
        "stage1_dev_best": round(best, 2),
        "stage1_best_step": best_step,
        "stage1_dev": f"{points[0][1]:.2f} -> {best:.2f} (step {best_step})",
        "stage1_improved": best_step > 0,
    }


def _export_reference(path: Path, args: argparse.Namespace, console: Console) -> bool:
    if (path / "manifest.json").exists():
        return True
    console.print(f"exporting the all-MiniLM-L6-v2 reference bundle to {path}")
    cmd = [*CLI, "export", "--model", args.reference_model, "--out", str(path)]
    rc, _ = _run(cmd, Path(args.runs_dir) / "logs" / "reference.export.log", dict(os.environ))
    return rc == 0


def measure_speeds(rows: list[dict[str, Any]], args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """Int8 sentences/s of every bundle and of the all-MiniLM-L6-v2 reference, in interleaved rounds.

    All STS-B test sentences at batch 32 per round; the median round counts. Interleaving makes a
    slow moment of the machine cost every bundle alike rather than the one that happened to run then.
    """
    from encode import stsb_sentences
    from harness import interleaved_seconds

    from export.runtime import Encoder

    bundles = {r["method"]: Path(r["bundle"]) for r in rows if r.get("bundle")}
    if not bundles:
        return {}
    reference = Path(args.reference_bundle)
    if _export_reference(reference, args, console):
        bundles = {"all-MiniLM-L6-v2": reference, **bundles}
    if not bundles or not args.data_dir:
        return {}
    texts = stsb_sentences(Path(args.data_dir) / "sts")
    encoders = {
        name: Encoder(path, variant="int8", threads=args.threads or None) for name, path in bundles.items()
    }
    for encoder in encoders.values():
        encoder.encode(texts[:256], batch_size=32)
    calls = {name: partial(encoder.encode, texts, batch_size=32) for name, encoder in encoders.items()}
    seconds = interleaved_seconds(calls, args.speed_repeats)
    speeds = {name: round(len(texts) / statistics.median(s), 1) for name, s in seconds.items()}
    console.print("int8 sentences/s (STS-B test, batch 32, median of rounds):", speeds)
    return {"texts": len(texts), "batch_size": 32, "repeats": args.speed_repeats, "sent_per_s": speeds}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    if args.render_from:
        return render_only(args, console)
    todo = [m for m in args.rows if not (Path(args.runs_dir) / m / "manifest.json").exists()]
    if args.jobs > 1 and len(todo) > 1:
        warm_cache(args)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        statuses = dict(
            zip(args.rows, pool.map(lambda m: run_method(m, args, console), args.rows), strict=True)
        )
    rows = [collect(m, statuses[m]) for m in args.rows]
    speeds = measure_speeds(rows, args, console)
    add_comparisons(rows, speeds)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python bench/methods.py", *(argv if argv is not None else sys.argv[1:])])
    report = {"command": command, "train_flags": train_flags(args), "speed": speeds, "rows": rows}
    measured = f"`{command}` ({time.strftime('%Y-%m-%d')})"
    note = args.note or f"Measured by {measured}; raw figures in `{out.as_posix()}`."
    if args.subset and out.exists():  # --rows re-measures some rows of the table, not the table
        report = merge_reports([json.loads(out.read_text()), report])
        again = f"Rows {', '.join(args.rows)} re-measured by {measured}."
        note = args.note or f"{doc_note(Path(args.doc))} {again}"
    publish(report, note, args, console)
    failed = [r["method"] for r in rows if "stsb_test" not in r or str(r.get("export", "ok")) != "ok"]
    if failed:
        console.print(f"[red]incomplete: {', '.join(failed)} (logs in {Path(args.runs_dir) / 'logs'})[/]")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

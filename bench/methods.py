"""Train, export and compare every distillation method under one budget: one command, one table.

Each row (a method, or ``--variant NAME=METHOD [FLAGS]``: METHOD with extra train flags after the
shared ones) is trained by ``distilembed train`` (skipped when RUNS/ROW/manifest.json exists, resumed
from RUNS/ROW.partial) and exported (skipped when its bundle exists); then every bundle's int8
sentences/s and all-MiniLM-L6-v2's are timed in interleaved rounds (STS-B test at batch 32). Columns:
STS-B test (PyTorch; the int8 bundle's from its parity check) and its difference to hpd's, size,
speed and its ratio to MiniLM's, training wall-clock, stage 1's STS-B dev at step 0 and at its best.
Writes docs/results/methods.json (--out) and the table between docs/methods.md's markers:

    python bench/methods.py --preset hpd-mpnet-cpu --teacher all-mpnet-base-v2 \
        --student all-MiniLM-L6-v2 --n-sentences 100000

``--methods A B`` runs only those (and the variants); ``--render-from JSON [JSON ...]`` merges runs'
JSON (a later row replaces an earlier one of its name) into --out and the table, measuring nothing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import harness as h

from training.config import METHODS

CLI = (sys.executable, "-m", "distilembed.cli")
START, END = "<!-- methods-results:start -->", "<!-- methods-results:end -->"
# fmt: off
PASS_THROUGH = {  # flags given to every ``distilembed train`` as they are, with their types
    "--preset": str, "--teacher": str, "--student": str, "--corpus": str, "--device": str,
    "--n-sentences": int, "--max-steps": int, "--batch-size": int, "--eval-every": int, "--save-every": int,
    "--max-seq-len": int, "--teacher-batch-size": int, "--finetune-max-steps": int,
    "--epochs": float, "--lr": float, "--finetune-epochs": float,
}
COLUMNS = (  # header, row key, format
    ("method", "method", "{}"), ("STS-B test (PyTorch)", "stsb_test", "{:.2f}"),
    ("vs hpd", "stsb_test_vs_hpd", "{:+.2f}"),
    ("STS-B test (int8 bundle)", "bundle_stsb_test_int8", "{:.2f}"), ("params", "params", "{:,}"),
    ("dim", "dim", "{}"), ("int8 sent/s", "int8_sent_per_s", "{:,.0f}"),
    ("x MiniLM int8", "speedup_vs_minilm", "{:.2f}"), ("train wall-clock (s)", "train_seconds", "{:.0f}"),
    ("stage-1 STS-B dev: step 0 -> best", "stage1_dev", "{}"), ("best STS-B dev", "best_dev", "{:.2f}"),
    ("trained on", "device", "{}"),
)
# fmt: on


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS, help="default: all")
    for flag, kind in PASS_THROUGH.items():
        parser.add_argument(flag, type=kind, help="passed to distilembed train")
    parser.add_argument("--train-arg", action="append", default=[], help="extra train flag (repeatable)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=METHOD [FLAGS]")
    parser.add_argument("--runs-dir", default="runs/methods", help="checkpoints, bundles and logs")
    parser.add_argument("--data-dir", default=os.environ.get("DISTILEMBED_DATA_DIR"))
    parser.add_argument("--no-export", action="store_true", help="skip the ONNX bundles")
    parser.add_argument("--export-arg", action="append", default=[], help="extra export flag (repeatable)")
    parser.add_argument("--reference-bundle", default="runs/bundles/minilm", help="MiniLM's, if exported")
    parser.add_argument("--speed-repeats", type=int, default=5, help="timed rounds per bundle (median)")
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime threads (0: all cores)")
    parser.add_argument("--out", type=Path, default=h.RESULTS / "methods.json")
    parser.add_argument("--doc", type=Path, default=h.ROOT / "docs" / "methods.md")
    parser.add_argument("--render-from", nargs="+", type=Path, metavar="JSON", help="measure nothing")
    parser.add_argument("--note", help="the sentence above the table (default: the command and date)")
    args = parser.parse_args(argv)
    try:
        args.variants = parse_variants(args.variant)
    except ValueError as exc:
        parser.error(str(exc))
    args.rows = [*args.methods, *args.variants]
    return args


def parse_variants(specs: list[str]) -> dict[str, tuple[str, list[str]]]:
    """``NAME=METHOD [FLAGS]`` -> {NAME: (METHOD, FLAGS)}; NAME is new, METHOD is known."""
    variants: dict[str, tuple[str, list[str]]] = {}
    for spec in specs:
        name, _, rest = spec.partition("=")
        method, *flags = rest.split() or [""]
        if not name or method not in METHODS or name in METHODS or name in variants:
            raise ValueError(f"--variant {spec!r}: want NEW-NAME=METHOD [FLAGS] ({', '.join(METHODS)})")
        variants[name] = (method, flags)
    return variants


def train_flags(args: argparse.Namespace) -> list[str]:
    values = ((flag, getattr(args, flag[2:].replace("-", "_"))) for flag in PASS_THROUGH)
    flags = [word for flag, value in values if value is not None for word in (flag, str(value))]
    return flags + [word for arg in args.train_arg for word in arg.split()]


def train_command(row: str, args: argparse.Namespace, out: Path) -> list[str]:
    """The ``distilembed train`` command of one row: a method, or a variant of one (its flags last)."""
    method, extra = args.variants.get(row, (row, []))
    return [*CLI, "train", "--method", method, "--out", str(out), *train_flags(args), *extra]


def run_logged(cmd: list[str], log: Path, args: argparse.Namespace) -> tuple[int, float]:
    env = dict(os.environ) | ({"DISTILEMBED_DATA_DIR": str(args.data_dir)} if args.data_dir else {})
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(cmd)}\n")
        handle.flush()
        rc = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, check=False).returncode
    return rc, round(time.perf_counter() - start, 1)


def run_row(row: str, args: argparse.Namespace) -> dict[str, Any]:
    """Train (or resume, or skip) then export one row; what happened."""
    runs = Path(args.runs_dir)
    ckpt, bundle, logs = runs / row, runs / "bundles" / row, runs / "logs"
    status: dict[str, Any] = {"checkpoint": str(ckpt), "bundle": None, "train": "existing"}
    if not (ckpt / "manifest.json").exists():
        resume = ["--resume"] if ckpt.with_name(ckpt.name + ".partial").exists() else []
        print(f"{row}: training, log {logs / f'{row}.train.log'}", flush=True)
        command = train_command(row, args, ckpt) + resume
        rc, status["train_command_seconds"] = run_logged(command, logs / f"{row}.train.log", args)
        status["train"] = "ok" if rc == 0 else f"failed (rc {rc})"
        if rc != 0:
            return status
    if args.no_export:
        return status
    if not (bundle / "manifest.json").exists():
        extra = [a for arg in args.export_arg for a in arg.split()]
        cmd = [*CLI, "export", "--model", str(ckpt), "--out", str(bundle), "--overwrite", *extra]
        rc, _ = run_logged(cmd, logs / f"{row}.export.log", args)
        if rc != 0:
            return status | {"export": f"failed (rc {rc}), see {logs / f'{row}.export.log'}"}
    return status | {"export": "ok", "bundle": str(bundle)}


def collect(row: str, status: dict[str, Any]) -> dict[str, Any]:
    """The table's figures of one row, from its checkpoint's manifest and training curve."""
    out: dict[str, Any] = {"method": row, **status}
    ckpt = Path(status["checkpoint"])
    if not (ckpt / "manifest.json").exists():
        return out
    manifest = json.loads((ckpt / "manifest.json").read_text())
    seconds, scores = manifest.get("seconds", {}), manifest["scores"]
    stages = [s["name"] for s in manifest.get("stages", [{"name": "train"}])]
    training, student = manifest["training"], manifest["student"]
    out |= {"stsb_test": scores.get("STS-B"), "sts_avg": scores.get("Avg."), "scores": scores}
    out |= {"best_dev": training["best_dev_spearman"], "params": student["params"], "dim": student["dim"]}
    out |= {"train_seconds": round(sum(seconds.get(n, 0.0) for n in stages), 1)}
    out |= {"total_seconds": round(sum(seconds.values()), 1), "stages": manifest.get("stages", [])}
    out |= {"device": training.get("device"), "teacher_reference": manifest["teacher"].get("reference", {})}
    out |= stage1_dev(ckpt)
    if status.get("bundle"):
        parity = json.loads((Path(status["bundle"]) / "manifest.json").read_text()).get("parity", {})
        out |= {"bundle_stsb_test_int8": parity.get("stsb_test_int8"), "bundle_parity": parity}
    return out


def stage1_dev(checkpoint: Path) -> dict[str, Any]:
    """Stage 1's STS-B dev at step 0 and at its best evaluation: whether the method made progress
    from its start at this budget (the trainer keeps step 0 when nothing beats it)."""
    path = checkpoint / "training_curve.json"
    curve = json.loads(path.read_text()) if path.exists() else []
    stage1 = [p for p in curve if p.get("stage", "train") == "train" and "dev_spearman" in p]
    points = [(p["step"], p["dev_spearman"]) for p in stage1]
    if not points or points[0][0] != 0:
        return {}
    step, best = max(points, key=lambda point: (point[1], -point[0]))
    start = points[0][1]
    out = {"stage1_dev_step0": round(start, 2), "stage1_dev_best": round(best, 2), "stage1_best_step": step}
    return out | {"stage1_dev": f"{start:.2f} -> {best:.2f} (step {step})", "stage1_improved": step > 0}


def measure_speeds(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Int8 sentences/s of every bundle and of the MiniLM reference (``distilembed export --model
    all-MiniLM-L6-v2 --out runs/bundles/minilm``, when there): all STS-B test sentences at batch 32
    per round, interleaved rounds, the median counts."""
    from export.runtime import Encoder

    bundles = {r["method"]: Path(r["bundle"]) for r in rows if r.get("bundle")}
    if not bundles or not args.data_dir:
        return {}
    if (Path(args.reference_bundle) / "manifest.json").exists():
        bundles = {"all-MiniLM-L6-v2": Path(args.reference_bundle), **bundles}
    pairs = h.stsb_test(args.data_dir)
    texts = [p.sentence1 for p in pairs] + [p.sentence2 for p in pairs]
    encoders = {name: Encoder(path, "int8", threads=args.threads or None) for name, path in bundles.items()}
    for encoder in encoders.values():
        encoder.encode(texts[:256], batch_size=32)  # warm-up
    calls = {name: partial(encoder.encode, texts, batch_size=32) for name, encoder in encoders.items()}
    seconds = h.interleaved_seconds(calls, args.speed_repeats)
    speeds = {name: round(len(texts) / statistics.median(s), 1) for name, s in seconds.items()}
    return {"texts": len(texts), "batch_size": 32, "repeats": args.speed_repeats, "sent_per_s": speeds}


def add_comparisons(rows: list[dict[str, Any]], speeds: dict[str, Any]) -> None:
    """Per row: int8 speed, its ratio to all-MiniLM-L6-v2's int8 bundle, STS-B test minus hpd's."""
    rates = speeds.get("sent_per_s", {})
    reference = rates.get("all-MiniLM-L6-v2")
    for row in rows:
        rate = row["int8_sent_per_s"] = rates.get(row["method"])
        row["speedup_vs_minilm"] = round(rate / reference, 2) if rate and reference else None
    compare_to_hpd(rows)


def compare_to_hpd(rows: list[dict[str, Any]]) -> None:
    hpd = next((r.get("stsb_test") for r in rows if r["method"] == "hpd"), None)
    for row in rows:
        if hpd is not None and row.get("stsb_test") is not None:
            row["stsb_test_vs_hpd"] = round(row["stsb_test"] - hpd, 2)


def merge_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from several runs': rows by name (a later run's wins), each run kept. A row keeps
    the speeds of its own run: runs on other machines have other speeds and other references."""
    rows: dict[str, dict[str, Any]] = {}
    runs: list[dict[str, Any]] = []
    for report in reports:
        runs += report.get("runs") or [{"command": report.get("command"), "speed": report.get("speed", {})}]
        rows |= {row["method"]: row for row in report["rows"]}
    compare_to_hpd(merged := list(rows.values()))
    return {"runs": runs, "rows": merged}


def render(rows: list[dict[str, Any]]) -> str:
    cells = [["-" if r.get(key) is None else spec.format(r[key]) for _, key, spec in COLUMNS] for r in rows]
    return h.markdown_table([name for name, _, _ in COLUMNS], cells)


def publish(report: dict[str, Any], note: str, args: argparse.Namespace) -> None:
    """Write the report to --out and its table, below ``note``, between the doc's markers."""
    h.write_json(args.out, report)
    text = args.doc.read_text() if args.doc.exists() else "# Methods\n"
    if START not in text or END not in text:
        text = text.rstrip("\n") + f"\n\n## Results\n\n{START}\n{END}\n"
    head, rest = text.split(START, 1)
    table = render(report["rows"])
    args.doc.write_text(f"{head}{START}\n{note}\n\n{table}\n{END}{rest.split(END, 1)[1]}")
    print(f"{table}\n\nrewrote the Results of {args.doc}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render_from:
        report = merge_reports([json.loads(p.read_text()) for p in args.render_from])
        publish(report, args.note or f"Rendered from {', '.join(f'`{p}`' for p in args.render_from)}.", args)
        return 0
    rows = [collect(row, run_row(row, args)) for row in args.rows]
    speeds = measure_speeds(rows, args)
    add_comparisons(rows, speeds)
    command = " ".join(["python bench/methods.py", *(argv if argv is not None else sys.argv[1:])])
    report = {"command": command, "train_flags": train_flags(args), "speed": speeds, "rows": rows}
    measured = f"Measured by `{command}` ({time.strftime('%Y-%m-%d')})"
    publish(report, args.note or f"{measured}; raw figures in `{h.repo_path(args.out)}`.", args)
    failed = [r["method"] for r in rows if "stsb_test" not in r or str(r.get("export", "ok")) != "ok"]
    if failed:
        print(f"incomplete: {', '.join(failed)} (logs in {Path(args.runs_dir) / 'logs'})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

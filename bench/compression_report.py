"""What bench/compression.py makes of its rows: the acceptance figures, the console table, the JSON,
the PNG and the ``compression`` block of docs/results.md."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from harness import fmt, markdown_table, publish, repo_path
from rich.console import Console
from rich.table import Table


def acceptance(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 23's figures, per student at full width and per corpus: binary and pq with rescoring."""
    out: dict[str, Any] = {}
    for corpus in sorted({r["corpus"] for r in rows}):
        at = [r for r in rows if r["corpus"] == corpus]
        exact = next(r for r in at if r["model"] == "teacher" and r["storage"] == "exact")
        ivf = next(r for r in at if r["model"] == "teacher" and r["storage"] == "float32")
        for r in at:
            if r["model"] == "teacher" or r["storage"] not in ("pq+rescore", "binary+rescore"):
                continue
            out[f"{r['model']} {r['width']} {r['storage']} ({corpus} docs)"] = {
                "mrr_vs_teacher_exact_pct": round(100 * r["mrr10"] / exact["mrr10"], 2),
                "list_bytes_vs_teacher_float": round(exact["code_bytes"] / (r["code_bytes"] - 8), 1),
                "teacher_ivf_time_over_this": round(ivf["ms_per_1000"] / r["ms_per_1000"], 2),
            }
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    corpora = sorted({r["corpus"] for r in rows})
    fig, axes = plt.subplots(1, len(corpora), figsize=(6.5 * len(corpora), 4.8), squeeze=False)
    markers = {"float32": "o", "sq8": "s", "pq": "v", "pq+rescore": "^", "binary": "x", "binary+rescore": "P"}
    models = sorted({r["model"] for r in rows})
    colors = {m: f"C{i}" for i, m in enumerate(models)}
    for ax, corpus in zip(axes[0], corpora, strict=True):
        for r in (r for r in rows if r["corpus"] == corpus):
            marker = "*" if r["model"] == "teacher" else markers[r["storage"]]
            ax.scatter(r["code_bytes"], r["mrr10"], color=colors[r["model"]], marker=marker, s=40)
            ax.annotate(str(r["width"]), (r["code_bytes"], r["mrr10"]), fontsize=6, xytext=(3, 2),
                        textcoords="offset points")  # fmt: skip
        ax.set_xscale("log")
        ax.set(xlabel="bytes per document in RAM (code + id)", ylabel="Quora MRR@10")
        ax.set_title(f"{corpus:,} documents")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=colors[m], marker="o", ls="") for m in models]
    handles += [plt.Line2D([], [], color="grey", marker=mk, ls="") for mk in markers.values()]
    axes[0][0].legend(handles, models + list(markers), fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def render(result: dict[str, Any]) -> str:
    """Every (model, width, storage) row with one column group per corpus, then the acceptance."""
    args, rows = result["args"], result["rows"]
    corpora = sorted({r["corpus"] for r in rows})
    exact = {r["corpus"]: r["mrr10"] for r in rows if r["storage"] == "exact"}
    by_key: dict[tuple[str, int, str], dict[int, dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault((r["model"], r["width"], r["storage"]), {})[r["corpus"]] = r
    header = ["model", "width", "storage", "B/doc in RAM", "STS-B test"]
    for n in corpora:
        header += [f"MRR@10, {n:,} docs", "% of teacher exact", "ms / 1000 q"]
    table = []
    for (model, width, storage), at in by_key.items():
        first = next(iter(at.values()))
        line = [model, width, storage, f"{first['code_bytes']:.0f}", fmt(first["sts_b_test"], ".2f")]
        for n in corpora:
            r = at.get(n, {"mrr10": None, "ms_per_1000": None})
            share = None if r["mrr10"] is None else 100 * r["mrr10"] / exact[n]
            line += [fmt(r["mrr10"], ".2f"), fmt(share, ".1f"), fmt(r["ms_per_1000"])]
        table.append(line)
    bundles = (b.split("=", 1) for b in args["bundles"].split(","))
    models = ", ".join(f"{name} = `{repo_path(path)}`" for name, path in bundles)
    planned = sorted(
        {(r["corpus"], r["nlist"]) for r in result["rows"] if r["storage"] == "binary" and "nlist" in r}
    )
    binary_nlist = (
        " / ".join(f"{nlist:,}" for _, nlist in planned) + " (about sqrt(n), as `index build` plans them)"
        if planned
        else args.get("binary_nlist") or args["nlist"]
    )
    pq_nprobe = args.get("pq_nprobe", args["nprobe"])
    setup = (
        f"Students: {models} ({args['variant']}). Quora retrieval as in bench/quora_sr.py; IVF nlist "
        f"{args['nlist']}, nprobe {args['nprobe']} (pq lists: nprobe {pq_nprobe}; "
        f"binary lists: nlist {binary_nlist}, nprobe {args['binary_nprobe']}), rescore_k "
        f"{args['rescore_k']}, {result['threads']} threads. B/doc in RAM: the lists' code plus the 8-byte "
        "id; rescored storages also keep 4 x width bytes per document on disk. STS-B test: the cosine of "
        "what the storage keeps. Time: median of interleaved rounds; the reference is the teacher's IVF."
    )
    return "\n\n".join(
        [setup, markdown_table(header, table, "lrl" + "r" * (len(header) - 3)), render_acceptance(result)]
    )


def render_acceptance(result: dict[str, Any]) -> str:
    """The acceptance figures of each student at its full width."""
    widest: dict[str, int] = {}
    for r in result["rows"]:
        widest[r["model"]] = max(widest.get(r["model"], 0), r["width"])
    lines = []
    for name, v in result["acceptance"].items():
        model, width, storage, corpus = re.fullmatch(r"(\S+) (\d+) (\S+) \((\d+) docs\)", name).groups()
        if int(width) == widest[model]:
            mrr, share = f"{v['mrr_vs_teacher_exact_pct']:.2f}%", f"1/{v['list_bytes_vs_teacher_float']:.0f}"
            time = f"{v['teacher_ivf_time_over_this']:.2f}x"
            lines.append([f"{model} {width} {storage}", f"{int(corpus):,}", mrr, share, time])
    header = ("student, width, storage", "docs", "MRR@10, % of teacher exact", "list bytes / teacher's")
    return markdown_table((*header, "teacher IVF time / this"), lines, "lrrrr")


def report(results: list[dict[str, Any]], args: argparse.Namespace, run: dict[str, str]) -> None:
    exact = {r["corpus"]: r["mrr10"] for r in results if r["storage"] == "exact"}
    shape = (
        f"nlist {args.nlist}, nprobe {args.nprobe} (pq {args.pq_nprobe}, binary {args.binary_nprobe}), "
        f"rescore_k {args.rescore_k}"
    )
    table = Table(title=f"Compressed indexes ({shape}): Quora MRR@10, STS-B test, memory, search time")
    columns = ("model", "width", "storage", "docs", "STS-B", "MRR@10", "% teacher", "B/doc RAM", "ms/1000 q")
    for col in columns:
        table.add_column(col, justify="left" if col in ("model", "storage") else "right", no_wrap=True)
    for r in results:
        table.add_row(
            r["model"], str(r["width"]), r["storage"], f"{r['corpus']:,}",
            "-" if r["sts_b_test"] is None else f"{r['sts_b_test']:.2f}",
            f"{r['mrr10']:.2f}", f"{100 * r['mrr10'] / exact[r['corpus']]:.1f}", f"{r['code_bytes']:.0f}",
            "-" if r["ms_per_1000"] is None else f"{r['ms_per_1000']:.1f}",
        )  # fmt: skip
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    verdict = acceptance(results)
    console.print(verdict)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    out = {"args": settings, "threads": args.threads, "rows": results, "acceptance": verdict, "run": run}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    png = Path(args.png) if args.png else Path(args.out).with_suffix(".png")
    plot(results, png)
    console.print(f"wrote {args.out} and {png}")
    publish(args, out, Path(args.out), "compression", render)

"""The 128-d head refitted to keep the student's own 384-d neighbourhoods: what it buys, what it costs.

``bench/checkpoint_quora.py --body`` shows a student's pooled encoder output (the Dense head's
input) retrieving Quora better than its 128-d output. This refits the head alone, from the trained
one, so that each sentence's neighbour distribution over a bank in the 128-d output matches the one
in the 384-d body (training/losses/neighbourhood.py, the loss of ``--target-reduction
neighbourhood``), plus ``--anchor`` times the squared distance of each unit output to the trained
head's (0: free). The text is the training run's kind (the first ``--sentences`` Wikipedia
sentences and STS-B train); Quora is only searched. Each anchor's curve is scored on STS-B dev and
test, and on Quora (exact, IVF over ``--seeds``, paired against the trained head) every
``--quora-every`` steps.

    python bench/head_refit.py --checkpoint runs/ens04r-nli --anchor 0 --anchor 1 --anchor 10 \
        --out docs/results/head_refit.json

``--save DIR`` (one anchor) writes the checkpoint with the last step's head, its manifest recording
the refit, for a later stage to start from (``distilembed finetune DIR ...``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkpoint_quora import add_scoring_args, dense_head, without_head
from harness import QuoraRetrieval, load_quora_retrieval, run_info
from ivf_seeds import search_mrrs, summarise
from quora_sr import unit_rows

from distilembed.artifacts import atomic_directory, atomic_write_json, read_manifest
from training.data.sts import STSPair, distinct_sentences, load_stsb_split
from training.data.text import read_sentences
from training.evaluation import evaluate_vectors
from training.losses.neighbourhood import neighbourhood_loss

Head = tuple[torch.Tensor, torch.Tensor]


def refit_head(
    body: torch.Tensor,
    head: Head,
    anchor: float,
    *,
    steps: int,
    lr: float,
    tau: float,
    bank: int,
    seed: int = 0,
) -> list[Head]:
    """Adam on the head (weight (d, D), bias (d,)) over the body vectors (n, D): the head after each step."""
    unit_body = F.normalize(body, dim=-1)
    weight = torch.nn.Parameter(head[0].clone())
    bias = torch.nn.Parameter(head[1].clone())
    trained = F.normalize(body @ head[0].T + head[1], dim=-1)
    optimiser = torch.optim.Adam([weight, bias], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    heads = []
    for _ in range(steps):
        anchors = torch.randint(len(body), (min(512, len(body)),), generator=generator)
        others = torch.randint(len(body), (min(bank, len(body)),), generator=generator)
        out_anchors = body[anchors] @ weight.T + bias
        loss = neighbourhood_loss(
            unit_body[anchors], unit_body[others], out_anchors, body[others] @ weight.T + bias, tau
        )
        if anchor:
            loss = loss + anchor * (F.normalize(out_anchors, dim=-1) - trained[anchors]).pow(2).sum(-1).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        heads.append((weight.detach().clone(), bias.detach().clone()))
    return heads


def project(vectors: np.ndarray, head: Head) -> np.ndarray:
    """The head's unit outputs of the body ``vectors``."""
    weight, bias = (t.numpy() for t in head)
    return unit_rows(vectors @ weight.T + bias)


def score_head(
    head: Head,
    encoded: dict[str, np.ndarray],
    sts: dict[str, list[STSPair]],
    data: QuoraRetrieval | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """STS-B per split; with ``data``, Quora exact and IVF over ``--seeds``."""
    row: dict[str, Any] = {}
    for split, pairs in sts.items():
        unit = project(encoded[split], head)
        row[split] = round(evaluate_vectors(distinct_sentences(pairs), unit, pairs), 2)
    if data is not None:
        seeds = list(range(args.seed, args.seed + args.seeds))
        found = search_mrrs(project(encoded["quora"], head), data, args, seeds)
        row |= {"exact": found.exact, "ivf": found.ivf}
    return row


def main(argv: list[str] | None = None) -> None:
    data_root = os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--anchor", type=float, action="append", help="weight of the trained head's outputs")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--tau", type=float, default=0.05)
    parser.add_argument("--bank", type=int, default=8192)
    parser.add_argument("--sentences", type=int, default=20_000, help="first Wikipedia sentences fitted on")
    parser.add_argument("--corpus", default=f"{data_root}/unlabeled/enwiki2015_1m_sentences.txt.gz")
    add_scoring_args(parser, data_root)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--quora-every", type=int, default=100)
    parser.add_argument("--save", help="write the checkpoint with the last step's head (one --anchor)")
    parser.add_argument("--out", default="docs/results/head_refit.json")
    args = parser.parse_args(argv)
    anchors = args.anchor or [0.0]
    if args.save and len(anchors) != 1:
        parser.error("--save takes one --anchor")
    faiss.omp_set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(args.checkpoint, device="cpu")
    dense = dense_head(model)
    trained = (dense.linear.weight.detach().clone(), dense.linear.bias.detach().clone())
    body = without_head(model)
    sts = {split: load_stsb_split(args.sts_dir, split) for split in ("dev", "test")}
    fit_text = read_sentences(args.corpus, limit=args.sentences) + distinct_sentences(
        load_stsb_split(args.sts_dir, "train")
    )
    data = load_quora_retrieval(args.quora_dir)

    def encode(sentences: list[str]) -> np.ndarray:
        return body.encode(sentences, batch_size=128, convert_to_numpy=True).astype(np.float32)

    encoded = {split: encode(distinct_sentences(pairs)) for split, pairs in sts.items()}
    encoded["quora"] = encode(data.corpus)
    fit = torch.from_numpy(encode(fit_text))
    start = score_head(trained, encoded, sts, data, args)
    rows = [{"anchor": None, "step": 0} | start]
    for anchor in anchors:
        heads = refit_head(fit, trained, anchor, steps=args.steps, lr=args.lr, tau=args.tau, bank=args.bank)
        for step in range(args.eval_every, args.steps + 1, args.eval_every):
            quora = data if step % args.quora_every == 0 else None
            scores = score_head(heads[step - 1], encoded, sts, quora, args)
            rows.append({"anchor": anchor, "step": step} | scores)
        if args.save:
            save_refit(args.checkpoint, args.save, model, heads[-1], vars(args))
    for row in rows:
        if "ivf" in row:
            row.update(vars(summarise(row["ivf"], start["ivf"])))
    result = {"checkpoint": args.checkpoint, "fit_sentences": len(fit_text), "rows": rows}
    result["run"] = run_info("bench/head_refit.py", argv if argv is not None else sys.argv[1:])
    render(rows, args)
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")


def save_refit(source: str, out: str, model: Any, head: Head, settings: dict[str, Any]) -> None:
    """``source``'s checkpoint with ``head`` in its Dense layer; its manifest records the refit."""
    dense = dense_head(model)
    with torch.no_grad():
        dense.linear.weight.copy_(head[0])
        dense.linear.bias.copy_(head[1])
    manifest = read_manifest(source)
    keys = ("steps", "lr", "tau", "bank", "sentences", "anchor")
    manifest["head_refit"] = {"source": source} | {k: settings[k] for k in keys}
    with atomic_directory(out) as tmp:
        model.save(str(tmp))
        atomic_write_json(tmp / "manifest.json", manifest)


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    table = Table(title=f"Head refit to the body's neighbourhoods; IVF{args.nlist} nprobe {args.nprobe}")
    for col in ("anchor", "step", "STS-B dev", "STS-B test", "Quora exact", "IVF mean (sd)", "paired (sd)"):
        table.add_column(col, justify="right")
    for r in rows:
        quora = ("", "", "")
        if "ivf" in r:
            ivf, paired = f"{r['mean']:.2f} ({r['sd']:.2f})", f"{r['diff_mean']:+.2f} ({r['diff_sd']:.2f})"
            quora = (f"{r['exact']:.2f}", ivf, paired)
        anchor = "trained head" if r["anchor"] is None else f"{r['anchor']:g}"
        table.add_row(anchor, str(r["step"]), f"{r['dev']:.2f}", f"{r['test']:.2f}", *quora)
    Console(width=None if sys.stdout.isatty() else 150).print(table)


if __name__ == "__main__":
    main()

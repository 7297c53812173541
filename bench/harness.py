"""The harness every bench script shares: the run record, interleaved timing, the blocks of
docs/results.md that a script rewrites from its own JSON, and the data the model-side scripts share
(STS-B test, the Quora retrieval set with Wikipedia distractors and the teacher's vectors of it).

A block sits between ``<!-- results:NAME:start -->`` and ``<!-- results:NAME:end -->``. A script
that owns one measures, writes its JSON (with a ``run`` record: command, machine, date) under
docs/results/, renders the table from that JSON and replaces the block; ``--render-from JSON`` does
only the last two steps, for a JSON written earlier. ``--no-doc`` leaves the doc alone.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

if TYPE_CHECKING:
    from training.data.sts import STSPair

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as ``python bench/x.py``: the packages sit beside bench/
    sys.path.insert(0, str(ROOT))
from distilembed.artifacts import atomic_write_json  # noqa: E402

DEFAULT_DOC = ROOT / "docs" / "results.md"
RESULTS = ROOT / "docs" / "results"  # every script's JSON
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
Result = dict[str, Any]  # what a script measured, as its JSON holds it
Render = Callable[[Result], str]  # the block's markdown, from a Result


class BlockError(ValueError):
    """The doc has no such block, or its markers are out of order or repeated."""


def replace_block(text: str, name: str, body: str) -> str:
    if not NAME.match(name):
        raise BlockError(f"bad block name {name!r}: lower-case letters, digits, '.', '_' and '-'")
    start, end = f"<!-- results:{name}:start -->", f"<!-- results:{name}:end -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise BlockError(f"no block {name!r}: the doc needs the line {start}, later {end}, once each")
    head, rest = text.split(start, 1)
    return f"{head}{start}\n{body.strip()}\n{end}{rest.split(end, 1)[1]}"


def rewrite_block(doc: Path, name: str, body: str) -> None:
    """Replace the block ``name`` of ``doc`` with ``body``, atomically (temp file, then rename)."""
    text = replace_block(doc.read_text(encoding="utf-8"), name, body)
    handle, name_of_tmp = tempfile.mkstemp(prefix=f".{doc.name}.", suffix=".tmp", dir=doc.parent)
    tmp = Path(name_of_tmp)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        tmp.chmod(doc.stat().st_mode & 0o777)
        tmp.replace(doc)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A pipe table; ``align`` holds one 'l' or 'r' per column (default: first left, rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [header, rule, *([str(c) for c in row] for row in rows)]
    return "\n".join("| " + " | ".join(str(c) for c in line) + " |" for line in lines)


def machine() -> str:
    """CPU model, CPU count and memory: where a run was measured."""
    info: dict[str, str] = {}
    for name in ("/proc/cpuinfo", "/proc/meminfo"):
        with contextlib.suppress(OSError):
            for key, _, value in (line.partition(":") for line in Path(name).read_text().splitlines()):
                info.setdefault(key.strip(), value.strip())
    memory = f", {round(int(info['MemTotal'].split()[0]) / 2**20)} GiB" if "MemTotal" in info else ""
    cpu = info.get("model name", platform.processor() or platform.machine())
    return f"{cpu}, {os.cpu_count()} CPUs{memory}"


def run_info(script: str, argv: Sequence[str]) -> dict[str, str]:
    """What a measuring run records in its JSON, for the caption of the table rendered from it."""
    command = shlex.join(["python", script, *argv])
    return {"command": command, "machine": machine(), "date": dt.datetime.now(dt.UTC).date().isoformat()}


def named_path(text: str) -> tuple[str, str]:
    """A ``NAME=PATH`` command-line value (``--bundle default=models/default``)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"want NAME=DIR, got {text!r}")
    return name, path


def named_bundles(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """``--bundle NAME=DIR`` values in the order given (the first is the reference), names unique."""
    if len(dict(pairs)) != len(pairs):
        raise SystemExit("error: a --bundle name is given twice")
    return dict(pairs)


def repo_path(path: str | Path) -> str:
    """``path`` relative to the repository when it is inside it, else as given."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def caption(run: dict[str, str], source: Path | None = None) -> str:
    line = f"Measured by `{run['command']}` on {run['machine']}, {run['date']}"
    return line + (f"; JSON `{repo_path(source)}`." if source is not None else ".")


def add_doc_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("results doc (docs/results.md)")
    group.add_argument("--doc", type=Path, default=DEFAULT_DOC, help="doc whose block this run rewrites")
    group.add_argument("--no-doc", action="store_true", help="leave the doc alone")
    group.add_argument("--doc-block", help="block name (default: from the results)")
    group.add_argument("--render-from", type=Path, metavar="JSON", help="measure nothing: rewrite the block")
    group.add_argument("--run-command", help="--render-from a JSON without a 'run' record: its command")
    group.add_argument("--run-date", help="... and the date it was measured (YYYY-MM-DD)")
    group.add_argument("--run-machine", help="... and its machine (default: this one)")


def publish(args: argparse.Namespace, result: Result, source: Path, block: str, render: Render) -> None:
    """Rewrite this run's block of ``--doc`` from ``result`` (unless ``--no-doc``)."""
    if args.no_doc:
        return
    run = {"machine": machine()} | (result.get("run") or {})
    given = {"command": args.run_command, "date": args.run_date, "machine": args.run_machine}
    run |= {key: value for key, value in given.items() if value}
    if missing := [key for key in ("command", "date") if not run.get(key)]:
        flags = " and ".join(f"--run-{key}" for key in missing)
        raise SystemExit(f"error: the results have no 'run' record: pass {flags}")
    name, table = args.doc_block or block, render(result)
    joint = "\n\n" if table.startswith("|") else "\n"  # a leading paragraph continues the caption's
    try:
        rewrite_block(args.doc, name, f"{caption(run, source)}{joint}{table}")
    except (BlockError, FileNotFoundError) as error:
        again = f"add the block, then rerun with --render-from {repo_path(source)}"
        raise SystemExit(f"error: {args.doc}: {error} (the results are saved: {again})") from error
    print(f"rewrote block {name!r} of {args.doc}")


def publish_saved(args: argparse.Namespace, name: str | Callable[[Result], str], render: Render) -> bool:
    """``--render-from JSON``: rewrite the block from a saved run, measuring nothing. True if it did
    (the script then stops); ``name`` is the block's name, or a function of the results giving it."""
    if not args.render_from:
        return False
    result = json.loads(args.render_from.read_text())
    publish(args, result, args.render_from, name(result) if callable(name) else name, render)
    return True


def write_json(path: str | Path, result: Mapping[str, Any]) -> Path:
    out = Path(path)
    atomic_write_json(out, result)  # a killed run never leaves half a JSON behind
    print(f"wrote {out}")
    return out


def finish(args: argparse.Namespace, result: Result, block: str, render: Render) -> None:
    """The end of a measuring run: its JSON to ``args.out``, its table printed, its block rewritten."""
    out = write_json(args.out, result)
    print(render(result))
    publish(args, result, out, block, render)


def fmt(value: float | None, spec: str = ",.1f") -> str:
    return "-" if value is None else format(value, spec)


def interleaved_seconds(
    calls: Mapping[str, Callable[[], object]], rounds: int, desc: str = "timing rounds"
) -> dict[str, list[float]]:
    """Wall-clock seconds of each call, one per round; every call runs once per round, so a slow
    moment of the machine costs every candidate alike rather than the one that happened to run then."""
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in tqdm(range(rounds), desc=desc, unit="round"):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def data_root() -> str:
    """DISTILEMBED_DATA_DIR, else ../shared/data: every model-side script's ``--data-dir``."""
    return os.environ.get("DISTILEMBED_DATA_DIR", "../shared/data")


def stsb_test(data: str | Path) -> list[STSPair]:
    """The STS-B test pairs (SentEval-processed) under the data root."""
    from training.data.sts import read_stsb

    return read_stsb(Path(data) / "sts" / "stsbenchmark" / "sts-test.csv")


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as a contiguous float32 array (what Faiss takes)."""
    rows = np.asarray(vectors, dtype=np.float32)
    return np.ascontiguousarray(rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12))


QUORA_FILES = ("quora_pairs_dev.tsv", "quora_pairs_test.tsv")
WIKIPEDIA = "unlabeled/enwiki2015_1m_sentences.txt.gz"  # the distractors, under the data root
DISTRACTOR_CHUNK = 100_000  # teacher-cache entries of distractors: whole slices, so runs share them


@dataclass(frozen=True)
class QuoraRetrieval:
    corpus: list[str]  # every distinct question of both files, sorted (then any distractors)
    queries: list[int]  # corpus index of question1 of each duplicate pair
    relevant: list[int]  # corpus index of its question2


def add_distractors(data: QuoraRetrieval, distractors: list[str]) -> tuple[QuoraRetrieval, list[int]]:
    """The corpus grown by ``distractors`` (after the questions, so query ids stay), skipping any that
    is a question or repeats an earlier one; also the positions in ``distractors`` that were kept."""
    seen = set(data.corpus)
    kept: list[int] = []
    for i, text in enumerate(distractors):
        if text not in seen:
            seen.add(text)
            kept.append(i)
    corpus = data.corpus + [distractors[i] for i in kept]
    return QuoraRetrieval(corpus, data.queries, data.relevant), kept


def load_quora_retrieval(quora_dir: str | Path) -> QuoraRetrieval:
    """The Quora semantic-retrieval set of HPD section 4.2: every distinct question is a document,
    question1 of each duplicate pair a query and its question2 the one relevant document."""
    from training.data.pairs import read_quora_pairs

    pairs = [p for name in QUORA_FILES for p in read_quora_pairs(Path(quora_dir) / name)]
    corpus = sorted({p.text1 for p in pairs} | {p.text2 for p in pairs})
    row = {text: i for i, text in enumerate(corpus)}
    dups = [p for p in pairs if p.label == 1.0 and p.text1 != p.text2]
    return QuoraRetrieval(corpus, [row[p.text1] for p in dups], [row[p.text2] for p in dups])


def drop_self(ids: np.ndarray, self_ids: np.ndarray, k: int) -> np.ndarray:
    """Top-k ids per query with the query's own corpus entry dropped (ids holds k + 1 per row)."""
    out = np.full((len(ids), k), -1, dtype=np.int64)
    for row, (hits, own) in enumerate(zip(ids, self_ids, strict=True)):
        kept = hits[hits != own][:k]
        out[row, : len(kept)] = kept
    return out


def retrieval_scores(ids: np.ndarray, relevant: np.ndarray) -> tuple[float, float]:
    """MRR@k and recall@k (x 100) of ``ids`` (k per query) for one relevant id per query."""
    hit = ids == relevant[:, None]
    ranks = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, 0)
    mrr = float(np.mean(np.where(ranks > 0, 1.0 / np.maximum(ranks, 1), 0.0)))
    return 100 * mrr, 100 * float(hit.any(axis=1).mean())


def add_quora_args(parser: argparse.ArgumentParser, distractors: int) -> None:
    """The data root, the number of Wikipedia distractors and the teacher of ``quora_corpus``."""
    parser.add_argument("--data-dir", default=data_root())
    parser.add_argument("--distractors", type=int, default=distractors, help="first N Wikipedia sentences")
    parser.add_argument("--teacher", default="all-mpnet-base-v2")


def quora_corpus(args: argparse.Namespace) -> tuple[QuoraRetrieval, QuoraRetrieval, np.ndarray]:
    """The Quora questions, the corpus grown by ``--distractors``, and the teacher's unit vectors of it,
    through the teacher-target cache of ``distilembed train`` (each text encoded once per machine).
    Distractors go in ``DISTRACTOR_CHUNK`` slices: a run with 200k reuses those of a run with 100k."""
    from training.data.text import read_sentences
    from training.teacher_targets import Teacher

    questions = load_quora_retrieval(Path(args.data_dir) / "quora")
    slices = -(-args.distractors // DISTRACTOR_CHUNK)
    wiki = Path(args.data_dir) / WIKIPEDIA
    pool = read_sentences(wiki, limit=slices * DISTRACTOR_CHUNK) if slices > 0 else []
    data, kept = add_distractors(questions, pool[: args.distractors])
    teacher = Teacher(args.teacher, batch_size=16)  # mpnet's fastest on a CPU
    vectors = [teacher.targets(questions.corpus)[0]]
    if kept:
        starts = range(0, len(pool), DISTRACTOR_CHUNK)
        extra = np.concatenate([teacher.targets(pool[i : i + DISTRACTOR_CHUNK])[0] for i in starts])
        vectors.append(extra[np.asarray(kept)])
    return questions, data, unit_rows(np.concatenate(vectors).astype(np.float32))

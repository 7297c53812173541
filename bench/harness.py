"""The harness every bench script shares: interleaved timing, the Quora retrieval set, the run record
and the blocks of docs/results.md that a script rewrites from its own JSON.

A block sits between ``<!-- results:NAME:start -->`` and ``<!-- results:NAME:end -->``. A script
that owns one measures, writes its JSON (with a ``run`` record: command, machine, date), renders
the table from that JSON and replaces the block; ``--render-from JSON`` does only the last two
steps, for a JSON written earlier. ``--no-doc`` leaves the doc alone.
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
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DOC = ROOT / "docs" / "results.md"
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class BlockError(ValueError):
    """The doc has no such block, or its markers are out of order or repeated."""


def markers(name: str) -> tuple[str, str]:
    if not NAME.match(name):
        raise BlockError(f"bad block name {name!r}: lower-case letters, digits, '.', '_' and '-'")
    return f"<!-- results:{name}:start -->", f"<!-- results:{name}:end -->"


def replace_block(text: str, name: str, body: str) -> str:
    start, end = markers(name)
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise BlockError(
            f"no block {name!r}: the doc needs the line {start}, later the line {end}, once each"
        )
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    return f"{head}{start}\n{body.strip()}\n{end}{tail}"


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


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def memory_gib() -> int | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20)
    return None


def machine() -> str:
    memory = memory_gib()
    return f"{cpu_model()}, {os.cpu_count()} CPUs" + (f", {memory} GiB" if memory else "")


def run_info(script: str, argv: Sequence[str]) -> dict[str, str]:
    """What a measuring run records in its JSON, for the caption of the table rendered from it."""
    return {
        "command": shlex.join(["python", script, *argv]),
        "machine": machine(),
        "date": dt.datetime.now(dt.UTC).date().isoformat(),
    }


def named_path(text: str) -> tuple[str, str]:
    """A ``NAME=PATH`` command-line value (``--bundle default=models/default``)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"want NAME=DIR, got {text!r}")
    return name, path


def repo_path(path: str | Path) -> str:
    """``path`` relative to the repository when it is inside it, else as given."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def caption(run: dict[str, str], source: Path | None = None) -> str:
    line = f"Measured by `{run['command']}` on {run['machine']}, {run['date']}"
    if source is not None:
        line += f"; JSON `{repo_path(source)}`"
    return line + "."


def add_doc_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("results doc (docs/results.md)")
    group.add_argument("--doc", type=Path, default=DEFAULT_DOC, help="doc whose block this run rewrites")
    group.add_argument("--no-doc", action="store_true", help="leave the doc alone")
    group.add_argument("--doc-block", help="block name (default: from the results)")
    group.add_argument(
        "--render-from", type=Path, metavar="JSON", help="measure nothing: rewrite the block from this JSON"
    )
    group.add_argument("--run-command", help="--render-from a JSON without a 'run' record: its command")
    group.add_argument("--run-date", help="... and the date it was measured (YYYY-MM-DD)")
    group.add_argument("--run-machine", help="... and its machine (default: this one)")


def recorded_run(result: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    run = dict(result.get("run") or {})
    given = {"command": args.run_command, "date": args.run_date, "machine": args.run_machine}
    run |= {key: value for key, value in given.items() if value}
    run.setdefault("machine", machine())
    missing = [key for key in ("command", "date") if not run.get(key)]
    if missing:
        flags = " and ".join(f"--run-{key}" for key in missing)
        raise SystemExit(f"error: the results have no 'run' record: pass {flags}")
    return run


def publish(
    args: argparse.Namespace,
    result: dict[str, Any],
    source: Path,
    default_name: str,
    render: Callable[[dict[str, Any]], str],
) -> None:
    """Rewrite this run's block of ``--doc`` from ``result`` (unless ``--no-doc``)."""
    if args.no_doc:
        return
    name = args.doc_block or default_name
    table = render(result)
    joint = "\n\n" if table.startswith("|") else "\n"  # a leading paragraph continues the caption's
    body = f"{caption(recorded_run(result, args), source)}{joint}{table}"
    try:
        rewrite_block(args.doc, name, body)
    except (BlockError, FileNotFoundError) as error:
        again = f"add the block, then rerun with --render-from {repo_path(source)}"
        raise SystemExit(f"error: {args.doc}: {error} (the results are saved: {again})") from error
    print(f"rewrote block {name!r} of {args.doc}")


def publish_saved(
    args: argparse.Namespace,
    name: str | Callable[[dict[str, Any]], str],
    render: Callable[[dict[str, Any]], str],
) -> bool:
    """``--render-from JSON``: rewrite the block from a saved run, measuring nothing. True if it did
    (the script then stops); ``name`` is the block's name, or a function of the results giving it."""
    if not args.render_from:
        return False
    result = json.loads(args.render_from.read_text())
    publish(args, result, args.render_from, name(result) if callable(name) else name, render)
    return True


def fmt(value: float | None, spec: str = ",.1f") -> str:
    return "-" if value is None else format(value, spec)


# Interleaved timing: every candidate runs once per round, so a slow moment of the machine costs
# every candidate alike rather than the one that happened to run then.
def interleaved_seconds(
    calls: Mapping[str, Callable[[], object]],
    rounds: int,
    alternate: bool = False,
    desc: str = "timing rounds",
) -> dict[str, list[float]]:
    """Wall-clock seconds of each call, one per round. ``alternate`` reverses the order every other
    round (two candidates: neither always runs right after the other)."""
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for round_ in tqdm(range(rounds), desc=desc, unit="round"):
        for name in reversed(names) if alternate and round_ % 2 else names:
            start = time.perf_counter()
            calls[name]()
            seconds[name].append(time.perf_counter() - start)
    return seconds


QUORA_FILES = ("quora_pairs_dev.tsv", "quora_pairs_test.tsv")


@dataclass(frozen=True)
class QuoraRetrieval:
    corpus: list[str]  # every distinct question of both files, sorted
    queries: list[int]  # corpus index of question1 of each duplicate pair
    relevant: list[int]  # corpus index of its question2

    @property
    def corpus_sha256(self) -> str:
        from training.data.text import content_hash

        return content_hash(self.corpus)


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

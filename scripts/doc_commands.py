"""Check and run the commands in README.md and the guides: every command in them runs in a fresh clone.

Every ```bash, ```sh, ```console and ```python fence of README.md and docs/*.md (all but results.md
and decisions.md) has one marker on the line directly above it:

    <!-- runnable -->               run it
    <!-- runnable: TAGS -->         run it when its tags (comma-separated) are met: service (a
                                    `distilembed serve` on a fresh index, one per file; localhost:8080
                                    and 127.0.0.1:8080 become its port), data (DISTILEMBED_DATA_DIR,
                                    set for these blocks only), mpnet (the packaged teacher), ray (the
                                    ray extra), slow (only with --slow)
    <!-- not-runnable: REASON -->   shown to users, never run

Files run in order (README.md, then docs/*.md sorted), blocks in document order, each in a process of
its own in the tree's root with its .venv/bin first on PATH: bash and sh with `bash -euo pipefail -c`,
console with its `$ ` lines only, python with the venv's python; its background processes are killed
when it ends. A curl that must succeed needs -f (curl -sf) to fail its block on an HTTP error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_GUIDES = ("results.md", "decisions.md")
STATUSES = ("passed", "failed", "skipped", "not-runnable", "invalid")
READY_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0
SLOW_FACTOR = 12  # a slow block may train for an hour at the default 300 s
SERVICE_URL = re.compile(r"\b(localhost|127\.0\.0\.1):8080\b")
MPNET_CHECK = "from training.teachers import _mpnet_parts; raise SystemExit(0 if _mpnet_parts() else 3)"
RAY_CHECK = "import importlib.util as u; raise SystemExit(0 if u.find_spec('ray') else 3)"
LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy for the local service
LANGS = ("bash", "sh", "console", "python")
TAGS = ("service", "data", "mpnet", "slow", "ray")
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`{]*)")
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>runnable|not-runnable)\s*(?::(?P<arg>.*?))?\s*-->\s*$")
LOOSE_MARKER = re.compile(r"^\s*<!--\s*(not[- ]?)?runn?able", re.IGNORECASE)
USAGE = "<!-- runnable -->, <!-- runnable: TAGS --> or <!-- not-runnable: REASON -->"


@dataclass
class Block:
    file: str
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    kind: str  # runnable | not-runnable | invalid
    tags: tuple[str, ...] = ()
    reason: str = ""  # not-runnable: why not; invalid: what is wrong with its marker


def parse_marker(line: str) -> tuple[str, tuple[str, ...], str]:
    """(kind, tags, reason) of the line above a fence; kind ``invalid`` with the problem as reason."""
    match = MARKER.match(line)
    if match is None:
        found = "a malformed marker" if LOOSE_MARKER.match(line) else "no marker"
        return "invalid", (), f"{found} on the line above (want {USAGE})"
    if match["kind"] == "not-runnable":
        reason = (match["arg"] or "").strip()
        return ("not-runnable", (), reason) if reason else ("invalid", (), "not-runnable without a reason")
    tags = tuple(tag.strip() for tag in match["arg"].split(",")) if match["arg"] is not None else ()
    unknown = [tag for tag in tags if tag not in TAGS]
    if not unknown:
        return "runnable", tags, ""
    problem = "empty tag in runnable marker" if "" in tags else f"unknown tag {', '.join(unknown)}"
    return "invalid", (), f"{problem} (tags: {', '.join(TAGS)})"


def _scan(path: Path, name: str) -> tuple[list[Block], list[int]]:
    """The shell and Python blocks of a markdown file, and the lines of markers above no such block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    outside: list[int] = []  # line indexes outside fences
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            outside.append(i)
            i += 1
            continue
        closing = re.compile(rf"^ *{re.escape(match['fence'][0])}{{{len(match['fence'])},}}\s*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), len(lines))
        lang = match["info"].lower()
        if lang in LANGS:
            indent = len(match["indent"])
            body = [line if line[:indent].strip() else line[indent:] for line in lines[i + 1 : end]]
            kind, tags, reason = parse_marker(lines[i - 1] if i else "")
            blocks.append(Block(name, i + 1, lang, "".join(f"{line}\n" for line in body), kind, tags, reason))
        i = end + 1
    above = {block.line - 2 for block in blocks}
    stray = [i + 1 for i in outside if LOOSE_MARKER.match(lines[i]) and i not in above]
    return blocks, stray


def extract(path: Path, name: str | None = None) -> list[Block]:
    """The ```bash / sh / console / python blocks of a markdown file with their markers."""
    return _scan(path, name or str(path))[0]


def check(path: Path, name: str | None = None) -> list[str]:
    """One ``file:line: problem`` line per block without a valid marker and per stray marker."""
    blocks, stray = _scan(path, name or str(path))
    problems = [(b.line, f"```{b.lang} block: {b.reason}") for b in blocks if b.kind == "invalid"]
    problems += [(n, "marker not on the line directly above a bash/sh/console/python fence") for n in stray]
    return [f"{name or path}:{line}: {problem}" for line, problem in sorted(problems)]


def describe(block: Block) -> str:
    """``file:line  lang  marker  | first line`` for --list."""
    marker = block.kind + "".join(f": {part}" for part in (",".join(block.tags), block.reason) if part)
    first = block.code.partition("\n")[0][:60]
    return f"{block.file}:{block.line}  {block.lang:<7}  {marker}  | {first}"


@dataclass
class Result:
    file: str
    line: int
    status: str  # one of STATUSES
    seconds: float = 0.0
    reason: str = ""


def default_docs(tree: Path) -> list[Path]:
    """README.md, then the guides (docs/*.md but results.md and decisions.md), sorted."""
    guides = sorted(p for p in (tree / "docs").glob("*.md") if p.name not in NOT_GUIDES)
    return [tree / "README.md", *guides]


def display_name(path: Path, tree: Path) -> str:
    resolved = path.resolve()
    return str(resolved.relative_to(tree.resolve())) if resolved.is_relative_to(tree.resolve()) else str(path)


def console_commands(code: str) -> str:
    """A console block's commands: its ``$ `` lines (prompt stripped) and their continuation lines;
    a block with no prompt runs as it is."""
    lines = code.splitlines()
    if not any(line.startswith("$ ") for line in lines):
        return code
    commands: list[str] = []
    continued = False
    for line in lines:
        if continued or line.startswith("$ "):
            commands.append(line if continued else line[2:])
            continued = line.rstrip().endswith("\\")
    return "".join(f"{line}\n" for line in commands)


def rewrite_service_urls(code: str, port: int) -> str:
    return SERVICE_URL.sub(rf"\g<1>:{port}", code)


def shared_data() -> Path | None:
    """``DISTILEMBED_DATA_DIR``, else ../shared/data next to this checkout, if it has the STS-B test set."""
    value = os.environ.get("DISTILEMBED_DATA_DIR")
    root = Path(value).expanduser() if value else ROOT.parent / "shared" / "data"
    return root.resolve() if (root / "sts" / "stsbenchmark" / "sts-test.csv").is_file() else None


class ServiceError(RuntimeError):
    pass


class Runner:
    """Runs blocks in one tree: its venv first on PATH, its code first on PYTHONPATH, a clean
    ``DISTILEMBED_*`` environment (but the cache dir) and tag checks made once."""

    def __init__(self, tree: Path, *, slow: bool = False, timeout: float = 300.0) -> None:
        self.tree = tree.resolve()
        self.timeout = timeout
        self.data = shared_data()
        self.python = str(self.tree / ".venv" / "bin" / "python")
        keep = {"DISTILEMBED_CACHE_DIR"}
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DISTILEMBED_") or k in keep}
        self.env["PATH"] = os.pathsep.join([str(self.tree / ".venv" / "bin"), os.environ.get("PATH", "")])
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.tree), os.environ.get("PYTHONPATH")]))
        self.env["VIRTUAL_ENV"] = str(self.tree / ".venv")
        for proxy in ("no_proxy", "NO_PROXY"):  # the service is local, whatever proxy is set
            self.env[proxy] = ",".join(filter(None, [os.environ.get(proxy), "localhost,127.0.0.1"]))
        self._unmet: dict[str, str | None] = {
            "slow": None if slow else "slow: runs with --slow only",
            "data": None if self.data else "data: no DISTILEMBED_DATA_DIR (nor ../shared/data) with STS-B",
        }

    def unmet(self, tag: str) -> str | None:
        """Why a tag is not met here, or None (each checked once)."""
        if tag not in self._unmet:
            self._unmet[tag] = self._check(tag)
        return self._unmet[tag]

    def _check(self, tag: str) -> str | None:
        checks = {"mpnet": (MPNET_CHECK, "the all-mpnet-base-v2 teacher packages are not installed"),
                  "ray": (RAY_CHECK, "the ray extra is not installed")}  # fmt: skip
        if tag not in checks:
            return None
        code, missing = checks[tag]
        run = {"cwd": self.tree, "env": self.env, "capture_output": True, "text": True, "timeout": 300}
        done = subprocess.run([self.python, "-c", code], check=False, **run)
        if done.returncode in {0, 3}:
            return None if done.returncode == 0 else f"{tag}: {missing}"
        return f"{tag}: the check failed ({done.returncode}): {done.stderr.strip()[-300:]}"

    def limit(self, block: Block) -> float:
        """Seconds a block may run: ``slow`` blocks (training runs) get SLOW_FACTOR times more."""
        return self.timeout * (SLOW_FACTOR if "slow" in block.tags else 1)

    def run(self, block: Block, code: str) -> tuple[int | None, str, float]:
        """(exit status or None on timeout, output, seconds) of one block."""
        code = console_commands(code) if block.lang == "console" else code
        interpreter = [self.python] if block.lang == "python" else ["bash", "-euo", "pipefail"]
        data = {"DISTILEMBED_DATA_DIR": str(self.data)} if self.data and "data" in block.tags else {}
        start = time.monotonic()
        with tempfile.TemporaryFile() as out:  # a file, not a pipe: a lingering child cannot hang us
            proc = subprocess.Popen(
                [*interpreter, "-c", code], cwd=self.tree, env=self.env | data, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            try:
                status: int | None = proc.wait(timeout=self.limit(block))
            except subprocess.TimeoutExpired:
                status = None
            finally:  # what is left of the block's process group: its background children
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.seek(0)
            return status, out.read().decode(errors="replace"), time.monotonic() - start

    @contextmanager
    def service(self, workdir: Path) -> Iterator[int]:
        """``distilembed serve`` on a fresh index in ``workdir``; yields its port once /ready says so."""
        with socket.socket() as sock:  # a free port
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        index, log_path = workdir / "doc-index", workdir / "serve.log"
        exe = str(self.tree / ".venv" / "bin" / "distilembed")
        cmd = [exe, "serve", "--index", str(index), "--create-index", "--port", str(port)]
        with open(log_path, "wb") as log:
            out = {"stdin": subprocess.DEVNULL, "stdout": log, "stderr": subprocess.STDOUT}
            proc = subprocess.Popen(cmd, cwd=self.tree, env=self.env, **out)
            try:
                self._wait_ready(proc, port, log_path)
                yield port
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    @staticmethod
    def _wait_ready(proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        """Poll /ready until it says so, the process exits or the deadline passes."""
        deadline, url = time.monotonic() + READY_TIMEOUT, f"http://127.0.0.1:{port}/ready"
        while (alive := proc.poll() is None) and time.monotonic() < deadline:
            with suppress(OSError, ValueError), LOCAL.open(url, timeout=2) as response:  # URLError: OSError
                if json.load(response).get("ready"):
                    return
            with suppress(subprocess.TimeoutExpired):  # the poll interval, cut short if it exits
                proc.wait(timeout=0.1)
        why = f"not ready in {READY_TIMEOUT:.0f} s" if alive else f"exited ({proc.returncode})"
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise ServiceError(f"distilembed serve {why}:\n{tail}")


def run_block(runner: Runner, block: Block, port: int | None) -> Result:
    """Run one block (``port``: the file's service, 0 if it did not start); failures are printed with
    the code and the last 40 lines of output."""
    where = f"{block.file}:{block.line}"
    if port == 0:
        return Result(block.file, block.line, "failed", reason="the service did not start")
    code = rewrite_service_urls(block.code, port) if port else block.code
    status, output, seconds = runner.run(block, code)
    if status == 0:
        print(f"passed  {where} ({seconds:.1f} s)", flush=True)
        return Result(block.file, block.line, "passed", round(seconds, 2))
    why = f"timed out after {runner.limit(block):g} s" if status is None else f"exit status {status}"
    tail = "\n  ".join(output.rstrip().splitlines()[-40:])
    print(f"FAILED {where} ({block.lang}, {why})\n  " + block.code.rstrip().replace("\n", "\n  "))
    print(f"  --- last 40 lines of output ---\n  {tail}", flush=True)
    return Result(block.file, block.line, "failed", round(seconds, 2), why)


def run_file(runner: Runner, path: Path, name: str) -> list[Result]:
    """Every block of one file in order; the service starts before its first service block."""
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="doc-commands-") as tmp, ExitStack() as stack:
        port: int | None = None  # the file's service; 0: it did not start
        for block in extract(path, name):
            if block.kind != "runnable":
                results.append(Result(block.file, block.line, block.kind, reason=block.reason))
            elif unmet := "; ".join(why for tag in block.tags if (why := runner.unmet(tag))):
                print(f"skipped {block.file}:{block.line}: {unmet}", flush=True)
                results.append(Result(block.file, block.line, "skipped", reason=unmet))
            else:
                if "service" in block.tags and port is None:
                    try:
                        port = stack.enter_context(runner.service(Path(tmp)))
                    except ServiceError as exc:
                        print(f"FAILED {block.file}:{block.line}: {exc}", flush=True)
                        port = 0
                results.append(run_block(runner, block, port if "service" in block.tags else None))
    return results


def run_docs(tree: Path, docs: list[Path], *, slow: bool = False, timeout: float = 300.0) -> list[Result]:
    """Run the runnable blocks of ``docs`` (in this order) in ``tree``."""
    runner = Runner(tree, slow=slow, timeout=timeout)
    return [result for path in docs for result in run_file(runner, path, display_name(path, tree))]


def table(results: list[Result]) -> str:
    counts: dict[str, dict[str, int]] = {}
    for result in results:
        counts.setdefault(result.file, dict.fromkeys(STATUSES, 0))[result.status] += 1
    counts["total"] = {s: sum(c[s] for c in counts.values()) for s in STATUSES}
    width = max(len(name) for name in counts)
    rows = [f"{'file':<{width}}  " + "  ".join(STATUSES)]
    rows += [f"{n:<{width}}  " + "  ".join(f"{c[s]:>{len(s)}}" for s in STATUSES) for n, c in counts.items()]
    return "\n".join(rows)


def clone(dest: Path) -> Path:
    """``git clone`` of this checkout's HEAD into an empty ``dest``, with this checkout's .venv linked."""
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"--clone: {dest} is not empty")
    git = ["git", "-C", str(ROOT)]
    head = subprocess.check_output([*git, "rev-parse", "HEAD"], text=True).strip()
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", "--detach", head], check=True)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    dirty = subprocess.check_output([*git, "status", "--porcelain"], text=True)
    note = "; uncommitted changes in this checkout are not in it" if dirty.strip() else ""
    print(f"cloned {head[:12]} into {dest}{note}", flush=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--tree", type=Path, metavar="DIR", help="run in this tree (default: this checkout)")
    where.add_argument("--clone", type=Path, metavar="DIR", help="git clone HEAD into empty DIR, run there")
    parser.add_argument("--docs", nargs="+", type=Path, metavar="MD", help="these markdown files instead")
    parser.add_argument("--files", nargs="+", metavar="NAME", help="only these of the files (README.md ...)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help="print the blocks and their markers, run nothing")
    mode.add_argument("--check", action="store_true", help="only check the markers (exit 1 on a bad one)")
    parser.add_argument("--slow", action="store_true", help="also run the blocks tagged slow")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S", help="per block (slow: 12x)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write per-block results here")
    args = parser.parse_args(argv)
    tree = clone(args.clone.resolve()) if args.clone else (args.tree or ROOT).resolve()
    docs = [p if p.is_absolute() else tree / p for p in args.docs] if args.docs else default_docs(tree)
    if args.files:
        wanted = {str(Path(name)) for name in args.files}
        docs = [p for p in docs if display_name(p, tree) in wanted or p.name in wanted]
        if not docs:
            raise SystemExit(f"--files: none of {sorted(wanted)} is among the docs")
    if missing := [str(p) for p in docs if not p.is_file()]:
        raise SystemExit(f"no such file: {', '.join(missing)}")
    if args.list:
        for block in (block for path in docs for block in extract(path, display_name(path, tree))):
            print(describe(block))
        return 0
    problems = [line for path in docs for line in check(path, display_name(path, tree))]
    print("\n".join(problems) or f"markers: valid in {len(docs)} files", flush=True)
    if args.check:
        return 1 if problems else 0
    results = run_docs(tree, docs, slow=args.slow, timeout=args.timeout)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    print(table(results))
    return 1 if problems or any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

"""The fenced shell and Python blocks of a markdown file and the markers above them (their syntax:
scripts/doc_commands.py's docstring)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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


def _tag_problem(tags: tuple[str, ...]) -> str:
    known = f"(tags: {', '.join(TAGS)})"
    if "" in tags:
        return f"empty tag in runnable marker {known}"
    unknown = [tag for tag in tags if tag not in TAGS]
    return f"unknown tag {', '.join(unknown)} {known}" if unknown else ""


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
    problem = _tag_problem(tags)
    return ("invalid", (), problem) if problem else ("runnable", tags, "")


def _closing(lines: list[str], start: int, fence: str) -> int:
    """Index of the line closing the fence opened at ``start`` (len(lines) when unclosed)."""
    closing = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
    return next((i for i in range(start + 1, len(lines)) if closing.match(lines[i])), len(lines))


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
        end = _closing(lines, i, match["fence"])
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

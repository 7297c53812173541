"""scripts/doc_commands.py: the markers above the shell and Python blocks of README.md and the guides,
and every runnable block of them run in a copy of the working tree (issue 25: every command in the docs
runs in a fresh clone)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_script() -> ModuleType:
    """scripts/ is no package: load the script by path (registered, for its dataclasses)."""
    spec = importlib.util.spec_from_file_location("doc_commands", ROOT / "scripts" / "doc_commands.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


dc = _load_script()


def _write(tmp_path: Path, text: str, name: str = "guide.md") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_markers_give_kind_tags_and_reason(tmp_path: Path) -> None:
    md = _write(
        tmp_path,
        "# Guide\n\n<!-- runnable -->\n```bash\necho one\necho two\n```\n\n"
        "<!-- runnable: service, data -->\n```python\nprint(1)\n```\n"
        "<!-- not-runnable: needs docker -->\n```sh\ndocker build .\n```\n"
        "<!--runnable:slow-->\n```console\n$ distilembed --help\n```\n",
    )
    blocks = dc.extract(md, "guide.md")
    assert [(b.line, b.lang, b.kind, b.tags, b.reason) for b in blocks] == [
        (4, "bash", "runnable", (), ""),
        (10, "python", "runnable", ("service", "data"), ""),
        (14, "sh", "not-runnable", (), "needs docker"),
        (18, "console", "runnable", ("slow",), ""),
    ]
    assert blocks[0].code == "echo one\necho two\n" and blocks[0].file == "guide.md"
    assert dc.check(md, "guide.md") == []


def test_bad_markers_are_reported_one_line_each_with_file_and_line(tmp_path: Path) -> None:
    md = _write(
        tmp_path,
        "```bash\nls\n```\n"  # 1: no marker
        "<!-- not-runnable: -->\n```bash\nls\n```\n"  # 5: empty reason
        "<!-- not-runnable -->\n```bash\nls\n```\n"  # 9: no reason
        "<!-- runnable: gpu -->\n```python\npass\n```\n"  # 13: unknown tag
        "<!-- runnable: -->\n```sh\nls\n```\n"  # 17: empty tag list
        "<!-- runnable -->\n\n```bash\nls\n```\n"  # 20 stray marker, 22 no marker (blank line between)
        "<!-- runable -->\n```console\n$ ls\n```\n"  # 26: malformed marker
        "<!-- runnable -->\n```json\n{}\n```\n",  # 29: a marker above a fence that takes none
    )
    problems = dc.check(md, "g.md")
    assert [p.split(": ", 1)[0] for p in problems] == [f"g.md:{n}" for n in (1, 5, 9, 13, 17, 20, 22, 26, 29)]
    text = "\n".join(problems)
    assert "not-runnable without a reason" in text and "unknown tag gpu" in text and "empty tag" in text
    assert "malformed marker" in text and "marker not on the line directly above" in text
    assert all("\n" not in p for p in problems)
    kinds = [b.kind for b in dc.extract(md)]
    assert kinds == ["invalid"] * 7


def test_other_fences_need_no_marker_and_hide_what_they_contain(tmp_path: Path) -> None:
    md = _write(
        tmp_path,
        "```\nplain\n```\n```text\n<!-- runnable -->\n```\n```json\n{}\n```\n```yaml\na: 1\n```\n"
        "````markdown\n<!-- runnable -->\n```bash\nls\n```\n````\n"
        "- a list item:\n\n  <!-- runnable -->\n  ```bash\n  echo indented\n    kept\n  ```\n",
    )
    assert dc.check(md) == []
    [block] = dc.extract(md)
    assert block.code == "echo indented\n  kept\n" and block.kind == "runnable"


def test_console_blocks_keep_their_prompt_lines_and_continuations() -> None:
    code = "$ distilembed index info \\\n    --index runs/index\nflat, 3 documents\n$ echo done\ndone\n"
    assert dc.console_commands(code) == "distilembed index info \\\n    --index runs/index\necho done\n"
    assert dc.console_commands("echo no prompt\n") == "echo no prompt\n"


def test_service_urls_point_at_the_chosen_port() -> None:
    code = "curl -s localhost:8080/health; curl http://127.0.0.1:8080/ready; echo a.com:8080 localhost:80801"
    assert dc.rewrite_service_urls(code, 41234) == (
        "curl -s localhost:41234/health; curl http://127.0.0.1:41234/ready; echo a.com:8080 localhost:80801"
    )


def test_readme_and_guides_have_valid_markers() -> None:
    docs = dc.default_docs(ROOT)
    assert docs[0].name == "README.md" and all(p.name not in {"results.md", "decisions.md"} for p in docs)
    problems = [line for path in docs for line in dc.check(path, dc.display_name(path, ROOT))]
    assert problems == [], "\n".join(problems)


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working tree as git sees it (tracked and untracked, not ignored) copied, with .venv linked
    (and models/default, were it ignored): the docs' commands write into it, not into the checkout."""
    dest = tmp_path_factory.mktemp("tree") / "distilembed"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file() or src.is_symlink():  # a tracked file deleted in the working tree is skipped
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    if (ROOT / "models" / "default").is_dir() and not (dest / "models" / "default").exists():
        (dest / "models").mkdir(exist_ok=True)
        (dest / "models" / "default").symlink_to(ROOT / "models" / "default")
    return dest


SAMPLE = """# A sample guide

<!-- runnable -->
```bash
test "$PWD" = "{tree}"
test "$(command -v distilembed)" = "$PWD/.venv/bin/distilembed"
test -z "${{DISTILEMBED_DATA_DIR:-}}"
echo made > runs-sample.txt
```

<!-- runnable: service -->
```bash
curl -sf localhost:8080/health
curl -sf localhost:8080/documents -H 'content-type: application/json' \\
  -d '{{"documents": [{{"id": "cat", "text": "A cat is sleeping on the sofa."}}]}}'
```

<!-- runnable: service -->
```python
import json, pathlib, urllib.request
import distilembed
assert pathlib.Path(distilembed.__file__).resolve().parents[1] == pathlib.Path.cwd().resolve()
assert pathlib.Path("runs-sample.txt").read_text() == "made\\n"
with urllib.request.urlopen("http://127.0.0.1:8080/documents/cat") as response:
    assert json.load(response)["text"] == "A cat is sleeping on the sofa."
```

<!-- runnable: service -->
```console
$ curl -sf localhost:8080/documents/dog
{{"error": "not found"}}
```

<!-- not-runnable: a placeholder host -->
```bash
curl -s https://embeddings.example.com/health
```

<!-- runnable: slow -->
```bash
exit 1
```

<!-- runnable: data -->
```bash
test -f "$DISTILEMBED_DATA_DIR/sts/stsbenchmark/sts-test.csv"
```

<!-- runnable -->
```bash
echo before
false
echo never
```
"""


def test_runner_runs_shell_service_and_python_blocks_of_a_sample(tree_copy: Path, tmp_path: Path) -> None:
    md = _write(tmp_path, SAMPLE.format(tree=tree_copy.resolve()))
    out = tmp_path / "results.json"
    assert dc.main(["--tree", str(tree_copy), "--docs", str(md), "--json", str(out)]) == 1
    results = {r["line"]: r for r in json.loads(out.read_text())}
    status = {line: r["status"] for line, r in results.items()}
    data = "passed" if dc.shared_data() else "skipped"
    assert status == {
        4: "passed",
        12: "passed",
        19: "passed",
        29: "failed",  # curl -f fails on the 404
        35: "not-runnable",
        40: "skipped",
        45: data,
        50: "failed",  # bash -e stops at false
    }
    assert results[29]["reason"] == "exit status 22" and results[50]["reason"] == "exit status 1"
    assert results[40]["reason"] == "slow: runs with --slow only"
    assert results[35]["reason"] == "a placeholder host"


def test_a_timeout_and_a_service_that_does_not_start_fail_their_blocks(tmp_path: Path, capsys) -> None:
    tree = tmp_path / "bare"  # no models/default: the service exits at start
    tree.mkdir()
    (tree / ".venv").symlink_to(ROOT / ".venv")
    md = _write(
        tmp_path,
        "<!-- runnable -->\n```bash\nsleep 600 &\nsleep 600\n```\n"
        "<!-- runnable: service -->\n```bash\ncurl -s localhost:8080/health\n```\n"
        "<!-- runnable: service -->\n```bash\ntrue\n```\n",
    )
    results = dc.run_docs(tree, [md], timeout=1)
    assert [(r.line, r.status, r.reason) for r in results] == [
        (2, "failed", "timed out after 1 s"),
        (7, "failed", "the service did not start"),
        (11, "failed", "the service did not start"),
    ]
    assert "distilembed serve exited" in capsys.readouterr().out


def test_clone_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("x")
    with pytest.raises(SystemExit, match="not empty"):
        dc.main(["--clone", str(tmp_path), "--check"])


def _files(tree: Path) -> set[str]:
    """Every file under ``tree`` (relative), not descending into its .venv link."""
    found = set()
    for folder, dirs, names in os.walk(tree):
        dirs[:] = [d for d in dirs if d != ".venv"]
        found |= {str((Path(folder) / name).relative_to(tree)) for name in names}
    return found


@pytest.mark.timeout(3600)
def test_every_runnable_block_of_the_docs_passes_in_a_copy_twice_writing_only_ignored_files(
    tree_copy: Path,
) -> None:
    before = _files(tree_copy)
    for attempt in ("first", "second"):  # a reader runs a block again: its outputs exist by then
        results = dc.run_docs(tree_copy, dc.default_docs(tree_copy))
        ran = [r for r in results if r.status in {"passed", "failed"}]
        assert ran, "no runnable block in README.md or the guides"
        failed = [f"{r.file}:{r.line}: {r.reason}" for r in results if r.status == "failed"]
        assert failed == [], f"{attempt} run:\n" + "\n".join(failed)
        assert {r.status for r in results} <= {"passed", "skipped", "not-runnable", "invalid"}
    written = sorted(_files(tree_copy) - before)
    cmd = ["git", "check-ignore", "--no-index", "--stdin"]  # exit 1: none of them is ignored
    ignored = subprocess.run(
        cmd, cwd=ROOT, input="\n".join(written), capture_output=True, text=True, check=False
    )
    assert ignored.returncode in {0, 1}, ignored.stderr
    assert sorted(set(written) - set(ignored.stdout.splitlines())) == []  # git status stays clean

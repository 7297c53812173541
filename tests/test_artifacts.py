"""Atomic writes leave ordinary permissions (artifacts are read by other users, e.g. containers);
manifests name the commit that made them, and say when the tree differed from it."""

import os
import stat
import subprocess

from distilembed.artifacts import atomic_directory, atomic_write_json, git_commit


def test_atomic_writes_use_the_umask_not_private_modes(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "m.json", {"a": 1})
        with atomic_directory(tmp_path / "bundle") as tmp:
            (tmp / "x").write_text("y")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "bundle").stat().st_mode) == 0o755
    assert (tmp_path / "bundle" / "x").read_text() == "y"


def test_git_commit_marks_a_dirty_tree(tmp_path) -> None:
    assert git_commit(tmp_path) is None  # not a checkout
    env = os.environ | {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env |= {"GIT_COMMITTER_EMAIL": "t@t"}

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, env=env, check=True, capture_output=True).stdout

    git("init", "-q")
    (tmp_path / "f").write_text("a")
    git("add", "f")
    git("commit", "-qm", "one")
    git("tag", "v1")  # a tag must not replace the sha
    head = git("rev-parse", "HEAD").decode().strip()
    assert git_commit(tmp_path) == head
    (tmp_path / "f").write_text("b")
    assert git_commit(tmp_path) == f"{head}-dirty"

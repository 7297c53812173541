"""Atomic writes leave ordinary permissions: artifacts are read by other users (containers)."""

import os
import stat

from distilembed.artifacts import atomic_directory, atomic_write_json


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

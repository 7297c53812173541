"""The docs a newcomer reads first say how `distilembed` gets on PATH before they call it bare."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ACTIVATE = "source .venv/bin/activate"
BARE_CALL = re.compile(r"^(?:\$ )?distilembed\b", re.MULTILINE)


def first_fence_with_bare_call(text: str) -> int | None:
    for fence in re.finditer(r"```(?:bash|sh|console)\n(.*?)```", text, re.DOTALL):
        if BARE_CALL.search(fence.group(1)):
            return fence.start()
    return None


@pytest.mark.parametrize("doc", ["README.md", "docs/index.md"])
def test_path_is_explained_before_the_first_bare_call(doc: str) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert ACTIVATE in text, f"{doc} never says how to get distilembed on PATH"
    first = first_fence_with_bare_call(text)
    if first is not None:
        assert text.index(ACTIVATE) < first, f"{doc} calls distilembed before saying how to reach it"


def test_the_check_catches_a_bare_call_first() -> None:
    text = "```bash\ndistilembed serve\n```\n\nThen source .venv/bin/activate.\n"
    first = first_fence_with_bare_call(text)
    assert first is not None and text.index(ACTIVATE) > first

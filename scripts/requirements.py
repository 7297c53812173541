"""Print the requirements of one extra of pyproject.toml, with the project's own extras that it
names (``distilembed[serve]``) expanded: the Dockerfile installs them in a layer of their own."""

import re
import sys
import tomllib
from pathlib import Path

PROJECT = tomllib.loads(Path(sys.argv[2] if len(sys.argv) > 2 else "pyproject.toml").read_text())["project"]


def requirements(extra: str) -> list[str]:
    out = []
    for req in PROJECT["optional-dependencies"][extra]:
        own = re.fullmatch(r"distilembed\[([\w,]+)\]", req)
        out += [r for e in own.group(1).split(",") for r in requirements(e)] if own else [req]
    return out


if __name__ == "__main__":
    print("\n".join(dict.fromkeys(PROJECT["dependencies"] + requirements(sys.argv[1]))))

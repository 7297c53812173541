"""The project's import graph, read from the source with ``ast`` (nothing of the project is imported):
no two modules import each other, and the serving side (service/, index/) never imports torch.

Every import counts, at any depth: module level, inside functions, under ``if TYPE_CHECKING``. A
circle that only works because one side imports lazily is still a circle: it breaks as soon as
someone moves that import, and it hides which module is the lower one."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("distilembed", "training", "export", "index", "service")
SERVING = ("service", "index")
TORCH = frozenset({"torch", "transformers", "sentence_transformers"})


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imports(tree: ast.AST, name: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """(dotted name, line) of everything ``tree`` imports: ``from m import x`` yields ``m.x`` and,
    when that is not a module, the resolver below falls back to ``m``."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: ``from .x import y`` / ``from .. import y``
                base = package[: len(package) - (node.level - 1)] + ([node.module] if node.module else [])
                module = ".".join(base)
            else:
                module = node.module or ""
            for alias in node.names:
                yield (module if alias.name == "*" else f"{module}.{alias.name}"), node.lineno


def _resolve(dotted: str, modules: set[str]) -> str | None:
    """The project module ``dotted`` names: itself, or its longest prefix that is one."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if (candidate := ".".join(parts[:end])) in modules:
            return candidate
    return None


@cache
def _graph() -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """The module graph, and for each serving module the torch-family imports it holds."""
    sources = _sources()
    modules = set(sources)
    graph: dict[str, set[str]] = {}
    torch_imports: dict[str, list[str]] = {}
    for name, path in sources.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges = graph.setdefault(name, set())
        for dotted, line in _imports(tree, name, path.name == "__init__.py"):
            if (target := _resolve(dotted, modules)) is not None and target != name:
                edges.add(target)
            if name.split(".")[0] in SERVING and dotted.split(".")[0] in TORCH:
                torch_imports.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{line} {dotted}")
    return graph, torch_imports


def _mutual(graph: Mapping[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets if a < b and a in graph.get(b, ()))


def test_no_two_modules_import_each_other() -> None:
    graph, _ = _graph()
    assert len(graph) > 50, f"found only {len(graph)} modules under {ROOT}"
    pairs = _mutual(graph)
    assert not pairs, "modules that import each other: " + ", ".join(f"{a} <-> {b}" for a, b in pairs)


def test_service_and_index_import_no_torch() -> None:
    _, torch_imports = _graph()
    found = [where for places in torch_imports.values() for where in places]
    assert not found, "service/ and index/ must not import torch: " + "; ".join(found)


def test_the_graph_reader_resolves_every_import_form() -> None:
    source = (
        "import index.store\n"
        "from index import corpus\n"
        "from index.splits import plan_corpus\n"
        "from . import live\n"
        "from .vectors import build_index\n"
        "def later():\n"
        "    import ray\n"
        "    from service.settings import Settings\n"
    )
    modules = {"index", "index.store", "index.corpus", "index.splits", "index.live", "index.vectors"}
    modules |= {"index.build", "service.settings"}
    found = {_resolve(d, modules) for d, _ in _imports(ast.parse(source), "index.build", False)}
    assert found == {
        "index.store",
        "index.corpus",
        "index.splits",
        "index.live",
        "index.vectors",
        "service.settings",
        None,  # ray: not a project module
    }
    assert _mutual({"a": {"b", "c"}, "b": {"a"}, "c": set(), "d": {"c"}}) == [("a", "b")]


def test_every_product_file_stays_under_400_lines() -> None:
    """Files short enough to read in one sitting: the packages, the benchmarks and the scripts."""
    folders = (*PACKAGES, "bench", "scripts")
    long = {
        str(path.relative_to(ROOT)): n
        for folder in folders
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) >= 400
    }
    assert not long, f"split these files: {long}"

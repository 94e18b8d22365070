"""The folders read as the data flow of one keystroke, top-down: an import never points
back up a level, and no module imports itself through others (no cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("cli", "bench", "lsp_server", "engine", "kernels")  # top-down: each may import only those after it
ENGINE_TOP = ("serve",)  # inside engine/: the serving side sits above the request path


def _modules() -> dict[str, Path]:
    found = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found["kspec." + ".".join(parts)] = path
    return found


def _imports(path: Path, known: set[str]) -> set[str]:
    """Every kspec module `path` imports, at module level or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kspec."):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                out.add(candidate if candidate in known else node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name.startswith("kspec."))
    return {name for name in out if name in known}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, set(modules)) for name, path in modules.items()}


def _level(module: str) -> tuple[int, int]:
    parts = module.split(".")
    folder = FOLDERS.index(parts[1])
    inner = 0 if len(parts) > 2 and parts[1] == "engine" and parts[2] in ENGINE_TOP else 1
    return folder, inner


def test_no_import_points_back_up() -> None:
    upward = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        for target in targets
        if _level(target) < _level(module)
    ]
    assert upward == []


def test_no_import_cycle() -> None:
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_graph_sees_imports() -> None:
    """The checks above would pass on an empty graph: make sure they look at real edges."""
    graph = _graph()
    assert "kspec.engine.batching" in graph["kspec.engine.completion"]
    assert "kspec.kernels.bifurcated" in graph["kspec.engine.cache.kv"]  # a lazy (in-function) import
    assert _level("kspec.engine.serve.runner") < _level("kspec.engine.request") < _level("kspec.kernels.contract")

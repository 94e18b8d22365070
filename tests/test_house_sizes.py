"""No class over MAX_CLASS_LINES and no function over MAX_FUNCTION_LINES in the shipped code: a
longer one holds more than one job. The exceptions are named one by one (an argparse table is
long because it lists every option, not because it does several things)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("lsp_server", "engine", "kernels", "bench", "cli", "editors")
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 80
MAX_README_LINES = 500  # a newcomer reads it through; the details live in docs/
# (file, qualified name): argparse tables, one `add_argument` after another
EXEMPT = frozenset({("cli/main.py", "build_parser")})


def _definitions(path: Path) -> list[tuple[str, ast.AST, int]]:
    """(qualified name, node, lines) of every class and function in `path`, nested ones included;
    lines: from the `class` / `def` line to the last line of its body (decorators aside)."""
    found: list[tuple[str, ast.AST, int]] = []

    def visit(node: ast.AST, outer: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{outer}.{child.name}" if outer else child.name
                found.append((name, child, child.end_lineno - child.lineno + 1))
                visit(child, name)
            else:
                visit(child, outer)

    visit(ast.parse(path.read_text(), str(path)), "")
    return found


def _all_definitions() -> list[tuple[str, str, ast.AST, int]]:
    return [
        (path.relative_to(ROOT).as_posix(), name, node, lines)
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name, node, lines in _definitions(path)
    ]


def test_no_class_or_function_over_its_cap() -> None:
    over = [
        f"{file}:{node.lineno}:{name}:{lines}"
        for file, name, node, lines in _all_definitions()
        if (file, name) not in EXEMPT
        and lines > (MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES)
    ]
    assert over == [], "split by responsibility (file:line:name:lines):\n" + "\n".join(over)


def test_every_exemption_names_a_function_that_needs_it() -> None:
    """An exemption whose function is gone or back under the cap is dropped from the list."""
    long_ones = {(file, name) for file, name, node, lines in _all_definitions() if lines > MAX_FUNCTION_LINES}
    assert EXEMPT <= long_ones, sorted(EXEMPT - long_ones)


def test_the_count_sees_definitions() -> None:
    """The cap would hold on an empty walk: make sure it reads real, nested definitions."""
    names = {(file, name) for file, name, _, _ in _all_definitions()}
    assert ("lsp_server/server.py", "Session.inline_completion") in names
    assert ("engine/decode/speculative.py", "SpeculativeRun") in names
    assert ("cli/main.py", "build_parser") in names


def test_the_readme_stays_a_newcomers_length_and_names_nothing_outside_the_project() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= MAX_README_LINES, "move details to docs/"
    assert "../shared" not in text, "the README's commands run on what the project ships or fetches"

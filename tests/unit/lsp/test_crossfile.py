"""The context gatherer (lsp_server/crossfile/): tree-sitter chunks, identifier ranking, import
resolution inside the workspace folder, outlines, the budget, and a choice that stays put
while the user types (so the prompt's start, and the engine's prefix cache, stay too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kspec.lsp_server.crossfile.chunks import chunk_at, chunk_text
from kspec.lsp_server.crossfile.gatherer import ContextConfig
from kspec.lsp_server.crossfile.gatherer import ContextGatherer
from kspec.lsp_server.crossfile.imports import resolve_imports
from kspec.lsp_server.crossfile.outline import member_names, outline
from kspec.lsp_server.crossfile.gatherer import RecentPlaces
from kspec.lsp_server.crossfile.similarity import identifiers, jaccard
from kspec.lsp_server.crossfile.workspace import Source, WorkspaceFiles, folder_for

NODES = '''"""AST nodes."""
import typing

MAX_DEPTH = 64


class Node:
    """Base of all nodes."""
    fields = ()

    def __init__(self, *fields, lineno=None):
        self.lineno = lineno
        for name in fields:
            setattr(self, name, None)

    def iter_child_nodes(self, exclude=None):
        for child in self.fields:
            yield child


class Impossible(Exception):
    pass


def render_tree(node: Node, indent: int = 0) -> str:
    lines = []
    for child in node.iter_child_nodes():
        lines.append(" " * indent + repr(child))
    return "\\n".join(lines)
'''

PARSER = '''from . import nodes
from .lexer import tokenize as lex
import pkg.helpers as h


class Parser:
    def parse_expression(self, stream):
        token = stream.current
        if token.type == "name":
            return self.parse_name(stream)
        
'''


def source(path: Path, text: str, version: int = 1) -> Source:
    return Source(path.as_uri(), "python", version, lambda: text)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    package = tmp_path / "ws" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nodes.py").write_text(NODES)
    (package / "lexer.py").write_text("def tokenize(source: str, name=None):\n    return iter(source)\n\ndef other():\n    pass\n")
    (package / "helpers.py").write_text("DEFAULT_WIDTH = 80\n\ndef wrap(text, width=DEFAULT_WIDTH):\n    return text\n")
    (package / "parser.py").write_text(PARSER)
    (tmp_path / "outside.py").write_text("SECRET_OUTSIDE = 1\n")
    return tmp_path / "ws"


# --- chunks, similarity, places --------------------------------------------------------------


def test_chunks_are_whole_definitions() -> None:
    chunks = chunk_text(NODES, "python")
    heads = [chunk.text.splitlines()[0] for chunk in chunks]
    assert heads == ['"""AST nodes."""', "class Node:", "class Impossible(Exception):", "def render_tree(node: Node, indent: int = 0) -> str:"]
    node = chunks[1]
    assert node.text.rstrip().endswith("yield child")  # the whole class, methods included
    assert chunk_at(chunks, node.start + 3) is node
    long = chunk_text("def f():\n" + "    x = 1\n" * 100, "python", max_lines=10)
    assert len(long) == 1 and long[0].text.count("\n") == 10  # the header and the start of the body
    assert [c.text for c in chunk_text("a b\nc\n\n\nd e\n", None)] == ["a b\nc\n", "d e\n"]  # no grammar: paragraphs
    js = chunk_text("import x from './x';\nexport function f(a) {\n  return a;\n}\nconst g = () => 1;\n", "javascript")
    assert [c.text.splitlines()[0] for c in js] == ["import x from './x';", "export function f(a) {", "const g = () => 1;"]


def test_identifiers_and_jaccard() -> None:
    assert identifiers("def render(self, node): return node.x") == frozenset({"render", "node"})
    assert jaccard(frozenset({"a1", "b1"}), frozenset({"b1", "c1"})) == pytest.approx(1 / 3)
    assert jaccard(frozenset(), frozenset({"x1"})) == 0.0


def test_recent_places_are_a_ring() -> None:
    places = RecentPlaces(size=2)
    places.note("a", 10)
    places.note("a", 12)  # near the last one: replaces it
    places.note("b", 1)
    places.note("c", 1)
    assert places.uris() == ["b", "c"] and places.of("a") == []


# --- imports and outlines --------------------------------------------------------------------


def test_python_imports_resolve_inside_the_folder(workspace: Path) -> None:
    parser = workspace / "pkg" / "parser.py"
    text = PARSER + "from .. import outside\nimport os\nfrom pkg import lexer\n"
    found = {(imp.path.name, imp.names) for imp in resolve_imports(text, "python", parser, workspace)}
    assert found == {("nodes.py", None), ("lexer.py", frozenset({"tokenize"})), ("helpers.py", None), ("lexer.py", None)}
    # the same file in a folder that ends at the package: the absolute `pkg.` cannot resolve, outside it nothing is read
    assert {imp.path.name for imp in resolve_imports(text, "python", parser, workspace / "pkg")} == {"nodes.py", "lexer.py"}


def test_js_relative_imports(tmp_path: Path) -> None:
    (tmp_path / "util.ts").write_text("export function pad(s: string, n: number): string { return s; }\n")
    found = resolve_imports("import { pad } from './util';\nimport x from 'react';\n", "typescript", tmp_path / "main.ts", tmp_path)
    assert [imp.path.name for imp in found] == ["util.ts"]


def test_outline_keeps_signatures_not_bodies() -> None:
    text = outline(NODES, "python")
    assert "MAX_DEPTH = 64" in text and "class Node:" in text
    assert "    def __init__(self, *fields, lineno=None): ..." in text
    assert "    def iter_child_nodes(self, exclude=None): ..." in text
    assert "def render_tree(node: Node, indent: int = 0) -> str: ..." in text
    assert "setattr" not in text and "yield" not in text and "import typing" not in text
    assert outline(NODES, "python", frozenset({"Impossible"})).strip() == "class Impossible(Exception):"
    go = outline('package p\nimport "fmt"\nfunc Parse(s string) (*Node, error) {\n\treturn nil, nil\n}\n', "go")
    assert go.strip() == "func Parse(s string) (*Node, error) { ... }"


# --- the gatherer ----------------------------------------------------------------------------


def gather(gatherer: ContextGatherer, workspace: Path, current: Source, line: int, others: list[Source], budget: int = 4000):
    return gatherer.gather(current, line, WorkspaceFiles(workspace, [current, *others]), budget)


def test_imported_definitions_and_open_chunks(workspace: Path) -> None:
    parser = source(workspace / "pkg" / "parser.py", PARSER)
    gathered = gather(ContextGatherer(), workspace, parser, 9, [])
    assert set(gathered.files) == {"pkg/nodes.py", "pkg/lexer.py", "pkg/helpers.py"}
    texts = "".join(piece.text for piece in gathered.pieces)
    assert "def tokenize(source: str, name=None): ..." in texts and "def other" not in texts  # only the name imported
    assert "return iter" not in texts  # signatures, not bodies
    # an open document of the folder that shares names with the cursor's lines is chunked in
    visitor = source(workspace / "pkg" / "visitor.py", "def visit_name(stream, token):\n    return stream.current.type == token.type\n")
    unrelated = source(workspace / "pkg" / "misc.py", "def alpha_beta():\n    return gamma_delta\n")
    gathered = gather(ContextGatherer(), workspace, parser, 9, [visitor, unrelated])
    assert "pkg/visitor.py" in gathered.files and "pkg/misc.py" not in gathered.files
    assert gathered.files[-1].startswith("pkg/") and gathered.pieces[0].path == "pkg/visitor.py"  # chunks first, imports nearest the file


def test_the_budget_is_kept(workspace: Path) -> None:
    parser = source(workspace / "pkg" / "parser.py", PARSER)
    for budget in (0, 60, 200, 4000):
        assert gather(ContextGatherer(), workspace, parser, 9, [], budget).chars <= budget
    assert gather(ContextGatherer(), workspace, parser, 9, [], 0).pieces == ()
    assert gather(ContextGatherer(ContextConfig(enabled=False)), workspace, parser, 9, [], 4000).pieces == ()
    config = ContextConfig(max_tokens=1024)
    assert config.budget_chars(None) == 3072 and config.budget_chars(400.0) == 600  # the machine fit caps the user's cap: half its prompt budget
    assert ContextConfig(enabled=False).budget_chars(None) == 0
    with pytest.raises(ValueError):
        ContextConfig(max_tokens=-1)


def test_the_choice_stays_while_typing_and_changes_when_it_matters(workspace: Path) -> None:
    gatherer = ContextGatherer(ContextConfig(max_chunks=1, refresh_gain=0.5))
    parser = workspace / "pkg" / "parser.py"
    kept = source(workspace / "pkg" / "visitor.py", "def visit_name(stream, token):\n    return stream.current.type\n")
    rival = source(workspace / "pkg" / "calls.py", "def visit_call(stream, parse_call, args):\n    return parse_call(stream, args)\n")
    first = gather(gatherer, workspace, source(parser, PARSER), 9, [kept, rival])
    assert "pkg/visitor.py" in first.files and "pkg/calls.py" not in first.files
    # typing makes the rival rank a little higher (0.25 against 0.18): not enough to change the block
    typed = PARSER.replace("        \n", "        return self.parse_call(stream, args, visit_call\n")
    second = gather(gatherer, workspace, source(parser, typed, 2), 9, [kept, rival])
    assert second.pieces == first.pieces  # the same block: the prefix cache keeps it
    assert "pkg/calls.py" in gather(ContextGatherer(ContextConfig(max_chunks=1)), workspace, source(parser, typed, 2), 9, [kept, rival]).files
    # a much better match opens: the choice is made again
    better = source(workspace / "pkg" / "more.py", "def more(self, stream, args, visit_call, parse_call, parse_expression, Parser):\n    return stream\n")
    third = gather(gatherer, workspace, source(parser, typed, 3), 9, [kept, rival, better])
    assert third.files[0] == "pkg/more.py"
    # an import added: made again too
    (workspace / "pkg" / "extra.py").write_text("def extra_thing(stream): ...\n")
    fourth = gather(gatherer, workspace, source(parser, "from . import extra\n" + typed, 4), 10, [kept, rival, better])
    assert fourth.pieces != third.pieces and "pkg/extra.py" in fourth.files
    # the kept chunk's document closed: its chunk goes
    fifth = gather(gatherer, workspace, source(parser, "from . import extra\n" + typed, 5), 10, [kept, rival])
    assert "pkg/more.py" not in fifth.files


def test_nothing_comes_from_outside_the_folder(workspace: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    secret = source(other / "secret.py", "def parse_name(stream):\n    return stream.current.type  # SECRET\n")
    nested = workspace / "nested"
    nested.mkdir()
    inner = source(nested / "inner.py", "def parse_name(stream, token):\n    return stream.current.type  # INNER\n")
    parser = source(workspace / "pkg" / "parser.py", PARSER)
    gathered = ContextGatherer().gather(parser, 9, WorkspaceFiles(workspace, [parser, secret, inner], folders=[workspace, nested]), 4000)
    texts = "".join(piece.text for piece in gathered.pieces)
    assert "SECRET" not in texts and "INNER" not in texts and gathered.files
    assert folder_for(nested / "inner.py", [workspace, nested]) == nested
    assert folder_for(tmp_path / "loose.py", [workspace]) == tmp_path  # outside every folder: its own folder only


def test_go_rust_java_imports_resolve_inside_the_folder(tmp_path: Path) -> None:
    (tmp_path / "go.mod").write_text("module example.com/app\n\ngo 1.22\n")
    (tmp_path / "shapes").mkdir()
    (tmp_path / "shapes" / "area.go").write_text("package shapes\n\nfunc Area(r float64) float64 {\n\treturn r\n}\n")
    (tmp_path / "main.go").write_text('package main\n\nimport (\n\t"fmt"\n\t"example.com/app/shapes"\n)\n')
    (tmp_path / "util.go").write_text("package main\n\nfunc helper() int { return 1 }\n")
    go = resolve_imports((tmp_path / "main.go").read_text(), "go", tmp_path / "main.go", tmp_path)
    assert [imp.path.name for imp in go] == ["util.go", "area.go"]  # its package's other file, then the imported package
    crate = tmp_path / "crate"
    (crate / "src" / "geo").mkdir(parents=True)
    (crate / "Cargo.toml").write_text('[package]\nname = "c"\n')
    (crate / "src" / "geo" / "mod.rs").write_text("pub fn dist(a: i32) -> i32 { a }\npub fn other() {}\n")
    (crate / "src" / "main.rs").write_text("use crate::geo::dist;\nuse std::fmt;\n")
    rust = resolve_imports((crate / "src" / "main.rs").read_text(), "rust", crate / "src" / "main.rs", tmp_path)
    assert [(imp.path.relative_to(crate).as_posix(), imp.names) for imp in rust] == [("src/geo/mod.rs", frozenset({"dist"}))]
    assert outline((crate / "src" / "geo" / "mod.rs").read_text(), "rust", frozenset({"dist"})).strip() == "pub fn dist(a: i32) -> i32 { ... }"
    java_root = tmp_path / "j" / "src" / "main" / "java" / "com" / "acme"
    java_root.mkdir(parents=True)
    (java_root / "Shape.java").write_text("package com.acme;\npublic class Shape {\n  public double area(double r) { return r; }\n}\n")
    app = tmp_path / "j" / "App.java"
    app.write_text("import com.acme.Shape;\nimport java.util.List;\n")
    java = resolve_imports(app.read_text(), "java", app, tmp_path / "j")
    assert [imp.path.name for imp in java] == ["Shape.java"]
    assert "public double area(double r) { ... }" in outline((java_root / "Shape.java").read_text(), "java")
    assert resolve_imports(app.read_text(), "java", app, tmp_path / "elsewhere") == []  # never outside the folder


# --- member names of the modules the file reaches by a qualifier ------------------------------


def test_member_names_are_a_modules_own_definitions() -> None:
    text = NODES + "if typing.TYPE_CHECKING:\n    from .env import Environment\n_CACHE = {}\ntry:\n    FAST = True\nexcept ImportError:\n    FAST = False\n"
    assert member_names(text, "python") == ("MAX_DEPTH", "Node", "Impossible", "render_tree", "FAST", "_CACHE")
    # a package's __init__ re-exports what it imports
    assert member_names("from .nodes import Node as N, render_tree\nimport typing\n", "python", package=True) == ("N", "render_tree", "typing")
    assert member_names("func Parse() {}\nfunc local() {}\n", "go") == ("Parse",)  # Go: what is exported


def test_imports_say_the_name_the_file_reaches_a_module_by(workspace: Path) -> None:
    parser = workspace / "pkg" / "parser.py"
    text = PARSER + "import pkg.nodes\nfrom . import lexer as lx\n"
    found = {(imp.path.name, imp.qualifier) for imp in resolve_imports(text, "python", parser, workspace)}
    assert found == {("nodes.py", "nodes"), ("lexer.py", ""), ("helpers.py", "h"), ("nodes.py", "pkg.nodes"), ("lexer.py", "lx")}


def test_the_gatherer_gives_each_qualifiers_member_names_once_per_module(workspace: Path) -> None:
    parser = source(workspace / "pkg" / "parser.py", PARSER + "import pkg.nodes\n")
    gathered = gather(ContextGatherer(), workspace, parser, 9, [])
    assert {(m.qualifier, m.names) for m in gathered.members} == {
        ("nodes", ("MAX_DEPTH", "Node", "Impossible", "render_tree")),
        ("pkg.nodes", ("MAX_DEPTH", "Node", "Impossible", "render_tree")),
        ("h", ("DEFAULT_WIDTH", "wrap")),
    }
    assert [piece.path for piece in gathered.pieces].count("pkg/nodes.py") == 1  # one outline for the module imported twice
    assert gather(ContextGatherer(ContextConfig(enabled=False)), workspace, parser, 9, []).members == ()


def test_js_namespaces_and_go_packages_carry_their_exported_names(tmp_path: Path) -> None:
    (tmp_path / "util.ts").write_text(
        "export function pad(s: string): string { return s; }\nexport const WIDTH = 80, other = 1;\n"
        "function hidden() {}\nexport { hidden as shown };\nexport interface Options { width: number }\n"
    )  # fmt: skip
    (tmp_path / "old.js").write_text("exports.parse = function () {};\nmodule.exports.render = 1;\n")
    text = 'import * as util from "./util";\nconst legacy = require("./old.js");\nimport { pad } from "./util";\n'
    found = {(imp.path.name, imp.qualifier) for imp in resolve_imports(text, "typescript", tmp_path / "main.ts", tmp_path)}
    assert found == {("util.ts", "util"), ("old.js", "legacy")}
    assert member_names((tmp_path / "util.ts").read_text(), "typescript") == ("pad", "WIDTH", "Options", "shown")
    assert member_names((tmp_path / "old.js").read_text(), "javascript") == ("parse", "render")
    # Go: a package of the folder's module, reached by its package clause's name (or an alias)
    (tmp_path / "go.mod").write_text("module example.com/app\n")
    (tmp_path / "geom").mkdir()
    (tmp_path / "geom" / "shapes.go").write_text(
        "package shapes\n\nconst (\n\tPi = 3.14\n\tsmall = 1\n)\n\ntype Circle struct {\n\tRadius float64\n}\n\n"
        "func Area(c Circle) float64 { return Pi }\nfunc helper() {}\n"
    )  # fmt: skip
    main = 'package main\n\nimport (\n\t"example.com/app/geom"\n\tg2 "example.com/app/geom"\n)\n'
    found = {(imp.path.name, imp.qualifier) for imp in resolve_imports(main, "go", tmp_path / "main.go", tmp_path)}
    assert found == {("shapes.go", "shapes"), ("shapes.go", "g2")}
    assert member_names((tmp_path / "geom" / "shapes.go").read_text(), "go") == ("Pi", "Circle", "Area")

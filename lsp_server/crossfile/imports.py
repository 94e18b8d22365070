"""The modules a file imports, resolved to files inside its workspace folder (never outside it).

Python: `import a.b`, `import a.b as c`, `from a.b import c` (c a module or a name defined in
a.b), relative imports (`from . import x`, `from ..pkg.mod import y`); absolute names are looked
up from the workspace folder, its `src/`, and each folder between it and the file (a package's
own name: `from jinja2 import nodes` inside jinja2/compiler.py). JS/TS: relative `import ...
from "./x"` and `require("./x")`. Go: the other files of the file's package (its folder) and the
packages imported under the module path of the folder's go.mod. Rust: `use crate::a::b` (and
`super::`, `self::`) to src/a.rs, src/a/mod.rs or src/a/b.rs. Java: `import a.b.C` to a/b/C.java
under the folder, `src/main/java` or `src`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import tree_sitter

from kspec.engine.syntax.languages import new_parser

MAX_IMPORTS = 32
JS_SPECIFIER = re.compile(r"""(?:\bfrom\s+|\brequire\(\s*|\bimport\s+)["'](\.{1,2}/[^"']+)["']""")
JS_EXTENSIONS = ("", ".ts", ".tsx", ".js", ".jsx", ".mjs", "/index.ts", "/index.js")
GO_IMPORT = re.compile(r'^\s*(?:import\s+)?(?:(\w+)\s+)?"([^"]+)"', re.M)  # (alias or "", path)
GO_PACKAGE = re.compile(r"^package\s+(\w+)", re.M)
# a relative module the file reaches as a namespace: `import * as ns from "./x"`, `const ns = require("./x")`
JS_NAMESPACE = re.compile(
    r"""\bimport\s+\*\s+as\s+([A-Za-z_$][\w$]*)\s+from\s+["'](\.{1,2}/[^"']+)["']"""
    r"""|\b(?:const|let|var)\s+([A-Za-z_$][\w$]*)\s*=\s*require\(\s*["'](\.{1,2}/[^"']+)["']"""
)
GO_MODULE = re.compile(r"^module\s+(\S+)", re.M)
RUST_USE = re.compile(r"^\s*(?:pub\s+)?use\s+((?:crate|super|self)(?:::\w+)+)", re.M)
JAVA_IMPORT = re.compile(r"^\s*import\s+([\w.]+)\s*;", re.M)
MAX_GO_FILES = 8
# the lines that can import, per language: what the resolved imports are cached by (a keystroke
# elsewhere in the file keeps them; parsing and resolving again on every keystroke would cost ms)
IMPORT_LINES = {
    "python": re.compile(r"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import[ \t]*(?:\([^)]*\)?|[^\n]*)|import[ \t][^\n]*)", re.M),
    "go": re.compile(r'^[ \t]*(?:import[^\n]*|"[^"\n]+"|\w+[ \t]+"[^"\n]+")[ \t]*$', re.M),
    "rust": RUST_USE,
    "java": JAVA_IMPORT,
}
JS_LINES = re.compile(r"^[^\n]*(?:\bimport\b|\brequire\()[^\n]*", re.M)


def import_key(text: str, language: str | None) -> tuple[str, ...]:
    """The file's import lines: while they stay the same, so do its resolved imports."""
    pattern = IMPORT_LINES.get(language or "", JS_LINES)
    return tuple(match.group(0) for match in pattern.finditer(text))


@dataclass(frozen=True)
class Imported:
    path: Path  # the module's file, inside the workspace folder
    names: frozenset[str] | None  # the names taken from it; None: the whole module (its outline)
    qualifier: str = ""  # the name the file reaches the whole module by (`nodes`, `c` for `import a.b as c`); "": none


@dataclass(frozen=True)
class PyImport:
    module: str  # dotted, without the leading dots
    level: int  # leading dots: 0 absolute
    names: tuple[str, ...]  # `from m import a, b`: ("a", "b"); `import m`: ()
    bound: tuple[str, ...] = ()  # the name each import binds in the file: `import m as c`: ("c",); `from m import a as b`: ("b",)


def _text(source: bytes, node: tree_sitter.Node) -> str:
    return source[node.start_byte : node.end_byte].decode("utf-8", "replace")


def _imported_name(source: bytes, node: tree_sitter.Node) -> str:
    if node.type == "aliased_import":
        node = node.child_by_field_name("name") or node
    return _text(source, node)


def _bound_name(source: bytes, node: tree_sitter.Node) -> str:
    alias = node.child_by_field_name("alias") if node.type == "aliased_import" else None
    return _text(source, alias) if alias is not None else _imported_name(source, node)


def python_imports(text: str) -> list[PyImport]:
    """The import statements of a Python module (top level and nested), in order."""
    source = text.encode("utf-8")
    found: list[PyImport] = []
    stack = [new_parser("python").parse(source).root_node]
    while stack and len(found) < MAX_IMPORTS:
        node = stack.pop()
        if node.type == "import_statement":
            found += [PyImport(_imported_name(source, n), 0, (), (_bound_name(source, n),)) for n in node.children_by_field_name("name")]
        elif node.type == "import_from_statement":
            module = node.child_by_field_name("module_name")
            spelled = _text(source, module) if module is not None else ""
            level = len(spelled) - len(spelled.lstrip("."))
            named = node.children_by_field_name("name")
            names = tuple(_imported_name(source, n) for n in named)
            found.append(PyImport(spelled.lstrip("."), level, names, tuple(_bound_name(source, n) for n in named)))
        else:
            stack.extend(reversed(node.children))
    return found


def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder)
    except OSError:
        return False


def _module_file(base: Path, dotted: str, folder: Path) -> Path | None:
    target = base.joinpath(*dotted.split(".")) if dotted else base
    for candidate in (target.with_name(target.name + ".py") if dotted else None, target / "__init__.py"):
        if candidate is not None and candidate.is_file() and _inside(candidate, folder):
            return candidate
    return None


def _roots(file: Path, folder: Path) -> list[Path]:
    roots, here = [folder, folder / "src"], file.parent
    while here != folder and _inside(here, folder) and here.parent != here:
        roots.append(here)
        here = here.parent
    return roots


def _resolve(spec: PyImport, file: Path, folder: Path) -> list[Imported]:
    if spec.level:
        base = file.parent
        for _ in range(spec.level - 1):
            base = base.parent
        bases = [base]
    else:
        bases = _roots(file, folder)
    for base in bases:
        module = _module_file(base, spec.module, folder)
        if module is None:
            continue
        if not spec.names:
            return [Imported(module, None, spec.bound[0] if spec.bound else "")]
        found, names = [], []
        for name, bound in zip(spec.names, spec.bound or spec.names):
            submodule = _module_file(base, f"{spec.module}.{name}" if spec.module else name, folder)
            if submodule is not None:
                found.append(Imported(submodule, None, bound))
            elif name != "*":
                names.append(name)
        return found + ([Imported(module, frozenset(names))] if names else [])
    return []


def resolve_python(text: str, file: Path, folder: Path) -> list[Imported]:
    """The workspace modules `text` (the file at `file`) imports, first imported first."""
    folder = folder.resolve()
    resolved: list[Imported] = []
    for spec in python_imports(text):
        for found in _resolve(spec, file, folder):
            if found.path.resolve() != file.resolve() and found not in resolved:
                resolved.append(found)
    return resolved


def resolve_js(text: str, file: Path, folder: Path) -> list[Imported]:
    """Relative JS/TS imports of `text` resolved to files inside `folder`."""
    folder, resolved = folder.resolve(), []
    namespaces = {found[1] or found[3]: found[0] or found[2] for found in JS_NAMESPACE.findall(text)}  # specifier -> name
    for specifier in JS_SPECIFIER.findall(text)[:MAX_IMPORTS]:
        base = file.parent / specifier
        for extension in JS_EXTENSIONS:
            candidate = Path(str(base) + extension)
            if candidate.is_file() and _inside(candidate, folder):
                resolved.append(Imported(candidate, None, namespaces.get(specifier, "")))
                break
    return resolved


def resolve_go(text: str, file: Path, folder: Path) -> list[Imported]:
    """The other files of the file's package, then the files of the packages it imports from
    the folder's own module (go.mod's `module` path)."""
    folder = folder.resolve()
    found = [Imported(f, None) for f in sorted(file.parent.glob("*.go")) if f.resolve() != file.resolve() and not f.name.endswith("_test.go")]
    go_mod = folder / "go.mod"
    module = GO_MODULE.search(go_mod.read_text(errors="replace")) if go_mod.is_file() else None
    for alias, path in GO_IMPORT.findall(text)[:MAX_IMPORTS] if module else ():
        if path.startswith(module.group(1) + "/"):  # type: ignore[union-attr]
            package = folder / path[len(module.group(1)) + 1 :]  # type: ignore[union-attr]
            files = [f for f in sorted(package.glob("*.go")) if _inside(f, folder) and not f.name.endswith("_test.go")]
            qualifier = alias or _go_package_name(files) or package.name
            found += [Imported(f, None, qualifier if alias != "_" else "") for f in files]
    return found[:MAX_GO_FILES]


def _go_package_name(files: list[Path]) -> str:
    """The `package` clause of a package's first file (what `pkg.` is written as); "" when unread."""
    for file in files[:1]:
        found = GO_PACKAGE.search(file.read_text(errors="replace")[:4096])
        if found is not None:
            return found.group(1)
    return ""


def resolve_rust(text: str, file: Path, folder: Path) -> list[Imported]:
    folder, found = folder.resolve(), []
    crate = next((p for p in (file.parent, *file.parents) if (p / "Cargo.toml").is_file() and _inside(p, folder)), None)
    for path in RUST_USE.findall(text)[:MAX_IMPORTS]:
        head, *parts = path.split("::")
        base = (crate / "src") if head == "crate" and crate is not None else file.parent.parent if head == "super" else file.parent
        for end in range(len(parts), 0, -1):  # the longest prefix of the path that is a module file
            stem = base.joinpath(*parts[:end])
            module = next((c for c in (stem.with_suffix(".rs"), stem / "mod.rs") if c.is_file() and _inside(c, folder)), None)
            if module is not None:
                found.append(Imported(module, frozenset(parts[end:end + 1]) if end < len(parts) else None))
                break
    return found


def resolve_java(text: str, file: Path, folder: Path) -> list[Imported]:
    folder, found = folder.resolve(), []
    for dotted in JAVA_IMPORT.findall(text)[:MAX_IMPORTS]:
        relative = Path(*dotted.split(".")).with_suffix(".java")
        for root in (folder, folder / "src" / "main" / "java", folder / "src"):
            if (root / relative).is_file() and _inside(root / relative, folder):
                found.append(Imported(root / relative, None))
                break
    return found


def resolve_imports(text: str, language: str | None, file: Path, folder: Path) -> list[Imported]:
    """The files `text` imports inside `folder`, their paths resolved."""
    found = _resolvers(text, language, file, folder)
    return list(dict.fromkeys(Imported(imported.path.resolve(), imported.names, imported.qualifier) for imported in found))


def _resolvers(text: str, language: str | None, file: Path, folder: Path) -> list[Imported]:
    resolvers = {"python": resolve_python, "javascript": resolve_js, "typescript": resolve_js, "tsx": resolve_js,
                 "go": resolve_go, "rust": resolve_rust, "java": resolve_java}  # fmt: skip
    resolver = resolvers.get(language or "")
    return resolver(text, file, folder) if resolver is not None else []

"""What a module offers, without its bodies: function signatures, class headers with their
method signatures and class attributes, module constants (tree-sitter). This is what goes into
the prompt for an imported module: names and how to call them, not whole files.

Python is outlined exactly; for the other languages, each top-level declaration keeps the text
before its body (`func Parse(s string) (*Node, error)`) and short declarations whole."""

from __future__ import annotations

import re

import tree_sitter

from kspec.engine.syntax.languages import new_parser

MAX_CONSTANT_CHARS = 120  # a longer value is cut: the name and the start of the value are what count
PY_DEFINITIONS = ("function_definition", "class_definition")
CONTAINERS = ("class", "impl", "interface", "trait")  # declarations whose members are listed


def _text(source: bytes, node: tree_sitter.Node) -> str:
    return source[node.start_byte : node.end_byte].decode("utf-8", "replace")


def _header(source: bytes, node: tree_sitter.Node, indent: str) -> str:
    """`def f(a, b) -> int:` / `class A(B):` with decorators, the body replaced by `...`."""
    last = None
    for field in ("return_type", "parameters", "superclasses", "type_parameters", "name"):
        found = node.child_by_field_name(field)
        if found is not None and (last is None or found.end_byte > last.end_byte):
            last = found
    end = last.end_byte if last is not None else node.end_byte
    head = source[node.start_byte : end].decode("utf-8", "replace") + ":"
    return indent + head + " ..." if node.type == "function_definition" else indent + head


def _docline(body: tree_sitter.Node | None, source: bytes, indent: str) -> list[str]:
    first = body.children[0] if body is not None and body.children else None
    if first is not None and first.type == "expression_statement" and first.children and first.children[0].type == "string":
        words = _text(source, first).strip().lstrip("rRbBuU").strip("\"'").strip().splitlines()
        return [f'{indent}"""{words[0].strip()}"""'] if words and '"' not in words[0] else []
    return []


def _short(line: str) -> str:
    line = line.splitlines()[0] if line else line
    return line if len(line) <= MAX_CONSTANT_CHARS else line[:MAX_CONSTANT_CHARS] + " ..."


def _py_definition(source: bytes, node: tree_sitter.Node, indent: str, wanted: frozenset[str] | None) -> list[str]:
    decorators: list[str] = []
    while node.type == "decorated_definition":
        decorators += [indent + _text(source, d) for d in node.children if d.type == "decorator"]
        node = node.child_by_field_name("definition") or node.children[-1]
    name = node.child_by_field_name("name")
    if node.type not in PY_DEFINITIONS or name is None or (wanted is not None and _text(source, name) not in wanted):
        return []
    lines = [*decorators, _header(source, node, indent)]
    if node.type == "class_definition":
        body = node.child_by_field_name("body")
        lines += _docline(body, source, indent + "    ")
        for child in body.children if body is not None else ():
            lines += _py_statement(source, child, indent + "    ", None, in_class=True)
    return lines


def _py_statement(source: bytes, node: tree_sitter.Node, indent: str, wanted: frozenset[str] | None, in_class: bool = False) -> list[str]:
    if node.type in ("decorated_definition", *PY_DEFINITIONS):
        return _py_definition(source, node, indent, wanted)
    if node.type == "expression_statement" and node.children and node.children[0].type == "assignment":
        target = node.children[0].child_by_field_name("left")
        name = _text(source, target) if target is not None else ""
        if (wanted is None and not name.startswith("__")) or (wanted is not None and name in wanted):
            return [indent + _short(_text(source, node))]
    return []


def _python(source: bytes, root: tree_sitter.Node, wanted: frozenset[str] | None) -> list[str]:
    entries = ["\n".join(lines) for node in root.children if (lines := _py_statement(source, node, "", wanted))]
    return entries


def _declared_name(source: bytes, node: tree_sitter.Node) -> str:
    for child in (node, *node.children):
        name = child.child_by_field_name("name")
        if name is not None:
            return _text(source, name)
        for grandchild in child.children:
            if (name := grandchild.child_by_field_name("name")) is not None:
                return _text(source, name)
    return ""


def _c_family(source: bytes, root: tree_sitter.Node, wanted: frozenset[str] | None) -> list[str]:
    lines: list[str] = []  # one entry per declaration
    for node in root.children:
        if "comment" in node.type or "import" in node.type or node.type in ("package_clause", "package_declaration", "use_declaration"):
            continue
        if wanted is not None and _declared_name(source, node) not in wanted:
            continue
        owner = node if node.child_by_field_name("body") is not None else next((c for c in node.children if c.child_by_field_name("body")), node)
        body = owner.child_by_field_name("body")
        text = source[node.start_byte : body.start_byte if body is not None else node.end_byte].decode("utf-8", "replace").rstrip()
        members = _members(source, body) if body is not None and any(k in owner.type for k in CONTAINERS) else []
        if members:
            lines.append(text + " {\n" + "".join(f"    {m}\n" for m in members) + "}")
        else:
            lines.append(text + (" { ... }" if body is not None else "") if text.count("\n") < 6 else _short(text))
    return lines


def _members(source: bytes, body: tree_sitter.Node) -> list[str]:
    """A class's (impl's, interface's) members: methods up to their body, short fields whole."""
    members = []
    for child in body.named_children:
        if "comment" in child.type:
            continue
        inner = child.child_by_field_name("body")
        end = inner.start_byte if inner is not None else child.end_byte
        text = " ".join(source[child.start_byte : end].decode("utf-8", "replace").split())
        members.append(_short(text + (" { ... }" if inner is not None else "")))
    return members


def outline_entries(text: str, language: str, wanted: frozenset[str] | None = None) -> list[str]:
    """The outline of a module's text, one entry per top-level definition (a class with its
    methods' signatures is one entry), in file order; only those named in `wanted` when given."""
    source = text.encode("utf-8")
    root = new_parser(language).parse(source).root_node
    return _python(source, root, wanted) if language == "python" else _c_family(source, root, wanted)


def outline(text: str, language: str, wanted: frozenset[str] | None = None) -> str:
    """The whole outline as text."""
    return "".join(entry + "\n" for entry in outline_entries(text, language, wanted))


PY_BLOCKS = ("if_statement", "try_statement", "with_statement", "else_clause", "elif_clause", "except_clause", "finally_clause", "block")


def _py_bound(source: bytes, node: tree_sitter.Node, imports: bool) -> list[str]:
    """The module-level names one top-level statement binds (descending into `if` / `try` /
    `with`); those of import statements only with `imports`."""
    if node.type == "decorated_definition":
        node = node.child_by_field_name("definition") or node.children[-1]
    if node.type in PY_DEFINITIONS:
        name = node.child_by_field_name("name")
        return [_text(source, name)] if name is not None else []
    if node.type == "expression_statement" and node.children and node.children[0].type == "assignment":
        target = node.children[0].child_by_field_name("left")
        if target is not None and target.type == "identifier":
            return [_text(source, target)]
        return [_text(source, n) for n in (target.named_children if target is not None else ()) if n.type == "identifier"]
    if node.type in ("import_statement", "import_from_statement"):
        if not imports:
            return []
        bound = []
        for name in node.children_by_field_name("name"):
            alias = name.child_by_field_name("alias") if name.type == "aliased_import" else None
            bound.append(_text(source, alias) if alias is not None else _text(source, name).split(".")[0])
        return bound
    if node.type in PY_BLOCKS:
        return [found for child in node.children for found in _py_bound(source, child, imports)]
    return []


JS_EXPORTED = re.compile(
    r"^export\s+(?:default\s+)?(?:declare\s+)?(?:async\s+)?(?:function\*?|class|const|let|var|interface|type|enum|namespace)\s+([A-Za-z_$][\w$]*)"
    r"|^(?:module\.)?exports\.([A-Za-z_$][\w$]*)\s*=",
    re.M,
)
JS_EXPORT_LIST = re.compile(r"^(?:export\s*|module\.exports\s*=\s*)\{([^}]*)\}", re.M)  # `export { a, b as c }`, `module.exports = { a, b: f }`
GO_EXPORTED = re.compile(r"^(?:func|type|var|const)\s+([A-Z]\w*)")
GO_GROUP = re.compile(r"^(?:var|const|type)\s*\($")  # `const (` ... `)`: one name per line inside


def _go_names(text: str) -> list[str]:
    names, grouped = [], False
    for line in text.splitlines():
        if grouped:
            grouped = not line.startswith(")")
            found = re.match(r"\s+([A-Z]\w*)\b", line) if grouped else None
        else:
            grouped = GO_GROUP.match(line) is not None
            found = GO_EXPORTED.match(line)
        if found is not None:
            names.append(found.group(1))
    return names


def _js_names(text: str) -> list[str]:
    names = [a or b for a, b in JS_EXPORTED.findall(text)]
    for listed in JS_EXPORT_LIST.findall(text):
        for item in listed.split(","):
            words = item.replace(":", " ").split()
            if words:
                names.append(words[-1] if "as" in words[1:2] else words[0])
    return [name for name in names if re.fullmatch(r"[A-Za-z_$][\w$]*", name)]


def member_names(text: str, language: str, package: bool = False) -> tuple[str, ...]:
    """The names a module offers to `module.name`, in file order. Python: its module-level
    functions, classes and constants, the private ones last (a package's `__init__` also the
    names it imports, which it re-exports: a plain module's imports are its own business).
    JavaScript / TypeScript: what it exports (`export function f`, `exports.f =`, then the lists:
    `export { a }`, `module.exports = { a }`).
    Go: a file's exported (capitalized) functions, types, variables and constants. () otherwise."""
    if language in ("javascript", "typescript", "tsx"):
        return tuple(dict.fromkeys(_js_names(text)))
    if language == "go":
        return tuple(dict.fromkeys(_go_names(text)))
    if language != "python":
        return ()
    source = text.encode("utf-8")
    root = new_parser(language).parse(source).root_node
    names = dict.fromkeys(name for node in root.children for name in _py_bound(source, node, package) if not name.startswith("__"))
    return tuple(sorted(names, key=lambda name: name.startswith("_")))

"""What one request knows about Python names, window-aware (the rules; pyscope.py has the tree walking).

A window of a file is cut anywhere, so a name the window reads may be defined above it.
Three things are collected once per request from the tree of the (repaired) window:

* `outer`: the names each scope of the window binds (pyscope.Bindings);
* `free`: names the window's code reads (outside strings and comments, not as an
  attribute) that no scope of it binds, and the module-level names of the part of the file
  above the window when the caller has it (`module_names`): they come from above the window (a parameter of a
  function whose header is cut off, an import at the top of the file) or are the hole's to
  define; an alternative that reads one is not blamed for it;
* `needs`: names the code right after the cursor reads (its first `NEEDS_LINES` lines)
  that nothing in the window binds and that the code before the cursor never reads: the
  hole should define them (the suffix uses `msg`, the hole is where `msg = ...` goes).

Per alternative, `undefined_names` are the names it reads that are none of: bound by a
scope enclosing the read (in the window or the alternative itself; when the window's tree
has errors, its scopes are guesses, and a binding anywhere but in another function or
lambda counts), a builtin, free in the window (but `self` or `cls` inside a function the
window shows, whose parameters are then known); `needs_met` splits the needed names into those it binds and those it leaves undefined.
"""

from __future__ import annotations

import re
from functools import lru_cache

import tree_sitter

from kspec.engine.syntax import pyscope
from kspec.engine.syntax.languages import ts_language

NEEDS_LINES = 10
_FUNCTION_SCOPES = frozenset({"function_definition", "lambda"})
_PARAMETER_NAMES = frozenset({"self", "cls"})
_CODE_WORD = re.compile(r"(?<![\w.])[A-Za-z_]\w*")


class WindowNames:
    """The names of one request's window (see the module docstring); `free` is worked out on
    first use, since most alternatives read only names that are bound or builtins."""

    def __init__(
        self, source: bytes, root: tree_sitter.Node, cursor: int, needs_end: int, in_function: bool,
        above: frozenset[str] = frozenset(),
    ) -> None:
        self.source = source
        self.in_function = in_function  # the window shows the header of a function around the cursor
        self.above = above  # module-level names of the file above the window (when it has them)
        self.root = root
        self.outer = pyscope.collect_bindings(root)
        self.broken = root.has_error
        self.bound_outside_functions = {
            name for (kind, _), names in self.outer.by_scope.items() if kind not in _FUNCTION_SCOPES for name in names
        }
        self.bound: set[str] = set().union(*self.outer.by_scope.values()) if self.outer.by_scope else set()
        self._free: frozenset[str] | None = None
        prefix = source[:cursor].decode("utf-8", "replace")
        # What the suffix needs: a name it reads and nothing in the window defines (`total +=`
        # defines nothing: it reads `total` too)
        needs: list[str] = []
        for node in pyscope.identifiers_in(root, cursor, needs_end):
            name = pyscope.node_text(node)
            if name in needs or name in self.outer.defining or name in above or name in pyscope.BUILTIN_NAMES or not pyscope.is_read(node):
                continue
            if re.search(r"(?<![\w.])" + re.escape(name) + r"\b", prefix) is None:
                needs.append(name)  # read after the cursor, never before it, bound nowhere
        self.needs = tuple(needs)

    @property
    def free(self) -> frozenset[str]:
        if self._free is None:
            words = code_words(self.source, self.root, 0, len(self.source))
            self._free = frozenset((words - self.bound - pyscope.BUILTIN_NAMES) | self.above)
        return self._free


@lru_cache(maxsize=None)
def _not_code_query() -> tree_sitter.Query:
    """Spans whose words are not names the code reads: literals, comments, and the module
    path of `from M import x` (`from pickle import Pickler` binds `Pickler`, not `pickle`)."""
    return tree_sitter.Query(
        ts_language("python"), "(string) @s (comment) @s (import_from_statement module_name: (_) @s)"
    )


_MODULE_NAMES = re.compile(
    r"^(?:(?:async[ \t]+)?def|class)[ \t]+(\w+)"  # a function or class
    r"|^(\w+)[ \t]*(?::[^=\n]*)?=(?!=)"  # a global
    r"|^import[ \t]+([^\n#]+)"  # import a.b as c, d
    r"|^from[ \t]+\S+[ \t]+import[ \t]+(\([^)]*\)|[^\n#]+)",  # from m import (a, b as c)
    re.MULTILINE,
)


def module_names(text: str) -> frozenset[str]:
    """Names `text` (the part of a file above the window) binds at module level: its
    imports, functions, classes and globals (a regex over lines at column 0)."""
    names: set[str] = set()
    for match in _MODULE_NAMES.finditer(text):
        defined, assigned, imported, from_import = match.groups()
        names.update(name for name in (defined, assigned) if name)
        for part in (imported or from_import or "").strip("() \t").split(","):
            words = part.split()
            if words:
                names.add(words[-1] if len(words) == 3 and words[1] == "as" else words[0].split(".")[0])
    return frozenset(names)


def code_words(source: bytes, root: tree_sitter.Node, start: int, end: int) -> set[str]:
    """Identifier-like words in source[start:end] outside strings, comments, attribute names and
    `from ... import` module paths."""
    cursor = tree_sitter.QueryCursor(_not_code_query())
    cursor.set_byte_range(start, end)
    pieces: list[bytes] = []
    position = start
    for node in sorted(cursor.captures(root).get("s", []), key=lambda n: n.start_byte):
        if node.start_byte > position:
            pieces.append(source[position : min(node.start_byte, end)])
        position = max(position, node.end_byte)
    if position < end:
        pieces.append(source[position:end])
    text = b" ".join(pieces).decode("utf-8", "replace")
    return set(_CODE_WORD.findall(text)) - pyscope.KEYWORDS


def undefined_names(
    root: tree_sitter.Node, start: int, end: int, names: WindowNames, inner: pyscope.Bindings, shift: int = 0,
) -> list[str]:
    """Names the alternative in [start, end) reads that nothing defines (see the module docstring).
    `shift`: where a scope of `root`'s tree starts in the window's tree, less where it starts in its own."""
    missing = pyscope.undefined_names(root, start, end, names.outer, inner, shift)
    if not missing:
        return []
    if names.broken:  # scopes in a tree with errors are guesses: a binding outside functions counts
        missing = [name for name in missing if name not in names.bound_outside_functions]
    # `self` and `cls` are parameters by convention: read elsewhere in the window they say
    # nothing about the function around the cursor when the window shows its header.
    return [name for name in missing if name not in names.free or (names.in_function and name in _PARAMETER_NAMES)]


def needs_met(names: WindowNames, inner: pyscope.Bindings) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(needed names the alternative binds, needed names it leaves undefined)."""
    defined = tuple(name for name in names.needs if name in inner.defining)
    return defined, tuple(name for name in names.needs if name not in inner.defining)

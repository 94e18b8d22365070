"""What one request knows about Python names, window-aware (the rules; pyscope.py has the tree walking).

A window of a file is cut anywhere, so a name the window reads may be defined above it.
Three things are collected once per request from the tree of the (repaired) window, or of
the function around the cursor when the checks parse only that (`checks.checked_span`; what
the rest of the window binds and reads then comes from `OutsideNames`, lexically):

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
Of the undefined names, `certainly_undefined` are those no file above the window can
define: the window binds them only inside functions (another function's parameter or local,
`self` of the methods above a module-level function), never at module level.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Callable

import tree_sitter

from kspec.engine.syntax import pyscope
from kspec.engine.syntax.languages import ts_language
from kspec.engine.syntax.lexer import COMMENT, STRING, Tok

NEEDS_LINES = 10
_FUNCTION_SCOPES = frozenset({"function_definition", "lambda"})
_PARAMETER_NAMES = frozenset({"self", "cls"})
_CODE_WORD = re.compile(r"(?<![\w.])[A-Za-z_]\w*")


@dataclass(frozen=True)
class OutsideNames:
    """What a part of the window the checks do not parse (`checks.checked_span`) tells about
    names, lexically: what it binds at module level (visible in the function around the
    cursor), every name it writes outside strings and comments (`from M import` paths left
    out), and those it binds in any scope (a line-anchored regex: `x =`, `def f(a, b)`,
    `for x in`, `import x`, `... as x`)."""

    binds: frozenset[str] = frozenset()
    reads: frozenset[str] = frozenset()
    bound: frozenset[str] = frozenset()
    wildcard: bool = False  # `from m import *` there: any name may be defined

    def __or__(self, other: "OutsideNames") -> "OutsideNames":
        return OutsideNames(
            self.binds | other.binds, self.reads | other.reads, self.bound | other.bound, self.wildcard or other.wildcard
        )

    @classmethod
    def of(cls, text: str, tokens: list[Tok], start: int, end: int) -> "OutsideNames":
        """text[start:end], whose literals and comments are among `tokens` (offsets in `text`)."""
        pieces, position = [], start
        for tok in tokens:
            if tok.kind in (STRING, COMMENT) and tok.end > start and tok.start < end:
                pieces.append(text[position : max(tok.start, position)])
                position = max(position, tok.end)
        pieces.append(text[position:end])
        code = " ".join(pieces)  # a literal taken out of a line leaves the line whole
        if not code.strip():
            return cls()
        words = frozenset(_CODE_WORD.findall(_FROM_IMPORT_PATH.sub(" import", code))) - pyscope.KEYWORDS
        in_scope = _lines_in_scopes(code)
        binds: set[str] = set()
        bound: set[str] = set()
        wildcard = False
        for match in _BINDING.finditer(code):
            named, params, imported = _binding_names(match)
            wildcard = wildcard or (match.group("imported") or "").strip() == "*"
            bound |= named | params | imported
            if match.start() not in in_scope:  # at module level, but a function's parameters are its own
                binds |= named | imported
        return cls(frozenset(binds) - pyscope.KEYWORDS, words, frozenset(bound) - pyscope.KEYWORDS, wildcard)


def _lines_in_scopes(code: str) -> set[int]:
    """Starts of the lines of `code` inside a `def` or `class` body (an `if` or `try` block
    at module level binds module-level names: `try: import json` / `except: json = None`)."""
    inside: set[int] = set()
    open_blocks: list[tuple[int, bool]] = []  # (indentation of a block header, whether it is a def or class)
    for line in _HEADER_LINE.finditer(code):
        leading = line.group(1)
        width = len(leading.expandtabs(8))
        while open_blocks and open_blocks[-1][0] >= width:
            open_blocks.pop()
        if any(scope for _, scope in open_blocks):
            inside.add(line.start())
        if line.group(2) is not None:  # a block header
            open_blocks.append((width, line.group(3) is not None))
    return inside


_HEADER_LINE = re.compile(
    r"^([ \t]*)(?=\S)(?:((async[ \t]+def|def|class)\b|(?:if|elif|else|for|while|with|try|except|finally|async|match|case)\b)?)",
    re.MULTILINE,
)
_NAMED = ("function", "cls", "loop", "alias", "targets")  # `_BINDING`'s groups whose words it binds
_PARAMETER_NAME = re.compile(r"[ \t\n]*\**[ \t\n]*([A-Za-z_]\w*)")


def _binding_names(match: re.Match[str]) -> tuple[set[str], set[str], set[str]]:
    """What one `_BINDING` match binds: (the function, class or targets it names, the function's
    parameters, the names an import binds). A parameter is the first name of each top-level
    part of the list (`b: t.Any = f(x)` binds `b`; `t`, `f` and `x` are read); an import binds
    its aliases and the first part of each dotted path (`import os.path as p, sys` -> p, sys)."""
    named = {word for group in _NAMED for word in _CODE_WORD.findall(match.group(group) or "")}
    params: set[str] = set()
    depth, start, text = 0, 0, match.group("params") or ""
    for at, char in enumerate(text + ","):
        depth += (char in "([{") - (char in ")]}")
        if char == "," and (depth <= 0 or at == len(text)):  # the list's end closes its last part
            if found := _PARAMETER_NAME.match(text, start, at):
                params.add(found.group(1))
            start = at + 1
    return named, params, set(imported_names(match.group("imported") or ""))


def imported_names(names: str) -> list[str]:
    """The names `a.b as c, d` (what follows `import`) binds: c, d."""
    bound = []
    for part in names.strip("() \t").split(","):
        words = part.split()
        if words and words[0] != "*":
            bound.append(words[-1] if len(words) == 3 and words[1] == "as" else words[0].split(".")[0])
    return bound


_FROM_IMPORT_PATH = re.compile(r"^([ \t]*)from[ \t]+\S+[ \t]+import", re.MULTILINE)
_TARGETS = r"\(?\w+(?:[ \t]*,[ \t]*\w+)*\)?"  # `x`, `a, b`, `(a, b)`
_BINDING = re.compile(
    r"^(?P<indent>[ \t]*)(?:"
    r"(?:async[ \t]+)?def[ \t]+(?P<function>\w+)[ \t]*\((?P<params>[^)]*)"  # a function and its parameters
    r"|class[ \t]+(?P<cls>\w+)"  # a class
    r"|(?:async[ \t]+)?for[ \t]+(?P<loop>" + _TARGETS + r")"  # loop targets
    r"|(?:import|from[ \t]+\S+[ \t]+import)[ \t]+\(?(?P<imported>[^\n#)]*)"  # imported names (and `as` aliases)
    r"|(?:with|except)\b[^\n]*?[ \t]as[ \t]+(?P<alias>\w+)"  # with / except ... as
    r"|(?P<targets>" + _TARGETS + r")[ \t]*(?::[^=\n]*)?[-+*/%&|^@]?=(?!=)"  # assignment targets
    r")",
    re.MULTILINE,
)


class WindowNames:
    """The names of one request's window (see the module docstring); `free` is worked out on
    first use, since most alternatives read only names that are bound or builtins."""

    def __init__(
        self, source: bytes, root: tree_sitter.Node, cursor: int, needs_end: int, in_function: bool,
        above: frozenset[str] = frozenset(), outside: Callable[[], tuple[OutsideNames, OutsideNames]] | None = None,
        cut: str | None = None,
    ) -> None:
        """`source` / `root`: the part of the window the checks parse; `outside`: what the
        window's text before and after it tells (`checks.checked_span`), worked out when a rule asks;
        `cut`: the piece of a word the window's end cut off (`window.cut_word`), which is no name."""
        self.source = source
        self.cut = cut
        self.in_function = in_function  # the window shows the header of a function around the cursor
        self._above = above  # module-level names of the file above the window (when the caller has it)
        self._outside = outside
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
            if name in needs or name in self.outer.defining or name in pyscope.BUILTIN_NAMES or not pyscope.is_read(node):
                continue
            if name in self.above or name in self.outside.bound or name in self.before.reads:
                continue  # defined at module level or elsewhere in the window, or read before the cursor
            if re.search(r"(?<![\w.])" + re.escape(name) + r"\b", prefix) is None:
                needs.append(name)  # read after the cursor, never before it, bound nowhere
        self.needs = tuple(needs)

    @cached_property
    def _around(self) -> tuple[OutsideNames, OutsideNames]:
        return self._outside() if self._outside is not None else (OutsideNames(), OutsideNames())

    @property
    def before(self) -> OutsideNames:
        """What the window before the part the checks parse tells about names."""
        return self._around[0]

    @cached_property
    def outside(self) -> OutsideNames:
        """What the window before and after the part the checks parse tells about names."""
        return self._around[0] | self._around[1]

    @cached_property
    def above(self) -> frozenset[str]:
        """Module-level names of the file above the window and of the window outside the checked part."""
        return self._above | self.outside.binds

    @property
    def free(self) -> frozenset[str]:
        if self._free is None:
            words = code_words(self.source, self.root, 0, len(self.source))
            bound = self.bound | self.outside.bound  # bound anywhere in the window: not from above it
            self._free = frozenset(((words | self.outside.reads) - bound - pyscope.BUILTIN_NAMES - {self.cut}) | self.above)
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
        names.update(imported_names(imported or from_import or ""))
    return frozenset(names)


def outside_names(text: str, start: int, end: int) -> tuple[str, ...]:
    """`CompletionRequest.outside_names` for a window text[start:end] of a Python file: the names
    the rest of it binds at module level (`module_names`; a line the window cuts counts whole),
    sorted; () when the window holds all of it."""
    if start <= 0 and end >= len(text):
        return ()
    first_line_end = start if text[start - 1 : start] == "\n" else text.find("\n", start)  # the window's first line begins outside when cut
    before = (text if first_line_end < 0 else text[:first_line_end]) if start > 0 else ""
    after = text[text.rfind("\n", 0, end) + 1 :] if end < len(text) else ""
    return tuple(sorted(module_names(before + "\n" + after)))


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
    root: tree_sitter.Node, start: int, end: int, names: WindowNames, inner: pyscope.Bindings
) -> list[str]:
    """Names the alternative in [start, end) reads that nothing defines (see the module docstring)."""
    missing = pyscope.undefined_names(root, start, end, names.outer, inner)
    if not missing or names.outside.wildcard:
        return []
    if names.broken:  # scopes in a tree with errors are guesses: a binding outside functions counts
        missing = [name for name in missing if name not in names.bound_outside_functions]
    # `self` and `cls` are parameters by convention: read elsewhere in the window they say
    # nothing about the function around the cursor when the window shows its header.
    return [name for name in missing if name not in names.free or (names.in_function and name in _PARAMETER_NAMES)]


def certainly_undefined(names: WindowNames, undefined: list[str]) -> list[str]:
    """Those of `undefined` (an alternative's) that the window binds only inside functions: a
    local of another function read here, which no module-level name above the window explains."""
    return [
        name for name in undefined
        if (name in names.bound or name in names.outside.bound) and name not in names.above
        and name not in names.bound_outside_functions
    ]  # fmt: skip


def needs_met(names: WindowNames, inner: pyscope.Bindings) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(needed names the alternative binds, needed names it leaves undefined)."""
    defined = tuple(name for name in names.needs if name in inner.defining)
    return defined, tuple(name for name in names.needs if name not in inner.defining)

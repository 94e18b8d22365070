"""What one request knows about JavaScript / TypeScript names, window-aware.

The rules are pynames.py's, on tree-sitter's JavaScript and TypeScript trees, kept cheap by
judging names by their text, not by scope:

* a name an alternative *reads* (an `identifier` or a shorthand `{x}` outside a binding
  position) is undefined when the alternative does not bind it, no word of the window
  spells it (the window is cut anywhere: what it mentions, even in a comment, may be bound
  above it, and an import, a parameter or a `.name` of the window vouches for the word; so
  does a word of the file above the window when the caller has that part: `above`),
  and it is not one of the language's or hosts' globals (`GLOBALS`): a mid-word completion
  that writes a name that exists nowhere (`len` -> `lenght`) is what it catches;
* `needs`: names the suffix reads in its first `NEEDS_LINES` non-blank lines (pynames.py's
  span), and before the block around the cursor ends, that the window never binds and the
  prefix never mentions: the hole should define them (`count` read right below the cursor,
  `let count = 0` is what the hole is for). An alternative that binds one (a
  declaration, a parameter, an import, a destructuring, or an assignment `count = 0`)
  defines it; one that does not leaves it undefined (`WindowNames.judge`).

A name is bound where tree-sitter's grammar puts a pattern (`_BINDING_PATTERNS`): declarator
names, function and class names, parameters, catch and for-of/in variables, import
specifiers, destructuring patterns and the left side of an assignment. Property names,
labels and TypeScript types are other node types, never read names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import tree_sitter

from kspec.engine.syntax.context import CursorContext
from kspec.engine.syntax.languages import ts_language
from kspec.engine.syntax.lexer import CLOSE, OPEN, lex
from kspec.engine.syntax.pynames import NEEDS_LINES
from kspec.engine.syntax.window import cut_word

LANGUAGES = frozenset({"javascript", "typescript", "tsx"})

_WORD = re.compile(r"[A-Za-z_$][\w$]*")

# ECMAScript's global objects and functions, and what browsers and Node.js add that code
# reads without binding it.
GLOBALS = frozenset(
    """
    globalThis undefined NaN Infinity arguments eval isFinite isNaN parseFloat parseInt
    decodeURI decodeURIComponent encodeURI encodeURIComponent escape unescape
    Object Function Boolean Symbol Error AggregateError EvalError RangeError ReferenceError
    SyntaxError TypeError URIError Number BigInt Math Date String RegExp Array Int8Array
    Uint8Array Uint8ClampedArray Int16Array Uint16Array Int32Array Uint32Array Float32Array
    Float64Array BigInt64Array BigUint64Array Map Set WeakMap WeakSet WeakRef
    FinalizationRegistry ArrayBuffer SharedArrayBuffer DataView Atomics JSON Promise Reflect
    Proxy Intl Iterator
    console window document navigator location history self fetch Request
    Response Headers URL URLSearchParams FormData Blob File FileReader TextEncoder TextDecoder
    AbortController AbortSignal Event EventTarget CustomEvent WebSocket Worker XMLHttpRequest
    localStorage sessionStorage performance crypto structuredClone queueMicrotask
    setTimeout clearTimeout setInterval clearInterval setImmediate clearImmediate
    requestAnimationFrame cancelAnimationFrame alert confirm prompt atob btoa
    HTMLElement Element Node NodeList
    process require module exports __dirname __filename Buffer global
    """.split()
)

_READ_QUERY = "(identifier) @read (shorthand_property_identifier) @read"
_BINDING_PATTERNS = (
    "(shorthand_property_identifier_pattern) @bind",
    "(variable_declarator name: (identifier) @bind)",
    "(function_declaration name: (identifier) @bind)",
    "(generator_function_declaration name: (identifier) @bind)",
    "(function_expression name: (identifier) @bind)",
    "(class_declaration name: (_) @bind)",
    "(arrow_function parameter: (identifier) @bind)",
    "(catch_clause parameter: (identifier) @bind)",
    "(import_specifier (identifier) @bind)",
    "(import_clause (identifier) @bind)",
    "(namespace_import (identifier) @bind)",
    "(for_in_statement left: (identifier) @bind)",
    "(assignment_expression left: (identifier) @bind)",
    "(pair_pattern value: (identifier) @bind)",
    "(assignment_pattern left: (identifier) @bind)",
    "(array_pattern (identifier) @bind)",
    "(rest_pattern (identifier) @bind)",
)
_PARAMETER_PATTERNS = {
    "javascript": ("(formal_parameters (identifier) @bind)",),
    "typescript": ("(required_parameter pattern: (identifier) @bind)", "(optional_parameter pattern: (identifier) @bind)"),
}
_JSX_NAMES = frozenset({"jsx_opening_element", "jsx_closing_element", "jsx_self_closing_element"})


@lru_cache(maxsize=None)
def _queries(language: str) -> tuple[tree_sitter.Query, tree_sitter.Query]:
    """(reads, bindings) for a grammar; TypeScript's parameters are nodes of their own."""
    grammar = ts_language(language)
    parameters = _PARAMETER_PATTERNS["javascript" if language == "javascript" else "typescript"]
    return tree_sitter.Query(grammar, _READ_QUERY), tree_sitter.Query(grammar, "\n".join(_BINDING_PATTERNS + parameters))


def words(text: str) -> frozenset[str]:
    """Every word `text` spells (code, strings and comments alike)."""
    return frozenset(_WORD.findall(text))


def block_end(head: str, ctx: CursorContext) -> int:
    """Where in `head` (the suffix's first lines) the closer of a bracket opened before the
    cursor is (the end of the block around it; what follows is not the hole's business), or
    its length when it has none."""
    if ctx.spec is not None:
        depth = 0
        for tok in lex(head, ctx.spec, ctx.start_state, newlines=False).tokens:
            depth += (tok.kind == OPEN) - (tok.kind == CLOSE)
            if depth < 0:
                return tok.start
    return len(head)


def _captured(query: tree_sitter.Query, root: tree_sitter.Node, start: int, end: int) -> list[tree_sitter.Node]:
    cursor = tree_sitter.QueryCursor(query)
    cursor.set_byte_range(start, end)
    return [node for nodes in cursor.captures(root).values() for node in nodes if node.start_byte < end and node.end_byte > start]


def _text(node: tree_sitter.Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")


def _is_read(node: tree_sitter.Node) -> bool:
    """Not a lower-case JSX tag (`<div>` names an element, not a variable)."""
    parent = node.parent
    return not (parent is not None and parent.type in _JSX_NAMES and _text(node)[:1].islower())


def _names(language: str, root: tree_sitter.Node, start: int, end: int) -> tuple[list[tree_sitter.Node], list[tree_sitter.Node]]:
    """(reading nodes, binding nodes) of code that overlaps [start, end) (bytes): one query each."""
    reads, bindings = _queries(language)
    bound = _captured(bindings, root, start, end)
    spans = {(node.start_byte, node.end_byte) for node in bound}
    read = [node for node in _captured(reads, root, start, end) if (node.start_byte, node.end_byte) not in spans and _is_read(node)]
    return read, bound


def bound_names(language: str, root: tree_sitter.Node, start: int, end: int) -> frozenset[str]:
    """Names bound by code that overlaps [start, end) (bytes)."""
    return frozenset(_text(node) for node in _captured(_queries(language)[1], root, start, end))


def read_names(language: str, root: tree_sitter.Node, start: int, end: int) -> frozenset[str]:
    """Names read (not bound) by code that overlaps [start, end) (bytes)."""
    return frozenset(_text(node) for node in _names(language, root, start, end)[0])


@dataclass(frozen=True)
class WindowNames:
    """What the window (its baseline tree, before any alternative) says about names."""

    language: str
    words: frozenset[str]  # every word the window spells (code, strings, comments)
    needs: frozenset[str]  # read right after the cursor, bound nowhere in the window, not mentioned before the cursor

    @classmethod
    def of(
        cls, language: str, prefix: str, suffix: str, root: tree_sitter.Node, cursor: int, needs_end: int,
        above: frozenset[str] = frozenset(),
    ) -> "WindowNames":
        """`prefix` / `suffix`: the window as given; `root`: the tree of the text the checks
        parse (the repaired window), with the cursor at byte `cursor` of it; the suffix's reads
        that may be needed are those before byte `needs_end` there (`block_end`); `above`: the
        words of the file above the window, when the caller has them (`words`). The piece of a
        word the window's end cut off (`cut_word`) vouches for no name."""
        before = words(prefix) | above
        needs = read_names(language, root, cursor, needs_end) - before - GLOBALS if needs_end > cursor else frozenset()
        if needs:
            needs -= bound_names(language, root, 0, root.end_byte)
        cut = cut_word(prefix + suffix) if suffix else None
        return cls(language, (before | words(suffix)) - {cut}, needs)

    def judge(self, root: tree_sitter.Node, start: int, cursor: int, end: int) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """(names read that nothing vouches for, needed names bound, needed names left unbound)
        for the alternative at bytes [cursor, end) of the tree `root`; its reads and bindings
        from `start` (the word before the cursor it goes on with: `len` -> `length`), the needed
        names' bindings from the cursor on."""
        read, bound = _names(self.language, root, start, end)
        binds = frozenset(_text(node) for node in bound)
        unknown = frozenset(_text(node) for node in read) - self.words - GLOBALS - binds
        if not self.needs:
            return tuple(sorted(unknown)), (), ()
        after = frozenset(_text(node) for node in bound if node.end_byte > cursor)
        return tuple(sorted(unknown)), tuple(sorted(self.needs & after)), tuple(sorted(self.needs - after))

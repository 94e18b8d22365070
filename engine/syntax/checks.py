"""Static checks of one alternative in its file: syntax errors it introduces, and for Python
undefined names it reads and local variables it binds but never uses.

The prefix + suffix is parsed once per request (`Checker`); each alternative is then an
edit of that tree (tree-sitter reparses incrementally: ~0.2 ms for a 9 kB file instead of
~1 ms). "Introduces" is literal: an ERROR or MISSING node of the assembled file counts
unless the file without the completion has an error around the same place (once the
completion's length is taken out), so a file that was already broken is not held against
the completion. For Python, pylines.py adds the line-structure errors tree-sitter-python
accepts (an empty block, a bad indent, a line ending in an operator), Python 2 `print x`
statements count as errors, and CPython itself (`ast.parse`) judges the top-level construct
around the cursor (a few hundred microseconds) when tree-sitter found nothing. Errors the
file already had and still has are reported apart (`unfixed_errors`, and those at the
cursor): the completion did not cause them, but it did not fill the hole either. Python names:
pyscope.py (tree-sitter scopes, not pyflakes).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache

import tree_sitter

from kspec.engine.syntax import pyscope
from kspec.engine.syntax.context import CursorContext, build_context, top_level_start
from kspec.engine.syntax.languages import SPECS, new_parser, normalize_language, ts_language
from kspec.engine.syntax.pylines import line_errors

ANALYSIS = (
    "tree-sitter ERROR/MISSING nodes new relative to prefix+suffix (Python: + line rules and "
    "CPython ast.parse of the enclosing top-level construct); Python names by tree-sitter scopes"
)


@dataclass(frozen=True)
class CheckResult:
    syntax_errors: int = 0  # error nodes the completion introduces
    undefined_names: tuple[str, ...] = ()
    unused_variables: tuple[str, ...] = ()
    # Errors the file had before and still has; not the completion's fault, but not a fix
    # either. At the cursor: the hole is left unfilled (a header with no body, an unclosed
    # bracket, a statement cut short).
    unfixed_errors: int = 0
    unfixed_at_cursor: int = 0

    @property
    def breaks_parse(self) -> bool:
        return self.syntax_errors > 0

    @property
    def static_errors(self) -> int:
        return len(self.undefined_names) + len(self.unused_variables)


@lru_cache(maxsize=None)
def _python2_query() -> tree_sitter.Query:
    return tree_sitter.Query(ts_language("python"), "(print_statement) @s (exec_statement) @s")


def error_nodes(root: tree_sitter.Node) -> list[tree_sitter.Node]:
    """ERROR and MISSING nodes, visiting only subtrees that contain one."""
    found: list[tree_sitter.Node] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            found.append(node)
            if node.is_missing:
                continue
        if node.has_error:
            stack.extend(child for child in node.children if child.has_error or child.is_missing)
    return found


def _point_after(text: bytes, start: tree_sitter.Point) -> tree_sitter.Point:
    newlines = text.count(b"\n")
    if newlines == 0:
        return tree_sitter.Point(start.row, start.column + len(text))
    return tree_sitter.Point(start.row + newlines, len(text) - text.rfind(b"\n") - 1)


class Checker:
    """Checks the alternatives of one request against its prefix and suffix."""

    def __init__(
        self, prefix: str, suffix: str, language: str | None, ctx: CursorContext | None = None
    ) -> None:
        self.language = normalize_language(language)
        self.prefix = prefix.encode("utf-8", "surrogatepass")
        self.suffix = suffix.encode("utf-8", "surrogatepass")
        self.cursor = len(self.prefix)
        self.cursor_point = _point_after(self.prefix, tree_sitter.Point(0, 0))
        # "At the cursor": from the cursor to the end of the suffix's next few lines, where
        # the errors a hole causes show up (a body without its header, a stray `}`).
        self.near_end = self.cursor + len(_first_lines(suffix, NEAR_LINES).encode("utf-8", "surrogatepass"))
        if self.language is None:
            return
        self.parser = new_parser(self.language)
        self.baseline = self.parser.parse(self.prefix + self.suffix)
        self.baseline_errors = {self._signature(node, 0) for node in error_nodes(self.baseline.root_node)}
        self.outer: pyscope.Bindings | None = None
        self.ctx: CursorContext | None = None
        self.window: tuple[str, str] | None = None
        self.window_parses = False
        if self.language == "python":
            self.outer = pyscope.collect_bindings(self.baseline.root_node)
            self.ctx = ctx if ctx is not None else build_context(prefix, suffix, self.language)
            self.baseline_lines = line_errors(self.ctx, "")
            self.window = python_window(prefix, suffix)
            self.window_parses = self.window is not None and python_parses("".join(self.window))

    def _signature(self, node: tree_sitter.Node, inserted: int) -> tuple[str, int, int]:
        """(kind, start, end) in prefix+suffix coordinates; -1 for a place inside the completion."""
        end_of_completion = self.cursor + inserted

        def mapped(position: int) -> int:
            if position <= self.cursor:
                return position
            if position >= end_of_completion:
                return position - inserted
            return -1

        kind = ("MISSING " + node.type) if node.is_missing else "ERROR"
        return kind, mapped(node.start_byte), mapped(node.end_byte)

    def parse(self, completion: str) -> tuple[tree_sitter.Tree, int]:
        """The tree of prefix + completion + suffix (an incremental reparse) and the completion's byte length."""
        inserted = completion.encode("utf-8", "surrogatepass")
        tree = self.baseline.copy()
        tree.edit(
            start_byte=self.cursor,
            old_end_byte=self.cursor,
            new_end_byte=self.cursor + len(inserted),
            start_point=self.cursor_point,
            old_end_point=self.cursor_point,
            new_end_point=_point_after(inserted, self.cursor_point),
        )
        return self.parser.parse(self.prefix + inserted + self.suffix, tree), len(inserted)

    def syntax_errors(self, tree: tree_sitter.Tree, inserted: int) -> tuple[int, int, int]:
        """(new, unfixed, unfixed at the cursor) error nodes of the assembled file.

        New: not explained by an error of prefix + suffix. An error explains another when its
        span (completion taken out) contains it: error recovery often re-cuts a pre-existing
        ERROR node once text is inserted before it. Any error with an end inside the
        completion is the completion's. Unfixed: explained, i.e. the file had it before.
        """
        new = unfixed = at_cursor = 0
        for node in error_nodes(tree.root_node):
            _, start, end = self._signature(node, inserted)
            if start == -1 or end == -1 or not any(
                old_start <= start and end <= old_end for _, old_start, old_end in self.baseline_errors
            ):
                new += 1
            else:
                unfixed += 1
                at_cursor += start <= self.near_end and end >= self.cursor
        return new, unfixed, at_cursor

    def _python2_statements(self, tree: tree_sitter.Tree, inserted: int) -> int:
        """`print x` / `exec code`: tree-sitter-python still parses Python 2 statements."""
        cursor = tree_sitter.QueryCursor(_python2_query())
        cursor.set_byte_range(self.cursor, self.cursor + inserted)
        return sum(len(nodes) for nodes in cursor.captures(tree.root_node).values())

    def check(self, completion: str, *, names: bool = True) -> CheckResult:
        """Syntax errors introduced and left unfixed; with `names`, the Python name checks."""
        if self.language is None or not completion:
            return CheckResult()
        tree, inserted = self.parse(completion)
        errors, unfixed, at_cursor = self.syntax_errors(tree, inserted)
        if self.ctx is not None:
            lines = line_errors(self.ctx, completion)
            errors += len(lines - self.baseline_lines) + self._python2_statements(tree, inserted)
            unfixed += len(lines & self.baseline_lines)
            at_cursor += len(lines & self.baseline_lines)
            if errors == 0 and self.window is not None:
                head, tail = self.window
                parses = python_parses(head + completion + tail)
                if self.window_parses and not parses:
                    errors += 1  # CPython rejects what it accepted without the completion
                elif not self.window_parses and parses:
                    unfixed = at_cursor = 0  # CPython accepts the construct now: the hole is filled
                elif not self.window_parses:
                    unfixed, at_cursor = max(unfixed, 1), max(at_cursor, 1)
        if not names or self.outer is None:
            return CheckResult(errors, unfixed_errors=unfixed, unfixed_at_cursor=at_cursor)
        root, start, end = tree.root_node, self.cursor, self.cursor + inserted
        inner = pyscope.collect_bindings(root, start, end)
        return CheckResult(
            errors,
            tuple(pyscope.undefined_names(root, start, end, self.outer, inner)),
            tuple(pyscope.unused_variables(root, start, end)),
            unfixed,
            at_cursor,
        )


NEAR_LINES = 3


def _first_lines(text: str, count: int) -> str:
    """`text` up to the end of its `count`-th non-blank line."""
    pos = seen = 0
    while pos < len(text) and seen < count:
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        seen += bool(text[pos:end].strip())
        pos = end + 1
    return text[: min(pos, len(text))]


def python_parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


# The Python window CPython checks: the top-level construct around the cursor, at most this long.
MAX_PYTHON_WINDOW = 6000
_PY_NEXT_TOP_LEVEL = re.compile(r"\n(?=[^\s#)\]}])")


def python_window(prefix: str, suffix: str) -> tuple[str, str] | None:
    """The cursor's top-level construct, split at the cursor; None when it is too long."""
    head = prefix[top_level_start(prefix, SPECS["python"]) :]
    following = _PY_NEXT_TOP_LEVEL.search(suffix)
    tail = suffix if following is None else suffix[: following.start() + 1]
    if len(head) + len(tail) > MAX_PYTHON_WINDOW:
        return None
    return head, tail

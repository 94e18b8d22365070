"""Static checks of one alternative in its file: syntax errors it introduces; for Python and
JavaScript/TypeScript undefined names it reads and names the code after the cursor needs
that it defines or leaves undefined; for Python local variables it binds but never uses.

The prefix + suffix is parsed once per request (`Checker`); each alternative is then an
edit of that tree (tree-sitter reparses incrementally: ~0.2 ms for a 9 kB file instead of
~1 ms). "Introduces" is literal: an ERROR or MISSING node of the assembled file counts
unless the file without the completion has an error around the same place (once the
completion's length is taken out), so a file that was already broken is not held against
the completion. The prefix and suffix are a *window* of the file, cut anywhere: the tree
is that of the window repaired at both ends (window.py: the opener of the docstring,
comment or brackets it starts in, the closers of those its end cuts), and an error that
starts before the statement the cursor is in never counts as the hole's. For Python,
pylines.py adds the line-structure errors tree-sitter-python accepts (an empty block, a bad
indent, a line ending in an operator), Python 2 `print x` statements count as errors, and
CPython itself (`ast.parse`) judges the region around the cursor (window.py: from the
outermost construct the window shows around the cursor to its end; a few hundred
microseconds) when tree-sitter found nothing, and only when the region without the
completion parses or fails near the cursor (an error far from it is the window's, and
CPython then cannot tell). Errors the file already had and still has are reported apart
(`unfixed_errors`, and those at the cursor): the completion did not cause them, but it did
not fill the hole either. Python names: pynames.py (on pyscope.py's tree-sitter scopes);
JavaScript/TypeScript names: jsnames.py (tree-sitter bindings, judged by their text).
"""

from __future__ import annotations

import ast
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import cached_property, lru_cache

import tree_sitter

from kspec.engine.syntax import jsnames, pynames, pyscope
from kspec.engine.syntax.context import CursorContext, build_context, indent_of
from kspec.engine.syntax.hole_errors import BaselineErrors, Hole
from kspec.engine.syntax.languages import new_parser, normalize_language, ts_language
from kspec.engine.syntax.pylines import line_errors
from kspec.engine.syntax.lexer import CLOSE, COMMENT, OPEN, STRING
from kspec.engine.syntax.window import (
    Region, closing_tail, construct_end, cursor_indent, cut_word, find_region, indent_width, repair, scan,
)


ANALYSIS = (
    "tree-sitter ERROR/MISSING nodes new relative to the repaired window (Python: + line rules and "
    "CPython ast.parse of the region around the cursor); Python names by tree-sitter scopes, "
    "JavaScript/TypeScript names by tree-sitter bindings"
)


@dataclass(frozen=True)
class CheckResult:
    syntax_errors: int = 0  # error nodes the completion introduces
    undefined_names: tuple[str, ...] = ()
    unused_variables: tuple[str, ...] = ()
    # Python: of undefined_names, those the window binds only inside other functions (no
    # module-level name above the window can explain them: pynames.certainly_undefined)
    certainly_undefined: tuple[str, ...] = ()
    # Errors the file had before and still has; not the completion's fault, but not a fix
    # either. At the cursor: the hole is left unfilled (a header with no body, an unclosed
    # bracket, a statement cut short).
    unfixed_errors: int = 0
    unfixed_at_cursor: int = 0
    # Python, JavaScript/TypeScript: names the code after the cursor reads that nothing
    # before defines (the hole should): those this completion binds, and those it leaves
    # undefined.
    needs_defined: tuple[str, ...] = ()
    needs_missing: tuple[str, ...] = ()
    # Where the window's end is open: it closes a bracket opened before the cursor's line, or
    # leaves open one it opens, and no line end before that was safe to cut at
    # (window.end_balance): whether the file stays whole is past the window's end.
    beyond_window: bool = False

    @property
    def breaks_parse(self) -> bool:
        return self.syntax_errors > 0

    @property
    def static_errors(self) -> int:
        return len(self.undefined_names) + len(self.unused_variables)

    @property
    def binds_the_wrong_name(self) -> bool:
        """It binds a name nothing reads while a name the code after the cursor needs stays
        unbound (`j = 10` where the suffix reads `res`): the hole's assignment, to the wrong name."""
        return bool(self.unused_variables) and bool(self.needs_missing)


@lru_cache(maxsize=None)
def _python2_query() -> tree_sitter.Query:
    return tree_sitter.Query(ts_language("python"), "(print_statement) @s (exec_statement) @s")


def _edit(
    tree: tree_sitter.Tree, start: int, old_end: int, point: tree_sitter.Point, old_end_point: tree_sitter.Point, text: bytes
) -> None:
    """Replace [start, old_end) of the tree's text by `text`."""
    tree.edit(
        start_byte=start, old_end_byte=old_end, new_end_byte=start + len(text),
        start_point=point, old_end_point=old_end_point, new_end_point=_point_after(text, point),
    )


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _point_after(text: bytes, start: tree_sitter.Point) -> tree_sitter.Point:
    newlines = text.count(b"\n")
    if newlines == 0:
        return tree_sitter.Point(start.row, start.column + len(text))
    return tree_sitter.Point(start.row + newlines, len(text) - text.rfind(b"\n") - 1)


class Checker:
    """Checks the alternatives of one request against its prefix and suffix (a window of the file)."""

    def __init__(
        self, prefix: str, suffix: str, language: str | None, ctx: CursorContext | None = None,
        above: frozenset[str] = frozenset(),
    ) -> None:
        """`above`: names of the file above the window (Python: its module-level names,
        pynames.module_names; JavaScript/TypeScript: its words, jsnames.words)."""
        self.language = normalize_language(language)
        self.prefix = _utf8(prefix)
        self.suffix = _utf8(suffix)
        self.cursor = len(self.prefix)
        self.cursor_point = _point_after(self.prefix, tree_sitter.Point(0, 0))
        self.above = above
        if self.language is None:
            return
        self.ctx: CursorContext = ctx if ctx is not None else build_context(prefix, suffix, self.language)
        region = find_region(prefix, suffix) if self.language == "python" else None
        start, end = checked_span(prefix, suffix, region) if region is not None else (0, None)
        if start == 0:
            self.window_prefix, self.window_suffix = prefix, suffix
            self._repair(prefix, suffix)
        else:
            # A line end before the `def` line: the repair must not take it for a line the window cut.
            self.window_prefix, self.window_suffix = "\n" + prefix[start:], suffix[:end]
            self._repair(self.window_prefix, self.window_suffix, start - 1)
        self.parser = new_parser(self.language)
        self.baseline = self.parser.parse(self.prefix + self.suffix)
        word = _WORD_TAIL.search(prefix[-64:])
        self.word_before = len(_utf8(word.group())) if word else 0  # bytes of the word at the cursor
        self.names: pynames.WindowNames | None = None
        self.window: PythonWindow | None = None
        if region is not None:
            self._python(prefix, suffix, region, start, end, above)
        self.baseline_errors = BaselineErrors(self.baseline.root_node, self.hole)
        self.window_errors = self.baseline_errors.away_from_hole  # no completion is expected to mend these

    def _repair(self, prefix: str, suffix: str, offset: int = 0) -> None:
        """The repaired window (window.py) as the text to parse, and where in it the cursor's
        statement starts, its next lines end, and the window's own last line starts
        (`prefix` begins `offset` characters into the prefix the context was built from)."""
        fix = repair(prefix, suffix, self.language)
        self.tail = fix.tail.encode()
        self.prefix = _utf8(fix.head + prefix[fix.drop :])
        # Blanks at the very end of a window are a line the window cut: not worth an error.
        self.suffix = _utf8(suffix.rstrip(" \t") + fix.tail)
        self.cursor = len(self.prefix)
        self.cursor_point = _point_after(self.prefix, tree_sitter.Point(0, 0))
        # A window offset (after its first line) -> an offset in the repaired text.
        shift = len(fix.head.encode("utf-8")) - len(_utf8(prefix[: fix.drop]))
        # "At the cursor": from the start of the statement the cursor is in to the end of
        # the suffix's next few lines, where the errors a hole causes show up (a body
        # without its header, a stray `}`).
        statement = shift + len(_utf8(prefix[: _statement_start(prefix, self.ctx, offset)]))
        near_end = self.cursor + len(_utf8(_first_lines(suffix, NEAR_LINES)))
        # The window's last line may be cut short (no line end after it): errors that start
        # on it are its own.
        content = suffix.rstrip()
        self.cut_end = not suffix.rstrip(" \t").endswith("\n") and ("\n" in content or not self.ctx.mid_line)
        last_line = content.rfind("\n") + 1 if self.cut_end else len(content)
        last_line = self.cursor + len(_utf8(content[:last_line]))
        self.hole = Hole(self.prefix + self.suffix, self.cursor, statement, near_end, last_line, indent_of(self.ctx.line_prefix))

    def _python(self, prefix: str, suffix: str, region: Region, start: int, end: int | None, above: frozenset[str]) -> None:
        """Names, line rules and CPython's region for a Python window whose checks parse
        prefix[start:] to suffix[:end] (`checked_span`)."""
        # Names the suffix needs: in the construct around the cursor, not on a last line the window cut.
        needs_end = min(
            self.cursor + len(_utf8(_first_lines(suffix, pynames.NEEDS_LINES))),
            self.cursor + len(_utf8(suffix[: region.end])),
            self.hole.last_line,
        )
        def outside() -> tuple[pynames.OutsideNames, pynames.OutsideNames]:
            """What the window before and after the checked part binds and reads (it still counts)."""
            found = scan(prefix, suffix, "python")
            before = pynames.OutsideNames.of(prefix, found.prefix_tokens, 0, start)
            after = pynames.OutsideNames.of(suffix, found.suffix_tokens, end if end is not None else len(suffix), len(suffix))
            return before, after

        self.names = pynames.WindowNames(
            self.prefix + self.suffix, self.baseline.root_node, self.cursor, needs_end, region.in_function, above,
            outside if start > 0 else None, cut_word(prefix + suffix) if suffix else None,
        )
        # An expression the window's end cut short on the line after the cursor's is the window's.
        following_cut = self.cut_end and "\n" not in suffix[suffix.find("\n") + 1 :].strip()
        baseline_lines = line_errors(self.ctx, "")
        self.cut_line_errors = {
            e for e in baseline_lines if following_cut and e[0] == "incomplete expression" and e[1][0] == "suffix"
        }
        self.baseline_lines = baseline_lines - self.cut_line_errors
        self.window = python_window(prefix, suffix)

    def leaves_whole(self, result: CheckResult) -> bool:
        """Whether a completion leaves the file as whole as the window can show it: no error of
        its own, none at the cursor, and no more elsewhere than the window had."""
        return not result.breaks_parse and result.unfixed_at_cursor == 0 and result.unfixed_errors <= self.window_errors

    def parse(self, completion: str) -> tuple[tree_sitter.Tree, int]:
        """The tree of prefix + completion + suffix (an incremental reparse) and the completion's byte length."""
        inserted = completion.encode("utf-8", "surrogatepass")
        tree = self.baseline.copy()
        _edit(tree, self.cursor, self.cursor, self.cursor_point, self.cursor_point, inserted)
        text = self.prefix + inserted + self.suffix
        # The closers the window's end needs can change with what the completion opens or closes.
        tail = closing_tail(self.window_prefix, self.window_suffix, self.language, completion, self.ctx.start_state).encode()
        if tail != self.tail:
            body = text[: len(text) - len(self.tail)]
            point = _point_after(body, tree_sitter.Point(0, 0))
            _edit(tree, len(body), len(text), point, _point_after(self.tail, point), tail)
            text = body + tail
        return self.parser.parse(text, tree), len(inserted)

    def _body_without_header(self, completion: str) -> bool:
        """C family: the completion ends a statement, and the line after it is indented deeper
        without continuing it: a body whose header the hole should have written (a window may
        have cut the stray `}` that would show it)."""
        ctx = self.ctx
        following = ctx.suffix_following_line
        if ctx.suffix_line_rest.strip() or following is None or following.lstrip()[:1] in _CONTINUES_LINE:
            return False
        last = (ctx.line_prefix + completion).rstrip().rsplit("\n", 1)[-1]
        return last.rstrip()[-1:] in (";", "}") and indent_of(following) > indent_of(last)

    @cached_property
    def _js_names(self) -> jsnames.WindowNames:
        """JavaScript/TypeScript names of the window, read from the baseline tree (once, when
        the first alternative's names are checked); the needed names are read in the suffix's
        next lines in the cursor's block (`jsnames.block_end`), not on a last line the window cut."""
        head = _first_lines(self.window_suffix, jsnames.NEEDS_LINES)
        needs_end = min(self.cursor + len(_utf8(head[: jsnames.block_end(head, self.ctx)])), self.hole.last_line)
        return jsnames.WindowNames.of(
            self.language or "", self.window_prefix, self.window_suffix, self.baseline.root_node, self.cursor, needs_end, self.above
        )

    def needed_names(self) -> tuple[str, ...]:
        """Names the code right after the cursor reads that nothing before it binds (Python:
        pynames `needs`; JavaScript/TypeScript: jsnames `needs`); () for other languages."""
        if self.language is None:
            return ()
        if self.names is not None:
            return self.names.needs
        if self.language in jsnames.LANGUAGES:
            return tuple(sorted(self._js_names.needs))
        return ()

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
        errors, unfixed, at_cursor = self.baseline_errors.count(tree.root_node, inserted)
        if self.names is not None:
            lines = line_errors(self.ctx, completion) - self.cut_line_errors
            errors += len(lines - self.baseline_lines) + self._python2_statements(tree, inserted)
            unfixed += len(lines & self.baseline_lines)
            at_cursor += len(lines & self.baseline_lines)
            if errors == 0 and self.window is not None and self.window.judges:
                verdict = self.window.judge(completion)
                if verdict == BREAKS:
                    errors += 1  # CPython rejects what it accepted without the completion
                elif verdict == FILLS:
                    unfixed = at_cursor = 0  # CPython accepts the region now: the hole is filled
                elif verdict == UNFILLED:
                    unfixed, at_cursor = max(unfixed, 1), max(at_cursor, 1)
        elif errors == 0 and self._body_without_header(completion):
            unfixed, at_cursor = unfixed + 1, at_cursor + 1
        # A completion that goes on with the word before the cursor (`len` -> `length`)
        # writes that whole name.
        start = self.cursor - (self.word_before if completion[:1].isalnum() or completion[:1] in "_$" else 0)
        root, end = tree.root_node, self.cursor + inserted
        if names and self.language in jsnames.LANGUAGES:
            undefined, defined, missing = self._js_names.judge(root, start, self.cursor, end)
            return CheckResult(
                errors, undefined, unfixed_errors=unfixed, unfixed_at_cursor=at_cursor, needs_defined=defined, needs_missing=missing
            )
        if not names or self.names is None:
            return CheckResult(errors, unfixed_errors=unfixed, unfixed_at_cursor=at_cursor)
        inner = pyscope.collect_bindings(root, start, end)
        defined, missing = pynames.needs_met(self.names, inner)
        undefined = pynames.undefined_names(root, start, end, self.names, inner)
        return CheckResult(
            errors,
            tuple(undefined),
            tuple(pyscope.unused_variables(root, start, end)),
            certainly_undefined=tuple(pynames.certainly_undefined(self.names, undefined)),
            unfixed_errors=unfixed,
            unfixed_at_cursor=at_cursor,
            needs_defined=defined,
            needs_missing=missing,
        )


def checked_span(prefix: str, suffix: str, region: Region) -> tuple[int, int | None]:
    """What of a Python window its checks parse, prefix[start:] + completion + suffix[:end]
    (end None: to the window's end): the outermost function around the cursor whose `def`
    line the window shows below its first line (its inner functions read its names), from that
    line, where nothing is open, to the first line after the cursor at its level or lower (a
    completion inside cannot change how the text around it parses); else the whole window
    (0, None). An incremental reparse redoes what tree-sitter cannot reuse: the text after the
    edit (0.24 ms a check with 2000 characters after the cursor, 0.06 ms with 300) and error
    nodes (a window cut mid-construct: 0.2 ms with no edit at all). What the rest of the
    window binds and reads is taken lexically (`pynames.OutsideNames`)."""
    if region.state is not None:
        return 0, None
    found = scan(prefix, suffix, "python")
    opens = [tok.start for tok in found.prefix_tokens if tok.kind == OPEN]
    closes = [tok.start for tok in found.prefix_tokens if tok.kind == CLOSE]
    literals = [tok for tok in found.prefix_tokens if tok.kind in (STRING, COMMENT)]
    literal_starts = [tok.start for tok in literals]

    def statement_at(start: int) -> bool:
        """Whether a statement may begin at line start `start` (at the cursor's bracket depth, not in a literal)."""
        inside = bisect_right(literal_starts, start) - 1
        if inside >= 0 and literals[inside].end > start:
            return False  # a line of a string
        return bisect_left(opens, start) - bisect_left(closes, start) == depth

    statement = prefix.rfind("\n", 0, region.statement) + 1
    depth = bisect_left(opens, statement) - bisect_left(closes, statement)
    cursor_line = prefix.rfind("\n") + 1
    # The statement's indentation: its first line's; on the cursor's line, where the cursor
    # is on a blank line (the completion goes there), else what the line (or the next) says.
    if statement < cursor_line:
        threshold = indent_width(prefix, statement)
    elif not prefix[cursor_line:].strip() and indent_width(prefix, cursor_line) > 0:
        threshold = indent_width(prefix, cursor_line)
    else:
        threshold = cursor_indent(prefix[cursor_line:], suffix) or 0
    start = indent = -1
    # Lines above, innermost first: each indented less than the last kept encloses it.
    for line in reversed(list(_CODE_LINE.finditer(prefix, 0, statement)) if threshold > 0 else []):
        line_start, leading, first = line.start(), line.group(1), line.group(2)
        width = indent_width(leading, 0) if "\t" in leading else len(leading)
        if width >= threshold or first == "#" or not statement_at(line_start):
            continue
        threshold = width
        if _PY_FUNCTION.match(prefix, line_start + len(leading)):
            start, indent = line_start, width
        if threshold == 0:
            break
    if start <= 0:
        return 0, None
    return start, construct_end(suffix, found.suffix_tokens, indent)


_PY_FUNCTION = re.compile(r"(?:async[ \t]+)?def[ \t]")
_CODE_LINE = re.compile(r"^([ \t]*)(\S)", re.MULTILINE)  # a non-blank line: its indentation and first character


def _statement_start(prefix: str, ctx: CursorContext, offset: int = 0) -> int:
    """Where the statement the cursor is in begins in `prefix` (which begins `offset`
    characters into the prefix `ctx` was built from): its line, or for a line inside brackets
    or a string (open at the cursor), the line of the outermost of them."""
    line_start = prefix.rfind("\n") + 1
    if not ctx.open_brackets and ctx.start_state is None:
        return line_start
    return max(ctx.statement_start - offset, 0) if ctx.statement_start is not None else line_start


NEAR_LINES = 3
_CONTINUES_LINE = frozenset(")]}.?:+-*/%&|^,<>=")
_WORD_TAIL = re.compile(r"[\w$]+$")


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
    return python_error(source) is None


def python_error(source: str) -> tuple[int, str] | None:
    """(1-based line, message) of the syntax error CPython reports; None when `source` parses."""
    try:
        ast.parse(source)
    except SyntaxError as exc:
        return exc.lineno or 1, exc.msg
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        return 1, type(exc).__name__
    return None


# The Python region CPython checks is at most this long; a longer one (a function longer than
# this, or no `def` within window.SPAN of the cursor) is left to tree-sitter: CPython compiles
# the region once per alternative (~0.3 ms at 6000 characters, 0.15 at 1500). Lowered from
# 6000: the replayed quality bench showed the same figures either way.
MAX_PYTHON_WINDOW = 3000
_REGION_HEADER = "if True:\n"  # a region that does not start at column 0 is a block

# What CPython says about the region with a completion.
BREAKS, FILLS, UNFILLED, SAME = "breaks", "fills", "unfilled", "same"


class PythonWindow:
    """The region around the cursor (window.py) as CPython sees it, judged once without the completion."""

    def __init__(self, region: Region, prefix: str, suffix: str) -> None:
        self.head = (_REGION_HEADER if region.indent > 0 else "") + prefix[region.start :]
        self.tail = suffix[: region.end]
        self.open_end = region.open_end
        self.at_document_end = not suffix.strip()
        header_lines = 1 if region.indent > 0 else 0
        # Lines (1-based, in head + tail) of the cursor's statement and of the cursor.
        self.statement_line = header_lines + prefix.count("\n", region.start, region.statement) + 1
        self.cursor_line = self.head.count("\n") + 1
        self.near_lines = _first_lines(self.tail, NEAR_LINES).count("\n") + 1
        baseline = python_error(self.head + self.tail)
        self.parses = baseline is None
        # CPython can judge the hole when the region parses without it, or fails near the cursor.
        self.judges = region.state is None and (baseline is None or self._near(baseline, ""))

    def _at_end(self, error: tuple[int, str], completion: str) -> bool:
        """A block header on the region's last line: its body is still to come."""
        line, message = error
        return message.startswith("expected an indented block") and line >= (self.head + completion + self.tail).rstrip().count("\n") + 1

    def _near(self, error: tuple[int, str], completion: str) -> bool:
        line, message = error
        if message.startswith("expected an indented block"):
            if self.open_end and self._at_end(error, completion):
                return False  # its body may be what the window cut off
            line += 1  # reported at the header, missing on the line after it
        return self.statement_line <= line <= self.cursor_line + completion.count("\n") + self.near_lines

    def judge(self, completion: str) -> str:
        error = python_error(self.head + completion + self.tail)
        if error is None:
            return SAME if self.parses else FILLS
        near = self._near(error, completion)
        if self.parses and self.at_document_end and self._at_end(error, completion):
            return UNFILLED  # a header written at the end of the document: its body comes next
        if self.parses:
            return BREAKS if near or not self.open_end else SAME
        return UNFILLED if near else SAME


def python_window(prefix: str, suffix: str) -> PythonWindow | None:
    """The region around the cursor for CPython; None when it is too long to parse per keystroke."""
    region = find_region(prefix, suffix)
    if len(prefix) - region.start + region.end > MAX_PYTHON_WINDOW:
        return None
    return PythonWindow(region, prefix, suffix)

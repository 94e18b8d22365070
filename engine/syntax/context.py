"""What the text around the cursor says about the unit a completion should fill.

Built once per request from (prefix, suffix, language) and shared by every alternative and
every early-stop call of that request: the cursor line, whether the cursor is inside a
string or comment, which brackets are open at the cursor and how many of them the suffix
already closes, and the suffix's next line (to notice a completion that repeats it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kspec.engine.syntax.languages import SPECS, LanguageSpec, normalize_language, spec_for
from kspec.engine.syntax.lexer import CLOSE, CLOSERS, COMMENT, NEWLINE, OPEN, STRING, LexResult, LexState, Tok, lex, unmatched_openers
from kspec.engine.syntax.memo import request_memo
from kspec.engine.syntax.window import SPAN, start_state

# How much of the suffix is lexed to learn which open brackets it closes.
SUFFIX_SCAN_CHARS = 4000
# How many suffix lines a completion is compared with to see it repeat the suffix.
SUFFIX_REPEAT_LINES = 3
# How many of the innermost open brackets at the cursor are remembered.
MAX_OPEN_BRACKETS = 32


def indent_of(line: str) -> int:
    """Indentation width of a line (tabs to 8 columns)."""
    expanded = line.expandtabs(8)
    return len(expanded) - len(expanded.lstrip(" \t"))


@dataclass(frozen=True)
class CursorContext:
    language: str | None
    spec: LanguageSpec | None
    line_prefix: str  # the cursor line up to the cursor
    mid_line: bool  # the cursor line has code before the cursor
    start_state: LexState | None  # the cursor is inside this string / comment
    open_brackets: tuple[str, ...]  # brackets open at the cursor, outermost first
    suffix_closes: int  # how many of the innermost open brackets the suffix closes
    suffix_line_rest: str  # the cursor line after the cursor
    suffix_lines: tuple[str, ...]  # the next non-blank suffix lines, at their absolute indentation
    prev_line_opens_block: bool  # the last non-blank line above the cursor line opens a block
    cursor_line_opens_block: bool  # the cursor line (up to the cursor) opens a block
    suffix_following_line: str | None = None  # the first non-blank suffix line after the cursor line
    # Python only: the indentation levels open at the cursor line (outermost first), as
    # Python's tokenizer keeps them, and whether the last logical line before the cursor
    # line ends with ":" (so the next line must be indented deeper).
    indent_stack: tuple[int, ...] = (0,)
    expects_indent: bool = False
    # Where the statement the cursor is in begins when the cursor line continues it (inside
    # brackets or a string opened on an earlier line): that line's start; else None.
    statement_start: int | None = None
    # Python: the window starts inside a block, so indentation levels below the lowest one
    # it shows are unknown (a dedent there cannot be judged).
    indent_partial: bool = False

    @property
    def string_closed_by_suffix(self) -> bool:
        state = self.start_state
        return (
            state is not None
            and state.kind in ("string", "template")
            and self.suffix_line_rest.startswith(state.close)
        )

    @property
    def suffix_next_line(self) -> str | None:
        return self.suffix_lines[0] if self.suffix_lines else None

    @property
    def suffix_next_indent(self) -> int | None:
        return None if self.suffix_next_line is None else indent_of(self.suffix_next_line)


# A line that starts a construct outside any bracket, string or comment (in all but
# contrived files). Python: a `def` or `class` line at any depth, or a decorator, import or
# main guard at column 1. C family: code at column 1 right after a blank line or after a
# line that closes a `}` at column 1.
_PY_TOP_LEVEL = re.compile(r"\n(?=(?:async\s+def|def|class|import|from)\s|@|if\s+__name__)")
_PY_BLOCK_START = re.compile(r"\n(?=[ \t]*(?:async\s+def|def|class)\s|(?:import|from)\s|@|if\s+__name__)")
_C_TOP_LEVEL = re.compile(r"(?:\n[ \t]*\n|\n\}[^\n]*\n)(?=[A-Za-z_#@])")


def top_level_start(prefix: str, spec: LanguageSpec, *, nested: bool = False) -> int:
    """Where lexing the prefix can start: the last top-level construct before the cursor line
    (with `nested`, for Python also a `def`/`class` at any depth).

    Lexing only from there keeps the context cost proportional to the construct the cursor
    is in, not to the whole prefix.
    """
    if spec.family == "python":
        pattern = _PY_BLOCK_START if nested else _PY_TOP_LEVEL
    else:
        pattern = _C_TOP_LEVEL
    cursor_line = prefix.rfind("\n")
    start = 0
    for match in pattern.finditer(prefix, 0, max(cursor_line, 0)):
        start = match.end()
    return start


def lexing_start(prefix: str, spec: LanguageSpec) -> tuple[int, LexState | None]:
    """Where lexing the prefix starts, and in which state: the innermost construct before the
    cursor line (`top_level_start`), else the first line of its last `SPAN` characters; a
    Python `def`/`class` line is code, anywhere else the state is guessed (window.py: the
    prefix may be a window that starts inside a docstring or a block comment)."""
    start = top_level_start(prefix, spec, nested=True)
    if start > 0 and spec.family == "python":
        return start, None
    if start == 0:
        floor = prefix.rfind("\n", 0, max(len(prefix) - SPAN, 0)) + 1
        start = floor if floor > 0 else 0
    return start, start_state(prefix[start:], spec)


# Memoized: a pure function of immutable arguments with an immutable result. Decoding asks
# the early-stop hook every round and post-processing then trims, all for the same request.
@request_memo
def build_context(prefix: str, suffix: str, language: str | None) -> CursorContext:
    """The cursor context of one request (see CursorContext)."""
    name = normalize_language(language)
    spec = spec_for(name)
    line_start = prefix.rfind("\n") + 1
    line_prefix = prefix[line_start:]
    newline = suffix.find("\n")
    suffix_line_rest = suffix if newline < 0 else suffix[:newline]

    start_state: LexState | None = None
    open_brackets: tuple[str, ...] = ()
    suffix_closes = 0
    statement_start: int | None = None
    indent_partial = False
    mid_line = line_prefix.strip() != ""
    suffix_lines = _suffix_lines(line_prefix, mid_line, suffix, newline, SUFFIX_REPEAT_LINES)
    indent_stack: tuple[int, ...] = (0,)
    expects_indent = False
    if spec is not None:
        python = spec.family == "python"
        start, state = lexing_start(prefix, spec)
        tail = prefix[start:]
        prefix_lex = lex(tail, spec, state, newlines=python)
        start_state = prefix_lex.end_state
        if python:
            # A first line the window may have cut (it starts inside a literal, or indented at
            # the window's first character) tells nothing about indentation.
            cut_first = start == 0 and (state is not None or indent_of(tail[: tail.find("\n") + 1 or None]) > 0)
            levels, expects_indent = _python_indentation(tail, line_start - start, prefix_lex.tokens, cut_first)
            if levels is None:  # the window starts right above the cursor: take the levels it shows
                shown = [indent_of(line) for line in (line_prefix, *suffix_lines) if line.strip()]
                closer = _closing_quote_indent(tail, prefix_lex.tokens, state.close) if state is not None else None
                levels = tuple(sorted({0, *shown, *([] if closer is None else [closer])}))
            indent_stack = _outer_levels(prefix[:start], levels[1] if len(levels) > 1 else 0) + levels[1:]
            indent_partial = len(indent_stack) > 1 and indent_stack[1] > 0 and not _top_level_above(prefix[:start] if start else "")
        all_openers = unmatched_openers(prefix_lex.tokens)
        openers = all_openers[-MAX_OPEN_BRACKETS:]
        open_brackets = tuple(tok.char for tok in openers)
        statement_start = _continued_from(prefix, start, prefix_lex, all_openers, python)
        suffix_closes = _closed_by(open_brackets, suffix[:SUFFIX_SCAN_CHARS], spec, start_state)

    return CursorContext(
        language=name,
        spec=spec,
        line_prefix=line_prefix,
        mid_line=mid_line,
        start_state=start_state,
        open_brackets=open_brackets,
        suffix_closes=suffix_closes,
        suffix_line_rest=suffix_line_rest,
        suffix_lines=suffix_lines,
        prev_line_opens_block=opens_block(_last_nonblank_line(prefix[: max(line_start - 1, 0)]), spec),
        cursor_line_opens_block=mid_line and opens_block(line_prefix, spec),
        suffix_following_line=(_suffix_lines("", True, suffix, newline, 1) or (None,))[0],
        indent_stack=indent_stack,
        expects_indent=expects_indent,
        statement_start=statement_start,
        indent_partial=indent_partial,
    )


def _closing_quote_indent(text: str, tokens: list[Tok], close: str) -> int | None:
    """A window that starts inside a string closed by `close`: the indentation of the line
    that closer begins (a docstring's closing quotes alone on their line are indented as the
    block's body); None when the string does not close in `text` or code precedes the closer."""
    literal = tokens[0] if tokens and tokens[0].kind == STRING and tokens[0].start == 0 else None
    if literal is None or not text.startswith(close, literal.end - len(close)):
        return None
    before = text[text.rfind("\n", 0, literal.end) + 1 : literal.end - len(close)]
    return indent_of(before) if not before.strip() else None


def _top_level_above(text: str) -> bool:
    """Whether `text` has a code line at column 0 (the window shows the module level)."""
    return re.search(r"(?:^|\n)[A-Za-z_@]", text) is not None


def _continued_from(prefix: str, start: int, lexed: LexResult, openers: list[Tok], python: bool) -> int | None:
    """The start of the line where the statement the cursor is in begins, when that is above
    the cursor line: the line of the outermost bracket open at the cursor inside that
    statement (C family: opened after the innermost open `{` that ends its line, a block),
    or of the literal the cursor is in."""
    inside = openers
    if not python:
        blocks = [i for i, tok in enumerate(openers) if tok.char == "{" and _ends_line(prefix, start + tok.end)]
        inside = openers[blocks[-1] + 1 :] if blocks else openers
    begins = [tok.start for tok in inside[:1]]
    if lexed.end_state is not None and lexed.tokens:
        begins.append(lexed.tokens[-1].start)
    if not begins:
        return None
    return prefix.rfind("\n", 0, start + min(begins)) + 1


def _ends_line(text: str, pos: int) -> bool:
    """Whether only blanks or a comment follow `pos` on its line."""
    end = text.find("\n", pos)
    rest = (text[pos:] if end < 0 else text[pos:end]).strip()
    return not rest or rest.startswith(("//", "/*"))


def logical_line_starts(text: str, tokens: list[Tok], depth: int = 0) -> list[int]:
    """Offsets after each line end that ends a Python logical line (outside brackets, no `\\`)."""
    starts = []
    for tok in tokens:
        if tok.kind == OPEN:
            depth += 1
        elif tok.kind == CLOSE:
            depth = max(depth - 1, 0)
        elif tok.kind == NEWLINE and depth == 0 and not _continued(text, tok.start):
            starts.append(tok.end)
    return starts


def _continued(text: str, newline: int) -> bool:
    """Whether the line ending at `newline` ends with a backslash (an explicit line join)."""
    i = newline - 1
    while i >= 0 and text[i] in " \t\r":
        i -= 1
    return i >= 0 and text[i] == "\\"


def _python_indentation(
    prefix: str, cursor_line_start: int, tokens: list[Tok], cut_first: bool = False
) -> tuple[tuple[int, ...] | None, bool]:
    """Python's indentation stack at the cursor line, and whether a deeper indent is expected
    (`cut_first`: the first logical line may be cut, and does not count)."""
    levels: list[int] = []  # innermost first, walking back
    expects: bool | None = None
    starts = [*([] if cut_first else [0]), *logical_line_starts(prefix, tokens)]
    for index in range(len(starts) - 1, -1, -1):
        start = starts[index]
        if start >= cursor_line_start:
            continue  # the cursor line itself is not a finished logical line
        end = starts[index + 1] - 1 if index + 1 < len(starts) else cursor_line_start - 1
        first_line_end = prefix.find("\n", start)
        first_line = prefix[start : first_line_end if first_line_end >= 0 else len(prefix)]
        if not first_line.strip() or first_line.lstrip().startswith("#"):
            continue
        if expects is None:
            last_line = prefix[prefix.rfind("\n", 0, max(end, start)) + 1 : end]
            expects = last_line.strip() != "" and _ends_with_colon(last_line)
        indent = indent_of(first_line)
        if not levels or indent < levels[-1]:
            levels.append(indent)
            if indent == 0:
                break
    if not levels and cut_first:
        return None, False  # no whole line before the cursor: the indentation is unknown
    if not levels or levels[-1] != 0:
        levels.append(0)
    return tuple(reversed(levels)), bool(expects)


def _outer_levels(outer: str, below: int) -> tuple[int, ...]:
    """Indentation levels open before the lexed part of the prefix (which starts at `below`).

    Read from raw lines: the last code line indented less than each level found so far.
    """
    levels = [0]
    text = "\n" + outer
    while below > 0:
        found = None
        for found in re.finditer(r"\n([ \t]{0,%d})(?=[^\s#])" % (below - 1), text):
            pass
        if found is None:
            break
        below = indent_of(found.group(1))
        if below > 0:
            levels.insert(1, below)
    return tuple(levels)


def _ends_with_colon(line: str) -> bool:
    return code_of_line(line, SPECS["python"]).endswith(":")


def _closed_by(open_brackets: tuple[str, ...], suffix: str, spec: LanguageSpec, state: LexState | None) -> int:
    """How many of the innermost `open_brackets` the suffix closes, innermost first."""
    closed, depth = 0, 0
    for tok in lex(suffix, spec, state, newlines=False).tokens:
        if tok.kind == OPEN:
            depth += 1
        elif tok.kind == CLOSE:
            if depth > 0:
                depth -= 1
                continue
            if closed >= len(open_brackets) or CLOSERS[tok.char] != open_brackets[-1 - closed]:
                break
            closed += 1
    return closed


def _suffix_lines(line_prefix: str, mid_line: bool, suffix: str, newline: int, count: int) -> tuple[str, ...]:
    """The first `count` non-blank lines the suffix puts after the cursor, with their full
    indentation (the rest of the cursor line counts when the cursor is at its start)."""
    lines: list[str] = []
    first = suffix if newline < 0 else suffix[:newline]
    if first.strip() and not mid_line:
        lines.append((line_prefix + first).rstrip())
    if newline < 0:
        return tuple(lines)
    pos = newline + 1
    while pos < len(suffix) and len(lines) < count:
        end = suffix.find("\n", pos)
        line = suffix[pos:] if end < 0 else suffix[pos:end]
        if line.strip():
            lines.append(line.rstrip())
        if end < 0:
            break
        pos = end + 1
    return tuple(lines[:count])


def _last_nonblank_line(text: str) -> str:
    end = len(text)
    while end > 0:
        start = text.rfind("\n", 0, end) + 1
        line = text[start:end]
        if line.strip():
            return line
        end = start - 1
    return ""


def code_of_line(line: str, spec: LanguageSpec | None) -> str:
    """The line without a trailing comment and trailing whitespace."""
    if spec is None:
        return line.rstrip()
    tokens = lex(line, spec, newlines=False).tokens
    if tokens and tokens[-1].kind == COMMENT:
        line = line[: tokens[-1].start]
    return line.rstrip()


def opens_block(line: str, spec: LanguageSpec | None) -> bool:
    """Whether the line's code ends by opening a block (`:` in Python, `{` elsewhere)."""
    if spec is None or not line.strip():
        return False
    code = code_of_line(line, spec)
    return code.endswith(":") if spec.family == "python" else code.endswith("{")

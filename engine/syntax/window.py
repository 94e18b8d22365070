"""Resynchronising on a window of a file: how to repair its ends, and the span around the
cursor that is whole.

The engine sees a window of the file (the language server sends a few thousand characters
before and after the cursor), and a window starts and ends anywhere: inside a docstring,
a block comment, a bracket, a statement. Parsed as it is, such a window has errors all
over, and every alternative then seems to break, or to leave broken, what surrounds it.
With the lexer alone (the window is lexed once per request, `scan`):

1. `start_state`: the lexical state at the window's first character. A window that starts
   inside a Python triple-quoted string shows it by its first triple quote being a closer
   (it ends a line of prose, or is alone on a line that no header line opens a docstring
   for, or alone on the window's first line with code, not prose, after it: `_reads_as_code`,
   the one parse here); one inside a C-family block comment by a `*/` before any `/*`. A window that
   starts in code starts on a line it may have cut: when that line does not parse on its
   own it is replaced by what it leaves open.
2. `repair`: text that makes the window lex and parse as the file does: before it, the
   openers of the brackets it closes without opening; after it (`closing_tail`, per
   alternative), the closers of what its end cuts open: the literal, the brackets the
   suffix opens, and the blocks the window ends inside (their line is indented less than
   the window's last line; when the suffix is blank, the completion's last line, and a `{`
   ending it). A bracket opened on the cursor's line that nothing closes is the hole's to
   close, and stays open. Where the window's end is open (a bracket opened before the
   cursor's line is still open after the suffix), what a completion opens and leaves open,
   or closes of those brackets, cannot be judged by the window: `end_balance` cuts it back
   to a line end where it is balanced.
3. `find_region` (Python): the span around the cursor that CPython can judge. Walking
   back from the cursor line over *safe* lines (outside strings, comments and brackets;
   not a continuation or an `else`/`except` clause), every line indented less than those
   after it encloses the cursor; the region starts at the innermost `def`/`class` found
   that way, else at the outermost enclosing line the window shows (when the window
   starts inside that construct: its earliest safe line at that indentation). It ends
   where that construct ends (the next line indented less, or no deeper for a `def`,
   `class` or column-0 statement), else at the last line end of the suffix after which
   nothing is left open, and then `open_end` says the window, not the construct, ended
   it. Only the last `SPAN` characters before the cursor are looked at. `Region.indent`
   > 0 means CPython needs a header line (`if True:`) before it.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from kspec.engine.api import spells_word
from kspec.engine.syntax.languages import SPECS, LanguageSpec, new_parser, normalize_language
from kspec.engine.syntax.lexer import CLOSE, CLOSERS, COMMENT, NEWLINE, OPEN, OPENERS, LexState, Tok, lex, unmatched_openers
from kspec.engine.syntax.memo import request_memo

SPAN = 3000  # characters before the cursor the region is looked for in
# The window of text around the cursor, defined once: what the language server sends by default
# (its prefixChars / suffixChars settings) and at most what post-processing analyses, so that it
# costs the same for a file of any size.
MAX_BEFORE = 6000
MAX_AFTER = 2000

_PY_TRIPLE = re.compile(r"\"\"\"|'''")
_STRING_PREFIX = re.compile(r"[rRbBuUfF]{1,2}$")
# Code before a triple quote on its line that makes it an opener (`x = """`, `f("""`, `return """`).
_OPENS_VALUE = re.compile(r"(?:[=(\[{,:+%]|\breturn|\byield|\bin|\band|\bor|\bnot|\bprint)\s*$")
_HEADER_END = re.compile(r"[:(\[{,=]\s*(?:#.*)?$")
_PY_CONTINUES = re.compile(r"(?:else|elif|except|finally|case)\b")
_PY_DEF = re.compile(r"[ \t]*(?:async[ \t]+def|def|class)[ \t]")
_WORD_OR_QUOTE = re.compile(r"[\w\"'`]")
# A line ending in a block's `{` (not an object literal after `=`, `return`, `(`, `,`, `:`).
_BLOCK_HEADER = re.compile(r"(?:\)|\belse|\bdo|\btry|\bfinally|=>|\b(?:class|struct|interface|enum|namespace)\b[^=]*)\s*\{$")


# ------------------------------------------------------------------------ the window's start

def start_state(text: str, spec: LanguageSpec) -> LexState | None:
    """The lexical state at the first character of `text`, a piece of a file cut anywhere:
    None (code), or inside a Python triple-quoted string or a C-family block comment."""
    if spec.family == "python":
        match = _PY_TRIPLE.search(text)
        if match is not None and _is_closer(text, match.start(), match.end()):
            return LexState("string", match.group(), escapes=True, multiline=True)
        return None
    close = text.find("*/")
    if close >= 0 and text.rfind("/*", 0, close) < 0:
        return LexState("block_comment", "*/", escapes=False, multiline=True)
    return None


def _is_closer(text: str, start: int, body: int) -> bool:
    """Whether the triple quote at `start` (its body from `body`) closes a string the text
    started in rather than opening one."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", body)
    line_end = len(text) if line_end < 0 else line_end
    if text.find(text[start:body], body, line_end) >= 0:
        return False  # a whole string on one line: `"""One line."""`
    before = _STRING_PREFIX.sub("", text[line_start:start].rstrip())
    if before:
        # Text before it: an opener after code that wants a value, a closer after prose.
        return line_start == 0 or _OPENS_VALUE.search(before) is None
    if line_start == 0:  # the first line, alone: what follows it up to the next such quote tells
        following = text.find(text[start:body], body)
        return _reads_as_code(text[line_end + 1 : following if following >= 0 else len(text)])
    after = text[body:line_end].strip()
    if after and _WORD_OR_QUOTE.match(after):
        return False  # text follows on its line: the first line of a docstring
    above = _previous_code_line(text, line_start)
    # A docstring opens after a header (`def f():`) or inside an expression that wants a value.
    return above is not None and _HEADER_END.search(above) is None


_CODE_LINES_TRIED = 3  # lines dropped from the end of a piece that does not parse (a block the cursor cut)


def _reads_as_code(piece: str) -> bool:
    """Whether `piece` (whole lines) is Python code rather than a docstring's prose: it parses
    (dedented; a last line or two the window's end cut may be dropped) and holds a statement
    other than a bare name or literal (`Summary` alone parses too)."""
    lines = textwrap.dedent(piece).rstrip().split("\n")
    for drop in range(min(_CODE_LINES_TRIED, len(lines))):
        try:
            body = ast.parse("\n".join(lines[: len(lines) - drop])).body
        except (SyntaxError, ValueError):
            continue
        return any(not (isinstance(node, ast.Expr) and isinstance(node.value, (ast.Name, ast.Constant))) for node in body)
    return False


def _previous_code_line(text: str, line_start: int) -> str | None:
    end = line_start - 1
    while end > 0:
        start = text.rfind("\n", 0, end) + 1
        line = text[start:end]
        if line.strip():
            return line.rstrip()
        end = start - 1
    return None


def crop(prefix: str, suffix: str) -> tuple[int, int]:
    """Where a window of at most `MAX_BEFORE` / `MAX_AFTER` characters around the cursor
    starts in `prefix` and ends in `suffix` (at line starts, when there is one to cut at)."""
    start = 0
    if len(prefix) > MAX_BEFORE:
        newline = prefix.find("\n", len(prefix) - MAX_BEFORE, len(prefix) - 1)
        start = newline + 1 if newline >= 0 else len(prefix) - MAX_BEFORE
    end = len(suffix)
    if len(suffix) > MAX_AFTER:
        newline = suffix.rfind("\n", 0, MAX_AFTER)
        end = newline + 1 if newline > 0 else MAX_AFTER
    return start, end


_LAST_WORD = re.compile(r"[A-Za-z_$][\w$]*\Z")


def cut_word(window: str) -> str | None:
    """The piece of a word the window's end cut off (`for i in ls` of `lst`): the window's
    last characters when they are a word with no line end after it, and the window spells
    that word nowhere else. Its reads vouch for no name; None when there is no such piece."""
    match = _LAST_WORD.search(window)
    if match is None:
        return None
    before = window[match.start() - 1 : match.start()]  # '' at the window's start
    if before.isalnum() or before in ("_", "$", "."):  # inside a longer token, or an attribute
        return None
    word = match.group()
    return None if spells_word(window[: match.start()], word) else word


# ----------------------------------------------------------------------- one scan, repairs

@dataclass(frozen=True)
class Scan:
    """The window lexed once (shared by the repair and the region).

    A window that starts in code may start on a line it cut (` -> bool:`, `ength; i++) {`):
    when that first line does not parse on its own, it is replaced by what it leaves open
    (its unclosed brackets, the literal it ends in) and the rest is lexed after it. Token
    offsets are in prefix coordinates.
    """

    state: LexState | None  # at the window's first character
    drop: int  # prefix[:drop] (the first line, cut) is replaced by `keep`
    keep: str
    prefix_tokens: list[Tok]  # of prefix[drop:], with line ends for Python
    cursor_state: LexState | None  # at the cursor
    suffix_tokens: list[Tok]
    end_state: LexState | None  # at the window's end


@request_memo
def scan(prefix: str, suffix: str, language: str) -> Scan:
    spec = SPECS[language]
    newlines = spec.family == "python"
    state = start_state(prefix, spec)
    drop, keep, rest_state = 0, _opener(state), state
    newline = prefix.find("\n")
    if state is None and newline >= 0 and not _whole_line(prefix[:newline], language):
        first = lex(prefix[:newline], spec, None, newlines=False)
        rest_state = first.end_state if first.end_state is not None and first.end_state.multiline else None
        drop = newline
        keep = "".join(tok.char for tok in unmatched_openers(first.tokens)) + _opener(rest_state)
    before = lex(prefix[drop:], spec, rest_state, newlines=newlines)
    tokens = [Tok(t.kind, t.start + drop, t.end + drop, t.char) for t in before.tokens] if drop else before.tokens
    after = lex(suffix, spec, before.end_state, newlines=newlines)
    return Scan(state, drop, keep, tokens, before.end_state, after.tokens, after.end_state)


def _whole_line(line: str, language: str) -> bool:
    """Whether a window's first line parses on its own (else the window cut it)."""
    root = new_parser(language).parse(line.encode("utf-8", "surrogatepass")).root_node
    return not root.has_error


def _opener(state: LexState | None) -> str:
    if state is None:
        return ""
    return "/*" if state.kind == "block_comment" else state.close


@dataclass(frozen=True)
class Repair:
    """How to make a window lex and parse as the file does: `head + prefix[drop:]`, the
    completion, then `suffix + tail` (`tail` is `closing_tail(..., "")`; an alternative that
    opens or closes brackets gets its own)."""

    head: str = ""
    drop: int = 0
    tail: str = ""


@dataclass(frozen=True)
class _Open:
    """A bracket open at some point, and the indentation of the line it opens on."""

    char: str
    indent: int
    end: int = -1  # for one the completion opens: where it ends in line_prefix + completion


@dataclass(frozen=True)
class _Brackets:
    at_cursor: tuple[_Open, ...]  # open at the cursor, outermost first
    taken: int  # closers the suffix has for brackets opened before it
    opened: tuple[_Open, ...]  # what the suffix opens and leaves open, outermost first
    last_indent: int  # of the suffix's last non-blank line after a line end; -1: none
    literal: str  # the closer of the literal the window ends in
    own_line: int = 0  # the innermost of `at_cursor` opened on the cursor's line (the hole's to close)


@request_memo
def repair(prefix: str, suffix: str, language: str | None) -> Repair:
    """Before the window: the openers of the brackets it closes without opening (outermost
    first), then what its first line leaves open (`Scan`); after it: `closing_tail`.

    A closer after the cursor that nothing in the window opens is ambiguous: the window may
    start inside its block, or the hole should write its opener (a header the hole lost).
    Closers of enclosing blocks are indented less than the cursor's line; those beyond the
    enclosing blocks the prefix opens are taken as the window's.
    """
    name = normalize_language(language)
    if name is None:
        return Repair()
    found = scan(prefix, suffix, name)
    opened: list[Tok] = [Tok(OPEN, -1, -1, char) for char in found.keep if char in OPENERS]
    needed: list[Tok] = []  # closers in the prefix without an opener in it
    _track(found.prefix_tokens, opened, needed)
    width = indent_width(prefix, prefix.rfind("\n") + 1)
    enclosing = sum(_line_indent(prefix, max(tok.start, 0)) < width for tok in opened)
    unopened: list[Tok] = []  # closers in the suffix without an opener in it
    suffix_opened: list[Tok] = []
    _track(found.suffix_tokens, suffix_opened, unopened)
    low = [tok for tok in unopened if _line_indent(suffix, tok.start, width) < width]
    window_closers = low[enclosing:] if len(low) > enclosing else []
    head = "".join(CLOSERS[tok.char] for tok in reversed(needed + window_closers)) + found.keep
    return Repair(head, found.drop, closing_tail(prefix, suffix, name, "", found.cursor_state))


def closing_tail(prefix: str, suffix: str, language: str, completion: str, cursor_state: LexState | None) -> str:
    """Closers for what the window's end cuts open once `completion` is in the hole: the
    literal the suffix ends in, the brackets the suffix opens and leaves open, and the
    brackets open at the end whose line is indented less than the suffix's last line (the
    window ends inside their block). Innermost first. Others stay open: a bracket opened in
    the cursor's statement that nothing closes is the hole's to close."""
    found = _brackets(prefix, suffix, language)
    stack = list(found.at_cursor)
    line_prefix = prefix[prefix.rfind("\n") + 1 :]
    text = line_prefix + completion
    if completion and any(char in completion for char in "()[]{}"):
        for tok in lex(completion, SPECS[language], cursor_state, newlines=False).tokens:
            if tok.kind == OPEN:
                stack.append(_Open(tok.char, _line_indent(text, tok.start + len(line_prefix)), end=tok.end + len(line_prefix)))
            elif tok.kind == CLOSE and stack:
                stack.pop()
    del stack[len(stack) - min(found.taken, len(stack)) :]
    if suffix.strip():
        cut = [item for item in stack if item.indent < found.last_indent]
    else:
        # The window (or the document) ends with the completion: the blocks around its last
        # line are open by nature, and so is a block its last line opens (its body comes next).
        last = text.rstrip()
        last_indent = _line_indent(last, len(last))
        header = _BLOCK_HEADER.search(last) is not None
        cut = [item for item in stack if item.indent < last_indent or (header and item.char == "{" and item.end == len(last))]
    return found.literal + "".join(OPENERS[item.char] for item in reversed([*cut, *found.opened]))


class EndBalance(NamedTuple):
    """What of a completion the window can vouch for at its end (`end_balance`)."""

    keep: int  # completion[:keep]
    unsure: bool  # even that closes a bracket the window leaves open, or leaves open one it opens


def end_balance(prefix: str, suffix: str, language: str, completion: str) -> EndBalance:
    """Where the window's end is open (a bracket opened before the cursor's line is still
    open after the suffix: the window was cut inside it, or the document is unfinished),
    the repair closes whatever is left open, so the window cannot tell whether the file
    stays whole with a completion that closes such a bracket (the file may close it later,
    after more code) or that opens one it leaves open (the file's closers further on would
    then be one short). Such a completion is cut back to its last line end where the
    brackets it opened are closed and it closed none opened before the cursor's line
    (those opened on that line are the hole's to close); when nothing is left, the whole
    completion is kept and `unsure`. Elsewhere the window shows what happens: keep it all."""
    found = _brackets(prefix, suffix, language)
    if len(found.at_cursor) - found.own_line <= 0 or len(found.at_cursor) <= found.taken:
        return EndBalance(len(completion), False)  # nothing opened before the cursor's line is left open
    depth, own, keep = 0, found.own_line, 0
    for tok in lex(completion, SPECS[language], scan(prefix, suffix, language).cursor_state, newlines=True).tokens:
        if tok.kind == OPEN:
            depth += 1
        elif tok.kind == CLOSE:
            if depth > 0:
                depth -= 1
            elif own > 0:
                own -= 1
            else:
                return EndBalance(keep or len(completion), keep == 0)  # closes one opened before the cursor's line
        elif tok.kind == NEWLINE and depth == 0:
            keep = tok.start
    # What it leaves open the suffix's stray closers close first (a header whose body the suffix has).
    if depth > found.taken:
        return EndBalance(keep or len(completion), keep == 0)
    return EndBalance(len(completion), False)


@request_memo
def _brackets(prefix: str, suffix: str, language: str) -> _Brackets:
    found = scan(prefix, suffix, language)
    at_cursor: list[_Open] = [_Open(char, 0) for char in found.keep if char in OPENERS]
    for tok in found.prefix_tokens:
        if tok.kind == OPEN:
            at_cursor.append(_Open(tok.char, _line_indent(prefix, tok.start)))
        elif tok.kind == CLOSE and at_cursor:
            at_cursor.pop()
    taken = 0
    opened: list[_Open] = []
    for tok in found.suffix_tokens:
        if tok.kind == OPEN:
            opened.append(_Open(tok.char, 0))
        elif tok.kind == CLOSE:
            if opened:
                opened.pop()
            else:
                taken += 1
    end = found.end_state
    literal = end.close if end is not None and end.kind != "line_comment" else ""
    line_start = prefix.rfind("\n") + 1
    own_line = min(_depth(tok for tok in found.prefix_tokens if tok.start >= line_start), len(at_cursor))
    return _Brackets(tuple(at_cursor), taken, tuple(opened), _last_indent(suffix), literal, own_line)


def _last_indent(text: str) -> int:
    """Indentation of the last non-blank line of `text` (-1 when it has none after a line end)."""
    content = text.rstrip()
    newline = content.rfind("\n")
    return -1 if newline < 0 else indent_width(content, newline + 1)


def _line_indent(text: str, at: int, first: int | None = None) -> int:
    """Indentation of the line of offset `at`; `first` is that of the text's first line when it
    continues a line before the text (the cursor's)."""
    start = text.rfind("\n", 0, at) + 1
    return first if start == 0 and first is not None else indent_width(text, start)


def _track(tokens: list[Tok], opened: list[Tok], unopened: list[Tok]) -> None:
    """Match the brackets of `tokens` after those in `opened`: what stays open is left in
    `opened`, closers without an opener are added to `unopened`."""
    for tok in tokens:
        if tok.kind == OPEN:
            opened.append(tok)
        elif tok.kind == CLOSE:
            if opened:
                opened.pop()
            else:
                unopened.append(tok)


# -------------------------------------------------------------------------- the region

@dataclass(frozen=True)
class Region:
    """The whole span `prefix[start:]` + `suffix[:end]` around the cursor."""

    start: int
    end: int
    indent: int  # indentation of the line at `start` (CPython needs a header before it when > 0)
    statement: int  # where the statement the cursor is in begins (an offset in the prefix)
    state: LexState | None = None  # the lexical state at `start` (not None: the region is not whole)
    open_end: bool = False  # it ends where the window does, not where its construct does
    in_function: bool = False  # it starts at a `def` line (the function around the cursor)


def indent_width(text: str, start: int) -> int:
    """Indentation width of the line starting at `start` (tabs to 8 columns)."""
    width = 0
    for char in text[start : start + 256]:
        if char == " ":
            width += 1
        elif char == "\t":
            width = (width // 8 + 1) * 8
        else:
            break
    return width


@dataclass(frozen=True)
class _Line:
    start: int
    indent: int
    safe: bool  # outside literals and brackets, and a statement may begin here


def _lines(text: str, tokens: list[Tok], floor: int) -> list[_Line]:
    """Python code lines of `text` from offset `floor` (not blank, not only a comment) with
    their safety, in one pass over its tokens; never its first line (the window may cut it).
    A line is outside brackets when the depth there is the lowest the text reaches (a
    bracket opened before the window shows as a closer without opener)."""
    depth = min_depth = 0
    line_start = 0
    starts: list[tuple[int, int]] = []  # (line start, bracket depth there)
    comment_at: dict[int, int] = {}  # line start -> where a comment on that line begins
    for tok in tokens:
        if tok.kind == OPEN:
            depth += 1
        elif tok.kind == CLOSE:
            depth -= 1
            min_depth = min(min_depth, depth)
        elif tok.kind == COMMENT and tok.start >= line_start:
            comment_at.setdefault(line_start, tok.start)
        elif tok.kind == NEWLINE:
            if tok.end >= floor:
                starts.append((tok.end, depth))
            line_start = tok.end
    lines: list[_Line] = []
    previous = ""
    for start, depth_there in starts:
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        code = text[start : min(comment_at.get(start, end), end)].rstrip()
        content = code.lstrip(" \t")
        if not content:
            continue  # blank, or only a comment
        safe = depth_there == min_depth and not previous.endswith("\\") and _PY_CONTINUES.match(content) is None
        lines.append(_Line(start, indent_width(text, start), safe))
        previous = code
    return lines


@request_memo
def find_region(prefix: str, suffix: str) -> Region:
    """The whole span around the cursor of a Python window (see the module docstring)."""
    found = scan(prefix, suffix, "python")
    cursor_line = prefix.rfind("\n") + 1
    lines = _lines(prefix, found.prefix_tokens, max(cursor_line - SPAN, 0))
    start, indent, statement = _region_start(prefix, lines, cursor_line, cursor_indent(prefix[cursor_line:], suffix))
    # Brackets open at the cursor that the suffix does not close are the hole's to close.
    depth = _depth(tok for tok in found.prefix_tokens if tok.start >= start)
    lowest = running = depth
    for tok in found.suffix_tokens:
        running += (tok.kind == OPEN) - (tok.kind == CLOSE)
        lowest = min(lowest, running)
    header = start < len(prefix) and _PY_DEF.match(prefix, start) is not None
    end, open_end = _region_end(suffix, found.suffix_tokens, depth - max(lowest, 0), indent, header)
    in_function = header and _PY_DEF.match(prefix, start).group().strip() != "class"
    return Region(start, end, indent, statement, found.state if start == 0 else None, open_end, in_function)


def _depth(tokens: Iterable[Tok]) -> int:
    depth = 0
    for tok in tokens:
        depth += tok.kind == OPEN
        depth -= tok.kind == CLOSE and depth > 0
    return depth


def cursor_indent(line_prefix: str, suffix: str) -> int | None:
    """The indentation of the statement at the cursor: its line's, or when that line is blank
    (the completion will indent it), the next suffix line's; None when nothing tells."""
    newline = suffix.find("\n")
    line = line_prefix + (suffix if newline < 0 else suffix[:newline])
    if line.strip():
        return indent_width(line, 0)
    following = _next_code_line(suffix, newline + 1) if newline >= 0 else None
    return indent_width(suffix, following[0]) if following is not None else None


def _region_start(piece: str, lines: list[_Line], cursor_line: int, cursor_indent: int | None) -> tuple[int, int, int]:
    """(offset and indentation of the region's first line, start of the cursor's statement) in `piece`."""
    cursor = lines[-1] if lines and lines[-1].start == cursor_line else None
    statement = cursor_line
    if cursor is not None and not cursor.safe:  # the cursor line continues a statement begun above
        statement = next((line.start for line in reversed(lines) if line.safe and line.start < cursor_line), 0)
    need = cursor.indent if cursor is not None and cursor.safe else cursor_indent
    start = cursor if cursor is not None and cursor.safe else None
    for line in reversed(lines):
        if line is cursor or not line.safe:
            continue
        if need is None or line.indent < need or (start is None and line.indent == need):
            need, start = line.indent, line  # a line enclosing everything after it
            if _PY_DEF.match(piece, line.start):
                break  # the innermost function or class around the cursor is region enough
        elif line.indent == need and need > 0:
            start = line  # an earlier statement at the same level: the window may start inside its block
        if need == 0:
            break
    if start is None:
        return 0, indent_width(piece, 0), min(statement, cursor_line)
    return start.start, start.indent, max(statement, start.start)


def _region_end(suffix: str, tokens: list[Tok], depth: int, indent: int, header: bool) -> tuple[int, bool]:
    """Where the region ends in the suffix: before the first line outside the region's construct
    (indented less than its first line; with `header`, a def or class line, no deeper),
    else at the last line end after which nothing is left open (no bracket, no block header
    whose body the window cut off); and whether that end is the window's."""
    last_safe = 0
    comment_at = -1  # where a comment on the current line starts
    for tok in tokens:
        if tok.kind == OPEN:
            depth += 1
        elif tok.kind == CLOSE:
            depth = max(depth - 1, 0)  # a closer without opener: the hole's to open
        elif tok.kind == COMMENT:
            comment_at = tok.start
        elif tok.kind == NEWLINE:
            line_start = suffix.rfind("\n", 0, tok.start) + 1
            code = suffix[line_start : comment_at if comment_at >= line_start else tok.start].rstrip()
            comment_at = -1
            if depth > 0 or code.endswith("\\"):
                continue
            following = _next_code_line(suffix, tok.end)
            if following is not None:
                start, content = following
                width = indent_width(suffix, start)
                if (width < indent or (width == indent and (header or indent == 0))) and _PY_CONTINUES.match(content) is None:
                    return tok.start, False
            if not code.endswith(":"):
                last_safe = tok.end if following is None else tok.start
    return last_safe, bool(suffix.strip())  # a blank suffix: the cursor is at the end of the document


def construct_end(suffix: str, tokens: list[Tok], indent: int) -> int | None:
    """Where a Python construct whose header line (a `def`) is indented `indent` ends in
    `suffix` (its tokens from `scan`): before the first line after the cursor's outside it;
    None when the window ends first."""
    end, open_end = _region_end(suffix, tokens, 0, indent, header=True)
    return None if open_end or not suffix.strip() else end


def _next_code_line(text: str, pos: int) -> tuple[int, str] | None:
    while pos < len(text):
        end = text.find("\n", pos)
        line = text[pos:] if end < 0 else text[pos:end]
        content = line.strip()
        if content and not content.startswith("#"):
            return pos, content
        if end < 0:
            return None
        pos = end + 1
    return None

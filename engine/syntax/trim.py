"""Cut a raw completion where it leaves the syntactic unit the cursor is in.

The unit depends on where the cursor is:

* mid-line (code before the cursor on its line): the rest of that statement — up to the
  line end, or further while brackets the completion opened are open, or through the body
  of a block the line opens (Python `:`, a `{` on the line);
* at the start of a line: the statement (simple or compound, with its `else`/`except`/...
  clauses) that begins there;
* at the start of an empty body (the line above opens a block, the suffix has no body):
  the whole body, up to the first line indented less than it;
* inside a string or comment: the rest of it (a line comment: the rest of the line).

Whatever the unit, the cut also comes earlier: before a closing bracket the completion did
not open when the suffix already closes it (unless the same line opens one in its place,
as `} else {` does); where the completion starts repeating the suffix (its next line at
the same indentation, or the rest of the cursor line); at a dedent below the cursor's
block. A last line cut off by the token budget is dropped first, and a copy of the name the cursor is in
or follows, written again at the start, goes (`without_stutter`). A unit's indentation is that of
its first line of code (not of a leading comment).

This module is lexical (see lexer.py) and pure: `find_cut` is what both trimming and the
early-stop hook use. Whether the result parses is checked by checks.py; postprocess.py
falls back to the earlier line ends listed in `Cut.line_ends` when it does not, and to
later ones when the file needs more than the unit to be whole again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kspec.engine.syntax.context import CursorContext, code_of_line, indent_of
from kspec.engine.syntax.lexer import CLOSE, CLOSERS, COMMENT, NEWLINE, OPEN, STRING, Tok, lex, unmatched_openers

MIDLINE, STATEMENT, BODY = "midline", "statement", "body"

# Reasons a cut is made; the inline ones do not end at a line end.
UNIT, DEDENT, REPEAT, END, BRACKET, REPEAT_INLINE, STRING_END, COMMENT_END = (
    "unit", "dedent", "repeat", "end", "bracket", "repeat-inline", "string-end", "comment-end",
)
INLINE_REASONS = frozenset({BRACKET, REPEAT_INLINE, STRING_END})

# A C-family line that ends in one of these continues on the next line.
_C_CONTINUATION = frozenset(",([{=+-*/%&|^<>?.:!")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The name the cursor is in or follows, with its qualifiers (`users.`, `os.path.jo`, `retu`)
_NAME_AT_CURSOR = re.compile(r"(?<![\w$.])(?:[A-Za-z_$][\w$]*\.)*[A-Za-z_$][\w$]*\.?$")
MIN_STUTTER = 3  # shorter names repeat in real words (`b` + `box` is `bbox`)


@dataclass(frozen=True)
class Cut:
    end: int  # keep completion[:end]
    reason: str
    line_ends: tuple[int, ...] = ()  # earlier line ends inside the unit, latest first (fallbacks)


@dataclass(frozen=True)
class _NextLine:
    text: str  # the line (absolute: it starts at column 0)
    complete: bool  # a newline follows it (its first word and indentation are final)


def drop_truncated_line(completion: str) -> str:
    """Drop the last line when the token budget cut it off (keep it if it is the only one)."""
    newline = completion.rfind("\n")
    if newline < 0 or not completion[:newline].strip():
        return completion
    return completion[: newline + 1]


def without_stutter(line_prefix: str, completion: str) -> str:
    """`completion` less a copy of the name at the end of `line_prefix` that it starts with: a
    model that writes the name again instead of going on (`users.` + `users.find(u)` ->
    `find(u)`, `retu` + `return x` -> `rn x`, `get` + `get_value()` -> `_value()`); names of
    `MIN_STUTTER` characters or more."""
    found = _NAME_AT_CURSOR.search(line_prefix)
    if found is None or len(found.group(0)) < MIN_STUTTER or not completion.startswith(found.group(0)):
        return completion
    return completion[found.end() - found.start() :]


def find_cut(ctx: CursorContext, completion: str, *, final: bool = True) -> Cut | None:
    """Where the unit ends in `completion`.

    With `final=False` the completion is still being generated: None means "not decided
    yet" (the unit may still go on), and a Cut is returned only when text after it shows
    the unit is over.
    """
    if ctx.spec is None:
        tokens = [Tok(NEWLINE, m.start(), m.end()) for m in re.finditer("\n", completion)]
        lex_open = False
    else:
        result = lex(completion, ctx.spec, ctx.start_state)
        tokens, lex_open = result.tokens, result.end_state is not None
    return _Scanner(ctx, completion, tokens, lex_open, final).run()


def finalize(ctx: CursorContext, completion: str, cut: Cut | int) -> str | None:
    """The text to show for a cut: trailing whitespace normalised; None if nothing is left."""
    end, reason = (cut, UNIT) if isinstance(cut, int) else (cut.end, cut.reason)
    text = completion[:end]
    inline = reason in INLINE_REASONS and "\n" not in text
    if not inline:
        text = text.rstrip()
    if not text.strip():
        return None
    if not inline and not ctx.mid_line and ctx.suffix_line_rest.strip():
        # The cursor sits before code on its line: that code must stay on a line of its own.
        text += "\n" + ctx.line_prefix
    return text


def trim(ctx: CursorContext, completion: str, *, truncated: bool = False) -> str | None:
    """The trimmed completion, or None when nothing worth showing is left."""
    if truncated:
        completion = drop_truncated_line(completion)
    completion = without_stutter(ctx.line_prefix, completion)
    cut = find_cut(ctx, completion, final=True) or Cut(len(completion), END)
    return finalize(ctx, completion, cut)


def own_depth(tokens: list[Tok], pos: int) -> int:
    """The brackets a completion (`tokens`, lexed) opened before `pos` and has not closed there."""
    depth = 0
    for tok in tokens:
        if tok.start >= pos:
            break
        if tok.kind == OPEN:
            depth += 1
        elif tok.kind == CLOSE:
            depth = max(depth - 1, 0)  # one the prefix opened: none of its own
    return depth


class _Scanner:
    def __init__(self, ctx: CursorContext, text: str, tokens: list[Tok], lex_open: bool, final: bool) -> None:
        self.ctx = ctx
        self.text = text
        self.tokens = tokens
        self.lex_open = lex_open  # the text ends inside a literal or comment
        self.final = final
        self.python = ctx.spec is not None and ctx.spec.family == "python"
        self.clauses = ctx.spec.clause_keywords if ctx.spec is not None else frozenset()
        self.annotations = ctx.spec.annotation_prefixes if ctx.spec is not None else ()
        self.line_ends: list[int] = []

    def cut(self, end: int, reason: str) -> Cut:
        return Cut(end, reason, tuple(e for e in reversed(self.line_ends) if e < end))

    def undecided(self) -> Cut | None:
        return self.cut(len(self.text), END) if self.final else None

    # -- set-up ---------------------------------------------------------------------------

    def run(self) -> Cut | None:
        ctx, text = self.ctx, self.text
        state = ctx.start_state
        if state is not None and self.tokens:
            first = self.tokens[0]
            if state.kind == "line_comment":
                return self.cut(first.end, COMMENT_END) if first.end < len(text) else self.undecided()
            if ctx.string_closed_by_suffix and self._closes_string(first):
                return self.cut(first.end - len(state.close), STRING_END)

        first_newline = text.find("\n")
        first_line = text if first_newline < 0 else text[:first_newline]
        at_eol = ctx.mid_line and state is None and first_newline >= 0 and not first_line.strip()
        if ctx.mid_line and not at_eol:
            return self.scan(MIDLINE, indent_of(ctx.line_prefix), self._inline_repeat(first_line))

        # The unit begins on the first non-blank line of the completion; its indentation is
        # that of its first line of code (a model often puts a comment at another depth).
        head = None if at_eol else ctx.line_prefix + first_line
        if head is not None and head.strip():
            repeat = self.repeats_suffix(0, ctx.line_prefix)
            if repeat:
                return self.cut(0, REPEAT)
            if repeat is None:
                return None
        code_line = self._first_code_line(head, first_newline)
        if code_line is None:
            return self.undecided()
        unit_indent = indent_of(code_line)
        opens = ctx.cursor_line_opens_block if at_eol else ctx.prev_line_opens_block
        next_indent = ctx.suffix_next_indent
        body_empty = (
            next_indent is None
            or next_indent < unit_indent
            or (ctx.suffix_next_line or "").lstrip()[:1] in (")", "]", "}")
        )
        return self.scan(BODY if opens and body_empty else STATEMENT, unit_indent, None)

    def _first_code_line(self, head: str | None, first_newline: int) -> str | None:
        """The first line that is not blank or only a comment (the head is the cursor line)."""
        lines = [] if head is None else [head]
        if first_newline >= 0:
            lines += self.text[first_newline + 1 :].split("\n")
        nonblank = [line for line in lines if line.strip()]
        code = next((line for line in nonblank if not self._comment_only(line)), None)
        return code if code is not None else (nonblank[0] if nonblank else None)

    def _comment_only(self, line: str) -> bool:
        stripped = line.lstrip()
        if self.ctx.spec is None:
            return False
        return stripped.startswith("#") if self.python else stripped.startswith(("//", "/*", "*"))

    def _closes_string(self, first: Tok) -> bool:
        close = self.ctx.start_state.close if self.ctx.start_state else ""
        body = self.text[: first.end]
        if first.end == len(self.text) and self.lex_open:
            return False
        return len(body) >= len(close) and body.endswith(close) and not body.endswith("\\" + close)

    def _inline_repeat(self, first_line: str) -> int | None:
        """Where the completion's first line starts repeating the rest of the cursor line."""
        rest = self.ctx.suffix_line_rest.strip()
        if not rest:
            return None
        # The literal the cursor is in (if any) is where a repeat of its closing part shows up.
        literals = [
            t for i, t in enumerate(self.tokens)
            if t.kind in (STRING, COMMENT) and not (i == 0 and self.ctx.start_state is not None)
        ]
        pos = first_line.find(rest)
        while pos >= 0:
            glued = _WORD.match(rest[0]) and pos > 0 and (first_line[pos - 1].isalnum() or first_line[pos - 1] == "_")
            inside_literal = any(t.start < pos < t.end - 1 for t in literals)
            # `return [|]` + `[a, b] for a in xs]`: the first `]` closes the completion's own `[`
            closes_own = rest[0] in CLOSERS and own_depth(self.tokens, pos) > 0
            if not glued and not inside_literal and not closes_own:
                if self.ctx.suffix_line_rest[:1].isspace():  # the suffix brings its own space
                    while pos > 0 and first_line[pos - 1] in " \t":
                        pos -= 1
                return pos
            pos = first_line.find(rest, pos + 1)
        return None

    # -- the scan -------------------------------------------------------------------------

    def scan(self, mode: str, unit_indent: int, repeat_at: int | None) -> Cut | None:
        cut, pending = self._scan(mode, unit_indent, repeat_at)
        if pending is not None and cut is not None and cut.end > pending:
            # Generating, and the line after `pending` may repeat the suffix: either way
            # the unit ends no later than the cut found after it.
            return self.cut(pending, REPEAT)
        return cut

    def _scan(self, mode: str, unit_indent: int, repeat_at: int | None) -> tuple[Cut | None, int | None]:
        ctx, text = self.ctx, self.text
        stack: list[str] = []
        closed_prefix = 0
        finishing = False  # closed a bracket the suffix does not close: the unit ends on this line
        seen_code = mode == MIDLINE
        has_block = False  # the unit opened a block (Python `:` line, `{` at the unit's level)
        first_word = ""
        line_start = 0
        last_comment: Tok | None = None
        pending: int | None = None  # a line end where the unit may already have ended

        reopen_at = -1  # an opener that takes the place of a prefix bracket just closed
        for index, tok in enumerate(self.tokens):
            if repeat_at is not None and tok.start >= repeat_at:
                return self.cut(repeat_at, REPEAT_INLINE), pending
            kind = tok.kind
            if kind == OPEN:
                if tok.start == reopen_at:
                    continue  # `} else {`: the prefix's block goes on under a new brace
                if not stack and tok.char == "{":
                    has_block = True
                stack.append(tok.char)
            elif kind == CLOSE:
                if stack:
                    stack.pop()
                    continue
                j = closed_prefix
                if j >= len(ctx.open_brackets) or CLOSERS[tok.char] != ctx.open_brackets[-1 - j]:
                    return self.cut(tok.start, BRACKET), pending
                if j < ctx.suffix_closes:
                    reopen_at = reopened_on_line(self.tokens, index)
                    if reopen_at >= 0:
                        continue
                    return self.cut(tok.start, BRACKET), pending
                closed_prefix += 1
                finishing = True
            elif kind == COMMENT:
                last_comment = tok
            elif kind == NEWLINE:
                newline = tok.start
                line = text[line_start:newline]
                if last_comment is not None and last_comment.start >= line_start:
                    line = text[line_start : last_comment.start]
                last_comment = None
                if stack:
                    if self.repeats_suffix(newline + 1):
                        return self.cut(newline, REPEAT), pending
                    line_start = newline + 1
                    continue
                code = code_of_line(line, None)
                if mode == MIDLINE and line_start == 0:
                    code = code_of_line(ctx.line_prefix, ctx.spec) + code
                stripped = code.strip()
                if stripped and not stripped.startswith(self.annotations or ("\0",)):
                    if not seen_code:
                        match = _WORD.match(stripped)
                        first_word = match.group() if match else ""
                    seen_code = True
                if finishing and seen_code:
                    return self.cut(newline, UNIT), pending
                decided = self.at_line_end(
                    mode, unit_indent, newline, stripped, seen_code, has_block, first_word
                )
                if decided is _PENDING:
                    pending = newline
                elif decided is not _CONTINUE:
                    return decided, pending  # a Cut, or None (undecided while generating)
                if self.python and stripped.endswith(":"):
                    has_block = True
                if seen_code:
                    self.line_ends.append(newline)
                line_start = newline + 1

        if repeat_at is not None:
            return self.cut(repeat_at, REPEAT_INLINE), pending
        return self.undecided(), pending

    def repeats_suffix(self, pos: int, head: str = "") -> bool | None:
        return repeats_lines(self.text, pos, self.ctx.suffix_lines, self.final, head)

    def at_line_end(
        self, mode: str, unit_indent: int, newline: int, code: str, seen_code: bool,
        has_block: bool, first_word: str,
    ) -> Cut | None | object:
        """At a line end outside brackets: cut here, go on (_CONTINUE), or undecided (None)."""
        nxt = _next_nonblank(self.text, newline + 1)
        if nxt is None:
            return self.cut(newline, END) if self.final else None
        repeat = self.repeats_suffix(newline + 1)
        if repeat:
            return self.cut(newline, REPEAT)
        decided = self.structure(mode, unit_indent, newline, code, seen_code, has_block, first_word, nxt)
        if repeat is None and not isinstance(decided, Cut):
            return _PENDING  # it may turn into a repeat of the suffix: the unit ends here or later
        return decided

    def structure(
        self, mode: str, unit_indent: int, newline: int, code: str, seen_code: bool,
        has_block: bool, first_word: str, nxt: _NextLine,
    ) -> Cut | None | object:
        """The decision from indentation, continuation and clause keywords alone."""
        undecided_line = not nxt.complete and not self.final
        if not seen_code:
            return _CONTINUE
        last = code[-1:]
        if last == "\\":
            return _CONTINUE
        if self.python and last == ":":
            return _CONTINUE
        if not self.python and last in _C_CONTINUATION and not code.endswith(("++", "--")):
            return _CONTINUE
        body = nxt.text.lstrip()
        if body[:1] in (")", "]", "}"):
            return _CONTINUE  # the closer decides (see the bracket rule)
        next_indent = indent_of(nxt.text)
        word_match = _WORD.match(body)
        word = word_match.group() if word_match else ""
        if undecided_line and word_match is not None and word_match.end() == len(body):
            if any(k.startswith(word) for k in self.clauses):
                return None  # "el" may become "else"
        if next_indent < unit_indent:
            return self.cut(newline, DEDENT)
        if mode == BODY:
            return _CONTINUE
        if self.python:
            if has_block and (next_indent > unit_indent or word in self.clauses):
                return _CONTINUE
            return self.cut(newline, UNIT)
        if word in self.clauses and last in (";", "}") and (word != "while" or first_word == "do"):
            return _CONTINUE
        if next_indent > unit_indent and last not in (";", "}"):
            return _CONTINUE
        return self.cut(newline, UNIT)


_CONTINUE = object()
_PENDING = object()  # generating: the line being written may yet repeat the suffix


def _next_nonblank(text: str, pos: int) -> _NextLine | None:
    while pos < len(text):
        end = text.find("\n", pos)
        line = text[pos:] if end < 0 else text[pos:end]
        if line.strip():
            return _NextLine(line, end >= 0)
        if end < 0:
            return None
        pos = end + 1
    return None


def repeats_lines(text: str, pos: int, expected: list[str] | tuple[str, ...], final: bool, head: str = "") -> bool | None:
    """Do the completion's lines from `pos` (the first one after `head`) repeat the suffix's next
    lines (`expected`)? Two lines must match when the completion has two, so that a line the code
    really needs twice is not taken for a repeat. None: still generating (not `final`), and the
    lines so far cannot tell."""
    if not expected:
        return False
    needed = min(2, len(expected))
    matched = 0
    while matched < needed:
        end = text.find("\n", pos)
        line = (head + (text[pos:] if end < 0 else text[pos:end])).rstrip()
        head = ""
        if line.strip():
            if end < 0:  # the last line, possibly cut short
                if not expected[matched].startswith(line):
                    return False
                return (matched > 0 or line == expected[0]) if final else None
            if line != expected[matched]:
                return False
            matched += 1
        if end < 0:
            return matched > 0 if final else None
        pos = end + 1
    return True


def reopened_on_line(tokens: list[Tok], index: int) -> int:
    """Offset of an opener of the same kind that the line of closer `tokens[index]` leaves open, else -1.

    `} else {`, `} catch (e) {`, `}, {`: the closer ends the prefix's bracket but the line
    opens another in its place, which the suffix's closer then ends; no cut there.
    """
    closer = tokens[index]
    open_on_line: list[Tok] = []
    for tok in tokens[index + 1 :]:
        if tok.kind == NEWLINE:
            break
        if tok.kind == OPEN:
            open_on_line.append(tok)
        elif tok.kind == CLOSE:
            if not open_on_line:
                return -1
            open_on_line.pop()
    if open_on_line and open_on_line[0].char == CLOSERS[closer.char]:
        return open_on_line[0].start
    return -1


def before_open_call(ctx: CursorContext, completion: str) -> int | None:
    """Where a completion that ends by opening a call or subscript on a name (`Message(`, the
    line rule having cut it at the newline before the arguments) keeps just that name: the
    offset of its last opener when nothing but whitespace follows the opener, the opener is
    left unclosed and a name (or a closing bracket: `f(x)(`) comes right before it. None
    otherwise (and for text without a lexer)."""
    if ctx.spec is None:
        return None
    result = lex(completion, ctx.spec, ctx.start_state)
    if result.end_state is not None:
        return None  # ends inside a string or comment
    open_now = unmatched_openers(result.tokens)
    if not open_now or completion[open_now[-1].end :].strip():
        return None
    at = open_now[-1].start
    before = completion[:at].rstrip(" \t")
    if len(before) != at or not before or not (before[-1].isalnum() or before[-1] in "_)]"):
        return None
    return at


def under_block_opener(prefix: str, ctx: CursorContext, completion: str) -> str | None:
    """Python: the completion moved right to one indentation unit under the block opener above
    the cursor line, where the model wrote the block's first line at the opener's depth or less
    (`if month == 2:` then `return False` at the `if`'s column: a parse error whose code is
    right). Every line moves by the same width (the completion's own nesting kept). None where
    the cursor is not at a line start under an opener, or the depth is already deeper."""
    if ctx.spec is None or ctx.spec.family != "python" or ctx.mid_line or not ctx.prev_line_opens_block:
        return None
    above = [line for line in prefix[: len(prefix) - len(ctx.line_prefix)].split("\n") if line.strip()]
    first = ctx.line_prefix + completion.split("\n", 1)[0]
    if not above or not first.strip() or indent_of(first) > indent_of(above[-1]):
        return None
    shift = " " * (indent_of(above[-1]) + indent_unit(above) - indent_of(first))
    return "\n".join(shift + line if line.strip() or i == 0 else line for i, line in enumerate(completion.split("\n")))


def indent_unit(lines: list[str]) -> int:
    """The file's indentation step: the most common increase from one non-blank line to the next
    (4 where none is seen)."""
    steps: dict[int, int] = {}
    for before, after in zip(lines, lines[1:]):
        step = indent_of(after) - indent_of(before)
        if step > 0:
            steps[step] = steps.get(step, 0) + 1
    return max(steps, key=lambda step: (steps[step], -step)) if steps else 4

"""Python line-structure errors that tree-sitter-python does not report.

tree-sitter-python accepts an empty block (`if x:` followed by a dedent), an unexpected
indent, a dedent to a level that was never opened, and a logical line that ends in an
operator (it reads `x = a +` NEWLINE `y = 2` as one expression); CPython rejects all of
them, and a code model produces them often (a header cut off before its body, a body at
the wrong depth, a line cut mid-expression). This replays Python's tokenizer rules — a
stack of indentation levels, logical lines ending outside brackets — over the cursor line,
the lines the completion adds and the first suffix line after them, starting from the
stack at the cursor (CursorContext.indent_stack). Lexical: microseconds.
"""

from __future__ import annotations

import re

from kspec.engine.syntax.context import CursorContext, code_of_line, indent_of, logical_line_starts
from kspec.engine.syntax.languages import LanguageSpec
from kspec.engine.syntax.lexer import lex


# An error: (what, where). `where` is ("prefix", offset), ("suffix", offset without the
# completion) or ("completion", -1), so that the same error with and without the completion
# compares equal and any error the completion's own lines cause is new.
IndentError = tuple[str, tuple[str, int]]


class _Stack:
    def __init__(self, levels: tuple[int, ...], expects: bool, place: "_Places", partial: bool = False) -> None:
        self.levels = list(levels) or [0]
        self.partial = partial  # the levels between 0 and the lowest known one are unknown
        self.expects = expects
        self.expects_at = ("prefix", -1)  # where the ':' that opened the expected block is
        self.place = place
        self.errors: set[IndentError] = set()

    def start_line(self, indent: int, at: int) -> None:
        """A logical line starts at `indent`; its first character is at offset `at`."""
        top = self.levels[-1]
        if self.expects:
            if indent <= top:
                self.errors.add(("expected an indented block", self.expects_at))
            self.levels.append(max(indent, top + 1))
        elif indent > top:
            self.errors.add(("unexpected indent", self.place(at)))
            self.levels.append(indent)
        elif indent < top:
            while self.levels and self.levels[-1] > indent:
                self.levels.pop()
            if not self.levels or self.levels[-1] != indent:
                if not (self.partial and len(self.levels) <= 1):  # below what the window shows: unknown
                    self.errors.add(("unindent does not match", self.place(at)))
                self.levels.append(indent)
        self.expects = False


class _Places:
    """Maps an offset in line_prefix + completion + suffix to a completion-independent place."""

    def __init__(self, prefix_length: int, completion_length: int) -> None:
        self.prefix_length = prefix_length
        self.completion_length = completion_length

    def __call__(self, offset: int) -> tuple[str, int]:
        if offset < self.prefix_length:
            return "prefix", offset
        if offset < self.prefix_length + self.completion_length:
            return "completion", -1
        return "suffix", offset - self.completion_length


def line_errors(ctx: CursorContext, completion: str) -> set[IndentError]:
    """Line-structure errors from the cursor line to the first suffix line after the completion."""
    spec = ctx.spec
    if spec is None or spec.family != "python" or ctx.start_state is not None:
        return set()
    local = ctx.line_prefix + completion + ctx.suffix_line_rest
    following = ctx.suffix_following_line
    text = local + "\n" + (following or "")
    depth = len(ctx.open_brackets)
    starts = ([] if depth else [0]) + logical_line_starts(text, lex(text, spec).tokens, depth)
    stack = _Stack(ctx.indent_stack, ctx.expects_indent, _Places(len(ctx.line_prefix), len(completion)), ctx.indent_partial)
    for start in starts:
        if start > 0:
            _note_line_end(stack, text, start - 1, spec)
        end = text.find("\n", start)
        line = text[start:] if end < 0 else text[start:end]
        if line.strip() and not line.lstrip().startswith("#"):
            stack.start_line(indent_of(line), start + len(line) - len(line.lstrip()))
    if following is None and (len(local) + 1) in starts:
        # The end of the text: a line cut mid-expression is an error; a block header is
        # not (the document or the window ends there: its body is still to be written).
        _note_line_end(stack, text, len(local), spec)
    return stack.errors


_DANGLING_CHARS = frozenset("+-*/%@&|^~<>=.")
_DANGLING_WORDS = frozenset({"and", "or", "not", "in", "is", "if", "else", "lambda"})
_WORD_AT_END = re.compile(r"(?<![\w.])([A-Za-z_]+)$")


def dangling(code: str) -> bool:
    """Whether a logical line's code ends where an operand must follow."""
    if not code or code.endswith("...") or code.endswith("import *"):
        return False
    if code[-1] in _DANGLING_CHARS:
        return True
    word = _WORD_AT_END.search(code)
    return word is not None and word.group(1) in _DANGLING_WORDS


def _note_line_end(stack: _Stack, text: str, newline: int, spec: LanguageSpec) -> None:
    """A logical line ended at `newline`: a non-blank one that ends with ':' opens a block."""
    start = text.rfind("\n", 0, newline) + 1
    line = text[start:newline]
    if line.strip() and not line.lstrip().startswith("#"):
        code = code_of_line(line, spec)
        stack.expects = code.endswith(":")
        if stack.expects:
            stack.expects_at = stack.place(start + len(code) - 1)
        elif dangling(code):
            stack.errors.add(("incomplete expression", stack.place(start + len(code) - 1)))

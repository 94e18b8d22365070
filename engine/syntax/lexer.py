"""A small lexer that sees only what trimming needs: brackets, strings, comments, line ends.

Everything else (identifiers, numbers, operators) is skipped by the regex engine (a search
for the few characters a token can start with; the alternation of every form is only tried
where one is found), so a prefix of several kilobytes lexes in well under a millisecond and a completion of a few
lines in tens of microseconds. It is deliberately approximate where languages are
ambiguous (JavaScript regex literals are not recognised; Python f-string fields are part of
the string), because brackets in those places are balanced in practice.

Lexing can start inside a string or comment (`LexState`), which is how a completion is
lexed when the cursor is inside one, and it reports the state it ends in, which is how we
learn that the cursor is inside one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from kspec.engine.syntax.languages import LanguageSpec

OPEN = "open"
CLOSE = "close"
STRING = "string"
COMMENT = "comment"
NEWLINE = "newline"

OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {")": "(", "]": "[", "}": "{"}


class Tok(NamedTuple):
    kind: str
    start: int
    end: int  # exclusive
    char: str = ""  # the bracket character for OPEN / CLOSE


def _tok(fields: tuple[str, int, int, str]) -> Tok:
    """A Tok of all four fields without NamedTuple's Python-level constructor (the lexer's hot loop)."""
    return tuple.__new__(Tok, fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class LexState:
    """Where a text ends (or starts) when that is inside a literal or comment."""

    kind: str  # "string", "template", "line_comment" or "block_comment"
    close: str = ""  # closing delimiter of a string or block comment
    escapes: bool = True  # backslash escapes the next character
    multiline: bool = False  # the literal may span lines


@dataclass(frozen=True)
class LexResult:
    tokens: list[Tok]
    end_state: LexState | None  # None: the text ends in code


_TEMPLATE_STOP = re.compile(r"\\|`|\$\{")
_CHAR_LITERAL = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]{1,6}\}|[^\n])|[^\\'\n])'")


@lru_cache(maxsize=None)
def _master(spec: LanguageSpec) -> re.Pattern[str]:
    """The alternation of everything interesting in this language, longest forms first."""
    parts = [r"(?P<nl>\n)", r"(?P<open>[(\[{])", r"(?P<close>[)\]}])"]
    if spec.family == "python":
        parts.append(r"(?P<lc>\#)")
        parts.append(r"(?P<str>(?:(?<![\w])[rRbBuUfFtT]{1,2})?(?:'''|\"\"\"|'|\"))")
    else:
        parts.append(r"(?P<lc>//)")
        parts.append(r"(?P<bc>/\*)")
        if spec.cpp_raw_strings:
            parts.append(r"(?P<cppraw>(?<![\w])(?:u8|u|U|L)?R\"[^()\\\s]{0,16}\()")
        if spec.rust_strings:
            parts.append(r"(?P<rustraw>(?<![\w])b?r\#*\")")
        if spec.text_blocks:
            parts.append(r"(?P<tb>\"\"\")")
        parts.append(r"(?P<str>\")")
        if spec.template_strings:
            parts.append(r"(?P<tpl>`)")
        if spec.raw_backtick_strings:
            parts.append(r"(?P<rawbt>`)")
        parts.append(r"(?P<sq>')")
    return re.compile("|".join(parts))


@lru_cache(maxsize=None)
def _triggers(spec: LanguageSpec) -> tuple[re.Pattern[str], frozenset[str]]:
    """A character class search finds candidates far faster than the alternation: the
    characters every `_master` match starts with or, for a prefixed literal (`rb"`, `u8R"`,
    `r#"`), ends its prefix with; and the characters such a prefix is made of."""
    if spec.family == "python":
        return re.compile(r"[\n()\[\]{}#'\"]"), frozenset("rRbBuUfFtT")
    chars = r"\n()\[\]{}/\"'" + ("`" if spec.template_strings or spec.raw_backtick_strings else "")
    prefix = ("uUL8R" if spec.cpp_raw_strings else "") + ("br#" if spec.rust_strings else "")
    return re.compile("[" + chars + "]"), frozenset(prefix)


@lru_cache(maxsize=None)
def _string_stop(close: str, escapes: bool) -> re.Pattern[str]:
    """Where a string body stops being plain: its closing delimiter, a backslash or a line end."""
    alternatives = [re.escape(close), r"\n"]
    if escapes:
        alternatives.insert(0, r"\\")
    return re.compile("|".join(alternatives))


class _Lexer:
    def __init__(self, text: str, spec: LanguageSpec, newlines: bool) -> None:
        self.text = text
        self.spec = spec
        self.master = _master(spec)
        self.triggers, self.prefix_chars = _triggers(spec)
        self.newlines = newlines
        self.tokens: list[Tok] = []

    # Each scanner returns (end, state): end is where the literal stops (exclusive),
    # state is not None when the text ran out inside it.

    def scan_string(self, pos: int, state: LexState) -> tuple[int, LexState | None]:
        text, stop = self.text, _string_stop(state.close, state.escapes)
        while True:
            match = stop.search(text, pos)
            if match is None:
                return len(text), state
            found = match.group()
            if found == "\\":
                if match.end() >= len(text):
                    return len(text), state
                pos = match.end() + 1
            elif found == "\n":
                if not state.multiline:
                    return match.start(), None  # unterminated on its line: it ends there
                pos = match.end()
            else:
                return match.end(), None

    def scan_template(self, pos: int, state: LexState) -> tuple[int, LexState | None]:
        """A JavaScript template literal: `text ${code} text`, with code lexed for nesting."""
        text = self.text
        while True:
            match = _TEMPLATE_STOP.search(text, pos)
            if match is None:
                return len(text), state
            found = match.group()
            if found == "\\":
                pos = match.end() + 1
            elif found == "`":
                return match.end(), None
            else:
                pos, inner = self.scan_code(match.end(), until_unmatched_brace=True)
                if inner is not None:
                    return len(text), state

    def scan_comment(self, pos: int, state: LexState) -> tuple[int, LexState | None]:
        if state.kind == "line_comment":
            newline = self.text.find("\n", pos)
            return (len(self.text), state) if newline < 0 else (newline, None)
        close = self.text.find(state.close, pos)
        return (len(self.text), state) if close < 0 else (close + len(state.close), None)

    def literal_at(self, pos: int, at: int) -> re.Match[str] | None:
        """The `_master` match of a literal or comment that starts at `at` or, with a prefix,
        just before it (not before `pos`); None when the trigger at `at` starts none."""
        text, prefix_chars = self.text, self.prefix_chars
        start = at
        while start > pos and at - start < 32 and text[start - 1] in prefix_chars:
            start -= 1
        while start <= at:
            match = self.master.match(text, start)
            if match is not None:
                return match
            start += 1
        return None

    def resume(self, pos: int, state: LexState) -> tuple[int, LexState | None]:
        if state.kind == "string":
            return self.scan_string(pos, state)
        if state.kind == "template":
            return self.scan_template(pos, state)
        return self.scan_comment(pos, state)

    def scan_code(self, pos: int, until_unmatched_brace: bool = False) -> tuple[int, LexState | None]:
        """Lex code from `pos`; with `until_unmatched_brace`, stop after the `}` that closes a `${`."""
        text, tokens, triggers = self.text, self.tokens, self.triggers
        record = not until_unmatched_brace
        newlines = self.newlines and record
        depth = 0
        while True:
            # The same tokens as `_master.search` would give, found by a character class
            # (brackets and line ends need nothing more).
            found = triggers.search(text, pos)
            if found is None:
                return len(text), None
            start = found.start()
            char = text[start]
            end = start + 1
            if char == "\n":
                if newlines:
                    tokens.append(_tok((NEWLINE, start, end, "")))
                pos = end
                continue
            if char in OPENERS:
                depth += 1
                if record:
                    tokens.append(_tok((OPEN, start, end, char)))
                pos = end
                continue
            if char in CLOSERS:
                depth -= 1
                if not record and depth < 0:
                    return end, None
                if record:
                    tokens.append(_tok((CLOSE, start, end, char)))
                pos = end
                continue
            match = self.literal_at(pos, start)
            if match is None:
                pos = end
                continue
            kind, start, end = match.lastgroup, match.start(), match.end()
            if kind == "sq" and not self.spec.single_quote_strings:
                literal = _CHAR_LITERAL.match(text, start)
                if literal is not None:  # otherwise a Rust lifetime or a stray quote
                    end = literal.end()
                    if record:
                        tokens.append(Tok(STRING, start, end))
            else:
                state = self.literal_state(kind, match.group())
                end, left_open = self.resume(end, state)
                if record:
                    tokens.append(Tok(COMMENT if "comment" in state.kind else STRING, start, end))
                if left_open is not None:
                    return end, left_open
            pos = end

    def literal_state(self, kind: str | None, lexeme: str) -> LexState:
        if kind == "lc":
            return LexState("line_comment")
        if kind == "bc":
            return LexState("block_comment", "*/", escapes=False, multiline=True)
        if kind == "tb":
            return LexState("string", '"""', multiline=True)
        if kind == "tpl":
            return LexState("template", "`", multiline=True)
        if kind == "rawbt":
            return LexState("string", "`", escapes=False, multiline=True)
        if kind == "cppraw":
            delimiter = lexeme[lexeme.index('"') + 1 : -1]
            return LexState("string", ")" + delimiter + '"', escapes=False, multiline=True)
        if kind == "rustraw":
            hashes = lexeme.count("#")
            if "r" in lexeme:
                return LexState("string", '"' + "#" * hashes, escapes=False, multiline=True)
            return LexState("string", '"', multiline=True)
        if kind == "str":
            quote = lexeme.lstrip("rRbBuUfFtT")
            if self.spec.family == "python":
                # A backslash keeps the next quote inside even a raw string (r'\'' is one string).
                return LexState("string", quote, escapes=True, multiline=len(quote) == 3)
            # Rust and C++ strings may span lines; Go/Java/JS/C ones may not.
            return LexState("string", '"', multiline=self.spec.rust_strings)
        return LexState("string", "'")  # "sq" in a language where '...' is a string


def lex(
    text: str,
    spec: LanguageSpec,
    start: LexState | None = None,
    *,
    newlines: bool = True,
) -> LexResult:
    """Tokens of `text` (brackets, literals, comments and, if asked, line ends) and the end state."""
    lexer = _Lexer(text, spec, newlines)
    pos = 0
    if start is not None:
        pos, left_open = lexer.resume(0, start)
        lexer.tokens.append(Tok(COMMENT if "comment" in start.kind else STRING, 0, pos))
        if left_open is not None:
            return LexResult(lexer.tokens, left_open)
    _, end_state = lexer.scan_code(pos)
    return LexResult(lexer.tokens, end_state)


def unmatched_openers(tokens: list[Tok]) -> list[Tok]:
    """Openers in `tokens` that no later token closes, outermost first."""
    stack: list[Tok] = []
    for tok in tokens:
        if tok.kind == OPEN:
            stack.append(tok)
        elif tok.kind == CLOSE and stack:
            stack.pop()
    return stack

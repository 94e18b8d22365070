"""The lexer finds its tokens by a character class, not by searching the whole alternation
(`_master`): both must give the same tokens and end state, prefixed literals included."""

from __future__ import annotations

import random

import pytest

from kspec.engine.syntax.languages import SPECS
from kspec.engine.syntax.lexer import CLOSE, NEWLINE, OPEN, STRING, COMMENT, LexState, Tok, _CHAR_LITERAL, _Lexer, _master


class _Alternation(_Lexer):
    """The reference: every token found by `_master(spec).search`."""

    def scan_code(self, pos: int, until_unmatched_brace: bool = False) -> tuple[int, LexState | None]:
        text, tokens, record, depth = self.text, self.tokens, not until_unmatched_brace, 0
        while True:
            match = _master(self.spec).search(text, pos)
            if match is None:
                return len(text), None
            kind, start, end = match.lastgroup, match.start(), match.end()
            if kind == "nl":
                if self.newlines and record:
                    tokens.append(Tok(NEWLINE, start, end))
            elif kind == "open":
                depth += 1
                if record:
                    tokens.append(Tok(OPEN, start, end, match.group()))
            elif kind == "close":
                depth -= 1
                if not record and depth < 0:
                    return end, None
                if record:
                    tokens.append(Tok(CLOSE, start, end, match.group()))
            elif kind == "sq" and not self.spec.single_quote_strings:
                literal = _CHAR_LITERAL.match(text, start)
                if literal is not None:
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


def _lex(lexer_type: type[_Lexer], text: str, language: str, start: LexState | None) -> tuple[list[Tok], LexState | None]:
    lexer = lexer_type(text, SPECS[language], True)
    pos = 0
    if start is not None:
        pos, left_open = lexer.resume(0, start)
        lexer.tokens.append(Tok(COMMENT if "comment" in start.kind else STRING, 0, pos))
        if left_open is not None:
            return lexer.tokens, left_open
    return lexer.tokens, lexer.scan_code(pos)[1]


TEXTS = {
    "python": 'x = rb"a" + Rb\'b\' + f"{x}" + xr"c" + _b"d" + 9u"e" # c\ns = fr"""m\n(""" [1] \'\'\'\n\'\'\' "\\\n"\n',
    "rust": 'let s = r#"a "q" b"#; let t = br"x"; fn f<\'a>(x: &\'a str) -> char { \'c\' } // c\n/* b */ xr"a" r##"x"#"## b\'y\'',
    "go": "s := `raw\n${x}` + \"q\" // c\nr := 'x'\n/* b\n*/ f(a[1]) / 2",
    "cpp": 'auto s = R"delim(a)" b)delim"; auto t = u8R"(x)"; auto u = LR"(y)"; xR"(z)"; 8R"(w)"; c = \'(\'; /* ( */ a / b',
    "java": 'String s = """\n  text "a" \n  """; String t = "";"x"; // c\nchar c = \'{\';',
    "javascript": "const s = `a${f(`b${c}`)}d`; const r = /a[(]/; 'x' \"y\" // (\n",
}
STATES = [None, LexState("string", '"""', multiline=True), LexState("block_comment", "*/", escapes=False, multiline=True)]


@pytest.mark.parametrize("language", sorted(TEXTS))
def test_the_character_class_search_gives_the_alternations_tokens(language: str) -> None:
    rng = random.Random(0)
    text = TEXTS[language]
    pieces = [text] + [text[a : rng.randrange(a, len(text) + 1)] for a in (rng.randrange(len(text)) for _ in range(200))]
    for piece in pieces:
        for state in STATES:
            assert _lex(_Lexer, piece, language, state) == _lex(_Alternation, piece, language, state), (piece, state)

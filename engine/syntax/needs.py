"""What the hole must bind, as the text a branch can be made to start with (issue 42).

The name analysis (pynames.py, jsnames.py) finds the names the code right after the cursor
reads that nothing before it binds (`needs`: the suffix reads `msg`, the hole is where
`msg = ...` goes). `binding_starts` turns them into starts that bind them, most likely
first, for the decoder to force on some of the k branches (engine/decode/steering.py):

* Python: `msg =`, and `us, them =` when the suffix needs several names; `for x in` when
  the suffix's next line is indented deeper than the cursor's (the hole is a block header);
  `import getopt` for a standard-library module the suffix reads as `getopt.getopt(...)`;
* JavaScript / TypeScript: `const x =` (`let x =` when the suffix assigns it again);
  `for (const x of` for a block header.

At column 0 a start begins with the next line's indentation (a hole cut at a line's start,
as HumanEval infilling cuts them). Only where a statement starts at the cursor: nothing but indentation before it on its line
(Python: or the start of a needed name, `ms|`, which the starts then go on with: `g =`),
nothing after it, not inside a string, comment or bracket (a block's `{` aside). Starts end before the space
that follows `=` / `in` / `of`: the model writes that space with the value's first token,
as it does in code it has read.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from kspec.engine.syntax.context import indent_of
from kspec.engine.syntax.jsnames import LANGUAGES as JS_LANGUAGES
from kspec.engine.syntax.postprocess import analysis

MAX_TUPLE_NAMES = 3  # `a, b, c =` at most


@dataclass(frozen=True)
class HoleNeeds:
    """What one request's window says the hole must bind (`hole_needs`)."""

    language: str | None
    names: tuple[str, ...] = ()  # needed names, in the order the suffix first reads them
    statement_start: bool = False  # a statement starts at the cursor (see the module docstring)
    header: bool = False  # the suffix's next line is indented deeper: the hole is a block header
    reassigned: frozenset[str] = frozenset()  # needed names the suffix assigns again (JS: `let`)
    typed: str = ""  # the start of a needed name typed before the cursor (`ms|`): starts go on with it
    indent: str = ""  # what a start begins with where the cursor is at column 0: the next line's indentation
    modules: frozenset[str] = frozenset()  # Python: needed names of standard-library modules the suffix reads as `name.x`


def hole_needs(prefix: str, suffix: str, language: str | None) -> HoleNeeds:
    """The hole's needs, from the same window analysis post-processing uses (memoized per request)."""
    found = analysis(prefix, suffix, language)
    names = found.checker.needed_names()
    ctx = found.ctx
    if not names:
        return HoleNeeds(language)
    typed = ctx.line_prefix.strip()
    in_code = ctx.start_state is None and (not ctx.open_brackets or ctx.open_brackets[-1] == "{")
    if typed and (_WORD.fullmatch(typed) is None or language != "python"):
        return HoleNeeds(language, tuple(names))  # mid-line (a JavaScript word may be `const`'s start)
    following = ctx.suffix_following_line
    at_start = in_code and not ctx.suffix_line_rest.strip()
    indent, header = "", following is not None and indent_of(following) > indent_of(ctx.line_prefix)
    if not ctx.line_prefix:  # at column 0, before a line or not: the statement goes at the next line's depth
        next_line = ctx.suffix_line_rest if ctx.suffix_line_rest.strip() else following or ""
        previous = _last_code_line(found.prefix)
        if indent_of(next_line) > indent_of(previous) and not previous.rstrip().endswith((":", "{")):
            next_line = previous  # the next line is in a block the hole opens: the statement goes at the previous one's depth
        indent, header, at_start = next_line[: len(next_line) - len(next_line.lstrip(" \t"))], False, in_code
    ordered = sorted(names, key=lambda name: _first_read(found.suffix, name))
    if header:  # a loop variable is read in the block the header opens, not after it
        body, after = _block_and_after(found.suffix, indent_of(ctx.line_prefix))
        ordered.sort(key=lambda name: _first_read(after, name) < len(after) or _first_read(body, name) == len(body))
    ordered = [name for name in ordered if name.startswith(typed) and name != typed]
    reassigned = frozenset(name for name in ordered if _assigned(found.suffix, name))
    modules = frozenset(name for name in ordered if language == "python" and _module_read(found.suffix, name))
    return HoleNeeds(language, tuple(ordered), at_start, header, reassigned, typed, indent, modules)


_WORD = re.compile(r"[A-Za-z_$][\w$]*")


def _block_and_after(suffix: str, indent: int) -> tuple[str, str]:
    """The suffix's lines after the cursor's that are indented deeper than `indent`, and the rest."""
    lines = suffix.split("\n")[1:]
    end = 0
    while end < len(lines) and (not lines[end].strip() or indent_of(lines[end]) > indent):
        end += 1
    return "\n".join(lines[:end]), "\n".join(lines[end:])


_ASSIGNED = r"(?<![\w$.]){}\s*(?:[-+*/%&|^]?=(?![=>])|\+\+|--)"


def _first_read(text: str, name: str) -> int:
    found = re.search(r"(?<![\w$.])" + re.escape(name) + r"(?![\w$])", text)
    return found.start() if found else len(text)


def _assigned(text: str, name: str) -> bool:
    return re.search(_ASSIGNED.format(re.escape(name)), text) is not None


def _last_code_line(prefix: str) -> str:
    lines = [line for line in prefix.split("\n") if line.strip()]
    return lines[-1] if lines else ""


def _module_read(suffix: str, name: str) -> bool:
    """`name` is a standard-library module and the suffix reads it only as `name.attribute`."""
    if name not in sys.stdlib_module_names:
        return False
    reads = re.findall(r"(?<![\w.])" + re.escape(name) + r"\b(\s*\.)?", suffix)
    return bool(reads) and all(reads)


def binding_starts(needs: HoleNeeds) -> list[str]:
    """The starts that bind what the hole needs, most likely first; [] where none applies.
    After a typed start of a name (`ms|`) they go on with the rest of it (`g =`)."""
    names = needs.names
    if not names or not needs.statement_start:
        return []
    starts: list[str] = []
    if needs.language == "python":
        if needs.header:
            starts = [f"for {names[0]} in"]
        elif names[0] in needs.modules:
            starts = [f"import {names[0]}"]
        else:
            starts = [f"{names[0]} ="] + ([", ".join(names[:MAX_TUPLE_NAMES]) + " ="] if len(names) > 1 else [])
    elif needs.language in JS_LANGUAGES:
        if needs.header:
            starts = [f"for (const {names[0]} of"]
        else:
            starts = [f"{'let' if name in needs.reassigned else 'const'} {name} =" for name in names[:MAX_TUPLE_NAMES]]
    if needs.typed:  # Python: the rest of the typed name (`ms|` -> `g =`)
        return [start[len(needs.typed) :] for start in starts if start.startswith(needs.typed)]
    return [needs.indent + start for start in starts]

"""What the hole must bind, as the text a branch can be made to start with.

The name analysis (pynames.py, jsnames.py) finds the names the code right after the cursor
reads that nothing before it binds (`needs`: the suffix reads `msg`, the hole is where
`msg = ...` goes). `binding_starts` turns them into starts that bind them, most likely
first, for the decoder to force on some of the k branches (engine/decode/steering.py):

* Python: `msg =`, and `us, them =` when the suffix needs several names; `for x in` when
  the suffix's next line is indented deeper than the cursor's (the hole is a block header),
  and, for such a hole with or without a name to bind, `if` / `for` / `while` (`BLOCK_KEYWORDS`:
  only a header fills it, a statement leaves the deeper line without one);
  `import getopt` for a standard-library module the suffix reads as `getopt.getopt(...)`;
* JavaScript / TypeScript: `const x =` (`let x =` when the suffix assigns it again);
  `for (const x of` for a block header, then `if (` / `for (` / `while (`.

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
from collections import Counter
from dataclasses import dataclass

from kspec.engine.syntax.context import indent_of
from kspec.engine.syntax.jsnames import LANGUAGES as JS_LANGUAGES
from kspec.engine.syntax.postprocess import analysis

MAX_TUPLE_NAMES = 3  # `a, b, c =` at most
DEFAULT_INDENT_STEP = 4


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


def hole_needs(prefix: str, suffix: str, language: str | None, outside: frozenset[str] = frozenset()) -> HoleNeeds:
    """The hole's needs, from the same window analysis post-processing uses (memoized per request;
    `outside`: as `postprocess` takes it)."""
    found = analysis(prefix, suffix, language, outside)
    names = found.checker.needed_names()
    ctx = found.ctx
    typed = ctx.line_prefix.strip()
    in_code = ctx.start_state is None and (not ctx.open_brackets or ctx.open_brackets[-1] == "{")
    if typed and (_WORD.fullmatch(typed) is None or language != "python"):
        return HoleNeeds(language, tuple(names))  # mid-line (a JavaScript word may be `const`'s start)
    following = ctx.suffix_following_line
    at_start = in_code and not ctx.suffix_line_rest.strip()
    indent, header = "", following is not None and indent_of(following) > indent_of(ctx.line_prefix)
    if not ctx.line_prefix:  # at column 0, before a line or not: the statement goes at the next line's depth
        next_line = ctx.suffix_line_rest if ctx.suffix_line_rest.strip() else following or ""
        indent, header, at_start = _column_0_depth(found.prefix, next_line) + (in_code,)
    if not names and not header:
        return HoleNeeds(language, statement_start=at_start)
    ordered = sorted(names, key=lambda name: _first_read(found.suffix, name))
    if header:  # a loop variable is read in the block the header opens, not after it
        # (at column 0 the suffix's first line is the block's first, not the rest of the cursor's)
        body, after = _block_and_after(found.suffix, indent_of(indent if not ctx.line_prefix else ctx.line_prefix), 0 if not ctx.line_prefix else 1)
        ordered.sort(key=lambda name: _first_read(after, name) < len(after) or _first_read(body, name) == len(body))
    ordered = [name for name in ordered if name.startswith(typed) and name != typed]
    reassigned = frozenset(name for name in ordered if _assigned(found.suffix, name))
    modules = frozenset(name for name in ordered if language == "python" and _module_read(found.suffix, name))
    return HoleNeeds(language, tuple(ordered), at_start, header, reassigned, typed, indent, modules)


def _column_0_depth(prefix: str, next_line: str) -> tuple[str, bool]:
    """Where a statement written at column 0 goes, between the last code line of `prefix` and
    the line after it: (its indentation, whether it must open a block — the line after is deeper
    than the statement can be, so it is that block's body). After a header (`else:`) the
    statement is the header's body, one indentation step (`_indent_step`) deeper; where the next
    line is deeper still (`else:` at 8, the next line at 16), a header itself; after other code,
    at its depth where the next line is deeper; else at the next line's depth. Depths in columns
    (indent_of), indentations as written."""
    previous = _last_code_line(prefix)
    previous_depth, next_depth = indent_of(previous), indent_of(next_line)
    next_indent = _leading(next_line)
    if next_depth <= previous_depth:
        return next_indent, False
    if not previous.rstrip().endswith((":", "{")):
        return _leading(previous), True
    step = _indent_step(prefix)  # only here: the prefix's every line is read for it
    if next_depth >= previous_depth + 2 * step:
        return _indent_to(_leading(previous), next_indent, previous_depth + step), True
    return next_indent, False


def _leading(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _indent_to(base: str, deeper: str, columns: int) -> str:
    """`base` followed by `deeper`'s next whitespace (the file's own tabs or spaces) up to `columns`."""
    rest = deeper[len(base) :] if deeper.startswith(base) else " " * columns
    indent = base
    for char in rest:
        if indent_of(indent + "x") >= columns:
            break
        indent += char
    return indent


def _indent_step(prefix: str) -> int:
    """The code's indentation step: the commonest increase from one code line to the next (4 where none)."""
    depths = [indent_of(line) for line in prefix.split("\n") if line.strip()]
    increases = Counter(after - before for before, after in zip(depths, depths[1:]) if after > before)
    return increases.most_common(1)[0][0] if increases else DEFAULT_INDENT_STEP


_WORD = re.compile(r"[A-Za-z_$][\w$]*")


def _block_and_after(suffix: str, indent: int, first: int = 1) -> tuple[str, str]:
    """The suffix's lines from line `first` on (after the cursor's) that are indented deeper than
    `indent`, and the rest."""
    lines = suffix.split("\n")[first:]
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


BLOCK_KEYWORDS = {"python": ("if", "for", "while"), **{language: ("if (", "for (", "while (") for language in JS_LANGUAGES}}


def binding_starts(needs: HoleNeeds, headers: bool = True) -> list[str]:
    """The starts that bind what the hole needs, most likely first; [] where none applies.
    After a typed start of a name (`ms|`) they go on with the rest of it (`g =`). Where the
    hole is a block header (the code after it is its body): the loop binding the name read
    only in that block first, then (`headers`) the headers a hole most often is (`if`, `for`,
    `while`)."""
    names, keywords = needs.names, BLOCK_KEYWORDS.get(needs.language or "")
    if not needs.statement_start or not (names or (needs.header and headers)) or keywords is None:
        return []
    keywords = keywords if headers else ()
    python = needs.language == "python"
    if needs.header:
        loop = [f"for {names[0]} in" if python else f"for (const {names[0]} of"] if names else []
        starts = loop + [keyword for keyword in keywords if not (loop and keyword.startswith("for"))]
    elif python and names[0] in needs.modules:
        starts = [f"import {names[0]}"]
    elif python:
        starts = [f"{names[0]} ="] + ([", ".join(names[:MAX_TUPLE_NAMES]) + " ="] if len(names) > 1 else [])
    else:
        starts = [f"{'let' if name in needs.reassigned else 'const'} {name} =" for name in names[:MAX_TUPLE_NAMES]]
    if needs.typed:  # Python: the rest of the typed name (`ms|` -> `g =`)
        return [start[len(needs.typed) :] for start in starts if start.startswith(needs.typed)]
    return [needs.indent + start for start in starts]

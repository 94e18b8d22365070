"""Degenerate completions: a model stuck in a loop, in any language.

Five signs, each cheap (a regex or a set look-up over a few hundred characters):

* a repeated sub-string: a unit of 3 to 80 characters with at least two letters written
  four times in a row, or three times when it is `LONG_UNIT` characters or more or spans a
  line end (`include_include_include_include_`, `foo(foo(foo(foo(`); `None, None, None`
  is still code;
* a run of the same token: one word six times in a row with at most two separator
  characters between them (`self self self ...`), or one punctuation character ten times
  (`((((((((((`); numbers do not count (`[0, 0, 0, 0, 0, 0]` is data);
* one line (two letters or digits at least) written three times in a row, whatever its
  indentation;
* lines that grow a repeat: three lines in a row that are the same once each repeated
  unit (two letters at least) is written once, and are not all the same as written
  (`x_pow = 1`, `x_pow_pow = 1`, `x_pow_pow_pow = 1`: the model adds a unit a line);
* a repeat of the prompt: at least two thirds of the completion's lines (and at least two
  of them, or its only line when that is the line right above the cursor) are copies of
  the prompt's last lines; lines of fewer than `TRIVIAL_ALNUM` letters and digits (`}`,
  `else:`, `pass`) count as neither.

`degeneration` says which sign it found; ranking sinks such an alternative below every
alternative that shows none (rank.py).
"""

from __future__ import annotations

import re
from typing import Callable

REPEATED_UNIT = re.compile(r"(?s)(.{3,80}?)\1\1(\1)?")
LONG_UNIT = 12
WORD_RUN = re.compile(r"\b([A-Za-z_]\w*)\b(?:\W{1,2}\1\b){5,}")
PUNCT_RUN = re.compile(r"([^\w\s])\1{9,}")
LINE_REPEATS = 3
PROMPT_LINES = 8  # how many of the prompt's last non-blank lines a completion is compared with
TRIVIAL_ALNUM = 4
MIN_LETTERS_IN_UNIT = 2
REPEAT_IN_LINE = re.compile(r"(.{2,40}?)\1+")


def degeneration(text: str, prefix: str) -> str | None:
    """Why `text` (inserted after `prefix`) is degenerate, or None when it is not."""
    for match in REPEATED_UNIT.finditer(text):
        unit = match.group(1)
        often = match.group(2) is not None or len(unit) >= LONG_UNIT or "\n" in unit
        if often and sum(c.isalpha() or c == "_" for c in unit) >= MIN_LETTERS_IN_UNIT:
            return f"repeats {unit.strip()[:20]!r}"
    match = WORD_RUN.search(text) or PUNCT_RUN.search(text)
    if match is not None:
        return f"a run of {match.group(1)!r}"
    line = _repeated_line(text)
    if line is not None:
        return f"writes {line[:20]!r} {LINE_REPEATS} times in a row"
    line = _repeated_line(text, _unit_once)
    if line is not None:
        return f"grows {line[:20]!r} a repeat a line"
    if repeats_prompt(text, prefix):
        return "repeats the lines above the cursor"
    return None


def _unit_once(line: str) -> str:
    """The line with each repeated unit of two letters or more written once (`a_b_b_b` -> `a_b`)."""

    def once(match: re.Match[str]) -> str:
        unit = match.group(1)
        return unit if sum(c.isalpha() or c == "_" for c in unit) >= MIN_LETTERS_IN_UNIT else match.group(0)

    return REPEAT_IN_LINE.sub(once, line)


def _repeated_line(text: str, key: Callable[[str], str] | None = None) -> str | None:
    """A line (two letters or digits at least) written `LINE_REPEATS` times in a row; with
    `key`, lines count as the same when their keys are, and not all of them are equal as written."""
    run, previous, written = 0, None, set()
    for line in text.split("\n"):
        line = line.strip()
        same = key(line) if key is not None else line
        if same == previous:
            run, written = run + 1, written | {line}
        else:
            run, written = 1, {line}
        previous = same
        if run >= LINE_REPEATS and sum(c.isalnum() for c in line) >= 2 and (key is None or len(written) > 1):
            return line
    return None


def _nontrivial(line: str) -> bool:
    return sum(c.isalnum() for c in line) >= TRIVIAL_ALNUM


def _last_lines(prefix: str, count: int) -> list[str]:
    """The prefix's last `count` non-blank complete lines (before the cursor line), stripped, last first."""
    lines: list[str] = []
    end = prefix.rfind("\n")
    while end > 0 and len(lines) < count:
        start = prefix.rfind("\n", 0, end) + 1
        line = prefix[start:end].strip()
        if line:
            lines.append(line)
        end = start - 1
    return lines


def repeats_prompt(text: str, prefix: str) -> bool:
    """Whether the completion's lines (the cursor line completed first) are mostly copies of
    the prompt's last lines."""
    cursor_line = prefix[prefix.rfind("\n") + 1 :]
    lines = [line.strip() for line in (cursor_line + text).split("\n")]
    lines = [line for line in lines if _nontrivial(line)]
    if not lines:
        return False
    above = _last_lines(prefix, PROMPT_LINES)
    if len(lines) == 1:
        return bool(above) and lines[0] == above[0]
    copies = sum(line in above for line in lines)
    return copies >= 2 and 3 * copies >= 2 * len(lines)

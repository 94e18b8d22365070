"""The names a cursor right after `module.` can go on with.

Where the text before the cursor ends with a qualifier the file reaches a module by (`nodes.`,
`nodes.Con`: `ModuleMembers` from the context gatherer) the module's member names are what the
next identifier can be. `member_names` gives them, the typed start left out (`cat` for
`Concat` after `nodes.Con`); the decoder forces some of them as the starts of some branches
(engine/decode/steering.py), ranked by the model, so the k alternatives hold names that exist
instead of the names a small model makes up (`DtdHandler` for `DTDHandler`); and ranking counts
an alternative that writes a name the module does not have as one more undefined name
(`MemberNames.unknown`).
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass

from kspec.engine.api import ModuleMembers
from kspec.engine.syntax.context import indent_of

_NAME_START = re.compile(r"[\w$]+")
_AFTER_QUALIFIER = re.compile(r"(?<![\w.$])([A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)*)\.([A-Za-z_$][\w$]*)?$")


@dataclass(frozen=True)
class MemberNames:
    """What may follow the cursor: the rest of each member name that starts with what is typed."""

    qualifier: str  # as written before the dot (`nodes`, `os.path`)
    typed: str  # the part of the member's name typed already (`Con`)
    rests: tuple[str, ...]  # each matching name without `typed`, in the module's order (a private `_name` only after a typed `_`)
    names: frozenset[str]  # every member name of the module
    words: frozenset[str] = frozenset()  # of the code around the cursor (`context_words`)

    def written(self, text: str) -> str:
        """The member name the alternative `text` completes (`typed` and its first name)."""
        found = _NAME_START.match(text)
        return self.typed + (found.group(0) if found else "")

    def unknown(self, text: str) -> str | None:
        """`qualifier.name` where the alternative `text` completes the name to one the module
        does not have (`nodes.DtdHandler`); None where it is a member or names nothing."""
        name = self.written(text)
        return None if not name or name in self.names else f"{self.qualifier}.{name}"

    def affinity(self, text: str) -> float:
        """`affinity_share` of the member name `text` writes with the code around the cursor; 0
        for a name the module lacks."""
        name = self.written(text)
        return affinity_share(name, self.words) if name in self.names else 0.0


def member_names(prefix: str, members: tuple[ModuleMembers, ...], whole: bool = False) -> MemberNames | None:
    """The member names that can complete the identifier at the end of `prefix`; None where the
    cursor does not follow `qualifier.` of a module in `members` or no name matches. `whole`:
    a name typed whole counts too (its rest is "": the name may end here)."""
    if not members:
        return None
    found = _AFTER_QUALIFIER.search(prefix[-256:])
    if found is None:
        return None
    qualifier, typed = found.group(1), found.group(2) or ""
    names = [name for module in members if module.qualifier == qualifier for name in module.names]
    rests = tuple(dict.fromkeys(
        name[len(typed) :] for name in names
        if name.startswith(typed) and (whole or name != typed) and (typed.startswith("_") or not name.startswith("_"))
    ))  # fmt: skip
    return MemberNames(qualifier, typed, rests, frozenset(names), context_words(prefix, qualifier)) if rests else None


# Words that say nothing about which member is meant (keywords, the receiver).
_PLAIN_WORDS = frozenset(keyword.kwlist) | {"self", "cls", "this", "const", "let", "var", "func", "function", "return"}
_SUBWORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_IDENTIFIER = re.compile(r"[A-Za-z_$][\w$]*")
_DEFINITION = re.compile(r"^[ \t]*(?:async[ \t]+)?(?:def|class|function|func|fn)[ \t]+([A-Za-z_$][\w$]*)")
MIN_WORD = 3  # shorter subwords (`to`, `of`, `a`) match too much
HEADER_LOOKBACK = 4000  # characters above the cursor searched for the enclosing definition


def subwords(identifier: str) -> list[str]:
    """`parse_concat` -> [parse, concat]; `ScopedEvalContextModifier` -> [scoped, eval, context, modifier]."""
    return [w.lower() for w in _SUBWORD.findall(identifier)]


def context_words(prefix: str, qualifier: str) -> frozenset[str]:
    """The words of the cursor's line before `qualifier.` and of the enclosing definition's name
    (the nearest less-indented `def`/`class`/`function`/`func`/`fn` line above), less the
    qualifier's own and the plain words."""
    line_start = prefix.rfind("\n") + 1
    line = prefix[line_start:]
    texts = [line[: line.rfind(qualifier + ".")] if qualifier + "." in line else line]
    for above in reversed(prefix[max(0, line_start - HEADER_LOOKBACK) : line_start].split("\n")):
        found = _DEFINITION.match(above)
        if found and indent_of(above) < indent_of(line):
            texts.append(found.group(1))
            break
    skip = set(subwords(qualifier)) | _PLAIN_WORDS
    return frozenset(w for text in texts for name in _IDENTIFIER.findall(text) for w in subwords(name) if len(w) >= MIN_WORD and w not in skip)


STEM_WORD = 6  # words this long that differ only in the shorter one's last letter share a stem (`generate` / `generator`)


def _matches(word: str, other: str) -> bool:
    shorter = min(len(word), len(other))
    if word == other or (shorter >= 4 and (word.startswith(other) or other.startswith(word))):
        return True
    return shorter >= STEM_WORD and word[: shorter - 1] == other[: shorter - 1]


def affinity_share(name: str, words: frozenset[str]) -> float:
    """The share of `name`'s own words (`subwords`) that match one of `words` (equal, or one a
    start of the other when both have 4 letters or more: `scan` / `scanner`, or one stem when
    both have `STEM_WORD` or more: `generate` / `generator`); 0 to 1."""
    own = [w for w in subwords(name) if len(w) >= MIN_WORD]
    if not own or not words:
        return 0.0
    return sum(1 for w in own if any(_matches(w, c) for c in words)) / len(own)


def by_context_affinity(names: tuple[str, ...], words: frozenset[str]) -> list[str]:
    """The `names` (whole member names) that share a word with the code around the cursor
    (`words`: `context_words`, as `MemberNames.words` holds them; the line the cursor is on, the
    enclosing definition's name: `def parse_concat` -> `Concat`, `context = nodes.` ->
    `ContextReference`, `self.scan_once = scanner.` -> `make_scanner`), the larger share of the
    name's own words first, then in the given order."""
    shares = [(-share, at, name) for at, name in enumerate(names) if (share := affinity_share(name, words)) > 0]
    return [name for _, _, name in sorted(shares)]

"""The names a cursor right after `module.` can go on with (issues 41 and 42).

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

import re
from dataclasses import dataclass

from kspec.engine.api import ModuleMembers

_NAME_START = re.compile(r"[\w$]+")
_AFTER_QUALIFIER = re.compile(r"(?<![\w.$])([A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)*)\.([A-Za-z_$][\w$]*)?$")


@dataclass(frozen=True)
class MemberNames:
    """What may follow the cursor: the rest of each member name that starts with what is typed."""

    qualifier: str  # as written before the dot (`nodes`, `os.path`)
    typed: str  # the part of the member's name typed already (`Con`)
    rests: tuple[str, ...]  # each matching name without `typed`, in the module's order (a private `_name` only after a typed `_`)
    names: frozenset[str]  # every member name of the module

    def unknown(self, text: str) -> str | None:
        """`qualifier.name` where the alternative `text` completes the name to one the module
        does not have (`nodes.DtdHandler`); None where it is a member or names nothing."""
        found = _NAME_START.match(text)
        name = self.typed + (found.group(0) if found else "")
        return None if not name or name in self.names else f"{self.qualifier}.{name}"


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
    return MemberNames(qualifier, typed, rests, frozenset(names)) if rests else None

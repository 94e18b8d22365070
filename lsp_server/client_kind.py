"""What a client declared it handles beyond plain LSP, and what a plain client is shown.

A client that handles `$/kspec/suggestionsUpdated` (it asks again when told that longer
alternatives are ready) says so in its capabilities:

    "capabilities": {"experimental": {"kspec": {"suggestionsUpdated": true}}}

Only such a client gets an early (interim) answer. Any other client (Neovim's built-in
inline completion, Helix, Emacs, Zed, ...) never asks again, so it is shown whole answers:
the engine's final alternatives, and of those cut short (at the deadline, or cancelled)
only the whole lines they wrote, never a fragment ending mid-identifier.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from kspec.engine.api import Completion

# finish reasons of an alternative stopped from outside, wherever it was (the token budget,
# "length", is the user's own choice: such an answer is final, as the issue asks)
CUT_SHORT = frozenset({"deadline", "cancelled"})
# what a client puts in `capabilities.experimental` to declare it re-asks on $/kspec/suggestionsUpdated
DECLARES_UPDATES = {"kspec": {"suggestionsUpdated": True}}


def handles_updates(experimental: Any) -> bool:
    """The client capabilities' `experimental` value declares `$/kspec/suggestionsUpdated`."""
    kspec = experimental.get("kspec") if isinstance(experimental, dict) else None
    return isinstance(kspec, dict) and kspec.get("suggestionsUpdated") is True


def whole_text(completion: Completion) -> str:
    """The alternative as a plain client may see it: whole when it ended by itself, else
    cut after its last complete line ("" when it wrote no complete line)."""
    if completion.finish_reason not in CUT_SHORT:
        return completion.text
    end = completion.text.rfind("\n")
    return completion.text[:end].rstrip() if end > 0 else ""


def whole_alternatives(completions: Iterable[Completion]) -> list[Completion]:
    """The alternatives with their whole texts (`whole_text`), those non-empty and distinct, in rank order."""
    kept: list[Completion] = []
    seen: set[str] = set()
    for completion in completions:
        text = whole_text(completion)
        if text.strip() and text not in seen:
            seen.add(text)
            kept.append(completion if text == completion.text else replace(completion, text=text))
    return kept

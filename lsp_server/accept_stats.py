"""Whether suggestions are taken: shown / accepted / partially accepted, by rank and by
language. Each inline item carries a command (`kspec.accepted`) that the client runs when
the user accepts it (VS Code runs an item's command on a full accept and forwards it as
`workspace/executeCommand`; the Neovim plugin sends it on a full or a partial accept).
Its argument holds the rank, the language, and how many characters were taken of how
many: never the document's text, so nothing of it leaves the machine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lsprotocol import types as lsp

ACCEPT_COMMAND = "kspec.accepted"
MAX_RANK = 32  # ranks above are counted at this one (k is at most 32)


def item_command(rank: int, language: str, length: int) -> lsp.Command:
    """The command of the item at `rank` (0 = the first shown) whose text is `length` characters:
    it is given the length alone, so no text can reach the tally."""
    return lsp.Command(title="kspec: suggestion accepted", command=ACCEPT_COMMAND, arguments=[{"rank": rank, "language": language, "length": length}])


@dataclass
class Tally:
    shown: int = 0
    accepted: int = 0  # fully
    partial: int = 0  # a word or a line of it

    def to_dict(self) -> dict[str, Any]:
        rate = (self.accepted + self.partial) / self.shown if self.shown else None
        return {"shown": self.shown, "accepted": self.accepted, "partial": self.partial, "rate": None if rate is None else round(rate, 4)}


@dataclass
class Acceptance:
    total: Tally = field(default_factory=Tally)
    by_rank: dict[int, Tally] = field(default_factory=dict)
    by_language: dict[str, Tally] = field(default_factory=dict)

    def _tallies(self, rank: int, language: str) -> tuple[Tally, Tally, Tally]:
        rank = min(max(rank, 0), MAX_RANK)
        return self.total, self.by_rank.setdefault(rank, Tally()), self.by_language.setdefault(language or "unknown", Tally())

    def shown(self, language: str, count: int) -> None:
        """An answer of `count` items was shown (the client shows one at a time: each rank counts as offered)."""
        for rank in range(count):
            for tally in self._tallies(rank, language):
                tally.shown += 1

    def accepted(self, argument: Any) -> str | None:
        """The command's argument -> None, or what is wrong with it."""
        if not isinstance(argument, dict):
            return "expected {rank, language, length[, accepted]}"
        rank, language, length = argument.get("rank"), argument.get("language", ""), argument.get("length")
        taken = argument.get("accepted", length)
        if not (isinstance(rank, int) and isinstance(language, str) and isinstance(length, int) and isinstance(taken, int)) or isinstance(rank, bool):
            return "rank, length and accepted must be integers, language a string"
        partial = 0 <= taken < length
        for tally in self._tallies(rank, language):
            if partial:
                tally.partial += 1
            else:
                tally.accepted += 1
        return None

    def summary(self) -> dict[str, Any]:
        return self.total.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.total.to_dict(),
            "by_rank": [{"rank": rank, **tally.to_dict()} for rank, tally in sorted(self.by_rank.items())],
            "by_language": {language: tally.to_dict() for language, tally in sorted(self.by_language.items())},
        }

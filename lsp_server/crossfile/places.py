"""Recently edited and visited places, a ring buffer as llama.vim keeps (its chunks of recently
opened, edited and yanked text): each place is a document and a line; the chunk holding it is
looked up when context is gathered, so a place follows its document's later edits."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Place:
    uri: str
    line: int


class RecentPlaces:
    def __init__(self, size: int = 16) -> None:
        self._places: deque[Place] = deque(maxlen=size)

    def note(self, uri: str, line: int, near: int = 8) -> None:
        """A place edited or visited; one within `near` lines of a remembered one replaces it."""
        for place in list(self._places):
            if place.uri == uri and abs(place.line - line) <= near:
                self._places.remove(place)
        self._places.append(Place(uri, line))

    def forget(self, uri: str) -> None:
        for place in [p for p in self._places if p.uri == uri]:
            self._places.remove(place)

    def of(self, uri: str) -> list[int]:
        """The lines noted in `uri`, most recent last."""
        return [p.line for p in self._places if p.uri == uri]

    def uris(self) -> list[str]:
        return list(dict.fromkeys(p.uri for p in self._places))

"""Which engine replica answers a document: sticky placement, no Ray here.

A document's prefix cache lives on the replica that answered its last keystroke, so its
next keystroke must go there too while that replica is alive. A document seen for the
first time (or whose replica died) goes to the live replica holding the fewest
documents, ties broken by rendezvous (highest-random-weight) hashing of document and
replica, so placement spreads documents evenly and two routers that saw the same
documents agree. Used by kspec.engine.serve.cluster.DocumentRouter (Ray Serve's request-router
extension point); the table is bounded (least recently used documents are forgotten).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Collection

MAX_DOCUMENTS = 65536


def rendezvous_weight(document: str, replica: str) -> int:
    digest = hashlib.blake2b(f"{document}\x00{replica}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class DocumentPlacement:
    """document -> replica id, kept while the replica is live."""

    def __init__(self, max_documents: int = MAX_DOCUMENTS):
        if max_documents < 1:
            raise ValueError(f"max_documents must be >= 1, got {max_documents}")
        self.max_documents = max_documents
        self._replica_of: OrderedDict[str, str] = OrderedDict()  # least recently used first
        self._count: dict[str, int] = {}  # replica -> documents placed on it

    def __len__(self) -> int:
        return len(self._replica_of)

    def replica_of(self, document: str) -> str | None:
        return self._replica_of.get(document)

    def documents_on(self, replica: str) -> int:
        return self._count.get(replica, 0)

    def choose(self, document: str, live: Collection[str]) -> str:
        """The replica for `document` among the live ones (placing it if needed)."""
        if not live:
            raise ValueError("no live replica to choose from")
        current = self._replica_of.get(document)
        if current is not None and current in live:
            self._replica_of.move_to_end(document)
            return current
        chosen = min(live, key=lambda replica: (self._count.get(replica, 0), -rendezvous_weight(document, replica), replica))
        self._place(document, chosen)
        return chosen

    def forget_replica(self, replica: str) -> None:
        """The replica died or left: its documents are placed again on their next request."""
        for document in [d for d, r in self._replica_of.items() if r == replica]:
            del self._replica_of[document]
        self._count.pop(replica, None)

    def _place(self, document: str, replica: str) -> None:
        previous = self._replica_of.pop(document, None)
        if previous is not None:
            self._uncount(previous)
        self._replica_of[document] = replica
        self._count[replica] = self._count.get(replica, 0) + 1
        while len(self._replica_of) > self.max_documents:
            _, evicted = self._replica_of.popitem(last=False)
            self._uncount(evicted)

    def _uncount(self, replica: str) -> None:
        left = self._count.get(replica, 0) - 1
        if left > 0:
            self._count[replica] = left
        else:
            self._count.pop(replica, None)

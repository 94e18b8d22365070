"""Inline-completion trigger kinds in either numbering, normalized before validation.

LSP 3.18 says Invoked = 1, Automatic = 2; older clients (the proposed API) sent Invoked = 0,
Automatic = 1. A client that ever sends 0 uses the old numbering, so its 1 means Automatic. A
missing context means Invoked."""

from __future__ import annotations

from typing import Any

from lsprotocol import types as lsp


class TriggerKinds:
    """One client's numbering, learnt from what it sends."""

    def __init__(self) -> None:
        self.legacy = False

    def normalize(self, message: dict[str, Any]) -> None:
        """Rewrites an inline-completion request's trigger kind to LSP 3.18's numbering, in place."""
        if message.get("method") != lsp.TEXT_DOCUMENT_INLINE_COMPLETION or not isinstance(message.get("params"), dict):
            return
        params = message["params"]
        context = params.setdefault("context", {"triggerKind": 1})
        if not isinstance(context, dict):
            return
        kind = context.setdefault("triggerKind", 1)
        if kind == 0:
            self.legacy = True
            context["triggerKind"] = 1
        elif kind == 1 and self.legacy:
            context["triggerKind"] = 2

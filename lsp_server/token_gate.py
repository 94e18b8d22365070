"""The token a client of `kspec lsp --tcp` must show before anything else.

On a TCP port any local user (or any host, off loopback) can connect, and the language
server acts on what its client asks: read `engineTokenFile`, send documents to
`engineUrl`. So over TCP the first message must be `initialize` with the server's token
as `initializationOptions.lspToken`; anything else is refused and the connection closed.
"""

from __future__ import annotations

from typing import Any

from kspec.engine.serve.auth import tokens_match

TOKEN_KEY = "lspToken"


class TokenGate:
    def __init__(self, token: str):
        self._token = token
        self.passed = False

    def refusal(self, message: dict[str, Any]) -> str | None:
        """None when `message` may be handled (the token key is removed from it, so it
        never reaches the settings); else why the connection is refused."""
        if self.passed:
            return None
        params = message.get("params")
        options = params.get("initializationOptions") if isinstance(params, dict) else None
        given = options.pop(TOKEN_KEY, None) if isinstance(options, dict) else None
        if message.get("method") != "initialize" or "id" not in message:
            return f"the first message must be initialize with the server's token as initializationOptions.{TOKEN_KEY}"
        if not tokens_match(self._token, given):
            return f"missing or wrong initializationOptions.{TOKEN_KEY}"
        self.passed = True
        return None

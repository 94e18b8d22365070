"""The gatherer's validated configuration and its token budget."""

from __future__ import annotations

from dataclasses import dataclass

from kspec.engine.api import CONTEXT_SHARE

CHARS_PER_TOKEN = 3.0  # code averages 3-4 characters per BPE token: the budget is converted with the lower figure


@dataclass(frozen=True)
class ContextConfig:
    enabled: bool = True
    max_tokens: int = 1024  # the user's cap (setting `contextTokens`)
    query_lines_before: int = 40  # the lines around the cursor chunks are ranked against
    query_lines_after: int = 10
    max_chunks: int = 6
    min_similarity: float = 0.04  # a chunk sharing less with the cursor's lines is left out
    import_share: float = 0.6  # of the budget at most, for imported definitions
    refresh_gain: float = 0.3  # a new choice of chunks replaces the kept one when it ranks this much higher
    ring_size: int = 16

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if not 0.0 < self.import_share <= 1.0 or self.refresh_gain < 0 or self.max_chunks < 0 or self.ring_size < 1:
            raise ValueError("import_share in (0, 1], refresh_gain >= 0, max_chunks >= 0, ring_size >= 1")

    def budget_chars(self, prompt_tokens: float | None) -> int:
        """Characters of context: the user's cap, and at most the engine's `CONTEXT_SHARE` of what the
        machine prefills cold in its budget (`prompt_tokens`, the engine's machine fit; None: not known)."""
        tokens = self.max_tokens if prompt_tokens is None else min(self.max_tokens, int(prompt_tokens * CONTEXT_SHARE))
        return int(tokens * CHARS_PER_TOKEN) if self.enabled else 0

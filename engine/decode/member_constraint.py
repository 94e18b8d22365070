"""Names after `module.` kept to the module's members while a branch writes them.

A branch that writes `nodes.` for a module the file imports (`ModuleMembers`, from the context
gatherer) goes on, token by token, only with tokens that continue one of the module's names or
end a whole one (`nodes.Con` + `cat(`, not `nodes.Conc` + `atenate`): the monitor-guided
decoding of Agrawal et al. (2023), with the names the language server resolved. The cursor's own
`nodes.|` is the case of engine/decode/steering.py's member starts; this one covers a branch that
writes the qualifier itself (`raise nodes.Impossible()` from the line's start).

While a branch is inside such a name it is verified one token at a time (no drafts), as a
branch regenerating healed text is: the bias holds for position 0 of its row only.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor

from kspec.engine.api import ModuleMembers, goes_on_name
from kspec.engine.decode.branches import Branch
from kspec.engine.models.tokenizer import Tokenizer
from kspec.engine.syntax.members import member_names

TAIL_CHARS = 256  # of the text before the cursor: enough to hold `qualifier.` before a branch's text


class MemberConstraint:
    """The biases [V] for the branches (of one request) that are inside a module's member name."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, device: torch.device, prefix: str, members: tuple[ModuleMembers, ...]):
        self.tokenizer, self.vocab_size, self.device = tokenizer, vocab_size, device
        self.tail, self.members = prefix[-TAIL_CHARS:], members
        self._biases: dict[tuple[str, str, str], Tensor | None] = {}  # (qualifier, typed, healed text left) -> its bias

    def bias(self, branch: Branch) -> Tensor | None:
        """[V]: 0 on the tokens that continue or end a member name, -inf elsewhere; None where the
        branch is not inside a known module's name. A branch still regenerating healed text (the
        `.` of `nodes.`) takes that text first: a token may then be a start of it, or all of it
        followed by what the name allows (`.Con`)."""
        if branch.done:
            return None
        found = member_names(self.tail + branch.text, self.members, whole=True)
        if found is None:
            return None
        key = (found.qualifier, found.typed, branch.heal_remaining)
        if key not in self._biases:
            allowed = self._allowed(found.rests, branch.heal_remaining)
            bias = None
            if allowed:
                bias = torch.full((self.vocab_size,), float("-inf"), device=self.device)  # [V]
                bias[torch.tensor(sorted(allowed), dtype=torch.long, device=self.device)] = 0.0
            self._biases[key] = bias
        return self._biases[key]

    def _allowed(self, rests: tuple[str, ...], lead: str) -> set[int]:
        """Token ids whose text, after `lead` (healed text still to regenerate) or a start of it, is
        a start of a rest (the name goes on), or a rest followed by a character that cannot go on a
        name (`cat(`: the name ends there)."""
        index = self.tokenizer.token_text_index()
        allowed: set[int] = set()
        for end in range(1, len(lead) + 1):
            allowed.update(index.exactly(lead[:end]))
        for rest in rests:
            for end in range(1, len(rest) + 1):
                allowed.update(index.exactly(lead + rest[:end]))
            whole = lead + rest
            if not whole:
                allowed.update(self.tokenizer.name_end_ids())
                continue
            allowed.update(i for i, text in index.continuing(whole) if not goes_on_name(text[len(whole)]))
        return {i for i in allowed if i < self.vocab_size}

    def constrain(self, logits: Tensor, branches: list[Branch], rows: Collection[int] | None = None) -> Tensor:
        """logits [k, V] with the rows of branches inside a member name restricted (of `rows` only, when given)."""
        biases = [self.bias(branch) if rows is None or row in rows else None for row, branch in enumerate(branches)]
        if all(b is None for b in biases):
            return logits
        return logits + torch.stack([b if b is not None else torch.zeros_like(logits[0]) for b in biases])  # [k, V]


"""Branches steered by what the hole needs: some of the k branches start with a
forced text (`msg =` where the code after the cursor reads `msg` and nothing binds it:
engine/syntax/needs.py), the others decode freely.

A forced start is tokenized with the healed text in front of it (token healing: a branch
first regenerates the prompt's last characters, so the forced tokens are what the tokenizer
gives for that whole text, `forced_tokens`). Its first token replaces the branch's first
token; the others ride in the first verification pass as that branch's draft, so the target
scores every forced token in the pass that verifies the other branches' drafts, and the
branch's log-probability (what ranking reads) is the model's for the forced text. A start
the target scores below `SteeringConfig.min_logprob` in all is undone: the branch goes back
to the first token it had, and decodes freely.

Starts of one kind (the member names after `nodes.`) are ordered by the model before they are
assigned (`ranked_by_model`): the name whose first token it prefers most first, one name per
first token before a second, so the steered branches differ from their name's first token on.

The last branches are steered (`k - 1`, then `k - 2`, ...): in mode "diverse" the branches
come in the order of the model's first-token preference, and branch 0 always stays free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Collection, Sequence

import torch
from torch import Tensor

from kspec.engine.api import goes_on_name
from kspec.engine.config import SteeringConfig
from kspec.engine.decode.sampling import SamplingParams, choose_tokens
from kspec.engine.models.tokenizer import Tokenizer

MAX_FORCED_TOKENS = 12  # a start longer than this is not a start


def forced_tokens(tokenizer: Tokenizer, healed_text: str, start: str) -> list[int] | None:
    """The tokens a branch is forced to start with: `healed_text + start` as the tokenizer
    splits it; None when they do not spell it back exactly or are too many."""
    text = healed_text + start
    ids = tokenizer.encode(text)
    if not ids or len(ids) > MAX_FORCED_TOKENS or tokenizer.decode(ids) != text:
        return None
    return ids


def common_start(starts: Sequence[list[int]]) -> list[int]:
    """The tokens every start begins with (the healed text's, `.` before a member name), shorter
    than each start: the model's log-probabilities after them tell the starts apart."""
    common = list(starts[0]) if starts else []
    for start in starts[1:]:
        same = 0
        while same < min(len(common), len(start) - 1) and common[same] == start[same]:
            same += 1
        common = common[:same]
    return common[: min(map(len, starts)) - 1] if starts else []


def ranked_by_model(starts: Sequence[list[int]], next_log_probs: Callable[[list[int]], Tensor]) -> list[list[int]]:
    """The starts grouped by their first token after `common_start`, the groups in the order the
    model prefers that token (`next_log_probs(common)` -> [V]: its log-probabilities after the
    prompt and those tokens), each group in the given order; then round robin: each group's
    first start, then each group's second, ..."""
    if not starts:
        return []
    common = common_start(starts)
    groups: dict[int, list[list[int]]] = {}
    for start in starts:
        groups.setdefault(start[len(common)], []).append(start)
    scores = next_log_probs(common)[torch.tensor(list(groups), dtype=torch.long)].tolist()  # [groups]
    ordered = [groups[token] for _, token in sorted(zip(scores, groups), key=lambda pair: -pair[0])]
    return [group[at] for at in range(max(map(len, ordered))) for group in ordered if at < len(group)]


PAST_INDENT_CANDIDATES = 64  # of the tokens after the indentation, the likeliest looked at for distinct content
MAX_INDENT_TOKENS = 4  # an indentation longer than this many tokens is not followed further


def past_indentation_starts(
    first_log_probs: Tensor, texts: Sequence[str], stop_ids: Collection[int], healed_text: str,
    next_log_probs: Callable[[list[int]], Tensor], k: int, one_line: bool = False,
) -> list[list[int]]:
    """At a line start the k most likely distinct first tokens are mostly indentations (`\n   `,
    `\n       `, `\n      `: after token healing, the newline and the spaces are one token in
    some vocabularies; in others, Qwen's, the line break is one and the spaces the next), so
    diverse branches write one line at several depths. Where two or more of them are whitespace
    only and the likeliest is one (a single line break, covering the healed text), the branches
    split after the likeliest indentation instead (that token, and then while the likeliest next
    one is spaces only, it too: `\n` + `       `): the starts for branches 1..k-1 are that
    indentation followed by the 2nd..k-th likeliest distinct content tokens after it
    (`next_log_probs(indent)` -> [V]); branch 0 writes the likeliest itself. first_log_probs [V]:
    the first token's, healing applied.
    [] where this does not apply, and where that line break is text written after the healed
    text while the cursor's rule ends the text at a line break (`one_line`): every start would be
    cut to nothing (seen at `return |` where the model would end the line: k empty alternatives)."""
    top = torch.topk(first_log_probs, min(k, first_log_probs.shape[-1])).indices.tolist()  # [k]
    blank = [token for token in top if not texts[token].strip()]
    indent = top[0]
    text = texts[indent]
    if len(blank) < 2 or text.strip() or text.count("\n") > 1 or not text.startswith(healed_text):
        return []
    if one_line and "\n" in text[len(healed_text) :]:
        return []
    path = [indent]
    after = next_log_probs([*path])  # [V]
    while len(path) < MAX_INDENT_TOKENS:
        spaces = int(torch.argmax(after))
        if texts[spaces].strip() or "\n" in texts[spaces] or not texts[spaces] or spaces in stop_ids:
            break
        path.append(spaces)
        after = next_log_probs([*path])  # [V]
    contents: list[int] = []
    for token in torch.topk(after, min(PAST_INDENT_CANDIDATES, after.shape[-1])).indices.tolist():
        if texts[token].strip() and "\n" not in texts[token] and token not in stop_ids:
            contents.append(token)
        if len(contents) == k:
            break
    return [[*path, token] for token in contents[1:]]


@dataclass
class _Forced:
    tokens: list[int]  # the whole forced start
    free: tuple[int, float]  # the first token (and its log-probability) the branch had without it
    first_logprob: float  # the target's log-probability of tokens[0] (the prompt's logits)


@dataclass
class ForcedStarts:
    """Which branches start forced, and the one verification that scores their starts."""

    config: SteeringConfig
    by_branch: dict[int, _Forced] = field(default_factory=dict)
    verifying: set[int] = field(default_factory=set)  # rows (this round) whose draft is a forced start
    assigned: int = 0  # branches that started forced
    undone: int = 0  # ... whose start the target scored below the floor

    @classmethod
    def assign(
        cls, config: SteeringConfig, starts: Sequence[list[int]], first_log_probs: Tensor, tokens: list[int], logprobs: list[float]
    ) -> "ForcedStarts":
        """first_log_probs [k, V]: the branches' first-token log-probabilities (healing applied);
        tokens / logprobs: their free first tokens, replaced in place where a start is forced.
        A start whose first token alone scores below the floor is not forced."""
        forced = cls(config)
        k = len(tokens)
        for start, branch in zip(starts[: min(config.branches, k - 1)], range(k - 1, 0, -1)):
            first = float(first_log_probs[branch, start[0]])
            if first < config.min_logprob:
                continue
            forced.by_branch[branch] = _Forced(list(start), (tokens[branch], logprobs[branch]), first)
            tokens[branch], logprobs[branch] = start[0], first
            forced.assigned += 1
        return forced

    def drafts(self, live: list[int]) -> dict[int, list[int]]:
        """row -> the forced tokens still to verify (none for a one-token start), for the branches
        (of `live`, the branch of each row) whose start is not verified yet; they are verified in
        this round."""
        rows = {row: self.by_branch[index].tokens[1:] for row, index in enumerate(live) if index in self.by_branch}
        self.verifying = set(rows)  # a one-token start too: its branch's next token is chosen here (`score`)
        return rows

    def score(
        self, index: int, hidden: Tensor, head: Callable[[Tensor], Tensor], first: Callable[[Tensor], Tensor],
        params: SamplingParams, generator: torch.Generator, ends_name: Callable[[int], Tensor | None],
    ) -> Verified:
        """Branch `index`'s forced start as the target scored it. hidden [T, dim]: the final hidden
        states of its row; head: [n, dim] -> logits [n, V]; first: position 0's logits [1, V] -> the
        same, constrained (token healing); ends_name(last forced token) -> a bias [V] that keeps
        the next token from running a name the start ends with on into another (`nodes.Node` +
        `Bound`), None where the start does not end inside a name."""
        forced = self.by_branch.pop(index)
        rest = forced.tokens[1:]
        logits = head(hidden[: len(rest) + 1]).float()  # [n + 1, V]
        logits = torch.cat([first(logits[:1]), logits[1:]])
        log_probs = torch.log_softmax(logits, dim=-1)  # [n + 1, V]
        scores = log_probs[torch.arange(len(rest)), torch.tensor(rest, dtype=torch.long)].tolist()  # [n]
        if forced.first_logprob + sum(scores) < self.config.min_logprob:
            self.undone += 1
            return Verified([forced.free[0]], [forced.free[1]], undone=True)
        after = logits[len(rest) :]  # [1, V]
        bias = ends_name(forced.tokens[-1])
        if bias is not None:
            after = after + bias
        own, _ = choose_tokens(after, params, generator)  # [1]
        own_logprob = float(log_probs[len(rest), int(own)])  # the model's, not the biased choice's
        return Verified(rest + [int(own)], scores + [own_logprob], undone=False)


@dataclass(frozen=True)
class Verified:
    """A forced start after its verification: the tokens the branch takes now, with their
    log-probabilities — the forced ones after the first and the target's next token; or, where
    the start was undone, the branch's own first token, from which it decodes again."""

    tokens: list[int]
    logprobs: list[float]
    undone: bool


class NameEndBias:
    """`ForcedStarts.score`'s `ends_name`: after a forced start that ends inside a name (its last
    token's text ends with an identifier character), a bias [V] of -inf on the tokens that would
    run the name on; None otherwise. The bias is built on first use."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, device: torch.device) -> None:
        self.tokenizer, self.vocab_size, self.device = tokenizer, vocab_size, device
        self._bias: Tensor | None = None  # [V]

    def __call__(self, last: int) -> Tensor | None:
        if not goes_on_name(self.tokenizer.token_texts()[last][-1:]):
            return None
        if self._bias is None:
            self._bias = torch.zeros(self.vocab_size, device=self.device)  # [V]
            ids = [i for i in self.tokenizer.word_start_ids() if i < self.vocab_size]
            self._bias[torch.tensor(ids, dtype=torch.long, device=self.device)] = float("-inf")
        return self._bias

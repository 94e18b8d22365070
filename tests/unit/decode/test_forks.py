"""Diverse branches split where the model hesitates (engine/decode/forks.py)."""

from __future__ import annotations

import math

import torch

from kspec.engine.decode.branches import Branch
from kspec.engine.decode.forks import LaterForks, plausible_first_tokens


def _logits(probabilities: dict[int, float], vocab: int = 10) -> torch.Tensor:
    rest = (1.0 - sum(probabilities.values())) / (vocab - len(probabilities))
    return torch.tensor([math.log(probabilities.get(i, rest)) for i in range(vocab)])  # [V]


def test_only_plausible_first_tokens_start_branches_of_their_own() -> None:
    logits = _logits({3: 0.80, 5: 0.12, 7: 0.02})
    tokens, logprobs, plausible = plausible_first_tokens(logits, 4, frozenset(), 0.1)
    assert plausible == 2 and tokens.tolist() == [3, 5, 3, 3]  # 7 is 0.025 of the best: not plausible
    assert math.isclose(float(logprobs[1]), math.log(0.12), rel_tol=1e-4)
    tokens, _, plausible = plausible_first_tokens(logits, 4, frozenset({5}), 0.1)  # banned: a stop token
    assert plausible == 1 and tokens.tolist() == [3, 3, 3, 3]
    tokens, _, plausible = plausible_first_tokens(logits, 4, frozenset(), 0.0)  # 0: the k likeliest, as before
    assert plausible == 4 and tokens.tolist()[:3] == [3, 5, 7] and len(set(tokens.tolist())) == 4


def test_waiting_branches_take_the_alternatives_of_the_first_hesitation_in_order() -> None:
    forks = LaterForks(0.1, frozenset({9}), waiting={1, 2, 3})
    branches = [Branch(token_ids=[3]) for _ in range(4)]
    live = [0, 1, 2, 3]
    sure = torch.stack([_logits({4: 0.95})] * 4)  # [4, V]: no hesitation
    assert torch.equal(forks.constrain(sure, live, branches), sure) and forks.waiting == {1, 2, 3}
    for branch in branches:
        branch.token_ids.append(4)
    torn = torch.stack([_logits({6: 0.5, 2: 0.3, 9: 0.15, 8: 0.04})] * 4)  # [4, V]: 2 plausible, 9 banned, 8 too unlikely
    constrained = forks.constrain(torn, live, branches)
    assert constrained.argmax(dim=-1).tolist() == [6, 2, 6, 6]  # the greedy row is left alone; one alternative, one branch
    assert forks.waiting == {2, 3} and forks.forked == 1
    logprobs = [[-0.1], [-0.2], [-0.3], [-0.4]]
    forks.keep_own_logprobs(logprobs)
    assert math.isclose(logprobs[1][0], math.log(0.3), rel_tol=1e-4) and logprobs[2] == [-0.3]  # the model's own
    branches[2].heal_remaining = "x"  # still regenerating healed text: not free to split
    assert forks.rows(live, branches) == {3}

"""Diverse branches split where the model hesitates (engine/decode/forks.py)."""

from __future__ import annotations

import math

import pytest
import torch

from kspec.engine.decode.branches import Branch
from kspec.engine.decode.forks import LaterForks, begins_a_word, plausible_first_tokens


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
    forks = LaterForks(0.1, frozenset({9}), frozenset(), waiting={1, 2, 3})
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


@pytest.mark.parametrize("drafter", ["none", "lookup"])
def test_a_branch_that_goes_back_to_a_split_decodes_on_as_if_it_had_started_there(default_engine, drafter: str) -> None:
    """No first token but the best is plausible at a ratio of 0.99, so three branches wait, reach the
    greedy path's end, and go back to splits: each one's tokens are greedy's up to its split, its
    split token, then what greedy decoding gives from there (the rolled-back KV is right)."""
    from kspec.bench.baselines import decode_regular, decode_speculative, greedy_batch
    from kspec.engine.decode.branches import BranchTracker, DecodeLimits
    from kspec.engine.decode.drafters import NoDrafter, PromptLookupDrafter
    from kspec.engine.decode.sampling import SamplingParams
    from kspec.engine.decode.stopping import StopRule

    model, tokenizer = default_engine.target.model, default_engine.target.tokenizer
    prompt = tokenizer.encode("def mean(values):\n    total = 0\n    for value in values:\n")
    new = 16

    def tracker() -> BranchTracker:
        return BranchTracker(tokenizer, StopRule(), DecodeLimits(new, ignore_eos=True), prompt)

    greedy = decode_regular(model, tracker(), 1, SamplingParams(), diverse=True).branches[0].token_ids
    made = NoDrafter() if drafter == "none" else PromptLookupDrafter()
    output = decode_speculative(model, tracker(), 4, SamplingParams(), made, diverse=True, fork_ratio=0.99)
    branches = [b.token_ids for b in output.branches]
    assert branches[0] == greedy and len({tuple(b) for b in branches}) == 4
    for tokens in branches[1:]:
        split = next(i for i, (a, b) in enumerate(zip(tokens, greedy)) if a != b)
        assert tokens[:split] == greedy[:split] and len(tokens) == new
        rest = greedy_batch(model, [prompt + tokens[: split + 1]], new - split - 1)[0]
        assert tokens[split + 1 :] == rest, split


def test_a_last_resort_first_word_is_a_new_word_not_another_spelling_of_the_typed_one(default_engine) -> None:
    """Under token healing (`retu` held back), a first token that only respells the typed text,
    only adds whitespace, or runs the name on differently is no alternative; a new word is."""
    texts = default_engine.target.tokenizer.token_texts()

    def begins(token_text: str, healed: str) -> bool:  # the rule on a token of the small model
        return begins_a_word(texts[texts.index(token_text)], healed)

    assert not begins("ret", "ret")  # only the healed text again
    assert not begins("return", "ret") and not begins("rets", "ret")  # the name runs on
    assert begins(" return", " ")  # a new word after a space
    assert not begins("  ", " ")  # only whitespace

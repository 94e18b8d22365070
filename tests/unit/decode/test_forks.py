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


def test_another_spacing_of_the_same_code_is_no_alternative() -> None:
    """` []\n` after ` []\n\n`, `)\n` for `)\n\n`: the same code once trimmed, so neither a first
    token of its own nor a split (they made k branches that deduplication merged into one)."""
    texts = ["a", " []\n\n", " []\n", ")\n\n", ")\n", " [x", ")", "b", "c", "d"]
    logits = _logits({1: 0.5, 2: 0.3, 5: 0.1})
    tokens, _, plausible = plausible_first_tokens(logits, 4, frozenset(), 0.1, texts)
    assert plausible == 2 and tokens.tolist()[:2] == [1, 5]  # 2 is 1 in other spacing
    forks = LaterForks(0.1, frozenset(), frozenset(), waiting={1}, texts=texts)
    forks.observe(_logits({3: 0.6, 4: 0.2, 6: 0.1, 7: 0.05}), (0,), "a")
    moves = forks.plan(Branch(token_ids=[0, 3], text="a)"))
    assert [split.token for split in moves.values()] == [7]  # the likeliest alternative but 4 (spacing) and 6 (the same `)`)


def test_waiting_branches_take_the_alternatives_of_the_first_hesitation_in_order() -> None:
    """The lead's positions decide: a plausible alternative is taken at once (lowest waiting
    branch first), a less likely one is held tentatively, and at the end of the lead's first line
    what a branch holds is its own; a branch with nothing to hold stays a copy of the lead."""
    forks = LaterForks(0.1, frozenset({9}), frozenset(), waiting={1, 2, 3})
    forks.observe(_logits({4: 0.95}), (3,), "x")  # no hesitation
    assert forks.plan(Branch(token_ids=[3, 4], text="xy")) == {} and forks.waiting == {1, 2, 3}
    torn = _logits({6: 0.5, 2: 0.3, 9: 0.15, 8: 0.04})  # [V]: 2 plausible, 9 banned, 8 too unlikely for now
    forks.observe(torn, (3, 4), "xy")
    forks.observe(torn, (3, 4, 6, 1), "xy z")  # a position the lead did not reach (it ended before): nothing
    moves = forks.plan(Branch(token_ids=[3, 4, 6], text="xy z"))
    assert {index: (split.position, split.token) for index, split in moves.items()} == {1: (2, 2), 2: (2, 8)}
    assert math.isclose(moves[1].logprob, math.log(0.3), rel_tol=1e-4)  # the model's own
    assert forks.waiting == {2, 3} and forks.forked == 1 and forks.tentative == {2: moves[2]}
    assert forks.plan(Branch(token_ids=[3, 4, 6, 5], text="xy z\n")) == {}  # the first line is written: 2 keeps its split
    assert forks.waiting == {3} and forks.forked == 2 and forks.tentative == {}
    forks.observe(_logits({7: 0.9, 1: 0.05}), (3, 4, 6, 5), "xy z\n")  # after the first line: the first split seen is 3's
    moves = forks.plan(Branch(token_ids=[3, 4, 6, 5, 7], text="xy z\nw"))
    assert {index: (split.position, split.token) for index, split in moves.items()} == {3: (4, 1)} and forks.waiting == set()
    waiting_at_the_end = LaterForks(0.1, frozenset(), frozenset(), waiting={1})  # no split anywhere: a copy of the lead
    assert waiting_at_the_end.plan(Branch(token_ids=[3], text="x", finish_reason="stop")) == {1: None}


def test_a_lead_that_writes_nothing_sends_the_waiting_branches_to_other_whitespace_starts() -> None:
    """HumanEval/48 at 0.5B: after a function's docstring the model would end the function (`\n\n\n`)
    where the hole is its body. No first token began a word, so the waiting branches copied the
    lead and the answer was empty; now they start with the likeliest other whitespace (`\n` + body)."""
    texts = ["\n\n\n", "\n    \n", "\n", "\n\n", "x", "y", "<eos>", "a", "b", "c"]
    first = _logits({0: 0.5, 1: 0.2, 2: 0.1, 6: 0.15})  # [V]: 6 is a stop token, never a start
    for lead, expected in ((Branch(token_ids=[0], text="", finish_reason="stop"), {1: 1, 2: 2}),
                           (Branch(token_ids=[4], text="x", finish_reason="stop"), {1: None, 2: None})):  # it wrote something: copies
        forks = LaterForks(0.1, frozenset({0, 1, 2, 3, 6}), frozenset(), waiting={1, 2}, texts=texts, stops=frozenset({6}))
        forks.offer_first(first, [0], lambda token: False)
        moves = forks.plan(lead)
        assert {index: None if split is None else split.token for index, split in moves.items()} == expected
        assert forks.waiting == set()


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


@pytest.mark.parametrize("fork_ratio", [0.99, 0.3, 0.05])
def test_the_same_splits_whether_the_lead_verifies_drafts_or_one_token_a_round(default_engine, fork_ratio: float) -> None:
    """The splits are read at every position the lead's row verifies, and the waiting branches
    explore their best splits meanwhile: the same k texts as when every row decodes one token a
    round (no drafts), in about the rounds of the greedy branch alone (when the waiting branches
    walked the lead's path one token a round, 10 where it takes 4, at 0.99). Splits taken at once
    (ratios 0.3, 0.05) and at the end of the first line (0.99) both count. The drafter is the
    target itself (it drafts each row's own greedy path)."""
    from kspec.bench.baselines import decode_speculative
    from kspec.engine.decode.branches import BranchTracker, DecodeLimits
    from kspec.engine.decode.drafters import ModelDrafter, NoDrafter
    from kspec.engine.decode.sampling import SamplingParams
    from kspec.engine.decode.speculative import SpeculationConfig
    from kspec.engine.decode.stopping import StopRule

    model, tokenizer = default_engine.target.model, default_engine.target.tokenizer
    prompt = tokenizer.encode("def mean(values):\n    total = 0\n    for value in values:\n        total += value\n")
    new = 24

    def tracker() -> BranchTracker:
        return BranchTracker(tokenizer, StopRule(), DecodeLimits(new, ignore_eos=True), prompt)

    def run(k: int, drafter):
        return decode_speculative(model, tracker(), k, SamplingParams(), drafter, SpeculationConfig(cost_aware=False), diverse=True, fork_ratio=fork_ratio)

    plain, drafted, alone = run(4, NoDrafter()), run(4, ModelDrafter(model, SamplingParams())), run(1, ModelDrafter(model, SamplingParams()))
    assert sorted(b.token_ids for b in drafted.branches) == sorted(b.token_ids for b in plain.branches)
    assert drafted.branches[0].token_ids == alone.branches[0].token_ids and len({tuple(b.token_ids) for b in drafted.branches}) == 4
    assert drafted.stats.rounds <= alone.stats.rounds + 1 < plain.stats.rounds, (drafted.stats.rounds, alone.stats.rounds, plain.stats.rounds)



CLOSED_PROMPT = "values = [3, 1, 2]\ntotal = sum(values"  # the small model's best start: `)`


def test_a_first_token_that_only_repeats_what_the_editor_closed_is_an_echo(default_engine) -> None:
    """`return [|]`: the empty list (` []`, ` []\\n\\n`, after the healed ` [`) writes only what the line
    holds after the cursor, which post-processing cuts: nothing to show. Where the rest of the line
    is only punctuation, such first tokens are echoes; a line with a name after the cursor has none
    (the user may be inserting before it)."""
    from kspec.engine.decode.branches import suffix_echoes

    tokenizer = default_engine.target.tokenizer
    texts = tokenizer.token_texts()
    echoes = {texts[token] for token in suffix_echoes(tokenizer, " [", "]\n\n    def count(self):")}
    assert " []" in echoes and all(text.startswith(" [") and text[2:].strip() == "]" for text in echoes)
    closing = {texts[token].rstrip() for token in suffix_echoes(tokenizer, "", "):\n        pass")}
    assert ")" in closing and closing <= {")", "):"}
    assert suffix_echoes(tokenizer, "", "self.items)\n") == frozenset()
    assert suffix_echoes(tokenizer, "", "\n") == frozenset()


def test_no_branch_starts_with_an_echo_the_best_one_included(default_engine) -> None:
    """After `sum(values` the best start closes the call; with that `)` after the cursor (as an
    editor closes it), no branch starts with it, the best one included (the control: without the
    suffix the best one does)."""
    from kspec.bench.baselines import decode_speculative
    from kspec.engine.api import goes_on_name
    from kspec.engine.decode.branches import BranchTracker, DecodeLimits
    from kspec.engine.decode.drafters import NoDrafter
    from kspec.engine.decode.sampling import SamplingParams
    from kspec.engine.decode.stopping import StopRule

    model, tokenizer = default_engine.target.model, default_engine.target.tokenizer
    prompt = tokenizer.encode(CLOSED_PROMPT)

    texts = tokenizer.token_texts()

    def first_tokens(suffix: str) -> list[int]:
        tracker = BranchTracker(tokenizer, StopRule(), DecodeLimits(6, ignore_eos=True), prompt, suffix=suffix)
        output = decode_speculative(model, tracker, 4, SamplingParams(), NoDrafter(), diverse=True, fork_ratio=0.1)
        return [branch.token_ids[0] for branch in output.branches]

    free = first_tokens("")
    closer = texts[free[0]].strip()  # as if the editor had closed what the best start writes
    assert closer and not any(goes_on_name(char) or char.isspace() for char in closer), closer
    held = first_tokens(closer + "\n")
    assert all(texts[token].strip() != closer for token in held), ([texts[t] for t in free], [texts[t] for t in held])

"""Branches steered by what the hole needs (engine/decode/steering.py): a forced start rides
in the first verification pass like a draft, is kept whatever the target's argmax, and is
scored by the target; a start scored below the floor is undone."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from kspec.engine.api import CompletionRequest, ModuleMembers
from kspec.engine.cache.prefix_cache import prefill_uncached
from kspec.engine.decode.branches import BranchTracker, DecodeLimits
from kspec.engine.decode.drafters import ModelDrafter, NoDrafter, PromptLookupDrafter
from kspec.engine.decode.sampling import SamplingParams
from kspec.engine.decode.speculative import SpeculativeRun, pad_rows
from kspec.engine.decode.steering import (
    MAX_FORCED_TOKENS, ForcedStarts, SteeringConfig, common_start, forced_tokens, past_indentation_starts, ranked_by_model,
)
from kspec.engine.decode.healing import HealingBias
from kspec.engine.decode.stopping import StopRule, rule_for_cursor
from kspec.engine.request import steering_starts

CODE = "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n"
START = "    return msg"  # what the random model would never write: forced, then scored
OPEN = SteeringConfig(branches=1, min_logprob=-1000.0)


def _run(engine, forced=(), steering=OPEN, drafter=None, params=SamplingParams(), k=4) -> SpeculativeRun:
    model, tokenizer = engine.target.model, engine.target.tokenizer
    tracker = BranchTracker(tokenizer, StopRule(), DecodeLimits(10, ignore_eos=True), tokenizer.encode(CODE))
    run = SpeculativeRun(
        model, tracker, k, params, drafter or PromptLookupDrafter(), diverse=params.greedy, forced=forced, steering=steering
    )
    with torch.inference_mode():
        while not run.finished():
            run.accept(model(pad_rows(run.propose(), model.device), run.cache), 1.0)
    return run


def _model_logprobs(engine, tokens: list[int]) -> list[float]:
    """The target's log-probability of each of `tokens` after CODE, one plain prefill each."""
    model, prompt = engine.target.model, engine.target.tokenizer.encode(CODE)
    out = []
    with torch.inference_mode():
        for i, token in enumerate(tokens):
            logits = prefill_uncached(model, prompt + tokens[:i]).last_logits.float()  # [V]
            out.append(float(torch.log_softmax(logits, dim=-1)[token]))
    return out


@pytest.mark.parametrize("drafter", ["none", "lookup", "model-self"])
def test_a_steered_branch_carries_its_start_scored_by_the_model_and_the_others_stay_free(random_engine, drafter):
    start = forced_tokens(random_engine.target.tokenizer, "", START)
    assert start is not None and len(start) > 1
    make = {
        "none": NoDrafter,
        "lookup": PromptLookupDrafter,
        "model-self": lambda: ModelDrafter(random_engine.target.model, SamplingParams()),
    }[drafter]
    free = _run(random_engine, drafter=make())
    steered = _run(random_engine, forced=[start], drafter=make())
    branch = steered.branches[3]  # the last branch is steered, branch 0 never
    assert branch.token_ids[: len(start)] == start and len(branch.token_ids) == 10
    expected = _model_logprobs(random_engine, branch.token_ids[: len(start) + 1])
    assert branch.logprobs[: len(start) + 1] == pytest.approx(expected, abs=1e-3)  # what ranking reads is the model's
    # after the start, the target's own greedy choice, of the tokens that do not run its last name (`msg`) on
    tokenizer = random_engine.target.tokenizer
    with torch.inference_mode():
        after = prefill_uncached(random_engine.target.model, tokenizer.encode(CODE) + start).last_logits.float()  # [V]
        after[tokenizer.word_start_ids()] = float("-inf")
    assert branch.token_ids[len(start)] == int(after.argmax())
    assert not tokenizer.decode([branch.token_ids[len(start)]])[:1].isalnum()
    assert [b.token_ids for b in steered.branches[:3]] == [b.token_ids for b in free.branches[:3]]
    assert steered.forced.assigned == 1 and steered.forced.undone == 0
    assert branch.text.startswith(START)


def test_a_start_the_model_scores_below_the_floor_is_undone(random_engine):
    start = forced_tokens(random_engine.target.tokenizer, "", START)
    scores = _model_logprobs(random_engine, start)
    floor = (scores[0] + sum(scores)) / 2  # the first token alone passes, the whole start does not
    free = _run(random_engine)
    undone = _run(random_engine, forced=[start], steering=SteeringConfig(branches=1, min_logprob=floor))
    assert undone.forced.assigned == 1 and undone.forced.undone == 1
    assert [b.token_ids for b in undone.branches] == [b.token_ids for b in free.branches]  # decoded as if never steered
    flat = [lp for b in undone.branches for lp in b.logprobs]
    assert flat == pytest.approx([lp for b in free.branches for lp in b.logprobs], abs=1e-4)


def test_a_start_whose_first_token_scores_below_the_floor_is_not_forced(random_engine):
    start = forced_tokens(random_engine.target.tokenizer, "", START)
    first = _model_logprobs(random_engine, start[:1])[0]
    run = _run(random_engine, forced=[start], steering=SteeringConfig(branches=1, min_logprob=first + 0.5))
    assert run.forced.assigned == 0 and run.branches[3].token_ids[: len(start)] != start


def test_a_sampled_run_keeps_its_start_too(random_engine):
    start = forced_tokens(random_engine.target.tokenizer, "", START)
    run = _run(random_engine, forced=[start], params=SamplingParams(temperature=0.8, seed=5))
    assert run.branches[3].token_ids[: len(start)] == start and run.forced.assigned == 1


def test_branch_zero_is_never_steered_and_at_most_the_configured_number_are():
    log_probs = torch.zeros(3, 10)
    tokens, logprobs = [1, 2, 3], [-0.1, -0.2, -0.3]
    forced = ForcedStarts.assign(SteeringConfig(branches=5), [[7, 8], [6], [5]], log_probs, tokens, logprobs)
    assert sorted(forced.by_branch) == [1, 2] and tokens == [1, 6, 7]  # the first start on the last branch
    one = ForcedStarts.assign(SteeringConfig(branches=1), [[7, 8]], torch.zeros(1, 10), [4], [-0.1])
    assert one.by_branch == {}  # k = 1: the only branch stays free


def test_forced_tokens_spell_the_healed_text_and_the_start(random_engine):
    tokenizer = random_engine.target.tokenizer
    ids = forced_tokens(tokenizer, "\n    ", "msg =")
    assert ids is not None and tokenizer.decode(ids) == "\n    msg ="
    assert forced_tokens(tokenizer, "", "x" * 200 + " =") is None or len(tokenizer.encode("x" * 200)) <= MAX_FORCED_TOKENS


def test_steering_config_is_validated():
    with pytest.raises(ValueError):
        SteeringConfig(branches=-1)
    with pytest.raises(ValueError):
        SteeringConfig(min_logprob=0.0)


def test_the_embedded_model_steers_a_branch_to_bind_what_the_suffix_needs(default_engine):
    """On the embedded model, through a whole request: a branch binds `us` (the suffix returns
    it and nothing binds it; the model, which does not see the suffix, would not write it), and
    its score is the model's for the text it wrote."""
    request = CompletionRequest(
        prefix="def stats(values):\n    ", suffix="\n    return us\n", language="python", k=4, max_tokens=16, raw=True,
        deadline_ms=120_000,
    )
    saved = default_engine.config
    try:
        default_engine.config = replace(saved, steer_branches=0)
        free = default_engine.complete(request)
        default_engine.config = replace(saved, steer_branches=1, steer_min_logprob=-30.0)
        steered = default_engine.complete(request)
    finally:
        default_engine.config = saved
    assert not any(c.text.startswith("us =") for c in free.completions)
    bound = [c for c in steered.completions if c.text.startswith("us =")]
    assert steered.timing_ms["steered"] == 1.0 and len(bound) == 1, [c.text for c in steered.completions]
    assert -30.0 < bound[0].logprob < max(c.logprob for c in free.completions)  # forced: less likely than the model's best


def test_a_one_token_start_ending_a_name_is_not_run_on_into_another(random_engine):
    tokenizer = random_engine.target.tokenizer
    start = forced_tokens(tokenizer, "", " value")
    assert start is not None and len(start) == 1
    run = _run(random_engine, forced=[start])
    branch = run.branches[3]
    assert branch.token_ids[0] == start[0] and run.forced.assigned == 1 and len(branch.token_ids) == 10
    assert not tokenizer.decode([branch.token_ids[1]])[:1].isalnum()  # the random model's argmax would be any token
    expected = _model_logprobs(random_engine, branch.token_ids[:2])
    assert branch.logprobs[:2] == pytest.approx(expected, abs=1e-3)  # the model's own scores, not the biased choice's


def test_common_start_is_what_every_start_begins_with_short_of_each():
    assert common_start([[1, 2, 3], [1, 2, 4], [1, 5]]) == [1]
    assert common_start([[1, 2], [1, 2, 3]]) == [1]  # shorter than each: the next token tells them apart
    assert common_start([[1, 2], [3, 4]]) == [] and common_start([]) == []


def test_ranked_by_model_orders_by_the_next_token_one_per_token_first():
    starts = [[9, 1, 7], [9, 2], [9, 1, 8], [9, 3], [9, 2, 5]]
    log_probs = torch.tensor([0.0, -2.0, -0.5, -1.0, 0, 0, 0, 0, 0, -9.0])  # [V]: after [9], token 2 then 3 then 1
    asked = []
    ranked = ranked_by_model(starts, lambda common: asked.append(common) or log_probs)
    assert asked == [[9]]
    assert ranked == [[9, 2], [9, 3], [9, 1, 7], [9, 2, 5], [9, 1, 8]]  # one per token, then the second of each


def test_the_embedded_model_after_a_module_qualifier_writes_the_modules_names(default_engine):
    """After `nodes.` with the module's names given (the context gatherer's), the steered branches
    start with names it has, the model's likeliest first and the one the enclosing function's name
    shares a word with, and the top suggestion is one of them; without the names the model makes
    one up."""
    names = ("Node", "Stmt", "Expr", "Add", "Sub", "Concat", "Const", "TemplateData", "Tuple", "List", "Dict", "Name", "Call")
    request = CompletionRequest(
        prefix="from jinja2 import nodes\n\n\ndef parse_concat(self, args, lineno):\n    return nodes.", suffix="\n",
        language="python", k=4, max_tokens=16, deadline_ms=120_000, members=(ModuleMembers("nodes", names),),
    )  # fmt: skip
    steered = default_engine.complete(request)
    free = default_engine.complete(replace(request, members=()))
    leading = [re.match(r"\w*", c.text).group(0) for c in steered.completions]  # type: ignore[union-attr]
    assert steered.timing_ms["steered"] == 3 and sum(name in names for name in leading) >= 3
    assert leading[0] in names
    assert "Concat" in leading  # the name the enclosing `def parse_concat` shares a word with is steered to
    assert free.timing_ms["steered"] == 0 and re.match(r"\w*", free.completions[0].text).group(0) not in names  # type: ignore[union-attr]


def test_member_starts_put_the_name_the_code_around_the_cursor_shares_a_word_with_first(default_engine):
    """The model's preference alone would steer to the names it likes most; a name sharing a word
    with the enclosing definition (`def parse_slice` -> `Slice`) takes a steered branch first,
    the model's likeliest still branch 0's, and one steered branch keeps the model's choice."""
    from kspec.engine.request import steering_starts

    names = ("Add", "Call", "Dict", "List", "Node", "Pow", "Slice", "Sub")
    request = CompletionRequest(
        prefix="from jinja2 import nodes\n\n\ndef parse_slice(self, args):\n    return nodes.", suffix="\n",
        language="python", k=4, max_tokens=16, members=(ModuleMembers("nodes", names),),
    )  # fmt: skip
    tokenizer = default_engine.target.tokenizer
    vocab = default_engine.target.model.args.vocab_size
    order = ["Node", "Pow", "List", "Add", "Call", "Dict", "Sub", "Slice"]  # what this fake model prefers, Slice last

    def next_log_probs(common: list[int]) -> torch.Tensor:
        scores = torch.full((vocab,), -50.0)  # [V]
        for rank, name in enumerate(order):
            scores[forced_tokens(tokenizer, ".", name)[len(common)]] = -float(rank)  # type: ignore[index]
        return scores

    starts, _ = steering_starts(default_engine, request, "python", ".", next_log_probs)
    spelled = [tokenizer.decode(ids)[1:] for ids in starts]
    assert spelled[0] == "Slice" and "Node" not in spelled  # Node: branch 0's, the likeliest
    assert spelled[1:3] == ["Pow", "List"]


# --------------------------------------------------------------------------- past the indentation

_TEXTS = ["\n   ", "\n       ", "\n      ", " return", " if", " x", "\n\n", "<eos>", "  ", "y", "\n"]
_EOS = 7


def _log_probs(order: list[int]) -> torch.Tensor:
    """[V] log-probabilities ranking the token ids of `order` first, in that order."""
    scores = torch.full((len(_TEXTS),), -30.0)
    for rank, token in enumerate(order):
        scores[token] = -1.0 - rank
    return torch.log_softmax(scores, dim=-1)


def test_at_a_line_start_branches_split_after_the_likeliest_indentation():
    """The first tokens are three indentations: the branches after the first take the likeliest
    one and the 2nd, 3rd, ... distinct content tokens after it (not a newline, whitespace or a stop)."""
    asked: list[list[int]] = []

    def after(more: list[int]) -> torch.Tensor:
        asked.append(more)
        return _log_probs([3, 6, 4, 7, 8, 5])  # return, "\n\n", if, <eos>, "  ", x

    starts = past_indentation_starts(_log_probs([0, 1, 2, 3]), _TEXTS, {_EOS}, "\n", after, 3)
    assert asked == [[0]] and starts == [[0, 4], [0, 5]]  # `if` and `x` after "\n   "; branch 0 writes `return` itself


def test_where_the_line_break_and_the_spaces_are_two_tokens_the_split_is_after_both():
    """Qwen's vocabulary writes `\n        if` as `\n`, `       `, ` if`: after the line break alone
    the likeliest tokens are spaces, and content tokens after it are what is left of the
    vocabulary's junk (`2`, `\tif`, `#` at HumanEval/127). The indentation is followed while
    its likeliest next token is spaces only; the branches split after it."""
    asked: list[list[int]] = []

    def after(more: list[int]) -> torch.Tensor:
        asked.append(more)
        return _log_probs([8, 9, 5]) if more == [10] else _log_probs([3, 6, 4, 8, 5])  # then: return, "\n\n", if, "  ", x

    starts = past_indentation_starts(_log_probs([10, 0, 1, 2]), _TEXTS, {_EOS}, "\n", after, 3)
    assert asked == [[10], [10, 8]] and starts == [[10, 8, 4], [10, 8, 5]]


@pytest.mark.parametrize(
    ("first", "healed"),
    [
        ([3, 0, 1, 2], "\n"),  # the likeliest first token is code: the branches already differ in content
        ([0, 3, 4, 5], "\n"),  # one indentation among the k: nothing to spread
        ([6, 0, 1, 2], "\n"),  # a blank line first
        ([0, 1, 2, 3], "\n    "),  # the indentation does not cover the healed text
    ],
)
def test_past_indentation_starts_only_where_the_first_tokens_are_indentations(first: list[int], healed: str):
    assert past_indentation_starts(_log_probs(first), _TEXTS, {_EOS}, healed, lambda more: _log_probs([3, 4, 5]), 4) == []


def test_the_embedded_model_at_a_line_start_writes_k_statements_not_k_indentations(default_engine):
    """At the start of a line the k branches used to write one statement at several depths; now
    they share the likeliest indentation and differ from the statement's first word on."""
    request = CompletionRequest(
        prefix="def mean(values):\n    if not values:\n        return 0.0\n", suffix="    return total / len(values)\n",
        language="python", k=4, max_tokens=16, deadline_ms=120_000,
    )  # fmt: skip
    steered = default_engine.complete(request)
    words = {re.match(r"\s*(\w*)", c.text).group(1) for c in steered.completions}  # type: ignore[union-attr]
    assert steered.timing_ms["steered"] >= 2 and len(words) >= 2


def test_no_starts_past_a_line_break_where_the_cursors_rule_ends_the_text_there(default_engine):
    """At `return |` the model would end the line (seen with Qwen2.5-Coder at `area(width, height)`
    in a file with an unfinished `return` above): branches forced past that line break were all cut
    to nothing by the cursor's one-line rule, four empty alternatives. At a line start they apply."""
    tokenizer = default_engine.target.tokenizer
    vocab = default_engine.target.model.args.vocab_size
    breaks = [tokenizer.encode(text) for text in ("\n", "\n\n")]
    contents = [tokenizer.encode(text)[0] for text in ("x", "y", "z", "w")]
    assert all(len(ids) == 1 for ids in breaks)

    def next_log_probs(more: list[int]) -> torch.Tensor:
        scores = torch.full((vocab,), -50.0)  # [V]: line breaks first, then content after one
        for rank, token in enumerate(contents if more else [ids[0] for ids in breaks]):
            scores[token] = -float(rank)
        return torch.log_softmax(scores, dim=-1)

    healing = HealingBias(tokenizer, vocab, torch.device("cpu"))
    for prefix, past_the_break in (("def f(a):\n    b = a\n", True), ("def f(a):\n    return ", False)):
        request = CompletionRequest(prefix=prefix, suffix="\n", language="python", k=4)
        starts, _ = steering_starts(default_engine, request, "python", "", next_log_probs, healing, rule_for_cursor(prefix, "\n"))
        assert bool(starts) is past_the_break, (prefix, [tokenizer.decode(ids) for ids in starts])


def test_the_embedded_model_fills_a_hole_the_code_below_is_the_body_of_with_headers(default_engine, monkeypatch):
    """HumanEval/140's hole: after `for c in text:` the next line is two levels deeper, so the
    hole is an `if` (or another header) whose body that line is. Free branches wrote statements
    (`n += 1`) that break the file, and the hole got nothing; all branches but the first now
    start with a header."""
    request = CompletionRequest(
        prefix="def count_spaces(text):\n    n = 0\n    for c in text:\n", suffix="            n += 1\n    return n\n",
        language="python", k=4, max_tokens=24, deadline_ms=120_000,
    )  # fmt: skip
    steered = default_engine.complete(request)
    assert steered.timing_ms["steered"] >= 2
    assert len(steered.completions) >= 2
    assert all(c.text.startswith("        ") and c.text.rstrip().endswith(":") for c in steered.completions)
    monkeypatch.setattr(default_engine, "config", replace(default_engine.config, steer_block_headers=False))
    free = default_engine.complete(request)
    assert len(free.completions) < len(steered.completions)

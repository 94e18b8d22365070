"""Regular batched decoding: stops, budgets, seeds, diversity, deadlines, cancellation."""

from __future__ import annotations

import time

import torch

from kspec.engine.api import CancelToken, CompletionRequest
from kspec.bench.baselines import decode_regular, greedy_batch
from kspec.engine.decode.branches import Branch, BranchTracker, DecodeLimits
from kspec.engine.decode.sampling import SamplingParams, distinct_first_tokens, probabilities
from kspec.engine.decode.stopping import StopRule

PROMPT = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"


def _tracker(engine, max_new: int = 12, rule: StopRule = StopRule(), deadline: float | None = None, ignore_eos: bool = True):
    ids = engine.target.tokenizer.encode(PROMPT)
    return BranchTracker(engine.target.tokenizer, rule, DecodeLimits(max_new, deadline, ignore_eos), ids)


def test_greedy_rows_equal_single_sequence_greedy(random_engine):
    tracker = _tracker(random_engine)
    output = decode_regular(random_engine.target.model, tracker, 3, SamplingParams())
    expected = greedy_batch(random_engine.target.model, [tracker.prompt_ids], 12)[0]
    assert all(branch.token_ids == expected for branch in output.branches)
    assert all(branch.finish_reason == "length" and len(branch.token_ids) == 12 for branch in output.branches)


def test_sampling_is_reproducible_per_seed_and_differs_across_seeds(random_engine):
    model = random_engine.target.model
    runs = [
        [b.token_ids for b in decode_regular(model, _tracker(random_engine), 4, SamplingParams(1.0, 1.0, seed)).branches]
        for seed in (7, 7, 8)
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert len({tuple(ids) for ids in runs[0]}) > 1  # k samples differ from each other


def test_diverse_mode_starts_every_branch_with_a_different_token(random_engine):
    output = decode_regular(random_engine.target.model, _tracker(random_engine), 5, SamplingParams(), diverse=True)
    assert len({branch.token_ids[0] for branch in output.branches}) == 5


def test_stop_string_cuts_text_and_ends_branch(random_engine):
    tracker = _tracker(random_engine, max_new=40)
    free = decode_regular(random_engine.target.model, tracker, 1, SamplingParams()).branches[0].text
    stop = free[3:5]
    tracker = _tracker(random_engine, max_new=40, rule=StopRule(stop_strings=(stop,)))
    branch = decode_regular(random_engine.target.model, tracker, 1, SamplingParams()).branches[0]
    assert branch.finish_reason == "stop"
    assert branch.text == free[: free.find(stop)]


def test_eos_ends_a_branch_without_adding_text(random_engine):
    tracker = _tracker(random_engine, ignore_eos=False)
    eos = next(iter(tracker.tokenizer.stop_ids))
    branch = Branch()
    detok = tracker.new_detokenizer()
    tracker.push(branch, detok, 300, -0.5)
    tracker.push(branch, detok, eos, -0.1)
    tracker.push(branch, detok, 301, -0.2)  # ignored: the branch is done
    assert branch.finish_reason == "eos" and branch.token_ids == [300] and branch.logprob == -0.5


def test_deadline_in_the_past_returns_what_is_done(random_engine):
    tracker = _tracker(random_engine, max_new=50, deadline=time.monotonic() - 1)
    output = decode_regular(random_engine.target.model, tracker, 2, SamplingParams())
    assert all(b.finish_reason == "deadline" and len(b.token_ids) == 1 for b in output.branches)


def test_cancelled_request_stops_at_the_next_step(random_engine):
    cancel = CancelToken()
    cancel.cancel()
    output = decode_regular(random_engine.target.model, _tracker(random_engine, max_new=50), 2, SamplingParams(), cancel)
    assert all(b.finish_reason == "cancelled" for b in output.branches)


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert torch.allclose(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))


def test_distinct_first_tokens_skip_banned_and_repeat_when_too_few_allowed():
    logits = torch.tensor([5.0, 4.0, float("-inf"), 3.0])
    tokens, _ = distinct_first_tokens(logits, 3, frozenset({0}))
    assert tokens.tolist() == [1, 3, 1]


def test_complete_returns_distinct_texts(random_engine):
    result = random_engine.complete(CompletionRequest(prefix=PROMPT + "    ", k=4, max_tokens=8))
    texts = [c.text for c in result.completions]
    assert texts and len(texts) == len(set(texts))
    assert all(t.strip() for t in texts)
    assert result.timing_ms["total"] > 0

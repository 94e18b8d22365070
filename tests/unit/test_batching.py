"""Continuous batching across requests: results equal each request decoded alone,
cancellation and deadlines inside a batch, newcomers joining at the next round."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kspec.engine.request import ActiveCompletion, RequestState, with_first_lines_so_far
from kspec.engine.syntax import postprocess
from kspec.engine.api import CancelToken, Completion, CompletionRequest, CompletionResult
from kspec.engine.batching import BatchConfig, ContinuousBatcher
from kspec.engine.errors import InputError
from kspec.engine.cache.kv import BranchCacheGroup

SOURCES = [
    "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n    return total / ",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        self.",
    "import os\n\nfor name in os.listdir('.'):\n    if name.endswith('.py'):\n        print(",
    "x = [i * i for i in range(10)]\ny = sum(",
]


def _request(index: int, **overrides) -> CompletionRequest:
    fields = dict(prefix=SOURCES[index % len(SOURCES)], k=1 + index % 4, max_tokens=6 + 3 * index, raw=True, cursor_rules=False, deadline_ms=60_000.0)
    fields.update(overrides)
    return CompletionRequest(**fields)


class Outcomes:
    def __init__(self) -> None:
        self.by_index: dict[int, tuple[CompletionResult | None, BaseException | None]] = {}

    def callback(self, index: int):
        def done(result: CompletionResult | None, error: BaseException | None) -> None:
            assert index not in self.by_index, "done called twice"
            self.by_index[index] = (result, error)

        return done


def _texts(result: CompletionResult | None) -> list[str]:
    assert result is not None
    return [c.text for c in result.completions]


def _drain(batcher: ContinuousBatcher, limit: int = 500) -> None:
    for _ in range(limit):
        if batcher.idle:
            return
        batcher.run_round()
    raise AssertionError("the batch did not finish")


def test_requests_decoded_together_equal_each_alone(random_engine):
    requests = [_request(i) for i in range(6)]
    alone = [_texts(random_engine.complete(r)) for r in requests]
    batcher = random_engine.batcher(max_requests=8)
    outcomes = Outcomes()
    for index, request in enumerate(requests):
        batcher.add(request, CancelToken(), outcomes.callback(index))
    _drain(batcher)
    assert batcher.largest_batch == len(requests)  # one verification pass held them all
    assert [_texts(outcomes.by_index[i][0]) for i in range(len(requests))] == alone
    assert any(alone), "the random model produced nothing to compare"


def test_max_requests_one_serves_in_arrival_order(random_engine):
    batcher = random_engine.batcher(max_requests=1)
    outcomes = Outcomes()
    order: list[int] = []
    for index in range(3):
        done = outcomes.callback(index)
        batcher.add(_request(index), CancelToken(), lambda r, e, done=done, index=index: (order.append(index), done(r, e)))
    _drain(batcher)
    assert order == [0, 1, 2] and batcher.largest_batch == 1


def test_cancelled_request_leaves_the_batch_at_once(random_engine):
    long = dict(max_tokens=200, k=3)
    requests = [_request(0, **long), _request(1, **long), _request(2, max_tokens=30)]
    alone = [_texts(random_engine.complete(r)) for r in requests]
    batcher = random_engine.batcher(max_requests=4)
    outcomes = Outcomes()
    cancels = [CancelToken() for _ in requests]
    for index, request in enumerate(requests):
        batcher.add(request, cancels[index], outcomes.callback(index))
    batcher.run_round()
    batcher.run_round()
    assert batcher.size == 3
    cancels[1].cancel()
    batcher.run_round()
    assert 1 in outcomes.by_index and batcher.size == 2  # gone within the round it was cancelled in
    result, error = outcomes.by_index[1]
    assert error is None and all(c.finish_reason == "cancelled" for c in result.completions)
    _drain(batcher)
    assert _texts(outcomes.by_index[0][0]) == alone[0]
    assert _texts(outcomes.by_index[2][0]) == alone[2]


def test_newcomer_joins_at_the_next_round_while_a_long_request_runs(random_engine):
    batcher = random_engine.batcher(max_requests=4)
    outcomes = Outcomes()
    batcher.add(_request(0, max_tokens=300, k=2), CancelToken(), outcomes.callback(0))
    for _ in range(3):
        batcher.run_round()
    long_run = batcher._members[0].active.run
    rounds_before = long_run.stats.rounds
    batcher.add(_request(1, max_tokens=3, k=1), CancelToken(), outcomes.callback(1))
    batcher.run_round()
    newcomer = next(m.active.run for m in batcher._members if m.active.request.max_tokens == 3) if batcher.size == 2 else None
    assert 1 in outcomes.by_index or newcomer.stats.rounds == 1  # decoded in the round it arrived for
    assert long_run.stats.rounds == rounds_before + 1
    for _ in range(3):
        if 1 in outcomes.by_index:
            break
        batcher.run_round()
    assert 1 in outcomes.by_index and 0 not in outcomes.by_index  # the short one did not wait for the long one
    batcher.cancel_all()
    _drain(batcher)


def test_long_prompt_is_prefilled_a_chunk_per_round(random_engine):
    chunk = random_engine.prefix_cache.config.chunk_tokens
    tokenizer = random_engine.target.tokenizer
    long_prefix = "".join(f"value_{i} = compute({i}, {i * 7})\n" for i in range(400))
    assert len(tokenizer.encode(long_prefix)) > 2 * chunk
    random_engine.prefix_cache.clear()
    batcher = random_engine.batcher(max_requests=4)
    outcomes = Outcomes()
    batcher.add(_request(0, max_tokens=300, k=2), CancelToken(), outcomes.callback(0))
    batcher.run_round()
    running = batcher._members[0].active.run
    batcher.add(_request(1, prefix=long_prefix, max_tokens=4), CancelToken(), outcomes.callback(1))
    batcher.run_round()
    newcomer = batcher._members[1].active
    assert newcomer.state is RequestState.PREPARING  # still prefilling after one round ...
    assert running.stats.rounds == 2  # ... while the running request got its round
    batcher.cancel_all()
    _drain(batcher)


def test_deadline_inside_a_batch_and_invalid_requests(random_engine):
    batcher = random_engine.batcher(max_requests=4)
    outcomes = Outcomes()
    clock = [0.0]
    batcher.add(_request(0, max_tokens=300), CancelToken(), outcomes.callback(0))
    batcher.add(_request(1, k=99), CancelToken(), outcomes.callback(1))  # invalid: refused alone
    batcher.run_round()
    result, error = outcomes.by_index[1]
    assert result is None and isinstance(error, InputError)
    member = batcher._members[0]
    member.active.run.tracker.limits = replace(member.active.run.tracker.limits, clock=lambda: clock[0], deadline=-1.0)
    batcher.run_round()
    result, error = outcomes.by_index[0]
    assert error is None and all(c.finish_reason == "deadline" for c in result.completions)
    assert batcher.idle


def test_group_of_caches_rejects_mismatched_counts(random_engine):
    from kspec.engine.cache.kv import BranchKVCache
    from kspec.engine.cache.prefix_cache import prefill_uncached

    model = random_engine.target.model
    prefill = prefill_uncached(model, [1, 2, 3])
    group = BranchCacheGroup([BranchKVCache.from_prompt(prefill.cache, 2, 8), BranchKVCache.from_prompt(prefill.cache, 3, 8)])
    assert group.batch == 5
    with pytest.raises(ValueError, match="5 rows"):
        group.advance([1, 1])
    with pytest.raises(ValueError):
        BatchConfig(max_requests=0)


def test_many_newcomers_share_a_bounded_prefill_budget_in_turns(random_engine, monkeypatch):
    from kspec.engine.request import ActiveCompletion

    stepped: list[int] = []
    original = ActiveCompletion.prepare_step

    def counting(self):
        stepped.append(int(self.request.path))
        return original(self)

    monkeypatch.setattr(ActiveCompletion, "prepare_step", counting)
    random_engine.prefix_cache.clear()
    batcher = ContinuousBatcher(random_engine, BatchConfig(max_requests=8, prefill_chunks_per_round=2))
    outcomes = Outcomes()
    long_prefix = "".join(f"item_{i} = table[{i}] + {i * 3}\n" for i in range(300))  # several chunks
    for index in range(4):
        batcher.add(_request(index, prefix=f"# file {index}\n" + long_prefix, max_tokens=2, path=str(index)), CancelToken(), outcomes.callback(index))
    batcher.run_round()
    assert stepped == [0, 1]  # two chunks this round, the first two in arrival order ...
    batcher.run_round()
    assert stepped[2:] == [2, 3]  # ... the other two the next round
    batcher.run_round()
    assert stepped[4:] == [0, 1]
    _drain(batcher)
    assert sorted(outcomes.by_index) == [0, 1, 2, 3] and all(error is None for _, error in outcomes.by_index.values())


def test_a_failing_request_fails_alone(random_engine, monkeypatch):
    from kspec.engine.decode.speculative import SpeculativeRun

    requests = [_request(0, k=1), _request(1, k=3), _request(2, k=2)]
    alone = [_texts(random_engine.complete(r)) for r in requests]
    original = SpeculativeRun.propose

    def propose(self):
        if self.cache.batch == 3 and self.stats.rounds == 1:  # request 1, in its second round
            raise RuntimeError("drafter bug")
        return original(self)

    monkeypatch.setattr(SpeculativeRun, "propose", propose)
    batcher = random_engine.batcher(max_requests=4)
    outcomes = Outcomes()
    for index, request in enumerate(requests):
        batcher.add(request, CancelToken(), outcomes.callback(index))
    _drain(batcher)
    result, error = outcomes.by_index[1]
    assert result is None and isinstance(error, RuntimeError)
    assert _texts(outcomes.by_index[0][0]) == alone[0] and _texts(outcomes.by_index[2][0]) == alone[2]


def test_decoding_deadline_is_the_one_set_on_arrival(random_engine):
    active = ActiveCompletion(random_engine, _request(0), CancelToken())
    while active.state is RequestState.PREPARING:
        active.prepare_step()
    assert active.run is not None
    assert active.run.tracker.limits.deadline == active.deadline  # prefill time counts against it


def test_early_answer_comes_first_and_decoding_goes_on_unchanged(random_engine):
    """Early answers (what was complete at the end of the prefill, then after rounds) before the final one,
    which is the same as without an early answer: answering early changes no token."""
    request = _request(0, k=3, max_tokens=40)
    alone = _texts(random_engine.complete(request))
    batcher = random_engine.batcher(max_requests=2)
    events: list[tuple[str, object]] = []
    batcher.add(
        replace(request, first_answer_ms=0.001),
        CancelToken(),
        lambda result, error: events.append(("done", result if error is None else error)),
        lambda interim: events.append(("early", interim)),
    )
    _drain(batcher)
    kinds = [kind for kind, _ in events]
    assert kinds[-1] == "done" and set(kinds[:-1]) == {"early"} and len(kinds) >= 2
    interims, final = [result for _, result in events[:-1]], events[-1][1]
    for interim in interims:
        assert isinstance(interim, CompletionResult) and interim.completions and interim.timing_ms["interim"] == 1.0
    assert isinstance(final, CompletionResult) and _texts(final) == alone
    assert sum(c.n_tokens for c in interims[0].completions) < sum(c.n_tokens for c in final.completions)
    # Each later interim answer says something new: the branches grew since the last one.
    assert all(_texts(a) != _texts(b) for a, b in zip(interims, interims[1:]))


def test_no_early_answer_unless_asked(random_engine):
    batcher = random_engine.batcher(max_requests=1)
    early: list[object] = []
    outcomes = Outcomes()
    batcher.add(_request(0, max_tokens=6), CancelToken(), outcomes.callback(0), early.append)
    _drain(batcher)
    assert early == [] and outcomes.by_index[0][1] is None


def test_waiting_counts_against_the_early_answer_too():
    waited = CompletionRequest(prefix="x", deadline_ms=1000, first_answer_ms=200).after_waiting(250)
    assert waited.deadline_ms == 750 and 0 < waited.first_answer_ms < 1  # due at once, not dropped
    assert CompletionRequest(prefix="x", deadline_ms=1000).after_waiting(100).first_answer_ms == 0.0


def _early_answers(engine, request: CompletionRequest) -> tuple[list[CompletionResult], CompletionResult | None]:
    """`request` alone in a batcher, asking for an early answer at once: (the early answers, the final one)."""
    batcher = engine.batcher(max_requests=1)
    early: list[CompletionResult] = []
    outcomes = Outcomes()
    batcher.add(replace(request, first_answer_ms=0.001), CancelToken(), outcomes.callback(0), early.append)
    _drain(batcher)
    result, error = outcomes.by_index[0]
    assert error is None and early
    return early, result


def test_an_early_answer_before_any_line_is_complete_shows_the_words_so_far(random_engine):
    """Trimmed answers drop a branch's unfinished last line; when no branch has finished one
    at the first-answer moment, the interim answer is what the branches wrote so far (raw,
    distinct), each the beginning of what that branch goes on to write."""
    request = _request(1, k=3, max_tokens=40, raw=False, language="python")
    raw_alone = _texts(random_engine.complete(replace(request, raw=True)))
    early, _ = _early_answers(random_engine, request)
    assert any(interim.timing_ms["interim_partial"] == 1.0 for interim in early)
    for interim in early:  # the first, and those after later rounds while no line is complete
        if interim.timing_ms["interim_partial"] == 1.0:
            texts = _texts(interim)
            assert texts and len(set(texts)) == len(texts)
            assert all(any(full.startswith(text) for full in raw_alone) for text in texts)


def test_a_first_answer_due_by_the_end_of_the_prefill_comes_before_any_round(random_engine):
    """Each branch's first token comes with the prompt's logits: a first answer due by then is
    given at the end of the prefill (measured at 1.5B: a round later, half the keystrokes of a
    typing replay saw nothing before the next one), each text the start of what the branch writes."""
    request = _request(1, k=3, max_tokens=40, raw=True)
    raw_alone = _texts(random_engine.complete(request))
    early, final = _early_answers(random_engine, request)
    first = early[0]
    assert first.timing_ms["rounds"] == 0.0 and all(c.n_tokens == 1 for c in first.completions)
    assert all(any(full.startswith(c.text) for full in raw_alone) for c in first.completions)
    assert _texts(final) == raw_alone  # answering early changes no token


def test_a_round_of_one_request_runs_over_its_own_cache(random_engine, monkeypatch):
    """Several requests share a BranchCacheGroup; one alone passes its BranchKVCache, the cache
    the CPU fast path's C++ layer loop serves (engine/models/native_step.py)."""
    from kspec.engine.cache.kv import BranchKVCache

    model = random_engine.target.model
    seen: list[type] = []
    forward = type(model).forward
    def recorded(self, tokens, cache, n_layers=None, row_lengths=None):
        seen.append(type(cache))
        return forward(self, tokens, cache, n_layers, row_lengths)

    monkeypatch.setattr(type(model), "forward", recorded)
    for count in (1, 2):
        batcher = random_engine.batcher(max_requests=4)
        outcomes = Outcomes()
        for index in range(count):
            batcher.add(_request(index, k=2, max_tokens=4), CancelToken(), outcomes.callback(index))
        seen.clear()
        _drain(batcher)
        decode_caches = {kind for kind in seen if kind in (BranchKVCache, BranchCacheGroup)}
        if count == 1:
            assert decode_caches == {BranchKVCache}
        else:  # together while both decode (one finishing first decodes the other alone)
            assert BranchCacheGroup in decode_caches


def test_the_batcher_charges_the_wait_since_arrival_once(random_engine):
    """The runner hands over a request with the moment it arrived; the batcher alone charges the
    waiting against its deadline: one that waited past it fails before any work, one that has
    time left keeps only what is left."""
    import time

    from kspec.engine.api import admitted
    from kspec.engine.errors import DeadlineExceeded

    arrived = time.monotonic() - 5.0  # arrived five seconds ago
    batcher = random_engine.batcher(max_requests=1)
    outcomes = Outcomes()
    batcher.add(_request(0, deadline_ms=1000.0), CancelToken(), outcomes.callback(0), arrived=arrived)
    batcher.add(_request(1, deadline_ms=60_000.0, max_tokens=4), CancelToken(), outcomes.callback(1), arrived=arrived)
    _drain(batcher)
    assert isinstance(outcomes.by_index[0][1], DeadlineExceeded)
    assert outcomes.by_index[1][1] is None
    left = admitted(_request(2, deadline_ms=60_000.0), time.monotonic() - 5.0).deadline_ms
    assert 54_000 < left <= 55_000


def test_an_interim_answer_ranks_a_likelier_first_line_still_being_written_above_a_short_one_that_ended():
    """Seen in VS Code at `def total(self): return `: the branch writing "0" ended first and became
    the ghost while the likelier `self.price * self.quantity` was still on its first line; the
    text so far of a branch still on its first line is ranked beside the whole ones."""
    prefix, suffix = "class Item:\n    def total(self):\n        return ", "\n"
    ended = Completion("0", logprob=-1.2, n_tokens=2, finish_reason="stop")
    writing = Completion("self.price * se", logprob=-0.3, n_tokens=6, finish_reason="deadline")
    further = Completion("sum(x)\n        # then", logprob=-0.2, n_tokens=7, finish_reason="deadline")  # a whole line already
    whole = postprocess(prefix, suffix, "python", [ended, writing, further])
    assert whole[0].text == "0"  # checked as code, the unfinished name `se` reads as an undefined one
    shown, so_far = with_first_lines_so_far(prefix, suffix, "python", whole, [ended, writing, further])
    assert shown[0].text == "self.price * se" and shown[0].score == pytest.approx(-0.3 / 6) and so_far
    assert sorted(c.text for c in shown) == sorted({c.text for c in whole} | {"self.price * se"})  # each text once
    assert [c.score for c in shown] == sorted((c.score for c in shown), reverse=True)
    # all ended: nothing so far to add
    assert with_first_lines_so_far(prefix, suffix, "python", [whole[0]], [ended]) == ([whole[0]], False)

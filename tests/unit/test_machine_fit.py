"""Defaults that fit the machine: the rule that turns measured round and prefill times into
k, max tokens and the first-answer moment, the engine's own measurement, and the cache that
spares a restarted engine (a daemon after a crash) from measuring again."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

from kspec.engine import machine_fit
from kspec.engine.json_file import identity_key
from kspec.engine.machine_fit import (
    BUSY_MAX_AGE_S,
    FIRST_ANSWER_RANGE_MS,
    MAX_TOKENS_RANGE,
    MIN_K,
    TARGET_FIRST_ANSWER_MS,
    FIT_CACHE_FILE,
    FitCache,
    MachineTiming,
    choose_defaults,
    tokens_ms,
    FIRST_WORD_TOKENS,
    COLD_PROMPT_MS,
    PROMPT_TOKENS_RANGE,
    SUFFIX_REREAD_MS,
    SUFFIX_TOKENS_MIN,
    TOKENS_PER_ROUND,
)
from kspec.engine.api import SUFFIX_SHARE


def test_a_fast_machine_gets_four_alternatives_and_an_early_first_answer():
    fast = choose_defaults(MachineTiming({2: 8.0, 4: 10.0}, prefill_ms_per_token=1.0, keystroke_ms=20.0))
    assert fast.k == 4 and fast.first_answer_ms <= TARGET_FIRST_ANSWER_MS
    assert fast.max_tokens == MAX_TOKENS_RANGE[1]


def test_a_slow_machine_trades_alternatives_and_length_for_time():
    round_ms = 160.0  # at k = 2: not even one round fits the target at any k
    timing = MachineTiming({2: round_ms, 4: 1.5 * round_ms}, prefill_ms_per_token=4.0, keystroke_ms=100.0)
    slow = choose_defaults(timing)
    assert slow.k == MIN_K and slow.max_tokens < MAX_TOKENS_RANGE[1]
    assert FIRST_ANSWER_RANGE_MS[0] <= slow.first_answer_ms <= FIRST_ANSWER_RANGE_MS[1]
    # k: the first words (one round's worth) fit the target only at the smallest k
    words_ms = tokens_ms(timing, 2, FIRST_WORD_TOKENS)
    assert words_ms == 100 + math.ceil(FIRST_WORD_TOKENS / TOKENS_PER_ROUND) * round_ms
    # the first answer is due when each branch's first token is there: it comes with the
    # prompt's logits at the end of the keystroke's prefill (the engine answers then, or after
    # the first round ending past the moment), half a round early so that a prefill ending a
    # little late is still the step that answers, not the round after it
    assert slow.first_answer_ms == pytest.approx(max(FIRST_ANSWER_RANGE_MS[0], 100 - round_ms / 2), abs=1)
    later = choose_defaults(MachineTiming({2: round_ms, 4: 1.5 * round_ms}, prefill_ms_per_token=4.0, keystroke_ms=400.0))
    assert later.first_answer_ms == pytest.approx(400 - round_ms / 2, abs=1)


def test_choices_get_no_worse_as_the_machine_gets_faster():
    previous = None
    for round_ms in (120.0, 60.0, 30.0, 15.0, 8.0, 4.0):
        chosen = choose_defaults(MachineTiming({2: round_ms * 0.8, 4: round_ms}, prefill_ms_per_token=round_ms / 20, keystroke_ms=round_ms))
        if previous is not None:
            assert chosen.k >= previous.k and chosen.max_tokens >= previous.max_tokens
            assert chosen.first_answer_ms <= previous.first_answer_ms
        previous = chosen


def test_the_suffix_is_what_a_keystroke_prefills_again_in_its_time():
    """FIM's prefix-suffix-middle order puts the text after the cursor after the text typed into:
    a keystroke the typeahead cache misses prefills the suffix again, so the fit caps it at what
    prefills in SUFFIX_REREAD_MS, a few lines at least, and never above the prompt's share."""
    def suffix(per_token_ms: float, pinned: int | None = None) -> tuple[int, int]:
        chosen = choose_defaults(MachineTiming({2: 20.0, 4: 25.0}, prefill_ms_per_token=per_token_ms, keystroke_ms=30.0), pinned)
        return chosen.suffix_tokens, chosen.prompt_tokens

    tokens, prompt = suffix(3.0)  # Zen 4's 0.5B: ~50 tokens of a 384-token prompt's 96
    assert tokens == int(SUFFIX_REREAD_MS / 3.0) < int(prompt * SUFFIX_SHARE)
    assert suffix(20.0)[0] == SUFFIX_TOKENS_MIN  # a slow machine still sees the lines below
    tokens, prompt = suffix(0.1)  # a fast one: the whole share
    assert tokens == int(prompt * SUFFIX_SHARE)
    assert suffix(3.0, pinned=1000) == (int(1000 * SUFFIX_SHARE), 1000)  # a pinned budget keeps its share


def test_timing_is_validated():
    with pytest.raises(ValueError):
        MachineTiming({}, 1.0, 1.0)
    with pytest.raises(ValueError):
        MachineTiming({4: 0.0}, 1.0, 1.0)
    with pytest.raises(ValueError):
        MachineTiming({4: 1.0}, 1.0, -1.0)
    with pytest.raises(ValueError):
        MachineTiming({4: 1.0}, 1.0, 1.0, cpu_share=-0.1)


def test_the_engine_measures_itself(random_llama_dir, tmp_path, monkeypatch):
    import torch

    from kspec.engine.completion import CompletionEngine
    from kspec.engine.config import EngineConfig

    monkeypatch.setenv("KSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(machine_fit, "QUIET_CPU_SHARE", 0.0)  # kept however busy the machine running the tests is
    # threads pinned: on a loaded machine the core governor lowers torch's (process-wide) thread
    # count, which is part of what the timing is kept by, and the restarts below would measure again
    config = EngineConfig(model=str(random_llama_dir), dtype="float32", progress=False, threads=torch.get_num_threads())
    engine = CompletionEngine.load(config)
    assert engine.defaults is not None and engine.defaults.k >= MIN_K  # chosen at load
    assert (tmp_path / FIT_CACHE_FILE).is_file()  # and kept: the same engine started again does not measure (below)
    assert engine.prompt_tokens == engine.defaults.prompt_tokens
    from kspec.engine.completion import CALIBRATION_CODE, KEYSTROKE_INDENT

    runs: list[tuple[str, dict[str, float]]] = []
    complete = engine.complete
    monkeypatch.setattr(engine, "complete", lambda request: runs.append((request.prefix, (r := complete(request)).timing_ms)) or r)
    timing = engine.measure_machine()
    # What is timed as a keystroke is one typed character a cached prompt lacks: one prompt
    # token computed, as when typing a word (appending blanks re-cut 3 tokens, 3x the time).
    keystrokes = [t for prefix, t in runs if prefix.startswith(CALIBRATION_CODE + KEYSTROKE_INDENT)][1:]
    assert len(keystrokes) >= 3 and all(t["prompt_tokens"] - t["reused_prompt_tokens"] == 1 for t in keystrokes)
    assert set(timing.round_ms) == {2, 4} and all(ms > 0 for ms in timing.round_ms.values())
    assert timing.prefill_ms_per_token > 0 and timing.keystroke_ms > 0
    # per token of the cold prompt's own prefill: not the whole prefill over the one token the
    # healing walk computed after it (that read 470 ms "per token" for the default model)
    assert timing.prefill_ms_per_token < timing.keystroke_ms

    def measure_again() -> MachineTiming:
        raise AssertionError("a restarted engine measured the machine again")

    monkeypatch.setattr(CompletionEngine, "measure_machine", lambda self: measure_again())
    assert CompletionEngine.load(config).defaults == engine.defaults
    # settings that choose tokens, not what a round costs, share the timing (FIT_NEUTRAL_FIELDS)
    steered = replace(config, steer_branches=0, steer_member_branches=1, constrain_member_names=False, steer_past_indent=False)
    assert CompletionEngine.load(steered).defaults == engine.defaults
    # a pinned prompt budget is the fitted engine's, with the same timing
    pinned_tokens = engine.defaults.prompt_tokens + 7
    pinned = CompletionEngine.load(replace(config, prompt_tokens=pinned_tokens))
    assert pinned.defaults == replace(engine.defaults, prompt_tokens=pinned_tokens, suffix_tokens=int(pinned_tokens * SUFFIX_SHARE))
    assert pinned.prompt_tokens == engine.defaults.prompt_tokens + 7
    with pytest.raises(AssertionError, match="measured the machine again"):
        CompletionEngine.load(replace(config, gamma=config.gamma + 1))  # one that changes a round's cost does not


def test_the_prompt_budget_is_what_a_cold_prefill_does_in_its_time():
    per_token = COLD_PROMPT_MS / (PROMPT_TOKENS_RANGE[0] + 100)  # a budget inside the range
    slow = choose_defaults(MachineTiming({2: 120.0, 4: 180.0}, prefill_ms_per_token=per_token, keystroke_ms=100.0))
    assert slow.prompt_tokens == int(COLD_PROMPT_MS / per_token)
    fast = choose_defaults(MachineTiming({2: 8.0, 4: 10.0}, prefill_ms_per_token=0.2, keystroke_ms=20.0))
    assert fast.prompt_tokens == PROMPT_TOKENS_RANGE[1]
    crawling_timing = MachineTiming({2: 900.0, 4: 1200.0}, prefill_ms_per_token=50.0, keystroke_ms=400.0)
    crawling = choose_defaults(crawling_timing)
    assert crawling.prompt_tokens == PROMPT_TOKENS_RANGE[0]
    # EngineConfig.prompt_tokens pins the budget (its suffix keeps the whole share), and only the budget
    assert choose_defaults(crawling_timing, 2000) == replace(crawling, prompt_tokens=2000, suffix_tokens=int(2000 * SUFFIX_SHARE))


def test_the_engine_cuts_prompts_to_the_fitted_budget(random_engine):
    from kspec.engine.api import CompletionRequest

    assert random_engine.defaults is None  # the fixture's engine is not fitted
    assert random_engine.prompt_tokens == PROMPT_TOKENS_RANGE[1]
    long_prefix = "".join(f"def function_{i}(argument):\n    return argument * {i}\n\n" for i in range(300))

    def prompt_tokens() -> float:
        result = random_engine.complete(CompletionRequest(prefix=long_prefix, k=1, max_tokens=1, raw=True, cursor_rules=False))
        return result.timing_ms["prompt_tokens"]

    fitted = choose_defaults(MachineTiming({2: 8.0, 4: 10.0}, prefill_ms_per_token=0.01, keystroke_ms=20.0))
    try:
        random_engine.defaults = fitted
        assert random_engine.prompt_tokens == PROMPT_TOKENS_RANGE[1]
        whole = prompt_tokens()
        random_engine.defaults = replace(fitted, prompt_tokens=100)
        assert random_engine.prompt_tokens == 100
        assert 0 < prompt_tokens() <= 100 < whole
    finally:
        random_engine.defaults = None


TIMING = MachineTiming({2: 30.0, 4: 40.0}, prefill_ms_per_token=1.5, keystroke_ms=60.0)


def test_the_fit_cache_gives_back_what_it_was_given_for_that_key_only(tmp_path: Path):
    cache = FitCache(tmp_path / "fit.json")
    assert cache.get("a") is None  # no file yet
    cache.put("a", TIMING, now=1000.0)
    assert cache.get("a", now=1001.0) == TIMING  # the round times keep their int k through JSON
    assert cache.get("b", now=1001.0) is None
    assert FitCache(tmp_path / "fit.json").get("a", now=1001.0) == TIMING  # another process reads it


def test_a_stale_or_unreadable_fit_is_measured_again(tmp_path: Path):
    path = tmp_path / "fit.json"
    cache = FitCache(path, max_age_s=100.0)
    cache.put("a", TIMING, now=1000.0)
    assert cache.get("a", now=1099.0) == TIMING
    assert cache.get("a", now=1100.0) is None  # too old: the machine may be another now
    assert cache.get("a", now=999.0) is None  # from the future: a clock that jumped
    cache.put("a", TIMING, now=1000.0)
    good = json.loads(path.read_text())["a"]["value"]
    for text in ("{not json", "[1, 2]", json.dumps({"a": {"at": 1000.0, "value": {**good, "round_ms": {"2": -1.0}}}}),
                 json.dumps({"a": {"at": 1000.0, "value": {**good, "round_ms": {"two": 1.0}}}}),
                 json.dumps({"a": {"at": "yesterday", "value": good}}), json.dumps({"a": {"at": 1000.0}})):  # fmt: skip
        path.write_text(text)
        assert cache.get("a", now=1001.0) is None
        cache.put("b", TIMING, now=1001.0)  # a foreign file is replaced, not a failure
        assert cache.get("b", now=1002.0) == TIMING


def test_the_fit_cache_keeps_the_newest_entries(tmp_path: Path):
    cache = FitCache(tmp_path / "fit.json", entries=2)
    for at, key in enumerate("abc"):
        cache.put(key, TIMING, now=1000.0 + at)
    assert [cache.get(key, now=1003.0) is not None for key in "abc"] == [False, True, True]
    assert [p.name for p in tmp_path.iterdir()] == ["fit.json"]  # no temporary file left behind


def test_fitting_again_takes_the_cached_timing_until_what_it_depends_on_changes(random_engine, tmp_path: Path, monkeypatch):
    import torch

    monkeypatch.setattr(random_engine, "defaults", None)  # put back after the test: other tests want it unfitted
    measured: list[MachineTiming] = []
    monkeypatch.setattr(random_engine, "measure_machine", lambda: measured.append(TIMING) or TIMING)
    cache = FitCache(tmp_path / "fit.json")
    first = random_engine.fit_to_machine(cache)
    assert random_engine.fit_to_machine(cache) == first == choose_defaults(TIMING)
    assert len(measured) == 1  # the second start took the cached timing

    threads = torch.get_num_threads()
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads + 1)
    random_engine.fit_to_machine(cache)
    assert len(measured) == 2  # other threads: measured again
    monkeypatch.setattr(random_engine, "config", replace(random_engine.config, prefix_cache_mb=1))
    random_engine.fit_to_machine(cache)
    assert len(measured) == 3  # other engine settings: measured again

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x")
    monkeypatch.setattr(random_engine, "target", replace(random_engine.target, folder=folder))
    random_engine.fit_to_machine(cache)
    assert len(measured) == 4
    (folder / "model.safetensors").write_bytes(b"xy")  # the model's files changed
    random_engine.fit_to_machine(cache)
    assert len(measured) == 5
    random_engine.fit_to_machine(cache)
    assert len(measured) == 5


def test_a_timing_taken_while_other_work_competed_is_reused_for_an_hour_then_measured_again(random_engine, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(random_engine, "defaults", None)
    busy = replace(TIMING, round_ms={k: 3 * ms for k, ms in TIMING.round_ms.items()}, cpu_share=0.6)
    measured: list[MachineTiming] = [busy, TIMING]
    monkeypatch.setattr(random_engine, "measure_machine", lambda: measured.pop(0))
    cache = FitCache(tmp_path / "fit.json")
    assert random_engine.fit_to_machine(cache) == choose_defaults(busy)  # this start lives with what it measured
    assert random_engine.fit_to_machine(cache) == choose_defaults(busy) and measured == [TIMING]  # a start within the hour too
    _age_entries(cache.path, BUSY_MAX_AGE_S + 1)
    assert random_engine.fit_to_machine(cache) == choose_defaults(TIMING) and not measured  # after it: measured again, quiet
    _age_entries(cache.path, BUSY_MAX_AGE_S + 1)
    assert random_engine.fit_to_machine(cache) == choose_defaults(TIMING)  # and a quiet one is kept for FIT_CACHE_MAX_AGE_S
    assert not busy.quiet and TIMING.quiet


def _age_entries(path: Path, seconds: float) -> None:
    """Every entry of a cache file `seconds` older, as if put that long ago."""
    entries = json.loads(path.read_text())
    path.write_text(json.dumps({key: {**entry, "at": entry["at"] - seconds} for key, entry in entries.items()}))


def _through_cache(timing: MachineTiming, folder: Path) -> MachineTiming | None:
    cache = FitCache(folder / "round-trip.json")
    cache.put("a", timing)
    return cache.get("a")


def test_the_engine_s_own_measurement_says_what_share_of_the_cores_it_had(random_engine, tmp_path: Path):
    timing = random_engine.measure_machine()
    assert 0 < timing.cpu_share <= (os.cpu_count() or 1)  # CPU time over wall time and threads: a share, not seconds
    assert _through_cache(timing, tmp_path) == timing


def test_the_cache_key_is_the_identity_s_content_not_its_order():
    assert identity_key({"a": 1, "b": [1, 2]}) == identity_key({"b": [1, 2], "a": 1}) != identity_key({"a": 1, "b": [2, 1]})


def test_the_fit_times_a_head_on_kspecs_kernel_and_its_cost_replaces_the_prior(random_engine, tmp_path: Path, monkeypatch):
    from kspec.engine.models.head_cost import TIMED_ROWS, HeadCost

    model = random_engine.target.model
    monkeypatch.setattr(random_engine, "defaults", None)
    assert random_engine.measure_machine().head_ms == {}  # a float32 head (its rows may round by their call): not timed
    monkeypatch.setattr(model, "head_cost", HeadCost(call_ms=5.0, row_ms=0.3, max_rows=24))  # the CPU profile's prior
    timing = random_engine.measure_machine()
    assert sorted(timing.head_ms) == sorted(TIMED_ROWS) and _through_cache(timing, tmp_path) == timing
    cache = FitCache(tmp_path / "fit.json")
    monkeypatch.setattr(random_engine, "measure_machine", lambda: replace(TIMING, head_ms={1: 6.0, 16: 9.0}))
    random_engine.fit_to_machine(cache)
    assert model.head_cost == HeadCost(call_ms=5.8, row_ms=0.2, max_rows=24)
    assert "head 5.80 ms a call + 0.200 ms a row" in random_engine.kernels  # what `$/kspec/status` shows
    monkeypatch.setattr(model, "head_cost", HeadCost(call_ms=5.0, row_ms=0.3))
    random_engine.fit_to_machine(cache)  # a later start: the cached timing's head
    assert model.head_cost == HeadCost(call_ms=5.8, row_ms=0.2)
    with pytest.raises(ValueError, match="head times"):
        replace(TIMING, head_ms={0: 1.0})

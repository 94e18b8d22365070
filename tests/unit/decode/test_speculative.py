"""BASS: exactness against plain decoding, exact speculative sampling, ragged edge cases."""

from __future__ import annotations

import random

import math
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from kspec.engine.api import CancelToken
from kspec.engine.decode.drafters import Draft, ModelDrafter, NoDrafter, PromptLookupDrafter
from kspec.bench.baselines import decode_regular, decode_speculative
from kspec.engine.decode.branches import BranchTracker, DecodeLimits
from kspec.engine.models.hf_folder import load_transformer
from model_factory import write_random_model
from kspec.engine.decode.sampling import SamplingParams
from kspec.engine.decode.speculative import (
    PAYOFF_FIRST_PAUSE, PAYOFF_MAX_PAUSE, DraftBudget, DraftPayoff, DraftPayoffs, SpeculationConfig, SpeculationStats, SpeculativeRun, adapt_gamma,
)
from kspec.engine.decode.speculative import pad_rows
from kspec.engine.decode.stopping import StopRule
from kspec.engine.models.tokenizer import Tokenizer

CODE = (
    "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n    return total / len(values)\n\n\n"
    "def variance(values):\n    centre = mean(values)\n    total = 0\n    for value in values:\n"
)


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory):
    return load_transformer(write_random_model(tmp_path_factory.mktemp("draft"), "llama", seed=1), torch.float32)


def _tracker(engine, new_tokens: int = 20, **limits) -> BranchTracker:
    ids = engine.target.tokenizer.encode(CODE)
    return BranchTracker(engine.target.tokenizer, StopRule(), DecodeLimits(new_tokens, ignore_eos=True, **limits), ids)


def _drafters(engine, draft_model):
    target = engine.target.model
    return {
        "none": lambda: NoDrafter(),
        "lookup": lambda: PromptLookupDrafter(),
        "model-other": lambda: ModelDrafter(draft_model, SamplingParams()),
        "model-self": lambda: ModelDrafter(target, SamplingParams()),  # accepts (almost) everything
    }


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_branches_equal_plain_greedy_for_every_drafter(random_engine, draft_model, k):
    model = random_engine.target.model
    plain = decode_regular(model, _tracker(random_engine), k, SamplingParams(), diverse=True)
    expected = [b.token_ids for b in plain.branches]
    for name, make in _drafters(random_engine, draft_model).items():
        for gamma in (1, 4):
            config = SpeculationConfig(gamma=gamma, gamma_min=1, cost_aware=False)  # every draft verified: no timing in the test
            output = decode_speculative(model, _tracker(random_engine), k, SamplingParams(), make(), config, diverse=True)
            assert [b.token_ids for b in output.branches] == expected, (name, gamma)
            if name == "model-self":
                assert output.stats.mean_accepted_per_round > 1.0  # the all-accepted path ran


def test_greedy_on_the_default_model_with_lookup(default_engine):
    model = default_engine.target.model
    plain = decode_regular(model, _tracker(default_engine, 24), 3, SamplingParams(), diverse=True)
    bass = decode_speculative(model, _tracker(default_engine, 24), 3, SamplingParams(), PromptLookupDrafter(), diverse=True)
    assert [b.token_ids for b in bass.branches] == [b.token_ids for b in plain.branches]
    assert bass.stats.rounds < 3 * 24  # drafts were accepted: fewer target passes than tokens


class WrongDrafter:
    """Always proposes tokens the target will not choose (a real drafter, deliberately bad)."""

    name = "wrong"

    def begin(self, prompt_ids, k, max_new_tokens):
        pass

    def propose(self, histories, gamma):
        return [Draft([1] * gamma) for _ in histories]  # token 1 is <|im_start|>: never chosen on code

    def keep(self, rows):
        pass


def test_every_draft_rejected_still_exact(random_engine):
    model = random_engine.target.model
    plain = decode_regular(model, _tracker(random_engine), 3, SamplingParams(), diverse=True)
    output = decode_speculative(model, _tracker(random_engine), 3, SamplingParams(), WrongDrafter(), diverse=True)
    assert [b.token_ids for b in output.branches] == [b.token_ids for b in plain.branches]
    assert output.stats.accepted == 0 and output.stats.gammas[-1] < 4  # γ shrank


def test_branch_that_ends_at_once_leaves_the_batch(random_engine):
    output = decode_speculative(
        random_engine.target.model, _tracker(random_engine, new_tokens=1), 4, SamplingParams(), PromptLookupDrafter(), diverse=True
    )
    assert all(len(b.token_ids) == 1 and b.finish_reason == "length" for b in output.branches)
    assert output.stats.rounds == 0


def test_unit_done_hook_stops_single_branches(random_engine):
    model = random_engine.target.model

    def unit_done(text: str) -> bool:
        return len(text) > 12

    output = decode_speculative(model, _tracker(random_engine, 30), 3, SamplingParams(), PromptLookupDrafter(), diverse=True, unit_done=unit_done)
    assert all(b.finish_reason == "stop" and len(b.text) > 12 for b in output.branches)
    assert all(len(b.token_ids) < 30 for b in output.branches)


def test_deadline_in_the_middle_returns_the_text_so_far(random_engine):
    ticks = iter(range(1000))
    tracker = _tracker(random_engine, 40, deadline=3.5, clock=lambda: float(next(ticks)))
    output = decode_speculative(random_engine.target.model, tracker, 3, SamplingParams(), NoDrafter(), diverse=True)
    assert all(b.finish_reason == "deadline" for b in output.branches)
    assert all(0 < len(b.token_ids) < 40 for b in output.branches)


def test_cancel_in_the_middle(random_engine):
    cancel = CancelToken()

    class CancellingDrafter(PromptLookupDrafter):
        rounds = 0

        def propose(self, histories, gamma):
            self.rounds += 1
            if self.rounds == 3:
                cancel.cancel()
            return super().propose(histories, gamma)

    output = decode_speculative(
        random_engine.target.model, _tracker(random_engine, 40), 2, SamplingParams(), CancellingDrafter(),
        SpeculationConfig(cost_aware=False), cancel=cancel, diverse=True,
    )  # fmt: skip  # every round asks the drafter (no pauses that depend on this machine's timing)
    assert all(b.finish_reason == "cancelled" and b.token_ids for b in output.branches)
    assert output.stats.rounds == 3


def test_prompt_lookup_drafts_from_the_prompt_the_branch_and_its_siblings():
    drafter = PromptLookupDrafter()
    drafter.begin([1, 2, 3, 4, 5], k=3, max_new_tokens=16)
    histories = [
        [9, 2, 3],  # the prompt's 2 3 -> 4 5
        [7, 8, 6, 7],  # only a 1-gram, in its own text: 7 -> 8 6
        [6, 9, 7, 8],  # 7 8 only in the second branch's text -> 6 7
    ]
    drafts = drafter.propose(histories, gamma=2)
    assert [d.tokens for d in drafts] == [[4, 5], [8, 6], [6, 7]]
    # a longer n-gram in a sibling wins over a shorter one in the branch's own text
    drafter.begin([], k=2, max_new_tokens=16)
    own_unigram, sibling_trigram = [5, 1, 0, 2, 3, 5], [0, 2, 3, 5, 4, 4]
    assert drafter.propose([own_unigram, sibling_trigram], gamma=3)[0].tokens == [4, 4]
    assert drafter.propose([[1, 2], [3, 4]], gamma=3)[0].tokens == []  # nothing anywhere
    # a sibling's own last n-gram has nothing after it
    assert drafter.propose([[1, 2], [2]], gamma=3)[0].tokens == []


def _scanned_lookup(prompt: list[int], history: list[int], siblings: list[list[int]], gamma: int, longest: int) -> list[int]:
    """The lookup written as a plain scan: for n from the longest down, the latest earlier
    occurrence (a token after it) of the sequence's last n tokens in the sequence, then in each sibling."""
    sequence = prompt + history
    for n in range(longest, 0, -1):
        if len(sequence) <= n:
            continue
        tail = sequence[-n:]
        for text in [sequence, *siblings]:
            for start in range(len(text) - n - 1, -1, -1):
                if text[start : start + n] == tail:
                    return text[start + n : start + n + gamma]
    return []


def test_prompt_lookup_finds_what_a_plain_scan_finds():
    """The indexed lookup (the prompt's token places, agreement counted backwards) against the
    scan on random token streams over a small vocabulary (many repeats of every length)."""
    generator = random.Random(5)
    drafter = PromptLookupDrafter()
    for trial in range(300):
        vocab = generator.choice([3, 5, 12])
        prompt = [generator.randrange(vocab) for _ in range(generator.randrange(0, 40))]
        histories = [[generator.randrange(vocab) for _ in range(generator.randrange(1, 15))] for _ in range(generator.randrange(1, 4))]
        drafter.begin(prompt, len(histories), 16)
        gamma = generator.randrange(1, 8)
        drafts = drafter.propose(histories, gamma)
        for row, (history, draft) in enumerate(zip(histories, drafts)):
            siblings = [h for other, h in enumerate(histories) if other != row]
            want = _scanned_lookup(prompt, history, siblings, gamma, drafter.config.max_ngram)
            assert draft.tokens == want, (trial, prompt, histories, row)


def test_adapt_gamma_rules():
    paper = SpeculationConfig(gamma=4, gamma_min=1, gamma_max=6, rule="max")
    assert adapt_gamma(4, [4, 4], [4, 1], paper) == 5  # someone accepted a full draft
    assert adapt_gamma(4, [4, 2], [0, 0], paper) == 3  # nobody accepted anything
    assert adapt_gamma(4, [4, 2], [1, 2], paper) == 4
    assert adapt_gamma(6, [6], [6], paper) == 6 and adapt_gamma(1, [1], [0], paper) == 1
    mean = SpeculationConfig(gamma=4, gamma_min=1, gamma_max=6, rule="mean")
    assert adapt_gamma(4, [4, 4], [4, 0], mean) == 5  # half of γ on average
    assert adapt_gamma(4, [4, 4, 4, 4], [4, 0, 0, 0], mean) == 4  # one lucky branch is not enough
    assert adapt_gamma(4, [4, 4], [1, 0], mean) == 3  # under a quarter
    assert adapt_gamma(4, [4, 4], [4, 4], SpeculationConfig(rule="fixed")) == 4
    assert SpeculationStats(rounds=3, accepted=6, branch_rounds=6, drafting_branch_rounds=4).mean_accepted_per_round == 1.5


def test_draft_payoff_pauses_drafting_that_does_not_pay():
    payoff = DraftPayoff()
    assert payoff.draft_now()
    payoff.record(True, 4, 100.0)  # drafted: 0.04 tokens/ms
    assert not payoff.draft_now()  # one plain round, to have both rates
    payoff.record(False, 4, 40.0)  # plain: 0.1 tokens/ms
    pauses = []
    for _ in range(5):
        assert payoff.draft_now()
        payoff.record(True, 4, 100.0)  # drafting keeps losing: longer pauses each time
        rounds_paused = 0
        while not payoff.draft_now():
            rounds_paused += 1
            payoff.record(False, 4, 40.0)
        pauses.append(rounds_paused)
        payoff.pause = 0  # draft_now() consumed the round that ended the pause: give it back
    assert pauses == [PAYOFF_FIRST_PAUSE, 2 * PAYOFF_FIRST_PAUSE, 4 * PAYOFF_FIRST_PAUSE, PAYOFF_MAX_PAUSE, PAYOFF_MAX_PAUSE]
    paying = DraftPayoff(plain_rate=0.1)
    for _ in range(3):
        assert paying.draft_now()
        paying.record(True, 12, 60.0)  # 0.2 tokens/ms: drafting pays, never paused
    assert paying.pause == 0 and paying.next_pause == PAYOFF_FIRST_PAUSE


def _rounds(run: SpeculativeRun, model, verify_ms) -> list[int]:
    """Drive a run by hand, with the verification time the machine 'took' per round; -> row widths."""
    widths = []
    with torch.inference_mode():
        while not run.finished():
            rows = run.propose()
            widths.append(max(len(row) for row in rows))
            run.accept(model(pad_rows(rows, model.device), run.cache), verify_ms(widths[-1]))
    return widths


def test_a_greedy_run_stops_drafting_where_verification_costs_more_than_drafts_bring(random_engine):
    model = random_engine.target.model
    plain = decode_regular(model, _tracker(random_engine, 30), 3, SamplingParams(), diverse=True)
    costly = SpeculativeRun(model, _tracker(random_engine, 30), 3, SamplingParams(), WrongDrafter(), diverse=True)
    widths = _rounds(costly, model, lambda width: 50.0 * width)  # every row costs as much as a step: drafts never pay
    assert [b.token_ids for b in costly.branches] == [b.token_ids for b in plain.branches]  # greedy: the same text
    assert widths[:2] == [5, 1] and widths.count(1) > len(widths) // 2  # one plain round to measure, then mostly plain
    cheap = SpeculativeRun(model, _tracker(random_engine, 30), 3, SamplingParams(), PromptLookupDrafter(), diverse=True)
    _rounds(cheap, model, lambda width: 50.0)  # verifying drafts is free: drafting pauses only to measure once
    assert cheap.stats.drafted > 0 and cheap.stats.branch_rounds - cheap.stats.drafting_branch_rounds <= 3
    sampled = SpeculativeRun(model, _tracker(random_engine, 30), 3, SamplingParams(temperature=0.8, seed=3), WrongDrafter())
    assert sampled.payoff is None  # a seed gives the same text whatever the machine's timing


def test_what_drafting_is_worth_carries_over_to_the_next_request(random_engine):
    """The engine keeps one DraftPayoff per k: a second request starts knowing that drafting
    does not pay here, instead of measuring it again."""
    model = random_engine.target.model
    payoffs = DraftPayoffs()
    first = SpeculativeRun(model, _tracker(random_engine, 30), 3, SamplingParams(), WrongDrafter(), diverse=True, payoff=payoffs.for_k(3))
    _rounds(first, model, lambda width: 50.0 * width)
    second = SpeculativeRun(model, _tracker(random_engine, 12), 3, SamplingParams(), WrongDrafter(), diverse=True, payoff=payoffs.for_k(3))
    widths = _rounds(second, model, lambda width: 50.0 * width)
    # 11 rounds (the first token comes with the prefill): a fresh measurement would draft 4 of
    # them (D P D P P D P P P P D); the carried state is already in its longest pause
    assert len(widths) == 11 and sum(width > 1 for width in widths) <= 1
    assert payoffs.for_k(3).plain_rate is not None and payoffs.for_k(5).plain_rate is None  # per k


def test_a_greedy_run_verifies_only_the_drafts_worth_their_rows_and_writes_the_same_text(random_engine):
    model = random_engine.target.model
    plain = decode_regular(model, _tracker(random_engine, 30), 3, SamplingParams(), diverse=True)
    budget = DraftBudget()
    # each row costs a third of a 3-row round: a token at even odds does not pay. Seconds, not
    # milliseconds: a round's cost also counts the head's real time, which a loaded machine can
    # stretch by tens of ms (then a draft at even odds paid against 30 ms rounds)
    for rows, ms in ((3, 3000.0), (30, 30000.0)):
        budget.costs.record(torch.get_num_threads(), rows, ms)
    run = SpeculativeRun(model, _tracker(random_engine, 30), 3, SamplingParams(), PromptLookupDrafter(), diverse=True, budget=budget)
    widths = _rounds(run, model, lambda width: 3000.0 * width)
    assert [b.token_ids for b in run.branches] == [b.token_ids for b in plain.branches]
    assert set(widths) == {1} and run.stats.drafted == 0
    assert run.budget is budget and budget.costs.estimate(torch.get_num_threads(), 3) == pytest.approx(3000.0, abs=500.0)


# --- exact speculative sampling on a tiny vocabulary -------------------------------------------

TINY_VOCAB = ["a", "b", "c", "d", "e", "f", "g", "h"]


def _tiny_model_folder(root: Path, seed: int) -> Path:
    folder = write_random_model(
        root / f"tiny{seed}", "llama", seed=seed, vocab_size=len(TINY_VOCAB), hidden_size=32, intermediate_size=64, eos_token_id=None, bos_token_id=None
    )
    tokenizer = HFTokenizer(models.WordLevel({t: i for i, t in enumerate(TINY_VOCAB)}, unk_token="a"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    (folder / "tokenizer.json").write_text(tokenizer.to_str())
    return folder


def _chi_square_limit(df: int) -> float:
    """~0.9999 quantile of chi-square(df) (Wilson–Hilferty)."""
    z = 3.719
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_speculative_sampling_matches_the_target_distribution(tmp_path: Path):
    target_dir, draft_dir = _tiny_model_folder(tmp_path, 3), _tiny_model_folder(tmp_path, 4)
    target = load_transformer(target_dir, torch.float32)
    draft = load_transformer(draft_dir, torch.float32)
    with torch.no_grad():  # make both distributions far from uniform, and different
        target.lm_head.weight.mul_(60.0)
        draft.lm_head.weight.mul_(60.0)
    tokenizer = Tokenizer.from_folder(target_dir)
    prompt = [0, 3, 5, 2]
    params = SamplingParams(temperature=1.0, top_p=1.0, seed=11)
    samples = 4000
    tracker = BranchTracker(tokenizer, StopRule(), DecodeLimits(3, ignore_eos=True), prompt)
    output = decode_speculative(target, tracker, samples, params, ModelDrafter(draft, params), SpeculationConfig(gamma=2, rule="fixed"))
    pairs = torch.zeros(8, 8)
    for branch in output.branches:
        assert len(branch.token_ids) == 3
        pairs[branch.token_ids[1], branch.token_ids[2]] += 1  # tokens 2 and 3 come from speculation
    first = torch.zeros(8)
    for branch in output.branches:
        first[branch.token_ids[0]] += 1
    # exact joint of tokens 2 and 3 given token 1, weighted by the empirical token-1 counts
    expected = torch.zeros(8, 8)
    with torch.inference_mode():
        for t1 in range(8):
            if first[t1] == 0:
                continue
            p2 = torch.softmax(_logits(target, prompt + [t1]), -1)
            for t2 in range(8):
                p3 = torch.softmax(_logits(target, prompt + [t1, t2]), -1)
                expected[t2] += first[t1] * p2[t2] * p3
    mask = expected > 5  # chi-square needs expected counts >= 5
    statistic = (((pairs - expected) ** 2)[mask] / expected[mask]).sum().item()
    assert statistic < _chi_square_limit(int(mask.sum()) - 1), statistic
    assert output.stats.accepted > 0 and output.stats.accepted < output.stats.drafted  # both paths ran


def _logits(model, ids: list[int]) -> torch.Tensor:
    from kspec.engine.cache.kv import RaggedKVCache

    cache = RaggedKVCache(model.cache_shape, 1, len(ids), torch.float32)
    return model.step(torch.tensor([ids]), cache)[0]


SERVED_PROMPTS = [CODE, "import os\n\n\ndef list_python_files(folder):\n    names = []\n", "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"]


def _served_texts(engine, requests, together: bool) -> list[list[str]]:
    """The serving path: requests through the batcher (all in one batch, or each alone)."""
    outcomes: dict[int, object] = {}
    batchers = [engine.batcher(max_requests=len(requests))] if together else [engine.batcher(max_requests=1) for _ in requests]
    for index, request in enumerate(requests):
        batcher = batchers[0] if together else batchers[index]
        batcher.add(request, CancelToken(), lambda result, error, index=index: outcomes.__setitem__(index, result if error is None else error))
    for batcher in batchers:
        while not batcher.idle:
            batcher.run_round()
    assert all(not isinstance(value, BaseException) for value in outcomes.values()), outcomes
    return [[c.text for c in outcomes[i].completions] for i in range(len(requests))]


def test_bass_on_the_serving_path_is_exact_for_every_drafter(random_engine, draft_model):
    """BASS through the batcher (the path that serves requests), several requests verified
    together, gives the texts of plain greedy decoding (no drafter, one token per round)."""
    from dataclasses import replace

    from kspec.engine.api import CompletionRequest
    from kspec.engine.completion import CompletionEngine
    from kspec.engine.models.loading import LoadedModel

    requests = [
        CompletionRequest(prefix=prompt, k=k, max_tokens=16, raw=True, cursor_rules=False, deadline_ms=600_000)
        for prompt, k in zip(SERVED_PROMPTS, (3, 1, 4))
    ]
    target, config = random_engine.target, random_engine.config
    draft = LoadedModel(draft_model, target.tokenizer, "random draft")

    def engine(drafter: str, with_draft: bool = False) -> CompletionEngine:
        return CompletionEngine(target, replace(config, drafter=drafter, draft="draft" if with_draft else None), draft if with_draft else None)

    plain = _served_texts(engine("none"), requests, together=False)
    assert all(texts for texts in plain)
    for name, made in {"none": engine("none"), "lookup": engine("lookup"), "layerskip": engine("layerskip"), "model": engine("model", True)}.items():
        assert _served_texts(made, requests, together=True) == plain, name


def test_finished_is_a_question_and_finished_branches_leave_at_the_next_proposal(random_engine):
    """`finished()` changes nothing, however often it is asked; a branch that ended stops costing
    a row when the next round's rows are proposed."""
    model = random_engine.target.model
    run = SpeculativeRun(model, _tracker(random_engine, 30), 3, SamplingParams(), WrongDrafter(), diverse=True)
    with torch.inference_mode():
        while not run.finished():
            run.branches[run.live[0]].finish_reason = "stop"  # one branch ends (as a stop rule would)
            live = list(run.live)
            for _ in range(3):
                run.finished()
            assert run.live == live  # asking did not compact
            if run.finished():
                break
            rows = run.propose()
            assert len(rows) == len(run.live) == sum(not run.branches[index].done for index in live)
            run.accept(model(pad_rows(rows, model.device), run.cache), 10.0)

"""A sampling run whose leading branches stay greedy (`SamplingParams.greedy_branches`): branch 0
is the greedy text under speculative decoding whatever the drafter, the other branches are exact
samples of the target (speculative sampling's rule), and a seed gives the same branches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kspec.bench.baselines import decode_regular, decode_speculative
from kspec.engine.api import CompletionRequest
from kspec.engine.decode.acceptance import accept_drafts
from kspec.engine.decode.branches import BranchTracker, DecodeLimits
from kspec.engine.decode.drafters import ModelDrafter, NoDrafter, PromptLookupDrafter
from kspec.engine.decode.sampling import SamplingParams, choose_tokens
from kspec.engine.decode.speculative import SpeculationConfig
from kspec.engine.decode.stopping import StopRule
from kspec.engine.errors import InputError
from kspec.engine.models.hf_folder import load_transformer
from kspec.engine.models.tokenizer import Tokenizer
from kspec.engine.request import sampling_params, validate_request
from test_speculative import CODE, WrongDrafter, _chi_square_limit, _logits, _tiny_model_folder

MIXED = SamplingParams(temperature=0.9, seed=5, greedy_branches=1)


def _tracker(engine, new_tokens: int = 20) -> BranchTracker:
    ids = engine.target.tokenizer.encode(CODE)
    return BranchTracker(engine.target.tokenizer, StopRule(), DecodeLimits(new_tokens, ignore_eos=True), ids)


def test_params_say_which_branches_are_greedy() -> None:
    assert [MIXED.greedy_branch(i) for i in range(3)] == [True, False, False]
    assert all(SamplingParams().greedy_branch(i) for i in range(3))
    assert not any(SamplingParams(temperature=0.5).greedy_branch(i) for i in range(3))
    with pytest.raises(ValueError):
        SamplingParams(temperature=0.5, greedy_branches=-1)


def test_choose_tokens_takes_the_argmax_in_greedy_rows_only() -> None:
    logits = torch.tensor([[0.0, 0.1, 0.2, 0.3]]).expand(64, -1)  # nearly flat: samples vary
    tokens, _ = choose_tokens(logits, SamplingParams(temperature=1.0, seed=0, greedy_branches=2), torch.Generator().manual_seed(0))
    assert tokens[:2].tolist() == [3, 3]
    assert len(set(tokens[2:].tolist())) > 1


def test_accept_drafts_applies_the_greedy_rule_to_greedy_rows_and_leaves_the_sampled_rows_alone() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 16)  # [k, T, V]
    log_probs = torch.log_softmax(logits, dim=-1)
    greedy = logits.argmax(-1)  # [k, T]
    drafts = [[int(greedy[0, 0]), int(greedy[0, 1]), (int(greedy[0, 2]) + 1) % 16], [1, 2, 3], [int(greedy[2, 0]), 5, 6]]
    params = SamplingParams(temperature=1.0, seed=1)
    sampled = accept_drafts(drafts, [None] * 3, logits, log_probs, params, torch.Generator().manual_seed(1))
    mixed = accept_drafts(drafts, [None] * 3, logits, log_probs, params, torch.Generator().manual_seed(1), [True, False, False])
    assert mixed.accepted[0] == 2 and mixed.tokens[0] == [int(greedy[0, 0]), int(greedy[0, 1]), int(greedy[0, 2])]
    assert mixed.tokens[1:] == sampled.tokens[1:] and mixed.accepted[1:] == sampled.accepted[1:]


@pytest.mark.parametrize("drafter", ["none", "lookup", "model-self", "wrong"])
def test_branch_zero_is_the_greedy_text_under_speculation(random_engine, drafter) -> None:
    model = random_engine.target.model
    greedy = decode_regular(model, _tracker(random_engine), 1, SamplingParams()).branches[0].token_ids
    make = {"none": NoDrafter, "lookup": PromptLookupDrafter, "model-self": lambda: ModelDrafter(model, MIXED), "wrong": WrongDrafter}[drafter]
    runs = [decode_speculative(model, _tracker(random_engine), 4, MIXED, make(), SpeculationConfig(gamma=3)) for _ in range(2)]
    first, again = ([b.token_ids for b in run.branches] for run in runs)
    assert first[0] == greedy
    assert first == again  # seeded
    assert any(tokens != greedy for tokens in first[1:])  # the others are samples, not copies of the greedy one


def test_the_sampled_branches_follow_the_target_distribution(tmp_path: Path) -> None:
    """As test_speculative_sampling_matches_the_target_distribution, with branch 0 greedy."""
    target_dir, draft_dir = _tiny_model_folder(tmp_path, 3), _tiny_model_folder(tmp_path, 4)
    target, draft = load_transformer(target_dir, torch.float32), load_transformer(draft_dir, torch.float32)
    with torch.no_grad():
        target.lm_head.weight.mul_(60.0)
        draft.lm_head.weight.mul_(60.0)
    tokenizer = Tokenizer.from_folder(target_dir)
    prompt = [0, 3, 5, 2]
    params = SamplingParams(temperature=1.0, top_p=1.0, seed=11, greedy_branches=1)
    samples = 4000
    tracker = BranchTracker(tokenizer, StopRule(), DecodeLimits(3, ignore_eos=True), prompt)
    output = decode_speculative(target, tracker, samples + 1, params, ModelDrafter(draft, params), SpeculationConfig(gamma=2, rule="fixed"))
    with torch.inference_mode():
        ids = list(prompt)
        for _ in range(3):
            ids.append(int(_logits(target, ids).argmax()))
    assert output.branches[0].token_ids == ids[len(prompt) :]
    sampled = output.branches[1:]
    first = torch.zeros(8)
    pairs = torch.zeros(8, 8)
    for branch in sampled:
        first[branch.token_ids[0]] += 1
        pairs[branch.token_ids[1], branch.token_ids[2]] += 1
    expected = torch.zeros(8, 8)
    with torch.inference_mode():
        p1 = torch.softmax(_logits(target, prompt), -1)
        for t1 in range(8):
            if first[t1] == 0:
                continue
            p2 = torch.softmax(_logits(target, prompt + [t1]), -1)
            for t2 in range(8):
                expected[t2] += first[t1] * p2[t2] * torch.softmax(_logits(target, prompt + [t1, t2]), -1)
    mask = expected > 5
    statistic = (((pairs - expected) ** 2)[mask] / expected[mask]).sum().item()
    assert statistic < _chi_square_limit(int(mask.sum()) - 1), statistic
    expected_first = p1 * samples
    mask = expected_first > 5
    statistic = (((first - expected_first) ** 2)[mask] / expected_first[mask]).sum().item()
    assert statistic < _chi_square_limit(int(mask.sum()) - 1), statistic
    assert output.stats.accepted > 0 and output.stats.accepted < output.stats.drafted


def test_a_request_asks_for_sampled_others_in_mode_diverse() -> None:
    request = CompletionRequest("x = ", k=4, others_temperature=0.7, top_p=0.9, seed=3)
    assert sampling_params(request) == SamplingParams(0.7, 0.9, 3, greedy_branches=1)
    assert sampling_params(CompletionRequest("x = ", k=1, others_temperature=0.7)).greedy  # one branch: the greedy one
    assert sampling_params(CompletionRequest("x = ", k=4)).greedy  # 0: the diverse split
    with pytest.raises(InputError):
        validate_request(CompletionRequest("x = ", k=4, others_temperature=-1.0))


def test_the_engine_answers_with_sampled_others_and_the_same_top_text(random_engine) -> None:
    base = dict(prefix=CODE, k=4, max_tokens=12, raw=True, cursor_rules=False)
    greedy = random_engine.complete(CompletionRequest(**{**base, "k": 1}))
    mixed = [random_engine.complete(CompletionRequest(**base, others_temperature=1.0, seed=2)) for _ in range(2)]
    assert [c.text for c in mixed[0].completions] == [c.text for c in mixed[1].completions]
    texts = {c.text for c in mixed[0].completions}
    assert greedy.completions[0].text in texts  # the top text is still there (ranking may reorder it)
    assert len(texts) > 1

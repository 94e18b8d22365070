"""Our decoder against transformers on small random configs of every supported family.

Tolerances (max |logit difference|, logits of magnitude ~1-10):
  float32: 2e-4
  bfloat16: our bf16 error against HF's fp32 logits is at most 2x (+0.01) HF's own bf16 error
Greedy: 32 tokens identical, with and without our KV cache, for a ragged batch of prompts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kspec.bench.baselines import greedy_batch, ragged_forward  # noqa: E402
from kspec.engine.cache.kv import RaggedKVCache  # noqa: E402
from kspec.engine.models.hf_folder import load_transformer  # noqa: E402

VOCAB = 512
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.3,  # peaked logits: greedy choices are not near-ties
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(rope_theta=10000.0)),
    "llama-tied-mha": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "llama-linear-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(rope_scaling={"rope_type": "linear", "factor": 4.0}, rope_theta=10000.0),
    ),
    "llama3-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            rope_theta=500000.0,
        ),
    ),
    "llama-attention-bias": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=1000000.0)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(rope_theta=1000000.0, head_dim=32)),  # head_dim != hidden / heads
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=4096)),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(sliding_window=None, use_bias=True)),
}

PROMPTS = [[5, 17, 99, 3, 250, 42, 7], [11, 300], [8, 8, 8, 120, 64, 33, 2, 19, 77, 401, 6, 9, 13]]


def _hf_model(family: str, folder: Path):
    config_name, model_name, extra = FAMILIES[family]
    torch.manual_seed(1234)
    config = getattr(transformers, config_name)(**{**BASE, **extra})
    model = getattr(transformers, model_name)(config).eval()
    if "bias" in family or family in ("qwen2", "starcoder2"):
        with torch.no_grad():  # HF initialises biases to zero: make them matter
            for name, param in model.named_parameters():
                if name.endswith("bias"):
                    param.normal_(0.0, 0.3)
    if family == "qwen3":
        with torch.no_grad():  # HF initialises the q/k norms to ones: make them matter
            for name, param in model.named_parameters():
                if name.endswith(("q_norm.weight", "k_norm.weight")):
                    param.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = _hf_model(request.param, folder)
    ours = load_transformer(folder, torch.float32)
    return request.param, hf, ours, folder


def _hf_logits(hf, prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf(torch.tensor([prompt])).logits[0].float()  # [T, V]


def test_logits_match_for_ragged_batch(pair):
    _, hf, ours, _ = pair
    cache = RaggedKVCache(ours.cache_shape, len(PROMPTS), 64, torch.float32)
    width = max(map(len, PROMPTS))
    padded = torch.tensor([p + [0] * (width - len(p)) for p in PROMPTS])
    with torch.inference_mode():
        logits = ours.logits(ours(padded, cache))  # [B, T, V]
    for row, prompt in enumerate(PROMPTS):
        expected = _hf_logits(hf, prompt)
        assert torch.allclose(logits[row, : len(prompt)], expected, atol=2e-4, rtol=0), (
            (logits[row, : len(prompt)] - expected).abs().max()
        )


def test_greedy_32_tokens_match_with_and_without_cache(pair):
    _, hf, ours, _ = pair
    cached = greedy_batch(ours, PROMPTS, 32, use_cache=True)
    uncached = greedy_batch(ours, PROMPTS, 32, use_cache=False)
    for prompt, with_cache, without_cache in zip(PROMPTS, cached, uncached):
        with torch.inference_mode():
            reference = hf.generate(
                torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0
            )[0, len(prompt) :].tolist()
        assert with_cache == reference
        assert without_cache == reference


def test_bfloat16_error_no_worse_than_transformers(pair):
    family, hf, _, folder = pair
    ours = load_transformer(folder, torch.bfloat16)
    prompt = PROMPTS[2]
    cache = RaggedKVCache(ours.cache_shape, 1, 32, torch.bfloat16)
    reference = _hf_logits(hf, prompt)  # fp32
    with torch.inference_mode():
        ours_bf16 = ours.logits(ours(torch.tensor([prompt]), cache))[0]
        hf_bf16 = hf.to(torch.bfloat16)(torch.tensor([prompt])).logits[0].float()
    hf.to(torch.float32)
    our_error = (ours_bf16 - reference).abs().max().item()
    their_error = (hf_bf16 - reference).abs().max().item()
    assert our_error <= 2 * their_error + 0.01, (family, our_error, their_error)


def test_ragged_decode_step_matches_single_rows(pair):
    """One ragged decode step (rows at different lengths) equals each row decoded alone."""
    _, _, ours, _ = pair
    cache = RaggedKVCache(ours.cache_shape, len(PROMPTS), 64, torch.float32)
    with torch.inference_mode():
        ragged_forward(ours, [list(p) for p in PROMPTS], cache)
        batched = ours.step(torch.tensor([[3], [4], [5]]), cache)  # [B, V]
        for row, (prompt, token) in enumerate(zip(PROMPTS, [3, 4, 5])):
            single = RaggedKVCache(ours.cache_shape, 1, 64, torch.float32)
            alone = ours.step(torch.tensor([prompt + [token]]), single)[0]
            assert torch.allclose(batched[row], alone, atol=2e-4, rtol=0)

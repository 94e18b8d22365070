"""Small random models on disk, for tests and benchmarks (no hub, no download).

The tokenizer is the embedded default model's, so prompts are real code tokens."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from kspec.engine.models.args import ModelArgs
from kspec.engine.models.resolve import resolve_model
from kspec.engine.models.quantized import Q4Codes
from kspec.engine.models.transformer import Transformer, init_random

TOKENIZER_VOCAB = 49152  # the default model's tokenizer

FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "rope_theta": 10000.0},
    "qwen2": {"model_type": "qwen2", "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_theta": 1000000.0},
    "mistral": {"model_type": "mistral", "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "sliding_window": 4096},
    "qwen3": {"model_type": "qwen3", "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_theta": 1000000.0, "head_dim": 16},
    "starcoder2": {
        "model_type": "starcoder2",
        "norm_epsilon": 1e-5,
        "use_bias": True,
        "hidden_act": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
        "sliding_window": None,
    },
}


def random_config(family: str, **overrides: Any) -> dict[str, Any]:
    """An HF config.json dict for a small model of `family`."""
    if family not in FAMILY_CONFIGS:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILY_CONFIGS)}")
    config = {
        "vocab_size": TOKENIZER_VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "bos_token_id": 1,
        "eos_token_id": 2,
        **FAMILY_CONFIGS[family],
    }
    config.update(overrides)
    return config


def write_random_model(folder: Path, family: str = "llama", seed: int = 0, **overrides: Any) -> Path:
    """Write config.json, model.safetensors and tokenizer.json of a random model into `folder`."""
    config = random_config(family, **overrides)
    model = init_random(ModelArgs.from_hf_config(config), seed)
    folder.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    if model.args.tie_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    shutil.copyfile(borrowed_tokenizer(), folder / "tokenizer.json")
    return folder


def borrowed_tokenizer() -> Path:
    """The tokenizer random models borrow: the embedded model's, or $KSPEC_TEST_TOKENIZER's file on a
    machine without the embedded model (the GPU machine of docs/measurements/h200.md)."""
    given = os.environ.get("KSPEC_TEST_TOKENIZER")
    return Path(given) if given else resolve_model(None, progress=False).folder / "tokenizer.json"


def quantized_model(family: str, seed: int, **overrides: Any) -> tuple[Transformer, dict[str, Q4Codes]]:
    """A random float32 model whose projection weights are exactly 4-bit weights, and those codes
    (`overrides`: config.json fields over the family's)."""
    args = ModelArgs.from_hf_config(random_config(family, vocab_size=512, **overrides))
    model = init_random(args, seed)
    codes = {}
    with torch.no_grad():
        for name, module in model.model.layers.named_modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.mul_(8.0)  # std 0.16: peaked logits, as a trained model's
                q4 = Q4Codes.quantize(module.weight)
                module.weight.copy_(q4.dequantize())
                codes[f"model.layers.{name}.weight"] = q4
        model.lm_head.weight.mul_(8.0)
        generator = torch.Generator().manual_seed(seed)
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):  # Qwen3's per-head norms: not all ones, so they matter
                param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
            elif args.layer_norm and name.endswith("norm.weight"):  # StarCoder2's LayerNorms: weights and biases that matter
                param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
            elif args.layer_norm and name.endswith("bias"):  # LayerNorm and projection biases (init_random's 0.02 would vanish)
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model, codes

"""GGUF files of real code models' shapes with random weights, for speed and memory measurements
without a model hub: `python -m kspec.bench.model_shapes SHAPE TYPE OUT.gguf`.

The tokenizer is the small SmolLM2-135M's (`kspec models pull smollm2-135m`; 49152 tokens), so the vocabulary (and the head) is
smaller than the real model's; every other shape is the real one. Tensor types follow llama.cpp's
mixes (llama-quantize's `llama_tensor_get_type`, simplified): Q4_K_M keeps Q4_K for most
matrices and Q6_K for the head and for attn_v / ffn_down of the layers `use_more_bits` picks;
rows that are not a multiple of 256 weights fall back to Q5_0 / Q5_1 / Q8_0 as llama.cpp does.
Speed and memory are real; the text they write is noise.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from kspec.engine.models.gguf_encode import SUPER, encode

TOKENIZER_MODEL = "smollm2-135m"  # whose tokenizer the shapes carry
TOKENIZER_VOCAB = 49152  # SmolLM2's tokenizer


@dataclass(frozen=True)
class Shape:
    arch: str  # GGUF architecture: llama, qwen2, qwen3, starcoder2
    layers: int
    dim: int
    ffn: int
    heads: int
    kv_heads: int
    tied: bool
    rope_theta: float = 10000.0
    context: int = 32768

    def __post_init__(self) -> None:
        if self.dim % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} / kv heads {self.kv_heads} do not divide dim {self.dim}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


SHAPES = {
    "smollm2-135m": Shape("llama", 30, 576, 1536, 9, 3, True, 100000.0, 8192),
    "qwen2.5-coder-0.5b": Shape("qwen2", 24, 896, 4864, 14, 2, True, 1000000.0),
    "qwen2.5-coder-1.5b": Shape("qwen2", 28, 1536, 8960, 12, 2, True, 1000000.0),
    "qwen2.5-coder-7b": Shape("qwen2", 28, 3584, 18944, 28, 4, False, 1000000.0),
    "starcoder2-3b": Shape("starcoder2", 30, 3072, 12288, 24, 2, True, 999999.4, 16384),
    "qwen3-1.7b": Shape("qwen3", 28, 2048, 6144, 16, 8, True, 1000000.0, 40960),
    "tiny": Shape("qwen2", 2, 256, 512, 4, 2, True, 1000000.0, 4096),  # tests
}

# llama.cpp's mixes: (base type, type of the head and of the picked attn_v / ffn_down)
MIXES = {"Q4_K_M": ("Q4_K", "Q6_K"), "Q5_K_M": ("Q5_K", "Q6_K"), "Q4_K_S": ("Q4_K", "Q4_K")}
SINGLE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32")
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}  # rows not a multiple of 256
FILE_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "F16": 1, "BF16": 32, "F32": 0}


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v / ffn_down get the mix's larger type."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(mix: str, role: str, layer: int, layers: int, cols: int) -> str:
    """The GGUF type of a matrix: role is 'head', 'embd', or the block tensor name (attn_v, ...)."""
    if mix in SINGLE_TYPES:
        kind = mix
    else:
        base, more = MIXES[mix]
        picked = role == "head" or (role in ("attn_v", "ffn_down") and use_more_bits(layer, layers))
        kind = more if picked else base
    return FALLBACK[kind] if kind in FALLBACK and cols % SUPER else kind


def tensors(shape: Shape) -> Iterator[tuple[str, str, int, tuple[int, ...]]]:
    """(GGUF name, role, layer, [rows, cols] or [n]) of every tensor of the shape."""
    d, f, hd = shape.dim, shape.ffn, shape.head_dim
    kv = shape.kv_heads * hd
    biased = shape.arch in ("qwen2", "starcoder2")
    yield "token_embd.weight", "head" if shape.tied else "embd", -1, (TOKENIZER_VOCAB, d)
    for i in range(shape.layers):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", "norm", i, (d,)
        for name, rows in (("attn_q", d), ("attn_k", kv), ("attn_v", kv)):
            yield p + name + ".weight", name, i, (rows, d)
            if biased:
                yield p + name + ".bias", "norm", i, (rows,)
        if shape.arch == "qwen3":  # per-head RMSNorm of q and k
            yield p + "attn_q_norm.weight", "norm", i, (hd,)
            yield p + "attn_k_norm.weight", "norm", i, (hd,)
        yield p + "attn_output.weight", "attn_output", i, (d, d)
        yield p + "ffn_norm.weight", "norm", i, (d,)
        if shape.arch == "starcoder2":
            for name in ("attn_norm.bias", "attn_output.bias", "ffn_norm.bias", "ffn_down.bias"):
                yield p + name, "norm", i, (d,)
            yield p + "ffn_up.bias", "norm", i, (f,)
        else:
            yield p + "ffn_gate.weight", "ffn_gate", i, (f, d)
        yield p + "ffn_up.weight", "ffn_up", i, (f, d)
        yield p + "ffn_down.weight", "ffn_down", i, (d, f)
    yield "output_norm.weight", "norm", -1, (d,)
    if shape.arch == "starcoder2":
        yield "output_norm.bias", "norm", -1, (d,)
    if not shape.tied:
        yield "output.weight", "head", -1, (TOKENIZER_VOCAB, d)


def _copy_tokenizer(writer, tokenizer_gguf: Path) -> None:  # type: ignore[no-untyped-def]
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(str(tokenizer_gguf))
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.") and key != "tokenizer.chat_template":
            sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)


def write_shape(shape: Shape, mix: str, out: Path, tokenizer_gguf: Path, seed: int = 0, progress: bool = True) -> Path:
    """Write a GGUF of `shape` whose matrices have `mix`'s types, random weights (std 0.02, norms 1)."""
    import gguf
    from tqdm import tqdm

    if mix not in MIXES and mix not in SINGLE_TYPES:
        raise ValueError(f"unknown type {mix!r}; known: {', '.join([*MIXES, *SINGLE_TYPES])}")
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), shape.arch)
    a = shape.arch
    writer.add_key_value("general.name", f"random {mix}", gguf.GGUFValueType.STRING)
    writer.add_key_value("general.file_type", FILE_TYPES.get(mix, 0), gguf.GGUFValueType.UINT32)
    for key, value in {
        "context_length": shape.context, "embedding_length": shape.dim, "block_count": shape.layers,
        "feed_forward_length": shape.ffn, "attention.head_count": shape.heads, "attention.head_count_kv": shape.kv_heads,
        "rope.dimension_count": shape.head_dim, "attention.key_length": shape.head_dim, "vocab_size": TOKENIZER_VOCAB,
    }.items():  # fmt: skip
        writer.add_key_value(f"{a}.{key}", value, gguf.GGUFValueType.UINT32)
    writer.add_key_value(f"{a}.rope.freq_base", shape.rope_theta, gguf.GGUFValueType.FLOAT32)
    eps_key = "attention.layer_norm_epsilon" if a == "starcoder2" else "attention.layer_norm_rms_epsilon"
    writer.add_key_value(f"{a}.{eps_key}", 1e-6, gguf.GGUFValueType.FLOAT32)
    _copy_tokenizer(writer, tokenizer_gguf)
    for name, role, layer, dims in tqdm(list(tensors(shape)), desc=f"writing {out.name}", unit="tensor", disable=not progress):
        if len(dims) == 1:
            values = np.ones(dims, np.float32) if name.endswith("norm.weight") else np.zeros(dims, np.float32)
            writer.add_tensor(name, values)
            continue
        kind = tensor_type(mix, role, layer, shape.layers, dims[1])
        weight = rng.standard_normal(dims, dtype=np.float32) * 0.02
        data = encode(weight, kind)
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    return out


def hf_config(shape: Shape) -> dict[str, object]:
    """The shape's HF config.json."""
    config: dict[str, object] = {
        "model_type": shape.arch, "vocab_size": TOKENIZER_VOCAB, "hidden_size": shape.dim, "intermediate_size": shape.ffn,
        "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
        "max_position_embeddings": shape.context, "rope_theta": shape.rope_theta, "tie_word_embeddings": shape.tied,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
    }  # fmt: skip
    if shape.arch == "starcoder2":
        config.update(norm_epsilon=1e-6, use_bias=True, hidden_act="gelu_pytorch_tanh")
    else:
        config["rms_norm_eps"] = 1e-6
    return config


def write_hf_folder(shape: Shape, out: Path, tokenizer_json: Path, seed: int = 0, progress: bool = True) -> Path:
    """An HF folder of `shape`: config.json, tokenizer.json and bfloat16 safetensors (random
    weights as in write_shape), as users download them."""
    import json
    import shutil

    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm

    from kspec.engine.models.gguf_convert import hf_tensor_name

    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    state: dict[str, torch.Tensor] = {}
    for name, _, _, dims in tqdm(list(tensors(shape)), desc=f"writing {out.name}", unit="tensor", disable=not progress):
        values = rng.standard_normal(dims, dtype=np.float32) * 0.02 if len(dims) == 2 else (
            np.ones(dims, np.float32) if name.endswith("norm.weight") else np.zeros(dims, np.float32))  # fmt: skip
        state[hf_tensor_name(name, shape.arch)] = torch.from_numpy(values).to(torch.bfloat16)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(shape), indent=1))
    shutil.copyfile(tokenizer_json, out / "tokenizer.json")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kspec.bench.model_shapes", description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("type", help=f"one of {', '.join([*MIXES, *SINGLE_TYPES])}, or hf (an HF folder of bfloat16 safetensors)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from kspec.engine.models.resolve import known_model_path, resolve_model

    try:
        if args.type == "hf":
            write_hf_folder(SHAPES[args.shape], args.out, resolve_model(TOKENIZER_MODEL, progress=False).folder / "tokenizer.json", args.seed)
        else:
            write_shape(SHAPES[args.shape], args.type, args.out, known_model_path(TOKENIZER_MODEL), args.seed)
    except ValueError as exc:
        print(f"kspec: {exc}", file=sys.stderr)
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

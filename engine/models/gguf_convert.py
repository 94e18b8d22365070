"""Turn a GGUF file into an HF model folder (config.json, tokenizer.json) whose weight matrices
are kspec's kernel terms (q4.safetensors: gguf_blocks.py) and whose other tensors (norms,
biases, matrices no kernel takes) are float32 (model.safetensors). hf_folder.py dequantizes the
terms for a path that wants dense weights.

The folder is written to a temporary directory and renamed into place, so a failed conversion
leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from kspec.engine.errors import ModelLoadError
from kspec.engine.models.gguf_blocks import float_quantization_of, tensor_terms
from kspec.engine.models.quantized import Q4_FILE, TERM_SEPARATOR, SixBitCodes, q4_tensors, save_q4_tensors, six_bit_name

ProgressCallback = Callable[[float, str], None]  # (fraction done in [0, 1], what is happening)

# GGUF architecture -> HF model_type
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "starcoder2": "starcoder2"}

_TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output_norm.bias": "model.norm.bias",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_STARCODER2_BLOCK_NAMES = {**_BLOCK_NAMES, "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}

# GGUF tokenizer.ggml.pre -> how text is split before byte-level BPE
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SUPPORTED_PRE_TOKENIZERS = ("smollm", "starcoder", "qwen2", "gpt2", "default")

CONVERTING = "converting the GGUF file once (later starts reuse it)"  # what the first start shows


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def gguf_config(reader: Any) -> dict[str, Any]:
    arch = _field(reader, "general.architecture", "")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(sorted(GGUF_ARCHITECTURES))}"
        )
    n_heads = int(_field(reader, f"{arch}.attention.head_count"))
    dim = int(_field(reader, f"{arch}.embedding_length"))
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    eps_key = f"{arch}.attention.layer_norm_epsilon" if arch == "starcoder2" else f"{arch}.attention.layer_norm_rms_epsilon"
    config: dict[str, Any] = {
        "model_type": GGUF_ARCHITECTURES[arch],
        "vocab_size": int(_field(reader, f"{arch}.vocab_size", len(tokens))),
        "hidden_size": dim,
        "intermediate_size": int(_field(reader, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, f"{arch}.block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", n_heads)),
        "head_dim": int(_field(reader, f"{arch}.attention.key_length", _field(reader, f"{arch}.rope.dimension_count", dim // n_heads))),
        "max_position_embeddings": int(_field(reader, f"{arch}.context_length", 4096)),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": not has_output,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }
    config["rms_norm_eps" if arch != "starcoder2" else "norm_epsilon"] = float(_field(reader, eps_key, 1e-5))
    if arch == "starcoder2":
        config["use_bias"] = any(t.name == "blk.0.attn_q.bias" for t in reader.tensors)
    return config


def hf_tensor_name(gguf_name: str, arch: str) -> str:
    if gguf_name in _TENSOR_NAMES:
        return _TENSOR_NAMES[gguf_name]
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    names = _STARCODER2_BLOCK_NAMES if arch == "starcoder2" else _BLOCK_NAMES
    if not match or match.group(2) not in names:
        raise ModelLoadError(f"GGUF tensor {gguf_name!r} has no place in a {arch} model")
    return f"model.layers.{match.group(1)}.{names[match.group(2)]}.{match.group(3)}"


def _unpermute_rotary(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp interleaves the rotary halves of q/k rows for llama; undo it. weight [out, ...]."""
    out = weight.shape[0]
    return weight.reshape(n_heads, out // n_heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_weights(
    reader: Any, config: dict[str, Any], float_quantization: str = "q8", progress: bool = False,
    on_progress: ProgressCallback | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:  # fmt: skip
    """A GGUF file's weights by HF name: (the dense float32 tensors, the matrices as kspec's terms
    in a `save_q4` file's tensors: packed as each is made, so a 7B file converts in its own size).
    Every matrix the kernels can take becomes terms (gguf_blocks.py: the file's codes for the
    types the kernels take, requantized for the others, float matrices quantized per
    `float_quantization`): one 4-bit term, or two (`<name>#hi`, `<name>#lo`) for the 8-bit form,
    or `<name>#q6` for the 6-bit one (Q6_K);
    the rest (vectors, K not a multiple of 32, floats kept dense) is dequantized with `gguf`.
    Rows in HF order (llama's q/k rotary interleave undone)."""
    from gguf import quants

    arch = _field(reader, "general.architecture")
    state: dict[str, torch.Tensor] = {}
    codes: dict[str, torch.Tensor] = {}
    tensors = list(reader.tensors)
    for index, tensor in enumerate(tqdm(tensors, desc=CONVERTING, unit="tensor", disable=not progress)):
        if on_progress is not None:
            on_progress(index / len(tensors), CONVERTING)
        name = hf_tensor_name(tensor.name, arch)
        shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists the fastest dimension first
        heads = _rotary_heads(arch, tensor.name, config)
        quantize = float_quantization_of(name, float_quantization)
        found = tensor_terms(np.asarray(tensor.data), tensor.tensor_type.name, shape, quantize) if len(shape) == 2 else None  # type: ignore[arg-type]
        if found is not None:
            if isinstance(found[0], SixBitCodes):
                names = [six_bit_name(name)]
            else:
                names = [name] if len(found) == 1 else [f"{name}{TERM_SEPARATOR}hi", f"{name}{TERM_SEPARATOR}lo"]
            order = torch.from_numpy(_unpermute_rotary(np.arange(shape[0]), heads)) if heads else None
            for term_name, q4 in zip(names, found):
                codes.update(q4_tensors(term_name, q4 if order is None else q4.permute_rows(order)))
            continue
        array = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)
        if heads:
            array = _unpermute_rotary(array, heads)
        state[name] = torch.from_numpy(np.array(array, dtype=np.float32, order="C", copy=True))
    return state, codes


def write_q4_file(path: Path, folder: Path, float_quantization: str = "q8") -> Path:
    """Write a GGUF file's 4-bit weights into its converted folder (for one converted before they
    were kept); atomically, so a concurrent or failed write leaves nothing half-written."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        codes = gguf_weights(reader, gguf_config(reader), float_quantization)[1]
    except ModelLoadError:
        raise
    except Exception as exc:  # the gguf package raises many kinds on a truncated or corrupt file
        raise ModelLoadError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    staging = folder / f".{Q4_FILE}.{os.getpid()}.tmp"
    try:
        save_q4_tensors(codes, staging)
        os.replace(staging, folder / Q4_FILE)
    finally:
        staging.unlink(missing_ok=True)
    return folder / Q4_FILE


def _rotary_heads(arch: str, gguf_name: str, config: dict[str, Any]) -> int | None:
    """Heads whose rotary halves llama.cpp interleaved in this tensor's rows (llama q/k), else None."""
    if arch != "llama":
        return None
    if gguf_name.endswith(("attn_q.weight", "attn_q.bias")):
        return int(config["num_attention_heads"])
    if gguf_name.endswith(("attn_k.weight", "attn_k.bias")):
        return int(config["num_key_value_heads"])
    return None


def gguf_tokenizer_json(reader: Any) -> str:
    """A `tokenizers` JSON for the byte-level BPE vocabulary stored in the GGUF file."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    model_kind = _field(reader, "tokenizer.ggml.model")
    if model_kind != "gpt2":
        raise ModelLoadError(
            f"GGUF tokenizer type {model_kind!r} is not supported (only byte-level BPE, 'gpt2'); "
            "use the model's HF folder instead"
        )
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if pre not in SUPPORTED_PRE_TOKENIZERS:
        raise ModelLoadError(
            f"GGUF pre-tokenizer {pre!r} is not supported; supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)}"
        )
    tokens: list[str] = list(_field(reader, "tokenizer.ggml.tokens"))
    token_types: list[int] = list(_field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges") or []]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre != "qwen2")
    if pre in ("smollm", "starcoder"):
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre == "qwen2":
        split = pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated")
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    control = 3  # GGUF token type CONTROL; USER_DEFINED (4) tokens are added too, not special
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t, kind in zip(tokens, token_types) if kind == 4])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, kind in zip(tokens, token_types) if kind == control])
    return tokenizer.to_str()


def convert_gguf(
    path: Path, destination: Path, progress: bool = True, on_progress: ProgressCallback | None = None,
    float_quantization: str = "q8",
) -> Path:  # fmt: skip
    """Write the HF folder for GGUF `path` at `destination` atomically; returns destination."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        config = gguf_config(reader)
    except ModelLoadError:
        raise
    except Exception as exc:  # the gguf package raises many kinds on a truncated or corrupt file
        raise ModelLoadError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=destination.parent))
    try:
        try:
            state, codes = gguf_weights(reader, config, float_quantization, progress, on_progress)
            tokenizer_json = gguf_tokenizer_json(reader)
            save_q4_tensors(codes, staging / Q4_FILE)  # the matrices as the kernels take them (hf_folder dequantizes them for other paths)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"{path}: corrupt GGUF data ({type(exc).__name__}: {exc})") from exc
        save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt", "source": path.name})
        (staging / "config.json").write_text(json.dumps(config, indent=1))
        (staging / "tokenizer.json").write_text(tokenizer_json)
        try:
            staging.rename(destination)
        except OSError:
            if not (destination / "model.safetensors").is_file():  # not a concurrent conversion: a real error
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return destination

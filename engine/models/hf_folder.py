"""Load our Transformer from an HF model folder: config.json + *.safetensors (sharded or not)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from kspec.engine.errors import ModelLoadError
from kspec.engine.models.args import ModelArgs
from kspec.engine.models.quantized import Q4_FILE, Q4File, weight_terms
from kspec.engine.models.tensor_file import TensorFile
from kspec.engine.models.transformer import Transformer


def read_args(folder: Path) -> ModelArgs:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{folder}: no config.json (expected an HF model folder or a .gguf file)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{config_path}: unreadable config ({exc})") from exc
    return ModelArgs.from_hf_config(config)


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError) as exc:
            raise ModelLoadError(f"{index}: unreadable shard index ({exc})") from exc
        return [folder / name for name in names]
    files = sorted(path for path in folder.glob("*.safetensors") if path.name != Q4_FILE)  # not the 4-bit copy
    if not files:
        raise ModelLoadError(f"{folder}: no *.safetensors weights (PyTorch .bin checkpoints are not supported)")
    return files


def read_safetensors(path: Path, names: set[str], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors `names` of a safetensors file in `dtype`, one at a time (tensor_file.py: no
    memory map; a float32 checkpoint loaded as bfloat16 peaks at half its size plus one tensor)."""
    try:
        with TensorFile(path) as handle:
            return {name: handle.get(name).to(dtype) for name in handle.names() if name in names}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{path}: unreadable safetensors file ({type(exc).__name__}: {exc})") from exc


def load_transformer(folder: Path, dtype: torch.dtype, device: str = "cpu", skip: frozenset[str] = frozenset()) -> Transformer:
    """skip: weights not to read (they stay on the meta device): ones the caller replaces from
    another source, e.g. the CPU fast path's 4-bit codes. Then the model stays on the CPU."""
    args = read_args(folder)
    with torch.device("meta"):
        model = Transformer(args)
    expected = {name for name, _ in model.named_parameters()}  # lm_head.weight is not there when tied
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        state.update(read_safetensors(path, expected - skip, dtype))
    missing = expected - skip - set(state)
    if missing and (folder / Q4_FILE).is_file():
        state.update(_dequantized_terms(folder / Q4_FILE, missing, dtype))
        missing -= set(state)
    if missing:
        raise ModelLoadError(f"{folder}: weights missing from the checkpoint: {', '.join(sorted(missing)[:5])}")
    model.load_state_dict(state, strict=False, assign=True)  # completeness checked above
    if args.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval() if skip else model.to(device).eval()


def _dequantized_terms(path: Path, names: set[str], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The weights `names` that a converted GGUF keeps only as kernel terms (q4.safetensors),
    dequantized: the sum of each weight's terms, the file's float32 weights up to the terms'
    own rounding (gguf_blocks.py)."""
    found: dict[str, torch.Tensor] = {}
    with Q4File(path) as codes:
        for name in names:
            terms = weight_terms(codes, name)
            if terms is not None:
                found[name] = sum((t.dequantize() for t in terms[1:]), terms[0].dequantize()).to(dtype)
    return found

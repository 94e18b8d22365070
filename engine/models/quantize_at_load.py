"""Float weights (an HF folder of safetensors) quantized once for the CPU fast path's kernels and
cached on disk, keyed by the source files, so the next start reads the kernel terms as a GGUF's
converted folder does (`EngineConfig.quantize`: q8 or q4; gguf_blocks.py has the rules)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from tqdm import tqdm

from kspec.engine.models.gguf_blocks import float_quantization_of, quantize_4bit, quantize_8bit
from kspec.engine.models.hf_folder import weight_files
from kspec.engine.models.quantized import GROUP, Q4_FILE, Q4_FORMAT, TERM_SEPARATOR, q4_tensors, save_q4_tensors
from kspec.engine.models.tensor_file import TensorFile


def source_key(folder: Path, quantize: str) -> str:
    """What says the folder's weights (or the setting, or the terms' format) changed."""
    files = [folder / "config.json", *weight_files(folder)]
    stats = [(path.name, path.stat().st_size, path.stat().st_mtime_ns) for path in files]
    text = json.dumps([str(folder.resolve()), stats, quantize, Q4_FORMAT])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def quantized_terms(folder: Path, quantize: str, cache_dir: Path, progress: bool) -> Path:
    """The kernel terms of every weight matrix of an HF folder (rows of a multiple of 32 weights),
    as a q4.safetensors file under cache_dir, written on first use."""
    if quantize not in ("q8", "q4"):
        raise ValueError(f"quantize must be q8 or q4 here, got {quantize!r}")
    target = cache_dir / "quantized" / source_key(folder, quantize) / Q4_FILE
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    files = weight_files(folder)
    with tqdm(desc=f"quantizing {folder.name} to {quantize} (once)", unit="tensor", disable=not progress) as bar:
        for path in files:
            with TensorFile(path) as handle:
                for name in handle.names():
                    bar.update()
                    weight = handle.get(name)
                    if weight.dim() != 2 or weight.shape[1] % GROUP or not weight.is_floating_point():
                        continue
                    values = weight.float().numpy()
                    terms = quantize_8bit(values) if float_quantization_of(name, quantize) == "q8" else quantize_4bit(values)
                    names = [name] if len(terms) == 1 else [f"{name}{TERM_SEPARATOR}hi", f"{name}{TERM_SEPARATOR}lo"]
                    for term_name, term in zip(names, terms):
                        tensors.update(q4_tensors(term_name, term))
    staging = target.with_name(f".{Q4_FILE}.{os.getpid()}.tmp")
    try:
        save_q4_tensors(tensors, staging, source=str(folder))
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
    return target

"""Loading a model by name, path or GGUF file: weights and tokenizer together."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import torch

from kspec.engine.config import EngineConfig
from kspec.engine.errors import ModelLoadError
from kspec.engine.freed_memory import return_freed_memory
from kspec.engine.models.gguf_convert import ProgressCallback
from kspec.engine.json_file import identity_key
from kspec.engine.models.cpu_fast import (
    FastPath, cached_path, choice_identity, describe, fast_path_available, kernel_store, measured_path, to_fast_path,
)
from kspec.engine.models.hf_folder import load_transformer
from kspec.engine.models.kernel_choice import CHOICE_CACHE_FILE, ChoiceCache, KernelChoice
from kspec.engine.models.quantized import Q4_FILE, TERM_SEPARATOR, DenseWeightsSkipped, Q4File
from kspec.engine.models.quantize_at_load import quantized_terms
from kspec.engine.models.resolve import SOURCE_FILE, cache_root, codes_droppable, codes_file, resolve_model
from kspec.engine.models.tokenizer import Tokenizer
from kspec.engine.models.transformer import Transformer
from kspec.kernels.paths import attention_paths


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer
    name: str
    folder: Path | None = None  # where its files are (the HF folder, or a GGUF file's converted one)

    def files(self) -> list[tuple[str, int, int]]:
        """(name, bytes, mtime ns) of the model's files: what says they changed."""
        if self.folder is None:
            return []
        found = [(entry.name, entry.stat()) for entry in self.folder.iterdir() if entry.is_file()]
        return sorted((name, info.st_size, info.st_mtime_ns) for name, info in found)

    @property
    def compute(self) -> str:
        """How the model computes, for users: e.g. 'float32' or 'float32 + int4 from the GGUF (...)'."""
        return describe(self.model)

    @property
    def attention(self) -> dict[str, str]:
        """The attention paths this model takes (kernels/paths.py): {"prefill": ..., "decode": ...}."""
        return attention_paths(self.model.device, self.model.dtype, self.model.args.head_dim)


@dataclass(frozen=True)
class Compute:
    """What `EngineConfig.dtype` means on this machine."""

    dtype: torch.dtype  # of the model: embeddings, norms, attention, KV cache, head
    fast_cpu: bool  # the CPU fast path (engine/models/cpu_fast.py): fused projections, 4-bit weights where stored

    @classmethod
    def choose(cls, config: EngineConfig) -> "Compute":
        """auto: bfloat16 on CUDA (a GPU step reads weights and KV: half the bytes of float32), the
        fast path on an AVX-512 CPU (cpu_fast.fast_path_available), float32 elsewhere.
        An explicit dtype is that dtype on the plain path (float32: the exact reference)."""
        if config.dtype == "auto":
            if torch.device(config.device).type == "cuda":
                return cls(torch.bfloat16, False)
            return cls(torch.float32, config.device == "cpu" and fast_path_available())
        return cls(getattr(torch, config.dtype), False)


def load_model(spec: str | None, config: EngineConfig, on_progress: ProgressCallback | None = None) -> LoadedModel:
    """on_progress(fraction, message): conversion (if a GGUF file is new) up to 0.8, then weights."""
    report = on_progress or (lambda fraction, message: None)
    resolved = resolve_model(spec, config.progress, lambda f, m: report(0.8 * f, m), config.quantize)
    report(0.8, f"loading {resolved.name}")
    loading: ProgressCallback = lambda fraction, message: report(0.8, message)  # noqa: E731  # codes read again, as part of loading
    compute = Compute.choose(config)
    if compute.fast_cpu:
        model = _load_fast_path(resolved.folder, compute.dtype, FastPath.for_weights(**config.cpu_fast_path()), config, loading)
    else:
        codes_file(resolved.folder, loading)  # dropped 4-bit weights are read again: the other paths dequantize them
        model = load_transformer(resolved.folder, compute.dtype, config.device)
    tokenizer = Tokenizer.from_folder(resolved.folder, model.args.eos_token_ids)
    gc.collect()  # the conversion's and the tokenizer's reading leave reference cycles (0.5B: ~90 MB)
    return_freed_memory()  # ... and freed buffers (unpacked and int32 codes, the tokenizer's JSON)
    if tokenizer.vocab_size > model.args.vocab_size:
        raise ModelLoadError(
            f"{resolved.name}: tokenizer has {tokenizer.vocab_size} tokens but the model only {model.args.vocab_size}"
        )
    return LoadedModel(model, tokenizer, resolved.name, resolved.folder)


def _load_fast_path(folder: Path, dtype: torch.dtype, path: FastPath, config: EngineConfig, report: ProgressCallback) -> Transformer:
    """The CPU fast path's model, with the 4-bit weights of a converted Q4 GGUF where the folder
    has them. Without a dense copy, the float weights that 4-bit codes stand in for are never
    read: the load peaks at the model it keeps, not at the float32 model (869 -> 621 MB for the
    default one). Should one of them still be needed (codes that could not be fused), every
    weight is read after all. Where kspec's kernel forms of every coded weight are kept (a
    complete store) and the kernel choice was measured before, they serve the start alone; a
    converted GGUF's 4-bit weights are then dropped (written again from the file when a start
    needs them: another instruction set, PyTorch's kernel, a dense copy, a new measurement)."""
    from_gguf = (folder / SOURCE_FILE).is_file()
    q4_file = folder / Q4_FILE
    if not from_gguf and not q4_file.is_file():  # float weights (an HF folder): quantized once, cached (quantize_at_load.py)
        if config.quantize == "none":
            return to_fast_path(load_transformer(folder, dtype, "cpu"), {}, path)
        q4_file = quantized_terms(folder, config.quantize, cache_root(), config.progress)
    cache, asked = ChoiceCache(cache_root() / CHOICE_CACHE_FILE), path
    key = identity_key(choice_identity(q4_file.parent, path))
    if (model := _from_store(folder, dtype, cached_path(path, cache, key), q4_file.parent)) is not None:
        return model
    with _codes(folder, q4_file, from_gguf, report) as codes:
        q4_file = codes.path
        path, choice = measured_path(codes, path, cache, key)
        skip = frozenset() if path.resolved_keep_dense() else frozenset(name.split(TERM_SEPARATOR)[0] for name in codes)
        try:
            model = to_fast_path(load_transformer(folder, dtype, "cpu", skip), codes, path, q4_file.parent)
            complete = not any(tensor.is_meta for tensor in [*model.parameters(), *model.buffers()])
        except DenseWeightsSkipped:
            complete = False
        if not complete:
            model = to_fast_path(load_transformer(folder, dtype, "cpu"), codes, path, q4_file.parent)
    model.kernel_choice = choice
    if from_gguf and cached_path(asked, cache, key) is not None and codes_droppable(folder) and _serves_alone(path, q4_file.parent):
        q4_file.unlink(missing_ok=True)  # the kernel forms (and the choice) stand for them; the GGUF file is there to read them again
    return model


def _codes(folder: Path, q4_file: Path, from_gguf: bool, report: ProgressCallback) -> Q4File:
    """The model's 4-bit codes, opened; a converted GGUF's written again from the file where they
    were dropped (also by another start, between the check and the opening), told to `report`."""
    if not from_gguf:
        return Q4File(q4_file)
    try:
        return Q4File(codes_file(folder, report) or q4_file)
    except FileNotFoundError:
        return Q4File(codes_file(folder, report) or q4_file)


def _from_store(folder: Path, dtype: torch.dtype, cached: tuple[FastPath, KernelChoice | None] | None, codes_folder: Path) -> Transformer | None:
    """The model from its kept kernel forms alone (no 4-bit codes read), where the kernel choice
    (`cached`: the path it gives and the measured choice) is known and a store holds every weight
    the codes stood for; else None."""
    if cached is None or cached[0].resolved_keep_dense():
        return None
    path, choice = cached
    _, store = kernel_store(codes_folder, path)
    if store is None or not store.complete:
        return None
    try:
        model = to_fast_path(load_transformer(folder, dtype, "cpu", store.weights), {}, path, store=store)
    except (ModelLoadError, DenseWeightsSkipped):  # a weight neither kept nor in the checkpoint: read the codes
        return None
    if any(tensor.is_meta for tensor in [*model.parameters(), *model.buffers()]):
        return None
    model.kernel_choice = choice
    return model


def _serves_alone(path: FastPath, codes_folder: Path) -> bool:
    """Whether `path` takes kspec's kernel forms only and a complete store of them is kept."""
    if path.resolved_keep_dense():
        return False
    _, store = kernel_store(codes_folder, path)
    return store is not None and store.complete


def check_draft_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    if target.tokenizer.vocabulary() != draft.tokenizer.vocabulary():
        raise ModelLoadError(
            f"draft model {draft.name!r} has a different vocabulary from {target.name!r}; "
            "a draft must share the target's tokenizer"
        )

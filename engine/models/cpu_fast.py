"""The CPU fast path (`--dtype auto` on an AVX-512 or AVX2 CPU): the weights' own 4-bit, 5-bit or
8-bit codes for steps with few rows, one matmul for q/k/v and one for gate/up; everything else
stays float32.

What it does (which kernel on which CPU, and the measurements that chose it: cpu_profile.py):
- a decode step reads every weight once, so the codes are multiplied without unpacking: by
  PyTorch's int4 kernel (bfloat16 activations) or kspec's own 4-bit x 8-bit kernel
  (kernels/csrc/q4_q8_matmul.cpp; activations quantized to 8 bits per block of 32 as llama.cpp
  does: quantized.py `Q4Q8Term`), with its 8-bit (`Q8Q8Term`) and 5-bit (`Q5Q8Term`) forms;
- with many rows (verifying k x (gamma+1) drafts, prefill) a dense copy can be faster: where the
  CPU's profile keeps one, `CpuLinear` holds it (bfloat16 in oneDNN's layout on CPUs with native
  bfloat16, else float32) and picks by the row count (`FastPath.int4_max_rows`);
- without a dense copy the embedding table is kept as its codes too: in kspec's kernel forms
  (`TiledEmbedding`: the head's own where the table is tied to it, else its own, kept with the other
  forms), or as its 4-bit terms for PyTorch's kernel (`Int4Embedding`, exact);
- a step of few rows over the branch cache runs every layer in one C++ call
  (`native_step.NativeSteps`, kernels/cpu_layers.py) where this machine can build it;
- embeddings, norms, attention and the KV cache stay float32 (the prompt's KV float16 where the C++
  loop serves every branch step); only the matmuls round.
Weights without codes (an HF folder quantized with `--quantize none`) use the dense copy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from kspec.engine.config import CPU_INT4, CPU_KERNELS, CPU_KV, CPU_WEIGHTS, check_choice
from kspec.engine.models.cpu_profile import (
    HEAD_COST_PRIOR, INT4_KERNELS, INT4_MAX_ROWS, CpuFacts, dense_pays, kernel_forms, profile_for,
)
from kspec.engine.models.quantized import (
    Q4_FORMAT, CpuLinear, Int4Embedding, Q4Codes, Q6Q8Term, Q8Q8Term, TiledEmbedding, TiledTerm, cat_six_bit, fused_linear, int4_kernel_available,
    packed_terms, six_bit_codes, weight_terms,
)
from kspec.engine.models.kernel_choice import (
    MEMORY_HEADROOM, TRIAL_METHOD, Candidates, ChoiceCache, KernelChoice, available_bytes, decide, dense_bytes, dense_name, measure, trial_layer,
)
from kspec.engine.models.head_cost import HeadCost
from kspec.engine.models.native_step import NativeSteps
from kspec.engine.models.tiled_store import TiledStore, store_path
from kspec.engine.models.resolve import cache_root
from kspec.engine.models.transformer import Transformer
from kspec.engine.version import version
from kspec.kernels import cpu_layers
from kspec.kernels.cpu_cap import CPU_VARIABLE


EMBED_NAME = "model.embed_tokens.weight"  # the embedding table's weight (tied: the head's too)


@dataclass(frozen=True)
class FastPath:
    int4_max_rows: int | None = None  # 4-bit kernel up to this many rows per matmul, the dense copy above; None: INT4_MAX_ROWS
    keep_dense: bool | None = None  # a dense copy for many rows; None: the CPU's profile
    dense_dtype: torch.dtype | None = None  # None: bfloat16 on a CPU with native bfloat16, else float32
    native_steps: bool = True  # few-row branch steps through the C++ layer loop where it builds
    int4_kernel: str | None = None  # "torch" (PyTorch's int4 kernel) or "kspec" (4-bit x 8-bit); None: the CPU's profile (cpu_profile.py)
    prompt_kv: torch.dtype | None = None  # a prompt's KV: float32 or float16; None: `resolved_prompt_kv`

    def __post_init__(self) -> None:
        if self.int4_max_rows is not None and self.int4_max_rows < 0:
            raise ValueError(f"int4_max_rows must be >= 0, got {self.int4_max_rows}")
        if self.dense_dtype not in (None, torch.float32, torch.bfloat16):
            raise ValueError(f"dense_dtype must be float32 or bfloat16, got {self.dense_dtype}")
        if self.int4_kernel not in (None, *INT4_KERNELS):
            check_choice("int4_kernel", self.int4_kernel, INT4_KERNELS)
        if self.prompt_kv not in (None, torch.float32, torch.float16):
            raise ValueError(f"prompt_kv must be float32 or float16, got {self.prompt_kv}")

    @classmethod
    def for_weights(cls, cpu_weights: str, cpu_kernels: str = "auto", cpu_int4: str = "auto", cpu_kv: str = "auto") -> "FastPath":
        """EngineConfig.cpu_weights (auto, 4bit or 4bit+dense), cpu_kernels (auto or torch),
        cpu_int4 (auto, torch or kspec) and cpu_kv (auto, float32 or float16)."""
        for name, value, allowed in (("cpu_weights", cpu_weights, CPU_WEIGHTS), ("cpu_kernels", cpu_kernels, CPU_KERNELS),
                                     ("cpu_int4", cpu_int4, CPU_INT4), ("cpu_kv", cpu_kv, CPU_KV)):
            check_choice(name, value, allowed)
        choices = {"auto": None, "4bit": False, "4bit+dense": True}
        return cls(
            keep_dense=choices[cpu_weights], native_steps=cpu_kernels == "auto", int4_kernel=None if cpu_int4 == "auto" else cpu_int4,
            prompt_kv=None if cpu_kv == "auto" else getattr(torch, cpu_kv),
        )  # fmt: skip

    def resolved_dense_dtype(self) -> torch.dtype:
        return self.dense_dtype or (torch.bfloat16 if CpuFacts.here().native_bf16 else torch.float32)

    def resolved_int4_max_rows(self) -> int:
        if self.int4_max_rows is not None:
            return self.int4_max_rows
        return INT4_MAX_ROWS[(self.resolved_int4_kernel(), self.resolved_dense_dtype())]

    def resolved_keep_dense(self) -> bool:
        if self.keep_dense is not None:
            return self.keep_dense
        # the profile's dense_copy column is this rule for its kernel (tests/unit/models/test_fast_path.py)
        return dense_pays(self.resolved_int4_kernel(), CpuFacts.here())

    def resolved_prompt_kv(self, native_steps: NativeSteps | None) -> torch.dtype:
        """float16 where the C++ layer loop serves every branch step (it reads float16 itself;
        PyTorch's attention would convert the prompt's KV every layer); else float32. Measured on
        Zen 3 (docs/measurements/zen3-avx2.md): a one-row step 1.16-1.17x faster at a 1536-token
        prompt, no slower elsewhere, half the prefix cache's bytes."""
        if self.prompt_kv is not None:
            return self.prompt_kv
        return torch.float16 if native_steps is not None and native_steps.max_rows is None else torch.float32

    def resolved_int4_kernel(self) -> str:
        return self.int4_kernel or profile_for(CpuFacts.here()).int4_kernel or "torch"


def fast_path_available() -> bool:
    """Whether this CPU runs a 4-bit kernel vectorized (its profile names one, and kspec's is built
    where it is the one); elsewhere auto stays float32."""
    kernel = profile_for(CpuFacts.here()).int4_kernel
    if kernel is None or not int4_kernel_available():
        return False
    return kernel != "kspec" or cpu_layers.load_matmul(cache_root()) is not None


def _kernel_matmuls(kernel: str) -> tuple[Callable[..., torch.Tensor] | None, ...] | None:
    """(q4q8, q8q8, q5q8) of a 4-bit kernel, all None for PyTorch's; None where it cannot run here."""
    if kernel == "torch":
        return (None, None, None) if int4_kernel_available() else None
    q4q8 = cpu_layers.load_matmul(cache_root())
    if q4q8 is None:
        return None
    forms = kernel_forms(cpu_layers.matmul_isa(cache_root()))
    q8q8 = cpu_layers.load_q8_matmul(cache_root()) if "q8" in forms else None
    return q4q8, q8q8, cpu_layers.load_q5_matmul(cache_root()) if "q5" in forms else None


def choice_identity(codes_folder: Path, path: FastPath) -> dict[str, Any]:
    """What a measured kernel choice depends on: the CPU (name, flags, cap), the build, torch and
    its threads, the model's codes (their folder, named by the file they came from, and format),
    the settings left to the measurement."""
    info = cpu_layers.cpu_info()
    return {
        "cpu": [info.get("model name", ""), info.get("flags", ""), os.environ.get(CPU_VARIABLE, "")],
        "build": cpu_layers.build_flags(), "torch": [torch.__version__, torch.get_num_threads()], "kspec": version(),
        "model": [str(codes_folder.resolve()), Q4_FORMAT], "path": repr(path), "method": TRIAL_METHOD,
    }  # fmt: skip


def cached_path(path: FastPath, cache: ChoiceCache, key: str) -> tuple[FastPath, KernelChoice | None] | None:
    """`measured_path` without codes: `path` with what it leaves to this machine taken from an
    earlier start's measured choice; None where that is still to be measured."""
    if path.int4_kernel is not None and path.keep_dense is not None:
        return path, None
    choice = cache.get(key)
    return None if choice is None else (_with_choice(path, choice), choice)


def measured_path(codes: Mapping[str, Q4Codes], path: FastPath, cache: ChoiceCache | None, key: str) -> tuple[FastPath, KernelChoice | None]:
    """`path` with what it leaves to this machine (the 4-bit kernel, the dense copy and its rows)
    chosen by timing one layer (kernel_choice.py), or taken from `cache` under `key`. Unchanged
    where the settings decide everything or no layer has codes to time."""
    if path.int4_kernel is not None and path.keep_dense is not None:
        return path, None
    choice = cache.get(key) if cache is not None else None
    if choice is None:
        prior = profile_for(CpuFacts.here()).int4_kernel
        names = [path.int4_kernel] if path.int4_kernel is not None else sorted(INT4_KERNELS, key=lambda name: name != prior)
        kernels = {name: mm for name in names if (mm := _kernel_matmuls(name)) is not None}
        layer = trial_layer(codes)
        if not kernels or not layer:
            return path, None
        dense_dtype = path.resolved_dense_dtype() if path.keep_dense is not False else None
        times, share = measure(layer, Candidates(kernels, dense_dtype))
        room = available_bytes()
        fits = dense_dtype is not None and (room is None or MEMORY_HEADROOM * dense_bytes(codes, dense_dtype) <= room)
        dense = dense_name(dense_dtype) if dense_dtype is not None else None
        choice = decide(times, list(kernels), dense, prior, fits, share, layer_loop=path.native_steps)
        if cache is not None:  # a busy moment's times for an hour only (ChoiceCache)
            cache.put(key, choice)
    return _with_choice(path, choice), choice


def _with_choice(path: FastPath, choice: KernelChoice) -> FastPath:
    """`path` with the kernel, dense copy and row limit it leaves open taken from `choice`."""
    return replace(
        path, int4_kernel=path.int4_kernel or choice.int4_kernel, keep_dense=choice.keep_dense if path.keep_dense is None else path.keep_dense,
        int4_max_rows=path.int4_max_rows if path.int4_max_rows is not None else choice.int4_max_rows,
    )  # fmt: skip


def kernel_store(codes_folder: Path | None, path: FastPath) -> tuple[Path | None, TiledStore | None]:
    """Where this build keeps kspec's kernel forms of the codes in `codes_folder` (None: another
    kernel, or no folder), and the store there (None: none yet, or unreadable)."""
    if codes_folder is None or (kernel := _kernel_matmuls(path.resolved_int4_kernel())) is None or kernel[0] is None:
        return None, None
    isa = cpu_layers.matmul_isa(cache_root())
    store_file = store_path(codes_folder, isa, kernel_forms(isa))
    return store_file, TiledStore.open(store_file)


def to_fast_path(
    model: Transformer, codes: Mapping[str, Q4Codes], path: FastPath = FastPath(), codes_folder: Path | None = None,
    store: TiledStore | None = None,
) -> Transformer:  # fmt: skip
    """Turn a loaded model into the fast path, in place (returns it): q/k/v and gate/up fused,
    every projection and the head a CpuLinear, 4-bit where `codes` (HF weight names, see
    `weight_terms`) has every part. The head's dense form stays the model's own weight. With
    kspec's kernel and `codes_folder` (where `codes` were read from), the kernel's forms are kept
    there and later loads map them instead of building them (tiled_store.py; `store`: that store,
    already open). A complete store needs no `codes`."""
    dense_dtype, keep_dense, int4_max_rows = path.resolved_dense_dtype(), path.resolved_keep_dense(), path.resolved_int4_max_rows()
    q4q8, q8q8, q5q8 = _kernel_matmuls(path.resolved_int4_kernel()) or (None, None, None)  # all None: PyTorch's
    isa = cpu_layers.matmul_isa(cache_root()) if q4q8 is not None else None
    q6q8 = cpu_layers.load_q6_matmul(cache_root()) if "q6" in kernel_forms(isa) else None
    store_file, opened = kernel_store(codes_folder, path) if store is None else (None, store)
    store = store or opened
    forms = {"Q4Q8Term": q4q8, "Q8Q8Term": q8q8, "Q5Q8Term": q5q8, "Q6Q8Term": q6q8}
    built: dict[str, CpuLinear] = {}
    stands_for: dict[str, list[str]] = {}  # a built key -> the weight names its forms stand for

    def kept(key: str, *names: str) -> list[TiledTerm]:
        """The layer's terms from the store, else its weights' 6-bit form where each has one."""
        stands_for[key] = list(names)
        if store is not None and (terms := store.terms(key, forms)):
            return terms
        six = [six_bit_codes(codes, name) for name in names] if q6q8 is not None else []
        return [Q6Q8Term(cat_six_bit(six), q6q8)] if six and all(six) else []  # type: ignore[arg-type]

    for index, block in enumerate(model.model.layers):
        prefix = f"model.layers.{index}."

        def linear(*names: str) -> CpuLinear:
            modules = [block.get_submodule(name) for name in names]
            key = prefix + "+".join(names)
            tiled = kept(key, *(f"{prefix}{name}.weight" for name in names))
            terms = [] if tiled else [weight_terms(codes, f"{prefix}{name}.weight") for name in names]
            built[key] = fused_linear(modules, terms, int4_max_rows, dense_dtype, keep_dense, q4q8, q8q8, q5q8, tiled)
            return built[key]

        attention, mlp = block.self_attn, block.mlp
        attention.fuse(linear("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), linear("self_attn.o_proj"))
        if mlp.gated:
            mlp.fuse(linear("mlp.gate_proj", "mlp.up_proj"), linear("mlp.down_proj"))
        else:
            mlp.c_fc, mlp.c_proj = linear("mlp.c_fc"), linear("mlp.c_proj")
    head_name = EMBED_NAME if model.args.tie_embeddings else "lm_head.weight"
    head_tiled = kept("lm_head") if model.args.tie_embeddings else kept("lm_head", head_name)  # a tied table: 8-bit, read by the embedding too
    head_terms = None if head_tiled else weight_terms(codes, head_name) if int4_kernel_available() else None
    head = model.lm_head
    # The dense form: next to 4-bit terms, in the projections' dense dtype (bfloat16: a packed
    # copy, and the 4-bit kernel's row limit holds for the head too); alone, the model's
    # weight itself (tied: the embedding table), not a copy.
    head_coded = bool(head_tiled or head_terms)
    head_dense = [head.weight] if keep_dense or not head_coded else []
    head_dtype = dense_dtype if head_coded else head.weight.dtype
    model.lm_head = built["lm_head"] = CpuLinear(
        head_dense, head_terms or [], head.bias, int4_max_rows, head_dtype, q4q8_matmul=q4q8, q8q8_matmul=q8q8, q5q8_matmul=q5q8,
        tiled=head_tiled,
    )  # fmt: skip
    float_table_needed = bool(model.lm_head.dense_parts) and model.args.tie_embeddings
    if not float_table_needed and not (keep_dense and dense_dtype == torch.float32):  # else: loaded and kept anyway, float32
        def forms_of(terms: list[Q4Codes]) -> list[torch.nn.Module]:
            return list(CpuLinear([], terms, None, int4_max_rows, dense_dtype, q4q8_matmul=q4q8, q8q8_matmul=q8q8, q5q8_matmul=q5q8).terms)

        embedding = _coded_embedding(model, codes, store, forms, forms_of if q4q8 is not None else None)
        model.model.embed_tokens = embedding or model.model.embed_tokens
        if q4q8 is not None and embedding is not None:
            built[EMBED_NAME] = embedding  # type: ignore[assignment]  # kept with the forms (tied: the head's, stored once)
    if store_file is not None and store is None:
        _keep(model, store_file, built, stands_for, forms)
    model.native_steps = NativeSteps.for_model(model, lambda: cpu_layers.load(cache_root())) if path.native_steps else None
    model.prompt_kv_dtype = path.resolved_prompt_kv(model.native_steps)
    model.head_cost = _head_cost(model.lm_head, isa)
    return model


def _keep(
    model: Transformer, store_file: Path, built: Mapping[str, torch.nn.Module], stands_for: Mapping[str, list[str]],
    forms: Mapping[str, Callable[..., torch.Tensor] | None],
) -> None:  # fmt: skip
    """Keep the kernel forms just built (`built`, by key, each standing for the weights
    `stands_for` names) in `store_file`, complete where every one is a kernel form and the table
    is coded; the table is then looked up in the kept file (mapped: only the rows looked up become
    resident) instead of the memory it was built in."""
    coded = [key for key, module in built.items() if not _dense_parts(module)]
    table = EMBED_NAME in built
    weights = [name for key in coded for name in stands_for.get(key, [])] + [EMBED_NAME] * table
    TiledStore.save(store_file, built, weights, complete=table and len(coded) == len(built))  # type: ignore[arg-type]
    if table and (saved := TiledStore.open(store_file)) is not None:
        model.model.embed_tokens = _coded_embedding(model, {}, saved, forms, None) or model.model.embed_tokens


def _dense_parts(module: torch.nn.Module) -> bool:
    """Whether a built linear (or embedding) holds a dense copy or terms that are not kernel forms."""
    return isinstance(module, CpuLinear) and (module.has_dense or not all(isinstance(t, TiledTerm) for t in module.terms))


def _coded_embedding(
    model: Transformer, codes: Mapping[str, Q4Codes], store: TiledStore | None, forms: Mapping[str, Callable[..., torch.Tensor] | None],
    forms_of: Callable[[list[Q4Codes]], list[torch.nn.Module]] | None,
) -> torch.nn.Module | None:  # fmt: skip
    """The embedding table in codes instead of float weights, where it has them: as a `store` kept
    it (its 4-bit terms or its kernel forms), else read in kernel forms (the head's where tied to
    it, no table of its own; else its own, built by `forms_of`, kspec's kernel's) where those hold
    the file's weights exactly (their float16 s and m are the file's: Q8_0, Q4_0, Q5_x tables),
    else as its 4-bit terms, exact. None where the table has no codes."""
    if store is not None and (packed := store.packed(EMBED_NAME)):
        return Int4Embedding(packed, model.dtype)
    if store is not None and (kept := store.terms(EMBED_NAME, forms)):
        return TiledEmbedding(kept, model.dtype)
    if model.args.tie_embeddings:
        candidates = list(model.lm_head.terms)
    else:
        candidates = forms_of(terms) if forms_of is not None and (terms := weight_terms(codes, EMBED_NAME)) else []
    if candidates and all(isinstance(t, TiledTerm) and t.exact_params for t in candidates):
        return TiledEmbedding(candidates, model.dtype)  # type: ignore[arg-type]
    return _int4_embedding(codes, EMBED_NAME, model.dtype)


def _int4_embedding(codes: Mapping[str, Q4Codes], name: str, dtype: torch.dtype) -> Int4Embedding | None:
    terms = packed_terms(codes, name)
    return Int4Embedding(terms, dtype) if terms else None


def _head_cost(head: CpuLinear, isa: str | None) -> HeadCost | None:
    """The prior cost of a head on kspec's kernel (its rows' logits are each the same in any call,
    up to the rows it takes before a dense copy); None otherwise (a dense matmul may round a row by
    its call: acceptance then computes the head position by position)."""
    prior = HEAD_COST_PRIOR.get(isa or "")
    tiled = bool(head.terms) and all(isinstance(term, TiledTerm) for term in head.terms)
    if prior is None or not tiled:
        return None
    return HeadCost(*prior, max_rows=head.int4_max_rows if head.dense_parts else None)


def describe(model: Transformer) -> str:
    """What a user sees of the compute path, e.g. 'float32 + int4 from the GGUF (...)'."""
    base = str(model.dtype).removeprefix("torch.")
    linears = [m for m in model.modules() if isinstance(m, CpuLinear)]
    if not linears:
        return base
    dense = next((m.dense_dtype for m in model.model.layers.modules() if isinstance(m, CpuLinear) and m.has_dense), None)
    dense_text = f"dense {str(dense).removeprefix('torch.')}" if dense is not None else "no dense weights"
    int4 = [m for m in linears if m.has_int4]
    if not int4:
        return f"{base}, fused projections ({dense_text})"
    rows = "at every row count" if dense is None else f"up to {int4[0].int4_max_rows} rows, {dense_text} above"
    q4q8 = isinstance(int4[0].terms[0], TiledTerm)
    kernel = "PyTorch's int4 kernel"
    if q4q8:
        amx_rows = cpu_layers.matmul_amx_rows(cache_root())
        kernel = f"kspec's 4-bit x 8-bit kernel ({cpu_layers.matmul_isa(cache_root())}{f', AMX from {amx_rows} rows' if amx_rows else ''})"
    notes = [f"{len(int4)}/{len(linears)} matmuls {rows}", kernel + (", measured here" if model.kernel_choice is not None else "")]
    head_forms = {type(t) for t in model.lm_head.terms} if isinstance(model.lm_head, CpuLinear) else set()
    if Q8Q8Term in head_forms or Q6Q8Term in head_forms:
        notes.append("6-bit head" if Q6Q8Term in head_forms else "8-bit head")
    embedding = model.model.embed_tokens
    if isinstance(embedding, Int4Embedding):
        notes.append("4-bit embedding")
    elif isinstance(embedding, TiledEmbedding) and model.args.tie_embeddings:
        notes.append(f"embedding from the head's {embedding.terms[0].bits}-bit codes")
    elif isinstance(embedding, TiledEmbedding):
        notes.append(f"{embedding.terms[0].bits}-bit embedding")
    if model.native_steps is not None:
        limit = model.native_steps.max_rows
        notes.append("C++ layer loop" + (f" up to {limit} rows" if limit is not None else ""))
    elif reason := cpu_layers.unavailable_reason(cache_root(), tried_only=True):
        notes.append(reason)
    if model.kv_dtype != model.dtype:
        notes.append(f"{str(model.kv_dtype).removeprefix('torch.')} prompt KV")
    return f"{base} + int4 from the GGUF ({', '.join(notes)})"

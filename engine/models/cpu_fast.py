"""The CPU fast path (`--dtype auto` on an AVX-512 or AVX2 CPU): a Q4 GGUF's own 4-bit weights
for steps with few rows, one matmul for q/k/v and one for gate/up; everything else stays float32.

Why each piece (2 threads, SmolLM2-135M, a 512-token prompt; README "Measured"):
- a decode step reads every weight once: 4-bit codes are ~8x fewer bytes than float32, and
  PyTorch's int4 CPU kernel multiplies them without unpacking (bfloat16 in and out) on AVX-512;
  on AVX2, where that kernel is not vectorized well, and on Zen 4 and 5 where kspec's own 4-bit x 8-bit
  kernel is built with AVX-512 VNNI (measured faster than PyTorch's at every row count), that kernel does
  (`INT4_KERNELS`; float32 in and out, the activations quantized to 8 bits per block of 32 as
  llama.cpp does: quantized.py `Q4Q8Term`);
- with many rows (verifying k x (gamma+1) drafts, prefill) PyTorch's kernel dequantizes the
  weights again for every few rows. Where the CPU computes bfloat16 natively (AVX-512-BF16 / AMX;
  with kspec's kernel, which stays as fast as the copy up to ~28 rows, AMX only: `dense_pays`)
  `CpuLinear` also keeps a dense bfloat16 copy, in oneDNN's layout (no reorder per call), and
  picks by the row count (`FastPath.int4_max_rows`, the measured crossover: `INT4_MAX_ROWS`). On a plain AVX-512 CPU emulated bfloat16
  matmuls are slower than float32 ones, and a float32 copy costs 4x the 4-bit weights' memory
  (~400 MB for the default model) for a prefill ~1.7x faster and no faster verification
  (`kspec bench step`, README "Measured"): there the 4-bit weights serve every row count
  unless `--cpu-weights 4bit+dense` asks for the float32 copy (the loaded weights, no copy);
- without a dense copy the embedding table is kept as its 4-bit terms too (`Int4Embedding`,
  exact), and a tied head multiplies those terms at every row count; a table tied to an 8-bit
  head is looked up in the head's own codes (`Q8HeadEmbedding`, exact: no table of its own);
- fusing projections halves the number of small matmuls a step launches;
- a step of few rows over the branch cache runs every layer in one C++ call
  (`native_step.NativeSteps`, kernels/cpu_layers.py) where this machine can build it: a
  step's ~35 small ops per layer cost more than its 4-bit matmuls at one row;
- embeddings, norms, attention and the KV cache stay float32; the head (Q8_0 in the default
  GGUF, tied to the embedding) is two 4-bit terms, or with kspec's kernel on a VNNI build one
  8-bit term (quantized.py `Q8Q8Term`: one integer dot per block instead of two, measured
  1.4-2.0x faster at 1-40 rows on Zen 4) (for few rows, with a dense copy above: the
  float32 table itself, or a packed bfloat16 copy, and then the embedding is looked up from its
  4-bit terms): only the matmuls round to bfloat16.
Weights without 4-bit codes (an HF folder, a GGUF in another type) use the dense copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from kspec.engine.config import CPU_INT4, CPU_KERNELS, CPU_KV
from kspec.engine.models.quantized import (
    CpuLinear, Int4Embedding, Q4Codes, Q8HeadEmbedding, Q8Q8Term, TiledTerm, fused_linear, int4_kernel_available, weight_terms,
)
from kspec.engine.models.native_step import NativeSteps
from kspec.engine.models.resolve import cache_root
from kspec.engine.models.transformer import Transformer
from kspec.kernels import cpu_layers

# The 4-bit kernel per CPU level of torch (torch.backends.cpu.get_cpu_capability()), measured
# (30 layers of the default model's projections, weights streamed, 2 threads, README "Measured"):
# PyTorch's int4 kernel is vectorized for AVX-512; on AVX2 it is not (Zen 2: 9.2 ms at one row
# vs 5.5 ms with kspec's 4-bit x 8-bit kernel, csrc/q4_q8_matmul.cpp). Where kspec's kernel is
# built with AVX-512 VNNI on a CPU where that was measured faster it serves AVX-512 too
# (`vnni_kernel_measured`): Zen 5 (two runs: 2.6-2.7 vs 3.3-3.4 ms at one row, 4.6-5.0 vs 6.8-7.4
# at eight, 17.8-18.7 vs 28.3-29.0 at forty) and Zen 4 (whole steps, `kspec bench step`, README
# "Measured": 1.14x at one row, 1.26x at four, 1.06x at eight, 1.07x at forty against PyTorch's
# kernel with its bfloat16 copy). Not measured on Intel's AVX-512 VNNI CPUs: PyTorch's kernel
# stays theirs unless `--cpu-int4 kspec` asks.
INT4_KERNELS = {"AVX512": "torch", "AVX2": "kspec"}
VNNI_ISA = "avx512-vnni"  # cpu_layers.matmul_isa() of a build with the AVX-512 VNNI path
# Builds whose 8-bit form (a GGUF Q8_0 weight, the default model's head, as one term) is
# vectorized; elsewhere a Q8_0 weight stays two 4-bit terms. AVX2 measured on Zen 3 (the head,
# one 8-bit term vs two 4-bit ones in one process): 1.12x at one row, 1.28x at four, 1.34x at
# eight, 1.36x at forty
Q8Q8_ISAS = (VNNI_ISA, "avx2")
# Builds whose 5-bit form (GGUF Q5_0 / Q5_1 / Q5_K weights, 5 bits a weight instead of the 8-bit
# form's 8) is vectorized; elsewhere such weights take the 8-bit form
Q5Q8_ISAS = (VNNI_ISA,)
# AMD CPU families where that path was measured faster: 0x19 with AVX-512 is Zen 4 (Zen 3, also
# 0x19, has no AVX-512, so no VNNI build), 0x1A Zen 5
VNNI_MEASURED_AMD_FAMILY = 0x19


# The 4-bit kernel's rows per matmul, the dense copy above, by kernel and dense dtype (measured,
# 30 layers of the default model's projections with weights streamed from memory, 2 threads):
# float32 dense weights catch up with PyTorch's kernel at ~16 rows; bfloat16 ones in oneDNN's
# layout on an AMX CPU between 4 and 6 rows (4 rows: 7.9 ms 4-bit vs 11.4 ms packed; 6 rows:
# 13.9 vs 11.3 ms); with kspec's VNNI kernel (Zen 5, AVX-512-BF16) at ~24 rows (two runs: 24 rows
# 11.8-12.7 vs 11.7-11.9 ms; 32 rows 15.0-15.8 vs 13.7-13.9 ms).
INT4_MAX_ROWS = {
    ("torch", torch.float32): 16, ("torch", torch.bfloat16): 4, ("kspec", torch.float32): 16, ("kspec", torch.bfloat16): 24,
}


@dataclass(frozen=True)
class FastPath:
    int4_max_rows: int | None = None  # 4-bit kernel up to this many rows per matmul, the dense copy above; None: INT4_MAX_ROWS
    keep_dense: bool | None = None  # a dense copy for many rows; None: `dense_pays`
    dense_dtype: torch.dtype | None = None  # None: bfloat16 on a CPU with native bfloat16, else float32
    native_steps: bool = True  # few-row branch steps through the C++ layer loop where it builds
    int4_kernel: str | None = None  # "torch" (PyTorch's int4 kernel) or "kspec" (4-bit x 8-bit); None: INT4_KERNELS
    prompt_kv: torch.dtype | None = None  # a prompt's KV: float32 or float16; None: `resolved_prompt_kv`

    def __post_init__(self) -> None:
        if self.int4_max_rows is not None and self.int4_max_rows < 0:
            raise ValueError(f"int4_max_rows must be >= 0, got {self.int4_max_rows}")
        if self.dense_dtype not in (None, torch.float32, torch.bfloat16):
            raise ValueError(f"dense_dtype must be float32 or bfloat16, got {self.dense_dtype}")
        if self.int4_kernel not in (None, *set(INT4_KERNELS.values())):
            raise ValueError(f"int4_kernel must be one of {', '.join(sorted(set(INT4_KERNELS.values())))}, got {self.int4_kernel!r}")
        if self.prompt_kv not in (None, torch.float32, torch.float16):
            raise ValueError(f"prompt_kv must be float32 or float16, got {self.prompt_kv}")

    @classmethod
    def for_weights(cls, cpu_weights: str, cpu_kernels: str = "auto", cpu_int4: str = "auto", cpu_kv: str = "auto") -> "FastPath":
        """EngineConfig.cpu_weights (auto, 4bit or 4bit+dense), cpu_kernels (auto or torch),
        cpu_int4 (auto, torch or kspec) and cpu_kv (auto, float32 or float16)."""
        choices = {"auto": None, "4bit": False, "4bit+dense": True}
        if cpu_weights not in choices:
            raise ValueError(f"cpu_weights must be one of {', '.join(choices)}, got {cpu_weights!r}")
        if cpu_kernels not in CPU_KERNELS:
            raise ValueError(f"cpu_kernels must be one of {', '.join(CPU_KERNELS)}, got {cpu_kernels!r}")
        if cpu_int4 not in CPU_INT4:
            raise ValueError(f"cpu_int4 must be one of {', '.join(CPU_INT4)}, got {cpu_int4!r}")
        if cpu_kv not in CPU_KV:
            raise ValueError(f"cpu_kv must be one of {', '.join(CPU_KV)}, got {cpu_kv!r}")
        return cls(
            keep_dense=choices[cpu_weights], native_steps=cpu_kernels == "auto", int4_kernel=None if cpu_int4 == "auto" else cpu_int4,
            prompt_kv=None if cpu_kv == "auto" else getattr(torch, cpu_kv),
        )  # fmt: skip

    def resolved_dense_dtype(self) -> torch.dtype:
        return self.dense_dtype or (torch.bfloat16 if native_bf16_cpu() else torch.float32)

    def resolved_int4_max_rows(self) -> int:
        if self.int4_max_rows is not None:
            return self.int4_max_rows
        return INT4_MAX_ROWS[(self.resolved_int4_kernel(), self.resolved_dense_dtype())]

    def resolved_keep_dense(self) -> bool:
        return dense_pays(self.resolved_int4_kernel()) if self.keep_dense is None else self.keep_dense

    def resolved_prompt_kv(self, native_steps: NativeSteps | None) -> torch.dtype:
        """float16 where the C++ layer loop serves every branch step (it reads float16 itself;
        PyTorch's attention would convert the prompt's KV every layer); else float32. Measured on
        Zen 3 against float32 in one process (`kspec bench step --paths auto,auto/kv=float32
        --contexts 512,1536`, two runs; README "Measured"): a one-row step 1.16-1.17x faster at a
        1536-token prompt, 1.01-1.06x at 512; four rows 1.03-1.11x at 1536; eight rows and 40
        verification rows 0.96-1.04x; half the prefix cache's bytes."""
        if self.prompt_kv is not None:
            return self.prompt_kv
        return torch.float16 if native_steps is not None and native_steps.max_rows is None else torch.float32

    def resolved_int4_kernel(self) -> str:
        if self.int4_kernel is not None:
            return self.int4_kernel
        chosen = INT4_KERNELS.get(torch.backends.cpu.get_cpu_capability(), "torch")
        return "kspec" if chosen == "torch" and vnni_kernel_measured() else chosen


def vnni_kernel_measured() -> bool:
    """Whether kspec's kernel is built with AVX-512 VNNI here and this CPU is of a class where
    that was measured faster than PyTorch's int4 kernel (`VNNI_MEASURED_AMD_FAMILY`)."""
    if cpu_layers.matmul_isa(cache_root()) != VNNI_ISA:
        return False
    vendor, family = cpu_vendor_family()
    return vendor == "AuthenticAMD" and family >= VNNI_MEASURED_AMD_FAMILY


def cpu_vendor_family() -> tuple[str, int]:
    """('AuthenticAMD' / 'GenuineIntel' / ..., CPU family) of this CPU; ('', 0) where unknown."""
    info = cpu_layers.cpu_info()
    family = info.get("cpu family", "")
    return info.get("vendor_id", ""), int(family) if family.isdigit() else 0


def dense_pays(int4_kernel: str) -> bool:
    """Whether the dense bfloat16 copy is worth its memory (2.9x the 4-bit weights' for the
    default model) by default: with PyTorch's int4 kernel wherever the CPU computes bfloat16
    natively; with kspec's kernel only on an AMX CPU. Measured on Zen 5 (AVX-512-BF16, no AMX)
    with kspec's VNNI kernel: 40 verification rows no slower on the 4-bit weights alone, typing
    replay the same, the copy only speeds a cold 512-token prefill (1.37x) for 2.31x
    llama-server's resident memory instead of 1.58x (README "Measured")."""
    if int4_kernel == "kspec":
        return torch.cpu._is_amx_tile_supported()
    return native_bf16_cpu()


def native_bf16_cpu() -> bool:
    """Whether this CPU computes bfloat16 matmuls natively (AVX-512-BF16 or AMX)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def fast_path_available() -> bool:
    """Whether this CPU runs a 4-bit kernel vectorized: PyTorch's int4 CPU kernel on AVX-512
    (bfloat16 activations), kspec's 4-bit x 8-bit one on AVX2 where it builds (a C++ compiler);
    elsewhere auto stays float32."""
    if torch.backends.cpu.get_cpu_capability() not in INT4_KERNELS or not int4_kernel_available():
        return False
    return FastPath().resolved_int4_kernel() != "kspec" or cpu_layers.load_matmul(cache_root()) is not None


def to_fast_path(model: Transformer, codes: Mapping[str, Q4Codes], path: FastPath = FastPath()) -> Transformer:
    """Turn a loaded model into the fast path, in place (returns it): q/k/v and gate/up fused,
    every projection and the head a CpuLinear, 4-bit where `codes` (HF weight names, see
    `weight_terms`) has every part. The head's dense form stays the model's own weight."""
    dense_dtype, keep_dense, int4_max_rows = path.resolved_dense_dtype(), path.resolved_keep_dense(), path.resolved_int4_max_rows()
    q4q8 = cpu_layers.load_matmul(cache_root()) if path.resolved_int4_kernel() == "kspec" else None  # None: PyTorch's
    isa = cpu_layers.matmul_isa(cache_root()) if q4q8 is not None else None
    q8q8 = cpu_layers.load_q8_matmul(cache_root()) if isa in Q8Q8_ISAS else None
    q5q8 = cpu_layers.load_q5_matmul(cache_root()) if isa in Q5Q8_ISAS else None
    for index, block in enumerate(model.model.layers):
        prefix = f"model.layers.{index}."

        def linear(*names: str) -> CpuLinear:
            modules = [block.get_submodule(name) for name in names]
            terms = [weight_terms(codes, f"{prefix}{name}.weight") for name in names]
            return fused_linear(modules, terms, int4_max_rows, dense_dtype, keep_dense, q4q8, q8q8, q5q8)

        attention, mlp = block.self_attn, block.mlp
        attention.fuse(linear("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), linear("self_attn.o_proj"))
        if mlp.gated:
            mlp.fuse(linear("mlp.gate_proj", "mlp.up_proj"), linear("mlp.down_proj"))
        else:
            mlp.c_fc, mlp.c_proj = linear("mlp.c_fc"), linear("mlp.c_proj")
    embed_name = "model.embed_tokens.weight"
    head_name = embed_name if model.args.tie_embeddings else "lm_head.weight"
    head_terms = weight_terms(codes, head_name) if int4_kernel_available() else None
    head = model.lm_head
    # The dense form: next to 4-bit terms, in the projections' dense dtype (bfloat16: a packed
    # copy, and the 4-bit kernel's row limit holds for the head too); alone, the model's
    # weight itself (tied: the embedding table), not a copy.
    head_dense = [head.weight] if keep_dense or not head_terms else []
    head_dtype = dense_dtype if head_terms else head.weight.dtype
    model.lm_head = CpuLinear(
        head_dense, head_terms or [], head.bias, int4_max_rows, head_dtype, q4q8_matmul=q4q8, q8q8_matmul=q8q8, q5q8_matmul=q5q8
    )
    float_table_needed = bool(model.lm_head.dense_parts) and model.args.tie_embeddings
    float_weights_kept = keep_dense and dense_dtype == torch.float32  # loaded and kept anyway: the table stays float32
    head_terms_kept = model.lm_head.terms
    if model.args.tie_embeddings and not float_table_needed and len(head_terms_kept) == 1 and isinstance(head_terms_kept[0], Q8Q8Term):
        model.model.embed_tokens = Q8HeadEmbedding(head_terms_kept[0], model.dtype)  # the head's codes: no table of its own
    elif not float_table_needed and not float_weights_kept and (embed_terms := weight_terms(codes, embed_name)):
        model.model.embed_tokens = Int4Embedding(embed_terms, model.dtype)  # the table's codes read only when kept
    model.native_steps = NativeSteps.for_model(model, lambda: cpu_layers.load(cache_root())) if path.native_steps else None
    model.prompt_kv_dtype = path.resolved_prompt_kv(model.native_steps)
    return model


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
    kernel = f"kspec's 4-bit x 8-bit kernel ({cpu_layers.matmul_isa(cache_root())})" if q4q8 else "PyTorch's int4 kernel"
    notes = [f"{len(int4)}/{len(linears)} matmuls {rows}", kernel]
    if isinstance(model.lm_head, CpuLinear) and any(isinstance(t, Q8Q8Term) for t in model.lm_head.terms):
        notes.append("8-bit head")
    if isinstance(model.model.embed_tokens, Int4Embedding):
        notes.append("4-bit embedding")
    elif isinstance(model.model.embed_tokens, Q8HeadEmbedding):
        notes.append("embedding from the head's 8-bit codes")
    if model.native_steps is not None:
        limit = model.native_steps.max_rows
        notes.append("C++ layer loop" + (f" up to {limit} rows" if limit is not None else ""))
    elif reason := cpu_layers.unavailable_reason(cache_root(), tried_only=True):
        notes.append(reason)
    if model.kv_dtype != model.dtype:
        notes.append(f"{str(model.kv_dtype).removeprefix('torch.')} prompt KV")
    return f"{base} + int4 from the GGUF ({', '.join(notes)})"

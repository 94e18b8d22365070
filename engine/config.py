"""Engine configuration: validated dataclasses with defaults that work on a laptop CPU.

EngineConfig is the one list of what configures an engine. A field declared with
`option(...)` is, with no other change: a flag of every command that loads an engine
(`add_flags` / `from_flags`; complete, eval, bench, engine, cluster up), an argument of
the daemon a language server spawns (`to_flags`) and part of that daemon's identity, an
argument of `serve run ... cluster:build_app` (`from_values`), and with `setting=True`
a language-server setting (lsp_server/settings.py; the editors' settings are checked
against those in tests/unit/lsp/test_settings_schema.py).
"""

from __future__ import annotations

import argparse
import re
import typing
from dataclasses import Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DTYPES = ("auto", "float32", "bfloat16", "float16")  # auto, or torch dtype names (this module imports no torch: the language server reads it)
DRAFTER_CHOICES = ("auto", "lookup", "model", "layerskip", "none")
CPU_WEIGHTS = ("auto", "4bit", "4bit+dense")  # the CPU fast path's resident weights (engine/models/cpu_fast.py)
CPU_KERNELS = ("auto", "torch")  # the CPU fast path's decode steps: the C++ layer loop where it builds, or PyTorch ops only
CPU_INT4 = ("auto", "torch", "kspec")  # the CPU fast path's 4-bit matmul: by CPU (cpu_profile.PROFILES), PyTorch's int4 or kspec's 4-bit x 8-bit
CPU_KV = ("auto", "float32", "float16")  # the CPU fast path's prompt KV dtype: auto (cpu_fast.FastPath.resolved_prompt_kv) or a torch dtype name
QUANTIZE = ("q8", "q4", "none")  # float weights at load (engine/models/gguf_blocks.py, quantize_at_load.py)
def check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    """The one rule for an option that takes one of `choices`: a ValueError naming them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


CPU_FAST_PATH_FIELDS = ("cpu_weights", "cpu_kernels", "cpu_int4", "cpu_kv")  # EngineConfig's settings of the CPU fast path (FastPath.for_weights)
DEVICE_PATTERN = r"cpu|cuda(:\d+)?"  # the whole value
# The prompt budgets the machine fit chooses from (engine/machine_fit.py): below, too little of
# the file; the top is also the budget of an engine that is not fitted.
PROMPT_TOKENS_RANGE = (384, 1536)


def option(default: Any, help: str, *, short: str | None = None, choices: tuple[str, ...] | None = None,
           pattern: str | None = None, minimum: int | None = None, path: bool = False, setting: bool = False,
           vscode: bool = True) -> Any:  # fmt: skip
    """A field that users set: a command-line flag `--the-name` (and `short`) with this help;
    `choices` / `pattern` (a regex for the whole value) / `minimum` (a number's) say what is
    valid; `path`: a file or folder (resolved when it names the engine); `setting`: also a
    language-server setting, offered in VS Code's settings UI unless `vscode` is False."""
    metadata = {"help": help, "short": short, "choices": choices, "pattern": pattern, "minimum": minimum, "path": path,
                "setting": setting, "vscode": vscode}  # fmt: skip
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class SteeringConfig:
    """Branch steering (engine/decode/steering.py): the rule its two settings follow, defined once."""

    branches: int = 1  # at most this many of the k branches get a forced start (0: off; branch 0 is never steered)
    min_logprob: float = -20.0  # a forced start the target scores below this (the sum over its tokens) is undone

    def __post_init__(self) -> None:
        if not isinstance(self.branches, int) or self.branches < 0:
            raise ValueError(f"steering branches must be an int >= 0, got {self.branches!r}")
        if not self.min_logprob < 0:
            raise ValueError(f"steering min_logprob must be < 0, got {self.min_logprob}")


# Settings that choose which tokens a branch takes, not what a round of decoding costs: the
# machine fit's timing does not depend on them (engine/completion.py `fit_identity`), so changing
# one does not time the machine again.
FIT_NEUTRAL_FIELDS = frozenset({
    "prompt_tokens", "progress", "fork_ratio", "steer_branches", "steer_member_branches", "constrain_member_names", "steer_min_logprob", "steer_past_indent", "steer_block_headers",
})  # fmt: skip


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = option(
        None, "a known model name (`kspec models list`), HF model folder, .gguf file or cached hub id (default: $KSPEC_MODEL, else qwen2.5-coder-0.5b)",
        short="-m", path=True, setting=True,
    )  # fmt: skip
    draft: str | None = option(None, "draft model with the target's tokenizer (speculative decoding)", path=True, setting=True)
    dtype: str = option(
        "auto", "weight and activation type; auto: bfloat16 on CUDA, the CPU fast path (bfloat16, a Q4 GGUF's own 4-bit "
        "weights) on an AVX-512 CPU, else float32 (float32: the exact reference path)", choices=DTYPES, setting=True,
    )  # fmt: skip
    cpu_weights: str = option(
        "auto", "the CPU fast path's weights: 4bit (a Q4 GGUF's own codes only: least memory, prefill ~1.7x slower on "
        "a CPU without native bfloat16), 4bit+dense (also a dense copy for prefill and verification: fastest, ~4x the "
        "weight memory); auto: 4bit+dense (a bfloat16 copy) where the CPU computes bfloat16 natively and PyTorch's "
        "int4 kernel serves, else 4bit (kspec's 4-bit kernel runs every layer in its C++ loop, which the copy's rows "
        "would leave)",
        choices=CPU_WEIGHTS,
    )  # fmt: skip
    cpu_kernels: str = option(
        "auto", "the CPU fast path's decode steps of few rows: auto: every layer in one C++ call (kernels/cpu_layers.py, "
        "built once with this machine's compiler, ~2x faster at one row; PyTorch ops where it cannot be built); "
        "torch: PyTorch ops only", choices=CPU_KERNELS,
    )  # fmt: skip
    cpu_int4: str = option(
        "auto", "the CPU fast path's 4-bit matmul: torch (PyTorch's int4 kernel, bfloat16 activations, with a dense "
        "copy for many rows), kspec (kspec's 4-bit x 8-bit kernel, activations rounded to 8 bits per block of 32 as "
        "llama.cpp does: AVX2, or AVX-512 VNNI); auto: the one measured faster on this CPU class", choices=CPU_INT4,
    )  # fmt: skip
    cpu_kv: str = option(
        "auto", "the CPU fast path's prompt KV (prefill, prefix cache, the branches' shared prefix): float16 (half the "
        "memory, and a decode step reads half the bytes of a long prompt) or float32; auto: float16 where the C++ layer "
        "loop serves every branch step, else float32", choices=CPU_KV,
    )  # fmt: skip
    quantize: str = option(
        "q8", "float weights (an HF folder; an F16/BF16/F32 GGUF) on the CPU fast path, quantized once at load and "
        "cached on disk: q8 (8 bits per weight, a scale per block of 32: logits closest to the float weights), q4 "
        "(4 bits with a scale and minimum per block of 32: half the bytes a step reads), none (dense float weights)",
        choices=QUANTIZE,
    )  # fmt: skip
    device: str = option("cpu", "'cpu' or 'cuda[:N]'", pattern=DEVICE_PATTERN, setting=True)
    prompt_tokens: int | None = option(
        None, "the prompt's token budget (the file around the cursor and other files' context); default: what this "
        f"machine prefills cold in about half a second (the machine fit: {PROMPT_TOKENS_RANGE[0]}-{PROMPT_TOKENS_RANGE[1]}), "
        f"{PROMPT_TOKENS_RANGE[1]} without a fit; a number pins it: figures comparable across machines, or more of the "
        "file on a slow one", minimum=16, setting=True, vscode=False,
    )  # fmt: skip
    threads: int | None = option(None, "torch intra-op threads (default: torch's, one per core)")
    progress: bool = True  # progress bar while converting a GGUF file
    prefix_cache_mb: int = option(
        128, "KV of recent prompts kept for reuse across keystrokes, in MB (one entry per document being typed in; "
        "~18 MB per 384-token and ~70 MB per 1.5k-token prompt of the demo model in float32, half that in float16: --cpu-kv); 0 disables",
    )  # fmt: skip
    drafter: str = option(
        "auto", "speculative drafter (auto: --draft if given, else prompt lookup; layerskip: the first 8 layers of the target)",
        choices=DRAFTER_CHOICES,
    )  # fmt: skip
    draft_layers: int = 8  # layerskip: the target's first N layers + its head draft
    gamma: int = 4  # starting draft length (adapts per round)
    draft_only_when_paying: bool = True  # greedy: pause drafting while it costs more than it brings (decode/speculative.py DraftPayoff)
    early_stop: bool = True  # stop a branch once tree-sitter says its unit is complete
    steer_branches: int = option(
        SteeringConfig.branches, "branches (of the k) that start by binding a name the code after the cursor reads and nothing before it "
        "binds (`msg =`), verified by the model like a draft; 0: off (engine/decode/steering.py)",
    )  # fmt: skip
    steer_member_branches: int = option(
        3, "branches (of the k) that, after `module.` of a module the file imports, start with one of its member names "
        "(the context gatherer's), the model's likeliest first; 0: off (engine/decode/steering.py)",
    )  # fmt: skip
    constrain_member_names: bool = True  # a branch inside `module.name` goes on only with the module's names (engine/decode/member_constraint.py)
    steer_block_headers: bool = True  # where the code after the cursor is the hole's body, all branches but the first start with a header (`if`, `for`, ...)
    fork_ratio: float = option(
        0.1, "mode diverse: a first token starts a branch of its own only where the model finds it at least this likely "
        "relative to the likeliest one; the other branches split later, where the greedy line hesitates "
        "(engine/decode/forks.py); 0: the k likeliest first tokens",
    )  # fmt: skip
    steer_past_indent: bool = True  # at a line start, diverse branches split after the likeliest indentation, not on indentation variants (steering.past_indentation_starts)
    steer_min_logprob: float = SteeringConfig.min_logprob  # a forced start the model scores below this (summed log-probability) is undone (measured: docs/measurements/branch-steering.md)
    fit_to_machine: bool = True  # at load, time this machine and choose k / max tokens / first answer (engine/machine_fit.py)

    def __post_init__(self) -> None:
        check_choice("dtype", self.dtype, DTYPES)
        if not isinstance(self.device, str) or not re.fullmatch(DEVICE_PATTERN, self.device):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        for option_field in options():
            value, least = getattr(self, option_field.name), option_field.metadata["minimum"]
            if least is not None and value is not None and value < least:
                raise ValueError(f"{option_field.name} must be >= {least}, got {value}")
        check_choice("cpu_weights", self.cpu_weights, CPU_WEIGHTS)
        check_choice("cpu_kernels", self.cpu_kernels, CPU_KERNELS)
        check_choice("cpu_int4", self.cpu_int4, CPU_INT4)
        check_choice("cpu_kv", self.cpu_kv, CPU_KV)
        check_choice("quantize", self.quantize, QUANTIZE)
        if self.prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0, got {self.prefix_cache_mb}")
        check_choice("drafter", self.drafter, DRAFTER_CHOICES)
        if self.drafter == "model" and not self.draft:
            raise ValueError("drafter 'model' needs a draft model (--draft PATH)")
        if self.draft_layers < 1:
            raise ValueError(f"draft_layers must be >= 1, got {self.draft_layers}")
        if not 1 <= self.gamma <= 16:
            raise ValueError(f"gamma must be in [1, 16], got {self.gamma}")
        if not 0.0 <= self.fork_ratio < 1.0:
            raise ValueError(f"fork_ratio must be in [0, 1), got {self.fork_ratio}")
        SteeringConfig(self.steer_branches, self.steer_min_logprob)  # its rule
        SteeringConfig(self.steer_member_branches, self.steer_min_logprob)
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    def cpu_fast_path(self) -> dict[str, str]:
        """The CPU fast path's settings by field name, as FastPath.for_weights takes them."""
        return {name: getattr(self, name) for name in CPU_FAST_PATH_FIELDS}

    @property
    def torch_dtype(self) -> "torch.dtype":
        """The explicit dtype (auto depends on the machine: engine/models/loading.py Compute.choose)."""
        import torch

        if self.dtype == "auto":
            raise ValueError("dtype 'auto' is chosen at load (Compute.choose), it has no fixed torch dtype")
        return getattr(torch, self.dtype)


# --- what derives from the options ------------------------------------------------------


def options() -> tuple[Field, ...]:
    """The fields users set (declared with `option`), in declaration order."""
    return tuple(f for f in fields(EngineConfig) if "help" in f.metadata)


def flag(option_field: Field) -> str:
    return "--" + option_field.name.replace("_", "-")


def value_type(option_field: Field) -> type:
    """str, int, float or bool: the field's type without its None."""
    hint = typing.get_type_hints(EngineConfig)[option_field.name]
    kinds = [kind for kind in typing.get_args(hint) if kind is not type(None)] or [hint]
    return kinds[0]


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Every option as a flag; one not given stays None (-> EngineConfig's default)."""
    for option_field in options():
        meta = option_field.metadata
        names = [flag(option_field), *([meta["short"]] if meta["short"] else [])]
        kind = value_type(option_field)
        if kind is bool:
            parser.add_argument(*names, dest=option_field.name, action=argparse.BooleanOptionalAction, default=None, help=meta["help"])
            continue
        shown = "" if option_field.default is None or "default" in meta["help"] else f" (default: {option_field.default})"
        parser.add_argument(
            *names, dest=option_field.name, type=kind, choices=meta["choices"], default=None, help=meta["help"] + shown,
            metavar=None if meta["choices"] else option_field.name.upper(),
        )  # fmt: skip


def from_flags(args: argparse.Namespace, **fixed: Any) -> EngineConfig:
    """The config of parsed flags (`add_flags`), with `fixed` fields set by the caller.
    Raises ValueError naming what is invalid."""
    given = {f.name: getattr(args, f.name) for f in options() if getattr(args, f.name, None) is not None}
    return EngineConfig(**{**given, **fixed})


def to_flags(config: EngineConfig) -> list[str]:
    """The flags that give `config` back through `from_flags` (options at their default are left out)."""
    out: list[str] = []
    for option_field in options():
        value = getattr(config, option_field.name)
        if value == option_field.default:
            continue
        if value_type(option_field) is bool:
            out.append(flag(option_field) if value else "--no-" + flag(option_field)[2:])
        else:
            out += [flag(option_field), str(value)]
    return out


def from_values(values: dict[str, Any], **fixed: Any) -> EngineConfig:
    """The config of option values given as text or typed (`serve run` arguments, a YAML
    file); None or "" keeps the default. Raises ValueError for an unknown name or a bad value."""
    by_name = {f.name: f for f in options()}
    unknown = set(values) - set(by_name)
    if unknown:
        raise ValueError(f"unknown engine option(s) {', '.join(sorted(unknown))}; known: {', '.join(by_name)}")
    typed: dict[str, Any] = {}
    for name, value in values.items():
        if value is None or value == "":
            continue
        kind = value_type(by_name[name])
        if kind is bool and isinstance(value, str):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"{name} must be true or false, got {value!r}")
            value = value.lower() in ("true", "1", "yes")
        try:
            typed[name] = kind(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} must be {kind.__name__}, got {value!r}") from exc
    return EngineConfig(**{**typed, **fixed})

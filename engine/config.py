"""Engine configuration: validated dataclasses with defaults that work on a laptop CPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")  # torch dtype names (this module imports no torch: the language server reads it)
DRAFTER_CHOICES = ("auto", "lookup", "model", "layerskip", "none")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # None: the embedded default model
    draft: str | None = None  # a draft model with the target's tokenizer (speculative decoding)
    dtype: str = "float32"
    device: str = "cpu"
    prompt_tokens: int = 1536  # token budget for prefix + suffix
    threads: int | None = None  # torch intra-op threads; None keeps torch's default
    progress: bool = True  # progress bar while converting a GGUF file
    prefix_cache_mb: int = 512  # KV of recent prompts kept for reuse across keystrokes; 0 disables
    drafter: str = "auto"  # "auto" (the draft model if given, else prompt lookup), "lookup", "model", "layerskip", "none"
    draft_layers: int = 8  # layerskip: the target's first N layers + its head draft
    gamma: int = 4  # starting draft length (adapts per round)
    early_stop: bool = True  # stop a branch once tree-sitter says its unit is complete

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.prompt_tokens < 16:
            raise ValueError(f"prompt_tokens must be >= 16, got {self.prompt_tokens}")
        if self.prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0, got {self.prefix_cache_mb}")
        if self.drafter not in DRAFTER_CHOICES:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTER_CHOICES)}, got {self.drafter!r}")
        if self.drafter == "model" and not self.draft:
            raise ValueError("drafter 'model' needs a draft model (--draft PATH)")
        if self.draft_layers < 1:
            raise ValueError(f"draft_layers must be >= 1, got {self.draft_layers}")
        if not 1 <= self.gamma <= 16:
            raise ValueError(f"gamma must be in [1, 16], got {self.gamma}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    @property
    def torch_dtype(self) -> "torch.dtype":
        import torch

        return getattr(torch, self.dtype)

"""Model hyper-parameters, read from an HF `config.json` and validated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kspec.engine.errors import ModelLoadError

# model_type in config.json -> the architecture family our decoder implements.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",  # + an RMSNorm of each head's q and k before rotary (qk_norm)
    "starcoder2": "starcoder2",
}

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str = "default"
    factor: float = 1.0
    # llama3 only
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ModelLoadError(
                f"rope scaling type {self.rope_type!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        if self.factor <= 0:
            raise ModelLoadError(f"rope scaling factor must be > 0, got {self.factor}")


@dataclass(frozen=True)
class ModelArgs:
    model_type: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 4096
    tie_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    gated_mlp: bool = True  # llama family: down(act(gate(x)) * up(x)); starcoder2: c_proj(act(c_fc(x)))
    activation: str = "silu"
    layer_norm: bool = False  # starcoder2 uses LayerNorm with bias; llama family RMSNorm
    qk_norm: bool = False  # qwen3: RMSNorm over head_dim of every q and k head, before rotary
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ModelLoadError(f"model config: {name} must be > 0, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ModelLoadError(
                f"model config: num_attention_heads ({self.n_heads}) must be a multiple of "
                f"num_key_value_heads ({self.n_kv_heads})"
            )
        if self.activation not in ACTIVATIONS:
            raise ModelLoadError(
                f"model config: activation {self.activation!r} is not supported; supported: {', '.join(ACTIVATIONS)}"
            )

    @property
    def family(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.model_type]

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "ModelArgs":
        model_type = str(config.get("model_type", ""))
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported model architecture {model_type or '(none)'!r}; "
                f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
            )
        try:
            dim = int(config["hidden_size"])
            n_heads = int(config["num_attention_heads"])
            head_dim = int(config.get("head_dim") or dim // n_heads)
            rope_theta, rope_scaling = _rope_from_config(config)
            eos = config.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else ((int(eos),) if eos is not None else ())
            is_starcoder = model_type == "starcoder2"
            return cls(
                model_type=model_type,
                vocab_size=int(config["vocab_size"]),
                dim=dim,
                n_layers=int(config["num_hidden_layers"]),
                n_heads=n_heads,
                n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
                head_dim=head_dim,
                intermediate_size=int(config["intermediate_size"]),
                norm_eps=float(config.get("norm_epsilon" if is_starcoder else "rms_norm_eps", 1e-5)),
                rope_theta=rope_theta,
                rope_scaling=rope_scaling,
                max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
                tie_embeddings=bool(config.get("tie_word_embeddings", is_starcoder)),
                qkv_bias=_qkv_bias(model_type, config),
                o_bias=_o_bias(model_type, config),
                mlp_bias=bool(config.get("use_bias", True)) if is_starcoder else bool(config.get("mlp_bias", False)),
                gated_mlp=not is_starcoder,
                activation=str(config.get("hidden_act", "gelu_pytorch_tanh" if is_starcoder else "silu")),
                layer_norm=is_starcoder,
                qk_norm=model_type == "qwen3",
                sliding_window=_sliding_window(model_type, config),
                bos_token_id=config.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"model config.json is missing or has a bad value for {exc}") from exc


ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu")


def _rope_from_config(config: dict[str, Any]) -> tuple[float, RopeScaling]:
    # transformers >= 5 writes `rope_parameters`; older configs `rope_theta` + `rope_scaling`.
    params = dict(config.get("rope_parameters") or {})
    scaling = dict(config.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    merged = {**scaling, **params}
    rope_type = str(merged.get("rope_type", merged.get("type", "default")))
    if rope_type == "default":
        return theta, RopeScaling()
    return theta, RopeScaling(
        rope_type=rope_type,
        factor=float(merged.get("factor", 1.0)),
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(merged.get("original_max_position_embeddings", 8192)),
    )


def _qkv_bias(model_type: str, config: dict[str, Any]) -> bool:
    if model_type == "qwen2":
        return True
    if model_type == "starcoder2":
        return bool(config.get("use_bias", True))
    return bool(config.get("attention_bias", False))


def _o_bias(model_type: str, config: dict[str, Any]) -> bool:
    if model_type == "qwen2":
        return False
    if model_type == "starcoder2":
        return bool(config.get("use_bias", True))
    return bool(config.get("attention_bias", False))


def _sliding_window(model_type: str, config: dict[str, Any]) -> int | None:
    window = config.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not config.get("use_sliding_window", False):
        return None
    return int(window) if window else None

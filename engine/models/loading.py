"""Loading a model by name, path or GGUF file: weights and tokenizer together."""

from __future__ import annotations

from dataclasses import dataclass

from kspec.engine.config import EngineConfig
from kspec.engine.errors import ModelLoadError
from kspec.engine.models.gguf_convert import ProgressCallback
from kspec.engine.models.hf_folder import load_transformer
from kspec.engine.models.resolve import resolve_model
from kspec.engine.models.tokenizer import Tokenizer
from kspec.engine.models.transformer import Transformer


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer
    name: str


def load_model(spec: str | None, config: EngineConfig, on_progress: ProgressCallback | None = None) -> LoadedModel:
    """on_progress(fraction, message): conversion (if a GGUF file is new) up to 0.8, then weights."""
    report = on_progress or (lambda fraction, message: None)
    resolved = resolve_model(spec, progress=config.progress, on_progress=lambda f, m: report(0.8 * f, m))
    report(0.8, f"loading {resolved.name}")
    model = load_transformer(resolved.folder, config.torch_dtype, config.device)
    tokenizer = Tokenizer.from_folder(resolved.folder, model.args.eos_token_ids)
    if tokenizer.vocab_size > model.args.vocab_size:
        raise ModelLoadError(
            f"{resolved.name}: tokenizer has {tokenizer.vocab_size} tokens but the model only {model.args.vocab_size}"
        )
    return LoadedModel(model, tokenizer, resolved.name)


def check_draft_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    if target.tokenizer.vocabulary() != draft.tokenizer.vocabulary():
        raise ModelLoadError(
            f"draft model {draft.name!r} has a different vocabulary from {target.name!r}; "
            "a draft must share the target's tokenizer"
        )

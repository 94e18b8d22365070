"""Our own decoder implementation (llama family and StarCoder2) and its loaders."""

from kspec.engine.models.args import SUPPORTED_ARCHITECTURES, ModelArgs
from kspec.engine.models.transformer import Transformer

__all__ = ["SUPPORTED_ARCHITECTURES", "ModelArgs", "Transformer"]

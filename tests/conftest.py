"""Shared fixtures: small random models on disk and the small test model (loaded once). The
suite's default model is the small one (tests/suite_models.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from suite_models import TEST_MODEL, use_test_model

torch.manual_seed(0)
use_test_model()


@pytest.fixture(scope="session")
def small_gguf() -> Path:
    """The small test model's GGUF file (found before any test points the cache elsewhere)."""
    from kspec.engine.models.resolve import known_model_path

    return known_model_path(TEST_MODEL)


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A test that runs a command's main() configures the root logger with a handler on that
    test's captured stderr (cli/logs.py, `basicConfig(force=True)`); once the capture closes, a
    later test's log records would go to a closed stream. Each test gets the root logger back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session")
def random_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from model_factory import write_random_model

    return write_random_model(tmp_path_factory.mktemp("llama"), "llama", seed=0)


@pytest.fixture(scope="session")
def default_engine():
    from kspec.engine.completion import CompletionEngine
    from kspec.engine.config import EngineConfig

    # the exact path (auto: test_fast_path.py); not fitted to the machine, whose timing (and so
    # the prompt budget it caps) moves with the load: tests must not
    return CompletionEngine.load(EngineConfig(dtype="float32", progress=False, fit_to_machine=False))


@pytest.fixture(scope="session")
def random_engine(random_llama_dir: Path):
    from kspec.engine.completion import CompletionEngine
    from kspec.engine.config import EngineConfig

    # not fitted to the machine (see default_engine); tests/unit/test_machine_fit.py loads a fitted one
    return CompletionEngine.load(EngineConfig(model=str(random_llama_dir), dtype="float32", progress=False, fit_to_machine=False))

"""`kspec bench keystroke`'s prompt_starts part: typing at the language server's window through
the engine's prompt building counts the keystrokes whose prompt the prefix cache cannot serve."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kspec.bench.keystroke import prompt_starts
from kspec.engine.models.tokenizer import Tokenizer
from kspec.engine.prompt import PromptStarts

TEXT = Path(textwrap.__file__).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def tokenizer(random_llama_dir: Path) -> Tokenizer:
    return Tokenizer.from_folder(random_llama_dir)


def test_typing_keeps_the_prompt_warm(tokenizer: Tokenizer) -> None:
    report = prompt_starts(tokenizer, TEXT, points=3, length=120, budget=384, prefix_chars=3000)
    assert report["keystrokes"] == 3 * 119
    assert report["cold_prompts"] <= 3  # at most a start outgrown per place
    assert report["mean_tokens_recomputed"] < 2


def test_without_remembered_starts_prompts_go_cold(tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The count can fail: a start chosen afresh at each keystroke moves as the text grows."""
    monkeypatch.setattr(PromptStarts, "found_in", lambda self, text, lead=(): [])
    report = prompt_starts(tokenizer, TEXT, points=3, length=120, budget=384, prefix_chars=3000)
    assert report["cold_prompts"] > 3

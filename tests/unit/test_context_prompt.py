"""Other files' context in the prompt (engine/context_prompt.py, engine/prompt.py): the
repository format where the tokenizer has one, path comments otherwise, the budget, and a
block that does not move while the user types (what the prefix cache needs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from request_maps import parsed, through_the_wire

from kspec.engine.api import CompletionRequest, ContextFile
from kspec.engine.context_prompt import context_block, display_path
from kspec.engine.errors import InputError
from kspec.engine.models.tokenizer import Tokenizer
from kspec.engine.prompt import PromptBudget, build_prompt

UTILS = ContextFile("pkg/utils.py", "def decode_params(params): ...\n")
NODES = ContextFile("pkg/nodes.py", "class Const(Expr):\n    def as_const(self): ...\n")


def _with_tokens(random_llama_dir: Path, folder: Path, spellings: tuple[str, ...]) -> Tokenizer:
    data = json.loads((random_llama_dir / "tokenizer.json").read_text())
    base = len(data["model"]["vocab"])
    for offset, content in enumerate(spellings):
        data["added_tokens"].append(
            {"id": base + offset, "content": content, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        )
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return Tokenizer.from_folder(folder)


@pytest.fixture(scope="module")
def plain(random_llama_dir: Path) -> Tokenizer:
    return Tokenizer.from_folder(random_llama_dir)


@pytest.fixture(scope="module")
def qwen(random_llama_dir: Path, tmp_path_factory) -> Tokenizer:
    spellings = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>")
    return _with_tokens(random_llama_dir, tmp_path_factory.mktemp("qwen"), spellings)


@pytest.fixture(scope="module")
def file_sep_only(random_llama_dir: Path, tmp_path_factory) -> Tokenizer:
    """SmolLM2's case: `<file_sep>` in the vocabulary, no FIM tokens (not trained on the format)."""
    return _with_tokens(random_llama_dir, tmp_path_factory.mktemp("sep"), ("<file_sep>",))


def test_without_repository_tokens_files_are_named_in_comments(plain: Tokenizer, file_sep_only: Tokenizer) -> None:
    for tokenizer in (plain, file_sep_only):
        prompt = build_prompt(tokenizer, "import os\n\ndef f(x):\n    return ", "", PromptBudget(256), None, (UTILS, NODES), "/home/u/ws/pkg/m.py", "python")
        text = tokenizer.decode(prompt.ids)
        assert text.startswith("# pkg/utils.py\ndef decode_params(params): ...\n\n# pkg/nodes.py\nclass Const(Expr):")
        assert "# pkg/m.py\nimport os\n" in text  # the cursor's file named as the pieces name theirs
        assert prompt.context_files == ("pkg/utils.py", "pkg/nodes.py") and prompt.context_tokens > 0
    js = build_prompt(plain, "const a = 1;\n", "", PromptBudget(256), None, (ContextFile("src/b.js", "export function b() {}\n"),), "/w/src/a.js", "javascript")
    assert plain.decode(js.ids).startswith("// src/b.js\nexport function b() {}\n")


def test_qwen_repository_format_before_the_fim_prompt(qwen: Tokenizer) -> None:
    prompt = build_prompt(qwen, "x = utils.", "\n", PromptBudget(256), None, (UTILS,), "/ws/pkg/m.py", "python")
    repo, sep, fim = qwen.special_id("<|repo_name|>"), qwen.special_id("<|file_sep|>"), qwen.fim
    assert fim is not None and prompt.uses_fim
    assert prompt.ids[0] == repo and prompt.ids.count(sep) == 2
    start = prompt.ids.index(fim.prefix)
    assert prompt.ids[start - 1] != sep and qwen.decode(prompt.ids[prompt.ids.index(sep, 1) + 1 : start]).endswith("pkg/m.py\n")
    assert qwen.decode(prompt.ids[:start]).count("pkg/utils.py\ndef decode_params") == 1


def test_no_context_leaves_the_prompt_as_it_was(plain: Tokenizer) -> None:
    before = build_prompt(plain, "def f(x):\n    return ", "", PromptBudget(64))
    after = build_prompt(plain, "def f(x):\n    return ", "", PromptBudget(64), None, (), "/w/m.py", "python")
    assert before.ids == after.ids and after.context_tokens == 0


def test_the_budget_keeps_whole_pieces_from_the_end(plain: Tokenizer) -> None:
    big = ContextFile("pkg/big.py", "def f(): ...\n" * 200)
    block = context_block(plain, (big, UTILS), "/w/pkg/m.py", "python", 64)
    assert block.files == ("pkg/utils.py",)  # the last (most relevant) piece fits, the big one does not
    assert len(block.ids) <= 64
    assert context_block(plain, (UTILS,), "/w/pkg/m.py", "python", 3).ids == []  # nothing fits: no block at all
    # the context and the file share the budget: the context at most half of it, the file the rest
    prefix = "".join(f"line_{i} = {i}\n" for i in range(200))
    alone = build_prompt(plain, prefix, "", PromptBudget(128))
    joined = build_prompt(plain, prefix, "", PromptBudget(128), None, (UTILS,), "/w/pkg/m.py", "python")
    assert 0 < joined.context_tokens <= 64 and len(alone.ids) <= 128 and len(joined.ids) <= 128
    own = joined.ids[joined.context_tokens :]
    assert alone.ids[-len(own) :] == own and len(own) < len(alone.ids)  # the file's last lines, fewer of them


def test_typing_keeps_the_block_at_the_start(plain: Tokenizer) -> None:
    """Two keystrokes with the same pieces share the block and the file's start: the prefix cache's case."""
    first = build_prompt(plain, "import os\n\ndef f(x):\n    ret", "", PromptBudget(256), None, (UTILS,), "/w/pkg/m.py", "python")
    second = build_prompt(plain, "import os\n\ndef f(x):\n    retu", "", PromptBudget(256), None, (UTILS,), "/w/pkg/m.py", "python")
    shared = next((at for at, (a, b) in enumerate(zip(first.ids, second.ids)) if a != b), min(len(first.ids), len(second.ids)))
    assert shared >= first.context_tokens + len(plain.encode("import os\n\ndef f(x):\n")) - 1


def test_display_path() -> None:
    assert display_path("/home/u/ws/pkg/sub/m.py", (UTILS,)) == "pkg/sub/m.py"
    assert display_path("/home/u/ws/m.py", (UTILS,)) == "m.py"
    assert display_path("rel/m.py", ()) == "rel/m.py"


def test_the_request_field_round_trips_and_is_checked() -> None:
    request = CompletionRequest(prefix="x", context=(UTILS, NODES))
    assert through_the_wire(request) == request
    assert parsed({"prefix": "x", "context": [{"path": "a.py", "text": "y"}]}).context == (ContextFile("a.py", "y"),)
    for bad in ("x", [{"path": 1, "text": ""}], [{"text": "y"}], [{"path": "a", "text": "y"}] * 65, [{"path": "a", "text": "y" * (1 << 20)}]):
        with pytest.raises(InputError):
            parsed({"prefix": "x", "context": bad})

"""The prompts the real default model (Qwen2.5-Coder) was trained on, checked on its own tokenizer's
ids: FIM in prefix-suffix-middle order, the repository format for other files, and its stop
tokens. The ids are Qwen2.5-Coder's published special tokens."""

from __future__ import annotations

import pytest
from suite_models import REAL_DEFAULT

from kspec.engine.api import ContextFile
from kspec.engine.models.resolve import resolve_model
from kspec.engine.models.tokenizer import Tokenizer
from kspec.engine.prompt import PromptBudget, build_prompt

ENDOFTEXT, IM_END = 151643, 151645
FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, FIM_PAD, REPO_NAME, FILE_SEP = 151659, 151660, 151661, 151662, 151663, 151664


@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
    return Tokenizer.from_folder(resolve_model(REAL_DEFAULT, progress=False).folder)


def test_fim_prompt_is_prefix_suffix_middle_in_qwens_ids(qwen: Tokenizer) -> None:
    prefix, suffix = "def area(r):\n    return 3.14159 * ", "\n\nprint(area(2))\n"
    prompt = build_prompt(qwen, prefix, suffix, PromptBudget(512))
    ids = prompt.ids
    assert prompt.uses_fim and ids[0] == FIM_PREFIX and ids[-1] == FIM_MIDDLE and ids.count(FIM_SUFFIX) == 1
    middle = ids.index(FIM_SUFFIX)
    assert qwen.decode(ids[1:middle]) + prompt.healed_text == prefix  # the tail held back for token healing comes back
    assert qwen.decode(ids[middle + 1 : -1]) == suffix
    assert not {REPO_NAME, FILE_SEP} & set(ids)  # no other files: no repository header


def test_other_files_go_first_in_qwens_repository_format(qwen: Tokenizer) -> None:
    utils = ContextFile("pkg/utils.py", "def decode_params(params):\n    return dict(params)\n")
    prompt = build_prompt(qwen, "from pkg.utils import decode_params\n\nx = ", "\n", PromptBudget(512), None, (utils,), "/ws/pkg/m.py", "python")
    ids = prompt.ids
    assert ids[0] == REPO_NAME and ids.count(FILE_SEP) == 2  # one header, one separator per file (the piece, the cursor's)
    first, second = (i for i, t in enumerate(ids) if t == FILE_SEP)
    assert qwen.decode(ids[1:first]) == "workspace\n"
    assert qwen.decode(ids[first + 1 : second]) == "pkg/utils.py\n" + utils.text
    assert ids[ids.index(FIM_PREFIX) - 1] != FIM_MIDDLE and qwen.decode(ids[second + 1 : ids.index(FIM_PREFIX)]) == "pkg/m.py\n"
    assert prompt.context_files == ("pkg/utils.py",)


def test_qwens_stop_tokens_end_a_completion(qwen: Tokenizer) -> None:
    assert qwen.fim is not None and (qwen.fim.prefix, qwen.fim.suffix, qwen.fim.middle) == (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE)
    assert {ENDOFTEXT, IM_END, FIM_PAD, FILE_SEP, REPO_NAME, FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE} <= qwen.stop_ids

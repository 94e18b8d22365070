"""llama.cpp's /infill request and answer shapes, as llama.vim and llama.vscode send and
read them (ggml-org/llama.vim autoload/llama.vim, ggml-org/llama.vscode src/llama-server.ts)."""

from __future__ import annotations

import pytest

from kspec.engine.api import Completion, CompletionResult
from kspec.engine.serve.infill_api import cut_at_indent, infill_response, parse_infill, select_fields
from kspec.engine.serve.openai_api import ApiError

# llama.vim's FIM request (s:fim_try_hint), field for field
LLAMA_VIM = {
    "id_slot": 0,
    "input_prefix": "import os\n\ndef main():\n",
    "input_suffix": "\n\nmain()\n",
    "input_extra": [{"text": "def helper():\n    return 1\n", "time": 1.5, "filename": "util.py"}],
    "prompt": "    x = ",
    "n_predict": 128,
    "stop": [],
    "n_indent": 4,
    "top_k": 40,
    "top_p": 0.90,
    "samplers": ["top_k", "top_p", "infill"],
    "stream": False,
    "cache_prompt": True,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 1000,
    "response_fields": [
        "content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms", "timings/prompt_per_second",
        "timings/predicted_n", "timings/predicted_ms", "timings/predicted_per_token_ms", "timings/predicted_per_second",
        "truncated", "tokens_cached",
    ],
}  # fmt: skip


def test_llama_vim_request_becomes_one_engine_request() -> None:
    parsed = parse_infill(LLAMA_VIM)
    request = parsed.request
    assert request.prefix == "import os\n\ndef main():\n" + "    x = "
    # the chunks travel as the request's context, with their file names, not glued into the prefix
    assert [(piece.path, piece.text) for piece in request.context] == [("util.py", "def helper():\n    return 1\n")]
    assert request.suffix == "\n\nmain()\n"
    assert (request.k, request.max_tokens, request.deadline_ms, request.top_p) == (1, 128, 1500.0, 0.9)
    assert request.mode == "diverse" and not request.raw and request.cursor_rules
    assert parsed.n_indent == 4 and parsed.generate


def test_n_cmpl_is_k_and_n_predict_zero_is_a_warm_up() -> None:
    assert parse_infill({**LLAMA_VIM, "n_cmpl": 4}).request.k == 4
    assert parse_infill({**LLAMA_VIM, "n_predict": -1}).request.max_tokens == 128
    warm = parse_infill({"input_prefix": "", "input_suffix": "", "input_extra": [], "prompt": "", "n_predict": 0, "response_fields": [""]})
    assert not warm.generate
    assert infill_response(None, warm) == {}  # llama.vim asks for no field at all


@pytest.mark.parametrize(
    "bad",
    [{"stream": True}, {"n_cmpl": 0}, {"n_cmpl": 33}, {"input_extra": "x"}, {"input_extra": [{"text": 3}]}, {"input_prefix": 1}, {"kspec": {"postprocess": 1}}],
)
def test_refusals(bad: dict) -> None:
    with pytest.raises(ApiError) as caught:
        parse_infill({**LLAMA_VIM, **bad})
    assert caught.value.status == 400


def test_completion_route_continues_the_prompt() -> None:
    request = parse_infill({"prompt": "def f():", "n_predict": 8}, infill=False).request
    assert (request.prefix, request.suffix, request.max_tokens) == ("def f():", "", 8)
    with pytest.raises(ApiError):
        parse_infill({"input_prefix": "x"}, infill=False)


def test_n_indent_ends_at_a_line_indented_less() -> None:
    assert cut_at_indent("1\n    y = 2\n\nz = 3\n", 4) == ("1\n    y = 2\n\n", True)
    assert cut_at_indent("1\n    y = 2\n", 4) == ("1\n    y = 2\n", False)
    assert cut_at_indent("1\nz = 3", 0) == ("1\nz = 3", False)


def test_answer_fields_as_the_clients_read_them() -> None:
    result = CompletionResult(
        [Completion("1\n    y = 2\nz = 3", 0.0, n_tokens=6, finish_reason="length"), Completion("2", 0.0, n_tokens=1, finish_reason="eos")],
        "m", {"prompt_tokens": 40.0, "reused_prompt_tokens": 30.0, "prefill": 20.0, "decode": 60.0},
    )  # fmt: skip
    vim = infill_response(result, parse_infill(LLAMA_VIM))  # n_cmpl 1: one object, only the fields asked for
    assert set(vim) == set(LLAMA_VIM["response_fields"])
    assert vim["content"] == "1\n    y = 2\n" and vim["timings/prompt_n"] == 10 and vim["tokens_cached"] == 36 and vim["truncated"] is False
    vscode = infill_response(result, parse_infill({**LLAMA_VIM, "response_fields": None, "n_cmpl": 2}))
    assert isinstance(vscode, list) and [a["index"] for a in vscode] == [0, 1]
    assert [a["content"] for a in vscode] == ["1\n    y = 2\n", "2"]
    assert vscode[1]["stop_type"] == "eos" and vscode[0]["stop_type"] == "eos"  # cut by n_indent
    assert {"content", "timings", "tokens_cached", "truncated", "generation_settings"} <= set(vscode[0])
    assert vscode[0]["timings"]["predicted_n"] == 6 and vscode[0]["timings"]["prompt_ms"] == 20.0


def test_select_fields_skips_missing_paths() -> None:
    assert select_fields({"a": {"b": 1}, "c": 2}, ("a/b", "a/x", "c")) == {"a/b": 1, "c": 2}

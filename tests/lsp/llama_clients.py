"""The checks llama.vim and llama.vscode apply to an /infill answer before they show it,
written from their sources (ggml-org/llama.vim autoload/llama.vim s:fim_on_response and
s:fim_render; ggml-org/llama.vscode src/llama-server.ts LlamaResponse), so a test can run
them on the bytes kspec writes. Each returns the suggestion's lines, or None where the
plugin would drop the answer without a word."""

from __future__ import annotations

import json
import re
from typing import Any

# llama.vim: `l:raw !~# '^\s*{' || l:raw !~# '\v"content"\s*:"'` -> ignored
_VIM_OBJECT = re.compile(r"^\s*\{")
_VIM_CONTENT = re.compile(r'"content"\s*:"')
_VIM_TIMINGS = ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second")


def llama_vim_lines(raw: bytes) -> list[str] | None:
    """What llama.vim would render: None when its fast check or json_decode rejects the
    answer, else the content's lines without trailing empty ones."""
    text = raw.decode("utf-8")
    if not text or not _VIM_OBJECT.search(text) or not _VIM_CONTENT.search(text):
        return None
    try:
        response = json.loads(text)
    except ValueError:
        return None
    if not isinstance(response, dict) or not isinstance(response.get("content", ""), str):
        return None
    lines = response.get("content", "").split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    return lines


def llama_vim_info(raw: bytes) -> bool:
    """llama.vim fills its timings line only when every flattened `timings/...` key it asked for is there."""
    response = json.loads(raw)
    return all(f"timings/{name}" in response for name in _VIM_TIMINGS)


def llama_vscode_lines(raw: bytes) -> list[str] | None:
    """What llama.vscode reads (axios' parsed body as its LlamaResponse): an object whose
    `content` is a string; `tokens_cached` a number, `truncated` a boolean, `timings`'
    fields numbers where present."""
    response: Any = json.loads(raw)
    if not isinstance(response, dict) or not isinstance(response.get("content"), str):
        return None
    if not isinstance(response.get("tokens_cached", 0), int) or not isinstance(response.get("truncated", False), bool):
        return None
    timings = response.get("timings", {})
    if not isinstance(timings, dict) or not all(isinstance(value, (int, float)) for value in timings.values()):
        return None
    return response["content"].split("\n")

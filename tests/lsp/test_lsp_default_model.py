"""The whole pipeline (trimming, checks, ranking) behind `kspec lsp` with the real default model."""

from __future__ import annotations

import pytest
from lsp_harness import editor_session

SOURCE = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n    return \n'


@pytest.mark.slow
async def test_default_model_completes_python() -> None:
    options = {"k": 2, "maxTokens": 12, "debounceMs": 0, "deadlineMs": 20000}  # no "model": the default one
    async with editor_session(options, real_default=True) as editor:
        ready = await editor.ready()
        assert ready["model"].startswith("qwen2.5-coder-0.5b")  # a real code model, no setting needed
        uri = "file:///work/fib.py"
        editor.open(uri, SOURCE)
        items = await editor.inline(uri, 4, 11, timeout=90)
        assert items, "the default model suggested nothing after 'return '"
        for item in items:
            assert item.insert_text.strip() and "\n    return" not in item.insert_text
            assert item.range is not None and (item.range.start.line, item.range.start.character) == (4, 11)
        assert editor.statuses[-1]["latencyMs"] > 0

"""Context beyond the window end to end (`kspec lsp`, a small random model): what went in is told
in `$/kspec/status` (`context`: files, characters, tokens), and it comes only from the cursor's
workspace folder: never from another client of the same shared daemon, nor from another
workspace folder of the same client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lsp_harness import FAST, Editor, editor_session

pytestmark = pytest.mark.asyncio
DAEMON = ("--engine", "daemon", "--engine-idle-timeout", "60")
MAIN = "from . import nodes\n\n\ndef parse(stream):\n    token = stream.current\n    return nodes.\n"
CURSOR = (5, len("    return nodes."))


def workspace(root: Path, tag: str) -> dict[str, str]:
    """A package whose main.py imports nodes.py, and an open module sharing main.py's names."""
    package = root / "pkg"
    package.mkdir(parents=True)
    files = {
        "__init__.py": "",
        "nodes.py": f"class {tag.capitalize()}Node:\n    def render_{tag}(self, stream): ...\n",
        "main.py": MAIN,
        f"open_{tag}.py": f"def parse_stream_{tag}(stream, token):\n    return stream.current, token\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    return {name: (package / name).as_uri() for name in files}


async def context_after(editor: Editor, uri: str) -> dict[str, Any]:
    """The `context` of the status told after an inline request at main.py's cursor (a late status
    of a request for another document, which a loaded machine may send after this one began, is not it)."""
    seen = len(editor.statuses)
    await editor.inline(uri, *CURSOR)

    def told(status: dict[str, Any]) -> bool:
        return status.get("state") == "ready" and status.get("activity") == "idle" and (status.get("context") or {}).get("document") == uri

    return (await editor.wait_status(told, after=seen))["context"]


def open_all(editor: Editor, uris: dict[str, str], folder: Path) -> None:
    for name in ("nodes.py", *[n for n in uris if n.startswith("open_")], "main.py"):
        editor.open(uris[name], (folder / "pkg" / name).read_text())


async def test_two_clients_of_one_daemon_see_only_their_own_folder(model_dir: Path, runtime_dir: Path, tmp_path: Path) -> None:
    alpha, beta = tmp_path / "alpha", tmp_path / "beta"
    uris_a, uris_b = workspace(alpha, "alpha"), workspace(beta, "beta")
    options = {"model": str(model_dir), **FAST}
    async with (
        editor_session(options, args=DAEMON, runtime_dir=runtime_dir, folders=(alpha,)) as first,
        editor_session(options, args=DAEMON, runtime_dir=runtime_dir, folders=(beta,)) as second,
    ):
        assert (await first.ready())["enginePid"] == (await second.ready())["enginePid"]  # one shared daemon
        open_all(first, uris_a, alpha)
        open_all(second, uris_b, beta)
        seen_a = await context_after(first, uris_a["main.py"])
        seen_b = await context_after(second, uris_b["main.py"])
        assert set(seen_a["files"]) == {"pkg/open_alpha.py", "pkg/nodes.py"} and seen_a["tokens"] > 0
        assert set(seen_b["files"]) == {"pkg/open_beta.py", "pkg/nodes.py"} and seen_b["tokens"] > 0
        assert seen_a["modules"] == seen_b["modules"] == ["nodes"]  # `nodes.` at the cursor: its names went with the request
        # switched off: nothing goes in
        second.configure({**options, "contextFiles": False})
        off = await context_after(second, uris_b["main.py"])
        assert off["files"] == [] and off["tokens"] == 0 and off["modules"] == []


async def test_one_client_two_folders_keeps_them_apart(model_dir: Path, tmp_path: Path) -> None:
    alpha, beta = tmp_path / "alpha", tmp_path / "beta"
    uris_a, uris_b = workspace(alpha, "alpha"), workspace(beta, "beta")
    async with editor_session({"model": str(model_dir), **FAST}, folders=(alpha, beta)) as editor:
        await editor.ready()
        open_all(editor, uris_a, alpha)
        open_all(editor, uris_b, beta)
        assert set((await context_after(editor, uris_a["main.py"]))["files"]) == {"pkg/open_alpha.py", "pkg/nodes.py"}
        assert set((await context_after(editor, uris_b["main.py"]))["files"]) == {"pkg/open_beta.py", "pkg/nodes.py"}


async def test_the_next_keystroke_takes_the_context_from_the_prefix_cache(model_dir: Path, tmp_path: Path) -> None:
    """`prompt` in the status: after a keystroke at the cursor, the prompt (the other files'
    context before the file's own text) comes from the prefix cache but for its last tokens."""
    uris = workspace(tmp_path, "alpha")
    async with editor_session({"model": str(model_dir), **FAST, "typeahead": False}, folders=(tmp_path,)) as editor:
        await editor.ready()
        open_all(editor, uris, tmp_path)
        context = await context_after(editor, uris["main.py"])
        assert context["tokens"] > 0
        editor.edit(uris["main.py"], CURSOR, CURSOR, "N")
        seen = len(editor.statuses)
        await editor.inline(uris["main.py"], CURSOR[0], CURSOR[1] + 1)
        status = await editor.wait_status(lambda s: s.get("state") == "ready" and s.get("activity") == "idle" and s.get("prompt"), after=seen)
        prompt = status["prompt"]
        assert prompt["tokens"] > status["context"]["tokens"] > 0 and prompt["prefillMs"] >= 0
        assert prompt["reusedTokens"] >= prompt["tokens"] - 4, prompt

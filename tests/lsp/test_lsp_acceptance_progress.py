"""Acceptance telemetry and loading progress, through the real `kspec lsp` process: each
inline item carries the `kspec.accepted` command (rank, language, length; no text); running
it (as VS Code does on accept, and the Neovim plugin on a full or partial accept) is
counted by rank and language in `kspec/stats` and `$/kspec/status`. Loading the model is
reported as standard work-done progress ($/progress begin ... end)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lsp_harness import FAST, editor_session
from lsprotocol import types as lsp

from kspec.lsp_server.accept_stats import ACCEPT_COMMAND

TEXT = "def add(a, b):\n    return "


async def test_items_carry_the_accept_command_and_acceptance_is_counted(model_dir: Path) -> None:
    async with editor_session({"model": str(model_dir), **FAST}) as editor:
        commands = editor.initialize_result.capabilities.execute_command_provider
        assert commands is not None and ACCEPT_COMMAND in commands.commands
        await editor.ready()
        editor.open("file:///w/a.py", TEXT)
        items = await editor.inline("file:///w/a.py", 1, 11)
        assert items
        for rank, item in enumerate(items):
            assert item.command is not None and item.command.command == ACCEPT_COMMAND
            (argument,) = item.command.arguments
            assert argument == {"rank": rank, "language": "python", "length": len(item.insert_text)}  # no text
        run = editor.client.workspace_execute_command_async
        first = items[0].command
        await asyncio.wait_for(run(lsp.ExecuteCommandParams(command=first.command, arguments=first.arguments)), 10)
        partial = {**items[-1].command.arguments[0], "accepted": 1}
        if partial["length"] > 1:
            await asyncio.wait_for(run(lsp.ExecuteCommandParams(command=ACCEPT_COMMAND, arguments=[partial])), 10)
        stats = (await editor.stats())["acceptance"]
        assert stats["shown"] == len(items) and stats["accepted"] == 1
        assert stats["by_rank"][0]["rank"] == 0 and stats["by_rank"][0]["accepted"] == 1
        assert [r["shown"] for r in stats["by_rank"]] == [1] * len(items) and stats["by_language"]["python"]["shown"] == len(items)
        assert stats["partial"] == (1 if partial["length"] > 1 else 0)
        counted = {"accepted": 1, "partial": stats["partial"]}
        status = await editor.wait_status(lambda s: {k: s.get("acceptance", {}).get(k) for k in counted} == counted)
        assert status["acceptance"]["rate"] == round((1 + stats["partial"]) / len(items), 4)


async def test_loading_is_standard_work_done_progress(model_dir: Path) -> None:
    async with editor_session({"model": str(model_dir), **FAST}) as editor:
        await editor.ready()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        # begin goes out once the client answered the token's create request, maybe after "ready"
        while not (reports := [r for r in editor.client.progress_reports.values() if r]) or not isinstance(reports[0][-1], lsp.WorkDoneProgressEnd):
            assert loop.time() < deadline, f"no finished progress: {editor.client.progress_reports}"
            await asyncio.sleep(0.01)  # a poll of what the client received, not a wait for time to pass
        (report,) = reports
        assert isinstance(report[0], lsp.WorkDoneProgressBegin) and report[0].title.startswith("kspec")
        assert all(isinstance(r, lsp.WorkDoneProgressReport) for r in report[1:-1])

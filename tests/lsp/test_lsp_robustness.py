"""`kspec lsp` against hostile or sloppy input, end to end: deep nesting, broken
framing, notifications that must not pile up, and settings changes while requests wait."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lsp_harness import FAST, editor_session, tcp_server
from lsprotocol import types as lsp
from raw_rpc import RawServer, encode, frame

INPROCESS = ("--engine", "inprocess")
# No model (and no torch) where none is needed: an OpenAI-compatible engine nobody serves;
# requests that reach it answer an empty list.
NO_MODEL = ("--engine-url", "http://127.0.0.1:9/v1")
DEEP = b"[" * 100_000


async def test_deep_nesting_is_a_parse_error_even_before_initialize(tmp_path: Path) -> None:
    server = await RawServer.start(tmp_path / "stderr.log", *NO_MODEL)
    try:
        server.write(DEEP)  # json.loads raises RecursionError on this: it used to end the process
        server.write(b'{"jsonrpc": "2.0", "id": 7, "method": "kspec/stats", "params": ' + DEEP)
        answer = await server.answer(7)
        assert answer["error"]["code"] == -32700 and "nested" in answer["error"]["message"]
        await server.initialize(FAST)
        assert any(e["error"]["code"] == -32700 for e in server.unnamed_errors)
        assert "result" in await server.request(8, "kspec/stats")
        assert await server.close() == 0
    finally:
        if server.process.returncode is None:
            server.process.kill()


async def test_framing_errors_cost_only_the_messages_they_touch(tmp_path: Path) -> None:
    server = await RawServer.start(tmp_path / "stderr.log", *NO_MODEL)
    try:
        await server.initialize(FAST)

        def stats(name: str) -> bytes:
            return encode({"jsonrpc": "2.0", "id": name, "method": "kspec/stats"})

        broken = {
            "one byte short": frame(stats("one byte short"), len(stats("one byte short")) - 1),
            "one byte long": frame(stats("one byte long"), len(stats("one byte long")) + 1),
            "forty bytes long": frame(stats("forty bytes long"), len(stats("forty bytes long")) + 40),
            "negative": b"Content-Length: -5\r\n\r\n" + stats("negative"),
            "not a number": b"Content-Length: twelve\r\n\r\n" + stats("not a number"),
            "10^12": frame(stats("10^12"), 10**12),
            "5000 digits": b"Content-Length: 1" + b"0" * 5000 + b"\r\n\r\n" + stats("5000 digits"),
            "unframed bytes": b"garbage without a newline",
            "an endless header line": b"x" * 50_000,
            "no header at all": b"\r\n" + stats("no header at all"),
        }
        for number, (name, data) in enumerate(broken.items()):
            server.write_bytes(data)
            answer = await server.request(number, "kspec/stats", timeout=20)  # the next valid request is answered
            assert "result" in answer, (name, answer)
        # What the broken messages themselves got: an answer wherever their id could be found.
        assert server.answers["one byte short"]["error"]["code"] == -32700
        assert "result" in server.answers["one byte long"] and "result" in server.answers["forty bytes long"]
        assert server.answers["10^12"]["error"]["code"] == -32600 and server.answers["5000 digits"]["error"]["code"] == -32600

        assert await server.close() == 0
    finally:
        if server.process.returncode is None:
            server.process.kill()


async def test_wrong_types_are_invalid_params_with_one_log_line(tmp_path: Path) -> None:
    server = await RawServer.start(tmp_path / "stderr.log", *NO_MODEL)
    try:
        await server.initialize(FAST)
        uri = "file:///work/types.py"
        server.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": "x = 1\ny = 2\n"}})
        for number, position in enumerate(({"line": 1.5, "character": 0}, {"line": "1", "character": 0}, {"line": True, "character": 0})):
            params = {"textDocument": {"uri": uri}, "position": position, "context": {"triggerKind": 1}}
            answer = await server.request(number, "textDocument/inlineCompletion", params)
            assert answer["error"]["code"] == -32602, (position, answer)
        params = {"textDocument": {"uri": uri}, "position": {"line": 99, "character": 0}, "context": {"triggerKind": 1}}
        answer = await server.request("outside", "textDocument/inlineCompletion", params)  # raised inside the handler
        assert answer["error"]["code"] == -32602 and "outside the document" in answer["error"]["message"]
        assert not [n for n in server.notifications if n["method"] == "window/showMessage" and "Error in server" in n["params"]["message"]]
        assert await server.close() == 0
        log = server.stderr()
        assert "Traceback" not in log
        assert log.count("outside the document") == 1
    finally:
        if server.process.returncode is None:
            server.process.kill()


async def test_document_notifications_leave_nothing_behind() -> None:
    """pygls kept each generator/async notification handler's future for good (~1.9 KB each)."""
    async with editor_session(FAST, args=NO_MODEL) as editor:
        for index in range(200):
            uri = f"file:///work/n{index % 7}.py"
            editor.open(uri, "a = 1\n")
            editor.edit(uri, (0, 5), (0, 5), "2")
            editor.client.text_document_did_close(lsp.DidCloseTextDocumentParams(lsp.TextDocumentIdentifier(uri)))
            editor.client.text_document_did_change(  # a document that was never opened
                lsp.DidChangeTextDocumentParams(
                    lsp.VersionedTextDocumentIdentifier(uri="file:///work/never.py", version=index),
                    [lsp.TextDocumentContentChangeWholeDocument(text="b = 2\n")],
                )
            )
        editor.configure(FAST)  # an async handler
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while (stats := await editor.stats())["handlers"] != 0:  # each handler's entry goes when it ends
            assert loop.time() < deadline, stats
        assert stats["documents"] == 0


async def test_engine_switches_while_requests_wait_leave_one_engine(model_dir: Path, tmp_path: Path) -> None:
    from model_factory import write_random_model

    other = write_random_model(tmp_path / "other", "llama", seed=1)
    models = [str(model_dir), str(other)]
    settings = {**FAST, "maxTokens": 256, "firstAnswerMs": 0}  # long requests, one answer: the engine is busy when the setting changes
    async with editor_session({"model": models[0], **settings}, args=INPROCESS) as editor:
        await editor.ready()
        loop = asyncio.get_running_loop()
        for switch in range(1, 4):
            # Requests with the engine, then a setting that selects another one: the worker
            # used to forget that stop() came while it was busy, and wait for work for good.
            uris = [f"file:///work/switch{switch}-{index}.py" for index in range(3)]  # new documents: no typeahead answer
            for uri in uris:
                editor.open(uri, "def f(x):\n    return ")
            calls = (await editor.stats())["engine_calls"]
            requests = [asyncio.ensure_future(editor.inline(uri, 1, 11)) for uri in uris]
            deadline = loop.time() + 30
            while (await editor.stats())["engine_calls"] < calls + len(uris):
                assert loop.time() < deadline
            seen = len(editor.statuses)
            editor.configure({"model": models[switch % 2], **settings})
            await asyncio.wait_for(asyncio.gather(*requests, return_exceptions=True), 60)
            await editor.wait_status(lambda s: s["state"] == "ready", after=seen)
        deadline = loop.time() + 30
        while (stats := await editor.stats())["engine_threads"] != 1:  # the retired engines' workers end
            assert loop.time() < deadline, stats
        assert await editor.inline(uris[0], 1, 11)


async def test_a_network_engine_names_where_text_goes() -> None:
    """Issue 15: `engine: "openai"` + `engineUrl` sends documents (and $OPENAI_API_KEY) off the machine: say where, once."""
    async with editor_session({**FAST, "engine": "openai", "engineUrl": "http://127.0.0.1:9/v1"}, args=()) as editor:
        (notice,) = await editor.wait_message("completions send")
        assert "127.0.0.1:9" in notice and "openai" in notice


# Not loopback by its address (so the rule applies), yet a connection to it stays on this machine.
OFF_MACHINE_IN_CLEAR = "http://0.0.0.0:9/v1"


async def test_plain_http_off_the_machine_is_refused_unless_the_user_allows_it() -> None:
    """Issue 43: a workspace's server args or settings could send code and $OPENAI_API_KEY
    to any host over plain http. The server refuses such a URL (nothing is sent) unless
    allowInsecureRemote (user settings only, in the editors) says otherwise."""
    async with editor_session({**FAST, "engine": "openai", "engineUrl": OFF_MACHINE_IN_CLEAR}, args=()) as editor:
        (refusal,) = await editor.wait_message("unencrypted")
        assert "allowInsecureRemote" in refusal and "https://" in refusal
        assert not editor.messages("completions send")
        editor.open("file:///work/secret.py", "DB_PASSWORD = 'x'\n")
        assert await editor.inline("file:///work/secret.py", 1, 0) == []
        editor.configure({**FAST, "engine": "openai", "engineUrl": OFF_MACHINE_IN_CLEAR, "allowInsecureRemote": True})
        (notice,) = await editor.wait_message("completions send")
        assert "0.0.0.0:9" in notice
    async with editor_session(FAST, args=("--engine-url", OFF_MACHINE_IN_CLEAR)) as editor:  # the server's own arguments too
        await editor.wait_message("unencrypted")
        assert not editor.messages("completions send")
    async with editor_session(FAST, args=("--engine-url", OFF_MACHINE_IN_CLEAR, "--allow-insecure-remote")) as editor:
        await editor.wait_message("completions send")


async def _initialize(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str) -> bytes:
    options = {**FAST, "lspToken": token}
    writer.write(encode_frame({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}, "initializationOptions": options}}))
    await writer.drain()
    return await asyncio.wait_for(reader.readuntil(b"}}"), 60)  # the start of the answer is enough


def encode_frame(message: dict) -> bytes:
    return frame(encode(message))


async def test_tcp_squatters_never_keep_the_client_out(tmp_path: Path) -> None:
    """Issue 43: `--tcp` had one slot and no deadline: a silent local connection kept the
    editor out, and a refused client made the server exit. Now a silent connection is
    closed at the token deadline, a wrong token is answered and closed, and the client
    is served with 50 silent connections open."""
    process, host, port, token = await tcp_server(tmp_path, "--token-deadline", "3", *NO_MODEL)
    opened: list[asyncio.StreamWriter] = []
    try:
        reader, writer = await asyncio.open_connection(host, port)
        opened.append(writer)
        assert await asyncio.wait_for(reader.read(), 30) == b""  # silent: closed at the deadline, the server lives
        assert process.returncode is None

        reader, writer = await asyncio.open_connection(host, port)
        opened.append(writer)
        assert b"-32001" in await _initialize(reader, writer, "wrong")
        await asyncio.wait_for(reader.read(), 30)  # closed after the answer
        assert process.returncode is None

        silent = [await asyncio.open_connection(host, port) for _ in range(50)]
        opened += [w for _, w in silent]
        reader, writer = await asyncio.open_connection(host, port)
        opened.append(writer)
        reply = await _initialize(reader, writer, token)
        assert b'"result"' in reply and b"capabilities" in reply, reply[:200]
        for silent_reader, _ in silent:  # the others are let go once the client is in
            assert await asyncio.wait_for(silent_reader.read(), 30) == b""
        writer.write(encode_frame({"jsonrpc": "2.0", "id": 2, "method": "shutdown"}) + encode_frame({"jsonrpc": "2.0", "method": "exit"}))
        await writer.drain()
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        for each in opened:
            each.close()
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_client_mistakes_log_one_line_each(tmp_path: Path) -> None:
    """Issue 43: a "response" reusing the id of the client's own request in flight logged
    `RuntimeError: Task does not support set_result`; pygls' lines with hidden arguments
    printed a literal `%s`."""
    server = await RawServer.start(tmp_path / "stderr.log", *NO_MODEL)
    try:
        await server.initialize({**FAST, "debounceMs": 1500})  # an automatic request waits in its debounce
        uri = "file:///work/mistakes.py"
        server.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": "x = 1\n"}})
        server.send(7, "textDocument/inlineCompletion", {"textDocument": {"uri": uri}, "position": {"line": 1, "character": 0}, "context": {"triggerKind": 2}})
        server.write(encode({"jsonrpc": "2.0", "id": 7, "result": None}))  # the client's own id, as a response
        server.write(encode({"jsonrpc": "2.0", "id": "never-sent", "result": None}))  # an id the server never used
        answer = await server.answer(7)
        assert answer["result"] == {"items": []}, answer  # the request went on
        assert await server.close() == 0
        log = server.stderr()
        assert "Traceback" not in log and "does not support" not in log, log
        assert log.count("ignoring a response with id 7") == 1, log
        assert "arguments hidden" in log and "%s" not in log, log
    finally:
        if server.process.returncode is None:
            server.process.kill()


def _status_frame(settings: dict) -> bytes:
    return frame(encode({"jsonrpc": "2.0", "method": "workspace/didChangeConfiguration", "params": {"settings": {"kspec": settings}}}))


async def test_switching_to_the_daemon_and_back_around_a_completion_is_no_internal_error(model_dir: Path, tmp_path: Path) -> None:
    """Issue 43: `engine: daemon` and back before the daemon client began connecting, a
    completion in between: `assert self._connecting is not None` answered -32603 (three
    in a row: three). One write each time, so the server reads the three messages together."""
    server = await RawServer.start(tmp_path / "stderr.log", "--engine-idle-timeout", "1")
    try:
        inprocess = {"model": str(model_dir), **FAST, "engine": "inprocess"}
        await server.initialize(inprocess)
        await server.wait_ready()
        uri = "file:///work/race.py"
        server.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": "def f(x):\n    return "}})
        for attempt in range(3):
            inline = {"jsonrpc": "2.0", "id": f"race{attempt}", "method": "textDocument/inlineCompletion",
                      "params": {"textDocument": {"uri": uri}, "position": {"line": 1, "character": 11}, "context": {"triggerKind": 1}}}  # fmt: skip
            server.write_bytes(_status_frame({**inprocess, "engine": "daemon"}) + frame(encode(inline)) + _status_frame(inprocess))
            answer = await server.answer(f"race{attempt}")
            assert "result" in answer, answer  # was {"error": {"code": -32603, "message": "AssertionError..."}}
        assert await server.close() == 0
        assert "AssertionError" not in server.stderr() and "Traceback" not in server.stderr()
    finally:
        if server.process.returncode is None:
            server.process.kill()
            await server.process.wait()


def _memory_kb(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (the peak so far) of a process, in kB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


async def test_a_storm_of_model_changes_loads_one_model_and_answers_with_the_last(model_dir: Path, tmp_path: Path) -> None:
    """Issue 43: 20 model changes 100 ms apart took the server from 348 MB to 2,579 MB and
    25 threads (each replaced engine still loaded). Now one engine loads at a time, the
    replaced loads are abandoned: the peak stays within 20 % of one load's, and the
    last model chosen answers."""
    from model_factory import write_random_model

    models = [str(model_dir), str(write_random_model(tmp_path / "storm-a", "llama", seed=1)), str(write_random_model(tmp_path / "storm-b", "llama", seed=2))]
    settings = {**FAST, "engine": "inprocess"}
    async with editor_session({"model": models[0], **settings}, args=()) as editor:
        await editor.ready()
        pid = (await editor.wait_status(lambda s: "serverPid" in s))["serverPid"]
        for model in models[1:] + models[:1]:  # each model loaded once (its cache files written) before the storm
            seen = len(editor.statuses)
            editor.configure({"model": model, **settings})
            await editor.wait_status(lambda s: s["state"] == "ready" and s["model"] == Path(model).name, after=seen)
        one_load = _memory_kb(pid)["VmHWM"]
        loop = asyncio.get_running_loop()
        started = loop.time()
        for change in range(1, 21):
            editor.configure({"model": models[change % 3], **settings})
            await editor.stats()  # a round trip: the change is handled, its load may begin, before the next one
        storm_s = loop.time() - started
        last = Path(models[20 % 3]).name
        seen = len(editor.statuses)
        uri = "file:///work/storm.py"
        editor.open(uri, "def f(x):\n    return ")
        assert await editor.inline(uri, 1, 11)
        assert editor.statuses[-1]["model"] == last, editor.statuses[seen:]  # the answer's model
        assert all(s["model"] in (last, "default") or s["state"] != "ready" for s in editor.statuses[seen:]), editor.statuses[seen:]
        peak = _memory_kb(pid)["VmHWM"]
        print(f"STORM one_load={one_load/1024:.0f}MB peak={peak/1024:.0f}MB storm_s={storm_s:.2f}")
        assert peak <= one_load * 1.2, f"peak {peak / 1024:.0f} MB after 20 changes in {storm_s:.1f} s; one load peaked at {one_load / 1024:.0f} MB"
        deadline = loop.time() + 30
        while (stats := await editor.stats())["engine_threads"] != 1:  # the replaced engines' workers end
            assert loop.time() < deadline, stats

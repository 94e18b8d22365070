"""One keystroke's path, measured: a `textDocument/inlineCompletion` on a cache miss through a real
`kspec lsp` and the engine daemon it starts, with a profiler in both processes
(tests/lsp/keystroke_trace/sitecustomize.py: test code, loaded through PYTHONPATH; the product has no hook).

Counted for that request only (from just before it is sent to its answer), and written to
test-artifacts/keystroke-path.json with the lists behind each count:

- `transfers`: calls from a function of one repository file into a function of another whose
  arguments or return value carry the request (its document's text, marked) or its answer's text,
  distinct (caller, callee) pairs: the hand-offs on the request's way down and its answer's way up.
  The model's forward pass (token ids and tensors) carries neither, and is not counted;
- `files`: the repository files whose code ran for it, in either process, the model's included;
- `queues`: the queues the request's data was put in to wait for a consumer (asyncio.Queue,
  queue.SimpleQueue, collections.deque, Condition waits), by the repository function that put it;
- `crossings`: the thread and process boundaries its data crossed (distinct directed pairs);
- `result_shapes`: the types that directly hold an answer's text on its way from the engine to the
  LSP items (a bare `str` handed on is no shape).

The goals (issue 55) are asserted where they are met; where not, the measured count is a named
ceiling that fails if the path grows. README.md's "How a request flows" shows the counts between
`<!-- keystroke-path -->` markers, and this test checks they are the measured ones.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

from lsp_harness import FAST, REPO, editor_session

TRACE = Path(__file__).resolve().parent / "keystroke_trace"
ARTIFACT = REPO / "test-artifacts" / "keystroke-path.json"
README = REPO / "README.md"
MARKER = "keystroke_path_probe_7f3a"  # only the measured request's document holds it
DAEMON = ("--engine", "daemon", "--engine-idle-timeout", "60")

GOALS = {"transfers": 20, "files": 40, "queues": 1, "result_shapes": 4}  # issue 55
# Goals not reached yet: the measured counts, as ceilings a longer path fails (docs/keystroke-path.md)
CEILINGS = {
    "transfers": 37,  # goal 20: not reached
    "files": 66,  # goal 40: not reached
    "crossings": 5,  # no goal: 3 down (reader thread, socket, engine thread), 2 up
}
BEGIN, END = "<!-- keystroke-path -->", "<!-- /keystroke-path -->"


def _is_answer(text: str, answers: list[str]) -> bool:
    """`text` is one of the answer's texts on its way: the text itself, the untrimmed text it was cut
    from, or (while a branch grows) a start of it at least 4 characters long."""
    return any(text == answer or text.startswith(answer) or (answer.startswith(text) and len(text.strip()) >= 4) for answer in answers)


def measure(traces: list[dict[str, Any]], answers: list[str]) -> dict[str, Any]:
    events = sorted((event for trace in traces for event in trace["events"]), key=lambda event: event["t"])
    errors = [event["error"] for event in events if event["kind"] == "recorder-error"]
    assert not errors, f"the recorder failed: {errors[:3]}"
    for event in events:
        event["answer"] = [(holder, text) for holder, text in event["texts"] if _is_answer(text, answers)]
    carrying = [event for event in events if event["request"] or event["answer"]]

    transfers: list[str] = []
    for event in carrying:
        if event["kind"] not in ("call", "return") or event["caller"] is None:
            continue
        if event["kind"] == "return" and not event["answer"]:
            continue  # a return carries the answer back up; the request goes down in arguments
        caller, callee = event["caller"], event["callee"]
        if caller.split(":")[0] != callee.split(":")[0] and f"{caller} -> {callee}" not in transfers:
            transfers.append(f"{caller} -> {callee}")

    queues: list[str] = []
    for event in carrying:
        if event["kind"] == "queue" and event["taken"] and f"{event['queue']} at {event['site']}" not in queues:
            queues.append(f"{event['queue']} at {event['site']}")

    crossings: list[str] = []
    previous = None
    for event in carrying:
        where = f"{event['process']}/{event['thread']}"
        if previous is not None and where != previous and f"{previous} -> {where}" not in crossings:
            crossings.append(f"{previous} -> {where}")
        previous = where

    shapes: list[str] = []
    for event in carrying:
        for holder, _ in event["answer"]:
            if holder != "arguments" and not any(shape.startswith(f"{holder} ") for shape in shapes):
                shapes.append(f"{holder} (first in {event.get('callee') or event.get('site')}, {event['kind']})")

    files = sorted({file for trace in traces for file in trace["files"]})
    return {
        "transfers": len(transfers), "files": len(files), "queues": len(queues), "crossings": len(crossings),
        "result_shapes": len(shapes),
        "lists": {"transfers": transfers, "files": files, "queues": queues, "crossings": crossings, "result_shapes": shapes},
        "answers": answers,
    }  # fmt: skip


async def _traced_keystroke(model_dir: Path, runtime_dir: Path, out: Path) -> tuple[list[dict[str, Any]], list[str]]:
    arm = out / "armed"
    env = {
        "PYTHONPATH": f"{TRACE}:{REPO}", "KSPEC_TRACE_ARM": str(arm), "KSPEC_TRACE_OUT": str(out),
        "KSPEC_TRACE_MARKER": MARKER, "KSPEC_TRACE_ROOT": str(REPO),
    }  # fmt: skip
    options = {"model": str(model_dir), **FAST}
    async with editor_session(options, args=DAEMON, runtime_dir=runtime_dir, updates=False, env=env) as editor:
        await editor.ready()
        warm = "file:///work/warm.py"  # a first request pays for what is loaded lazily; the measured one does not
        editor.open(warm, "def warm_up(a, b):\n    ")
        assert await editor.inline(warm, 1, 4)
        uri = f"file:///work/{MARKER}.py"  # the request's own message carries the marker too (its uri)
        editor.open(uri, "def total(items):\n    count = 0\n    for item in items:\n        ")
        await editor.stats()  # the document is in before the recording starts
        arm.touch()
        await asyncio.sleep(0.05)  # the recorders poll the arm file every 5 ms
        items = await editor.inline(uri, 3, 8)
        arm.unlink()
        deadline = time.monotonic() + 30
        while len(traces := sorted(out.glob("trace-*.json"))) < 2:
            assert time.monotonic() < deadline, f"traces written: {traces}"
            await asyncio.sleep(0.05)  # a poll for the processes' files
    answers = [item.insert_text for item in items if isinstance(item.insert_text, str) and item.insert_text]
    assert answers, "the measured request got no answer"
    return [json.loads(path.read_text()) for path in traces], answers


async def test_a_keystrokes_path_is_counted(model_dir: Path, runtime_dir: Path, tmp_path: Path) -> None:
    traces, answers = await _traced_keystroke(model_dir, runtime_dir, tmp_path)
    assert sorted(trace["process"] for trace in traces) == ["engine", "lsp"]
    measured = measure(traces, answers)
    ARTIFACT.parent.mkdir(exist_ok=True)
    ARTIFACT.write_text(json.dumps(measured, indent=1) + "\n")
    counts = {name: measured[name] for name in ("transfers", "files", "queues", "crossings", "result_shapes")}
    print(json.dumps(counts))
    assert readme_counts() == counts, f"README.md's counts between {BEGIN} and {END} are not the measured ones: {counts}"
    for name, goal in GOALS.items():
        assert measured[name] <= CEILINGS.get(name, goal), f"{name}: {measured[name]} > {CEILINGS.get(name, goal)}: {measured['lists'][name]}"
    assert measured["crossings"] <= CEILINGS["crossings"], measured["lists"]["crossings"]


def readme_counts() -> dict[str, int]:
    """The counts README.md's "How a request flows" states between the markers, e.g. `transfers: 40`."""
    text = README.read_text()
    assert BEGIN in text and END in text, f"README.md has no {BEGIN} section"
    section = text[text.index(BEGIN) : text.index(END)]
    return {name: int(value) for name, value in re.findall(r"\*\*(transfers|files|queues|crossings|result_shapes)\*\*:? (\d+)", section)}


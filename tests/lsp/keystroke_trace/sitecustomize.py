"""A profiler for tests/lsp/test_keystroke_path.py, loaded by Python at start-up (`sitecustomize`) in
every process started with this folder first on PYTHONPATH: the test's `kspec lsp` and the engine
daemon it spawns (which inherits the environment). Nothing of it is product code.

With KSPEC_TRACE_ARM (a file path) set, `sys.setprofile` / `threading.setprofile` install a
recorder that does nothing until that file exists, then, while it exists, notes for the code under
KSPEC_TRACE_ROOT (the repository: cli/, lsp_server/, engine/, kernels/, bench/):

- every call into it (its file, function, the nearest repository frame that called it: across
  pygls' and asyncio's frames, and from a task or a loop callback to the frame that created it);
- what the call's arguments (without `self`) and its return value carry, walked a few levels deep:
  the request (a text or bytes containing KSPEC_TRACE_MARKER, which only the request's document
  holds) and short texts with the type of the value that holds each one directly (the test
  matches them against the answer's texts afterwards: the shapes the result is carried in);
- each put of a value carrying the request into a queue (asyncio.Queue, queue.SimpleQueue,
  collections.deque) and each Condition wait of a frame holding it, with the repository frame that
  did it, and whether anything was taken from that queue meanwhile (a history such as a bounded
  deque of recent places is put into but never waited on).

When the file is removed it writes what it noted to KSPEC_TRACE_OUT/trace-<pid>.json.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import queue
import sys
import threading
import time

_ARM = os.environ.get("KSPEC_TRACE_ARM")
_OUT = os.environ.get("KSPEC_TRACE_OUT", "")
_MARKER = os.environ.get("KSPEC_TRACE_MARKER", "")
_ROOT = os.environ.get("KSPEC_TRACE_ROOT", "")
_FOLDERS = ("cli", "lsp_server", "engine", "kernels", "bench")
_BOUNDARY = (os.sep + "asyncio" + os.sep, os.sep + "threading.py", os.sep + "concurrent" + os.sep)
_DEPTH, _BREADTH, _SHORTEST, _LONGEST = 4, 64, 3, 4000


class _Recorder:
    def __init__(self) -> None:
        self.armed = False
        self.events: list[dict] = []
        self.taken: set[int] = set()  # ids of the queues something was taken from (a waiting queue has a consumer)
        self.files: set[str] = set()
        self.code: dict[object, str | None] = {}
        self.created: dict[int, str] = {}  # id(frame of a coroutine handed to a task) -> the repository frame that created it
        self.scheduled: dict[object, str] = {}  # code of a callback handed to a loop -> the repository frame that handed it
        self.marker_bytes = _MARKER.encode()
        self.role = "engine" if "engine" in sys.argv[1:3] else "lsp" if "lsp" in sys.argv[1:3] else "other"

    # --- where code is --------------------------------------------------------------

    def repo(self, code: object) -> str | None:
        """`code`'s file relative to the repository, None outside it."""
        try:
            return self.code[code]
        except KeyError:
            pass
        filename = getattr(code, "co_filename", "")
        found = None
        if _ROOT and filename.startswith(_ROOT + os.sep):
            relative = filename[len(_ROOT) + 1 :]
            if relative.split(os.sep, 1)[0] in _FOLDERS:
                found = relative
        self.code[code] = found
        return found

    def name(self, frame) -> str:
        code = frame.f_code
        return f"{self.repo(code)}:{getattr(code, 'co_qualname', code.co_name)}"

    def caller(self, frame) -> str | None:
        """The nearest repository frame that led to `frame`: up its stack, and from the outermost
        frame of a task or loop callback to the repository frame that created it."""
        last = frame
        current = frame.f_back
        while current is not None:
            if self.repo(current.f_code) is not None:
                return self.name(current)
            if any(part in current.f_code.co_filename for part in _BOUNDARY):
                break
            last, current = current, current.f_back
        return self.created.get(id(last)) or self.scheduled.get(last.f_code)

    def site(self, frame) -> str | None:
        """The nearest repository frame at or above `frame`."""
        return self.name(frame) if self.repo(frame.f_code) is not None else self.caller(frame)

    # --- what values carry ----------------------------------------------------------

    def carried(self, values, found: dict) -> dict:
        """found["request"]: the request's marker was seen; found["texts"]: {(holder type, text)}."""
        seen: set[int] = set()
        stack = [(value, "arguments", 0) for value in values]  # a value handed on as it is has no holder
        while stack:
            value, holder, depth = stack.pop()
            kind = type(value)
            if kind is str:
                if _MARKER in value:
                    found["request"] = True
                elif _SHORTEST <= len(value) <= _LONGEST and value.strip():
                    found["texts"].add((holder, value))
                continue
            if kind in (bytes, bytearray, memoryview):
                if self.marker_bytes in bytes(value):
                    found["request"] = True
                continue
            if depth >= _DEPTH or id(value) in seen or kind in (int, float, bool, type(None)):
                continue
            seen.add(id(value))
            name = kind.__name__
            if isinstance(value, (list, tuple, set, frozenset, collections.deque)):  # named tuples too
                items = list(value)[:_BREADTH]
            elif kind is dict:
                items = [item for pair in list(value.items())[:_BREADTH] for item in pair]
            elif hasattr(kind, "__struct_fields__"):  # msgspec
                items = [getattr(value, field, None) for field in kind.__struct_fields__]
            elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                items = [getattr(value, field.name, None) for field in dataclasses.fields(value)]
            elif hasattr(kind, "__attrs_attrs__"):  # lsprotocol
                items = [getattr(value, attribute.name, None) for attribute in kind.__attrs_attrs__]
            elif kind.__module__.startswith("kspec.") and hasattr(value, "__dict__"):
                items = list(vars(value).values())[:_BREADTH]
            else:
                continue
            stack.extend((item, name, depth + 1) for item in items)
        return found

    def note(self, frame, kind: str, values, **extra) -> None:
        found = self.carried(values, {"request": False, "texts": set()})
        if not found["request"] and not found["texts"]:
            return
        thread = threading.current_thread().name
        self.events.append({
            "t": time.monotonic(), "process": self.role, "thread": thread, "kind": kind,
            "request": found["request"], "texts": sorted(found["texts"]), **extra,
        })  # fmt: skip

    # --- the profile function -------------------------------------------------------

    def __call__(self, frame, event, arg) -> None:
        if not self.armed:
            return
        try:
            if event == "call":
                self.on_call(frame)
            elif event == "return":
                if self.repo(frame.f_code) is not None and arg is not None:
                    values = list(arg) if type(arg) is tuple else [arg]  # several values returned: each as it is
                    self.note(frame, "return", values, callee=self.name(frame), caller=self.caller(frame))
            elif event == "c_call":
                self.on_c_call(frame, arg)
            elif event == "c_return":
                self.on_c_return(frame, arg)
        except Exception as exc:  # the recorder must never change what it records
            self.events.append({"t": time.monotonic(), "kind": "recorder-error", "error": repr(exc)})

    def on_call(self, frame) -> None:
        code = frame.f_code
        where = self.repo(code)
        if where is not None:
            self.files.add(where)
            names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            values = [frame.f_locals.get(name) for name in names if name not in ("self", "cls")]
            self.note(frame, "call", values, callee=self.name(frame), caller=self.caller(frame))
            return
        filename, function = code.co_filename, code.co_name
        if filename.endswith(os.path.join("asyncio", "tasks.py")) and function == "ensure_future" or (
            filename.endswith(os.path.join("asyncio", "base_events.py")) and function == "create_task"
        ):
            coroutine = frame.f_locals.get("coro_or_future", frame.f_locals.get("coro"))
            inner = getattr(coroutine, "cr_frame", None)
            site = self.caller(frame)
            if inner is not None and site is not None:
                self.created[id(inner)] = site
        elif filename.endswith(os.path.join("asyncio", "base_events.py")) and function in ("call_soon", "call_soon_threadsafe", "call_later", "call_at"):
            callback = frame.f_locals.get("callback")
            target = getattr(callback, "__code__", None) or getattr(getattr(callback, "__func__", None), "__code__", None)
            site = self.caller(frame)
            if target is not None and site is not None:
                self.scheduled[target] = site
        elif filename.endswith(os.path.join("asyncio", "queues.py")) and function in ("put_nowait", "get_nowait"):
            owner = id(frame.f_locals.get("self"))
            if function == "get_nowait":
                self.taken.add(owner)
            else:
                self.note(frame, "queue", [frame.f_locals.get("item")], queue="asyncio.Queue", site=self.caller(frame), id=owner)
        elif function == "wait" and type(frame.f_locals.get("self")).__name__ == "Condition":
            site = self.caller(frame)
            holder = frame.f_back
            while holder is not None and self.repo(holder.f_code) is None:
                holder = holder.f_back
            if holder is not None:
                values = [v for k, v in holder.f_locals.items() if k != "self"]
                condition = frame.f_locals["self"]
                self.taken.add(id(condition))  # a wait is its own taking
                self.note(frame, "queue", values, queue=f"{type(condition).__module__}.Condition", site=site, id=id(condition))

    def on_c_call(self, frame, function) -> None:
        owner = getattr(function, "__self__", None)
        if self.repo(frame.f_code) is None or owner is None:
            return
        name = getattr(function, "__name__", "")
        if isinstance(owner, (queue.SimpleQueue, collections.deque)) and name in ("get", "get_nowait", "popleft", "pop"):
            self.taken.add(id(owner))
        elif isinstance(owner, queue.SimpleQueue) and name in ("put", "put_nowait"):
            values = [v for k, v in frame.f_locals.items() if k != "self"]  # the item is not visible here: what the putting frame holds
            self.note(frame, "queue", values, queue="queue.SimpleQueue", site=self.name(frame), id=id(owner))

    def on_c_return(self, frame, function) -> None:
        owner = getattr(function, "__self__", None)
        if self.repo(frame.f_code) is None or not isinstance(owner, collections.deque):
            return
        name = getattr(function, "__name__", "")
        if name in ("append", "appendleft") and owner:
            self.note(frame, "queue", [owner[-1] if name == "append" else owner[0]], queue="collections.deque", site=self.name(frame), id=id(owner))

    # --- arming ----------------------------------------------------------------------

    def watch(self) -> None:
        """Arms while the file exists; writes the trace when it is removed."""
        while True:
            armed = os.path.exists(_ARM)
            if armed and not self.armed:
                self.events, self.files, self.taken = [], set(), set()
                self.armed = True
            elif self.armed and not armed:
                self.armed = False
                self.write()
            time.sleep(0.005)

    def write(self) -> None:
        path = os.path.join(_OUT, f"trace-{os.getpid()}.json")
        for event in self.events:
            if event["kind"] == "queue":
                event["taken"] = event.pop("id") in self.taken
        data = {"process": self.role, "pid": os.getpid(), "files": sorted(self.files), "events": self.events}
        with open(path + ".tmp", "w") as out:
            json.dump(data, out)
        os.replace(path + ".tmp", path)


if _ARM and _MARKER and _ROOT:
    _recorder = _Recorder()
    threading.Thread(target=_recorder.watch, name="kspec-trace-watch", daemon=True).start()
    threading.setprofile(_recorder)
    sys.setprofile(_recorder)

"""A minimal msgpack-RPC client for `nvim --embed` (no pynvim needed: msgpack is a
kspec dependency). Requests block with a deadline; a reader thread collects responses."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import Any, Callable

import msgpack


class NvimError(RuntimeError):
    pass


class Nvim:
    def __init__(self, argv: list[str], cwd: str, env: dict[str, str]):
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._responses: dict[int, tuple[Any, Any]] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._next_id = 0
        self._write_lock = threading.Lock()
        self.stderr = b""
        self.screen: Screen | None = None
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        stdout = self.proc.stdout
        assert stdout is not None
        while True:
            data = os.read(stdout.fileno(), 65536)
            if not data:
                break
            unpacker.feed(data)
            for message in unpacker:
                kind = message[0]
                if kind == 1:  # response: [1, id, error, result]
                    with self._cond:
                        self._responses[message[1]] = (message[2], message[3])
                        self._cond.notify_all()
                elif kind == 0:  # a request from nvim: we serve none
                    self._send([1, message[1], "not supported", None])
                elif kind == 2 and message[1] == "redraw" and self.screen is not None:
                    self.screen.apply(message[2])
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _read_stderr(self) -> None:
        stderr = self.proc.stderr
        assert stderr is not None
        for chunk in iter(lambda: os.read(stderr.fileno(), 65536), b""):
            self.stderr += chunk

    def _send(self, message: list[Any]) -> None:
        with self._write_lock:
            stdin = self.proc.stdin
            assert stdin is not None
            stdin.write(msgpack.packb(message, use_bin_type=True))
            stdin.flush()

    def request(self, method: str, *args: Any, timeout: float = 30.0) -> Any:
        with self._cond:
            self._next_id += 1
            msgid = self._next_id
        self._send([0, msgid, method, list(args)])
        with self._cond:
            if not self._cond.wait_for(lambda: msgid in self._responses or self._closed, timeout):
                raise TimeoutError(f"nvim did not answer {method} within {timeout} s")
            if msgid not in self._responses:
                raise NvimError(f"nvim exited during {method}: {self.stderr.decode(errors='replace')[-2000:]}")
            error, result = self._responses.pop(msgid)
        if error is not None:
            raise NvimError(f"{method}: {error}")
        return result

    def lua(self, code: str, *args: Any, timeout: float = 30.0) -> Any:
        return self.request("nvim_exec_lua", code, list(args), timeout=timeout)

    def input(self, keys: str) -> None:
        """Keys as typed by a user (processed by Neovim's input loop, autocmds and all)."""
        self.request("nvim_input", keys)

    def wait_for(self, what: str, lua_condition: str, timeout: float, *args: Any, diagnose: Callable[[], str] | None = None) -> Any:
        """Poll `lua_condition` (an expression) inside Neovim until it is truthy; its value.

        Each round waits inside Neovim with vim.wait (which keeps its event loop running:
        LSP answers, timers) for up to 200 ms, checking every 10 ms. Fails at the deadline.
        `args` are visible to the condition as a[1], a[2], ...
        """
        code = f"local a = {{...}}; local ok = vim.wait(200, function() return ({lua_condition}) end, 10); if ok then return ({lua_condition}) end; return vim.NIL"
        deadline = time.monotonic() + timeout
        while True:
            value = self.lua(code, *args)
            if value is not None and value is not False:
                return value
            if time.monotonic() > deadline:
                extra = diagnose() if diagnose else ""
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}\n{extra}")

    def attach_screen(self, width: int = 100, height: int = 20) -> "Screen":
        """Attach as a terminal UI without true colour (`rgb` off: highlights come as
        cterm colours, as in tmux): the grid Neovim draws, statusline and all."""
        self.screen = Screen()
        self.request("nvim_ui_attach", width, height, {"ext_linegrid": True, "rgb": False})
        return self.screen

    def close(self) -> None:
        try:
            self._send([2, "nvim_command", ["qa!"]])
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


class Screen:
    """The main grid of an attached UI, kept from `redraw` notifications (ext_linegrid)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._drawn = threading.Condition(self._lock)
        self.rows: list[list[tuple[str, int]]] = []  # (text, hl_id) per cell
        self.attrs: dict[int, dict[str, Any]] = {0: {}}  # hl_id -> cterm attributes
        self.flushes = 0

    def apply(self, events: list[Any]) -> None:
        with self._lock:
            for name, *calls in events:
                for args in calls:
                    handler = getattr(self, f"_{name}", None)
                    if handler is not None:
                        handler(*args)
            self._drawn.notify_all()

    def wait_for(self, what: str, predicate: Callable[[], Any], timeout: float) -> Any:
        """Wait (on redraws, no polling) until predicate() is truthy; its value. Neovim is
        left alone meanwhile: what appears is what it drew by itself."""
        with self._drawn:
            if not self._drawn.wait_for(predicate, timeout):
                rows = "\n".join(self.line(row) for row in range(len(self.rows)))
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}; the screen:\n{rows}")
            return predicate()

    def _grid_resize(self, grid: int, width: int, height: int) -> None:
        if grid == 1:
            self.rows = [[(" ", 0)] * width for _ in range(height)]

    def _grid_clear(self, grid: int) -> None:
        if grid == 1:
            self.rows = [[(" ", 0)] * len(row) for row in self.rows]

    def _grid_line(self, grid: int, row: int, col: int, cells: list[Any], *_: Any) -> None:
        if grid != 1 or row >= len(self.rows):
            return
        hl = 0
        for cell in cells:
            text = cell[0]
            if len(cell) > 1:
                hl = cell[1]
            for _ in range(cell[2] if len(cell) > 2 else 1):
                if col < len(self.rows[row]):
                    self.rows[row][col] = (text, hl)
                col += 1

    def _grid_scroll(self, grid: int, top: int, bottom: int, left: int, right: int, rows: int, _cols: int) -> None:
        if grid != 1:
            return
        old = [list(row) for row in self.rows]
        for row in range(top, bottom):
            source = row + rows
            if top <= source < bottom:
                self.rows[row][left:right] = old[source][left:right]

    def _hl_attr_define(self, hl_id: int, _rgb: dict[str, Any], cterm: dict[str, Any], *_: Any) -> None:
        self.attrs[hl_id] = cterm

    def _flush(self) -> None:
        self.flushes += 1

    def line(self, row: int) -> str:
        """The text of a screen row (negative: from the bottom)."""
        with self._lock:
            return "".join(text for text, _ in self.rows[row]) if self.rows else ""

    def cells(self, row: int) -> list[tuple[str, dict[str, Any]]]:
        """(text, cterm attributes) of each cell of a row."""
        with self._lock:
            return [(text, dict(self.attrs.get(hl, {}))) for text, hl in self.rows[row]] if self.rows else []

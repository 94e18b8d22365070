"""Run an untrusted program (a filled benchmark task) and say whether it passed.

What the sandbox does (all without extra packages):
* a fresh temporary folder per run is the program's working directory, `HOME` and `TMPDIR`;
  the folder is removed afterwards;
* resource limits set in the child before `exec` (`resource.setrlimit`): address space
  (memory), CPU seconds, file size, open files, and processes (a fork bomb stops at the
  limit: counted per user, so it binds when the run is under its own user, see below);
* a wall-clock timeout; the program runs in its own session, and the whole process group
  is killed when the time is up;
* an environment of a few fixed variables only (no proxies, no tokens, nothing inherited);
* **no network**: a new network namespace (`unshare(CLONE_NEWNET)`, only a loopback that is
  down) when the kernel lets this process make one (root, or unprivileged user namespaces);
  `isolation()` says which of these measures are in force on this machine;
* **under root, the program runs as `nobody`** (uid/gid 65534, no supplementary groups):
  it can write only its own folder and what the system leaves world-writable; run by
  another user, it runs as that user and could write where that user can.

Python programs run with `python -I` (isolated: no user site, no PYTHON* variables, the
script's folder not on the path).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
NOBODY = 65534
MIB = 1024 * 1024
OUTPUT_TAIL_CHARS = 2000


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock
    memory_mb: int = 1024  # address space (RLIMIT_AS); node starts within 1 GiB
    processes: int = 64  # RLIMIT_NPROC (threads count too: node runs ~10)
    file_mb: int = 16  # largest file the program may write (RLIMIT_FSIZE), stdout included
    open_files: int = 64

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError("SandboxLimits.timeout_s must be > 0")
        for name in ("memory_mb", "processes", "file_mb", "open_files"):
            if getattr(self, name) < 1:
                raise ValueError(f"SandboxLimits.{name} must be >= 1")


@dataclass(frozen=True)
class Isolation:
    """What this machine allows beyond rlimits and a timeout."""

    network_namespace: bool  # the program has no network
    user_namespace: bool  # the network namespace needed a user namespace (not root)
    as_nobody: bool  # run as uid/gid 65534 (only when started by root)

    def describe(self) -> str:
        parts = ["rlimits (address space, CPU, file size, open files, processes)", "wall-clock timeout, process group killed",
                 "fresh temporary cwd/HOME/TMPDIR", "minimal environment"]  # fmt: skip
        parts.append("network namespace (no network)" if self.network_namespace else "NO network isolation available")
        parts.append("runs as nobody" if self.as_nobody else "runs as the calling user")
        return "; ".join(parts)


@dataclass(frozen=True)
class SandboxResult:
    passed: bool  # exited with status 0 in time
    status: str  # "passed", "failed", "timeout"
    returncode: int | None
    seconds: float
    output_tail: str = field(default="", repr=False)  # the last characters of stdout + stderr


def _libc_unshare(flags: int) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _child_setup(limits: SandboxLimits, isolation: Isolation) -> None:
    """Runs in the child between fork and exec (keep it to system calls)."""
    if isolation.network_namespace:
        _libc_unshare(CLONE_NEWNET | (CLONE_NEWUSER if isolation.user_namespace else 0))
    cpu = int(limits.timeout_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * MIB, limits.memory_mb * MIB))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * MIB, limits.file_mb * MIB))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if isolation.as_nobody:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)


def _probe_network_namespace(user_namespace: bool) -> bool:
    flags = CLONE_NEWNET | (CLONE_NEWUSER if user_namespace else 0)
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", "pass"], preexec_fn=lambda: _libc_unshare(flags),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30, env={"PATH": os.defpath},
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def probe_isolation() -> Isolation:
    """What this machine allows (one short child process per kind of namespace tried)."""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    if _probe_network_namespace(user_namespace=False):
        return Isolation(True, False, root)
    if not root and _probe_network_namespace(user_namespace=True):
        return Isolation(True, True, False)
    return Isolation(False, False, root)


SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


def find_runtime(name: str) -> str | None:
    """The executable a sandboxed program runs under: looked up on the system's folders first
    (a program run as `nobody` cannot enter a user's own Python, e.g. under /root/.pyenv),
    then on this process's PATH."""
    return shutil.which(name, path=SANDBOX_PATH) or shutil.which(name)


def _environment(folder: Path) -> dict[str, str]:
    return {"PATH": SANDBOX_PATH, "HOME": str(folder), "TMPDIR": str(folder), "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "NODE_PATH": str(folder / "node_modules")}  # fmt: skip


class Sandbox:
    """Runs programs under `limits` with the isolation this machine allows (probed once)."""

    def __init__(self, limits: SandboxLimits = SandboxLimits(), isolation: Isolation | None = None) -> None:
        self.limits = limits
        self.isolation = isolation if isolation is not None else probe_isolation()

    def run(self, command: list[str], files: dict[str, str]) -> SandboxResult:
        """Write `files` (relative path -> text) into a fresh folder, run `command` there
        (its first word is found by `find_runtime`), and say how it went."""
        executable = find_runtime(command[0])
        if executable is None:
            raise FileNotFoundError(f"{command[0]}: not found")
        base = Path(tempfile.mkdtemp(prefix="kspec-sandbox-"))
        try:
            os.chmod(base, 0o711)  # `nobody` may enter its own folder below, not list this one
            folder = base / "work"
            folder.mkdir()
            for name, text in files.items():
                path = folder / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
            if self.isolation.as_nobody:
                for path in [folder, *folder.rglob("*")]:
                    os.chown(path, NOBODY, NOBODY)
            with open(base / "output", "w+b") as output:
                return self._run(executable, command, folder, output)
        finally:
            shutil.rmtree(base, ignore_errors=True)

    def _run(self, executable: str, command: list[str], folder: Path, output) -> SandboxResult:
        limits, isolation = self.limits, self.isolation
        started = time.perf_counter()
        process = subprocess.Popen(
            [executable, *command[1:]], cwd=folder, env=_environment(folder), stdin=subprocess.DEVNULL,
            stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=lambda: _child_setup(limits, isolation),
        )  # fmt: skip
        try:
            returncode: int | None = process.wait(timeout=limits.timeout_s)
            status = "passed" if returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            returncode, status = None, "timeout"
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # what the program started, too
            except (ProcessLookupError, PermissionError):
                pass
            process.wait()
        seconds = time.perf_counter() - started
        output.seek(0, os.SEEK_END)
        output.seek(max(0, output.tell() - OUTPUT_TAIL_CHARS))
        tail = output.read().decode("utf-8", "replace")
        return SandboxResult(status == "passed", status, returncode, seconds, tail)

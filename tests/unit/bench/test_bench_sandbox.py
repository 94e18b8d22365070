"""The sandbox that runs filled benchmark programs: pass/fail by exit status, a timeout, limits
on memory, file size and processes, a fresh folder, a bare environment, no network and (under
root) no writing outside its folder. Each limit is shown to bind: the same program passes
with the limit raised or the isolation absent."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from kspec.bench.sandbox import Isolation, Sandbox, SandboxLimits, find_runtime

pytestmark = pytest.mark.skipif(find_runtime("python3") is None, reason="no python3 where the sandbox looks")


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(SandboxLimits(timeout_s=2.0, memory_mb=256))


def run_python(sandbox: Sandbox, source: str):
    return sandbox.run(["python3", "-I", "prog.py"], {"prog.py": source})


def test_a_passing_program_passes_and_a_failing_one_fails(sandbox: Sandbox) -> None:
    assert run_python(sandbox, "assert sum([1, 2]) == 3\nprint('ok')").passed
    failed = run_python(sandbox, "assert sum([1, 2]) == 4")
    assert (failed.passed, failed.status, failed.returncode) == (False, "failed", 1)
    assert "AssertionError" in failed.output_tail
    assert run_python(sandbox, "def f(:\n    pass").status == "failed"  # a syntax error


def test_an_endless_loop_times_out(sandbox: Sandbox) -> None:
    result = Sandbox(SandboxLimits(timeout_s=0.5), sandbox.isolation).run(["python3", "-I", "prog.py"], {"prog.py": "while True:\n    pass"})
    assert (result.passed, result.status, result.returncode) == (False, "timeout", None)
    assert 0.5 <= result.seconds < 5


def test_memory_is_limited(sandbox: Sandbox) -> None:
    program = "block = bytearray(512 * 1024 * 1024)\nprint(len(block))"
    limited = Sandbox(SandboxLimits(timeout_s=10, memory_mb=128), sandbox.isolation).run(["python3", "-I", "prog.py"], {"prog.py": program})
    assert limited.status == "failed" and "MemoryError" in limited.output_tail
    roomy = Sandbox(SandboxLimits(timeout_s=10, memory_mb=2048), sandbox.isolation).run(["python3", "-I", "prog.py"], {"prog.py": program})
    assert roomy.passed  # the limit, not the program, made it fail


def test_file_size_is_limited(sandbox: Sandbox) -> None:
    program = "with open('big', 'w') as f:\n    f.write('x' * (2 * 1024 * 1024))"
    small = Sandbox(SandboxLimits(timeout_s=5, file_mb=1), sandbox.isolation)
    assert not small.run(["python3", "-I", "prog.py"], {"prog.py": program}).passed
    assert Sandbox(SandboxLimits(timeout_s=5, file_mb=4), sandbox.isolation).run(["python3", "-I", "prog.py"], {"prog.py": program}).passed


def test_each_run_gets_a_fresh_folder_as_cwd_home_and_tmp(sandbox: Sandbox) -> None:
    program = (
        "import os, tempfile\n"
        "assert os.listdir('.') == ['prog.py'], os.listdir('.')\n"
        "open('note.txt', 'w').write('mine')\n"
        "assert open('note.txt').read() == 'mine'\n"
        "assert os.environ['HOME'] == os.getcwd() == tempfile.gettempdir()\n"
        f"assert os.getcwd() != {os.getcwd()!r}\n"
    )
    assert run_python(sandbox, program).passed
    assert run_python(sandbox, program).passed  # the first run's note.txt is gone


def test_the_environment_is_bare(sandbox: Sandbox, monkeypatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("KSPEC_TEST_SECRET", "s3cret")
    program = "import os\nassert 'HTTPS_PROXY' not in os.environ and 'KSPEC_TEST_SECRET' not in os.environ, sorted(os.environ)"
    assert run_python(sandbox, program).passed


def test_no_network(sandbox: Sandbox) -> None:
    """A server on this machine's loopback is out of reach (a new network namespace)."""
    if not sandbox.isolation.network_namespace:
        pytest.skip("this machine allows no network namespace: the sandbox runs with the network")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).close()"
        assert not run_python(sandbox, program).passed
        without = Isolation(network_namespace=False, user_namespace=False, as_nobody=sandbox.isolation.as_nobody)
        assert Sandbox(sandbox.limits, without).run(["python3", "-I", "prog.py"], {"prog.py": program}).passed


def test_no_writing_outside_its_folder(sandbox: Sandbox, tmp_path: Path) -> None:
    if not sandbox.isolation.as_nobody:
        pytest.skip("not run by root: the program runs as the calling user and may write where that user can")
    target = tmp_path / "outside.txt"
    result = run_python(sandbox, f"open({str(target)!r}, 'w').write('escaped')")
    assert not result.passed and "PermissionError" in result.output_tail
    assert not target.exists()


def test_processes_are_limited(sandbox: Sandbox) -> None:
    """A fork bomb stops at the process limit (exit 3 once a fork is refused)."""
    if os.geteuid() == 0 and not sandbox.isolation.as_nobody:
        pytest.skip("root without dropping to nobody: the kernel ignores the process limit")
    program = (
        "import os, sys\n"
        "read_end, _ = os.pipe()\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except BlockingIOError:\n"
        "        sys.exit(3)\n"
        "    if pid == 0:\n"
        "        os.read(read_end, 1)  # blocks until the sandbox kills the group\n"
        "        os._exit(0)\n"
    )
    result = Sandbox(SandboxLimits(timeout_s=10, processes=16), sandbox.isolation).run(["python3", "-I", "prog.py"], {"prog.py": program})
    assert result.returncode == 3, result.output_tail


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError):
        SandboxLimits(memory_mb=0)

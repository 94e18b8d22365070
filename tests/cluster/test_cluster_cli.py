"""`kspec cluster up`: refusals a user can act on (no Ray needed), and one real run in a
subprocess: serves, answers with the token, and stops cleanly on SIGINT leaving no process."""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from kspec.cli.main import main

WAIT_S = 120.0


def test_public_host_without_token_is_refused(capsys):
    assert main(["cluster", "up", "--host", "0.0.0.0"]) == 2
    error = capsys.readouterr().err
    assert "refusing to serve on 0.0.0.0 without a token" in error and "--token-file" in error
    assert "Traceback" not in error


def test_missing_token_file_is_a_clear_error(tmp_path: Path, capsys):
    assert main(["cluster", "up", "--token-file", str(tmp_path / "missing")]) == 1  # a runtime error
    error = capsys.readouterr().err
    assert "cannot read the token file" in error and "Traceback" not in error


def test_without_ray_it_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    monkeypatch.delitem(sys.modules, "kspec.engine.serve.cluster", raising=False)
    assert main(["cluster", "up", "--replicas", "2"]) == 1
    error = capsys.readouterr().err
    assert "pip install 'kspec[cluster]'" in error and "Traceback" not in error


def _lines(stream) -> queue.Queue:
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def test_cluster_up_serves_and_stops_on_sigint(tmp_path: Path, random_llama_dir: Path):
    pytest.importorskip("ray.serve", reason="the 'cluster' extra (ray[serve]) is not installed")
    psutil = pytest.importorskip("psutil")
    token_file = tmp_path / "token"
    token_file.write_text("cli-test-token\n")
    command = [sys.executable, "-m", "kspec.cli.main", "cluster", "up", "--replicas", "1", "--model", str(random_llama_dir),
               "--port", "0", "--token-file", str(token_file)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        lines, seen, url = _lines(process.stderr), [], None
        deadline = time.monotonic() + WAIT_S
        while url is None:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            assert line is not None, "".join(seen)
            seen.append(line)
            found = re.search(r"kspec cluster: serving (http://\S+/v1)", line)
            url = found.group(1) if found else None
        body = json.dumps({"prompt": "def f(", "max_tokens": 3, "user": "cli.py"}).encode()
        request = urllib.request.Request(url + "/completions", data=body, headers={"Authorization": "Bearer cli-test-token"})
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            assert response.status == 200 and response.headers["x-kspec-replica"]
            assert json.loads(response.read())["choices"]
        descendants = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=WAIT_S) == 0
        _, alive = psutil.wait_procs(descendants, timeout=WAIT_S)
        for leftover in alive:
            leftover.kill()
        assert not alive, f"left running: {[p.pid for p in alive]}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

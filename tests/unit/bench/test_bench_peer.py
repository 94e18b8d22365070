"""`kspec bench peer`: the inputs both servers get, and a refusal a user can act on.
The bench itself needs a llama-server build (../shared/tools/build-llama-cpp.sh): with
KSPEC_LLAMA_SERVER naming one, the last test runs it for real against the embedded model."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kspec.bench.peer import PeerBenchConfig, bench_peer, completion_body, keystroke_prompts
from kspec.cli.main import main
from kspec.engine.config import EngineConfig


def test_each_keystroke_extends_the_cached_prompt_by_one_character() -> None:
    prompt, keystrokes = keystroke_prompts(4)
    assert len(prompt) > 3000 and len(keystrokes) == 4
    assert all(text.startswith(prompt) for text in keystrokes)
    assert [len(b) - len(a) for a, b in zip(keystrokes, keystrokes[1:])] == [1, 1, 1]
    assert keystrokes[0].endswith("    def ")


def test_both_servers_get_one_body() -> None:
    assert completion_body("x", 1, 32) == {"prompt": "x", "n_predict": 32, "temperature": 0, "cache_prompt": True}
    assert completion_body("x", 4, 8)["n_cmpl"] == 4


def test_a_missing_or_wrong_peer_is_refused(tmp_path: Path, capsys) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="not an executable llama-server"):
        PeerBenchConfig(tmp_path / "llama-server", gguf, 2)
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(server.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(ValueError, match=r"needs a \.gguf"):
        PeerBenchConfig(server, tmp_path / "folder", 2)
    assert PeerBenchConfig(server, gguf, 2).ns == (1, 4)
    assert main(["bench", "peer", "--json"]) == 1
    assert "--llama-server" in capsys.readouterr().err


@pytest.mark.skipif(not os.environ.get("KSPEC_LLAMA_SERVER"), reason="set KSPEC_LLAMA_SERVER to a llama-server build to run the peer bench")
def test_peer_bench_against_a_real_llama_server() -> None:
    from kspec.engine.models.resolve import default_gguf_path

    config = PeerBenchConfig(Path(os.environ["KSPEC_LLAMA_SERVER"]), default_gguf_path(), 2, ns=(2,), keystrokes=1, new_tokens=4, starts=1)
    report = bench_peer(EngineConfig(progress=False), config)
    assert set(report["n=2"]["ms"]) == {"kspec engine", "llama-server"}
    assert report["resident_mb"]["llama-server"]["VmRSS"] > 0
    assert report["resident_idle_mb"]["kspec engine"]["VmRSS"] > 0 and report["kspec_idle_rss_over_llama"] > 0
    alone = report["start_alone"]  # each started again by itself
    assert [len(times) for times in alone["s"].values()] == [1, 1] and alone["kspec_over_llama"] > 0

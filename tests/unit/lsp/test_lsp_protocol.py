"""Engine protocol: frames, size limits, runtime paths, tokens, engine URLs."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from kspec.engine.api import CompletionRequest
from kspec.engine.config import EngineConfig
from kspec.engine.errors import InputError, ProtocolError
from kspec.engine.serve import wire
from kspec.engine.serve.auth import read_token, tokens_match
from kspec.engine.serve.network import is_loopback, parse_engine_url
from kspec.engine.serve.runtime import DaemonPaths, runtime_dir
from kspec.engine.serve.wire import PROTOCOL_VERSION, Cancel, Complete, decode, encode, frame, read_frame


def feed(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_frames_round_trip_and_end_cleanly() -> None:
    message = Complete("r1", CompletionRequest(prefix="def f(\u00e9😀"))
    reader = feed(frame(encode(message)) + frame(encode(Cancel("r1"))))
    assert decode(await read_frame(reader)) == message
    assert decode(await read_frame(reader)) == Cancel("r1")
    assert await read_frame(reader) is None


async def test_bad_frames_are_protocol_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ProtocolError, match="exceeds"):
        await read_frame(feed((wire.MAX_FRAME + 1).to_bytes(4, "big")))
    with pytest.raises(ProtocolError, match="exceeds the 8-byte limit"):
        await read_frame(feed((10).to_bytes(4, "big") + b"0123456789"), limit=8)
    with pytest.raises(ProtocolError, match="inside a frame"):
        await read_frame(feed((10).to_bytes(4, "big") + b"abc"))
    with pytest.raises(ProtocolError, match="header"):
        await read_frame(feed(b"\x00\x01"))
    monkeypatch.setattr(wire, "MAX_FRAME", 10)
    with pytest.raises(ProtocolError, match="exceeds"):
        frame(encode(Cancel("y" * 20)))


def test_text_msgpack_cannot_carry_is_the_senders_input_error() -> None:
    with pytest.raises(InputError, match="lone surrogate at character 3"):
        encode(Complete("r1", CompletionRequest(prefix="abc\ud800")))


def test_runtime_dir_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    folder = runtime_dir()
    assert folder == tmp_path / "kspec"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.chmod(0o755)
    assert stat.S_IMODE(runtime_dir().stat().st_mode) == 0o700


def test_socket_names_carry_version_and_spec(tmp_path: Path) -> None:
    a = DaemonPaths.for_config(EngineConfig(model=str(tmp_path)), tmp_path)
    b = DaemonPaths.for_config(EngineConfig(model=str(tmp_path), device="cuda"), tmp_path)
    assert a.socket != b.socket and f"-v{PROTOCOL_VERSION}-" in a.socket.name
    assert DaemonPaths.for_config(EngineConfig(model=str(tmp_path) + "/"), tmp_path) == a  # same folder, same daemon
    assert DaemonPaths.for_config(EngineConfig(model=str(tmp_path), progress=False), tmp_path) == a  # not an option
    assert DaemonPaths.for_config(EngineConfig(model=str(tmp_path), prefix_cache_mb=64), tmp_path) != a  # every option counts
    assert a.daemon_pid() is None
    a.lock.write_text(f"{os.getpid()}\n")
    assert a.daemon_pid() == os.getpid()


def test_the_default_models_daemon_is_the_one_of_the_model_the_default_names(tmp_path: Path, monkeypatch) -> None:
    """No model named: the daemon is keyed by what $KSPEC_MODEL (or kspec) makes the default, so an
    editor with another default never reaches a daemon serving the first one's model."""
    monkeypatch.setenv("KSPEC_MODEL", "smollm2-135m")
    small = DaemonPaths.for_config(EngineConfig(), tmp_path)
    assert DaemonPaths.for_config(EngineConfig(model="smollm2-135m"), tmp_path) == small
    monkeypatch.delenv("KSPEC_MODEL")
    assert DaemonPaths.for_config(EngineConfig(), tmp_path) != small
    assert DaemonPaths.for_config(EngineConfig(), tmp_path) == DaemonPaths.for_config(EngineConfig(model="qwen2.5-coder-0.5b"), tmp_path)


def test_tokens() -> None:
    assert tokens_match(None, None)
    assert tokens_match("secret", "secret")
    assert not tokens_match("secret", "guess") and not tokens_match("secret", None) and not tokens_match("secret", 1)


def test_token_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One reader for every token file (engine --token-file, lsp --engine-token-file,
    cluster up, bench serve, the engineTokenFile setting, serve run's token_file)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "token").write_text("  s3cret\n")
    assert read_token(tmp_path / "token") == "s3cret" and read_token("~/token") == "s3cret"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(InputError, match="is empty"):
        read_token(tmp_path / "empty")
    with pytest.raises(InputError, match="cannot read the token file"):
        read_token(tmp_path / "missing")


def test_loopback_addresses() -> None:
    assert all(is_loopback(host) for host in ("127.0.0.1", "127.8.0.1", "::1", "localhost"))
    assert not any(is_loopback(host) for host in ("0.0.0.0", "::", "10.0.0.1", "example.com"))


def test_which_engine_urls_carry_code_in_clear_off_the_machine() -> None:
    """The server refuses these unless the user allows it (allowInsecureRemote)."""
    clear = ("http://gpu-box:8000/v1", "tcp://10.0.0.1:7000", "http://[2001:db8::1]:80/v1", "http://0.0.0.0:9/v1")
    fine = ("https://gpu-box/v1", "tls://10.0.0.1:7000", "http://127.0.0.1:8000/v1", "tcp://localhost:7000", "http://[::1]:80/v1")
    assert all(parse_engine_url(url).in_clear_off_machine for url in clear)
    assert not any(parse_engine_url(url).in_clear_off_machine for url in fine)


def test_a_token_file_others_can_read_is_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A token file others can read is used, and the user is told how to make it private."""
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    path.chmod(0o644)
    assert read_token(path) == "s3cret"
    assert "can be read by other users (mode 644)" in caplog.text and "chmod 600" in caplog.text
    caplog.clear()
    path.chmod(0o600)
    assert read_token(path) == "s3cret"
    assert not caplog.text

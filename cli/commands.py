"""`kspec lsp` and `kspec engine`: arguments and entry points (wired into cli.py)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kspec.cli.exits import UsageError
from kspec.cli.logs import add_log_level, configure_logging
from kspec.engine.errors import KspecError

if TYPE_CHECKING:
    from kspec.engine.config import EngineConfig


def engine_config(args: argparse.Namespace, **fixed: Any) -> "EngineConfig":
    """The engine a command was asked for (its flags come from `engine.config.add_flags`)."""
    from kspec.engine.config import from_flags

    try:
        return from_flags(args, **fixed)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _address(value: str) -> tuple[str, int]:
    """PORT or HOST:PORT; the host defaults to loopback."""
    host, _, port = value.rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected PORT or HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def warn_if_public(host: str, what: str) -> None:
    from kspec.engine.serve.network import is_loopback

    if not is_loopback(host):
        print(f"kspec {what}: warning: listening on {host}, reachable from other machines", file=sys.stderr)


def add_lsp_parser(commands: argparse._SubParsersAction) -> None:
    lsp = commands.add_parser("lsp", help="language server on stdio (inline completions)")
    lsp.add_argument("--tcp", type=_address, default=None, metavar="[HOST:]PORT", help="serve one client over TCP instead (debugging; loopback by default; the client must send the token as initializationOptions.lspToken)")
    lsp.add_argument("--token-file", type=Path, default=None, help="with --tcp: the token the client must show (default: write a new one in the runtime dir and print where)")
    lsp.add_argument("--token-deadline", type=float, default=None, metavar="SECONDS", help="with --tcp: a connection must show the token this soon or is closed (default 5); other connections never block the client")
    from kspec.lsp_server.placements import PLACEMENTS

    lsp.add_argument("--engine", choices=PLACEMENTS, default=None, help="where the model runs (default: the 'engine' setting, i.e. the shared daemon)")
    lsp.add_argument("--engine-url", default=None, metavar="URL", help="a network engine: tcp://HOST:PORT or tls://HOST:PORT (`kspec engine --listen`), or http(s)://HOST:PORT/v1 (OpenAI-compatible); sets --engine remote / openai")
    lsp.add_argument("--engine-tcp", type=_address, default=None, metavar="[HOST:]PORT", help="same as --engine-url tcp://HOST:PORT")
    lsp.add_argument("--allow-insecure-remote", action="store_true", help="allow an engine URL on another machine over plain http:// or tcp:// (your code and key unencrypted on the network); refused otherwise")
    lsp.add_argument("--engine-token-file", type=Path, default=None, help="with --engine-url: the file holding the engine's token (API key)")
    lsp.add_argument("--engine-idle-timeout", type=float, default=None, metavar="SECONDS", help="a daemon this server starts exits this long after its last client disconnected (default 10)")
    lsp.add_argument("--max-message-bytes", type=int, default=None, help="largest JSON-RPC message accepted (default 128 MiB)")
    add_log_level(lsp, "warning")  # document text is logged only with the debugLog setting


def add_engine_parser(commands: argparse._SubParsersAction) -> None:
    from kspec.engine.config import add_flags

    engine = commands.add_parser("engine", help="the shared engine daemon (normally started by `kspec lsp`)")
    add_flags(engine)
    engine.add_argument("--socket", type=Path, default=None, help="Unix socket path (default: in the user's runtime dir, named after the model)")
    engine.add_argument("--idle-timeout", type=float, default=None, help="exit after this many seconds without clients (default: 900 on the Unix socket, never with --listen)")
    engine.add_argument("--listen", "--tcp", dest="listen", type=_address, default=None, metavar="[HOST:]PORT", help="serve over the network instead: the msgpack protocol and the OpenAI-compatible HTTP API on one port (loopback by default; clients must present the token; port 0 picks a free one)")
    engine.add_argument("--token-file", type=Path, default=None, help="with --listen: read the token from this file (default: write a new one in the runtime dir and print where)")
    engine.add_argument("--tls-cert", type=Path, default=None, help="with --listen: serve TLS with this PEM certificate (chain)")
    engine.add_argument("--tls-key", type=Path, default=None, help="with --tls-cert: its PEM private key (default: in the certificate file)")
    engine.add_argument("--max-batch-requests", type=int, default=16, help="requests decoded together (continuous batching); 1 answers them one at a time")
    engine.add_argument("--metrics-open", action="store_true", help="with --listen: serve GET /metrics (Prometheus) without the token, for a scraper; every other route still needs it")
    add_log_level(engine, "info")


def run_lsp(args: argparse.Namespace) -> int:
    from kspec.engine.serve.auth import read_token
    from kspec.engine.serve.network import parse_engine_url
    from kspec.engine.serve.runtime import runtime_dir
    from kspec.lsp_server.server import KspecServer, Redactor, ServerOptions
    from kspec.lsp_server.tcp_admission import Limits

    redactor = Redactor()
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(redactor)
    configure_logging(args, "kspec-lsp", handler)
    url = args.engine_url or (f"tcp://{args.engine_tcp[0]}:{args.engine_tcp[1]}" if args.engine_tcp else None)
    engine, token = args.engine, None
    if url is not None:
        try:
            parsed = parse_engine_url(url)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        engine = "openai" if parsed.is_http else "remote"
        if engine == "remote" and args.engine_token_file is None:
            raise UsageError("a network engine needs its token: pass --engine-token-file")
        token = read_token(args.engine_token_file) if args.engine_token_file else None
    options = ServerOptions(engine=engine, engine_url=url, daemon_token=token, redactor=redactor, allow_insecure_remote=args.allow_insecure_remote)
    if args.engine_idle_timeout is not None:
        options = replace(options, daemon_idle_timeout_s=args.engine_idle_timeout)
    if args.max_message_bytes is not None:
        options = replace(options, max_message_bytes=args.max_message_bytes)
    if (args.token_file is not None or args.token_deadline is not None) and args.tcp is None:
        raise UsageError("--token-file and --token-deadline only apply with --tcp [HOST:]PORT")
    if args.token_deadline is not None and not 0 < args.token_deadline <= 600:
        raise UsageError(f"--token-deadline must be between 0 and 600 seconds, got {args.token_deadline:g}")
    server = KspecServer(options)
    if args.tcp is not None:
        warn_if_public(args.tcp[0], "lsp")
        generated = None if args.token_file else runtime_dir() / f"lsp-{os.getpid()}.token"
        lsp_token = read_token(args.token_file) if generated is None else _new_token_file(generated, "lsp")
        try:
            limits = Limits() if args.token_deadline is None else Limits(deadline_s=args.token_deadline)
            server.start_tcp(*args.tcp, lsp_token, limits)
        finally:
            if generated is not None:
                generated.unlink(missing_ok=True)
    else:
        server.start_io()
    return server.exit_code


def run_engine(args: argparse.Namespace) -> int:
    from kspec.engine.serve.daemon import run_daemon
    from kspec.engine.serve.auth import read_token
    from kspec.engine.serve.runtime import DaemonPaths

    configure_logging(args, "kspec-engine")
    config = engine_config(args, progress=False)
    if not 1 <= args.max_batch_requests <= 256:
        raise UsageError(f"--max-batch-requests must be between 1 and 256, got {args.max_batch_requests}")
    if args.listen is None:
        if args.tls_cert or args.token_file or args.metrics_open:
            raise UsageError("--tls-cert, --token-file and --metrics-open only apply with --listen HOST:PORT")
        idle = 900.0 if args.idle_timeout is None else args.idle_timeout
        return run_daemon(config, args.socket, idle, max_batch_requests=args.max_batch_requests)
    warn_if_public(args.listen[0], "engine")
    if args.token_file is not None:
        token = read_token(args.token_file)
    else:
        token = _new_token_file(DaemonPaths.for_config(config).lock.with_suffix(".token"), "engine")
    tls = _server_tls(args.tls_cert, args.tls_key)
    return run_daemon(
        config, args.socket, args.idle_timeout, tcp=args.listen, token=token, tls=tls, max_batch_requests=args.max_batch_requests,
        metrics_open=args.metrics_open,
    )  # fmt: skip


def _new_token_file(path: Path, what: str) -> str:
    """A new token, written to `path` (0600) and its place printed: what clients must show."""
    from kspec.engine.serve.auth import new_token

    token = new_token()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token)
    print(f"kspec {what}: token in {path}", file=sys.stderr, flush=True)
    return token


def _server_tls(cert: Path | None, key: Path | None):
    if cert is None:
        if key is not None:
            raise UsageError("--tls-key needs --tls-cert")
        return None
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise KspecError(f"cannot load the TLS certificate {cert}{f' / key {key}' if key else ''}: {exc}") from exc
    return context

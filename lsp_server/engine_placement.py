"""Where the model runs for a client's settings: in process, the shared local daemon, a kspec
engine on the network ("remote") or an OpenAI-compatible server ("openai"). Settings that cannot
work give an `UnusableEngine` that says why."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from kspec.engine.config import EngineConfig
from kspec.engine.errors import InputError
from kspec.engine.serve.load_slot import LoadSlot
from kspec.engine.serve.network import parse_engine_url
from kspec.engine.serve.status import Status
from kspec.lsp_server.engine_client import DaemonEngine, DaemonOptions, EngineClient, InProcessEngine, UnusableEngine
from kspec.lsp_server.options import ServerOptions
from kspec.lsp_server.remote_backend import OpenAIEngine, RemoteOptions, api_key_from
from kspec.lsp_server.settings import Settings

StatusCallback = Callable[[Status], None]


def make_engine(settings: Settings, options: ServerOptions, on_status: StatusCallback, load_slot: LoadSlot, tell: Callable[[str], None]) -> EngineClient:
    """The engine client for `settings` (`tell`: an informational message for the user)."""
    config = settings.engine_config()
    if settings.engine == "inprocess":
        return InProcessEngine(config, on_status, options.engine_factory, load_slot)
    if settings.engine == "daemon":
        daemon = DaemonOptions(config=config, folder=options.daemon_folder, idle_timeout_s=options.daemon_idle_timeout_s)
        return DaemonEngine(daemon, on_status)
    try:
        return network_engine(settings, options, config, on_status, tell)
    except (ValueError, InputError) as exc:
        return UnusableEngine(f"engine {settings.engine!r}: {exc}", on_status)


def network_engine(settings: Settings, options: ServerOptions, config: EngineConfig, on_status: StatusCallback, tell: Callable[[str], None]) -> EngineClient:
    """A kspec engine on the network ("remote") or an OpenAI-compatible one ("openai").
    Raises ValueError / InputError for settings that cannot work (no URL, wrong scheme, no token file)."""
    text = options.engine_url or settings.engine_url
    if not text:
        raise ValueError("set engineUrl (tcp://HOST:PORT or tls://HOST:PORT for a kspec engine, http(s)://HOST:PORT/v1 for an OpenAI-compatible one)")
    url = parse_engine_url(text)
    if url.in_clear_off_machine and not (settings.allow_insecure_remote or options.allow_insecure_remote):
        raise ValueError(
            f"{url} would carry your code{' and API key' if settings.engine == 'openai' else ' and token'} unencrypted to another machine; "
            "use https:// or tls://, or, on a network you trust, set allowInsecureRemote to true in your user settings "
            "(or pass --allow-insecure-remote to kspec lsp)"
        )
    variables = ("KSPEC_ENGINE_TOKEN", "OPENAI_API_KEY") if settings.engine == "openai" else ("KSPEC_ENGINE_TOKEN",)
    token = options.daemon_token or api_key_from(settings.engine_token_file, variables)
    ca_file = Path(settings.engine_ca_file).expanduser() if settings.engine_ca_file else None
    sent = "the text around your cursor" + (" and the API key" if token and settings.engine == "openai" else "")
    tell(f"kspec: completions send {sent} to {url.host}:{url.port} (engine {settings.engine!r}, {url})")
    if settings.engine == "openai":
        return OpenAIEngine(RemoteOptions(url, settings.remote_model, token, ca_file, settings.remote_fim), on_status)
    if url.is_http:
        raise ValueError(f"{url} is an HTTP URL: use engine 'openai' for it, or tcp:// / tls:// for a kspec engine")
    if not token:
        raise ValueError("a network engine needs its token: set engineTokenFile or $KSPEC_ENGINE_TOKEN")
    daemon = DaemonOptions(config=config, url=url, token=token, ca_file=ca_file, connect_timeout_s=10.0)
    return DaemonEngine(daemon, on_status)

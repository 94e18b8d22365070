"""Server settings from `initializationOptions` and `workspace/didChangeConfiguration`.

Keys are camelCase as editors write them (snake_case is accepted too), optionally under
a "kspec" section. Each value is checked on its own: an invalid one is reported by
name and its default is used, the others still apply.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable

from kspec.engine.api import MAX_K, MAX_NEW_TOKENS, MODES
from kspec.engine.config import DTYPES, EngineConfig, options

PLACEMENTS = ("inprocess", "daemon", "remote", "openai")
SECTION = "kspec"


@dataclass(frozen=True)
class Settings:
    model: str | None = None  # None: the embedded default (demonstration) model
    draft: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    engine: str = "daemon"  # "daemon": one shared warm model for all editors; "inprocess": inside this server;
    # "remote": a kspec engine on the network (engine_url tcp:// or tls://); "openai": an OpenAI-compatible API (http(s)://.../v1)
    engine_url: str | None = None
    engine_token_file: str | None = None  # the network engine's token / API key (else $KSPEC_ENGINE_TOKEN, for openai also $OPENAI_API_KEY)
    engine_ca_file: str | None = None  # TLS: trust this certificate (self-signed) or CA instead of the system's
    remote_model: str | None = None  # openai: the model to ask for (None: the first one the server lists)
    remote_fim: str = "suffix"  # openai: "suffix" (the API's suffix field) or a template with {prefix} and {suffix}
    k: int = 3
    max_tokens: int = 48
    mode: str = "diverse"
    temperature: float = 0.0
    debounce_ms: float = 40.0
    deadline_ms: float = 3000.0
    first_answer_ms: float | None = None  # answer with what is complete this soon, decode on into the typeahead cache; None: the engine's choice for this machine, 0: off
    enabled: bool = True
    languages: tuple[str, ...] = ()  # languageIds to complete; empty (or "*") means all
    prefix_chars: int = 6000
    suffix_chars: int = 2000
    typeahead: bool = True
    raw: bool = False  # untrimmed, unranked alternatives (comparisons, tests with random models)
    debug_log: bool = False  # logs may contain document text only when this is on

    def __post_init__(self) -> None:
        for name, check in CHECKS.items():
            problem = check(getattr(self, name))
            if problem:
                raise ValueError(f"{name}: {problem}")

    def language_enabled(self, language_id: str) -> bool:
        return self.enabled and (not self.languages or "*" in self.languages or language_id in self.languages)

    def engine_config(self) -> EngineConfig:
        """The engine these settings ask for: the EngineConfig options that are settings."""
        return EngineConfig(**{f.name: getattr(self, f.name) for f in options() if f.metadata["setting"]}, progress=False)

    def engine_key(self) -> tuple[Any, ...]:
        """Settings that need a new engine (or daemon) when they change."""
        return (self.engine, self.engine_config(), self.engine_url, self.engine_token_file, self.engine_ca_file,
                self.remote_model, self.remote_fim)  # fmt: skip


def _optional_path(value: Any) -> str | None:
    return None if value is None or isinstance(value, str) and value.strip() else "must be a non-empty string or null"


def _engine_url(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return "must be a URL string or null"
    from kspec.engine.serve.protocol import parse_engine_url

    try:
        parse_engine_url(value)
    except ValueError as exc:
        return str(exc)
    return None


def _fim(value: Any) -> str | None:
    if value == "suffix" or isinstance(value, str) and "{prefix}" in value and "{suffix}" in value:
        return None
    return "must be 'suffix' or a template containing {prefix} and {suffix}"


def _choice(options: tuple[str, ...]) -> Callable[[Any], str | None]:
    return lambda value: None if value in options else f"must be one of {', '.join(options)}"


def _number(low: float, high: float, integer: bool = False) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        kind = "an integer" if integer else "a number"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
            return f"must be {kind} between {low:g} and {high:g}"
        if not math.isfinite(value) or not low <= value <= high:
            return f"must be {kind} between {low:g} and {high:g}"
        return None

    return check


def _device(value: Any) -> str | None:
    if isinstance(value, str) and re.fullmatch(r"cpu|cuda(:\d+)?", value):
        return None
    return "must be 'cpu' or 'cuda[:N]'"


def _languages(value: Any) -> str | None:
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) and item for item in value):
        return None
    return "must be a list of languageIds (empty for all)"


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


CHECKS: dict[str, Callable[[Any], str | None]] = {
    "model": _optional_path,
    "draft": _optional_path,
    "device": _device,
    "dtype": _choice(tuple(DTYPES)),
    "engine": _choice(PLACEMENTS),
    "engine_url": _engine_url,
    "engine_token_file": _optional_path,
    "engine_ca_file": _optional_path,
    "remote_model": _optional_path,
    "remote_fim": _fim,
    "k": _number(1, MAX_K, integer=True),
    "max_tokens": _number(1, MAX_NEW_TOKENS, integer=True),
    "mode": _choice(MODES),
    "temperature": _number(0, 2),
    "debounce_ms": _number(0, 2000),
    "deadline_ms": _number(50, 120000),
    "first_answer_ms": lambda value: None if value is None else _number(0, 120000)(value),
    "enabled": _boolean,
    "languages": _languages,
    "prefix_chars": _number(1, 200000, integer=True),
    "suffix_chars": _number(0, 100000, integer=True),
    "typeahead": _boolean,
    "raw": _boolean,
    "debug_log": _boolean,
}
INTEGERS = {"k", "max_tokens", "prefix_chars", "suffix_chars"}


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


_BY_KEY = {key: f.name for f in fields(Settings) for key in (f.name, camel(f.name))}


@dataclass(frozen=True)
class Parsed:
    settings: Settings
    problems: list[str] = field(default_factory=list)  # one line per rejected or unknown key
    given: frozenset[str] = frozenset()  # the settings (field names) the client set to a valid value


def parse_settings(raw: Any, base: Settings | None = None) -> Parsed:
    """Settings from a client's JSON object. Keys absent keep `base` (default: defaults);
    invalid keys fall back to the default and are reported."""
    base = base or Settings()
    if raw is None:
        return Parsed(base)
    if not isinstance(raw, dict):
        return Parsed(base, [f"settings must be an object, got {type(raw).__name__}; using the defaults"])
    if isinstance(raw.get(SECTION), dict):
        raw = raw[SECTION]
    defaults = Settings()
    values: dict[str, Any] = {}
    problems: list[str] = []
    rejected: set[str] = set()
    for key, value in raw.items():
        name = _BY_KEY.get(key)
        if name is None:
            if key != SECTION:
                problems.append(f"unknown setting {key!r} ignored")
            continue
        problem = CHECKS[name](value)
        if problem:
            problems.append(f"setting {camel(name)!r} {problem} (got {value!r:.80}); using the default {getattr(defaults, name)!r}")
            values[name] = getattr(defaults, name)
            rejected.add(name)
            continue
        if name in INTEGERS:
            value = int(value)
        elif name == "languages":
            value = tuple(value)
        elif isinstance(value, int) and not isinstance(value, bool) and name in {"temperature", "debounce_ms", "deadline_ms", "first_answer_ms"}:
            value = float(value)
        values[name] = value
    given = frozenset(name for name in values if name not in rejected)
    return Parsed(replace(base, **values), problems, given)

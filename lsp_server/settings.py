"""Server settings from `initializationOptions` and `workspace/didChangeConfiguration`.

Keys are camelCase as editors write them (snake_case is accepted too), optionally under
a "kspec" section. Each value is checked on its own: an invalid one is reported by
name and its default is used, the others still apply.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from dataclasses import Field, dataclass, field, fields, make_dataclass, replace
from typing import Any, Awaitable, Callable

from lsprotocol import types as lsp

from kspec.engine.api import MAX_K, MAX_NEW_TOKENS, MODES
from kspec.engine.config import EngineConfig, options, value_type
from kspec.engine.syntax.window import MAX_AFTER, MAX_BEFORE
from kspec.lsp_server.placements import PLACEMENTS

SECTION = "kspec"

log = logging.getLogger("kspec.lsp")


@dataclass(frozen=True)
class Rule:
    """What one setting accepts: checks a value (-> the problem, or None) and tells the
    editors' declarations what to say (tests/unit/lsp/test_settings_schema.py compares
    VS Code's manifest and settings.ts and Neovim's config.lua with these)."""

    type: str  # the JSON type: "string", "integer", "number", "boolean" or "array" (of non-empty strings)
    nullable: bool = False  # null is allowed (and means "not set")
    enum: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    pattern: str | None = None  # a regex the whole string matches
    check: Callable[[str], str | None] | None = None  # a further check of a string (a URL, a template)
    expected: str = ""  # what "must be ..." says, when the generated words do not fit

    def __call__(self, value: Any) -> str | None:
        if value is None:
            return None if self.nullable else self.must()
        if not self._fits(value):
            return self.must()
        return self.check(value) if self.check is not None else None

    def _fits(self, value: Any) -> bool:
        if self.type == "boolean":
            return isinstance(value, bool)
        if self.type in ("integer", "number"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return False
            whole = self.type == "number" or float(value).is_integer()
            return whole and (self.minimum is None or value >= self.minimum) and (self.maximum is None or value <= self.maximum)
        if self.type == "array":
            return isinstance(value, (list, tuple)) and all(isinstance(item, str) and item for item in value)
        if not isinstance(value, str):
            return False
        if self.enum:
            return value in self.enum
        if self.pattern is not None:
            return re.fullmatch(self.pattern, value) is not None
        return self.check is not None or bool(value.strip())

    def must(self) -> str:
        if self.expected:
            return f"must be {self.expected}"
        if self.type == "boolean":
            return "must be true or false"
        if self.type in ("integer", "number"):
            kind = "an integer" if self.type == "integer" else "a number"
            if self.minimum is not None and self.maximum is not None:
                return f"must be {kind} between {self.minimum:g} and {self.maximum:g}"
            return f"must be {kind}" + (f" >= {self.minimum:g}" if self.minimum is not None else "") + (f" <= {self.maximum:g}" if self.maximum is not None else "")
        if self.enum:
            return f"must be one of {', '.join(self.enum)}"
        return "must be a non-empty string or null" if self.nullable else "must be a non-empty string"

    def convert(self, value: Any) -> Any:
        """A checked value as Settings holds it."""
        if value is None:
            return None
        if self.type == "integer":
            return int(value)
        if self.type == "number":
            return float(value)
        return tuple(value) if self.type == "array" else value

    @classmethod
    def of_option(cls, option_field: Field) -> "Rule":
        """The rule of an engine option that is a setting (kspec.engine.config.option)."""
        meta, kind = option_field.metadata, value_type(option_field)
        nullable = option_field.default is None
        if kind is bool:
            return cls("boolean", nullable)
        if kind in (int, float):
            return cls("integer" if kind is int else "number", nullable, minimum=meta.get("minimum"), maximum=meta.get("maximum"))
        expected = meta["help"] if meta["pattern"] else ""
        return cls("string", nullable, enum=tuple(meta["choices"] or ()), pattern=meta["pattern"], expected=expected)


def setting(default: Any, rule: Rule, *, vscode: bool = True) -> Any:
    """A language-server setting; `vscode`: offered in VS Code's settings UI (Neovim passes any)."""
    return field(default=default, metadata={"rule": rule, "vscode": vscode})


# The engine options marked as settings (kspec.engine.config: model, draft, dtype, device),
# with their defaults and rules, are the first fields of Settings: a new one needs no change here.
EngineSettings = make_dataclass(
    "EngineSettings",
    [(f.name, f.type, setting(f.default, Rule.of_option(f), vscode=f.metadata["vscode"])) for f in options() if f.metadata["setting"]],
    frozen=True,
)


def _engine_url(value: str) -> str | None:
    from kspec.engine.serve.network import parse_engine_url

    try:
        parse_engine_url(value)
    except ValueError as exc:
        return str(exc)
    return None


FIM = "'auto', 'suffix' or a template containing {prefix} and {suffix}"


def _fim(value: str) -> str | None:
    from kspec.lsp_server.fim import check_setting

    return check_setting(value)


PATH = Rule("string", nullable=True)  # a file, folder or name; null: not set


@dataclass(frozen=True)
class Settings(EngineSettings):  # type: ignore[misc,valid-type]
    """Every setting the server reads, with its default and its Rule: the one schema."""

    # "daemon": one shared warm model for all editors; "inprocess": inside this server; "remote": a kspec engine
    # on the network (engine_url tcp:// or tls://); "openai": an OpenAI-compatible API (http(s)://.../v1)
    engine: str = setting("daemon", Rule("string", enum=PLACEMENTS))
    engine_url: str | None = setting(None, Rule("string", nullable=True, check=_engine_url, expected="a URL string or null"))
    # the network engine's token / API key (else $KSPEC_ENGINE_TOKEN, for openai also $OPENAI_API_KEY)
    engine_token_file: str | None = setting(None, PATH)
    engine_ca_file: str | None = setting(None, PATH)  # TLS: trust this certificate (self-signed) or CA instead of the system's
    # an engine URL off this machine over plain http:// or tcp:// (code and key unencrypted) is refused unless this is true
    allow_insecure_remote: bool = setting(False, Rule("boolean"))
    remote_model: str | None = setting(None, PATH)  # openai: the model to ask for (None: the first one the server lists)
    # openai: "auto" (the model family's template, else the API's suffix field), "suffix", or a template with {prefix} and {suffix}
    remote_fim: str = setting("auto", Rule("string", check=_fim, expected=FIM))
    k: int = setting(3, Rule("integer", minimum=1, maximum=MAX_K))
    max_tokens: int = setting(48, Rule("integer", minimum=1, maximum=MAX_NEW_TOKENS))
    mode: str = setting("diverse", Rule("string", enum=MODES))
    temperature: float = setting(0.0, Rule("number", minimum=0, maximum=2))
    debounce_ms: float = setting(10.0, Rule("number", minimum=0, maximum=2000))
    deadline_ms: float = setting(3000.0, Rule("number", minimum=50, maximum=120000))
    # answer with what is complete this soon, decode on into the typeahead cache; None: the engine's choice for this machine, 0: off
    first_answer_ms: float | None = setting(None, Rule("number", nullable=True, minimum=0, maximum=120000), vscode=False)
    enabled: bool = setting(True, Rule("boolean"))
    # languageIds to complete; empty (or "*") means all
    languages: tuple[str, ...] = setting((), Rule("array", expected="a list of languageIds (empty for all)"))
    # other open files of the workspace folder and the definitions the file imports, before the file's text (crossfile/)
    context_files: bool = setting(True, Rule("boolean"))
    context_tokens: int = setting(1024, Rule("integer", minimum=0, maximum=8192))  # their cap; the machine fit may choose less
    prefix_chars: int = setting(MAX_BEFORE, Rule("integer", minimum=1, maximum=200000), vscode=False)
    suffix_chars: int = setting(MAX_AFTER, Rule("integer", minimum=0, maximum=100000), vscode=False)
    typeahead: bool = setting(True, Rule("boolean"), vscode=False)
    raw: bool = setting(False, Rule("boolean"), vscode=False)  # untrimmed, unranked alternatives (comparisons, tests with random models)
    debug_log: bool = setting(False, Rule("boolean"), vscode=False)  # logs may contain document text only when this is on

    def __post_init__(self) -> None:
        for name, rule in RULES.items():
            problem = rule(getattr(self, name))
            if problem:
                raise ValueError(f"{name}: {problem}")

    def language_enabled(self, language_id: str) -> bool:
        return self.enabled and (not self.languages or "*" in self.languages or language_id in self.languages)

    def engine_config(self) -> EngineConfig:
        """The engine these settings ask for: the EngineConfig options that are settings."""
        return EngineConfig(**{f.name: getattr(self, f.name) for f in fields(EngineSettings)}, progress=False)

    def engine_key(self) -> tuple[Any, ...]:
        """Settings that need a new engine (or daemon) when they change."""
        return (self.engine, self.engine_config(), self.engine_url, self.engine_token_file, self.engine_ca_file,
                self.allow_insecure_remote, self.remote_model, self.remote_fim)  # fmt: skip


RULES: dict[str, Rule] = {f.name: f.metadata["rule"] for f in fields(Settings)}


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


_BY_KEY = {key: f.name for f in fields(Settings) for key in (f.name, camel(f.name))}


@dataclass(frozen=True)
class Parsed:
    settings: Settings
    problems: list[str] = field(default_factory=list)  # one line per rejected or unknown key
    given: frozenset[str] = frozenset()  # the settings (field names) the client set to a valid value
    cleared: frozenset[str] = frozenset()  # the settings the client sent as null: not set (back to the default)


def parse_settings(raw: Any, base: Settings | None = None) -> Parsed:
    """Settings from a client's JSON object. Keys absent keep `base` (default: defaults);
    null means "not set": the default (for k, maxTokens and firstAnswerMs the engine's
    choice for this machine), as VS Code sends a setting the user removed; invalid keys
    fall back to the default and are reported."""
    base = base or Settings()
    if raw is None or raw == []:  # [] : an empty Lua table, as Neovim encodes it
        return Parsed(base)
    if not isinstance(raw, dict):
        return Parsed(base, [f"settings must be an object, got {type(raw).__name__}; using the defaults"])
    if isinstance(raw.get(SECTION), dict):
        raw = raw[SECTION]
    defaults = Settings()
    values: dict[str, Any] = {}
    problems: list[str] = []
    rejected: set[str] = set()
    cleared: set[str] = set()
    for key, value in raw.items():
        name = _BY_KEY.get(key)
        if name is None:
            if key != SECTION:
                problems.append(f"unknown setting {key!r} ignored")
            continue
        if value is None:
            values[name] = getattr(defaults, name)
            cleared.add(name)
            continue
        problem = RULES[name](value)
        if problem:
            problems.append(f"setting {camel(name)!r} {problem} (got {value!r:.80}); using the default {getattr(defaults, name)!r}")
            values[name] = getattr(defaults, name)
            rejected.add(name)
            continue
        values[name] = RULES[name].convert(value)
    given = frozenset(name for name in values if name not in rejected and name not in cleared)
    return Parsed(replace(base, **values), problems, given, frozenset(cleared))


CONFIGURATION_TIMEOUT_S = 5.0


async def pull_configuration(ask: Callable[[lsp.ConfigurationParams], Awaitable[list[Any]]]) -> Any:
    """The client's settings through `workspace/configuration` (`ask`: pygls' request), for a
    client whose `didChangeConfiguration` carries none; None when it fails or takes too long."""
    request = lsp.ConfigurationParams(items=[lsp.ConfigurationItem(section=SECTION)])
    try:
        values = await asyncio.wait_for(ask(request), CONFIGURATION_TIMEOUT_S)
    except (asyncio.TimeoutError, Exception) as exc:
        log.warning("workspace/configuration failed: %s", type(exc).__name__)
        return None
    return values[0] if values else None

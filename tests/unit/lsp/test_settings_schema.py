"""The settings list is written once, in lsp_server/settings.py (Settings: each field's
default and Rule; the engine's come from EngineConfig). The editors declare the same
settings in their own languages; these tests read those declarations as text and fail
when one drifts: a name, a type, a default, a choice or a limit.

- VS Code: package.json `contributes.configuration` (the settings UI) and src/settings.ts
  (DEFAULTS, SERVER_KEYS and the validators of readSettings), for the settings offered
  there (`vscode=True`);
- Neovim: lua/kspec/config.lua SERVER_KEYS (the type of every server setting);
- the server's own documentation: lsp_server/README.md's settings table (names and defaults).
"""

from __future__ import annotations

import json
import re
from dataclasses import Field, fields
from pathlib import Path
from typing import Any

import pytest

from kspec.lsp_server.settings import Rule, Settings, camel

EDITORS = Path(__file__).resolve().parents[3] / "editors"
VSCODE_CLIENT_ONLY = {"kspec.server.command", "kspec.server.args", "kspec.server.env", "kspec.trace.server"}


def schema(vscode_only: bool = False) -> dict[str, tuple[Field, Rule]]:
    return {camel(f.name): (f, f.metadata["rule"]) for f in fields(Settings) if f.metadata["vscode"] or not vscode_only}


def json_default(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def json_type(rule: Rule) -> Any:
    return [rule.type, "null"] if rule.nullable else rule.type


# --- VS Code: package.json -------------------------------------------------------------


def manifest_settings(text: str) -> dict[str, dict[str, Any]]:
    return json.loads(text)["contributes"]["configuration"]["properties"]


def manifest_problems(properties: dict[str, dict[str, Any]]) -> list[str]:
    problems = []
    wanted = schema(vscode_only=True)
    extra = set(properties) - VSCODE_CLIENT_ONLY - {f"kspec.{key}" for key in wanted}
    problems += [f"{name}: not a server setting offered in VS Code" for name in sorted(extra)]
    for key, (spec, rule) in wanted.items():
        prop = properties.get(f"kspec.{key}")
        if prop is None:
            problems.append(f"kspec.{key}: missing")
            continue
        declared = {
            "type": prop.get("type"), "default": prop.get("default"), "enum": tuple(prop.get("enum", ())),
            "minimum": prop.get("minimum"), "maximum": prop.get("maximum"),
        }  # fmt: skip
        expected = {
            "type": json_type(rule), "default": json_default(spec.default), "enum": rule.enum,
            "minimum": rule.minimum, "maximum": rule.maximum,
        }  # fmt: skip
        problems += [f"kspec.{key}: {what} is {declared[what]!r}, the server says {expected[what]!r}" for what in expected if declared[what] != expected[what]]
        if rule.type == "array" and prop.get("items") != {"type": "string"}:
            problems.append(f"kspec.{key}: items must be strings")
        if rule.pattern is not None and prop.get("pattern") != f"^({rule.pattern})$":
            problems.append(f"kspec.{key}: pattern is {prop.get('pattern')!r}, the server says ^({rule.pattern})$")
        if rule.pattern is None and rule.check is None and "pattern" in prop:
            problems.append(f"kspec.{key}: a pattern the server does not have")
    return problems


# --- VS Code: src/settings.ts -----------------------------------------------------------


def ts_literal(text: str) -> Any:
    return json.loads(re.sub(r",\s*\]", "]", text.strip().replace("'", '"')))


def ts_arrays(source: str) -> dict[str, list[str]]:
    """`export const NAME ... = ['a', 'b'];` constants."""
    return {name: ts_literal(f"[{body}]") for name, body in re.findall(r"export const (\w+)\b[^=\n]*= \[([^\]]*)\]", source)}


def ts_settings(source: str) -> tuple[list[str], dict[str, Any], dict[str, dict[str, Any]]]:
    """SERVER_KEYS, DEFAULTS (server keys) and what readSettings accepts for each key."""
    arrays = ts_arrays(source)
    body = re.search(r"export const DEFAULTS: KspecSettings = \{\n(.*?)\n\};", source, re.S)
    assert body, "DEFAULTS not found in settings.ts"
    defaults = {key: ts_literal(value) for key, value in re.findall(r"^\t(\w+): (.+),$", body.group(1), re.M) if key != "server"}
    device = re.search(r"const isDevice = .*?/\^\((.*?)\)\$/", source)
    enums = {"isDtype": arrays.get("DTYPES"), "isMode": arrays.get("MODES"), "isEngine": arrays.get("ENGINES")}
    accepted: dict[str, dict[str, Any]] = {}
    for key, validator, args in re.findall(r"take\('([\w.]+)', (\w+)(?:\(([^)]*)\))?,", source):
        if key.startswith("server."):
            continue
        low, high = (float(x) for x in args.split(",")) if args else (None, None)
        kind = {"isBool": "boolean", "intIn": "integer", "numIn": "number", "isStringList": "array"}.get(validator, "string")
        accepted[key] = {
            "type": kind, "minimum": low, "maximum": high, "enum": tuple(enums.get(validator) or ()),
            "pattern": device.group(1) if validator == "isDevice" and device else None,
        }  # fmt: skip
    return arrays.get("SERVER_KEYS", []), defaults, accepted


def ts_problems(source: str) -> list[str]:
    problems = []
    wanted = schema(vscode_only=True)
    keys, defaults, accepted = ts_settings(source)
    if sorted(keys) != sorted(wanted):
        problems.append(f"SERVER_KEYS {sorted(keys)} != the server's {sorted(wanted)}")
    for key, (spec, rule) in wanted.items():
        if key not in defaults or defaults[key] != json_default(spec.default):
            problems.append(f"DEFAULTS.{key} is {defaults.get(key, '(missing)')!r}, the server says {json_default(spec.default)!r}")
        declared = accepted.get(key)
        if declared is None:
            problems.append(f"readSettings does not take {key!r}")
            continue
        expected = {"type": rule.type, "minimum": rule.minimum, "maximum": rule.maximum, "enum": rule.enum, "pattern": rule.pattern}
        problems += [f"readSettings({key!r}): {what} is {declared[what]!r}, the server says {expected[what]!r}" for what in expected if declared[what] != expected[what]]
    return problems


# --- Neovim: lua/kspec/config.lua --------------------------------------------------------

LUA_TYPES = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean", "array": "table"}


def lua_server_keys(source: str) -> dict[str, set[str]]:
    body = re.search(r"local SERVER_KEYS = \{\n(.*?)\n\}", source, re.S)
    assert body, "SERVER_KEYS not found in config.lua"
    table = {}
    for key, value in re.findall(r"^\s*(\w+) = (\{[^}]*\}|'\w+'),", body.group(1), re.M):
        table[key] = set(re.findall(r"'(\w+)'", value))
    return table


def lua_problems(source: str) -> list[str]:
    declared, wanted = lua_server_keys(source), schema()
    problems = [f"SERVER_KEYS.{key}: not a server setting" for key in sorted(set(declared) - set(wanted))]
    for key, (_, rule) in wanted.items():
        expected = {LUA_TYPES[rule.type]} | ({"nil"} if rule.nullable else set())
        if declared.get(key) != expected:
            problems.append(f"SERVER_KEYS.{key} is {sorted(declared.get(key) or ['(missing)'])}, the server says {sorted(expected)}")
    return problems


# --- lsp_server/README.md ---------------------------------------------------------------


def readme_settings(text: str) -> dict[str, Any]:
    """The Settings table: `key`, `key2` | default, default2 | ... -> {key: default}."""
    section = text.split("## Settings", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) < 3 or not cells[1].strip().startswith("`"):
            continue
        keys = re.findall(r"`(\w+)`", cells[1])
        defaults = [json.loads(value.strip().strip("`")) for value in cells[2].split(",")]
        if len(defaults) == 1:
            defaults *= len(keys)  # `model`, `draft` | `null`
        table.update(zip(keys, defaults))
    return table


def readme_problems(text: str) -> list[str]:
    declared, wanted = readme_settings(text), schema()
    problems = [f"{key}: not a server setting" for key in sorted(set(declared) - set(wanted))]
    for key, (spec, _) in wanted.items():
        if key not in declared:
            problems.append(f"{key}: missing")
        elif declared[key] != json_default(spec.default):
            problems.append(f"{key}: default is {declared[key]!r}, the server says {json_default(spec.default)!r}")
    return problems


# --- the tests -------------------------------------------------------------------------

MANIFEST = EDITORS / "vscode" / "package.json"
SETTINGS_TS = EDITORS / "vscode" / "src" / "settings.ts"
CONFIG_LUA = EDITORS / "nvim" / "lua" / "kspec" / "config.lua"
SERVER_README = EDITORS.parent / "lsp_server" / "README.md"


def test_vscode_manifest_declares_the_server_settings() -> None:
    assert manifest_problems(manifest_settings(MANIFEST.read_text())) == []


def test_vscode_settings_ts_reads_the_server_settings() -> None:
    assert ts_problems(SETTINGS_TS.read_text()) == []


def test_neovim_config_types_every_server_setting() -> None:
    assert lua_problems(CONFIG_LUA.read_text()) == []


def test_the_server_readme_lists_every_setting_with_its_default() -> None:
    assert readme_problems(SERVER_README.read_text()) == []


def test_every_setting_has_a_rule_that_accepts_its_default() -> None:
    for spec in fields(Settings):
        assert isinstance(spec.metadata.get("rule"), Rule), spec.name
        assert spec.metadata["rule"](spec.default) is None, spec.name


# Each place drifting alone is caught: one edit of the real file's text per case.
DRIFTS = [
    (MANIFEST, '"maximum": 32', '"maximum": 64', manifest_problems, manifest_settings),
    (MANIFEST, '"default": 48', '"default": 64', manifest_problems, manifest_settings),
    (MANIFEST, '"diverse",\n', '"greedy",\n', manifest_problems, manifest_settings),
    (MANIFEST, '"kspec.k": {', '"kspec.alternatives": {', manifest_problems, manifest_settings),
    (SETTINGS_TS, "intIn(1, 32)", "intIn(1, 64)", ts_problems, None),
    (SETTINGS_TS, "\tk: 3,", "\tk: 4,", ts_problems, None),
    (SETTINGS_TS, "'remoteFim', 'k',", "'remoteFim',", ts_problems, None),
    (SETTINGS_TS, "take('enabled', isBool,", "take('enabled', isString,", ts_problems, None),
    (CONFIG_LUA, "  k = 'number',", "  k = 'string',", lua_problems, None),
    (CONFIG_LUA, "  debugLog = 'boolean',\n", "", lua_problems, None),
    (CONFIG_LUA, "  model = { 'string', 'nil' },", "  model = 'string',", lua_problems, None),
    (SERVER_README, "| `k` | 3 |", "| `k` | 4 |", readme_problems, None),
    (SERVER_README, "| `raw` | false |", "| `rawText` | false |", readme_problems, None),
]


@pytest.mark.parametrize(("path", "old", "new", "problems", "parse"), DRIFTS, ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_a_drifting_editor_fails(path: Path, old: str, new: str, problems, parse) -> None:
    text = path.read_text()
    assert old in text, f"the drift case no longer matches {path.name}: update it"
    drifted = text.replace(old, new, 1)
    assert problems(parse(drifted) if parse else drifted) != []

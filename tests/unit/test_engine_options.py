"""EngineConfig's options are the one list of engine flags: every command that loads an
engine offers each of them, the daemon a language server spawns gets them back, the
cluster takes them, and the editors' settings take the ones marked as settings."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from kspec.cli.main import build_parser
from kspec.engine.config import EngineConfig, flag, from_flags, from_values, options, to_flags, value_type
from kspec.lsp_server.settings import Settings, camel, parse_settings

ENGINE_COMMANDS = (["complete", "x:1:1"], ["eval", "cases.jsonl", "--out", "r.jsonl"], ["bench", "decode"], ["engine"], ["cluster", "up"])


def other_value(option_field, config: EngineConfig):
    """A valid value other than the default, whatever the option's type."""
    meta, kind = option_field.metadata, value_type(option_field)
    if meta["choices"]:
        for choice in meta["choices"]:
            if choice != option_field.default:
                try:
                    replace(config, **{option_field.name: choice})
                except ValueError:
                    continue
                return choice
    if meta["pattern"]:
        return "cuda:1"
    if kind is bool:
        return not option_field.default
    if kind is int:
        return max((option_field.default or 1) + 1, meta["minimum"] or 0)
    if kind is float:
        return (option_field.default or 1.0) * 2
    return f"/models/{option_field.name}"


def all_changed() -> EngineConfig:
    config = EngineConfig(progress=False)
    for option_field in options():
        config = replace(config, **{option_field.name: other_value(option_field, config)})
    return config


def test_there_are_options_and_each_is_documented() -> None:
    assert {"model", "draft", "dtype", "device", "drafter", "threads", "prefix_cache_mb"} <= {f.name for f in options()}
    assert all(f.metadata["help"] for f in options())


@pytest.mark.parametrize("command", ENGINE_COMMANDS, ids=lambda c: c[0])
def test_every_command_that_loads_an_engine_takes_every_option(command: list[str]) -> None:
    config = all_changed()
    args = build_parser().parse_args([*command, *to_flags(config)])
    assert from_flags(args, progress=False) == config
    defaults = build_parser().parse_args(command)
    assert from_flags(defaults, progress=False) == EngineConfig(progress=False)  # a flag not given keeps the default


def test_the_spawned_daemon_serves_the_language_servers_config() -> None:
    """DaemonEngine starts `kspec engine *to_flags(config)`; that parses back to the same config."""
    config = all_changed()
    command = ["engine", *to_flags(config)]
    assert from_flags(build_parser().parse_args(command), progress=False) == config
    assert to_flags(EngineConfig()) == []  # defaults travel as no flags at all


def test_the_cluster_takes_option_values_as_text() -> None:
    config = all_changed()
    text = {f.name: str(getattr(config, f.name)) for f in options()}
    assert from_values(text, progress=False) == config
    with pytest.raises(ValueError, match="unknown engine option"):
        from_values({"colour": "blue"})


def test_options_marked_as_settings_are_language_server_settings() -> None:
    config = all_changed()
    marked = [f for f in options() if f.metadata["setting"]]
    assert {f.name for f in marked} >= {"model", "draft", "dtype", "device"}
    raw = {camel(f.name): getattr(config, f.name) for f in marked}
    parsed = parse_settings(raw)
    assert parsed.problems == []
    expected = EngineConfig(**{f.name: getattr(config, f.name) for f in marked}, progress=False)
    assert parsed.settings.engine_config() == expected
    assert Settings().engine_config() == EngineConfig(progress=False)


def test_invalid_flag_values_are_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    from kspec.cli.main import main

    assert main(["engine", "--device", "tpu"]) == 2
    assert "device must be 'cpu' or 'cuda[:N]'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["engine", flag(next(f for f in options() if f.name == "dtype")), "float8"])
    assert isinstance(build_parser().parse_args(["engine"]), argparse.Namespace)

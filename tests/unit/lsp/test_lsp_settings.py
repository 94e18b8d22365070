"""Settings: each invalid value is named and replaced by its default; the rest still apply."""

from __future__ import annotations

import pytest

from kspec.lsp_server.settings import Settings, parse_settings


def test_camel_and_snake_case_keys_under_an_optional_section() -> None:
    parsed = parse_settings({"kspec": {"maxTokens": 12, "debounce_ms": 5, "languages": ["python"], "k": 2.0}})
    assert parsed.problems == []
    assert parsed.settings.max_tokens == 12 and parsed.settings.debounce_ms == 5.0 and parsed.settings.k == 2
    assert isinstance(parsed.settings.k, int)
    assert parsed.settings.language_enabled("python") and not parsed.settings.language_enabled("rust")


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("k", 0, "k"),
        ("k", 2.5, "k"),
        ("k", True, "k"),
        ("maxTokens", 10_000, "max_tokens"),
        ("temperature", "hot", "temperature"),
        ("temperature", float("nan"), "temperature"),
        ("mode", "greedy", "mode"),
        ("debounceMs", -1, "debounce_ms"),
        ("deadlineMs", 10, "deadline_ms"),
        ("languages", "python", "languages"),
        ("model", "", "model"),
        ("device", "tpu", "device"),
        ("dtype", "int8", "dtype"),
        ("engine", "cloud", "engine"),
        ("typeahead", "yes", "typeahead"),
    ],
)
def test_invalid_value_is_named_and_defaulted(key: str, value: object, field: str) -> None:
    base = Settings(k=7, max_tokens=9, temperature=0.5, mode="sample", debounce_ms=1, deadline_ms=999, typeahead=False)
    parsed = parse_settings({key: value, "suffixChars": 10}, base)
    assert len(parsed.problems) == 1 and repr(key) in parsed.problems[0]
    assert getattr(parsed.settings, field) == getattr(Settings(), field)  # the default, not the previous value
    assert parsed.settings.suffix_chars == 10  # valid keys next to it still apply


def test_absent_keys_keep_the_base_and_unknown_keys_are_reported() -> None:
    parsed = parse_settings({"k": 5, "colour": "blue"}, Settings(max_tokens=20))
    assert parsed.settings.k == 5 and parsed.settings.max_tokens == 20
    assert parsed.problems == ["unknown setting 'colour' ignored"]
    assert parse_settings(None, Settings(k=4)).settings.k == 4
    assert parse_settings([1, 2]).problems and parse_settings([1, 2]).settings == Settings()


def test_empty_languages_and_enabled() -> None:
    assert Settings().language_enabled("anything")
    assert Settings(languages=("*",)).language_enabled("go")
    assert not Settings(enabled=False).language_enabled("python")


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="k"):
        Settings(k=0)


def test_settings_module_never_imports_torch() -> None:
    """The limits come from the engine's torch-free modules: a daemon-backed server stays light."""
    import subprocess
    import sys

    code = "import sys, kspec.lsp_server.settings, kspec.lsp_server.server; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_null_means_not_set_so_the_engines_choice_applies_again() -> None:
    """VS Code sends every setting; one the user did not set (or removed) comes as null."""
    parsed = parse_settings({"k": None, "maxTokens": None, "model": None, "deadlineMs": 500}, Settings(k=5, max_tokens=20))
    assert parsed.problems == []
    assert parsed.settings.k == Settings().k and parsed.settings.max_tokens == Settings().max_tokens
    assert parsed.given == {"deadline_ms"}
    assert parsed.cleared == {"k", "max_tokens", "model"}


def test_an_empty_list_is_no_settings_as_an_empty_lua_table_encodes() -> None:
    base = Settings(k=3)
    parsed = parse_settings([], base)
    assert parsed.settings == base and parsed.problems == []
    assert parse_settings([1], base).problems  # any other list is still wrong

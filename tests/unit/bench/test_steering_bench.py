"""`kspec bench quality --steering`: its settings and a wrong one refused before a model loads."""

from __future__ import annotations

import pytest

from kspec.bench.steering import parse_settings
from kspec.cli.main import main
from kspec.engine.config import EngineConfig


def test_settings_with_and_without_a_floor() -> None:
    assert parse_settings("0,1@-20") == [(0, EngineConfig.steer_min_logprob), (1, -20.0)]


@pytest.mark.parametrize("text", ["", "one", "1@low"])
def test_a_wrong_setting_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="--steering"):
        parse_settings(text)


def test_the_command_line_refuses_it_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "quality", "--steering", "x@y"]) == 2
    assert "BRANCHES@FLOOR" in capsys.readouterr().err

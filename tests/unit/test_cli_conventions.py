"""The command line behaves like one: --version, help on every option, a log level for
every long-running command, progress bars that stay out of pipes, exit 1 for runtime
errors and 2 for usage errors, benches that name their missing extra before working."""

from __future__ import annotations

import argparse
import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from kspec.bench.evaluate import evaluate_file
from kspec.cli.logs import ENV_LOG_LEVEL
from kspec.cli.main import build_parser, main, show_progress
from kspec.engine.api import Completion, CompletionResult


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """main() configures the root logger (as the real command does): put it back for the other tests."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _parsers(parser: argparse.ArgumentParser, name: str = "kspec"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_version_is_the_distributions() -> None:
    run = subprocess.run([sys.executable, "-m", "kspec.cli.main", "--version"], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == f"kspec {version('kspec')}"


def test_every_option_has_help() -> None:
    missing = [
        f"{name} {action.option_strings[0]}"
        for name, parser in _parsers(build_parser())
        for action in parser._actions
        if action.option_strings and not isinstance(action, (argparse._HelpAction, argparse._VersionAction)) and not (action.help or "").strip()
    ]
    assert missing == []


@pytest.mark.parametrize("command", ["complete", "eval", "bench", "lsp", "engine", "cluster up"])
def test_every_long_running_command_takes_a_log_level(command: str) -> None:
    parsers = dict(_parsers(build_parser()))
    assert any(a.option_strings == ["--log-level"] for a in parsers[f"kspec {command}"]._actions)


def test_log_level_from_flag_then_environment(monkeypatch, tmp_path: Path) -> None:
    missing = str(tmp_path / "none.jsonl")
    monkeypatch.setenv(ENV_LOG_LEVEL, "debug")
    assert main(["eval", missing, "--out", str(tmp_path / "o")]) == 1
    assert logging.getLogger().level == logging.DEBUG
    assert main(["eval", missing, "--out", str(tmp_path / "o"), "--log-level", "error"]) == 1
    assert logging.getLogger().level == logging.ERROR
    monkeypatch.setenv(ENV_LOG_LEVEL, "loud")
    assert main(["eval", missing, "--out", str(tmp_path / "o")]) == 2  # a usage error, said as such


def test_usage_errors_exit_2_and_runtime_errors_exit_1(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["complete"])  # argparse's own
    assert caught.value.code == 2
    assert main(["complete", "x.py:1:1", "-k", "0"]) == 2
    assert main(["lsp", "--engine-url", "ftp://x"]) == 2
    assert main(["complete", str(tmp_path / "missing.py") + ":1:1"]) == 1
    assert "no such file" in capsys.readouterr().err


def test_a_bench_without_its_extra_says_what_to_install_before_working(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["bench", "decode", "--model", "no/such/model"]) == 1
    assert "pip install 'kspec[bench]'" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "pyflakes", None)
    assert main(["bench", "quality", "--data", "nowhere"]) == 1
    assert "pyflakes" in capsys.readouterr().err


def test_progress_only_on_a_terminal_and_not_for_json_into_a_pipe(monkeypatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    args = argparse.Namespace(json=True)
    monkeypatch.setattr(sys, "stderr", Tty())
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert not show_progress(args)
    assert show_progress(argparse.Namespace(json=False))
    monkeypatch.setattr(sys, "stdout", Tty())
    assert show_progress(args)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not show_progress(argparse.Namespace(json=False))


def test_eval_shows_a_progress_bar(tmp_path: Path, capsys) -> None:
    class Engine:
        def complete(self, request):
            return CompletionResult([Completion("1", 0.0)], "fake", {"total": 1.0})

    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps({"id": i, "prefix": "x = ", "language": "python"}) + "\n" for i in range(3)))
    evaluate_file(Engine(), str(cases), str(tmp_path / "out.jsonl"), {}, progress=True)
    shown = capsys.readouterr().err
    assert "kspec eval" in shown and "3/3" in shown
    evaluate_file(Engine(), str(cases), str(tmp_path / "out.jsonl"), {}, progress=False)
    assert "kspec eval" not in capsys.readouterr().err

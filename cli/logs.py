"""The log level of a long-running command: `--log-level`, else $KSPEC_LOG_LEVEL, else
the command's default. Logs go to stderr; stdout stays for results."""

from __future__ import annotations

import argparse
import logging
import os
import sys

LOG_LEVELS = ("debug", "info", "warning", "error")
ENV_LOG_LEVEL = "KSPEC_LOG_LEVEL"


def add_log_level(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--log-level", choices=LOG_LEVELS, default=None,
        help=f"stderr log level (default: ${ENV_LOG_LEVEL} when set, else {default})",
    )  # fmt: skip
    parser.set_defaults(log_level_default=default)


def log_level(args: argparse.Namespace) -> str:
    """The level asked for; a bad $KSPEC_LOG_LEVEL is a usage error."""
    from kspec.cli.exits import UsageError

    if args.log_level:
        return args.log_level
    env = os.environ.get(ENV_LOG_LEVEL, "").strip().lower()
    if env and env not in LOG_LEVELS:
        raise UsageError(f"${ENV_LOG_LEVEL} must be one of {', '.join(LOG_LEVELS)}, got {env!r}")
    return env or args.log_level_default


def configure_logging(args: argparse.Namespace, name: str, handler: logging.Handler | None = None) -> None:
    handler = handler or logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {name}[%(process)d] %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=log_level(args).upper(), handlers=[handler], force=True)

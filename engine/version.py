"""kspec's version: the one in pyproject.toml, as the installed distribution carries it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version


def version() -> str:
    try:
        return _distribution_version("kspec")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"

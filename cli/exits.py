"""What `kspec` exits with: 0 done, 1 a runtime error (a missing file, an engine that
cannot load or answer), 2 a usage error (argparse's own, or option values that cannot
work together), 130 interrupted."""

from __future__ import annotations

from kspec.engine.errors import KspecError

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(KspecError):
    """A command line that cannot work as given; exits 2 like argparse's usage errors."""


def exit_code(error: KspecError) -> int:
    return EXIT_USAGE if isinstance(error, UsageError) else EXIT_RUNTIME

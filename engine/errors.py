"""Errors a user can act on. The CLI prints their message on one line and exits non-zero."""


class KspecError(Exception):
    """Base class: the message alone must tell the user what to do."""


class ModelLoadError(KspecError):
    """A model path, format or architecture that cannot be loaded."""


class InputError(KspecError):
    """A bad file, position or request."""


class CancelledError(KspecError):
    """The request was cancelled before it produced anything."""


class EngineUnavailable(KspecError):
    """No engine to answer: it failed to load, or the daemon is gone."""


class DeadlineExceeded(KspecError):
    """The request's deadline passed before the engine could start it."""

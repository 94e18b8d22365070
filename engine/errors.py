"""Errors a user can act on, and how each one travels. The CLI prints their message on one
line and exits non-zero; the engine's surfaces answer with the class's own `kind` (the
msgpack protocol's error frames), `http_status` and `http_type` (the HTTP / OpenAI
API's status and error-body type). `describe` turns any exception into that answer and
`from_kind` / `from_status` turn an answer back into the exception, so a client raises
what the engine raised, whichever way it came."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


class KspecError(Exception):
    """Base class: the message alone must tell the user what to do. Anything not more
    specific is an engine that cannot answer."""

    kind = "unavailable"
    http_status = 503
    http_type = "server_error"


class ModelLoadError(KspecError):
    """A model path, format or architecture that cannot be loaded."""


class LoadCancelled(ModelLoadError):
    """The engine was stopped (its settings changed) before its model finished loading."""


class InputError(KspecError):
    """A bad file, position or request."""

    kind, http_status, http_type = "input", 400, "invalid_request_error"


class CancelledError(KspecError):
    """The request was cancelled before it produced anything."""

    kind = "cancelled"


class EngineUnavailable(KspecError):
    """No engine to answer: it failed to load, or the daemon is gone."""


class DeadlineExceeded(KspecError):
    """The request's deadline passed before the engine could start it."""

    kind, http_status, http_type = "deadline", 504, "timeout_error"


class ProtocolError(KspecError):
    """A peer that does not speak the engine protocol (bad frame, size, version or token)."""

    kind, http_status, http_type = "protocol", 400, "invalid_request_error"


# The class a client raises for each kind / HTTP status (the first one listed wins).
_ANSWERS = (InputError, DeadlineExceeded, EngineUnavailable, CancelledError, ProtocolError)


@dataclass(frozen=True)
class ErrorAnswer:
    kind: str  # msgpack error frame's "kind"
    http_status: int
    http_type: str  # the "type" of an OpenAI-style error body
    message: str


def describe(error: BaseException) -> ErrorAnswer:
    """How an engine surface answers `error`. A cancelled task is a cancelled request;
    anything that is not a KspecError is an engine that cannot answer."""
    if isinstance(error, asyncio.CancelledError):
        error = CancelledError("cancelled")
    if not isinstance(error, KspecError):
        error = EngineUnavailable(f"engine error: {type(error).__name__}: {error}")
    return ErrorAnswer(error.kind, error.http_status, error.http_type, str(error))


def from_kind(kind: object, message: str) -> KspecError:
    """The exception for a msgpack error frame's kind (unknown kinds: EngineUnavailable)."""
    error_type = next((cls for cls in _ANSWERS if cls.kind == kind), EngineUnavailable)
    return error_type(message)


def from_status(status: int, message: str) -> KspecError:
    """The exception for an HTTP error status (others than ours: EngineUnavailable)."""
    error_type = next((cls for cls in _ANSWERS if cls.http_status == status), EngineUnavailable)
    return error_type(message)

"""The typed messages between an engine and its clients, and their one encoding.

A request's life on the wire is one stream of events: `Interim` answers (what was complete at
the first-answer moment, then after each round that changed it), then exactly one of `Final`
or `Failed` (`Failed.kind` "cancelled" for a cancelled request); `Status` (status.py) goes out
whenever the engine's state changes. A client sends `Complete` and `Cancel`. `encode` gives the
map a msgpack frame carries (protocol.py), `decode` the typed message back; the daemon and the
network engine write only through `encode`, the engine client reads only through `decode`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from kspec.engine.api import CompletionRequest, CompletionResult
from kspec.engine.errors import KspecError, ProtocolError, describe, from_kind
from kspec.engine.serve.status import Status


@dataclass(frozen=True)
class Complete:
    id: str
    request: CompletionRequest


@dataclass(frozen=True)
class Cancel:
    id: str


@dataclass(frozen=True)
class Interim:
    id: str
    result: CompletionResult


@dataclass(frozen=True)
class Final:
    id: str
    result: CompletionResult


@dataclass(frozen=True)
class Failed:
    id: str | None  # None: the handshake failed
    kind: str  # engine/errors.py's kinds: input, deadline, unavailable, cancelled, protocol
    message: str

    @classmethod
    def of(cls, request_id: str | None, error: BaseException) -> "Failed":
        answer = describe(error)
        return cls(request_id, answer.kind, answer.message)

    def error(self) -> KspecError:
        """What the engine raised, as the client raises it."""
        return from_kind(self.kind, self.message)


Message = Union[Complete, Cancel, Interim, Final, Failed, Status]

# The wire's "type" of each message (the names the protocol had before they were typed)
WIRE_TYPES: dict[type, str] = {Complete: "complete", Cancel: "cancel", Interim: "early", Final: "result", Failed: "error", Status: "status"}
_MESSAGE_OF = {name: cls for cls, name in WIRE_TYPES.items()}


def encode(message: Message) -> dict[str, Any]:
    """The map a frame carries."""
    if isinstance(message, Status):
        return message.to_wire()
    kind = WIRE_TYPES[type(message)]
    if isinstance(message, Complete):
        return {"type": kind, "id": message.id, "request": message.request.to_dict()}
    if isinstance(message, (Interim, Final)):
        return {"type": kind, "id": message.id, "result": message.result.to_dict()}
    if isinstance(message, Failed):
        return {"type": kind, "id": message.id, "kind": message.kind, "message": message.message}
    return {"type": kind, "id": message.id}


def decode(data: dict[str, Any], engine_pid: int | None = None) -> Message:
    """The typed message of a frame's map; ProtocolError for an unknown type or a malformed body
    (a request's own fields are checked by CompletionRequest.from_dict: InputError)."""
    kind = data.get("type")
    cls = _MESSAGE_OF.get(kind) if isinstance(kind, str) else None
    if cls is Status:
        return Status.from_wire(data, engine_pid)
    request_id = data.get("id")
    try:
        if cls is Complete:
            return Complete(str(request_id), CompletionRequest.from_dict(data.get("request")))
        if cls is Cancel:
            return Cancel(str(request_id))
        if cls is Interim or cls is Final:
            return cls(str(request_id), CompletionResult.from_dict(data["result"]))
        if cls is Failed:
            return Failed(None if request_id is None else str(request_id), str(data.get("kind")), str(data.get("message", "engine error")))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed {kind!r} message: {exc}") from None
    raise ProtocolError(f"unknown message type {kind!r}")

"""Request maps as a client's `complete` message carries them, decoded by the engine (engine/serve/wire.py)."""

from __future__ import annotations

import msgspec

from kspec.engine.api import CompletionRequest
from kspec.engine.serve.wire import Complete, decode, encode


def parsed(request_map: object) -> CompletionRequest:
    """The request the engine reads from `request_map` (InputError when it is not one)."""
    message = decode(msgspec.msgpack.encode({"type": "complete", "id": "1", "request": request_map}))
    assert isinstance(message, Complete)
    return message.request


def through_the_wire(request: CompletionRequest) -> CompletionRequest:
    """`request` sent and read back."""
    message = decode(encode(Complete("1", request)))
    assert isinstance(message, Complete)
    return message.request

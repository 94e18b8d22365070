"""pygls' private members that kspec relies on (lsp_server/pygls_adapter.py) are still there, with
the parameters it calls them with: a pygls that changes one fails here, before a user sees it."""

from __future__ import annotations

import inspect

from pygls.protocol import LanguageServerProtocol

from kspec.lsp_server.pygls_adapter import PYGLS_PRIVATE_ATTRIBUTES, PYGLS_PRIVATE_METHODS, KspecProtocol
from kspec.lsp_server.server import KspecServer


def test_the_private_methods_kspec_overrides_or_calls_exist_with_their_parameters() -> None:
    for name, parameters in PYGLS_PRIVATE_METHODS.items():
        method = getattr(LanguageServerProtocol, name, None)
        assert method is not None, f"pygls no longer has LanguageServerProtocol.{name}"
        assert tuple(inspect.signature(method).parameters) == parameters, name


def test_the_private_attributes_exist_on_a_live_protocol() -> None:
    protocol = KspecServer().protocol
    assert isinstance(protocol, KspecProtocol)
    for name in PYGLS_PRIVATE_ATTRIBUTES:
        assert isinstance(getattr(protocol, name, None), dict), f"pygls' protocol has no dict {name}"


def test_the_overrides_are_kspecs_own() -> None:
    """Each overridden method is defined by KspecProtocol itself, so a rename in pygls would leave it unused."""
    for name in ("_execute_handler", "_handle_response", "_send_handler_result"):
        assert name in vars(KspecProtocol), name
        assert name in PYGLS_PRIVATE_METHODS
